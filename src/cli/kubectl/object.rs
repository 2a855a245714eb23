//! The objects `kubectl lockwarden` is asked about, named as kubectl names them
//! (`dlock/db`, `jobs.batch nightly`, `db` where a lock is meant), and why a name
//! names none ([`ObjectError`]: a usage error, exit 2).

/// The kinds of object the plugin reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectKind {
    Lock,
    Job,
    Pod,
}

impl ObjectKind {
    /// kubectl's spellings of each kind: singular, plural, short name, with group.
    fn parse(word: &str) -> Option<ObjectKind> {
        match word.to_ascii_lowercase().as_str() {
            "dlock"
            | "dlocks"
            | "distributedlock"
            | "distributedlocks"
            | "distributedlock.lockwarden.io"
            | "distributedlocks.lockwarden.io" => Some(ObjectKind::Lock),
            "job" | "jobs" | "job.batch" | "jobs.batch" => Some(ObjectKind::Job),
            "pod" | "pods" | "po" => Some(ObjectKind::Pod),
            _ => None,
        }
    }
}

/// Words that name no object the command reads, and the forms it takes
/// (`job/NAME or pod/NAME`).
#[derive(Debug, thiserror::Error)]
#[error("{problem}; expected {expected}")]
pub struct ObjectError {
    pub problem: Misnamed,
    pub expected: String,
}

/// What is wrong with the words given for an object.
#[derive(Debug, thiserror::Error)]
pub enum Misnamed {
    #[error("{0:?} names no kind of object")]
    NoKind(String),
    #[error("no object given")]
    NoObject,
    #[error("{0} words given, one object")]
    Words(usize),
    #[error("{0:?} is not a kind of object kubectl lockwarden reads")]
    UnknownKind(String),
    #[error("{0:?} cannot be used here")]
    NotHere(String),
    #[error("the object's name is missing")]
    NoName,
    #[error("{0:?} is not an object name")]
    NotAName(String),
}

/// `KIND/NAME`, `KIND NAME` or (where `bare` is given) `NAME`: the object named.
pub fn parse_resource(
    words: &[String],
    allowed: &[ObjectKind],
    bare: Option<ObjectKind>,
) -> Result<(ObjectKind, String), ObjectError> {
    let expected = allowed
        .iter()
        .map(|k| match k {
            ObjectKind::Lock => "dlock/NAME",
            ObjectKind::Job => "job/NAME",
            ObjectKind::Pod => "pod/NAME",
        })
        .collect::<Vec<_>>()
        .join(" or ");
    let usage = |problem: Misnamed| ObjectError {
        problem,
        expected: expected.clone(),
    };
    let (kind, name) = match words {
        [one] => match one.split_once('/') {
            Some((kind, name)) => (kind.to_string(), name.to_string()),
            None => match bare {
                Some(kind) => return check_name(one).map(|n| (kind, n)).map_err(usage),
                None => return Err(usage(Misnamed::NoKind(one.clone()))),
            },
        },
        [kind, name] if !kind.contains('/') => (kind.clone(), name.clone()),
        [] => return Err(usage(Misnamed::NoObject)),
        more => return Err(usage(Misnamed::Words(more.len()))),
    };
    let Some(found) = ObjectKind::parse(&kind) else {
        return Err(usage(Misnamed::UnknownKind(kind)));
    };
    if !allowed.contains(&found) {
        return Err(usage(Misnamed::NotHere(kind)));
    }
    Ok((found, check_name(&name).map_err(usage)?))
}

fn check_name(name: &str) -> Result<String, Misnamed> {
    if name.is_empty() {
        return Err(Misnamed::NoName);
    }
    if name.contains('/') {
        return Err(Misnamed::NotAName(name.to_string()));
    }
    Ok(name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_named_as_kubectl_names_them() {
        let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let lock = [ObjectKind::Lock];
        let workloads = [ObjectKind::Job, ObjectKind::Pod];
        for line in [
            &["dlock/db"][..],
            &["distributedlock/db"],
            &["dlocks", "db"],
            &["db"],
        ] {
            let got = parse_resource(&words(line), &lock, Some(ObjectKind::Lock)).unwrap();
            assert_eq!(got, (ObjectKind::Lock, "db".to_string()), "{line:?}");
        }
        assert_eq!(
            parse_resource(&words(&["job.batch/n"]), &workloads, None).unwrap(),
            (ObjectKind::Job, "n".into())
        );
        assert_eq!(
            parse_resource(&words(&["po", "p"]), &workloads, None).unwrap(),
            (ObjectKind::Pod, "p".into())
        );
        for (line, phrase) in [
            (&["svc/x"][..], "\"svc\" is not a kind of object"),
            (&["job/"], "name is missing"),
            (&["nightly"], "names no kind of object"),
            (&["dlock/db"], "cannot be used here"),
            (&[], "no object given"),
        ] {
            let err = parse_resource(&words(line), &workloads, None)
                .unwrap_err()
                .to_string();
            assert!(err.contains(phrase), "{line:?}: {err}");
            assert!(err.contains("expected job/NAME or pod/NAME"), "{err}");
        }
    }
}

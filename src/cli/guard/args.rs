//! The guard's command line: its flags ([`GuardArgs`]) and the locks they name
//! ([`Guarded`]): one from --url/--nonce/--fence, or several from
//! --urls/--nonces/--fences, the formats of the Pod's annotations.

use std::ffi::OsString;
use std::time::Duration;

use clap::Args;

use crate::cli::args::{BackendArgs, ValueError, parse_fence, parse_nonce};
use lockwarden_core::FenceToken;
use lockwarden_stores::{Target, TargetError};

#[derive(Args, Debug)]
#[command(after_help = "\
The guard runs as a container's entrypoint (PID 1, exec form) in front of the workload's \
command. It reads the lock's record on its own (a linearizable read every twentieth of the \
stored lease) and starts COMMAND once it has seen one renewal carrying NONCE; from then on \
its deadline is the send time of the last read that showed the previous revision plus the \
stored lease × (1 − δ) − margin. If no renewal moves it in time, COMMAND gets SIGTERM at \
deadline − 500ms − grace and every process of the container SIGKILL at deadline − 500ms; a \
record that is not ours any more stops COMMAND at once. COMMAND gets LOCKWARDEN_FENCE, \
LOCKWARDEN_URL and LOCKWARDEN_NONCE. A workload on several locks passes --urls, --nonces and \
--fences (LOCKWARDEN_URLS, LOCKWARDEN_NONCES, LOCKWARDEN_FENCES: the Pod's lockwarden.io/urls, \
nonces and fences annotations): every lock is read, COMMAND starts once each has shown a \
renewal and stops by the earliest of their deadlines, and gets the three variables as given. \
SIGTERM, SIGINT and SIGHUP are passed on to COMMAND, \
orphans are reaped, and the guard exits with COMMAND's status (128+N for signal N); 4 if the \
lock is not held with NONCE (COMMAND stopped, or never started), 6 if the lock could not be \
confirmed by the deadline. S3, DynamoDB and Kubernetes Leases; not ZooKeeper (a queue entry \
lives until its session expires and then goes at once: no read tells how long it stays).

  lockwarden guard --url s3://locks/nightly --nonce \"$NONCE\" --fence \"$FENCE\" -- ./job.sh")]
pub struct GuardArgs {
    // The six below are plain strings checked by `GuardArgs::locks`: the downward API
    // gives a Pod every variable it names, as "" when the annotation is absent (a
    // workload has either the single-lock or the several-lock annotations), and clap
    // would take an empty variable as a value given.
    /// The lock: s3://BUCKET/KEY, dynamodb://TABLE/KEY or k8s://NAMESPACE/LEASE-NAME
    /// (the Pod's lockwarden.io/url annotation)
    #[arg(long, env = "LOCKWARDEN_URL", value_name = "URL")]
    pub url: Option<String>,

    /// The acquisition to guard (the Pod's lockwarden.io/nonce annotation)
    #[arg(long, env = "LOCKWARDEN_NONCE", value_name = "NONCE")]
    pub nonce: Option<String>,

    /// Its fence (the Pod's lockwarden.io/fence annotation), passed on to COMMAND
    #[arg(long, env = "LOCKWARDEN_FENCE", value_name = "N")]
    pub fence: Option<String>,

    /// Several locks, all guarded: NAME=URL per lock, space-separated (the Pod's
    /// lockwarden.io/urls annotation); with --nonces and --fences
    #[arg(long, env = "LOCKWARDEN_URLS", value_name = "NAME=URL …")]
    pub urls: Option<String>,

    /// NAME=NONCE per lock, comma-separated (lockwarden.io/nonces)
    #[arg(long, env = "LOCKWARDEN_NONCES", value_name = "NAME=NONCE,…")]
    pub nonces: Option<String>,

    /// NAME=N per lock, comma-separated (lockwarden.io/fences), passed on to COMMAND
    #[arg(long, env = "LOCKWARDEN_FENCES", value_name = "NAME=N,…")]
    pub fences: Option<String>,

    /// How long COMMAND has between SIGTERM and SIGKILL; both come before the guard's
    /// deadline, so at most what the stored lease leaves (refused above it) [default:
    /// 10s, or that maximum if less]
    #[arg(long, value_name = "DURATION", value_parser = crate::cli::args::parse_duration)]
    pub grace: Option<Duration>,

    /// The command to guard (after `--`)
    #[arg(value_name = "COMMAND", required = true, num_args = 1.., trailing_var_arg = true)]
    pub command: Vec<OsString>,

    #[command(flatten)]
    pub backend: BackendArgs,
}

/// One lock the guard watches: its name among several (`None` for the only one), where
/// it is stored, the acquisition and its fence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Guarded {
    pub name: Option<String>,
    pub url: Target,
    pub nonce: String,
    pub fence: FenceToken,
}

/// Why the guard's flags name no lock it can guard. Every message names the flag (and
/// among several locks, the lock's name), and where the Pod takes its value from.
#[derive(Debug, thiserror::Error)]
pub enum GuardArgsError {
    #[error(
        "{flag} ({}) is missing or empty: is the Pod's lockwarden.io/{} annotation set?",
        env_name(flag),
        flag.trim_start_matches('-')
    )]
    Missing { flag: &'static str },

    #[error(
        "both --url/--nonce/--fence and --urls/--nonces/--fences are given: a workload \
         carries the one set for one lock or the other for several"
    )]
    BothSets,

    #[error(
        "no lock to guard: give --url, --nonce and --fence (LOCKWARDEN_URL, \
         LOCKWARDEN_NONCE, LOCKWARDEN_FENCE: the Pod's lockwarden.io/url, nonce and fence \
         annotations), or --urls, --nonces and --fences for several locks"
    )]
    NoLock,

    #[error("{flag}: {pair:?} is not NAME=VALUE")]
    NotNamed { flag: &'static str, pair: String },

    #[error("{flag} names no lock {name:?} (--fences does)")]
    NotNamedIn { flag: &'static str, name: String },

    #[error("{flag} names lock {name:?} more than once")]
    NamedTwice { flag: &'static str, name: String },

    #[error(
        "--urls, --nonces and --fences name {urls}, {nonces} and {fences} locks: each must \
         name every lock once"
    )]
    Counts {
        urls: usize,
        nonces: usize,
        fences: usize,
    },

    /// A lock URL that does not parse (`lock`: its name among several).
    #[error("{flag}: {}{source}", of_lock(lock))]
    Url {
        flag: &'static str,
        lock: Option<String>,
        source: TargetError,
    },

    /// A nonce or a fence that does not parse (`lock`: its name among several).
    #[error("{flag}: {}{source}", of_lock(lock))]
    Value {
        flag: &'static str,
        lock: Option<String>,
        source: ValueError,
    },
}

/// `NAME: ` before the error of one lock among several.
fn of_lock(lock: &Option<String>) -> String {
    lock.as_ref()
        .map(|name| format!("{name}: "))
        .unwrap_or_default()
}

impl GuardArgs {
    /// The locks to guard: the one of --url/--nonce/--fence, or every one of
    /// --urls/--nonces/--fences; an empty value counts as not given.
    pub fn locks(&self) -> Result<Vec<Guarded>, GuardArgsError> {
        fn given(value: &Option<String>) -> Option<&str> {
            value.as_deref().filter(|v| !v.trim().is_empty())
        }
        // Each flag with its value; the Pod's annotation is the flag's name.
        let one = [
            ("--url", given(&self.url)),
            ("--nonce", given(&self.nonce)),
            ("--fence", given(&self.fence)),
        ];
        let several_ = [
            ("--urls", given(&self.urls)),
            ("--nonces", given(&self.nonces)),
            ("--fences", given(&self.fences)),
        ];
        let any = |set: &[(&str, Option<&str>)]| set.iter().any(|(_, v)| v.is_some());
        let complete =
            |set: &[(&'static str, Option<&str>)]| match set.iter().find(|(_, v)| v.is_none()) {
                None => Ok(()),
                Some((flag, _)) => Err(GuardArgsError::Missing { flag }),
            };
        match (any(&one), any(&several_)) {
            (true, true) => Err(GuardArgsError::BothSets),
            (false, false) => Err(GuardArgsError::NoLock),
            (true, false) => {
                complete(&one)?;
                let [(_, Some(url)), (_, Some(nonce)), (_, Some(fence))] = one else {
                    unreachable!("checked complete")
                };
                Ok(vec![Guarded {
                    name: None,
                    url: Target::parse(url).map_err(url_error("--url", None))?,
                    nonce: parse_nonce(nonce).map_err(value_error("--nonce", None))?,
                    fence: parse_fence(fence).map_err(value_error("--fence", None))?,
                }])
            }
            (false, true) => {
                complete(&several_)?;
                let [(_, Some(urls)), (_, Some(nonces)), (_, Some(fences))] = several_ else {
                    unreachable!("checked complete")
                };
                several(urls, nonces, fences)
            }
        }
    }
}

/// The error of `flag`'s URL (of lock `lock` among several).
fn url_error(flag: &'static str, lock: Option<&str>) -> impl FnOnce(TargetError) -> GuardArgsError {
    let lock = lock.map(str::to_string);
    move |source| GuardArgsError::Url { flag, lock, source }
}

/// The error of `flag`'s nonce or fence (of lock `lock` among several).
fn value_error(
    flag: &'static str,
    lock: Option<&str>,
) -> impl FnOnce(ValueError) -> GuardArgsError {
    let lock = lock.map(str::to_string);
    move |source| GuardArgsError::Value { flag, lock, source }
}

/// The environment variable of a guard flag (`--nonces` → `LOCKWARDEN_NONCES`).
fn env_name(flag: &str) -> String {
    format!("LOCKWARDEN_{}", flag.trim_start_matches('-').to_uppercase())
}

/// `NAME=VALUE` pairs split by `separator`, for the flag `flag`.
fn named_values<'a>(
    text: &'a str,
    separator: char,
    flag: &'static str,
) -> Result<Vec<(&'a str, &'a str)>, GuardArgsError> {
    let pairs: Vec<&str> = text
        .split(separator)
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    if pairs.is_empty() {
        return Err(GuardArgsError::Missing { flag });
    }
    pairs
        .into_iter()
        .map(|pair| match pair.split_once('=') {
            Some((name, value)) if !name.is_empty() && !value.is_empty() => Ok((name, value)),
            _ => Err(GuardArgsError::NotNamed {
                flag,
                pair: pair.to_string(),
            }),
        })
        .collect()
}

/// The locks of the plural annotations (README "Jobs"): `NAME=URL` space-separated,
/// `NAME=NONCE` and `NAME=FENCE` comma-separated, in the order of the fences; every
/// lock named once in each.
pub fn several(urls: &str, nonces: &str, fences: &str) -> Result<Vec<Guarded>, GuardArgsError> {
    let urls = named_values(urls, ' ', "--urls")?;
    let nonces = named_values(nonces, ',', "--nonces")?;
    let fences = named_values(fences, ',', "--fences")?;
    let find = |pairs: &[(&str, &str)], name: &str, flag: &'static str| {
        let name_ = name.to_string();
        match pairs.iter().filter(|(n, _)| *n == name).count() {
            1 => Ok(pairs
                .iter()
                .find(|(n, _)| *n == name)
                .unwrap()
                .1
                .to_string()),
            0 => Err(GuardArgsError::NotNamedIn { flag, name: name_ }),
            _ => Err(GuardArgsError::NamedTwice { flag, name: name_ }),
        }
    };
    if urls.len() != fences.len() || nonces.len() != fences.len() {
        return Err(GuardArgsError::Counts {
            urls: urls.len(),
            nonces: nonces.len(),
            fences: fences.len(),
        });
    }
    fences
        .iter()
        .map(|(name, fence)| {
            let url = find(&urls, name, "--urls")?;
            let nonce = find(&nonces, name, "--nonces")?;
            Ok(Guarded {
                name: Some(name.to_string()),
                url: Target::parse(&url).map_err(url_error("--urls", Some(name)))?,
                nonce: parse_nonce(&nonce).map_err(value_error("--nonces", Some(name)))?,
                fence: parse_fence(fence).map_err(value_error("--fences", Some(name)))?,
            })
        })
        .collect::<Result<Vec<_>, GuardArgsError>>()
        .and_then(|locks| {
            match locks
                .iter()
                .enumerate()
                .find(|(i, l)| locks[..*i].iter().any(|o| o.name == l.name))
            {
                Some((_, dup)) => Err(GuardArgsError::NamedTwice {
                    flag: "--fences",
                    name: dup.name.clone().unwrap_or_default(),
                }),
                None => Ok(locks),
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_locks_come_in_the_order_of_the_fences_each_named_once() {
        let locks = several(
            "db=s3://locks/db  bucket=k8s://ns/bucket",
            "bucket=n2,db=n1",
            "db=3,bucket=7",
        )
        .unwrap();
        let seen: Vec<(Option<&str>, String, &str, u64)> = locks
            .iter()
            .map(|l| {
                (
                    l.name.as_deref(),
                    l.url.to_string(),
                    l.nonce.as_str(),
                    l.fence.0,
                )
            })
            .collect();
        assert_eq!(
            seen,
            vec![
                (Some("db"), "s3://locks/db".to_string(), "n1", 3),
                (Some("bucket"), "k8s://ns/bucket".to_string(), "n2", 7),
            ]
        );
        for (urls, nonces, fences, says) in [
            (
                "db=s3://locks/db",
                "db=n1",
                "db=3,bucket=7",
                "name 1, 1 and 2 locks",
            ),
            (
                "db=s3://locks/db bucket=s3://locks/x",
                "db=n1,other=n2",
                "db=3,bucket=7",
                "--nonces names no lock \"bucket\"",
            ),
            (
                "db=s3://locks/db db=s3://locks/x",
                "db=n1,bucket=n2",
                "db=3,bucket=7",
                "--urls names lock \"db\" more than once",
            ),
            (
                "db=s3://locks/db bucket=s3://locks/x",
                "db=n1,bucket=n2",
                "db=3,bucket=x",
                "--fences: bucket: \"x\" is not a fence",
            ),
            (
                "db=s3://locks/db bucket",
                "db=n1,bucket=n2",
                "db=3,bucket=7",
                "--urls: \"bucket\" is not NAME=VALUE",
            ),
            (
                "",
                "",
                "",
                "--urls (LOCKWARDEN_URLS) is missing or empty: is the Pod's lockwarden.io/urls annotation set?",
            ),
            ("db=nope://x", "db=n1", "db=1", "--urls: db: "),
        ] {
            let error = several(urls, nonces, fences).unwrap_err().to_string();
            assert!(
                error.contains(says),
                "{urls:?} {nonces:?} {fences:?}: {error}"
            );
        }
    }
}

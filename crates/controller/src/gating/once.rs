//! Once per run at the gate (docs/design.md §6.7): which run a workload is, from its
//! annotations and what its kind scheduled (a Job's CronJob and scheduled time), and
//! the rules a workload asking for it must meet. The run key goes on the workload's own
//! lock (`spec.runKey`); the lock controller and the store do the rest.

use std::collections::BTreeMap;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::ObjectReference;

use super::decide::{Gate, LockSet};
use super::{TEMPLATE_ANNOTATION, TEMPLATES_ANNOTATION};
use lockwarden_api::DistributedLock;
use lockwarden_api::conditions::{self, reason};
use lockwarden_core::{RunKey, RunKeyError, rfc3339};

/// Annotation: `"true"` runs the workload at most once per run key across every
/// cluster sharing its lock's key (on a CronJob: in `spec.jobTemplate.metadata`).
pub const ONCE_ANNOTATION: &str = "lockwarden.io/once";
/// Annotation: the workload's run key, for a workload its kind did not schedule (or
/// to name the run otherwise).
pub const RUN_KEY_ANNOTATION: &str = "lockwarden.io/run-key";

/// A run the workload's owner scheduled: for a Job a CronJob created, the CronJob and
/// the instant of `batch.kubernetes.io/cronjob-scheduled-timestamp`.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduledRun {
    /// `<namespace>/<cronjob>@<UTC RFC 3339>`, with the instant as its scheduled time.
    pub key: RunKey,
    /// The owner, for its Events.
    pub owner: ObjectReference,
}

impl ScheduledRun {
    /// The run `owner` (in `namespace`) scheduled at `scheduled`, as its annotation
    /// gives it (RFC 3339 in the owner's time zone: compared as an instant).
    pub fn parse(
        namespace: &str,
        owner: ObjectReference,
        scheduled: &str,
    ) -> Result<ScheduledRun, OnceError> {
        let instant: jiff::Timestamp =
            scheduled
                .parse()
                .map_err(|e: jiff::Error| OnceError::ScheduledTime {
                    value: scheduled.into(),
                    reason: e.to_string(),
                })?;
        let at = SystemTime::from(instant);
        let name = owner.name.clone().unwrap_or_default();
        let key = RunKey::scheduled(format!("{namespace}/{name}@{}", rfc3339(at)), at)
            .map_err(OnceError::RunKey)?;
        Ok(ScheduledRun { key, owner })
    }
}

/// A workload that asks for once per run and cannot be given it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OnceError {
    #[error("{ONCE_ANNOTATION}: {0:?} is neither \"true\" nor \"false\"")]
    NotABool(String),
    #[error("{RUN_KEY_ANNOTATION}: {0}")]
    RunKey(#[source] RunKeyError),
    #[error(
        "{RUN_KEY_ANNOTATION} is set without {ONCE_ANNOTATION}: \"true\"; a run key alone \
         asks for nothing — add {ONCE_ANNOTATION}: \"true\" or remove it"
    )]
    RunKeyWithoutOnce,
    #[error(
        "{ONCE_ANNOTATION} needs a run key: a Job created by a CronJob has one (its \
         scheduled time), any other {kind} must set {RUN_KEY_ANNOTATION} (e.g. a Job made \
         with `kubectl create job --from=cronjob/…` has no scheduled time)"
    )]
    NoRunKey { kind: &'static str },
    #[error(
        "{RUN_KEY_ANNOTATION} {given:?} disagrees with the run its CronJob scheduled \
         ({scheduled}); remove {RUN_KEY_ANNOTATION} or give the same instant"
    )]
    Disagrees { given: String, scheduled: String },
    #[error(
        "{ONCE_ANNOTATION} needs exactly one lock made from a template \
         ({TEMPLATE_ANNOTATION}): the workload's own lock carries its run key; not a \
         named lock, not several ({TEMPLATES_ANNOTATION})"
    )]
    NeedsOneTemplate,
    #[error(
        "batch.kubernetes.io/cronjob-scheduled-timestamp {value:?} is not an RFC 3339 \
         time: {reason}"
    )]
    ScheduledTime { value: String, reason: String },
}

/// The run a workload of `kind` with `annotations` is, if it asks for once per run:
/// its `lockwarden.io/run-key`, else the run its owner `scheduled`
/// (`<namespace>/<cronjob>@<instant>`: clusters share runs of CronJobs of one namespace
/// and name). Both must agree (the same text, or the same instant), and the given key
/// names the run; `once` needs one of them and exactly one own lock made from a
/// template.
pub fn run_of(
    annotations: &BTreeMap<String, String>,
    scheduled: Option<Result<ScheduledRun, OnceError>>,
    locks: &LockSet,
    kind: &'static str,
) -> Result<Option<(RunKey, Option<ObjectReference>)>, OnceError> {
    let once = match annotations.get(ONCE_ANNOTATION).map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => return Err(OnceError::NotABool(other.into())),
    };
    let given = annotations
        .get(RUN_KEY_ANNOTATION)
        .map(|k| RunKey::new(k.clone()).map_err(OnceError::RunKey))
        .transpose()?;
    if !once {
        return match given {
            Some(_) => Err(OnceError::RunKeyWithoutOnce),
            None => Ok(None),
        };
    }
    if !matches!(locks.0.as_slice(), [Gate::Template(_)]) {
        return Err(OnceError::NeedsOneTemplate);
    }
    let scheduled = scheduled.transpose()?;
    match (given, scheduled) {
        (None, None) => Err(OnceError::NoRunKey { kind }),
        (Some(given), None) => Ok(Some((given, None))),
        (None, Some(run)) => Ok(Some((run.key, Some(run.owner)))),
        (Some(given), Some(run)) => {
            let same = given.as_str() == run.key.as_str()
                || given.scheduled_at().is_some() && given.scheduled_at() == run.key.scheduled_at();
            if !same {
                return Err(OnceError::Disagrees {
                    given: given.to_string(),
                    scheduled: run.key.to_string(),
                });
            }
            // The name the workload gives its run wins: clusters whose CronJobs live
            // under other namespaces or names still share runs.
            Ok(Some((given, Some(run.owner))))
        }
    }
}

/// Its own lock says the run is already completed: granted and let go at once by the
/// lock controller (`Acquired` reason `RunCompleted`, for this generation); why.
pub fn run_completed(lock: &DistributedLock) -> Option<String> {
    let status = lock.status.as_ref()?;
    if status.observed_generation != lock.metadata.generation {
        return None;
    }
    let acquired = conditions::find_condition(&status.conditions, conditions::ACQUIRED)?;
    (acquired.reason == reason::RUN_COMPLETED).then(|| acquired.message.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cronjob() -> ObjectReference {
        ObjectReference {
            api_version: Some("batch/v1".into()),
            kind: Some("CronJob".into()),
            name: Some("nightly".into()),
            namespace: Some("payments".into()),
            ..Default::default()
        }
    }

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn template() -> LockSet {
        LockSet::one(Gate::Template("nightly".into()))
    }

    /// The scheduled time is compared as an instant: a CronJob in Europe/Berlin and one
    /// in UTC scheduling the same instant name the same run.
    #[test]
    fn once_a_cronjobs_scheduled_time_is_an_instant_whatever_its_time_zone() {
        let berlin = ScheduledRun::parse("payments", cronjob(), "2026-12-03T03:00:00+01:00");
        let utc = ScheduledRun::parse("payments", cronjob(), "2026-12-03T02:00:00Z");
        let (berlin, utc) = (berlin.unwrap(), utc.unwrap());
        assert_eq!(berlin.key, utc.key);
        assert_eq!(berlin.key.as_str(), "payments/nightly@2026-12-03T02:00:00Z");
        let once = annotations(&[(ONCE_ANNOTATION, "true")]);
        let (run, owner) = run_of(&once, Some(Ok(berlin)), &template(), "Job")
            .unwrap()
            .unwrap();
        assert_eq!(run.as_str(), "payments/nightly@2026-12-03T02:00:00Z");
        assert_eq!(owner.unwrap().kind.as_deref(), Some("CronJob"));
        // The same instant given as a run key agrees; another disagrees.
        let same = annotations(&[
            (ONCE_ANNOTATION, "true"),
            (RUN_KEY_ANNOTATION, "2026-12-03T02:00:00Z"),
        ]);
        assert!(run_of(&same, Some(Ok(utc.clone())), &template(), "Job").is_ok());
        let other = annotations(&[
            (ONCE_ANNOTATION, "true"),
            (RUN_KEY_ANNOTATION, "2026-12-04T02:00:00Z"),
        ]);
        assert!(matches!(
            run_of(&other, Some(Ok(utc)), &template(), "Job"),
            Err(OnceError::Disagrees { .. })
        ));
    }

    #[test]
    fn bad_input_once_without_what_it_needs_is_refused_naming_it() {
        let once = annotations(&[(ONCE_ANNOTATION, "true")]);
        assert_eq!(
            run_of(&once, None, &template(), "Job"),
            Err(OnceError::NoRunKey { kind: "Job" })
        );
        let named = LockSet::one(Gate::Named("db".into()));
        let keyed = annotations(&[(ONCE_ANNOTATION, "true"), (RUN_KEY_ANNOTATION, "r")]);
        assert_eq!(
            run_of(&keyed, None, &named, "Job"),
            Err(OnceError::NeedsOneTemplate)
        );
        let empty = annotations(&[(ONCE_ANNOTATION, "true"), (RUN_KEY_ANNOTATION, "")]);
        assert!(matches!(
            run_of(&empty, None, &template(), "Job"),
            Err(OnceError::RunKey(RunKeyError::Empty))
        ));
        let long = "x".repeat(400);
        let too_long = annotations(&[(ONCE_ANNOTATION, "true"), (RUN_KEY_ANNOTATION, &long)]);
        assert!(matches!(
            run_of(&too_long, None, &template(), "Job"),
            Err(OnceError::RunKey(RunKeyError::TooLong(400)))
        ));
        let alone = annotations(&[(RUN_KEY_ANNOTATION, "r")]);
        assert_eq!(
            run_of(&alone, None, &template(), "Job"),
            Err(OnceError::RunKeyWithoutOnce)
        );
        let yes = annotations(&[(ONCE_ANNOTATION, "yes")]);
        assert_eq!(
            run_of(&yes, None, &template(), "Job"),
            Err(OnceError::NotABool("yes".into()))
        );
        assert!(ScheduledRun::parse("ns", cronjob(), "tonight").is_err());
        // Not asked for: nothing.
        assert_eq!(run_of(&BTreeMap::new(), None, &template(), "Job"), Ok(None));
    }
}

//! The pure part of Job gating: what a Job's annotations ask for, and which phase a
//! Job is in. No API calls here, so every decision has a unit test. The decisions
//! Jobs share with Pods (which lock, held or not) are in [`crate::controller::gating::decide`].

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;

use crate::api::conditions;

pub use crate::controller::gating::decide::{Gate, LockSet, LossPolicy, max_lost_grace};
use crate::controller::gating::lockset::{self, WorkloadLock};
use crate::controller::gating::{FENCES_ANNOTATION, Kind, Workload, decide};

use super::{
    FENCE_ANNOTATION, FINALIZER, LOST_FENCE_ANNOTATION, ON_LOCK_LOST_ANNOTATION, STOPPED_ANNOTATION,
};

/// What happens to a running Job whose lock is no longer held
/// (`lockwarden.io/on-lock-lost`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnLockLost {
    /// Suspend it (the Job controller deletes its Pods), then wait for the lock again
    /// and resume with the new fence. The default.
    Suspend,
    /// Suspend it, mark it stopped by lockwarden and release its lock; never resumed.
    Fail,
    /// Keep it running; a Warning Event says the lock is no longer held.
    Ignore,
}

impl OnLockLost {
    pub const ALLOWED: &'static str = "suspend, fail, ignore";

    pub fn parse(value: &str) -> Option<OnLockLost> {
        match value {
            "suspend" => Some(OnLockLost::Suspend),
            "fail" => Some(OnLockLost::Fail),
            "ignore" => Some(OnLockLost::Ignore),
            _ => None,
        }
    }
}

/// Everything a gated Job's annotations ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub locks: LockSet,
    pub on_lock_lost: OnLockLost,
    /// How long a lock that stopped being claimable (`LeaseExpiring`) may stay so
    /// before the Job is stopped; zero by default.
    pub lost_grace: Duration,
}

impl Settings {
    /// What the Job's annotations say about losing its lock.
    pub fn loss_policy(&self) -> LossPolicy {
        LossPolicy {
            ignores: self.on_lock_lost == OnLockLost::Ignore,
            lost_grace: self.lost_grace,
        }
    }
}

/// The Job's settings, `None` for a Job that names no lock, or why its annotations
/// cannot be acted on.
pub fn settings(job: &Job) -> Result<Option<Settings>, String> {
    let annotations = job.annotations();
    let Some(locks) = locks(annotations)? else {
        return Ok(None);
    };
    let on_lock_lost = match annotations.get(ON_LOCK_LOST_ANNOTATION) {
        None => OnLockLost::Suspend,
        Some(value) => OnLockLost::parse(value).ok_or_else(|| {
            format!(
                "{ON_LOCK_LOST_ANNOTATION}: {value:?} is not one of {}",
                OnLockLost::ALLOWED
            )
        })?,
    };
    let lost_grace = decide::lost_grace(annotations, Kind::Job)?;
    Ok(Some(Settings {
        locks,
        on_lock_lost,
        lost_grace,
    }))
}

/// The Job's locks from its annotations, `None` if it names none.
pub fn locks(annotations: &BTreeMap<String, String>) -> Result<Option<LockSet>, String> {
    decide::locks(annotations, Kind::Job)
}

/// Where a gated Job stands; decides which phase function reconciles it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobPhase {
    /// Being deleted.
    Deleted,
    /// `Complete` or `Failed`.
    Finished,
    /// Stopped by lockwarden (`on-lock-lost: fail`): never started again.
    Stopped,
    /// Started by lockwarden with a fence, not stopped since.
    Running,
    /// Not started (or stopped after a loss, to start again), and suspended.
    Gated,
    /// Not started and not suspended: it runs without waiting for the lock.
    NotSuspended,
}

/// The phase of a Job whose settings are valid.
pub fn phase(job: &Job) -> JobPhase {
    if job.metadata.deletion_timestamp.is_some() {
        JobPhase::Deleted
    } else if finished(job).is_some() {
        JobPhase::Finished
    } else if job.annotations().contains_key(STOPPED_ANNOTATION) {
        JobPhase::Stopped
    } else if running(job) {
        JobPhase::Running
    } else if suspended(job) {
        JobPhase::Gated
    } else {
        JobPhase::NotSuspended
    }
}

/// `Complete` or `Failed`: the Job's pods are done. (`SuccessCriteriaMet` and
/// `FailureTarget` come first and do not count: since Kubernetes 1.31 the terminal
/// condition is added only after every pod has terminated, and a lock released
/// earlier could let the next holder overlap a pod still shutting down.)
pub fn finished(job: &Job) -> Option<&'static str> {
    let conditions = job.status.as_ref()?.conditions.as_ref()?;
    ["Complete", "Failed"].into_iter().find(|t| {
        conditions
            .iter()
            .any(|c| c.type_ == *t && c.status == conditions::TRUE)
    })
}

/// Started by lockwarden and not stopped since: its pod template carries the fence (or
/// fences) it was started with, and no loss has been recorded against it.
pub fn running(job: &Job) -> bool {
    (template_annotation(job, FENCE_ANNOTATION).is_some()
        || template_annotation(job, FENCES_ANNOTATION).is_some())
        && !job.annotations().contains_key(LOST_FENCE_ANNOTATION)
        && !job.annotations().contains_key(STOPPED_ANNOTATION)
}

/// Per lock, the fence the Job ran with before lockwarden stopped it after a loss
/// (`lockwarden.io/lost-fence`: a fence for one lock, `NAME=FENCE,…` for several).
pub fn lost_fences(job: &Job, locks: &[WorkloadLock]) -> BTreeMap<String, i64> {
    let Some(value) = job.annotations().get(LOST_FENCE_ANNOTATION) else {
        return BTreeMap::new();
    };
    match (value.parse::<i64>(), locks) {
        (Ok(fence), [only]) => BTreeMap::from([(only.name.clone(), fence)]),
        _ => lockset::parse_fences(value)
            .into_iter()
            .map(|(n, f)| (n.to_string(), f))
            .collect(),
    }
}

/// The fences the Job's pod template carries, per lock.
pub fn template_fences(job: &Job, locks: &[WorkloadLock]) -> Vec<(String, Option<i64>)> {
    let annotations = job
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    lockset::fences_of(&annotations, locks)
}

/// An annotation of the Job's pod template (where the fence goes).
pub fn template_annotation<'a>(job: &'a Job, key: &str) -> Option<&'a String> {
    job.spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(key)
}

pub fn suspended(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false)
}

pub fn has_finalizer(job: &Job) -> bool {
    job.finalizers().iter().any(|f| f == FINALIZER)
}

/// Whether the Job controller is done with the Pods of a suspended Job: none active or
/// terminating, so a restart cannot overlap them.
pub fn pods_gone(job: &Job) -> bool {
    let Some(status) = &job.status else {
        return true;
    };
    status.active.unwrap_or(0) == 0 && status.terminating.unwrap_or(0) == 0
}

/// The name of a Job's own lock: the Job's name and the start of its uid, so a Job
/// recreated under the same name never finds its predecessor's lock.
pub fn per_job_lock_name(job: &Job) -> String {
    workload(job).own_lock_name()
}

/// The Job as the shared gating layer sees it.
pub fn workload(job: &Job) -> Workload {
    Workload::of(Kind::Job, job)
}

#[cfg(test)]
mod tests;

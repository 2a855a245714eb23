//! The pure part of Job gating: what a Job's annotations ask for, and which phase a
//! Job is in. No API calls here, so every decision has a unit test.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;

use crate::api::conditions::{self, ACQUIRED, reason};
use crate::api::{DistributedLock, LockPhase};
use crate::duration::{format_duration, parse_duration};
use crate::lock::{SafetyMargins, names};

use super::{
    FENCE_ANNOTATION, FINALIZER, LOCK_ANNOTATION, LOST_FENCE_ANNOTATION, LOST_GRACE_ANNOTATION,
    ON_LOCK_LOST_ANNOTATION, STOPPED_ANNOTATION, TEMPLATE_ANNOTATION,
};

/// The lock a Job asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// `lockwarden.io/lock`: an existing DistributedLock, claimed while the Job runs.
    Named(String),
    /// `lockwarden.io/lock-template`: a DistributedLock of its own, copied from this.
    Template(String),
}

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
    pub gate: Gate,
    pub on_lock_lost: OnLockLost,
    /// How long a lock that stopped being claimable (`LeaseExpiring`) may stay so
    /// before the Job is stopped; zero by default.
    pub lost_grace: Duration,
}

/// The longest `lockwarden.io/lost-grace` that still stops the Job before another
/// holder may acquire the key.
///
/// The holder stops claiming at `sent + lease × (1 − δ) − margin` (rule 2); a contender
/// that started observing the record no earlier than `sent` takes over at the soonest
/// after `(lease + grace) × (1 − δ)` of real time (its clock may run δ fast). The gap
/// between the two, `grace × (1 − δ) + margin`, does not depend on the lease: that is
/// all a Job may wait past the holder deadline. (The Job's own stop then takes an API
/// round trip or two, which comes out of the same gap: hence strictly less.)
pub fn max_lost_grace(margins: &SafetyMargins) -> Duration {
    margins.grace.mul_f64(1.0 - margins.drift) + margins.margin
}

/// The Job's settings, `None` for a Job that names no lock, or why its annotations
/// cannot be acted on.
pub fn settings(job: &Job) -> Result<Option<Settings>, String> {
    let annotations = job.annotations();
    let Some(gate) = gate(annotations)? else {
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
    let lost_grace = match annotations.get(LOST_GRACE_ANNOTATION) {
        None => Duration::ZERO,
        Some(value) => lost_grace(value)?,
    };
    Ok(Some(Settings {
        gate,
        on_lock_lost,
        lost_grace,
    }))
}

fn lost_grace(value: &str) -> Result<Duration, String> {
    let grace =
        parse_duration(value).map_err(|e| format!("{LOST_GRACE_ANNOTATION}: {value:?}: {e}"))?;
    let max = max_lost_grace(&SafetyMargins::default());
    if grace >= max {
        return Err(format!(
            "{LOST_GRACE_ANNOTATION}: {value:?} would keep the Job running past the point \
             where another holder may acquire the lock; it must be less than {} (the gap \
             between the holder deadline and the earliest takeover)",
            format_duration(max)
        ));
    }
    Ok(grace)
}

/// The Job's gate from its annotations, `None` if it names no lock.
pub fn gate(annotations: &BTreeMap<String, String>) -> Result<Option<Gate>, String> {
    let (which, name, gate): (&str, &String, fn(String) -> Gate) = match (
        annotations.get(LOCK_ANNOTATION),
        annotations.get(TEMPLATE_ANNOTATION),
    ) {
        (None, None) => return Ok(None),
        (Some(_), Some(_)) => {
            return Err(format!(
                "both {LOCK_ANNOTATION} and {TEMPLATE_ANNOTATION} are set; a Job names one lock"
            ));
        }
        (Some(n), None) => (LOCK_ANNOTATION, n, Gate::Named),
        (None, Some(n)) => (TEMPLATE_ANNOTATION, n, Gate::Template),
    };
    if name.contains('/') {
        return Err(format!(
            "{which}: {name:?} names a lock in another namespace; a Job can only use a \
             DistributedLock in its own namespace (give the name alone)"
        ));
    }
    // The same rule as the CRD's metadata.name and the CLI's Lease names.
    if let Err(e) = names::kubernetes_name(name).map_err(|e| e.named("DistributedLock name")) {
        return Err(format!("{which}: {e}"));
    }
    Ok(Some(gate(name.clone())))
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

/// Started by lockwarden and not stopped since: its pod template carries the fence it
/// was started with, and no loss has been recorded against it.
pub fn running(job: &Job) -> bool {
    template_annotation(job, FENCE_ANNOTATION).is_some()
        && !job.annotations().contains_key(LOST_FENCE_ANNOTATION)
        && !job.annotations().contains_key(STOPPED_ANNOTATION)
}

/// The fence the Job ran with before lockwarden stopped it after a loss: its restart
/// must come with a higher one.
pub fn lost_fence(job: &Job) -> Option<i64> {
    job.annotations().get(LOST_FENCE_ANNOTATION)?.parse().ok()
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

/// The fence the Job's pod template carries.
pub fn template_fence(job: &Job) -> Option<i64> {
    template_annotation(job, FENCE_ANNOTATION)?.parse().ok()
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
    let uid = job.uid().unwrap_or_default();
    format!("{}-{}", job.name_any(), &uid[..uid.len().min(8)])
}

/// `<job name>/<job uid>`, written in the lock's claim annotation.
pub fn claim_of(job: &Job) -> String {
    format!("{}/{}", job.name_any(), job.uid().unwrap_or_default())
}

/// Acquired for its current spec, with a fence: what a Job may be started with.
pub fn held(lock: &DistributedLock) -> Option<(i64, String)> {
    let status = lock.status.as_ref()?;
    let generation = lock.metadata.generation;
    let condition = conditions::find_condition(&status.conditions, ACQUIRED)?;
    (condition.status == conditions::TRUE
        && condition.observed_generation == generation
        && status.observed_generation == generation
        && lock.metadata.deletion_timestamp.is_none())
    .then_some(())?;
    Some((status.fence?, status.holder.clone()?))
}

/// Whether `lock` still carries an acquisition a stopped Job ran with (fence at most
/// `lost_fence`): it must be let go and acquired anew before the Job starts again.
pub fn is_old_acquisition(lock: &DistributedLock, lost_fence: i64) -> bool {
    let Some(status) = &lock.status else {
        return false;
    };
    !lock.spec.release
        && matches!(status.phase, Some(LockPhase::Held | LockPhase::Lost))
        && status.fence.is_some_and(|f| f <= lost_fence)
}

/// Why a lock is not (yet) held, and whether that is a problem (Warning) rather than
/// ordinary waiting.
pub fn not_held_reason(lock: &DistributedLock) -> (String, bool) {
    let name = lock.name_any();
    let Some(status) = &lock.status else {
        return (format!("waiting for lock {name}: not acquired yet"), false);
    };
    let message = conditions::find_condition(&status.conditions, ACQUIRED)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    match status.phase {
        Some(LockPhase::Waiting) => {
            let holder = status.holder.as_deref().unwrap_or("another holder");
            let position = status
                .queue_position
                .map(|p| format!(", queue position {p}"))
                .unwrap_or_default();
            (
                format!("waiting for lock {name}: held by {holder}{position}"),
                false,
            )
        }
        Some(phase @ (LockPhase::Failed | LockPhase::Lost)) => (
            format!("lock {name} is {}: {message}", phase.as_str()),
            true,
        ),
        _ if message.is_empty() => (format!("waiting for lock {name}: not acquired yet"), false),
        _ => (format!("waiting for lock {name}: {message}"), false),
    }
}

/// How a running Job's lock stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockStanding {
    /// Held with the fence the Job was started with.
    Held,
    /// Not held. `reason` labels the metric and the Event (`LeaseExpiring`, `Lost`,
    /// `LockDeleted`, `NotHeld`); `may_recover`: only the holder deadline passed (the
    /// lock may come back if a renewal gets through), so `lost-grace` applies.
    NotHeld {
        reason: &'static str,
        why: String,
        may_recover: bool,
    },
}

/// The standing of the lock a running Job was started with `fence`. Read from what
/// the status says now, whatever generation it describes: a spec edit the lock
/// controller has not reported on yet does not make the Job lose its lock.
pub fn standing(lock: Option<&DistributedLock>, name: &str, fence: Option<i64>) -> LockStanding {
    let Some(lock) = lock.filter(|l| l.metadata.deletion_timestamp.is_none()) else {
        return LockStanding::NotHeld {
            reason: "LockDeleted",
            why: format!("lock {name} was deleted"),
            may_recover: false,
        };
    };
    let status = lock.status.clone().unwrap_or_default();
    let acquired = conditions::find_condition(&status.conditions, ACQUIRED);
    let same_fence = fence.is_some() && status.fence == fence;
    if status.phase == Some(LockPhase::Held) && same_fence {
        match acquired {
            Some(c) if c.status == conditions::TRUE => return LockStanding::Held,
            Some(c) if c.reason == reason::LEASE_EXPIRING => {
                return LockStanding::NotHeld {
                    reason: reason::LEASE_EXPIRING,
                    why: format!("lock {name}: {}", c.message),
                    may_recover: true,
                };
            }
            _ => {}
        }
    }
    let why = not_held_reason(lock).0;
    let reason = if status.phase == Some(LockPhase::Lost) {
        reason::LOST
    } else {
        "NotHeld"
    };
    LockStanding::NotHeld {
        reason,
        why,
        may_recover: false,
    }
}

/// What to do about a running Job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunningAction {
    /// The lock is held: nothing to do.
    Continue,
    /// `ignore`: warn that the lock is no longer held, keep running.
    Warn,
    /// Within `lost-grace`: look again after this long.
    WaitGrace(Duration),
    /// Stop the Job (`suspend` or `fail`).
    Stop,
}

/// The decision for a running Job: `not_held_for` is how long this controller has
/// seen the lock not held (zero the first time).
pub fn running_action(
    standing: &LockStanding,
    settings: &Settings,
    not_held_for: Duration,
) -> RunningAction {
    match standing {
        LockStanding::Held => RunningAction::Continue,
        LockStanding::NotHeld { .. } if settings.on_lock_lost == OnLockLost::Ignore => {
            RunningAction::Warn
        }
        LockStanding::NotHeld { may_recover, .. }
            if *may_recover && not_held_for < settings.lost_grace =>
        {
            RunningAction::WaitGrace(settings.lost_grace - not_held_for)
        }
        LockStanding::NotHeld { .. } => RunningAction::Stop,
    }
}

#[cfg(test)]
mod tests;

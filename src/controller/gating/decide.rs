//! The pure decisions every gated workload shares: which lock its annotations name,
//! whether that lock is held for it, and what to do about a running workload whose
//! lock is not. No API calls here; unit-tested through the Job and Pod gates.

use std::collections::BTreeMap;
use std::time::Duration;

use kube::ResourceExt;

use crate::api::conditions::{self, ACQUIRED, reason};
use crate::api::{DistributedLock, LockPhase};
use crate::duration::{format_duration, parse_duration};
use crate::lock::{SafetyMargins, names};

use super::{Kind, LOCK_ANNOTATION, LOST_GRACE_ANNOTATION, TEMPLATE_ANNOTATION};

/// The lock a workload asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// `lockwarden.io/lock`: an existing DistributedLock, claimed while the workload runs.
    Named(String),
    /// `lockwarden.io/lock-template`: a DistributedLock of its own, copied from this.
    Template(String),
}

/// The workload's gate from its annotations, `None` if it names no lock.
pub fn gate(annotations: &BTreeMap<String, String>, kind: Kind) -> Result<Option<Gate>, String> {
    let kind = kind.as_str();
    let (which, name, gate): (&str, &String, fn(String) -> Gate) = match (
        annotations.get(LOCK_ANNOTATION),
        annotations.get(TEMPLATE_ANNOTATION),
    ) {
        (None, None) => return Ok(None),
        (Some(_), Some(_)) => {
            return Err(format!(
                "both {LOCK_ANNOTATION} and {TEMPLATE_ANNOTATION} are set; a {kind} names one lock"
            ));
        }
        (Some(n), None) => (LOCK_ANNOTATION, n, Gate::Named),
        (None, Some(n)) => (TEMPLATE_ANNOTATION, n, Gate::Template),
    };
    if name.contains('/') {
        return Err(format!(
            "{which}: {name:?} names a lock in another namespace; a {kind} can only use a \
             DistributedLock in its own namespace (give the name alone)"
        ));
    }
    // The same rule as the CRD's metadata.name and the CLI's Lease names.
    if let Err(e) = names::kubernetes_name(name).map_err(|e| e.named("DistributedLock name")) {
        return Err(format!("{which}: {e}"));
    }
    Ok(Some(gate(name.clone())))
}

/// The longest `lockwarden.io/lost-grace` that still stops the workload before another
/// holder may acquire the key.
///
/// The holder stops claiming at `sent + lease × (1 − δ) − margin` (rule 2); a contender
/// that started observing the record no earlier than `sent` takes over at the soonest
/// after `(lease + grace) × (1 − δ)` of real time (its clock may run δ fast). The gap
/// between the two, `grace × (1 − δ) + margin`, does not depend on the lease: that is
/// all a workload may wait past the holder deadline. (Its own stop then takes an API
/// round trip or two, which comes out of the same gap: hence strictly less.)
pub fn max_lost_grace(margins: &SafetyMargins) -> Duration {
    margins.grace.mul_f64(1.0 - margins.drift) + margins.margin
}

/// `lockwarden.io/lost-grace` of a workload of `kind`: zero when absent.
pub fn lost_grace(annotations: &BTreeMap<String, String>, kind: Kind) -> Result<Duration, String> {
    let Some(value) = annotations.get(LOST_GRACE_ANNOTATION) else {
        return Ok(Duration::ZERO);
    };
    let grace =
        parse_duration(value).map_err(|e| format!("{LOST_GRACE_ANNOTATION}: {value:?}: {e}"))?;
    let max = max_lost_grace(&SafetyMargins::default());
    if grace >= max {
        return Err(format!(
            "{LOST_GRACE_ANNOTATION}: {value:?} would keep the {} running past the point \
             where another holder may acquire the lock; it must be less than {} (the gap \
             between the holder deadline and the earliest takeover)",
            kind.as_str(),
            format_duration(max)
        ));
    }
    Ok(grace)
}

/// Acquired for its current spec, with a fence: what a workload may be started with.
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

/// Whether `lock` still carries an acquisition a stopped workload ran with (fence at
/// most `lost_fence`): it must be let go and acquired anew before the workload starts
/// again.
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

/// How a running workload's lock stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockStanding {
    /// Held with the fence the workload was started with.
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

/// The standing of the lock a running workload was started with `fence`. Read from
/// what the status says now, whatever generation it describes: a spec edit the lock
/// controller has not reported on yet does not make the workload lose its lock.
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

/// What to do about a running workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunningAction {
    /// The lock is held: nothing to do.
    Continue,
    /// `ignore`: warn that the lock is no longer held, keep running.
    Warn,
    /// Within `lost-grace`: look again after this long.
    WaitGrace(Duration),
    /// Stop the workload (as its `on-lock-lost` says).
    Stop,
}

/// The decision for a running workload whose policy ignores a loss (`ignores`) or
/// stops it after `lost_grace`: `not_held_for` is how long this controller has seen
/// the lock not held (zero the first time).
pub fn running_action(
    standing: &LockStanding,
    ignores: bool,
    lost_grace: Duration,
    not_held_for: Duration,
) -> RunningAction {
    match standing {
        LockStanding::Held => RunningAction::Continue,
        LockStanding::NotHeld { .. } if ignores => RunningAction::Warn,
        LockStanding::NotHeld { may_recover, .. } if *may_recover && not_held_for < lost_grace => {
            RunningAction::WaitGrace(lost_grace - not_held_for)
        }
        LockStanding::NotHeld { .. } => RunningAction::Stop,
    }
}

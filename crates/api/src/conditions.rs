//! `status.conditions`: types, reasons and helpers.
//!
//! Conditions are a list-map keyed by `type`, each with `observedGeneration`, so
//! `kubectl wait --for=condition=Acquired` ignores a condition about an older spec.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition type: the lock is held by this object (`True`), or not (`False`, with a
/// reason saying why).
pub const ACQUIRED: &str = "Acquired";

/// Condition `status` values.
pub const TRUE: &str = "True";
pub const FALSE: &str = "False";
pub const UNKNOWN: &str = "Unknown";

/// Condition reasons (CamelCase, as Kubernetes requires).
pub mod reason {
    /// Held, lease renewed in time.
    pub const LEASE_HELD: &str = "LeaseHeld";
    /// Not acquired yet: first attempt pending.
    pub const PENDING: &str = "Pending";
    /// Someone else holds the lock; waiting for it.
    pub const WAITING: &str = "Waiting";
    /// Renewals are failing; our lease may expire before the backend answers again
    /// (rule 2: we stop claiming the lock before others could see it expired).
    pub const LEASE_EXPIRING: &str = "LeaseExpiring";
    /// The lock was taken over or its record vanished while we held it.
    pub const LOST: &str = "Lost";
    /// Let go: `spec.release` or deletion.
    pub const RELEASED: &str = "Released";
    /// Releasing is in progress.
    pub const RELEASING: &str = "Releasing";
    /// Acquired by force (`spec.force`), taking over another holder.
    pub const FORCED: &str = "Forced";
    /// The backend key holds a record lockwarden does not understand; never overwritten.
    pub const FOREIGN: &str = "Foreign";
    /// The key is held with other permits than this lock names (every lock on one key
    /// must name the same `spec.permits`).
    pub const PERMITS_DISAGREE: &str = "PermitsDisagree";
    /// `spec.acquireTimeout` passed before the lock was acquired.
    pub const ACQUIRE_TIMEOUT: &str = "AcquireTimeout";
    /// The spec cannot be acted on (e.g. credentials Secret missing).
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The backend could not be reached or answered with an error.
    pub const BACKEND_ERROR: &str = "BackendError";
    /// Any other failure.
    pub const FAILED: &str = "Failed";
    /// Once per run (docs/design.md §6.7): granted, but the key remembers `spec.runKey`
    /// as completed (or it is older than the memory reaches), so it was released at
    /// once: the run must not start. Final for this generation.
    pub const RUN_COMPLETED: &str = "RunCompleted";
    /// `spec.runKey` on a store or key that keeps no memory of completed runs
    /// (ZooKeeper; a key deleted on release).
    pub const RUNS_NOT_KEPT: &str = "RunsNotKept";
}

/// A condition with `lastTransitionTime` = `now`. `status` is `True` / `False`.
pub fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: Time,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if status { TRUE } else { FALSE }.to_string(),
        reason: reason.to_string(),
        message: message.into(),
        observed_generation,
        last_transition_time: now,
    }
}

/// The condition of `type_`, if present.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of `type_` is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find_condition(conditions, type_).is_some_and(|c| c.status == TRUE)
}

/// Sets `new` in `conditions` (replacing the one of the same type, or appending), and
/// says whether anything changed. When the status is unchanged, the existing
/// `lastTransitionTime` is kept (it records when the status last changed, not when we
/// last looked); a different reason, message or observedGeneration is still a change.
pub fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(existing) => {
            if existing.status == new.status {
                new.last_transition_time = existing.last_transition_time.clone();
            }
            if *existing == new {
                return false;
            }
            *existing = new;
            true
        }
        None => {
            conditions.push(new);
            true
        }
    }
}

/// Removes the condition of `type_`; whether there was one.
pub fn remove_condition(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    conditions.len() != before
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    /// `Acquired=False`, waiting, with `message`, written at `secs`.
    fn waiting(message: &str, secs: i64) -> Condition {
        condition(ACQUIRED, false, reason::WAITING, message, Some(1), at(secs))
    }

    #[test]
    fn set_keeps_transition_time_while_status_is_unchanged() {
        let mut conds = Vec::new();
        assert!(set_condition(&mut conds, waiting("held by x", 10)));
        // Same status and content: no change, time kept.
        assert!(!set_condition(&mut conds, waiting("held by x", 20)));
        assert_eq!(conds[0].last_transition_time, at(10));
        // Same status, new message: a change, time still kept.
        assert!(set_condition(&mut conds, waiting("held by y", 30)));
        assert_eq!(conds[0].last_transition_time, at(10));
        assert_eq!(conds[0].message, "held by y");
        // New status: new time.
        assert!(set_condition(
            &mut conds,
            condition(ACQUIRED, true, reason::LEASE_HELD, "", Some(2), at(40))
        ));
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0].last_transition_time, at(40));
        assert!(is_true(&conds, ACQUIRED));
        assert!(remove_condition(&mut conds, ACQUIRED));
        assert!(find_condition(&conds, ACQUIRED).is_none());
    }
}

//! Status: computed from what the controller knows, written with server-side apply
//! (field manager [`FIELD_MANAGER`](super::FIELD_MANAGER)) only when it differs from
//! the stored status. Times that change on every look (`renewedAt`) are set only when
//! something else changed, so a steady Held or Waiting lock costs no writes.

use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::api::conditions::{self, ACQUIRED};
use crate::api::{DistributedLock, DistributedLockStatus, LockPhase};

/// Now, in whole seconds.
pub fn now() -> Time {
    seconds(Timestamp::now())
}

/// `t` in whole seconds.
pub fn time(t: SystemTime) -> Option<Time> {
    Timestamp::try_from(t).ok().map(seconds)
}

/// A `metav1.Time` is stored with whole seconds, so a time with a fraction never
/// equals the stored one: every reconcile of a held lock then wrote its status again.
fn seconds(t: Timestamp) -> Time {
    Time(Timestamp::from_second(t.as_second()).unwrap_or(t))
}

/// What a status should say; applied onto the current status by [`next_status`].
#[derive(Clone, Debug, Default)]
pub struct Desired {
    pub phase: Option<LockPhase>,
    pub backend: Option<String>,
    pub key: Option<String>,
    pub holder: Option<String>,
    pub etag: Option<String>,
    pub fence: Option<i64>,
    pub nonce: Option<String>,
    pub acquired_at: Option<Time>,
    pub queue_position: Option<i32>,
    /// `Acquired` condition: status, reason, message.
    pub acquired: (bool, &'static str, String),
}

/// The status to write, or `None` when the stored one already says it all.
pub fn next_status(lock: &DistributedLock, desired: Desired) -> Option<DistributedLockStatus> {
    let current = lock.status.clone().unwrap_or_default();
    let generation = lock.metadata.generation;
    let mut next = current.clone();
    let held = desired.phase == Some(LockPhase::Held);
    next.phase = desired.phase;
    next.backend = desired.backend;
    next.key = desired.key;
    next.holder = desired.holder;
    next.etag = desired.etag;
    next.fence = desired.fence;
    next.nonce = desired.nonce;
    next.acquired_at = desired.acquired_at;
    next.queue_position = desired.queue_position;
    next.observed_generation = generation;
    next.lease_expires_at = None;
    if !held {
        next.renewed_at = None;
    }
    let (ok, reason, message) = desired.acquired;
    conditions::set_condition(
        &mut next.conditions,
        conditions::condition(ACQUIRED, ok, reason, message, generation, now()),
    );
    if next == current {
        return None;
    }
    if held {
        next.renewed_at = Some(now());
    }
    Some(next)
}

/// Writes `status` with server-side apply.
pub async fn write(
    api: &Api<DistributedLock>,
    name: &str,
    status: &DistributedLockStatus,
) -> kube::Result<()> {
    let patch = json!({
        "apiVersion": "lockwarden.io/v1alpha1",
        "kind": "DistributedLock",
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(super::FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DistributedLockSpec;
    use crate::api::conditions::reason;

    fn held(fence: i64) -> Desired {
        Desired {
            phase: Some(LockPhase::Held),
            backend: Some("kubernetes".into()),
            key: Some("k8s://ns/l".into()),
            holder: Some("c/ns/x".into()),
            etag: Some("1".into()),
            fence: Some(fence),
            nonce: Some("n".into()),
            acquired: (true, reason::LEASE_HELD, format!("held with fence {fence}")),
            ..Default::default()
        }
    }

    #[test]
    fn writes_only_on_transitions() {
        let mut lock = DistributedLock::new("x", DistributedLockSpec::default());
        lock.metadata.generation = Some(1);
        let first = next_status(&lock, held(1)).expect("a new status is a change");
        assert!(first.renewed_at.is_some());
        assert_eq!(first.observed_generation, Some(1));
        lock.status = Some(first.clone());
        // The same knowledge again (a resync, a resume): nothing to write.
        assert_eq!(next_status(&lock, held(1)), None);
        // A new fence is a transition.
        let second = next_status(&lock, held(2)).expect("changed");
        assert_eq!(second.fence, Some(2));
        // A new generation is reported even when nothing else changed.
        lock.metadata.generation = Some(2);
        assert_eq!(
            next_status(&lock, held(1)).unwrap().observed_generation,
            Some(2)
        );
        // Leaving Held clears renewedAt.
        let waiting = Desired {
            phase: Some(LockPhase::Waiting),
            acquired: (false, reason::WAITING, "held by y".into()),
            ..Default::default()
        };
        assert_eq!(next_status(&lock, waiting).unwrap().renewed_at, None);
    }

    /// The stored status comes back from the API server with whole-second times; a
    /// held lock with a sub-second `acquiredAt` must still compare equal to it.
    #[test]
    fn stored_times_compare_equal_after_a_round_trip() {
        let mut lock = DistributedLock::new("x", DistributedLockSpec::default());
        lock.metadata.generation = Some(1);
        let acquired_at =
            SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_123);
        let desired = || Desired {
            acquired_at: time(acquired_at),
            ..held(1)
        };
        let written = next_status(&lock, desired()).expect("a new status is a change");
        let stored: DistributedLockStatus =
            serde_json::from_value(serde_json::to_value(&written).unwrap()).unwrap();
        lock.status = Some(stored);
        assert_eq!(next_status(&lock, desired()), None);
    }
}

//! Status: computed from what the controller knows, written with server-side apply
//! (field manager [`FIELD_MANAGER`](super::config::FIELD_MANAGER)) only when it differs from
//! the stored status. Times that change on every look (`renewedAt`) are set only when
//! something else changed, so a steady Held or Waiting lock costs no writes.

use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::holders::Acquisition;
use lockwarden_api::conditions::{self, ACQUIRED, reason};
use lockwarden_api::{DistributedLock, DistributedLockStatus, HistoryEntry, LockPhase};
use lockwarden_core::history::{self, Grant};
use lockwarden_core::{FenceToken, LockRecord, QueueView, rfc3339};

/// How a key with more than one permit is held (docs/design.md §6.2), as a record
/// showed it: for `status.holders` and `status.permitsInUse`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Occupancy {
    pub holders: u32,
    pub in_use: u32,
    pub permits: u32,
}

impl Occupancy {
    /// `None` for a mutex's record (it has no holder set).
    pub fn of(record: &LockRecord) -> Option<Occupancy> {
        record.set.as_ref().map(|set| Occupancy {
            holders: set.holders.len() as u32,
            in_use: set.in_use(),
            permits: set.permits,
        })
    }
}

impl std::fmt::Display for Occupancy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = if self.holders == 1 { "" } else { "s" };
        write!(
            f,
            "{} holder{s}, {} of {} permits in use",
            self.holders, self.in_use, self.permits
        )
    }
}

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
    /// Where a queued waiter stands (docs/design.md §6.4): the queue's length, the
    /// expected start (RFC 3339, whole 10 s so a poll does not rewrite it), how often
    /// it was overtaken.
    pub queue_length: Option<i32>,
    pub expected_start: Option<String>,
    pub overtaken: Option<u32>,
    /// When the wait for the key began; kept while waiting (`acquireTimeout` counts
    /// from it across restarts).
    pub waiting_since: Option<Time>,
    /// How the key was held when last seen (keys with more than one permit).
    pub occupancy: Option<Occupancy>,
    /// The key's holder history as a record just read or written showed it; `None`:
    /// keep what status says.
    pub history: Option<Vec<HistoryEntry>>,
    /// `Acquired` condition: status, reason, message.
    pub acquired: (bool, &'static str, String),
    /// The lock is another tool's lock at that tool's name (`terraformCompatible`): the
    /// held condition says what that costs.
    pub as_a_tools_lock: bool,
}

/// What holding a Terraform/OpenTofu state lock as theirs costs (docs/design.md §6.8),
/// in the held condition's message.
const TOOLS_LOCK: &str = "held as a Terraform/OpenTofu state lock: deleted on release, so \
     the fence restarts at 1 with every holder (unfenced across holders) and the key keeps \
     no queue";

/// The key's holder history as `status.history` shows it.
pub fn history_entries(history: &[Grant]) -> Vec<HistoryEntry> {
    history
        .iter()
        .map(|g| HistoryEntry {
            holder: g.holder.clone(),
            cluster: g.cluster.clone(),
            fence: i64::try_from(g.fence.0).unwrap_or(i64::MAX),
            acquired_at: g.acquired_at().and_then(time),
            ended: g.ended.to_string(),
            ended_at: g.ended_at().and_then(time),
        })
        .collect()
}

impl Desired {
    /// What every status of a lock carries: its backend kind and key.
    pub fn for_key(kind: &str, key: &str) -> Desired {
        Desired {
            backend: Some(kind.to_string()),
            key: Some(key.to_string()),
            ..Default::default()
        }
    }

    /// Marks a lock held as another tool's lock at that tool's name.
    pub fn held_as_a_tools_lock(self, as_a_tools_lock: bool) -> Desired {
        Desired {
            as_a_tools_lock,
            ..self
        }
    }

    /// Held by this controller. `renewals_failing` (the last renewal error) when the
    /// holder deadline has passed: the lock is then not claimed.
    pub fn held(self, a: &Acquisition, renewals_failing: Option<&str>) -> Desired {
        let acquired = match (renewals_failing, &a.forced_from) {
            (Some(last_error), _) => (
                false,
                reason::LEASE_EXPIRING,
                format!("renewals failing, not claiming the lock: {last_error}"),
            ),
            (None, Some(from)) => (
                true,
                reason::FORCED,
                format!("taken over by force from {from}"),
            ),
            (None, None) => (
                true,
                reason::LEASE_HELD,
                match &a.occupancy {
                    Some(occupancy) => format!("held with fence {} ({occupancy})", a.fence),
                    None => format!("held with fence {}", a.fence),
                },
            ),
        };
        let acquired = match (acquired, self.as_a_tools_lock) {
            ((true, reason, message), true) => (true, reason, format!("{message}; {TOOLS_LOCK}")),
            (acquired, _) => acquired,
        };
        Desired {
            phase: Some(LockPhase::Held),
            holder: Some(a.holder.clone()),
            etag: Some(a.version.clone()),
            fence: Some(a.fence as i64),
            nonce: Some(a.nonce.clone()),
            acquired_at: time(a.acquired_at),
            occupancy: a.occupancy,
            history: Some(history_entries(&a.history)),
            acquired,
            ..self
        }
    }

    /// With the key's holder history as `holder` (a record just read) shows it.
    pub fn with_history_of(self, holder: &LockRecord) -> Desired {
        Desired {
            history: Some(history_entries(&history::of_record(holder))),
            ..self
        }
    }

    /// Waiting for `holder`, who holds the lock with `fence`.
    pub fn waiting(self, holder: &str, fence: FenceToken, queue_position: Option<u32>) -> Desired {
        Desired {
            phase: Some(LockPhase::Waiting),
            holder: Some(holder.to_string()),
            queue_position: queue_position.map(|p| p as i32),
            acquired: (
                false,
                reason::WAITING,
                format!("held by {holder} (fence {fence})"),
            ),
            ..self
        }
    }

    /// Waiting for a key with more than one permit, held as `occupancy` (the record's
    /// `holder` is then its first holder and `fence` the latest granted).
    pub fn waiting_for_permit(
        self,
        holder: &str,
        fence: FenceToken,
        queue_position: Option<u32>,
        occupancy: Occupancy,
    ) -> Desired {
        let waiting = self.waiting(holder, fence, queue_position);
        Desired {
            occupancy: Some(occupancy),
            acquired: (
                false,
                reason::WAITING,
                format!("no permit free: {occupancy} (latest fence {fence})"),
            ),
            ..waiting
        }
    }

    /// Where this waiter stands in the key's queue, if it is in one.
    pub fn in_queue(self, view: Option<QueueView>) -> Desired {
        let Some(view) = view else {
            return self;
        };
        let expected_start = view.expected_start.map(|t| {
            let secs = t
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or_default();
            rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(secs.div_ceil(10) * 10))
        });
        Desired {
            queue_position: Some(i32::try_from(view.position).unwrap_or(i32::MAX)),
            queue_length: Some(i32::try_from(view.length).unwrap_or(i32::MAX)),
            expected_start,
            overtaken: Some(view.overtaken).filter(|n| *n > 0),
            ..self
        }
    }

    /// The same, with the queue place `current` shows.
    pub fn keeping_place_of(self, current: &DistributedLockStatus) -> Desired {
        Desired {
            queue_position: current.queue_position,
            queue_length: current.queue_length,
            expected_start: current.expected_start.clone(),
            overtaken: current.overtaken,
            ..self
        }
    }

    /// Waiting since `started` (wall clock).
    pub fn since(self, started: Option<SystemTime>) -> Desired {
        Desired {
            waiting_since: started.and_then(time),
            ..self
        }
    }

    /// Not held, in `phase`, for `why`.
    pub fn not_held(self, phase: LockPhase, why: &'static str, message: String) -> Desired {
        Desired {
            phase: Some(phase),
            acquired: (false, why, message),
            ..self
        }
    }

    /// `Failed`: final for this generation.
    pub fn failed(self, why: &'static str, message: String) -> Desired {
        self.not_held(LockPhase::Failed, why, message)
    }
}

/// Whether writing `desired` would change nothing but the waiter's place in the queue
/// (position, length, expected start, overtaken).
pub fn only_the_place_moved(lock: &DistributedLock, desired: &Desired) -> bool {
    let Some(current) = lock.status.as_ref() else {
        return false;
    };
    let place_moved = current.queue_position != desired.queue_position
        || current.queue_length != desired.queue_length
        || current.expected_start != desired.expected_start
        || current.overtaken != desired.overtaken;
    if !place_moved {
        return false;
    }
    let keeping = desired.clone().keeping_place_of(current);
    next_status(lock, keeping).is_none()
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
    next.queue_length = desired.queue_length;
    next.expected_start = desired.expected_start;
    next.overtaken = desired.overtaken;
    next.waiting_since = desired.waiting_since;
    next.holders = desired.occupancy.map(|o| o.holders);
    next.permits_in_use = desired.occupancy.map(|o| o.in_use);
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
    // The history rides along with a write that happens anyway: a change of the
    // history alone (seen while waiting, say) is no reason to write.
    if next == current {
        return None;
    }
    if let Some(history) = desired.history {
        next.history = Some(history);
    }
    if held {
        next.renewed_at = Some(now());
    }
    Some(next)
}

/// Writes `status` with server-side apply.
///
/// During an upgrade the controller may run before the README's CRD step has
/// installed this build's CRD, and server-side apply refuses a field the installed
/// schema does not declare. `status.history` (CRD revision 3) is the only status field
/// an older CRD lacks, and it is informational: without it the write is made again,
/// so every other status field keeps being written (docs/design.md §3 "Stored formats
/// that can evolve").
pub async fn write(
    api: &Api<DistributedLock>,
    name: &str,
    status: &DistributedLockStatus,
) -> kube::Result<()> {
    match apply(api, name, status).await {
        Err(kube::Error::Api(e)) if status.history.is_some() && undeclared_history(&e.message) => {
            tracing::debug!(
                lock = name,
                "the installed CRD has no status.history: written without it"
            );
            let without = DistributedLockStatus {
                history: None,
                ..status.clone()
            };
            apply(api, name, &without).await
        }
        other => other,
    }
}

/// Whether the API server refused the apply because the installed CRD does not declare
/// `status.history`.
fn undeclared_history(message: &str) -> bool {
    message.contains(".status.history") && message.contains("field not declared in schema")
}

async fn apply(
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
        &PatchParams::apply(super::config::FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map(drop)
}

#[cfg(test)]
mod tests;

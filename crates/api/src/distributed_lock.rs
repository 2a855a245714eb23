//! The `DistributedLock` custom resource (`lockwarden.io/v1alpha1`).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::SpecError;
use super::backend_spec::{BackendKind, BackendSpec, a_tools_lock_is_a_mutex_without_a_queue};
use super::validation::*;
use lockwarden_core::runs::MAX_RUN_KEY_LEN;
use lockwarden_core::{Mode, Permits, Queueing, RunKey, RunMemory};

/// `spec.leaseDuration` when unset.
pub const DEFAULT_LEASE_DURATION: &str = "30s";
/// The longest `spec.lockDelay` (and `--lock-delay`): a delay blocks the key this long
/// after every expiry, so a mistaken hour is refused rather than honoured.
pub const MAX_LOCK_DELAY: Duration = Duration::from_secs(600);
/// `spec.renewInterval` when unset.
pub const DEFAULT_RENEW_INTERVAL: &str = "10s";

/// A lock in S3, DynamoDB, ZooKeeper or a Kubernetes Lease, held by the lockwarden
/// controller for as long as this object exists (and `release` is false).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "lockwarden.io",
    version = "v1alpha1",
    kind = "DistributedLock",
    namespaced,
    shortname = "dlock",
    category = "lockwarden",
    status = "DistributedLockStatus",
    derive = "PartialEq",
    doc = "A distributed lock with a fencing token, held in S3, DynamoDB, ZooKeeper or a Kubernetes Lease.",
    // Raw JSON: the structured form repeats `type_ = "string"`, which clippy's
    // duplicated_attributes lint rejects.
    printcolumn = r#"{"name":"Backend","type":"string","jsonPath":".status.backend","description":"Where the lock lives"}"#,
    printcolumn = r#"{"name":"Key","type":"string","jsonPath":".status.key","description":"The lock's key as a URL"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Holder","type":"string","jsonPath":".status.holder"}"#,
    printcolumn = r#"{"name":"Fence","type":"integer","jsonPath":".status.fence","description":"Fencing token of the current acquisition"}"#,
    printcolumn = r#"{"name":"Permits","type":"integer","jsonPath":".spec.permits","description":"How many may hold the key at once"}"#,
    printcolumn = r#"{"name":"In Use","type":"integer","jsonPath":".status.permitsInUse","description":"Permits of the key in use, as last seen (keys with more than one permit)"}"#,
    printcolumn = r#"{"name":"Position","type":"integer","jsonPath":".status.queuePosition","description":"Place in the key's queue while waiting, 0 = next"}"#,
    printcolumn = r#"{"name":"Expected","type":"string","jsonPath":".status.expectedStart","description":"Expected grant, from the key's recent hold times"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    selectable = ".status.backend",
    selectable = ".status.key",
    selectable = ".status.phase"
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::strip_nullable)]
#[schemars(transform = crate::schema::kubernetes_integer_formats)]
#[x_kube(
    validation = renew_below_half_lease(),
    validation = shared_needs_permits(),
    validation = mode_immutable(),
    validation = lock_delay_needs_a_lease_store(),
    validation = needs_a_queue("priority"),
    validation = needs_a_queue("weight"),
    validation = weight_at_most_the_permits(),
    validation = a_tools_lock_is_a_mutex_without_a_queue(),
    validation = a_run_has_one_holder_without_a_queue()
)]
pub struct DistributedLockSpec {
    /// Where the lock lives: exactly one of s3, dynamodb, zookeeper, kubernetes.
    pub backend: BackendSpec,
    /// Identity written as the lock's holder; `<clusterName>/<namespace>/<name>` when
    /// unset or empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub holder_identity: Option<String>,
    /// How long the lock stays held without a renewal (Go duration, e.g. `30s`).
    #[serde(default = "default_lease_duration")]
    #[schemars(length(max = MAX_DURATION_LEN))]
    #[x_kube(validation = positive_duration("leaseDuration"))]
    pub lease_duration: String,
    /// How often the holder renews; must be less than half of leaseDuration.
    #[serde(default = "default_renew_interval")]
    #[schemars(length(max = MAX_DURATION_LEN))]
    #[x_kube(validation = positive_duration("renewInterval"))]
    pub renew_interval: String,
    /// Give up waiting after this long (phase Failed, reason AcquireTimeout); wait
    /// forever when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_DURATION_LEN))]
    #[x_kube(validation = positive_duration("acquireTimeout"))]
    pub acquire_timeout: Option<String>,
    /// After this lock *expires* (its holder stopped renewing; never after a release),
    /// contenders wait this much longer before taking the key over, so that a holder's
    /// work can finish stopping first (Go duration, at most 10m; docs/design.md rule 8).
    /// Stored as part of the record's lease, which every reader — older lockwarden and
    /// the foreign tools — already honours; the holder's own deadline stays
    /// `leaseDuration`. When unset, a lock the controller makes for a workload takes
    /// the delay its Pods' termination grace needs; others have none. Not supported on
    /// ZooKeeper, whose session expiry deletes the holder's entry at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_DURATION_LEN))]
    #[x_kube(
        validation = positive_duration("lockDelay"),
        validation = lock_delay_at_most_the_maximum()
    )]
    pub lock_delay: Option<String>,
    /// Let go of the lock (or stop waiting) without deleting this object.
    #[serde(default)]
    pub release: bool,
    /// Take the lock over from its current holder (a conditional write; a Warning
    /// Event records it).
    #[serde(default)]
    pub force: bool,
    /// Free text stored with the lock record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub data: Option<String>,
    /// How many may hold the key at once: 1 is a mutex, more makes the key a counting
    /// semaphore. Every lock on one key must name the same number (a lock that does
    /// not goes Failed). 1 to 256.
    #[serde(default = "default_permits")]
    #[schemars(range(min = 1, max = Permits::MAX))]
    #[x_kube(validation = permits_immutable())]
    pub permits: u32,
    /// How this lock takes the key: `shared` takes one permit (a reader, or a
    /// semaphore holder) and coexists with other shared holders up to `permits`;
    /// `exclusive` holds the key alone (a writer). When unset: shared if permits is
    /// above 1, else exclusive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "mode_schema")]
    pub mode: Option<Mode>,
    /// Wait in the key's queue (docs/design.md §6.4): granted in arrival order (a
    /// ticket the store hands out), after higher priorities, across every cluster and
    /// the CLI. On S3, DynamoDB and Leases the queue lives in the key's record; a
    /// ZooKeeper key is always a queue. A key with a queue is joined by every lock on
    /// it, queued or not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub queue: bool,
    /// With `queue`: waiters of a higher priority are granted before lower ones (a
    /// holder is never preempted). Default 0. Values are compared across clusters as
    /// they are: clusters sharing a key must agree on what they mean. Not supported on
    /// ZooKeeper.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// With `queue`: how many of the key's `permits` this (shared) lock takes at once.
    /// Default 1, at most `permits`. Not supported on ZooKeeper.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = Permits::MAX))]
    pub weight: Option<u32>,
    /// Once per run (docs/design.md §6.7): the run this lock's holder runs, e.g.
    /// `payments/nightly@2026-12-03T02:00:00Z` (the gating sets it on a workload's own
    /// lock). When the key remembers the run as completed, the lock is released as
    /// soon as it is granted (`status.phase: Released`, reason `RunCompleted`). One
    /// permit, no queue; every store, but not a key deleted on release
    /// (s3lockCompatible, terraformCompatible).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_RUN_KEY_LEN))]
    pub run_key: Option<String>,
    /// With `runKey`: how many completed runs the key remembers, most recent first
    /// (older ones are counted as dropped). Default 64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub runs_kept: Option<u32>,
    /// With `runKey`: the run succeeded, so the release records it as completed in
    /// the key's memory (the gating sets it when the workload holding the lock
    /// succeeded, before letting the lock go).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub run_succeeded: bool,
}

impl Default for DistributedLockSpec {
    fn default() -> Self {
        DistributedLockSpec {
            backend: BackendSpec::default(),
            holder_identity: None,
            lease_duration: default_lease_duration(),
            renew_interval: default_renew_interval(),
            acquire_timeout: None,
            lock_delay: None,
            release: false,
            force: false,
            data: None,
            permits: default_permits(),
            mode: None,
            queue: false,
            priority: None,
            weight: None,
            run_key: None,
            runs_kept: None,
            run_succeeded: false,
        }
    }
}

fn default_permits() -> u32 {
    1
}

/// `spec.mode`: the lock layer's [`Mode`], spelled as it serialises.
fn mode_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": "string", "enum": ["exclusive", "shared"] })
}

fn default_lease_duration() -> String {
    DEFAULT_LEASE_DURATION.to_string()
}

fn default_renew_interval() -> String {
    DEFAULT_RENEW_INTERVAL.to_string()
}

/// Where a lock is in its life.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockPhase {
    /// Not tried yet.
    Pending,
    /// Someone else holds it; waiting.
    Waiting,
    /// Held by this object.
    Held,
    /// Letting go.
    Releasing,
    /// Let go (`spec.release`), or never acquired before release.
    Released,
    /// Was held, then taken over or expired.
    Lost,
    /// Cannot be acquired (acquireTimeout passed, invalid spec, foreign record…).
    Failed,
}

impl LockPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            LockPhase::Pending => "Pending",
            LockPhase::Waiting => "Waiting",
            LockPhase::Held => "Held",
            LockPhase::Releasing => "Releasing",
            LockPhase::Released => "Released",
            LockPhase::Lost => "Lost",
            LockPhase::Failed => "Failed",
        }
    }
}

impl std::fmt::Display for LockPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One grant of a key's holder history (`status.history`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::strip_nullable)]
#[schemars(transform = crate::schema::kubernetes_integer_formats)]
pub struct HistoryEntry {
    /// Holder identity of the grant.
    pub holder: String,
    /// Where the holder ran: a controller's cluster name, a command-line tool's host
    /// (absent when the store's record did not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The grant's fencing token.
    pub fence: i64,
    /// When it was granted (the granting writer's wall clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquired_at: Option<Time>,
    /// `held` (the key's current holder), `released`, `expired` (taken over after
    /// its lease ran out), `forced`, `reclaimed` or `unknown`.
    pub ended: String,
    /// When it ended (the wall clock of the writer that ended it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<Time>,
}

/// What the controller last saw and did. Written only on transitions.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::strip_nullable)]
#[schemars(transform = crate::schema::kubernetes_integer_formats)]
pub struct DistributedLockStatus {
    /// Pending, Waiting, Held, Releasing, Released, Lost or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<LockPhase>,
    /// Backend kind (`s3`, `dynamodb`, `zookeeper`, `kubernetes`), for printing and
    /// field selectors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// The lock's key as a URL (`s3://bucket/key`, `dynamodb://table/key`,
    /// `zk://host:port[,…][/chroot]/path`, `k8s://namespace/lease`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Holder identity of the current holder (ours when Held).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// Version of the lock record our last write produced (ETag, revision, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    /// Fencing token of the current acquisition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<i64>,
    /// Nonce of our acquisition; lets a restarted controller resume the lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    /// When the current acquisition was made (informational, wall clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquired_at: Option<Time>,
    /// Last renewal that was written to status (renewals themselves do not write).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewed_at: Option<Time>,
    /// Informational: when the lease would expire without renewal (wall clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_expires_at: Option<Time>,
    /// Position in the key's queue (a queued lock, or ZooKeeper), 0 = next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<i32>,
    /// How many wait in the key's queue (a queued lock on S3, DynamoDB or a Lease).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_length: Option<i32>,
    /// When this waiter may expect its grant, estimated from the key's recent hold
    /// times (RFC 3339, a string: `kubectl` prints a `date` column in the future as
    /// `<invalid>`); unset until the key has hold times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_start: Option<String>,
    /// How many later arrivals of a higher priority were granted before this waiter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overtaken: Option<u32>,
    /// When this lock began waiting for its key (wall clock): `acquireTimeout` counts
    /// from here, also across controller restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_since: Option<Time>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// How many hold the key, as this lock last saw it (keys with more than one
    /// permit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holders: Option<u32>,
    /// How many of the key's permits are in use, as this lock last saw it (an
    /// exclusive holder takes them all; keys with more than one permit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permits_in_use: Option<u32>,
    /// The key's holder history as the store kept it (its last grants, oldest first,
    /// in every cluster), as last seen: refreshed only by status writes that happen
    /// anyway (acquired, waiting for another holder), never by a write of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8))]
    pub history: Option<Vec<HistoryEntry>>,
    /// `Acquired` and others, keyed by type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

impl DistributedLockSpec {
    /// `leaseDuration`, parsed: positive.
    pub fn lease_duration(&self) -> Result<Duration, SpecError> {
        parse_field("spec.leaseDuration", &self.lease_duration)
    }

    /// `renewInterval`, parsed: positive (see [`validate`](Self::validate) for the
    /// relation to the lease).
    pub fn renew_interval(&self) -> Result<Duration, SpecError> {
        parse_field("spec.renewInterval", &self.renew_interval)
    }

    /// `acquireTimeout`, parsed; `None` = wait forever.
    pub fn acquire_timeout(&self) -> Result<Option<Duration>, SpecError> {
        self.acquire_timeout
            .as_deref()
            .map(|t| parse_field("spec.acquireTimeout", t))
            .transpose()
    }

    /// `lockDelay`, parsed: positive and at most [`MAX_LOCK_DELAY`]; `None` when unset.
    pub fn lock_delay(&self) -> Result<Option<Duration>, SpecError> {
        let Some(text) = self.lock_delay.as_deref() else {
            return Ok(None);
        };
        let delay = parse_field("spec.lockDelay", text)?;
        if delay > MAX_LOCK_DELAY {
            return Err(SpecError::Invalid {
                field: "spec.lockDelay".into(),
                message: format!(
                    "{text} is above the maximum of {}s: a lock delay blocks the key that long after every expiry",
                    MAX_LOCK_DELAY.as_secs()
                ),
            });
        }
        Ok(Some(delay))
    }

    /// `permits` and `mode`, with the mode's default applied: shared when the key has
    /// more than one permit (a semaphore holder takes one), else exclusive.
    pub fn permits(&self) -> Permits {
        let mode = self.mode.unwrap_or(if self.permits > 1 {
            Mode::Shared
        } else {
            Mode::Exclusive
        });
        Permits {
            total: self.permits,
            mode,
        }
    }

    /// What `queue`, `priority` and `weight` ask for: `None` without a queue, and on
    /// ZooKeeper, whose key is a queue by itself (docs/design.md §6.4).
    pub fn queueing(&self) -> Result<Option<Queueing>, SpecError> {
        let invalid = |field: &str, message: String| SpecError::Invalid {
            field: field.into(),
            message,
        };
        let on_zookeeper = !self.backend.supports_priorities();
        for (field, given) in [
            ("spec.priority", self.priority.is_some()),
            ("spec.weight", self.weight.is_some()),
        ] {
            if given && (!self.queue || on_zookeeper) {
                return Err(invalid(
                    field,
                    "needs queue: true, on S3, DynamoDB or a Lease (a ZooKeeper key's queue is \
                     the order of its entries, which every client of the key obeys)"
                        .into(),
                ));
            }
        }
        if !self.queue || on_zookeeper {
            return Ok(None);
        }
        let queueing = Queueing {
            priority: self.priority.unwrap_or(0),
            weight: self.weight.unwrap_or(1),
        };
        queueing
            .validate(self.permits())
            .map_err(|source| SpecError::Weight { source })?;
        Ok(Some(queueing))
    }

    /// The holder identity: `holderIdentity`, or `<cluster_name>/<namespace>/<name>`
    /// when it is unset or empty.
    pub fn holder_identity(&self, cluster_name: &str, namespace: &str, name: &str) -> String {
        match self.holder_identity.as_deref() {
            Some(id) if !id.is_empty() => id.to_string(),
            _ => format!("{cluster_name}/{namespace}/{name}"),
        }
    }

    /// Everything the CRD's CEL rules check at creation, in Rust: the API server
    /// enforces these, this is for specs that did not pass through it (CLI, tests) and
    /// for defence in depth in the controller.
    pub fn validate(&self) -> Result<(), SpecError> {
        self.backend.validate()?;
        let lease = self.lease_duration()?;
        let renew = self.renew_interval()?;
        if renew * 2 >= lease {
            return Err(SpecError::RenewTooLong {
                renew_interval: self.renew_interval.clone(),
                lease_duration: self.lease_duration.clone(),
            });
        }
        self.acquire_timeout()?;
        if self.lock_delay()?.is_some() && !self.backend.supports_lock_delay() {
            return Err(SpecError::Invalid {
                field: "spec.lockDelay".into(),
                message: "not supported on a ZooKeeper backend: an expired session's entry is \
                          deleted by the server and every waiter takes over at once, so no \
                          delay can be stored; remove spec.lockDelay"
                    .into(),
            });
        }
        if self.backend.holds_a_tools_lock() && (self.queue || self.permits > 1) {
            return Err(SpecError::Invalid {
                field: if self.queue {
                    "spec.queue"
                } else {
                    "spec.permits"
                }
                .into(),
                message: A_TOOLS_LOCK_IS_A_MUTEX.into(),
            });
        }
        let permits = self.permits();
        permits.validate().map_err(|source| SpecError::Permits {
            // The one mistake that is not the number's: shared with one permit.
            field: if permits.total == 1 {
                "spec.mode"
            } else {
                "spec.permits"
            },
            source,
        })?;
        self.queueing()?;
        self.run()?;
        if self.holder_identity.as_ref().is_some_and(|h| h.len() > 512) {
            return Err(SpecError::Invalid {
                field: "spec.holderIdentity".into(),
                message: "must be at most 512 characters".into(),
            });
        }
        // The schema's maxLength, which counts characters.
        if self
            .data
            .as_ref()
            .is_some_and(|d| d.chars().count() > 65536)
        {
            return Err(SpecError::Invalid {
                field: "spec.data".into(),
                message: "must be at most 65536 characters".into(),
            });
        }
        Ok(())
    }

    /// `spec.runKey` and `spec.runsKept` (checked): the run and how many completed
    /// runs the key keeps; `None` without a run key.
    pub fn run(&self) -> Result<Option<(RunKey, usize)>, SpecError> {
        let Some(key) = &self.run_key else {
            return Ok(None);
        };
        let run = RunKey::new(key.clone()).map_err(|e| SpecError::Invalid {
            field: "spec.runKey".into(),
            message: e.to_string(),
        })?;
        if self.permits != 1 || self.queue {
            return Err(SpecError::Invalid {
                field: "spec.runKey".into(),
                message: A_RUN_HAS_ONE_HOLDER.into(),
            });
        }
        let keep = self
            .runs_kept
            .map_or(RunMemory::DEFAULT_KEEP, |n| n.clamp(1, 1024) as usize);
        Ok(Some((run, keep)))
    }

    /// The CEL transition rules: the backend kind, the fields naming the lock, the
    /// permits and the mode are unchanged from `old`.
    pub fn validate_update(&self, old: &DistributedLockSpec) -> Result<(), SpecError> {
        self.backend.validate_update(&old.backend)?;
        if self.permits != old.permits {
            return Err(SpecError::Immutable {
                field: "spec.permits".into(),
            });
        }
        if self.mode != old.mode {
            return Err(SpecError::Immutable {
                field: "spec.mode".into(),
            });
        }
        Ok(())
    }
}

impl DistributedLock {
    /// The backend kind, for `status.backend`.
    pub fn backend_kind(&self) -> Result<BackendKind, SpecError> {
        self.spec.backend.kind()
    }

    /// The lock's key as a URL, for `status.key` and for indexing locks by key
    /// (`k8s://` keys default to this object's namespace).
    pub fn lock_key(&self) -> Result<String, SpecError> {
        let namespace = self.metadata.namespace.as_deref().unwrap_or("default");
        self.spec.backend.lock_url(namespace)
    }

    /// The holder identity this object acquires with (see
    /// [`DistributedLockSpec::holder_identity`]).
    pub fn holder_identity(&self, cluster_name: &str) -> String {
        self.spec.holder_identity(
            cluster_name,
            self.metadata.namespace.as_deref().unwrap_or("default"),
            self.metadata.name.as_deref().unwrap_or_default(),
        )
    }

    /// The current `Acquired` condition, if any.
    pub fn acquired_condition(&self) -> Option<&Condition> {
        self.status.as_ref().and_then(|s| {
            super::conditions::find_condition(&s.conditions, super::conditions::ACQUIRED)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KubernetesBackend, S3Backend, ZooKeeperBackend};

    fn s3_spec() -> DistributedLockSpec {
        DistributedLockSpec {
            backend: BackendSpec {
                s3: Some(S3Backend {
                    bucket: "locks".into(),
                    key: "a/b".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn defaults_are_valid() {
        let spec = s3_spec();
        spec.validate().unwrap();
        assert_eq!(spec.lease_duration().unwrap(), Duration::from_secs(30));
        assert_eq!(spec.renew_interval().unwrap(), Duration::from_secs(10));
        assert_eq!(spec.acquire_timeout().unwrap(), None);
        assert_eq!(spec.backend.kind().unwrap(), BackendKind::S3);
        assert_eq!(spec.backend.lock_url("ns").unwrap(), "s3://locks/a/b");
    }

    #[test]
    fn durations_name_the_field() {
        let mut spec = s3_spec();
        spec.lease_duration = "0s".into();
        let err = spec.validate().unwrap_err();
        assert!(err.to_string().starts_with("spec.leaseDuration:"), "{err}");
        spec.lease_duration = "20s".into();
        spec.renew_interval = "10s".into();
        assert!(matches!(
            spec.validate(),
            Err(SpecError::RenewTooLong { .. })
        ));
        spec.renew_interval = "9.999s".into();
        spec.validate().unwrap();
        spec.acquire_timeout = Some("+1m".into());
        let err = spec.validate().unwrap_err();
        assert!(err.to_string().starts_with("spec.acquireTimeout:"), "{err}");
    }

    #[test]
    fn exactly_one_backend() {
        let mut spec = s3_spec();
        spec.backend.kubernetes = Some(KubernetesBackend {
            lease_name: "l".into(),
            namespace: None,
        });
        assert_eq!(
            spec.validate().unwrap_err().to_string(),
            "spec.backend: exactly one of s3, dynamodb, zookeeper or kubernetes must be set, found s3, kubernetes"
        );
        spec.backend = BackendSpec::default();
        assert!(spec.backend.kind().is_err());
    }

    #[test]
    fn rule8_lock_delay_is_capped_and_refused_on_zookeeper() {
        let mut spec = s3_spec();
        spec.lock_delay = Some("10m".into());
        spec.validate().unwrap();
        spec.lock_delay = Some("2h".into());
        let above = spec.validate().unwrap_err().to_string();
        assert!(
            above.starts_with("spec.lockDelay: 2h is above the maximum of 600s"),
            "{above}"
        );
        spec.lock_delay = Some("30s".into());
        spec.backend = BackendSpec {
            zookeeper: Some(ZooKeeperBackend {
                servers: vec!["zk:2181".into()],
                path: "/locks/db".into(),
                chroot: None,
                session_timeout: None,
            }),
            ..Default::default()
        };
        let zk = spec.validate().unwrap_err().to_string();
        assert!(
            zk.starts_with("spec.lockDelay: not supported on a ZooKeeper backend"),
            "{zk}"
        );
        spec.lock_delay = None;
        spec.validate().unwrap();
    }

    #[test]
    fn lock_urls() {
        let zk = BackendSpec {
            zookeeper: Some(ZooKeeperBackend {
                servers: vec!["a:2181".into(), "b:2181".into()],
                path: "/locks/db".into(),
                chroot: Some("/app".into()),
                session_timeout: Some("10s".into()),
            }),
            ..Default::default()
        };
        assert_eq!(
            zk.lock_url("ns").unwrap(),
            "zk://a:2181,b:2181/app/locks/db"
        );
        let lease = BackendSpec {
            kubernetes: Some(KubernetesBackend {
                lease_name: "l".into(),
                namespace: None,
            }),
            ..Default::default()
        };
        assert_eq!(lease.lock_url("ns").unwrap(), "k8s://ns/l");
        let mut lock = DistributedLock::new(
            "x",
            DistributedLockSpec {
                backend: lease,
                ..Default::default()
            },
        );
        lock.metadata.namespace = Some("team".into());
        assert_eq!(lock.lock_key().unwrap(), "k8s://team/l");
        assert_eq!(lock.holder_identity("c"), "c/team/x");
        assert_eq!(lock.backend_kind().unwrap().to_string(), "kubernetes");
    }

    #[test]
    fn identity_fields_are_immutable() {
        let old = s3_spec();
        let mut new = old.clone();
        new.backend.s3.as_mut().unwrap().region = Some("eu-west-1".into());
        new.lease_duration = "1m".into();
        new.validate_update(&old).unwrap();
        new.backend.s3.as_mut().unwrap().key = "other".into();
        assert_eq!(
            new.validate_update(&old).unwrap_err(),
            SpecError::Immutable {
                field: "spec.backend.s3.key".into()
            }
        );
    }

    #[test]
    fn permits_and_mode_default_and_validate() {
        let mut spec = s3_spec();
        assert_eq!(spec.permits(), Permits::MUTEX, "a mutex by default");
        spec.permits = 3;
        assert_eq!(
            spec.permits(),
            Permits::semaphore(3),
            "shared when permits > 1"
        );
        spec.validate().unwrap();
        spec.mode = Some(Mode::Exclusive);
        assert_eq!(
            spec.permits().mode,
            Mode::Exclusive,
            "a writer on a semaphore key"
        );
        spec.validate().unwrap();

        // (permits, mode, the field named, a phrase of Permits::validate's message)
        let rows = [
            (0, None, "spec.permits", "at least 1"),
            (257, None, "spec.permits", "at most 256"),
            (257, Some(Mode::Shared), "spec.permits", "at most 256"),
            (
                1,
                Some(Mode::Shared),
                "spec.mode",
                "shared mode needs permits of 2 or more",
            ),
        ];
        for (permits, mode, field, phrase) in rows {
            spec.permits = permits;
            spec.mode = mode;
            let err = spec.validate().unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("{field}: ")),
                "{permits} {mode:?}: {err}"
            );
            assert!(err.contains(phrase), "{permits} {mode:?}: {err}");
        }
        spec.permits = 256;
        spec.mode = None;
        spec.validate().expect("256 permits are allowed");
    }

    #[test]
    fn permits_and_mode_are_immutable() {
        let old = DistributedLockSpec {
            permits: 2,
            ..s3_spec()
        };
        let mut new = old.clone();
        new.permits = 3;
        assert_eq!(
            new.validate_update(&old).unwrap_err(),
            SpecError::Immutable {
                field: "spec.permits".into()
            }
        );
        new.permits = 2;
        // Even spelling out the default is a change (as the CEL rule sees it).
        new.mode = Some(Mode::Shared);
        assert_eq!(
            new.validate_update(&old).unwrap_err(),
            SpecError::Immutable {
                field: "spec.mode".into()
            }
        );
        new.mode = None;
        new.validate_update(&old).unwrap();
    }

    #[test]
    fn permits_and_mode_serialise_as_the_crd_names_them() {
        let spec: DistributedLockSpec = serde_json::from_value(serde_json::json!({
            "backend": { "s3": { "bucket": "locks", "key": "k" } },
            "permits": 4, "mode": "exclusive",
        }))
        .unwrap();
        assert_eq!(spec.permits, 4);
        assert_eq!(spec.mode, Some(Mode::Exclusive));
        let defaulted: DistributedLockSpec = serde_json::from_value(serde_json::json!({
            "backend": { "s3": { "bucket": "locks", "key": "k" } },
        }))
        .unwrap();
        assert_eq!(defaulted.permits, 1);
        assert!(
            serde_json::from_value::<DistributedLockSpec>(serde_json::json!({
                "backend": { "s3": { "bucket": "locks", "key": "k" } }, "mode": "both",
            }))
            .is_err()
        );
    }
}

//! The backend-neutral interface the controller and the CLI drive.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use super::clock::{HolderDeadline, SafetyMargins};
use super::error::LockError;
use super::permits::Permits;
use super::record::{FenceToken, LockRecord, Stored, Version};

/// What an acquisition asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquireRequest {
    pub holder: String,
    pub lease: Duration,
    pub data: Option<String>,
    /// Take over a lock held by someone else, with a write conditioned on the version
    /// just read (never a blind overwrite).
    pub force: bool,
    /// Take back at once a lock that this same holder (by name) still holds — a
    /// restarted owner whose earlier run never released — instead of waiting out its
    /// lease: only a lockwarden record whose holder equals `holder`, by a write
    /// conditioned on the version read, with a new fence; reported in
    /// [`Lease::forced_from`]. Unsafe when two live processes share a holder name:
    /// each takes the lock from the other (docs/design.md §3, "Reclaim").
    pub reclaim: bool,
    /// The key's permits and how this holder takes it (docs/design.md §6.2); a mutex
    /// unless asked otherwise.
    pub permits: Permits,
    /// Where the holder runs — the controller's cluster name, the CLI's host — for the
    /// key's holder history ([`crate::history`]); nothing else reads it.
    pub cluster: Option<String>,
    /// The lock-delay (docs/design.md rule 8): stored as part of the record's lease, so
    /// every contender waits `lease + lock_delay` after an expiry, while this holder's
    /// own deadline (rule 2) stays on `lease`. Zero: none.
    pub lock_delay: Duration,
    /// Wait in the key's queue, with this priority and weight (docs/design.md §6.4):
    /// on S3, DynamoDB and Leases the key's record keeps the queue; `None` keeps
    /// today's race for the key unless the key already has a queue, which every
    /// contender of this build then joins.
    pub queue: Option<super::queue::Queueing>,
    /// A tool that polls shares the key (docs/design.md §6.4, "Sharing a key with a
    /// tool that polls"): after a lockwarden release, leave the key free this long,
    /// from this contender's first sight of it free, so that the tool's next poll can
    /// take it. Exclusive, unqueued locks on the conditional-write stores; `None`:
    /// take a free key at once.
    pub yield_to_pollers: Option<Duration>,
}

impl AcquireRequest {
    pub fn new(holder: impl Into<String>, lease: Duration) -> Self {
        AcquireRequest {
            holder: holder.into(),
            lease,
            data: None,
            force: false,
            reclaim: false,
            permits: Permits::MUTEX,
            cluster: None,
            lock_delay: Duration::ZERO,
            queue: None,
            yield_to_pollers: None,
        }
    }
}

/// A lock this process holds: the handle every renewal and the release go through.
#[derive(Clone, Debug)]
pub struct Lease {
    /// The record as we last wrote it.
    pub record: LockRecord,
    /// The version the next write is conditioned on: our last write's, or (a permit
    /// of a holder set) a later one that others' writes made, seen by a renewal with
    /// our entry in it as we last wrote it.
    pub version: Version,
    /// Rule 2: until when we may claim the lock.
    pub deadline: HolderDeadline,
    /// A write whose outcome was unknown (rule 4): if the backend later shows this
    /// revision, it landed. Boxed: rare, and a whole record, it would otherwise double
    /// the size of every lease a holder task keeps.
    pub unconfirmed: Option<Box<(LockRecord, tokio::time::Instant)>>,
    /// Whether this acquisition overwrote a live lock: someone else's (force), or this
    /// holder's own from an earlier run (reclaim).
    pub forced_from: Option<super::error::HeldBy>,
    /// The lock-delay (rule 8) included in `record.lease`: every write carries
    /// `lease + lock_delay` for contenders, while this holder's deadline and renewal
    /// schedule run on [`holder_lease`](Self::holder_lease) alone.
    pub lock_delay: Duration,
}

impl Lease {
    pub fn new(record: LockRecord, version: Version, deadline: HolderDeadline) -> Self {
        Lease {
            record,
            version,
            deadline,
            unconfirmed: None,
            forced_from: None,
            lock_delay: Duration::ZERO,
        }
    }

    /// This lease with `lock_delay` of its stored lease being the lock-delay (rule 8),
    /// not time this holder may claim. It sets what every later [`confirm`](Self::confirm)
    /// counts; the deadline given to [`new`](Self::new) is the caller's to compute
    /// from [`holder_lease`](Self::holder_lease).
    pub fn with_lock_delay(mut self, lock_delay: Duration) -> Self {
        self.lock_delay = lock_delay;
        self
    }

    /// The lease this holder claims the lock for (rule 2) and renews on: the stored
    /// lease less the lock-delay every contender adds after an expiry (rule 8).
    pub fn holder_lease(&self) -> Duration {
        self.record.lease.saturating_sub(self.lock_delay)
    }

    pub fn fence(&self) -> FenceToken {
        self.record.fence
    }

    pub fn nonce(&self) -> &str {
        &self.record.nonce
    }

    pub fn holder(&self) -> &str {
        &self.record.holder
    }

    pub fn acquired_at(&self) -> SystemTime {
        self.record.acquired_at
    }

    /// Records a successful write sent at `sent`: the deadline moves to
    /// `sent + lease × (1 − δ) − margin` (rule 2), `lease` being the holder's own, not
    /// the lock-delay the record also carries (rule 8).
    pub fn confirm(
        &mut self,
        record: LockRecord,
        version: Version,
        sent: tokio::time::Instant,
        margins: &SafetyMargins,
    ) {
        let holder_lease = record.lease.saturating_sub(self.lock_delay);
        self.deadline = HolderDeadline::after_write(sent, holder_lease, margins);
        self.record = record;
        self.version = version;
        self.unconfirmed = None;
    }

    /// Whether the holder may still claim the lock (rule 2).
    pub fn is_valid(&self) -> bool {
        self.deadline.is_valid()
    }
}

/// The result of one acquisition attempt.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // Acquired is the common, hot case: no box.
pub enum Attempt {
    Acquired(Lease),
    /// Someone else holds the lock.
    Busy {
        holder: LockRecord,
        /// When it is worth trying again: the remaining observation time before the
        /// holder's lease could be seen expired, if known.
        retry_in: Option<Duration>,
        /// Position in the key's queue (a queued key, or ZooKeeper), 0 = next; `None`
        /// when this contender is not registered in one.
        queue_position: Option<u32>,
    },
}

/// One lock key in one store. Every backend implements this; nothing above it knows
/// which store it talks to.
#[async_trait]
pub trait LockBackend: Send + Sync {
    /// The lock's URL (`s3://bucket/key`, …), used in every error and log line.
    fn url(&self) -> &str;

    /// The safety parameters this backend's holders and contenders use.
    fn margins(&self) -> SafetyMargins {
        SafetyMargins::default()
    }

    /// One attempt to acquire: never waits for the holder.
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Attempt, LockError>;

    /// Extends the lease with one conditional write. `Err(Lost)` when the lock is no
    /// longer ours; `Err(Unavailable)` when the outcome is not known yet (retry).
    async fn renew(&self, lease: &mut Lease) -> Result<(), LockError>;

    /// Waits for a slot of the store's bound of requests in flight, for a
    /// [`renew`](Self::renew) run in the returned admission's
    /// [`scope`](crate::Admission::scope) ([`crate::admission`]). `None`: the store has
    /// no bound, nothing to wait for.
    async fn admit(&self) -> Result<Option<crate::Admission>, LockError> {
        Ok(None)
    }

    /// Lets go of the lock (a conditional write of a tombstone, or the store's
    /// equivalent). Releasing a lock that is no longer ours is `Err(Lost)`.
    async fn release(&self, lease: &Lease) -> Result<(), LockError>;

    /// Lets go of the lock after `done`'s run succeeded, recording the run in the
    /// key's memory of completed runs in the same write as the release, keeping the
    /// `keep` most recent (docs/design.md §6.7). A store or key that keeps no memory
    /// refuses ([`keeps_runs`](Self::keeps_runs)) and releases nothing.
    async fn release_completed(
        &self,
        lease: &Lease,
        done: super::runs::CompletedRun,
        keep: usize,
    ) -> Result<(), LockError> {
        let _ = (lease, done, keep);
        self.keeps_runs()
    }

    /// The key's memory of completed runs as the grant of `lease` finds it: every
    /// completion recorded before the grant (docs/design.md §6.7). By default the
    /// memory in the record the grant replaced (`lease.record.runs`), for stores whose
    /// grant is a conditional write of the key's one record.
    async fn completed_runs(&self, lease: &Lease) -> Result<super::runs::RunMemory, LockError> {
        Ok(lease.record.runs.clone())
    }

    /// The memory of completed runs of a store that keeps it beside the key's record
    /// (ZooKeeper), read now; `None` where it is part of the record ([`inspect`]
    /// (Self::inspect) shows it in `record.runs`).
    async fn runs_beside_the_record(&self) -> Result<Option<super::runs::RunMemory>, LockError> {
        Ok(None)
    }

    /// Whether this key can keep a memory of completed runs (docs/design.md §6.7):
    /// the refusal, naming why, when it cannot. A granted [`Lease`]'s `record.runs`
    /// is the memory of the record its grant replaced.
    fn keeps_runs(&self) -> Result<(), LockError> {
        Err(LockError::Backend {
            url: self.url().to_string(),
            message: "this store keeps no memory of completed runs".into(),
        })
    }

    /// Reads the current record without acquiring.
    async fn inspect(&self) -> Result<Option<Stored>, LockError>;

    /// Re-attaches to an acquisition made earlier (e.g. before a restart) by its
    /// nonce: the same nonce in the store means the lock is still ours, with the same
    /// fence. The returned lease has an expired deadline until its first renewal.
    async fn resume(&self, holder: &str, nonce: &str) -> Result<Lease, LockError>;

    /// Stops waiting: removes any queue entry an unsuccessful attempt left behind.
    async fn abandon(&self) {}

    /// Resolves when the record may have changed, or after `timeout`. Backends with
    /// watches (ZooKeeper) wake early; others simply wait.
    async fn changed(&self, timeout: Duration) {
        tokio::time::sleep(timeout).await
    }

    /// Resolves when the store's connection puts the holder's claim in jeopardy before a
    /// renewal has failed (a ZooKeeper session disconnected, docs/design.md §3), so the
    /// holder task renews at once and [`renew`](Self::renew) can end the claim then,
    /// instead of at the next scheduled renewal. Default: never (a store whose claim
    /// lives only in the records a renewal writes learns everything from the renewal).
    async fn in_jeopardy(&self) {
        std::future::pending::<()>().await
    }

    /// Whether [`changed`](Self::changed) wakes on the store's own notification (a
    /// watch) after a [`try_acquire`](Self::try_acquire) found the lock held, so a
    /// waiter need not poll. `false`: it only sleeps.
    fn watches_changes(&self) -> bool {
        false
    }

    /// The release this contender wrote last, while it is still the newest record it
    /// knows of: what another contender of the key in this process can act on without
    /// reading (a same-process hand-off). `None`: nothing to hand over (stores whose
    /// waiters are woken by the store itself, such as ZooKeeper's queue).
    async fn last_release(&self) -> Option<Stored> {
        None
    }

    /// A record of this key that another contender in this process has just written
    /// (its [`last_release`](Self::last_release)). It is only ever the *condition* of
    /// this contender's next acquisition write, so a stale one costs a conflict and a
    /// read, never safety; it saves the read when it is current.
    async fn learn(&self, _released: Stored) {}

    /// The key's holder history: its last grants, oldest first, the current holder
    /// (if any) last ([`crate::history`]). From the record as read; a store that
    /// keeps no history (ZooKeeper) gives its current holder only. Empty for a key
    /// nobody has held and for a foreign record.
    async fn history(&self) -> Result<Vec<super::history::Grant>, LockError> {
        let stored = self.inspect().await?;
        Ok(super::history::of_stored(stored.as_ref()))
    }

    /// What users of other tools on this key should know about `stored` (e.g. that
    /// another library sees a released record as held). `None`: nothing.
    fn note(&self, _stored: &Stored) -> Option<String> {
        None
    }
}

/// A store with conditional writes on a single record (S3, DynamoDB, Kubernetes Lease):
/// the engine's [`crate::CasLock`] runs the whole protocol on top of it.
#[async_trait]
pub trait RecordStore: Send + Sync {
    fn url(&self) -> &str;

    /// Reads the record (a consistent read). `Ok(None)` when there is none.
    async fn read(&self) -> Result<Option<Stored>, StoreError>;

    /// Creates the record only if none exists.
    async fn create(&self, record: &LockRecord) -> Result<Version, StoreError>;

    /// Replaces the record only if its version is still `expected`.
    async fn replace(&self, expected: &Version, record: &LockRecord)
    -> Result<Version, StoreError>;

    /// Deletes the record only if its version is still `expected`.
    async fn delete(&self, expected: &Version) -> Result<(), StoreError>;

    /// Waits for a slot of this store's bound of requests in flight; the requests the
    /// running task sends within the admission's [`scope`](crate::Admission::scope)
    /// then go through without waiting again ([`crate::admission`]). `None`: no bound.
    /// Past the store's wait limit: `Unavailable`, as a request never sent.
    async fn admit(&self) -> Result<Option<crate::Admission>, StoreError> {
        Ok(None)
    }

    /// Said about a released record that stays in the store (no delete on release):
    /// how other tools on the key see it. `None`: as free.
    fn kept_tombstone_note(&self) -> Option<&'static str> {
        None
    }
}

/// The outcome of a failed conditional write.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The condition did not hold: the write certainly did not apply. Carries the
    /// current record when the store returned it for free (DynamoDB `ALL_OLD`).
    #[error("condition failed")]
    Conflict { current: Option<Box<Stored>> },
    /// The write may or may not have applied (timeout, reset, 5xx, S3 409).
    #[error("outcome unknown: {0}")]
    Indeterminate(String),
    /// The request certainly did not reach the store (connection refused, DNS).
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// Misconfiguration or a permanent refusal (no such bucket, access denied…).
    #[error("{0}")]
    Rejected(String),
}

impl StoreError {
    /// A failed *read* changes nothing, so whatever is not a refusal just means the
    /// store could not be reached.
    pub fn for_read(self) -> StoreError {
        match self {
            StoreError::Rejected(m) => StoreError::Rejected(m),
            StoreError::Indeterminate(m) | StoreError::Unavailable(m) => StoreError::Unavailable(m),
            StoreError::Conflict { .. } => {
                StoreError::Unavailable("the read was refused as a conflict".into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every held lock keeps a lease in its holder task, and another in the renewal in
    /// flight: 10,000 of each behind a slow store (docs/benchmarks.md, "Where the
    /// overloaded controller's memory goes"). The rare unknown-outcome write is boxed.
    #[test]
    fn a_lease_keeps_its_rare_unconfirmed_write_out_of_line() {
        let lease = std::mem::size_of::<Lease>();
        let record = std::mem::size_of::<LockRecord>();
        assert!(
            lease < 2 * record,
            "a lease is {lease} bytes, its record {record}: the unconfirmed write is inline"
        );
    }
}

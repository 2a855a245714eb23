//! The lock protocol on a store with conditional writes (S3, DynamoDB, Kubernetes
//! Lease). Every safety rule of docs/design.md §3 for those stores is implemented here,
//! once; the stores only translate reads and conditional writes.

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::backend::{AcquireRequest, Attempt, Lease, LockBackend, RecordStore, StoreError};
use super::clock::{HolderDeadline, LeaseObserver, SafetyMargins};
use super::error::{HeldBy, LockError, LostReason};
use super::history::{self, Ending, Grant};
use super::record::{FenceToken, ForeignRecord, LockRecord, LockState, Stored, Version};
use super::runs::CompletedRun;

/// How many times one `try_acquire` re-reads after losing a race before it reports
/// the lock busy.
const CONFLICT_RETRIES: usize = 3;

/// A lock on one key of a [`RecordStore`].
pub struct CasLock<S> {
    pub(super) store: S,
    pub(super) margins: SafetyMargins,
    pub(super) delete_on_release: bool,
    pub(super) state: Mutex<ContenderState>,
}

/// What a contender remembers between attempts.
#[derive(Default)]
pub(super) struct ContenderState {
    /// The last record seen or written, so a warm acquire of a released key is one
    /// conditional write. Only ever used as the *condition* of a write.
    last_seen: Option<Stored>,
    /// Rule 1: how long the current holder's version has been seen unchanged.
    observer: LeaseObserver,
    /// Rule 4: an acquisition write whose outcome we never learned.
    pending: Option<(LockRecord, Instant)>,
    /// The same for a key with more than one permit (`semaphore`).
    pub(super) set: super::semaphore::SetContender,
    /// How long a key released by lockwarden has been seen free, for a request that
    /// yields to a polling tool (§6.4).
    yield_observer: LeaseObserver,
    /// The last lockwarden record seen on the key, while no other tool's was seen
    /// since: a key found absent after it (deleted on release) was freed by
    /// lockwarden, and a request that yields leaves it to the polling tool first.
    last_ours: Option<LockRecord>,
}

/// What the yield observer watches while the key is absent (no store gives a version
/// to an absent key).
const ABSENT: Version = Version(String::new());

impl<S: RecordStore> CasLock<S> {
    pub fn new(store: S) -> Self {
        CasLock {
            store,
            margins: SafetyMargins::default(),
            delete_on_release: false,
            state: Mutex::new(ContenderState::default()),
        }
    }

    pub fn with_margins(mut self, margins: SafetyMargins) -> Self {
        self.margins = margins;
        self
    }

    /// Delete the record after writing the release tombstone. This resets the fence
    /// sequence of the key to 1 for the next holder: only for stores where stale
    /// holders cannot write anymore.
    pub fn with_delete_on_release(mut self, delete: bool) -> Self {
        self.delete_on_release = delete;
        self
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub(super) fn url(&self) -> String {
        self.store.url().to_string()
    }

    pub(super) fn unavailable(&self, cause: impl std::fmt::Display) -> LockError {
        LockError::Unavailable {
            url: self.url(),
            cause: cause.to_string().into(),
        }
    }

    pub(super) fn store_error(&self, e: StoreError) -> LockError {
        match e {
            StoreError::Rejected(message) => LockError::Backend {
                url: self.url(),
                message,
            },
            StoreError::Unavailable(cause) | StoreError::Indeterminate(cause) => {
                self.unavailable(cause)
            }
            StoreError::Conflict { .. } => self.unavailable("the record changed concurrently"),
        }
    }

    pub(super) async fn read(&self) -> Result<Option<Stored>, LockError> {
        self.store.read().await.map_err(|e| self.store_error(e))
    }

    /// Rule 4: after a write with an unknown outcome, the store tells whether it
    /// landed — our nonce and revision in the record mean it did.
    async fn landed(&self, written: &LockRecord) -> Result<Option<Version>, LockError> {
        Ok(self.read().await?.and_then(|s| match s.record {
            Ok(r) if r.is_write_of(written) => Some(s.version),
            _ => None,
        }))
    }

    /// The lease of an acquisition write sent at `sent`. Its record carries the
    /// holder's lease plus `lock_delay` (rule 8); the deadline runs on the holder's own.
    fn lease_from(
        &self,
        record: LockRecord,
        version: Version,
        sent: Instant,
        lock_delay: Duration,
    ) -> Lease {
        let holder_lease = record.lease.saturating_sub(lock_delay);
        let deadline = HolderDeadline::after_write(sent, holder_lease, &self.margins);
        Lease::new(record, version, deadline).with_lock_delay(lock_delay)
    }
}

/// A request that yields to a polling tool (§6.4), on a key lockwarden freed (its
/// tombstone at `version`, or [`ABSENT`]): the time left before it may take the key;
/// `None` to take it now. The window counts from this contender's first sight of the
/// key free (rule 1's observer: no clock is compared across hosts).
fn yield_left(
    req: &AcquireRequest,
    version: &Version,
    st: &mut ContenderState,
) -> Option<Duration> {
    let window = req.yield_to_pollers.filter(|_| !req.force)?;
    if st.yield_observer.is_expired(version, window) {
        None
    } else {
        Some(st.yield_observer.remaining(version, window))
    }
}

/// An absent key is created, unless lockwarden freed it (deleted on release) and the
/// request yields to a polling tool (§6.4): then it is busy for the rest of the window.
fn plan_for_absent_key(req: &AcquireRequest, st: &mut ContenderState) -> Plan {
    if let Some(last) = st.last_ours.clone()
        && let Some(left) = yield_left(req, &ABSENT, st)
    {
        return Plan::Busy(Box::new(last.released()), left);
    }
    Plan::Write(AcquisitionWrite::create())
}

/// What to do about the record currently stored.
enum Plan {
    Write(AcquisitionWrite),
    /// Boxed: a record with a holder set is large, and this is the rare arm.
    Busy(Box<LockRecord>, std::time::Duration),
    /// The key has a queue (docs/design.md §6.4): every contender of this build joins
    /// it rather than race the waiters.
    Queued,
}

/// The acquisition's one conditional write, as [`CasLock::plan`] decides it.
struct AcquisitionWrite {
    /// The version the write replaces; `None`: the key is absent, create it.
    expected: Option<Version>,
    fence: FenceToken,
    forced_from: Option<HeldBy>,
    /// How the grant being replaced ended, for the key's history.
    ending: Ending,
}

impl AcquisitionWrite {
    /// The first record of an absent key: the first fence, no grant it replaces.
    fn create() -> Self {
        AcquisitionWrite {
            expected: None,
            fence: FenceToken::FIRST,
            forced_from: None,
            ending: Ending::Unknown,
        }
    }
}

/// The record an acquisition writes: our grant at `fence`, for the holder's lease
/// plus the lock-delay, carrying what it replaces must keep (`current`).
fn acquisition_record(
    req: &AcquireRequest,
    current: Option<&Stored>,
    fence: FenceToken,
    ending: Ending,
) -> LockRecord {
    // Rule 8: contenders read the holder's lease plus the lock-delay.
    let stored_lease = req.lease + req.lock_delay;
    let mut record =
        LockRecord::new_acquisition(&req.holder, fence, stored_lease, req.data.clone());
    // A newer build's fields stay with the key (docs/design.md §3).
    record.unknown = current.map(Stored::unknown).unwrap_or_default();
    // The key's history: the grant replaced closed, ours appended. A holder set
    // keeps none, so after one the history starts again.
    let replaced = match current.map(|s| &s.record) {
        Some(Ok(r)) if r.set.is_none() => Some(r),
        _ => None,
    };
    let grant = Grant::new(
        &req.holder,
        req.cluster.as_deref(),
        fence,
        record.acquired_at,
    );
    record.history = history::after_grant(replaced, ending, grant, record.acquired_at);
    // The key's memory of completed runs stays with the key (docs/design.md §6.7):
    // the holder learns from it whether its run is already done.
    if let Some(Ok(r)) = current.map(|s| &s.record) {
        record.runs = r.runs.clone();
    }
    record
}

impl<S: RecordStore> CasLock<S> {
    /// The release of an exclusive lock: its tombstone (recording `completed`, a run
    /// that succeeded, in the key's memory: docs/design.md §6.7) in one conditional
    /// write, conditioned on our last write.
    async fn release_recording(
        &self,
        lease: &Lease,
        completed: Option<(CompletedRun, usize)>,
    ) -> Result<(), LockError> {
        let tombstone = match &completed {
            Some((done, keep)) => lease.record.released_completed(done.clone(), *keep),
            None => lease.record.released(),
        };
        let outcome = self.store.replace(&lease.version, &tombstone).await;
        let version = match outcome {
            Ok(v) => v,
            Err(StoreError::Indeterminate(_)) | Err(StoreError::Conflict { .. }) => {
                match self.read().await? {
                    Some(Stored {
                        record: Ok(r),
                        version,
                    }) if r.is_write_of(&tombstone) => version,
                    current => {
                        // Our tombstone did not land and the record moved on: releasing
                        // someone else's lock would be wrong.
                        let reason = lost_reason(lease, current.as_ref());
                        return match reason {
                            // The record still is ours (an unconfirmed renewal landed):
                            // release from its version instead.
                            None => {
                                let mut adopted = lease.clone();
                                if let Some(Stored {
                                    record: Ok(r),
                                    version,
                                }) = current
                                {
                                    adopted.record = r;
                                    adopted.version = version;
                                }
                                Box::pin(self.release_recording(&adopted, completed)).await
                            }
                            Some(LostReason::ReleasedElsewhere) => {
                                Err(LockError::NotHeld { url: self.url() })
                            }
                            Some(reason) => Err(LockError::Lost {
                                url: self.url(),
                                reason,
                            }),
                        };
                    }
                }
            }
            Err(e) => return Err(self.store_error(e)),
        };
        let mut st = self.state.lock().await;
        // A key this contender finds absent next was freed by lockwarden (§6.4).
        st.last_ours = Some(tombstone.clone());
        if self.delete_on_release {
            match self.store.delete(&version).await {
                Ok(()) => st.last_seen = None,
                Err(_) => st.last_seen = None, // the tombstone stays; still released
            }
        } else {
            st.last_seen = Some(Stored {
                record: Ok(tombstone),
                version,
            });
        }
        Ok(())
    }
}

#[async_trait]
impl<S: RecordStore> LockBackend for CasLock<S> {
    fn url(&self) -> &str {
        self.store.url()
    }

    fn margins(&self) -> SafetyMargins {
        self.margins
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Attempt, LockError> {
        if !req.permits.is_mutex() || req.queue.is_some() {
            return self.try_acquire_permit(req).await;
        }
        let mut st = self.state.lock().await;
        for _ in 0..CONFLICT_RETRIES {
            let current = self.current_for_attempt(&mut st).await?;
            if let Some(lease) = self
                .adopt_pending(&mut st, current.as_ref(), req.lock_delay)
                .await?
            {
                return Ok(Attempt::Acquired(lease));
            }
            let write = match self.plan(req, current.as_ref(), &mut st)? {
                Plan::Queued => {
                    drop(st);
                    let queued = AcquireRequest {
                        queue: Some(Default::default()),
                        ..req.clone()
                    };
                    return self.try_acquire_permit(&queued).await;
                }
                Plan::Busy(holder, remaining) => {
                    st.last_seen = current;
                    return Ok(Attempt::Busy {
                        holder: *holder,
                        retry_in: Some(remaining),
                        queue_position: None,
                    });
                }
                Plan::Write(write) => write,
            };
            let record = acquisition_record(req, current.as_ref(), write.fence, write.ending);
            // `None`: the condition failed — someone else wrote first (or an SDK-level
            // retry found our first try had landed: it stays pending, so the next look
            // adopts it).
            if let Some(mut lease) = self
                .write_acquisition(&mut st, write.expected, record, req.lock_delay)
                .await?
            {
                lease.forced_from = write.forced_from;
                return Ok(Attempt::Acquired(lease));
            }
        }
        self.busy_after_lost_races().await
    }

    async fn renew(&self, lease: &mut Lease) -> Result<(), LockError> {
        if lease.record.set.is_some() {
            // Boxed: inline, a permit's renewal would make every renewal's future
            // (1.9 KB against 0.9 KB), and behind an overloaded store every held lock
            // keeps one waiting.
            return Box::pin(self.renew_permit(lease)).await;
        }
        match self.renew_once(lease).await? {
            Renewed::Yes => Ok(()),
            // The record had moved on to a later write of ours whose reply was lost:
            // renew once more from that version.
            Renewed::AdoptedEarlierWrite => match self.renew_once(lease).await? {
                Renewed::Yes => Ok(()),
                Renewed::AdoptedEarlierWrite => {
                    Err(self.unavailable("the record kept changing while renewing"))
                }
            },
        }
    }

    async fn admit(&self) -> Result<Option<crate::Admission>, LockError> {
        self.store.admit().await.map_err(|e| self.store_error(e))
    }

    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        if lease.record.set.is_some() {
            return self.release_permit(lease).await;
        }
        self.release_recording(lease, None).await
    }

    async fn release_completed(
        &self,
        lease: &Lease,
        done: CompletedRun,
        keep: usize,
    ) -> Result<(), LockError> {
        self.keeps_runs()?;
        if lease.record.set.is_some() {
            return Err(LockError::Backend {
                url: self.url(),
                message: "a key with more than one permit or a queue keeps no memory of \
                          completed runs"
                    .into(),
            });
        }
        self.release_recording(lease, Some((done, keep))).await
    }

    fn keeps_runs(&self) -> Result<(), LockError> {
        if self.delete_on_release {
            return Err(LockError::Backend {
                url: self.url(),
                message: "this key is deleted on release (s3lockCompatible or \
                          terraformCompatible), so it cannot keep a memory of completed runs"
                    .into(),
            });
        }
        Ok(())
    }

    async fn inspect(&self) -> Result<Option<Stored>, LockError> {
        self.read().await
    }

    async fn last_release(&self) -> Option<Stored> {
        let st = self.state.lock().await;
        st.last_seen
            .clone()
            .filter(|s| matches!(&s.record, Ok(r) if r.state == LockState::Released))
    }

    async fn learn(&self, released: Stored) {
        if !matches!(&released.record, Ok(r) if r.state == LockState::Released) {
            return;
        }
        // A contender busy with an attempt of its own reads the key anyway: do not
        // make the releasing side wait for it.
        if let Ok(mut st) = self.state.try_lock() {
            st.last_seen = Some(released);
        }
    }

    async fn abandon(&self) {
        self.abandon_permit().await
    }

    fn note(&self, stored: &Stored) -> Option<String> {
        let released = matches!(&stored.record, Ok(r) if r.state == LockState::Released);
        (released && !self.delete_on_release)
            .then(|| self.store.kept_tombstone_note())
            .flatten()
            .map(String::from)
    }

    async fn resume(&self, holder: &str, nonce: &str) -> Result<Lease, LockError> {
        let current = self.read().await?;
        if let Some(lease) = current
            .as_ref()
            .and_then(|s| self.resume_permit(holder, nonce, s))
        {
            return Ok(lease);
        }
        match current {
            Some(Stored {
                record: Ok(r),
                version,
            }) if r.nonce == nonce && r.holder == holder && r.state == LockState::Held => {
                Ok(Lease::new(r, version, HolderDeadline::expired()))
            }
            current => {
                let reason = match current {
                    None => LostReason::Deleted,
                    Some(Stored {
                        record: Err(found), ..
                    }) => LostReason::Foreign(found),
                    Some(Stored { record: Ok(r), .. })
                        if r.nonce != nonce && r.state == LockState::Held =>
                    {
                        LostReason::TakenOver(HeldBy::from_record(&r))
                    }
                    Some(Stored { record: Ok(r), .. }) if r.state == LockState::Released => {
                        LostReason::ReleasedElsewhere
                    }
                    Some(_) => LostReason::NotOurs,
                };
                Err(LockError::Lost {
                    url: self.url(),
                    reason,
                })
            }
        }
    }
}

impl<S: RecordStore> CasLock<S> {
    /// Rule 4 across attempts: an earlier acquisition write whose reply was lost is
    /// found in the store, so it is ours.
    async fn adopt_pending(
        &self,
        st: &mut ContenderState,
        current: Option<&Stored>,
        lock_delay: Duration,
    ) -> Result<Option<Lease>, LockError> {
        let (Some(cur), Some((pending, sent))) = (current, &st.pending) else {
            return Ok(None);
        };
        if !matches!(&cur.record, Ok(r) if r.is_write_of(pending)) {
            return Ok(None);
        }
        let mut lease = self.lease_from(pending.clone(), cur.version.clone(), *sent, lock_delay);
        st.pending = None;
        if !lease.is_valid() {
            // Sent too long ago to claim on its own: confirm with a renewal.
            self.renew(&mut lease).await?;
        }
        Ok(Some(lease))
    }

    /// The record an attempt starts from. A cached absent/released state is safe to
    /// act on: the write is conditional, so a stale cache only costs a conflict. A held
    /// record is always read afresh, since expiry must be observed.
    async fn current_for_attempt(
        &self,
        st: &mut ContenderState,
    ) -> Result<Option<Stored>, LockError> {
        match st.last_seen.take() {
            Some(s) if matches!(&s.record, Ok(r) if r.state == LockState::Released) => Ok(Some(s)),
            _ => self.read().await,
        }
    }

    /// Every write lost a race; report whoever holds it now.
    async fn busy_after_lost_races(&self) -> Result<Attempt, LockError> {
        match self.read().await? {
            Some(Stored { record: Ok(r), .. }) => Ok(Attempt::Busy {
                holder: r,
                retry_in: None,
                queue_position: None,
            }),
            _ => Err(self.unavailable("the record kept changing while acquiring")),
        }
    }

    /// What to do about the record currently stored: rules 1 (observed expiry),
    /// 3 (the next fence), 5 (force is a conditional write) and 6 (foreign records).
    fn plan(
        &self,
        req: &AcquireRequest,
        current: Option<&Stored>,
        st: &mut ContenderState,
    ) -> Result<Plan, LockError> {
        let Some(Stored { record, version }) = current else {
            return Ok(plan_for_absent_key(req, st));
        };
        let r = match record {
            Ok(r) => r,
            Err(found) => return self.plan_for_foreign_record(req, found, version),
        };
        if r.set.as_ref().is_some_and(|s| s.queue.is_some()) && !req.force {
            return Ok(Plan::Queued);
        }
        // A key with more than one permit in use: every lock on it must agree.
        if let Some(set) = r.set.as_ref().filter(|s| !s.holders.is_empty()) {
            return Err(LockError::PermitsDisagree {
                url: self.url(),
                stored: set.permits,
                requested: 1,
            });
        }
        if req.yield_to_pollers.is_some() {
            st.last_ours = (!r.by_another_tool()).then(|| r.clone());
        }
        self.plan_for_mutex_record(req, r, version, st)
    }

    /// Rule 6: a record that is not a lockwarden lock is refused, unless forced.
    fn plan_for_foreign_record(
        &self,
        req: &AcquireRequest,
        found: &ForeignRecord,
        version: &Version,
    ) -> Result<Plan, LockError> {
        if !req.force {
            return Err(LockError::Foreign {
                url: self.url(),
                found: found.clone(),
            });
        }
        // Nothing to continue from: a forced takeover of a foreign record starts
        // the fence sequence afresh.
        Ok(Plan::Write(AcquisitionWrite {
            expected: Some(version.clone()),
            fence: FenceToken::FIRST,
            forced_from: None,
            ending: Ending::Forced,
        }))
    }

    /// A mutex record (or a holder set nobody holds, without a queue): taken when
    /// released, forced, observed expired (rule 1) or reclaimed, with the next fence
    /// (rule 3); otherwise busy for as long as its lease may still run.
    fn plan_for_mutex_record(
        &self,
        req: &AcquireRequest,
        r: &LockRecord,
        version: &Version,
        st: &mut ContenderState,
    ) -> Result<Plan, LockError> {
        let takeover_after = self.margins.takeover_after(r.lease);
        let (forced_from, ending) = if r.state == LockState::Released {
            if !r.by_another_tool()
                && let Some(left) = yield_left(req, version, st)
            {
                return Ok(Plan::Busy(Box::new(r.clone()), left));
            }
            (None, Ending::Released)
        } else if req.force {
            (Some(HeldBy::from_record(r)), Ending::Forced)
        } else if st.observer.is_expired(version, takeover_after) {
            // Only this next writer knows the lease ran out: its history entry says so.
            (None, Ending::Expired)
        } else if req.reclaim && r.holder == req.holder && !r.by_another_tool() {
            // Our own holder name's lock, left by an earlier run: taken back now, by
            // the same conditional write as a takeover, and reported as one.
            (Some(HeldBy::from_record(r)), Ending::Reclaimed)
        } else {
            let remaining = st.observer.remaining(version, takeover_after);
            return Ok(Plan::Busy(Box::new(r.clone()), remaining));
        };
        // Only a record written by hand ends the fence sequence; taking it over would
        // reuse its fence, so that is refused.
        let fence = r.fence.checked_next().ok_or_else(|| LockError::Backend {
            url: self.url(),
            message: format!(
                "the stored record has the last fence ({}): no later holder could carry a \
                 higher one; delete the record to start again",
                r.fence
            ),
        })?;
        Ok(Plan::Write(AcquisitionWrite {
            expected: Some(version.clone()),
            fence,
            forced_from,
            ending,
        }))
    }

    /// The acquisition's one conditional write (create if absent, else replace the
    /// version read), with rule 4 for a reply that never came. `None`: lost a race.
    async fn write_acquisition(
        &self,
        st: &mut ContenderState,
        expected: Option<Version>,
        record: LockRecord,
        lock_delay: Duration,
    ) -> Result<Option<Lease>, LockError> {
        let sent = Instant::now();
        let written = match &expected {
            None => self.store.create(&record).await,
            Some(v) => self.store.replace(v, &record).await,
        };
        match written {
            Ok(version) => {
                st.pending = None;
                st.observer.forget();
                Ok(Some(self.lease_from(record, version, sent, lock_delay)))
            }
            Err(StoreError::Conflict { current }) => {
                st.pending = Some((record, sent));
                st.last_seen = current.map(|c| *c);
                Ok(None)
            }
            Err(StoreError::Indeterminate(cause)) => {
                st.pending = Some((record.clone(), sent));
                match self.landed(&record).await? {
                    Some(version) => {
                        st.pending = None;
                        st.observer.forget();
                        Ok(Some(self.lease_from(record, version, sent, lock_delay)))
                    }
                    // Not there (yet): keep it pending, so a later attempt that finds
                    // it adopts it instead of waiting on itself.
                    None => Err(self.unavailable(format!("acquire outcome unknown: {cause}"))),
                }
            }
            Err(e) => Err(self.store_error(e)),
        }
    }
}

enum Renewed {
    Yes,
    AdoptedEarlierWrite,
}

/// What the store says about a renewal that failed or whose outcome is unknown.
enum Reconciled {
    /// The write in question landed.
    Landed(Version),
    /// The record is still at the lease's version: the write did not land (yet).
    NotApplied,
    /// The record is ours at another version: an earlier write whose reply was lost.
    Adopted(Box<LockRecord>, Version),
}

impl<S: RecordStore> CasLock<S> {
    async fn renew_once(&self, lease: &mut Lease) -> Result<Renewed, LockError> {
        let next = lease.record.renewed();
        // Before the store call (rule 2), or when the holder asked for its admission.
        let sent = crate::admission::send_time();
        let conflict = match self.store.replace(&lease.version, &next).await {
            Ok(version) => {
                lease.confirm(next, version, sent, &self.margins);
                return Ok(Renewed::Yes);
            }
            Err(StoreError::Conflict { .. }) => true,
            Err(StoreError::Indeterminate(_)) => false,
            Err(e) => return Err(self.store_error(e)),
        };
        match self.reconcile(lease, &next).await? {
            Reconciled::Landed(version) => {
                lease.confirm(next, version, sent, &self.margins);
                Ok(Renewed::Yes)
            }
            Reconciled::NotApplied if conflict => Err(self.unavailable(
                "the store refused a write conditioned on the version it still shows",
            )),
            Reconciled::NotApplied => {
                // It may still land: remember it, so the next renewal recognises it.
                lease.unconfirmed = Some(Box::new((next, sent)));
                Err(self.unavailable("renewal outcome unknown"))
            }
            Reconciled::Adopted(record, version) => {
                let record = *record;
                // Only a write we sent earlier could carry our nonce; if it is the one
                // we remembered, its send time extends the deadline.
                match lease.unconfirmed.take().map(|pending| *pending) {
                    Some((pending, pending_sent)) if record.is_write_of(&pending) => {
                        lease.confirm(record, version, pending_sent, &self.margins)
                    }
                    _ => {
                        lease.record = record;
                        lease.version = version;
                    }
                }
                Ok(Renewed::AdoptedEarlierWrite)
            }
        }
    }

    /// Rule 4 for a holder: reads the record to learn whether `written` landed, or
    /// whether the lock is still ours at all.
    async fn reconcile(
        &self,
        lease: &Lease,
        written: &LockRecord,
    ) -> Result<Reconciled, LockError> {
        let current = self.read().await?;
        match current {
            Some(Stored {
                record: Ok(r),
                version,
            }) if r.is_write_of(written) => Ok(Reconciled::Landed(version)),
            Some(s) if s.version == lease.version => Ok(Reconciled::NotApplied),
            Some(Stored {
                record: Ok(r),
                version,
            }) if r.nonce == lease.record.nonce && r.state == LockState::Held => {
                Ok(Reconciled::Adopted(Box::new(r), version))
            }
            other => Err(LockError::Lost {
                url: self.url(),
                reason: lost_reason(lease, other.as_ref()).unwrap_or(LostReason::NotOurs),
            }),
        }
    }
}

/// Why `current` means `lease` is no longer held; `None` if it still is ours.
fn lost_reason(lease: &Lease, current: Option<&Stored>) -> Option<LostReason> {
    match current {
        None => Some(LostReason::Deleted),
        Some(Stored {
            record: Err(found), ..
        }) => Some(LostReason::Foreign(found.clone())),
        Some(Stored { record: Ok(r), .. }) if r.nonce == lease.record.nonce => match r.state {
            LockState::Held => None,
            LockState::Released => Some(LostReason::ReleasedElsewhere),
        },
        Some(Stored { record: Ok(r), .. }) if r.state == LockState::Held => {
            Some(LostReason::TakenOver(HeldBy::from_record(r)))
        }
        Some(_) => Some(LostReason::ReleasedElsewhere),
    }
}

/// The rules of docs/design.md §3, one or more tests each, on the in-memory store.
///
/// Real time with short leases, not tokio's paused clock: the `test-util` feature
/// would rebuild tokio and every crate above it. Each timing assertion is one-sided so
/// it holds however slowly the test is scheduled: a contender's observation starts no
/// earlier than an instant taken before its first read, and a holder's write is sent no
/// earlier than an instant taken before the call (and no later than one taken after).
#[cfg(test)]
pub(super) mod tests {
    use std::time::Duration;

    use tokio::time::{Instant, sleep, sleep_until};

    use super::*;
    use crate::memory::{Fault, MemoryStore};
    use crate::record::ForeignRecord;

    pub(crate) const LEASE: Duration = Duration::from_millis(300);
    pub(crate) const MARGINS: SafetyMargins = SafetyMargins {
        drift: 0.02,
        margin: Duration::from_millis(30),
        grace: Duration::from_millis(50),
    };
    /// Rule 1: lease + grace.
    pub(crate) const TAKEOVER_AFTER: Duration = Duration::from_millis(350);
    /// Rule 2: lease × (1 − δ) − margin.
    const VALIDITY: Duration = Duration::from_millis(264);

    fn store() -> MemoryStore {
        MemoryStore::new("mem://locks/key")
    }

    /// One contender (a process) on the store's key.
    fn contender(store: &MemoryStore) -> CasLock<MemoryStore> {
        CasLock::new(store.clone()).with_margins(MARGINS)
    }

    fn req(holder: &str) -> AcquireRequest {
        AcquireRequest::new(holder, LEASE)
    }

    fn forced(holder: &str) -> AcquireRequest {
        AcquireRequest {
            force: true,
            ..req(holder)
        }
    }

    pub(crate) async fn acquired(lock: &CasLock<MemoryStore>, req: &AcquireRequest) -> Lease {
        match lock.try_acquire(req).await {
            Ok(Attempt::Acquired(lease)) => lease,
            other => panic!("{} should have acquired: {other:?}", req.holder),
        }
    }

    async fn busy(lock: &CasLock<MemoryStore>, req: &AcquireRequest) -> LockRecord {
        match lock.try_acquire(req).await {
            Ok(Attempt::Busy { holder, .. }) => holder,
            other => panic!("{} should have found the lock busy: {other:?}", req.holder),
        }
    }

    /// Polls until `lock` takes the lock over, checking rule 1 on every answer: a
    /// takeover only once `since` — taken before the version was first read — is
    /// lease + grace in the past.
    async fn take_over(lock: &CasLock<MemoryStore>, holder: &str, since: Instant) -> Lease {
        take_over_after(lock, holder, since, TAKEOVER_AFTER, 1).await
    }

    /// A store, and contender `a` holding the lock on it.
    async fn held_by_a() -> (MemoryStore, CasLock<MemoryStore>, Lease) {
        let store = store();
        let a = contender(&store);
        let lease = acquired(&a, &req("a")).await;
        (store, a, lease)
    }

    /// `a` tries to acquire; its write lands, but the reply and the re-read after it
    /// are lost, so the attempt fails as unavailable.
    async fn acquire_landing_unseen(store: &MemoryStore, a: &CasLock<MemoryStore>) {
        store.next_write(Fault::IndeterminateApplied);
        // The first read finds the key free; the one after the write fails.
        store.next_read(Fault::Pass).next_read(Fault::Unavailable);
        assert!(a.try_acquire(&req("a")).await.unwrap_err().is_transient());
    }

    fn lost(result: Result<(), LockError>) -> LostReason {
        match result {
            Err(LockError::Lost { reason, .. }) => reason,
            other => panic!("expected Lost, got {other:?}"),
        }
    }

    fn writes_by(store: &MemoryStore, holder: &str) -> usize {
        store
            .history()
            .iter()
            .flatten()
            .filter(|s| matches!(&s.record, Ok(r) if r.holder == holder))
            .count()
    }

    #[test]
    fn the_test_constants_are_the_margins_formulas() {
        assert_eq!(MARGINS.takeover_after(LEASE), TAKEOVER_AFTER);
        assert_eq!(MARGINS.holder_validity(LEASE), VALIDITY);
    }

    // Rule 1: expiry is observed, not computed from timestamps.

    #[tokio::test]
    async fn rule1_expiry_is_observed_not_computed_from_stored_timestamps() {
        let store = store();
        // A record whose wall-clock times say it expired decades ago.
        let mut ancient = LockRecord::new_acquisition("old", FenceToken(4), LEASE, None);
        ancient.acquired_at = std::time::UNIX_EPOCH;
        ancient.renewed_at = std::time::UNIX_EPOCH;
        store.put(Ok(ancient));

        let b = contender(&store);
        let since = Instant::now();
        assert_eq!(busy(&b, &req("b")).await.holder, "old");
        let lease = take_over(&b, "b", since).await;
        assert_eq!(lease.fence(), FenceToken(5));
        assert_eq!(store.record().nonce, lease.nonce());
    }

    #[tokio::test]
    async fn rule1_observation_starts_when_the_contender_first_sees_the_version() {
        let store = store();
        let a = contender(&store);
        acquired(&a, &req("a")).await;
        // A's lease is long over by anyone's clock, but B has not seen it yet.
        sleep(TAKEOVER_AFTER * 2).await;

        let b = contender(&store);
        let since = Instant::now();
        match b.try_acquire(&req("b")).await.unwrap() {
            Attempt::Busy {
                holder, retry_in, ..
            } => {
                assert_eq!(holder.holder, "a");
                let retry_in = retry_in.expect("a CAS store knows when to look again");
                assert!(retry_in <= TAKEOVER_AFTER && retry_in > TAKEOVER_AFTER / 2);
            }
            other => panic!("B took over on first sight: {other:?}"),
        }
        take_over(&b, "b", since).await;
    }

    #[tokio::test]
    async fn rule1_a_renewal_in_between_resets_the_observation() {
        let (store, a, mut a_lease) = held_by_a().await;
        let b = contender(&store);
        busy(&b, &req("b")).await;
        sleep(TAKEOVER_AFTER * 2 / 3).await;

        let renewed_from = Instant::now();
        a.renew(&mut a_lease).await.unwrap();
        // B's earlier observation of the old version must not count.
        take_over(&b, "b", renewed_from).await;
    }

    #[tokio::test]
    async fn rule1_a_restarted_contender_observes_afresh() {
        let store = store();
        acquired(&contender(&store), &req("a")).await;
        let b = contender(&store);
        busy(&b, &req("b")).await;
        sleep(TAKEOVER_AFTER * 2 / 3).await;
        drop(b);

        let restarted = Instant::now();
        let b_again = contender(&store);
        take_over(&b_again, "b", restarted).await;
    }

    #[tokio::test]
    async fn rule1_takeover_is_conditioned_on_the_observed_version() {
        let (store, _a, a_lease) = held_by_a().await;
        let b = contender(&store);
        busy(&b, &req("b")).await;
        sleep(TAKEOVER_AFTER + Duration::from_millis(20)).await;

        // A's renewal lands just before B's takeover write.
        let renewal = a_lease.record.renewed();
        store.next_write(Fault::ConcurrentWrite(Box::new(Ok(renewal.clone()))));
        assert_eq!(busy(&b, &req("b")).await.revision, renewal.revision);
        assert!(store.record().is_write_of(&renewal));
        assert_eq!(writes_by(&store, "b"), 0);
    }

    // Rule 2: the holder stops claiming before anyone else could take over.

    #[tokio::test]
    async fn rule2_holder_deadline_is_lease_less_drift_and_margin_after_sending() {
        let before = Instant::now();
        let (_store, _a, lease) = held_by_a().await;
        let after = Instant::now();
        let deadline = lease.deadline.instant();
        assert!(deadline >= before + VALIDITY && deadline <= after + VALIDITY);
        assert!(lease.is_valid());
        sleep_until(after + VALIDITY).await;
        assert!(!lease.is_valid(), "still claimed after its deadline");
    }

    #[tokio::test]
    async fn rule2_deadline_counts_from_the_send_not_the_reply() {
        let store = store();
        let a = contender(&store);
        let in_flight = Duration::from_millis(100);
        store.next_write(Fault::Delay(in_flight));
        let lease = acquired(&a, &req("a")).await;
        let replied = Instant::now();
        assert!(lease.deadline.instant() + in_flight <= replied + VALIDITY);

        let mut lease = lease;
        store.next_write(Fault::Delay(in_flight));
        let before = Instant::now();
        a.renew(&mut lease).await.unwrap();
        let replied = Instant::now();
        let deadline = lease.deadline.instant();
        assert!(
            deadline >= before + VALIDITY,
            "a renewal moves the deadline"
        );
        assert!(deadline + in_flight <= replied + VALIDITY);
    }

    #[tokio::test]
    async fn rule2_holder_gives_up_before_a_contender_may_take_over() {
        let before = Instant::now();
        let (store, _a, a_lease) = held_by_a().await;
        let b = contender(&store);
        take_over(&b, "b", before).await;
        assert!(!a_lease.is_valid(), "two holders claim the lock at once");
    }

    // Rule 8: the lock-delay rides on the stored lease; the holder's deadline does not.

    /// The lock-delay of the rule 8 tests: shorter than the lease, long enough that a
    /// takeover without it would be caught by `take_over_after`.
    pub(crate) const DELAY: Duration = Duration::from_millis(200);

    fn delayed(holder: &str) -> AcquireRequest {
        AcquireRequest {
            lock_delay: DELAY,
            ..req(holder)
        }
    }

    /// Like `take_over`, for a record whose stored lease is `after − grace`: no takeover
    /// before `since + after`, which `rule` (its number, for the message) requires.
    async fn take_over_after(
        lock: &CasLock<MemoryStore>,
        holder: &str,
        since: Instant,
        after: Duration,
        rule: u8,
    ) -> Lease {
        let give_up = since + after * 20;
        loop {
            let attempt = lock.try_acquire(&req(holder)).await.unwrap();
            let observed_at_most = since.elapsed();
            match attempt {
                Attempt::Acquired(lease) => {
                    assert!(
                        observed_at_most >= after,
                        "took over after at most {observed_at_most:?} of observation; \
                         rule {rule} needs {after:?}"
                    );
                    return lease;
                }
                Attempt::Busy { .. } => assert!(Instant::now() < give_up, "never took over"),
            }
            sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn rule8_the_record_carries_lease_plus_delay_while_the_holder_deadline_runs_on_the_lease()
    {
        let store = store();
        let a = contender(&store);
        let before = Instant::now();
        let lease = acquired(&a, &delayed("a")).await;
        let after = Instant::now();
        assert_eq!(store.record().lease, LEASE + DELAY);
        assert_eq!(lease.holder_lease(), LEASE);
        assert_eq!(lease.lock_delay, DELAY);
        let deadline = lease.deadline.instant();
        assert!(
            deadline >= before + VALIDITY && deadline <= after + VALIDITY,
            "the deadline is the lease's, not the stored lease's"
        );
    }

    #[tokio::test]
    async fn rule8_a_contender_waits_lease_plus_delay_plus_grace_after_an_expiry() {
        let before = Instant::now();
        let (store, _a, a_lease) = {
            let store = store();
            let a = contender(&store);
            let lease = acquired(&a, &delayed("a")).await;
            (store, a, lease)
        };
        let b = contender(&store);
        let lease = take_over_after(&b, "b", before, TAKEOVER_AFTER + DELAY, 8).await;
        assert_eq!(lease.fence(), FenceToken(2));
        assert!(!a_lease.is_valid(), "two holders claim the lock at once");
    }

    #[tokio::test]
    async fn rule8_a_release_is_taken_at_once_without_the_delay() {
        let store = store();
        let (a, b) = (contender(&store), contender(&store));
        let a_lease = acquired(&a, &delayed("a")).await;
        a.release(&a_lease).await.unwrap();
        // A release is a tombstone: no observation, no delay.
        let b_lease = acquired(&b, &req("b")).await;
        assert_eq!(b_lease.fence(), FenceToken(2));
    }

    #[tokio::test]
    async fn rule8_a_renewal_keeps_the_delay_and_the_holders_deadline() {
        let store = store();
        let a = contender(&store);
        let mut lease = acquired(&a, &delayed("a")).await;
        for _ in 0..2 {
            let before = Instant::now();
            a.renew(&mut lease).await.unwrap();
            let after = Instant::now();
            assert_eq!(
                store.record().lease,
                LEASE + DELAY,
                "a renewal never shrinks it"
            );
            let deadline = lease.deadline.instant();
            assert!(deadline >= before + VALIDITY && deadline <= after + VALIDITY);
        }
    }

    #[tokio::test]
    async fn rule8_an_acquisition_adopted_after_a_lost_reply_keeps_the_delay() {
        let store = store();
        let a = contender(&store);
        store.next_write(Fault::IndeterminateApplied);
        store.next_read(Fault::Pass).next_read(Fault::Unavailable);
        assert!(
            a.try_acquire(&delayed("a"))
                .await
                .unwrap_err()
                .is_transient()
        );
        // The retry (rule 4) finds its own write: adopted with the same split.
        let lease = acquired(&a, &delayed("a")).await;
        assert_eq!(lease.holder_lease(), LEASE);
        assert_eq!(store.record().lease, LEASE + DELAY);
        assert_eq!(writes_by(&store, "a"), 1);
    }

    #[tokio::test]
    async fn rule8_a_forced_takeover_does_not_wait_for_the_delay() {
        let store = store();
        acquired(&contender(&store), &delayed("a")).await;
        let b = contender(&store);
        // Force is a deliberate override: at once, reported, conditioned on the version.
        let lease = acquired(&b, &forced("b")).await;
        assert_eq!(lease.forced_from.map(|f| f.holder), Some("a".to_string()));
        assert_eq!(store.record().holder, "b");
    }

    // Rule 3: every acquisition increments the fence; release leaves a tombstone.

    #[tokio::test]
    async fn rule3_fence_increments_per_acquisition_and_survives_release() {
        let store = store();
        let (a, b) = (contender(&store), contender(&store));
        let first = acquired(&a, &req("a")).await;
        assert_eq!(first.fence(), FenceToken::FIRST);
        a.release(&first).await.unwrap();
        let tombstone = store.record();
        assert_eq!(tombstone.state, LockState::Released);
        assert_eq!(
            (tombstone.fence, tombstone.nonce.as_str()),
            (first.fence(), first.nonce())
        );

        let second = acquired(&b, &req("b")).await;
        assert_eq!(second.fence(), FenceToken(2));
        b.release(&second).await.unwrap();
        assert_eq!(acquired(&a, &req("a")).await.fence(), FenceToken(3));
    }

    #[tokio::test]
    async fn rule3_delete_on_release_resets_the_fence() {
        let store = store();
        let a = contender(&store).with_delete_on_release(true);
        let first = acquired(&a, &req("a")).await;
        a.release(&first).await.unwrap();
        assert_eq!(store.stored(), None);
        assert_eq!(acquired(&a, &req("a")).await.fence(), FenceToken::FIRST);
    }

    #[tokio::test]
    async fn rule3_warm_acquire_after_release_is_one_write() {
        let (store, a, lease) = held_by_a().await;
        a.release(&lease).await.unwrap();
        let (reads, writes) = store.requests();
        let again = acquired(&a, &req("a")).await;
        assert_eq!(store.requests(), (reads, writes + 1));
        assert_eq!(again.fence(), FenceToken(2));
    }

    #[tokio::test]
    async fn a_waiter_handed_the_release_takes_the_key_with_one_write() {
        let (store, a, lease) = held_by_a().await;
        let b = contender(&store);
        busy(&b, &req("b")).await;
        a.release(&lease).await.unwrap();
        let released = a.last_release().await.expect("a's release");
        b.learn(released).await;
        let (reads, writes) = store.requests();
        let next = acquired(&b, &req("b")).await;
        assert_eq!(
            store.requests(),
            (reads, writes + 1),
            "no read before the write"
        );
        assert_eq!(next.fence(), FenceToken(2));
    }

    #[tokio::test]
    async fn a_stale_hand_off_costs_a_conflict_never_a_second_holder() {
        let (store, a, lease) = held_by_a().await;
        let (b, c) = (contender(&store), contender(&store));
        a.release(&lease).await.unwrap();
        let released = a.last_release().await.expect("a's release");
        // c takes the key before b hears of the release.
        let held_by_c = acquired(&c, &req("c")).await;
        b.learn(released).await;
        let holder = busy(&b, &req("b")).await;
        assert_eq!(
            (holder.holder.as_str(), holder.fence),
            ("c", held_by_c.fence())
        );
    }

    #[tokio::test]
    async fn rule3_the_last_fence_is_never_reused() {
        let store = store();
        let last = LockRecord::new_acquisition("hand", FenceToken(u64::MAX), LEASE, None);
        store.put(Ok(last.released()));
        let err = contender(&store).try_acquire(&req("a")).await.unwrap_err();
        assert!(matches!(err, LockError::Backend { .. }), "{err}");
        assert_eq!(store.record().fence, FenceToken(u64::MAX));
    }

    // Rule 4: a write whose outcome is unknown is resolved by re-reading.

    #[tokio::test]
    async fn rule4_acquire_reply_lost_but_applied_is_ours() {
        let store = store();
        let a = contender(&store);
        store.next_write(Fault::IndeterminateApplied);
        let lease = acquired(&a, &req("a")).await;
        let stored = store.stored().unwrap();
        assert_eq!(lease.version, stored.version);
        assert!(stored.record.unwrap().is_write_of(&lease.record));
        assert!(lease.is_valid());
    }

    #[tokio::test]
    async fn rule4_acquire_reply_lost_not_applied_is_unavailable_and_holds_nothing() {
        let store = store();
        let a = contender(&store);
        store.next_write(Fault::IndeterminateNotApplied);
        let err = a.try_acquire(&req("a")).await.unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert_eq!(store.stored(), None);
        assert_eq!(acquired(&a, &req("a")).await.fence(), FenceToken::FIRST);
    }

    #[tokio::test]
    async fn rule4_acquire_that_landed_unseen_is_adopted_not_reported_busy() {
        let store = store();
        let a = contender(&store);
        // The write lands, its reply is lost, and the re-read fails too.
        acquire_landing_unseen(&store, &a).await;
        let ours = store.record();
        let lease = acquired(&a, &req("a")).await;
        assert_eq!(lease.nonce(), ours.nonce, "held by ourselves is ours");
        assert_eq!(lease.fence(), FenceToken::FIRST);
        assert!(lease.is_valid());
    }

    #[tokio::test]
    async fn rule4_acquire_adopted_after_its_deadline_is_confirmed_by_a_renewal() {
        let store = store();
        let a = contender(&store);
        acquire_landing_unseen(&store, &a).await;
        let landed = store.stored().unwrap().version;
        sleep(VALIDITY).await;

        let before = Instant::now();
        let lease = acquired(&a, &req("a")).await;
        assert!(lease.is_valid() && lease.deadline.instant() >= before + VALIDITY);
        assert_ne!(lease.version, landed, "confirmed by a fresh write");
        assert_eq!(lease.version, store.stored().unwrap().version);
    }

    #[tokio::test]
    async fn rule4_renewal_reply_lost_but_applied_is_confirmed() {
        let (store, a, mut lease) = held_by_a().await;
        store.next_write(Fault::IndeterminateApplied);
        let before = Instant::now();
        a.renew(&mut lease).await.unwrap();
        assert_eq!(lease.version, store.stored().unwrap().version);
        assert!(lease.deadline.instant() >= before + VALIDITY);
    }

    #[tokio::test]
    async fn rule4_renewal_reply_lost_not_applied_is_unavailable_then_retried() {
        let (store, a, mut lease) = held_by_a().await;
        let version = lease.version.clone();
        store.next_write(Fault::IndeterminateNotApplied);
        assert!(a.renew(&mut lease).await.unwrap_err().is_transient());
        assert_eq!(lease.version, version);
        assert!(lease.unconfirmed.is_some(), "remembered in case it lands");
        a.renew(&mut lease).await.unwrap();
        assert_eq!(lease.version, store.stored().unwrap().version);
    }

    #[tokio::test]
    async fn rule4_renewal_that_landed_unseen_is_adopted_by_the_next_renewal() {
        let (store, a, mut lease) = held_by_a().await;
        store.next_write(Fault::IndeterminateApplied);
        store.next_read(Fault::Unavailable);
        assert!(a.renew(&mut lease).await.unwrap_err().is_transient());
        assert_ne!(lease.version, store.stored().unwrap().version);
        // The next renewal's condition fails on our own landed write: not a loss.
        a.renew(&mut lease).await.unwrap();
        assert_eq!(lease.version, store.stored().unwrap().version);
        assert_eq!(store.record().nonce, lease.nonce());
    }

    #[tokio::test]
    async fn rule4_release_reply_lost_but_applied_is_released() {
        let (store, a, lease) = held_by_a().await;
        store.next_write(Fault::IndeterminateApplied);
        a.release(&lease).await.unwrap();
        assert_eq!(store.record().state, LockState::Released);
    }

    #[tokio::test]
    async fn rule4_release_reply_lost_not_applied_is_retried() {
        let (store, a, lease) = held_by_a().await;
        store.next_write(Fault::IndeterminateNotApplied);
        a.release(&lease).await.unwrap();
        let tombstone = store.record();
        assert_eq!(tombstone.state, LockState::Released);
        assert_eq!(tombstone.nonce, lease.nonce());
    }

    #[tokio::test]
    async fn rule4_release_from_a_renewal_that_landed_unseen() {
        let (store, a, mut lease) = held_by_a().await;
        let before_renewal = lease.clone();
        store.next_write(Fault::IndeterminateApplied);
        store.next_read(Fault::Unavailable);
        assert!(a.renew(&mut lease).await.is_err());
        // Released from the lease as it was before the renewal whose reply was lost.
        a.release(&before_renewal).await.unwrap();
        assert_eq!(store.record().state, LockState::Released);
    }

    // Rule 5: every write is conditional; force too.

    #[tokio::test]
    async fn rule5_force_takes_over_conditioned_on_the_version_read() {
        let (store, a, mut a_lease) = held_by_a().await;
        let b = contender(&store);
        let b_lease = acquired(&b, &forced("b")).await;
        assert_eq!(b_lease.fence(), FenceToken(2));
        let from = b_lease
            .forced_from
            .expect("a forced takeover says from whom");
        assert_eq!((from.holder.as_str(), from.fence), ("a", FenceToken(1)));
        // A learns at its next renewal; its write conditioned on its version fails.
        match lost(a.renew(&mut a_lease).await) {
            LostReason::TakenOver(by) => assert_eq!(by.holder, "b"),
            other => panic!("{other:?}"),
        }
        assert_eq!(store.record().holder, "b");
    }

    fn reclaiming(holder: &str) -> AcquireRequest {
        AcquireRequest {
            reclaim: true,
            ..req(holder)
        }
    }

    #[tokio::test]
    async fn rule5_reclaim_takes_back_only_the_same_holders_lock_with_a_new_fence() {
        let (store, _a, a_lease) = held_by_a().await;
        // Another holder name: reclaim is no force, the lock stays busy.
        assert_eq!(busy(&contender(&store), &reclaiming("b")).await.holder, "a");
        // A restarted "a" (a new process: nothing remembered) without reclaim waits...
        busy(&contender(&store), &req("a")).await;
        // ...and with it takes the lock back at once, as a reported takeover.
        let again = acquired(&contender(&store), &reclaiming("a")).await;
        assert_eq!(again.fence(), a_lease.fence().next());
        assert_ne!(again.nonce(), a_lease.nonce());
        let from = again.forced_from.expect("a reclaim is reported");
        assert_eq!((from.holder.as_str(), from.fence), ("a", a_lease.fence()));
        // The earlier run's lease is gone: its next renewal finds the lock taken.
        let mut old = a_lease;
        assert!(matches!(
            lost(contender(&store).renew(&mut old).await),
            LostReason::TakenOver(_)
        ));
    }

    #[tokio::test]
    async fn rule5_reclaim_is_conditioned_on_the_version_read() {
        let (store, _a, _lease) = held_by_a().await;
        // Between the reclaim's read and its write, "c" takes the key: the write fails
        // on the changed version and the re-read finds c, which is not ours.
        let c = LockRecord::new_acquisition("c", FenceToken(2), LEASE, None);
        store.next_write(Fault::ConcurrentWrite(Box::new(Ok(c))));
        let holder = busy(&contender(&store), &reclaiming("a")).await;
        assert_eq!(holder.holder, "c");
        assert_eq!(store.record().holder, "c");
    }

    #[tokio::test]
    async fn rule5_reclaim_never_takes_another_tools_lock_of_the_same_name() {
        let store = store();
        store.put(Ok(LockRecord {
            nonce: format!("{}rvn:1", crate::ANOTHER_TOOL_NONCE_PREFIX),
            ..LockRecord::new_acquisition("a", FenceToken(3), LEASE, None)
        }));
        busy(&contender(&store), &reclaiming("a")).await;
    }

    #[tokio::test]
    async fn rule5_force_replaces_the_record_it_read_not_one_it_did_not() {
        let store = store();
        let a = contender(&store);
        acquired(&a, &req("a")).await;
        // C slips in between B's read and B's forced write.
        let c = LockRecord::new_acquisition("c", FenceToken(2), LEASE, None);
        store.next_write(Fault::ConcurrentWrite(Box::new(Ok(c.clone()))));
        let b_lease = acquired(&contender(&store), &forced("b")).await;
        let from = b_lease.forced_from.clone().expect("forced");
        assert_eq!(from.holder, "c", "B took over the record it re-read");
        assert_eq!(b_lease.fence(), FenceToken(3));
    }

    #[tokio::test]
    async fn rule5_force_fails_rather_than_overwrite_a_record_that_keeps_changing() {
        let store = store();
        acquired(&contender(&store), &req("a")).await;
        for fence in 2..=(CONFLICT_RETRIES as u64 + 1) {
            let other = LockRecord::new_acquisition("c", FenceToken(fence), LEASE, None);
            store.next_write(Fault::ConcurrentWrite(Box::new(Ok(other))));
        }
        let holder = busy(&contender(&store), &forced("b")).await;
        assert_eq!(holder.holder, "c");
        assert_eq!(writes_by(&store, "b"), 0, "never written blindly");
    }

    #[tokio::test]
    async fn rule5_release_after_a_takeover_leaves_the_new_holder_alone() {
        let (store, a, a_lease) = held_by_a().await;
        acquired(&contender(&store), &forced("b")).await;
        let b_version = store.stored().unwrap().version;
        match lost(a.release(&a_lease).await) {
            LostReason::TakenOver(by) => assert_eq!(by.holder, "b"),
            other => panic!("{other:?}"),
        }
        assert_eq!(store.stored().unwrap().version, b_version);
    }

    // The key's holder history (lock/history.rs): informational, but each writer must
    // leave it right — the granting writer appends, the one that ends a grant closes it.

    #[tokio::test]
    async fn the_history_lists_each_grant_with_its_fence_and_how_it_ended() {
        let (store, a, lease) = held_by_a().await;
        a.release(&lease).await.unwrap();
        let b = contender(&store);
        let b_req = AcquireRequest {
            cluster: Some("west".into()),
            ..req("b")
        };
        acquired(&b, &b_req).await;
        // b stops renewing: c observes its lease run out and takes the key over.
        let c = contender(&store);
        let since = Instant::now();
        busy(&c, &req("c")).await;
        take_over(&c, "c", since).await;
        acquired(&contender(&store), &forced("d")).await;
        let history = a.history().await.unwrap();
        let seen: Vec<(&str, u64, String)> = history
            .iter()
            .map(|g| (g.holder.as_str(), g.fence.0, g.ended.to_string()))
            .collect();
        assert_eq!(
            seen,
            [
                ("a", 1, "released".to_string()),
                ("b", 2, "expired".into()),
                ("c", 3, "forced".into()),
                ("d", 4, "held".into()),
            ]
        );
        assert_eq!(history[1].cluster.as_deref(), Some("west"));
        assert!(history[..3].iter().all(|g| g.ended_at_ms.is_some()));
        assert_eq!(history[3].ended_at_ms, None);
        // Renewals leave it as it is.
        let stored_before = store.record().history;
        let mut d = acquired(&contender(&store), &reclaiming("d")).await;
        contender(&store).renew(&mut d).await.unwrap();
        let after = store.record().history;
        assert_eq!(after.len(), stored_before.len() + 1);
        assert_eq!(after[3].ended, crate::Ending::Reclaimed);
        assert_eq!(after[4].fence, FenceToken(5));
    }

    // Rule 6: foreign or corrupt records are reported, never overwritten unless forced.

    #[tokio::test]
    async fn rule6_foreign_record_is_reported_not_overwritten() {
        let store = store();
        let foreign = ForeignRecord::new("an s3lock UUID body");
        let version = store.put(Err(foreign.clone()));
        match contender(&store).try_acquire(&req("a")).await {
            Err(LockError::Foreign { found, .. }) => assert_eq!(found, foreign),
            other => panic!("{other:?}"),
        }
        assert_eq!(store.stored().unwrap().version, version);
        assert_eq!(store.history().len(), 1);
    }

    #[tokio::test]
    async fn rule6_force_replaces_a_foreign_record_starting_the_fence_afresh() {
        let store = store();
        store.put(Err(ForeignRecord::new("garbage")));
        let lease = acquired(&contender(&store), &forced("a")).await;
        assert_eq!(lease.fence(), FenceToken::FIRST);
        assert_eq!(lease.forced_from, None);
        assert_eq!(store.record().nonce, lease.nonce());
    }

    #[tokio::test]
    async fn rule6_holder_whose_record_became_foreign_has_lost_it() {
        let (store, a, mut lease) = held_by_a().await;
        store.put(Err(ForeignRecord::new("garbage")));
        assert!(matches!(
            lost(a.renew(&mut lease).await),
            LostReason::Foreign(_)
        ));
        assert!(store.stored().unwrap().record.is_err(), "left alone");
    }

    // Resuming after a restart (docs/design.md §4): only our own nonce is adopted.

    #[tokio::test]
    async fn resume_adopts_our_nonce_with_an_expired_deadline_until_renewed() {
        let (store, _a, lease) = held_by_a().await;
        let restarted = contender(&store);
        let mut resumed = restarted.resume("a", lease.nonce()).await.unwrap();
        assert_eq!(resumed.fence(), lease.fence());
        assert!(!resumed.is_valid(), "not claimed before a fresh write");
        restarted.renew(&mut resumed).await.unwrap();
        assert!(resumed.is_valid());

        let err = restarted.resume("a", "another-nonce").await.unwrap_err();
        assert!(matches!(err, LockError::Lost { .. }), "{err}");
    }

    #[tokio::test]
    async fn an_unreachable_store_is_transient_and_changes_nothing() {
        let store = store();
        let a = contender(&store);
        store.next_read(Fault::Unavailable);
        assert!(a.try_acquire(&req("a")).await.unwrap_err().is_transient());
        store.next_write(Fault::Unavailable);
        assert!(a.try_acquire(&req("a")).await.unwrap_err().is_transient());
        assert!(store.history().is_empty());
        let mut lease = acquired(&a, &req("a")).await;
        store.next_write(Fault::Conflict);
        // A refusal while the store still shows our version is not a loss.
        assert!(a.renew(&mut lease).await.unwrap_err().is_transient());
        a.renew(&mut lease).await.unwrap();
    }

    /// §6.4, sharing a key with a tool that polls: after a lockwarden release, a request
    /// that yields finds the key busy for the window from its first sight of the key
    /// free, then takes it; a key another tool released, or a request without the
    /// yield, is taken at once; on a key deleted on release the absence after a
    /// lockwarden record yields the same.
    #[tokio::test]
    async fn a_request_that_yields_leaves_a_key_lockwarden_freed_for_one_poll() {
        const WINDOW: Duration = Duration::from_millis(200);
        let yielding = |holder| AcquireRequest {
            yield_to_pollers: Some(WINDOW),
            ..req(holder)
        };
        for delete_on_release in [false, true] {
            let store = store();
            let a = contender(&store).with_delete_on_release(delete_on_release);
            let b = contender(&store).with_delete_on_release(delete_on_release);
            // b saw a hold it; then a releases.
            let lease = acquired(&a, &req("a")).await;
            busy(&b, &yielding("b")).await;
            a.release(&lease).await.unwrap();
            let first_sight = Instant::now();
            let seen = busy(&b, &yielding("b")).await;
            assert_eq!(seen.holder, "a", "the holder it yields after");
            // a itself, locking again with the yield, leaves the key alone too.
            busy(&a, &yielding("a")).await;
            tokio::time::sleep(WINDOW + Duration::from_millis(20)).await;
            let taken = acquired(&b, &yielding("b")).await;
            assert!(first_sight.elapsed() >= WINDOW);
            b.release(&taken).await.unwrap();
            // Without the yield, a freed key is taken at once.
            let again = acquired(&a, &req("a")).await;
            a.release(&again).await.unwrap();
        }

        // Another tool's release is taken at once.
        let store = store();
        let mut theirs =
            LockRecord::new_acquisition("dynamolock-1", FenceToken(4), LEASE, None).released();
        theirs.nonce = format!("{}x", super::super::record::ANOTHER_TOOL_NONCE_PREFIX);
        store.put_body(&theirs.to_json());
        acquired(&contender(&store), &yielding("c")).await;
    }

    // Once per run (docs/design.md §6.7): the memory of completed runs.

    fn run(name: &str) -> crate::RunKey {
        crate::RunKey::new(name).unwrap()
    }

    fn completed(lease: &Lease, name: &str) -> CompletedRun {
        CompletedRun::now(&run(name), lease.fence(), lease.holder(), Some("east"))
    }

    /// A completion recorded with a release is in the memory of the next grant, and
    /// stays through that holder's renewals and plain release, a takeover by expiry
    /// and later grants; a plain release records nothing.
    #[tokio::test]
    async fn once_a_recorded_completion_is_seen_by_every_later_grant() {
        let (store, a, lease) = held_by_a().await;
        a.release_completed(&lease, completed(&lease, "r1"), 64)
            .await
            .unwrap();
        let b = contender(&store);
        let mut held = acquired(&b, &req("b")).await;
        assert!(matches!(
            held.record.runs.check(&run("r1")),
            crate::RunCheck::Completed(r) if r.holder == "a" && r.fence == FenceToken(1)
        ));
        assert_eq!(held.record.runs.check(&run("r2")), crate::RunCheck::New);
        b.renew(&mut held).await.unwrap();
        assert_eq!(
            store.record().runs.runs.len(),
            1,
            "a renewal keeps the memory"
        );
        // b's run failed: a plain release, nothing recorded.
        b.release(&held).await.unwrap();
        // c takes the key, stops renewing, and d takes it over by expiry.
        let c = contender(&store);
        let c_lease = acquired(&c, &req("c")).await;
        assert_eq!(c_lease.record.runs.runs.len(), 1);
        let d = contender(&store);
        let since = Instant::now();
        busy(&d, &req("d")).await;
        let d_lease = take_over(&d, "d", since).await;
        let runs: Vec<&str> = d_lease
            .record
            .runs
            .runs
            .iter()
            .map(|r| r.run.as_str())
            .collect();
        assert_eq!(runs, ["r1"], "only the completed run, through a takeover");
        d.release_completed(&d_lease, completed(&d_lease, "r2"), 64)
            .await
            .unwrap();
        let runs: Vec<String> = store
            .record()
            .runs
            .runs
            .into_iter()
            .map(|r| r.run)
            .collect();
        assert_eq!(runs, ["r1", "r2"]);
    }

    /// A key deleted on release cannot remember: a release that would record a run is
    /// refused before anything is written, and the key stays held.
    #[tokio::test]
    async fn bad_input_once_on_a_key_deleted_on_release_is_refused() {
        let store = MemoryStore::new("mem://runs");
        let a = contender(&store).with_delete_on_release(true);
        assert!(a.keeps_runs().is_err());
        let lease = acquired(&a, &req("a")).await;
        let refused = a
            .release_completed(&lease, completed(&lease, "r1"), 64)
            .await
            .unwrap_err();
        assert!(
            refused.to_string().contains("deleted on release"),
            "{refused}"
        );
        assert_eq!(store.record().state, LockState::Held);
        a.release(&lease).await.unwrap();
    }
}

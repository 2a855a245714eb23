//! Keys with more than one permit on a store with conditional writes (S3, DynamoDB,
//! Kubernetes Lease), docs/design.md §6.2: the [`HolderSet`] lives in the key's one
//! record, and every change to it is one conditional write of the whole record.
//!
//! The rules of §3 hold per holder entry:
//! - rule 1: a contender reclaims a permit only after it has itself seen that entry's
//!   revision unchanged for the entry's lease plus the grace. A renewal rewrites only
//!   the renewing holder's entry, so renewals of different holders never make each
//!   other look expired, although every one of them changes the record's version;
//! - rule 2: a holder's deadline counts from the send time of the last write that
//!   carried its renewed entry;
//! - rule 3: every grant takes the key's next fence (the record's `fence` is the last
//!   one granted), so fences increase strictly across all grants;
//! - rule 4: a write whose reply was lost is resolved by reading the set: our nonce
//!   (acquisition) or our new revision (renewal) in it means it landed.
//!
//! A renewal or release that loses a write race to another holder re-reads the set and
//! tries again, the renewal only while the holder deadline allows.
//!
//! Writers are not starved: an exclusive contender that cannot be granted registers as
//! the set's `waiting_writer` (one slot, first come) and refreshes that entry on every
//! attempt; while it is live, no new shared holder is admitted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::backend::{AcquireRequest, Attempt, Lease, RecordStore, StoreError};
use super::cas::CasLock;
use super::clock::HolderDeadline;
use super::error::{HeldBy, LockError, LostReason};
use super::permits::{HolderSet, Mode, SetEntry};
use super::queue;
use super::record::{FenceToken, LockRecord, LockState, Stored, UnknownFields, Version, random_id};

/// How many times one acquisition attempt re-reads after losing a write race before it
/// reports the key busy (the caller tries again later).
const SET_RETRIES: usize = 8;

/// How long a release keeps retrying after losing write races to other holders. A
/// release that never lands is not unsafe (the entry expires), only slower for others.
const RELEASE_PATIENCE: Duration = Duration::from_secs(30);

/// Conditional writes of a holder set that lost a race to another writer, in this
/// process: each costs one more read and write. Counted for the benchmarks.
static LOST_WRITE_RACES: AtomicU64 = AtomicU64::new(0);

/// How many conditional writes of holder sets have lost a race in this process.
pub fn lost_write_races() -> u64 {
    LOST_WRITE_RACES.load(Ordering::Relaxed)
}

pub(super) fn lost_a_race() {
    LOST_WRITE_RACES.fetch_add(1, Ordering::Relaxed);
}

/// Keeps in `lease` the set a renewal found, when only others' writes moved it on (our
/// entry is as we last confirmed it): should the renewal be abandoned at its request
/// timeout, the next one starts from there instead of losing the same race again.
/// Behind a slow store, a renewal that starts one write behind needs a lost write, a
/// read and a second write; with waiters refreshing the record it could then miss its
/// timeout every time, until the holder's entry expired (docs/design.md §6.4, "Renewal
/// with waiters").
fn start_next_renewal_from(lease: &mut Lease, seen: &(HolderSet, Version, UnknownFields)) {
    let (set, version, unknown) = seen;
    let unchanged = set
        .entry(&lease.record.nonce)
        .is_some_and(|e| e.revision == lease.record.revision);
    if unchanged {
        lease.record.set = Some(set.clone());
        lease.record.unknown = unknown.clone();
        lease.version = version.clone();
    }
}

/// A short random pause after losing a write race, growing with the number of losses,
/// so that holders writing the one record at once spread out instead of colliding again.
async fn back_off(losses: u32) {
    let ceiling = 2u64.saturating_pow(losses.min(6)).min(50);
    let pause = rand::random_range(0..=ceiling);
    tokio::time::sleep(Duration::from_millis(pause)).await;
}

/// What a contender for a permit remembers between attempts.
#[derive(Default)]
pub(super) struct SetContender {
    /// Rule 1 per entry: the revision each entry (by nonce) was last seen with, and
    /// since when on our clock.
    observed: HashMap<String, (String, Instant)>,
    /// Rule 4: our acquisition entry whose write's outcome we never learned.
    pending: Option<(SetEntry, Instant)>,
    /// Our registration as the waiting writer (or in the key's queue), reused across
    /// attempts so others see one live entry.
    pub(super) waiting: Option<SetEntry>,
    /// When we last sent a write of our queue registration: it is refreshed every
    /// third of its lease (docs/design.md §6.4).
    pub(super) waiting_written: Option<Instant>,
    /// The queue ticket the store gave our registration (its write landed), until we
    /// are granted or give up: if others drop the registration because we missed its
    /// refreshes (a stall, not a death), we register again with it and keep our place
    /// (docs/design.md §6.4).
    pub(super) ticket: Option<u64>,
}

/// Every entry of a set that expires by rule 1: holders, the waiting writer, waiters.
fn entries(set: &HolderSet) -> impl Iterator<Item = &SetEntry> {
    set.holders
        .iter()
        .chain(set.waiting_writer.iter())
        .chain(set.queue.iter().flat_map(|q| q.waiters.iter()))
}

impl SetContender {
    /// Records the entries of `set` as seen now and returns the nonces of those seen
    /// unchanged for their lease plus the grace.
    fn expired(
        &mut self,
        set: &HolderSet,
        takeover_after: impl Fn(Duration) -> Duration,
    ) -> Vec<String> {
        let now = Instant::now();
        let mut seen = HashMap::new();
        let mut expired = Vec::new();
        for e in entries(set) {
            let since = match self.observed.get(&e.nonce) {
                Some((revision, since)) if *revision == e.revision => *since,
                _ => now,
            };
            if now.saturating_duration_since(since) >= takeover_after(e.lease()) {
                expired.push(e.nonce.clone());
            }
            seen.insert(e.nonce.clone(), (e.revision.clone(), since));
        }
        self.observed = seen;
        expired
    }

    /// Rule 1 per entry: drops the holders (and a waiting writer) seen unchanged for
    /// their lease; the write that follows is conditioned on the version that showed them.
    fn drop_expired(&mut self, set: &mut HolderSet, takeover_after: impl Fn(Duration) -> Duration) {
        let expired = self.expired(set, takeover_after);
        set.holders.retain(|h| !expired.contains(&h.nonce));
        if set
            .waiting_writer
            .as_ref()
            .is_some_and(|w| expired.contains(&w.nonce))
        {
            set.waiting_writer = None;
        }
        if let Some(queue) = set.queue.as_mut() {
            queue.waiters.retain(|w| !expired.contains(&w.nonce));
        }
    }

    /// How long until the first live entry of `set` could be seen expired.
    pub(super) fn next_expiry(
        &self,
        set: &HolderSet,
        takeover_after: impl Fn(Duration) -> Duration,
    ) -> Duration {
        entries(set)
            .map(|e| match self.observed.get(&e.nonce) {
                Some((_, since)) => takeover_after(e.lease()).saturating_sub(since.elapsed()),
                None => takeover_after(e.lease()),
            })
            .min()
            .unwrap_or_default()
    }
}

/// The record as a set, the version a write must name (`None`: create), and the
/// record's fields this build does not know, which every rewrite carries.
pub(super) struct Current {
    pub(super) set: HolderSet,
    pub(super) version: Option<Version>,
    pub(super) unknown: UnknownFields,
    /// Another tool's lock holds the key (s3lock, dynamolock, client-go): it stands in
    /// `set` as one exclusive entry, observed like any other (rule 1), and the record
    /// is its, so nothing but a grant after its observed expiry may replace it.
    pub(super) another_tool: Option<LockRecord>,
}

/// The record a set is stored as. The summary fields are for other tools and older
/// builds: held while anyone holds a permit, by the first holder, with the last fence.
/// `unknown`: the fields of the record it replaces that this build does not know.
pub(super) fn record_of(set: HolderSet, unknown: &UnknownFields) -> LockRecord {
    let now = SystemTime::now();
    let summary = set.holders.first().cloned();
    // A queued key with waiters and no holder stays held for other tools: the head is
    // about to take it (docs/design.md §6.4, foreign tools wait while the queue drains).
    let queued_for = set
        .holders
        .is_empty()
        .then(|| queue::summary_holder(&set))
        .flatten();
    LockRecord {
        holder: queued_for.clone().unwrap_or_else(|| holder_summary(&set)),
        // A fresh id per write: the body (and so an S3 ETag) is unique per write.
        nonce: format!("set:{}", random_id()),
        revision: random_id(),
        fence: set.last_fence,
        lease: set
            .holders
            .iter()
            .map(SetEntry::lease)
            .max()
            .or(set.waiting_writer.as_ref().map(SetEntry::lease))
            .or(set
                .queue
                .iter()
                .flat_map(|q| q.waiters.iter())
                .map(SetEntry::lease)
                .max())
            .unwrap_or(Duration::from_secs(1)),
        state: if set.holders.is_empty() && queued_for.is_none() {
            LockState::Released
        } else {
            LockState::Held
        },
        data: None,
        acquired_at: summary.as_ref().map_or(now, SetEntry::acquired_at),
        renewed_at: now,
        set: Some(set),
        // Not kept on keys with more than one permit (docs/backends.md "Holder
        // history"): the set's entries are its current grants.
        history: Vec::new(),
        runs: Default::default(),
        unknown: unknown.clone(),
    }
}

/// The holders of a set as one name, as every store's summary shows them: "a",
/// "a and b", "a, b and 3 more".
pub fn holder_summary(set: &HolderSet) -> String {
    let names: Vec<&str> = set.holders.iter().map(|h| h.holder.as_str()).collect();
    match names.as_slice() {
        [] => String::new(),
        [one] => one.to_string(),
        [a, b] => format!("{a} and {b}"),
        [a, b, rest @ ..] => format!("{a}, {b} and {} more", rest.len()),
    }
}

/// A holder's view of the record: its own entry in the lock-record fields (so
/// `Lease::fence`, `nonce`, `holder` are its own), the whole set in `set`, and the
/// record's fields this build does not know in `unknown`.
pub(super) fn entry_view(entry: &SetEntry, set: &HolderSet, unknown: &UnknownFields) -> LockRecord {
    LockRecord {
        holder: entry.holder.clone(),
        nonce: entry.nonce.clone(),
        revision: entry.revision.clone(),
        fence: entry.fence,
        lease: entry.lease(),
        state: LockState::Held,
        data: entry.data.clone(),
        acquired_at: entry.acquired_at(),
        renewed_at: entry.renewed_at(),
        set: Some(set.clone()),
        history: Vec::new(),
        runs: Default::default(),
        unknown: unknown.clone(),
    }
}

/// What a write of the set replaces: the version read (`None`: create) and the fields
/// of that record this build does not know, which the write carries.
type Replacing<'a> = (Option<&'a Version>, &'a UnknownFields);
/// With `req.reclaim`: the set without the first entry held under our holder name
/// (left by an earlier run of this holder), and who that was.
pub(super) fn reclaimable(set: &HolderSet, req: &AcquireRequest) -> Option<(HolderSet, HeldBy)> {
    if !req.reclaim {
        return None;
    }
    let i = set.holders.iter().position(|h| h.holder == req.holder)?;
    let mut without = set.clone();
    let entry = without.holders.remove(i);
    let from = HeldBy {
        holder: entry.holder.clone(),
        fence: entry.fence,
        since: Some(entry.acquired_at()),
        nonce: entry.nonce.clone(),
    };
    Some((without, from))
}

/// Our entry as a holder granted `fence`. Rule 8: every entry's lease carries the
/// lock-delay for contenders.
pub(super) fn holder_entry(req: &AcquireRequest, fence: FenceToken) -> SetEntry {
    let stored_lease = req.lease + req.lock_delay;
    SetEntry::new(
        &req.holder,
        fence,
        stored_lease,
        req.permits.mode,
        req.data.clone(),
    )
}

/// Whether `set` admits a new holder in `mode` now, with `us` the nonce of our
/// waiting-writer registration, if any.
fn admits(set: &HolderSet, mode: Mode, us: Option<&str>) -> bool {
    let writer_ahead = set
        .waiting_writer
        .as_ref()
        .is_some_and(|w| Some(w.nonce.as_str()) != us);
    match mode {
        Mode::Exclusive => set.holders.is_empty() && !writer_ahead,
        Mode::Shared => {
            !writer_ahead
                && set.holders.iter().all(|h| h.mode == Mode::Shared)
                && (set.holders.len() as u32) < set.permits
        }
    }
}

impl<S: RecordStore> CasLock<S> {
    /// Reads the key as a set of holders for a contender asking for `req.permits`.
    fn as_set(&self, req: &AcquireRequest, stored: Option<&Stored>) -> Result<Current, LockError> {
        let permits = req.permits.total;
        let Some(stored) = stored else {
            return Ok(Current {
                set: HolderSet {
                    permits,
                    ..HolderSet::default()
                },
                version: None,
                unknown: UnknownFields::new(),
                another_tool: None,
            });
        };
        let r = match &stored.record {
            Ok(r) => r,
            Err(found) => {
                return Err(LockError::Foreign {
                    url: self.url(),
                    found: found.clone(),
                });
            }
        };
        let mut set = match &r.set {
            Some(set) => self.stored_set_for(set, permits)?,
            None if r.state == LockState::Held => {
                return self.held_mutex_as_set(req, r, &stored.version);
            }
            None => HolderSet {
                permits,
                ..HolderSet::default()
            },
        };
        // A released mutex record (or an older set) continues the key's fences.
        set.last_fence = set.last_fence.max(r.fence);
        Ok(Current {
            set,
            version: Some(stored.version.clone()),
            unknown: r.unknown.clone(),
            another_tool: None,
        })
    }

    /// The stored holder set, for a contender asking for `permits`: every lock on a
    /// held key must name the key's permits.
    fn stored_set_for(&self, set: &HolderSet, permits: u32) -> Result<HolderSet, LockError> {
        if set.permits == permits {
            return Ok(set.clone());
        }
        if !set.holders.is_empty() {
            return Err(LockError::PermitsDisagree {
                url: self.url(),
                stored: set.permits,
                requested: permits,
            });
        }
        // Nobody holds it: the permits are whatever the next holder names.
        Ok(HolderSet {
            permits,
            waiting_writer: set.waiting_writer.clone(),
            queue: set.queue.clone(),
            ..HolderSet::default()
        })
    }

    /// A held record without a holder set, for a contender asking for
    /// `req.permits`.
    ///
    /// Another tool's lock has no permits: held, permits unknown. It counts as one
    /// exclusive holder (its revision is the store's version, which every write of
    /// that tool changes); the first lockwarden holder after it names the permits.
    /// A queued mutex contender (docs/design.md §6.4) sees a held mutex record the same
    /// way, as its one exclusive holder, observed by the record's version; the record
    /// is ours, so its unknown fields are carried. Anyone else asks for permits the
    /// held mutex does not have.
    fn held_mutex_as_set(
        &self,
        req: &AcquireRequest,
        r: &LockRecord,
        version: &Version,
    ) -> Result<Current, LockError> {
        let permits = req.permits.total;
        if !(r.by_another_tool() || (req.queue.is_some() && permits == 1)) {
            return Err(LockError::PermitsDisagree {
                url: self.url(),
                stored: 1,
                requested: permits,
            });
        }
        let mut entry = SetEntry::new(&r.holder, r.fence, r.lease, Mode::Exclusive, None);
        entry.nonce = r.nonce.clone();
        entry.revision = version.0.clone();
        let another_tool = r.by_another_tool();
        Ok(Current {
            set: HolderSet {
                permits,
                holders: vec![entry],
                last_fence: r.fence,
                ..HolderSet::default()
            },
            version: Some(version.clone()),
            // Another tool's record: nothing of it is ours to carry.
            unknown: if another_tool {
                UnknownFields::new()
            } else {
                r.unknown.clone()
            },
            another_tool: another_tool.then(|| r.clone()),
        })
    }

    /// One attempt at a permit (docs/design.md §6.2).
    pub(super) async fn try_acquire_permit(
        &self,
        req: &AcquireRequest,
    ) -> Result<Attempt, LockError> {
        if req.force {
            return Err(self.force_refused());
        }
        let mut st = self.state.lock().await;
        let takeover_after = |lease| self.margins.takeover_after(lease);
        let mut last_seen = None;
        for attempt in 0..SET_RETRIES as u32 {
            let stored = self.read().await?;
            if let Some(lease) = self
                .adopt_pending_permit(&mut st.set, stored.as_ref(), req.lock_delay)
                .await?
            {
                return Ok(Attempt::Acquired(lease));
            }
            let mut current = self.as_set(req, stored.as_ref())?;
            last_seen = Some(current.set.clone());
            st.set.drop_expired(&mut current.set, takeover_after);
            // A queued key (or a queued contender): docs/design.md §6.4.
            let queued = req.queue.is_some() || current.set.queue.is_some();
            let outcome = if queued {
                self.queued_attempt(&mut st.set, req, current).await?
            } else {
                self.permit_attempt(&mut st.set, req, current).await?
            };
            match outcome {
                Some(attempt) => return Ok(attempt),
                None => back_off(attempt).await,
            }
        }
        // Every write lost a race: busy for now, as the last set read showed.
        let holder = record_of(last_seen.unwrap_or_default(), &UnknownFields::new());
        Ok(Attempt::Busy {
            holder,
            retry_in: Some(Duration::from_millis(50)),
            queue_position: None,
        })
    }

    /// One attempt on a key without a queue, on the set read (expired entries already
    /// dropped): reclaim our earlier run's permit, take a free one, or wait (as the
    /// waiting writer when exclusive). `Ok(None)`: a write lost a race; read again.
    async fn permit_attempt(
        &self,
        st: &mut SetContender,
        req: &AcquireRequest,
        current: Current,
    ) -> Result<Option<Attempt>, LockError> {
        let takeover_after = |lease| self.margins.takeover_after(lease);
        let Current {
            mut set,
            version,
            unknown,
            another_tool,
        } = current;
        let ours = st.waiting.as_ref().map(|w| w.nonce.clone());
        if let Some(holder) = another_tool.filter(|_| !set.holders.is_empty()) {
            // Busy, and no waiting-writer registration: the record is the other
            // tool's, never rewritten while its lock is live.
            let retry_in = st.next_expiry(&set, takeover_after).min(req.lease / 3);
            return Ok(Some(Attempt::Busy {
                holder,
                retry_in: Some(retry_in),
                queue_position: None,
            }));
        }
        if let Some((without, from)) = reclaimable(&set, req)
            && admits(&without, req.permits.mode, ours.as_deref())
        {
            // Our holder name's permit from an earlier run: its entry leaves in the
            // same conditional write that grants ours, with the key's next fence.
            let granted = self
                .grant(st, req, without, (version.as_ref(), &unknown))
                .await?;
            return Ok(granted.map(|mut lease| {
                lease.forced_from = Some(from);
                Attempt::Acquired(lease)
            }));
        }
        if admits(&set, req.permits.mode, ours.as_deref()) {
            let granted = self
                .grant(st, req, set, (version.as_ref(), &unknown))
                .await?;
            return Ok(granted.map(Attempt::Acquired));
        }
        if !self
            .wait_as_writer(st, req, &mut set, (version.as_ref(), &unknown))
            .await
        {
            return Ok(None);
        }
        // Refresh the registration well within its lease; otherwise wake when the
        // first entry could be seen expired.
        let retry_in = st.next_expiry(&set, takeover_after).min(req.lease / 3);
        Ok(Some(Attempt::Busy {
            holder: record_of(set, &unknown),
            retry_in: Some(retry_in),
            queue_position: None,
        }))
    }

    /// Why a forced takeover is refused on a key with permits or a queue: it would take
    /// away permits others hold in good standing, or jump the queue.
    fn force_refused(&self) -> LockError {
        LockError::Backend {
            url: self.url(),
            message: "force is not supported on a key with more than one permit or a queue: \
                      release the holders instead"
                .into(),
        }
    }

    /// The fence the next grant on `set` takes (rule 3); none after the last one.
    pub(super) fn next_fence(&self, set: &HolderSet) -> Result<FenceToken, LockError> {
        let last = set.last_fence;
        last.checked_next().ok_or_else(|| LockError::Backend {
            url: self.url(),
            message: format!(
                "the stored record has the last fence ({last}): no later holder could carry \
                 a higher one; delete the record to start again"
            ),
        })
    }

    /// The admitted path: the key's next fence, our entry in the set (taking our
    /// waiting-writer slot out of it), one conditional write. `None`: lost a race.
    async fn grant(
        &self,
        st: &mut SetContender,
        req: &AcquireRequest,
        mut set: HolderSet,
        replacing: Replacing<'_>,
    ) -> Result<Option<Lease>, LockError> {
        let entry = holder_entry(req, self.next_fence(&set)?);
        let ours = st.waiting.as_ref().map(|w| &w.nonce);
        if set.waiting_writer.as_ref().map(|w| &w.nonce) == ours {
            set.waiting_writer = None;
        }
        let lease = self
            .write_grant(st, replacing, set, entry, req.lock_delay)
            .await?;
        if lease.is_some() {
            st.waiting = None;
        }
        Ok(lease)
    }

    /// Not admitted: an exclusive contender takes (or keeps refreshing) the set's
    /// waiting-writer slot when it is free or already ours. `false`: that write lost a
    /// race (read again); `true`: report the key busy.
    async fn wait_as_writer(
        &self,
        st: &mut SetContender,
        req: &AcquireRequest,
        set: &mut HolderSet,
        (version, unknown): Replacing<'_>,
    ) -> bool {
        let ours = st.waiting.as_ref().map(|w| w.nonce.clone());
        let slot_free = set.waiting_writer.is_none()
            || set.waiting_writer.as_ref().map(|w| &w.nonce) == ours.as_ref();
        if req.permits.mode != Mode::Exclusive || !slot_free {
            return true;
        }
        let waiting = match st.waiting.take() {
            Some(w) => w.renewed(),
            None => SetEntry::new(&req.holder, FenceToken(0), req.lease, Mode::Exclusive, None),
        };
        set.waiting_writer = Some(waiting.clone());
        let written = self
            .write_set(version, &record_of(set.clone(), unknown))
            .await;
        // Whatever the outcome, the registration may be there: keep its nonce so the
        // next attempt refreshes rather than duplicates it.
        st.waiting = Some(waiting);
        match written {
            Err(StoreError::Conflict { .. }) => {
                lost_a_race();
                false
            }
            _ => true,
        }
    }

    /// Creates the record or replaces `version` with it.
    pub(super) async fn write_set(
        &self,
        version: Option<&Version>,
        record: &LockRecord,
    ) -> Result<Version, StoreError> {
        match version {
            None => self.store.create(record).await,
            Some(v) => self.store.replace(v, record).await,
        }
    }

    /// The grant's one conditional write: `entry` joins the set's holders, its fence
    /// the set's last (rule 3); rule 4 for a lost reply. `None`: lost a race (re-read
    /// and decide again).
    pub(super) async fn write_grant(
        &self,
        st: &mut SetContender,
        (version, unknown): Replacing<'_>,
        mut set: HolderSet,
        entry: SetEntry,
        lock_delay: Duration,
    ) -> Result<Option<Lease>, LockError> {
        set.holders.push(entry.clone());
        set.last_fence = entry.fence;
        let record = record_of(set, unknown);
        let sent = Instant::now();
        match self.write_set(version, &record).await {
            Ok(version) => {
                st.pending = None;
                Ok(Some(
                    self.permit_lease(&entry, &record, version, sent, lock_delay),
                ))
            }
            Err(StoreError::Conflict { .. }) => {
                lost_a_race();
                st.pending = Some((entry, sent));
                Ok(None)
            }
            Err(StoreError::Indeterminate(cause)) => {
                st.pending = Some((entry, sent));
                let stored = self.read().await?;
                match self
                    .adopt_pending_permit(st, stored.as_ref(), lock_delay)
                    .await?
                {
                    Some(lease) => Ok(Some(lease)),
                    None => Err(self.unavailable(format!("acquire outcome unknown: {cause}"))),
                }
            }
            Err(e) => Err(self.store_error(e)),
        }
    }

    fn permit_lease(
        &self,
        entry: &SetEntry,
        record: &LockRecord,
        version: Version,
        sent: Instant,
        lock_delay: Duration,
    ) -> Lease {
        let set = record.set.clone().unwrap_or_default();
        // Rule 8: the entry's lease carries the lock-delay; our deadline does not.
        let holder_lease = entry.lease().saturating_sub(lock_delay);
        let deadline = HolderDeadline::after_write(sent, holder_lease, &self.margins);
        Lease::new(entry_view(entry, &set, &record.unknown), version, deadline)
            .with_lock_delay(lock_delay)
    }

    /// Rule 4 across attempts: an acquisition whose reply was lost, found in the set.
    async fn adopt_pending_permit(
        &self,
        st: &mut SetContender,
        stored: Option<&Stored>,
        lock_delay: Duration,
    ) -> Result<Option<Lease>, LockError> {
        let Some((pending, sent)) = &st.pending else {
            return Ok(None);
        };
        let Some(Stored {
            record: Ok(record),
            version,
        }) = stored
        else {
            return Ok(None);
        };
        let Some(entry) = record.set.as_ref().and_then(|s| s.entry(&pending.nonce)) else {
            return Ok(None);
        };
        let same_write = entry.revision == pending.revision;
        let mut lease = self.permit_lease(entry, record, version.clone(), *sent, lock_delay);
        st.pending = None;
        if !same_write || !lease.is_valid() {
            // Not provably the write we sent then: confirm with a renewal.
            lease.deadline = HolderDeadline::expired();
            self.renew_permit(&mut lease).await?;
        }
        Ok(Some(lease))
    }

    /// Renews our entry: one conditional write when the set has not changed since the
    /// lease's version; otherwise retry from the set that won (returned with the
    /// conflict, or read) within the holder deadline.
    pub(super) async fn renew_permit(&self, lease: &mut Lease) -> Result<(), LockError> {
        let mut base = lease.record.set.clone().unwrap_or_default();
        let mut version = lease.version.clone();
        let mut ours = lease.record.revision.clone();
        let mut unknown = lease.record.unknown.clone();
        let mut losses = 0;
        loop {
            let Some(entry) = base
                .holders
                .iter()
                .find(|h| h.nonce == lease.record.nonce)
                .cloned()
            else {
                return Err(self.lost(LostReason::EntryGone));
            };
            if entry.revision != ours {
                self.count_landed_renewal(lease, &entry);
            }
            let renewed = entry.renewed();
            let mut set = base.clone();
            for h in set.holders.iter_mut().filter(|h| h.nonce == renewed.nonce) {
                *h = renewed.clone();
            }
            let record = record_of(set.clone(), &unknown);
            let sent = crate::admission::send_time();
            let mut returned = None;
            match self.store.replace(&version, &record).await {
                Ok(v) => {
                    let view = entry_view(&renewed, &set, &unknown);
                    lease.confirm(view, v, sent, &self.margins);
                    return Ok(());
                }
                Err(StoreError::Conflict { current }) => {
                    lost_a_race();
                    if let Some(current) = current.filter(|c| c.version != version) {
                        let seen = self.set_of(Some(*current))?;
                        start_next_renewal_from(lease, &seen);
                        returned = Some(seen);
                    }
                }
                Err(StoreError::Indeterminate(cause)) => {
                    lease.unconfirmed =
                        Some(Box::new((entry_view(&renewed, &set, &unknown), sent)));
                    let (s, v, u) = self.read_set().await?;
                    if s.entry(&renewed.nonce)
                        .is_some_and(|e| e.revision == renewed.revision)
                    {
                        lease.confirm(entry_view(&renewed, &s, &u), v, sent, &self.margins);
                        return Ok(());
                    }
                    if v == version {
                        return Err(self.unavailable(format!("renewal outcome unknown: {cause}")));
                    }
                }
                Err(e) => return Err(self.store_error(e)),
            }
            // Someone else wrote the set in between: read it and try again, as long as
            // we may still claim our permit.
            if !lease.is_valid() {
                return Err(self.unavailable("renewal kept losing races past the holder deadline"));
            }
            // The store returned the set that won (DynamoDB): try again from it at
            // once, as a release does, without a read or a pause.
            let (s, v, u) = match returned {
                Some(seen) => seen,
                None => {
                    losses += 1;
                    back_off(losses).await;
                    let seen = self.read_set().await?;
                    start_next_renewal_from(lease, &seen);
                    seen
                }
            };
            ours = entry.revision.clone();
            base = s;
            version = v;
            unknown = u;
        }
    }

    /// Our entry moved on to `entry` by an earlier renewal of ours whose reply was lost:
    /// its send time counts for the deadline only if it is the one we remembered.
    fn count_landed_renewal(&self, lease: &mut Lease, entry: &SetEntry) {
        if let Some((pending, sent)) = lease.unconfirmed.take().map(|pending| *pending)
            && pending.revision == entry.revision
        {
            let holder_lease = entry.lease().saturating_sub(lease.lock_delay);
            lease.deadline = HolderDeadline::after_write(sent, holder_lease, &self.margins);
        }
    }

    /// Reads the set for a holder (with the record's fields this build does not know);
    /// the key no longer being a set means the permit is lost.
    async fn read_set(&self) -> Result<(HolderSet, Version, UnknownFields), LockError> {
        let found = self.read().await?;
        self.set_of(found)
    }

    /// The holder set in `found` (a read, or the record a conflict returned), or why
    /// there is none.
    fn set_of(
        &self,
        found: Option<Stored>,
    ) -> Result<(HolderSet, Version, UnknownFields), LockError> {
        match found {
            Some(Stored {
                record:
                    Ok(LockRecord {
                        set: Some(set),
                        unknown,
                        ..
                    }),
                version,
            }) => Ok((set, version, unknown)),
            None => Err(self.lost(LostReason::Deleted)),
            Some(Stored {
                record: Err(found), ..
            }) => Err(self.lost(LostReason::Foreign(found))),
            Some(Stored { record: Ok(r), .. }) if r.state == LockState::Held => {
                Err(self.lost(LostReason::TakenOver(super::error::HeldBy::from_record(&r))))
            }
            Some(_) => Err(self.lost(LostReason::ReleasedElsewhere)),
        }
    }

    fn lost(&self, reason: LostReason) -> LockError {
        LockError::Lost {
            url: self.url(),
            reason,
        }
    }

    /// Removes our entry, retrying when another holder wrote the set first.
    ///
    /// Rule 4 for a release: a removal leaves nothing of ours to recognize it by, so a
    /// set found without our entry after we wrote is the release done, not "not held",
    /// when our removal may be what removed it: its reply was lost, or our lease is
    /// still valid — then no contender may have expired the entry yet (rule 1), and a
    /// conflict was our own attempt retried by the store's client after it landed
    /// unseen (or a deliberate removal: a forced takeover, a release by our nonce).
    /// Either way what a release promises holds: no entry of ours on the key.
    pub(super) async fn release_permit(&self, lease: &Lease) -> Result<(), LockError> {
        let mut base = lease.record.set.clone().unwrap_or_default();
        let mut version = lease.version.clone();
        let mut unknown = lease.record.unknown.clone();
        let give_up = Instant::now() + RELEASE_PATIENCE;
        let mut losses = 0;
        let mut reply_lost = false;
        let gone = |reply_lost: bool| {
            if reply_lost || lease.is_valid() {
                Ok(())
            } else {
                Err(LockError::NotHeld { url: self.url() })
            }
        };
        while Instant::now() < give_up {
            if base.entry(&lease.record.nonce).is_none() {
                return gone(reply_lost);
            }
            let mut set = base.clone();
            set.holders.retain(|h| h.nonce != lease.record.nonce);
            if let Some(queue) = set.queue.as_mut() {
                // For the queue's expected start (informational: wall clock).
                let now = SystemTime::now();
                let held = now
                    .duration_since(lease.record.acquired_at)
                    .unwrap_or_default();
                queue.record_hold(held, now);
            }
            let empty = set.holders.is_empty()
                && set.waiting_writer.is_none()
                && set.queue.as_ref().is_none_or(|q| q.waiters.is_empty());
            match self
                .store
                .replace(&version, &record_of(set, &unknown))
                .await
            {
                Ok(v) => {
                    if empty && self.delete_on_release {
                        // s3lockCompatible: no object while nobody holds the key. A
                        // failed delete leaves a released record, still free.
                        let _ = self.store.delete(&v).await;
                    }
                    return Ok(());
                }
                Err(StoreError::Conflict {
                    current: Some(current),
                }) if current.version != version => {
                    // The store returned the set that won (DynamoDB): try again from it
                    // at once, without a read or a pause. A release only makes room,
                    // and the contenders that keep the set changing (acquisitions,
                    // registrations) are what it would otherwise lose to for as long
                    // as each read and pause leaves them a window (a 12-contender
                    // semaphore on a loaded machine once lost for 30 s).
                    lost_a_race();
                    (base, version, unknown) = match self.set_of(Some(*current)) {
                        Ok(found) => found,
                        Err(LockError::Lost { .. }) => return gone(reply_lost),
                        Err(e) => return Err(e),
                    };
                    continue;
                }
                Err(StoreError::Conflict { .. }) => lost_a_race(),
                Err(StoreError::Indeterminate(_)) => reply_lost = true,
                Err(e) => return Err(self.store_error(e)),
            }
            // Another write (or ours, unseen) came first: look again.
            losses += 1;
            back_off(losses).await;
            let (s, v, u) = match self.read_set().await {
                Ok(found) => found,
                // No set any more (released, deleted, or taken whole): none of ours either.
                Err(LockError::Lost { .. }) => return gone(reply_lost),
                Err(e) => return Err(e),
            };
            base = s;
            version = v;
            unknown = u;
        }
        Err(self.unavailable("the holder set kept changing while releasing"))
    }

    /// Re-attaches to a permit by its nonce.
    pub(super) fn resume_permit(
        &self,
        holder: &str,
        nonce: &str,
        stored: &Stored,
    ) -> Option<Lease> {
        let Ok(record) = &stored.record else {
            return None;
        };
        let set = record.set.as_ref()?;
        let entry = set.entry(nonce).filter(|e| e.holder == holder)?;
        Some(Lease::new(
            entry_view(entry, set, &record.unknown),
            stored.version.clone(),
            HolderDeadline::expired(),
        ))
    }

    /// Gives up waiting: takes our waiting-writer registration back out of the set.
    pub(super) async fn abandon_permit(&self) {
        let mut st = self.state.lock().await;
        st.set.waiting_written = None;
        st.set.ticket = None;
        let Some(waiting) = st.set.waiting.take() else {
            return;
        };
        for _ in 0..SET_RETRIES {
            let Ok(Some(Stored {
                record: Ok(record),
                version,
            })) = self.read().await
            else {
                return;
            };
            let Some(mut set) = record.set.clone() else {
                return;
            };
            let ours = |w: &SetEntry| w.nonce == waiting.nonce;
            if let Some(queue) = set.queue.as_mut().filter(|q| q.waiters.iter().any(ours)) {
                queue.waiters.retain(|w| !ours(w));
            } else if set.waiting_writer.as_ref().is_some_and(ours) {
                set.waiting_writer = None;
            } else {
                return;
            }
            match self
                .store
                .replace(&version, &record_of(set, &record.unknown))
                .await
            {
                Err(StoreError::Conflict { .. }) => continue,
                _ => return,
            }
        }
    }
}

/// The rules of docs/design.md §3, per holder entry (§6.2), on the in-memory store.
/// Real time with short leases and one-sided timing assertions, as in `cas`'s tests.
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::{Instant, sleep};

    use super::*;
    use crate::backend::LockBackend;
    use crate::cas::tests::{DELAY, LEASE, MARGINS, TAKEOVER_AFTER, acquired};
    use crate::memory::{Fault, MemoryStore};
    use crate::permits::Permits;

    fn contender(store: &MemoryStore) -> CasLock<MemoryStore> {
        CasLock::new(store.clone()).with_margins(MARGINS)
    }

    fn req(holder: &str, permits: u32, mode: Mode) -> AcquireRequest {
        AcquireRequest {
            permits: Permits {
                total: permits,
                mode,
            },
            ..AcquireRequest::new(holder, LEASE)
        }
    }

    fn shared(holder: &str) -> AcquireRequest {
        req(holder, 3, Mode::Shared)
    }

    async fn busy(lock: &CasLock<MemoryStore>, req: &AcquireRequest) -> LockRecord {
        match lock.try_acquire(req).await {
            Ok(Attempt::Busy { holder, .. }) => holder,
            other => panic!("{} should have been refused: {other:?}", req.holder),
        }
    }

    fn holders(store: &MemoryStore) -> Vec<String> {
        let set = store.record().set.expect("a holder set");
        set.holders.iter().map(|h| h.holder.clone()).collect()
    }

    #[tokio::test]
    async fn rule3_every_grant_takes_the_next_fence_and_permits_are_never_exceeded() {
        let store = MemoryStore::new("mem://locks/sem");
        let locks: Vec<_> = (0..4).map(|_| contender(&store)).collect();
        let a = acquired(&locks[0], &shared("a")).await;
        let b = acquired(&locks[1], &shared("b")).await;
        let c = acquired(&locks[2], &shared("c")).await;
        assert_eq!(
            [a.fence(), b.fence(), c.fence()],
            [FenceToken(1), FenceToken(2), FenceToken(3)]
        );
        let seen = busy(&locks[3], &shared("d")).await;
        assert_eq!(seen.set.as_ref().map(HolderSet::in_use), Some(3));
        assert_eq!(seen.holder, "a, b and 1 more");
        locks[1].release(&b).await.unwrap();
        let d = acquired(&locks[3], &shared("d")).await;
        // b's fence (2) is gone from the set; the grant still takes the key's next.
        assert_eq!(d.fence(), FenceToken(4));
        assert_eq!(holders(&store), ["a", "c", "d"]);
        assert_eq!(store.record().fence, FenceToken(4));
        assert_eq!(store.record().state, LockState::Held);
    }

    #[tokio::test]
    async fn rule8_per_entry_each_permit_carries_the_delay_and_its_holder_deadline_does_not() {
        let store = MemoryStore::new("mem://locks/sem");
        let (la, lb, lc) = (contender(&store), contender(&store), contender(&store));
        let delayed = |holder| AcquireRequest {
            lock_delay: DELAY,
            ..req(holder, 2, Mode::Shared)
        };
        let before = Instant::now();
        let _dead = acquired(&la, &delayed("a")).await;
        let after = Instant::now();
        let mut b = acquired(&lb, &delayed("b")).await;
        let entry_leases = |store: &MemoryStore| -> Vec<Duration> {
            let set = store.record().set.expect("a holder set");
            set.holders.iter().map(SetEntry::lease).collect()
        };
        assert_eq!(entry_leases(&store), vec![LEASE + DELAY; 2]);
        assert_eq!(b.holder_lease(), LEASE);
        lb.renew(&mut b).await.unwrap();
        assert_eq!(
            entry_leases(&store),
            vec![LEASE + DELAY; 2],
            "a renewal keeps it"
        );
        let validity = MARGINS.holder_validity(LEASE);
        assert!(b.deadline.instant() <= Instant::now() + validity);
        // a's entry is taken only after its lease, delay and grace have been observed.
        let c = loop {
            lb.renew(&mut b).await.unwrap();
            match lc.try_acquire(&req("c", 2, Mode::Shared)).await.unwrap() {
                Attempt::Acquired(lease) => break lease,
                Attempt::Busy { .. } => {}
            }
            assert!(before.elapsed() < TAKEOVER_AFTER * 20, "never reclaimed");
            sleep(Duration::from_millis(20)).await;
        };
        assert!(
            after.elapsed() >= TAKEOVER_AFTER + DELAY,
            "a's permit was taken before its lease, delay and grace"
        );
        assert_eq!(c.fence(), FenceToken(3));
    }

    #[tokio::test]
    async fn rule1_per_entry_a_dead_holders_permit_is_reclaimed_only_after_its_observed_lease() {
        let store = MemoryStore::new("mem://locks/sem");
        let (la, lb, lc) = (contender(&store), contender(&store), contender(&store));
        let _dead = acquired(&la, &req("a", 2, Mode::Shared)).await;
        let mut b = acquired(&lb, &req("b", 2, Mode::Shared)).await;
        let since = Instant::now();
        let c = loop {
            // b keeps renewing throughout: every renewal changes the record's version,
            // which must not make a's entry (or b's) look younger or older.
            lb.renew(&mut b).await.unwrap();
            match lc.try_acquire(&req("c", 2, Mode::Shared)).await.unwrap() {
                Attempt::Acquired(lease) => break lease,
                Attempt::Busy { .. } => {}
            }
            assert!(since.elapsed() < TAKEOVER_AFTER * 20, "never reclaimed");
            sleep(Duration::from_millis(20)).await;
        };
        let observed_at_most = since.elapsed();
        assert!(
            observed_at_most >= TAKEOVER_AFTER,
            "reclaimed after at most {observed_at_most:?}; rule 1 needs {TAKEOVER_AFTER:?}"
        );
        assert_eq!(holders(&store), ["b", "c"], "only the dead holder's permit");
        lb.renew(&mut b).await.expect("b still holds its permit");
        assert_eq!(c.fence(), FenceToken(3));
    }

    #[tokio::test]
    async fn renewals_of_other_holders_do_not_make_an_entry_look_expired() {
        let store = MemoryStore::new("mem://locks/sem");
        let (la, lb, lc) = (contender(&store), contender(&store), contender(&store));
        let mut a = acquired(&la, &req("a", 2, Mode::Shared)).await;
        let mut b = acquired(&lb, &req("b", 2, Mode::Shared)).await;
        let until = Instant::now() + TAKEOVER_AFTER * 3;
        while Instant::now() < until {
            la.renew(&mut a).await.unwrap();
            lb.renew(&mut b).await.unwrap();
            busy(&lc, &req("c", 2, Mode::Shared)).await;
            sleep(Duration::from_millis(30)).await;
        }
        assert_eq!(holders(&store), ["a", "b"]);
    }

    /// S3 answers a failed condition without the record: the renewal reads it.
    #[tokio::test]
    async fn a_renewal_that_loses_a_race_re_reads_and_retries() {
        let store = MemoryStore::encoded("mem://locks/sem");
        let (la, lb) = (contender(&store), contender(&store));
        let mut a = acquired(&la, &shared("a")).await;
        let mut b = acquired(&lb, &shared("b")).await;
        // a's lease still names the version before b's grant: its first write conflicts.
        la.renew(&mut a).await.unwrap();
        lb.renew(&mut b).await.unwrap();
        let (reads, writes) = store.requests();
        la.renew(&mut a).await.unwrap();
        assert_eq!(
            store.requests(),
            (reads + 1, writes + 2),
            "a lost write, a read, a write"
        );
        let set = store.record().set.unwrap();
        assert_eq!(set.entry(a.nonce()).unwrap().revision, a.record.revision);
        assert_eq!(set.entry(b.nonce()).unwrap().revision, b.record.revision);
        assert_eq!(store.stored().unwrap().version, a.version);
    }

    /// DynamoDB returns the set that won with its conflict: the renewal writes again
    /// from it, without a read.
    #[tokio::test]
    async fn a_renewal_that_loses_a_race_retries_from_the_set_the_conflict_returned() {
        let store = MemoryStore::new("mem://locks/sem");
        let (la, lb) = (contender(&store), contender(&store));
        let mut a = acquired(&la, &shared("a")).await;
        // b's grant comes after a's last write: a's next write conflicts.
        let _b = acquired(&lb, &shared("b")).await;
        let (reads, writes) = store.requests();
        la.renew(&mut a).await.expect("renewed at the second write");
        assert_eq!(store.requests(), (reads, writes + 2), "two writes, no read");
        assert_eq!(store.stored().unwrap().version, a.version);
    }

    /// A renewal abandoned at its request timeout after it lost a race leaves the lease
    /// at the set it found, so the next renewal is one write. Otherwise every renewal
    /// would start one write behind (a lost write, then another): behind a slow store,
    /// with waiters refreshing the record, a queued holder once missed every renewal's
    /// timeout until a waiter took its expired entry (the interop suite).
    #[tokio::test]
    async fn a_renewal_abandoned_after_a_lost_race_starts_the_next_from_the_set_it_found() {
        // The set found in the conflict's answer (DynamoDB) or by a read (S3).
        for store in [
            MemoryStore::new("mem://locks/sem"),
            MemoryStore::encoded("mem://locks/sem"),
        ] {
            let (la, lb) = (contender(&store), contender(&store));
            let mut a = acquired(&la, &shared("a")).await;
            let _b = acquired(&lb, &shared("b")).await;
            // a's first write conflicts; its second hangs past the renewal's timeout.
            store
                .next_write(Fault::Pass)
                .next_write(Fault::Delay(Duration::from_secs(60)));
            let abandoned =
                tokio::time::timeout(Duration::from_millis(100), la.renew(&mut a)).await;
            assert!(abandoned.is_err(), "abandoned while its second write hangs");
            assert_eq!(
                a.version,
                store.stored().unwrap().version,
                "the version it found"
            );
            let (reads, writes) = store.requests();
            la.renew(&mut a).await.expect("renewed");
            assert_eq!(store.requests(), (reads, writes + 1), "one write");
            assert_eq!(holders(&store), ["a", "b"]);
        }
    }

    /// A write of the set as it is without `lease`'s entry, landing just before the next
    /// write: a removal of that entry the holder did not see.
    fn removed_first(store: &MemoryStore, lease: &Lease) -> Fault {
        let mut removed = store.record();
        if let Some(set) = removed.set.as_mut() {
            set.holders.retain(|h| h.nonce != lease.record.nonce);
        }
        Fault::ConcurrentWrite(Box::new(Ok(removed)))
    }

    /// A removal that landed but whose reply was lost (or whose retried attempt met
    /// its own first one as a conflict) leaves no entry of ours: released, not "not
    /// held" (an interop run under load once failed on exactly that).
    #[tokio::test]
    async fn rule4_a_release_whose_reply_was_lost_after_it_landed_is_done() {
        let store = MemoryStore::new("mem://locks/sem");
        let (la, lb) = (contender(&store), contender(&store));
        let a = acquired(&la, &shared("a")).await;
        let _b = acquired(&lb, &shared("b")).await;
        store.next_write(Fault::IndeterminateApplied);
        la.release(&a).await.expect("released: the removal landed");
        assert_eq!(holders(&store), ["b"]);
        // A conflict, then no entry of ours: to the engine the same as the store's client
        // retrying a removal whose first attempt landed unseen. Released too.
        let a = acquired(&la, &shared("a")).await;
        store.next_write(removed_first(&store, &a));
        la.release(&a)
            .await
            .expect("released: no entry of ours is left");
        assert_eq!(holders(&store), ["b"]);
        // The same once the lease has lapsed: a contender may have expired the entry,
        // so the release says it was not held.
        let mut lapsed = acquired(&la, &shared("a")).await;
        lapsed.deadline = HolderDeadline::expired();
        store.next_write(removed_first(&store, &lapsed));
        assert!(matches!(
            la.release(&lapsed).await,
            Err(LockError::NotHeld { .. })
        ));
    }

    /// A release that loses a race to another holder's write tries again from the set
    /// the store returned with its conflict (DynamoDB's `ALL_OLD`), with no read and no
    /// pause between: under load the read and the pause were the window the
    /// contenders' writes kept landing in.
    #[tokio::test]
    async fn a_release_that_loses_a_race_retries_from_the_set_the_conflict_returned() {
        let store = MemoryStore::new("mem://locks/sem");
        let (la, lb) = (contender(&store), contender(&store));
        let a = acquired(&la, &shared("a")).await;
        let _b = acquired(&lb, &shared("b")).await;
        // Another holder's write lands first: the set as it is, written again.
        store.next_write(Fault::ConcurrentWrite(Box::new(Ok(store.record()))));
        let (reads, writes) = store.requests();
        la.release(&a).await.expect("released at the second write");
        assert_eq!(holders(&store), ["b"]);
        assert_eq!(store.requests(), (reads, writes + 2), "two writes, no read");
    }

    #[tokio::test]
    async fn rule4_a_lost_acquisition_reply_is_resolved_by_the_nonce_in_the_set() {
        let store = MemoryStore::new("mem://locks/sem");
        let la = contender(&store);
        store.next_write(Fault::IndeterminateApplied);
        store.next_read(Fault::Pass).next_read(Fault::Unavailable);
        assert!(
            la.try_acquire(&shared("a"))
                .await
                .unwrap_err()
                .is_transient()
        );
        assert_eq!(holders(&store), ["a"], "the write landed");
        let lease = acquired(&la, &shared("a")).await;
        assert_eq!(holders(&store), ["a"], "adopted, not a second permit");
        assert_eq!(lease.fence(), FenceToken(1));
        assert!(lease.is_valid());
    }

    #[tokio::test]
    async fn a_waiting_writer_blocks_new_readers_until_it_has_had_its_turn() {
        let store = MemoryStore::new("mem://locks/rw");
        let (lr1, lw, lr2) = (contender(&store), contender(&store), contender(&store));
        let r1 = acquired(&lr1, &shared("r1")).await;
        busy(&lw, &req("w", 3, Mode::Exclusive)).await;
        assert_eq!(
            store.record().set.unwrap().waiting_writer.map(|w| w.holder),
            Some("w".to_string())
        );
        busy(&lr2, &shared("r2")).await;
        lr1.release(&r1).await.unwrap();
        let w = acquired(&lw, &req("w", 3, Mode::Exclusive)).await;
        assert_eq!(store.record().set.unwrap().waiting_writer, None);
        assert_eq!(store.record().set.unwrap().in_use(), 3);
        busy(&lr2, &shared("r2")).await;
        lw.release(&w).await.unwrap();
        let r2 = acquired(&lr2, &shared("r2")).await;
        assert!(r2.fence() > w.fence() && w.fence() > r1.fence());
    }

    #[tokio::test]
    async fn a_dead_waiting_writer_stops_blocking_readers_after_its_observed_lease() {
        let store = MemoryStore::new("mem://locks/rw");
        let (lr1, lw, lr2) = (contender(&store), contender(&store), contender(&store));
        let _r1 = acquired(&lr1, &shared("r1")).await;
        busy(&lw, &req("w", 3, Mode::Exclusive)).await;
        let since = Instant::now();
        loop {
            match lr2.try_acquire(&shared("r2")).await.unwrap() {
                Attempt::Acquired(_) => break,
                Attempt::Busy { .. } => sleep(Duration::from_millis(20)).await,
            }
            assert!(since.elapsed() < TAKEOVER_AFTER * 20, "never admitted");
        }
        assert!(since.elapsed() >= TAKEOVER_AFTER);
    }

    #[tokio::test]
    async fn abandoning_takes_the_waiting_writer_registration_back() {
        let store = MemoryStore::new("mem://locks/rw");
        let (lr1, lw) = (contender(&store), contender(&store));
        let _r1 = acquired(&lr1, &shared("r1")).await;
        busy(&lw, &req("w", 3, Mode::Exclusive)).await;
        lw.abandon().await;
        assert_eq!(store.record().set.unwrap().waiting_writer, None);
        acquired(&contender(&store), &shared("r2")).await;
    }

    #[tokio::test]
    async fn every_lock_on_a_key_must_name_the_same_permits() {
        let store = MemoryStore::new("mem://locks/sem");
        let held = acquired(&contender(&store), &shared("a")).await;
        let disagree = |r: Result<Attempt, LockError>| match r {
            Err(LockError::PermitsDisagree {
                stored, requested, ..
            }) => (stored, requested),
            other => panic!("expected PermitsDisagree, got {other:?}"),
        };
        let two = contender(&store)
            .try_acquire(&req("b", 2, Mode::Shared))
            .await;
        assert_eq!(disagree(two), (3, 2));
        let mutex = contender(&store)
            .try_acquire(&AcquireRequest::new("m", LEASE))
            .await;
        let err = mutex.unwrap_err();
        assert!(
            err.to_string()
                .contains("held with 3 permits but this lock asks for 1"),
            "{err}"
        );
        contender(&store).release(&held).await.unwrap();
        // Nobody holds it: a mutex takes it, continuing the fences; a semaphore is refused.
        let m = acquired(&contender(&store), &AcquireRequest::new("m", LEASE)).await;
        assert_eq!(m.fence(), FenceToken(2));
        assert!(
            m.record.set.is_none(),
            "a mutex keeps the plain record format"
        );
        let sem = contender(&store).try_acquire(&shared("b")).await;
        assert_eq!(disagree(sem), (1, 3));
    }

    /// What s3lock, dynamolock or client-go leave: a plain held record, marked as
    /// another tool's by the store that read it.
    fn another_tools_lock(state: LockState) -> LockRecord {
        LockRecord {
            nonce: format!("{}rvn:1", crate::ANOTHER_TOOL_NONCE_PREFIX),
            state,
            fence: FenceToken(6),
            ..LockRecord::new_acquisition("dynamolock-owner", FenceToken(6), LEASE, None)
        }
    }

    #[tokio::test]
    async fn a_key_another_tool_holds_is_held_with_permits_unknown_and_never_rewritten() {
        let store = MemoryStore::new("mem://locks/sem");
        store.put(Ok(another_tools_lock(LockState::Held)));
        let before = store.stored();
        let lock = contender(&store);
        // Not a disagreement: busy, naming the other tool's holder, for every mode.
        for r in [shared("a"), req("w", 3, Mode::Exclusive)] {
            let seen = busy(&lock, &r).await;
            assert_eq!(seen.holder, "dynamolock-owner");
            assert!(seen.by_another_tool());
        }
        assert_eq!(
            store.stored(),
            before,
            "another tool's record was rewritten"
        );
        // Its release frees the key; the first lockwarden holder names the permits and
        // continues the fences.
        store.put(Ok(another_tools_lock(LockState::Released)));
        let a = acquired(&lock, &shared("a")).await;
        assert_eq!(a.fence(), FenceToken(7));
        assert_eq!(store.record().set.unwrap().permits, 3);
    }

    #[tokio::test]
    async fn another_tools_lock_not_renewed_is_taken_after_its_observed_lease() {
        let store = MemoryStore::new("mem://locks/sem");
        store.put(Ok(another_tools_lock(LockState::Held)));
        let lock = contender(&store);
        let since = Instant::now();
        let lease = loop {
            match lock.try_acquire(&shared("a")).await.unwrap() {
                Attempt::Acquired(lease) => break lease,
                Attempt::Busy { .. } => sleep(Duration::from_millis(20)).await,
            }
            assert!(since.elapsed() < TAKEOVER_AFTER * 20, "never taken");
        };
        assert!(since.elapsed() >= TAKEOVER_AFTER);
        assert_eq!(lease.fence(), FenceToken(7));
    }

    #[tokio::test]
    async fn rule5_reclaim_takes_back_the_same_holders_permit_in_one_write() {
        let store = MemoryStore::new("mem://locks/sem");
        let a = acquired(&contender(&store), &shared("a")).await;
        acquired(&contender(&store), &shared("b")).await;
        acquired(&contender(&store), &shared("c")).await;
        // Full: a restarted "a" waits without reclaim, and "d" waits even with it.
        busy(&contender(&store), &shared("a")).await;
        let reclaim = |holder: &str| AcquireRequest {
            reclaim: true,
            ..shared(holder)
        };
        busy(&contender(&store), &reclaim("d")).await;
        let again = acquired(&contender(&store), &reclaim("a")).await;
        assert_eq!(again.fence(), FenceToken(4));
        let from = again.forced_from.expect("reported");
        assert_eq!((from.holder.as_str(), from.fence), ("a", a.fence()));
        assert_eq!(holders(&store), ["b", "c", "a"]);
        let set = store.record().set.unwrap();
        assert!(
            set.entry(a.nonce()).is_none(),
            "the earlier run's entry is gone"
        );
    }

    #[tokio::test]
    async fn a_released_mutex_key_continues_its_fences_as_a_semaphore() {
        let store = MemoryStore::new("mem://locks/sem");
        let lock = contender(&store);
        let m = acquired(&lock, &AcquireRequest::new("m", LEASE)).await;
        lock.release(&m).await.unwrap();
        let s = acquired(&lock, &shared("s")).await;
        assert_eq!(s.fence(), FenceToken(2));
    }

    #[tokio::test]
    async fn resume_finds_a_permit_by_its_nonce() {
        let store = MemoryStore::new("mem://locks/sem");
        let a = acquired(&contender(&store), &shared("a")).await;
        let mut resumed = contender(&store).resume("a", a.nonce()).await.unwrap();
        assert_eq!(resumed.fence(), a.fence());
        assert!(!resumed.is_valid(), "valid only after its first renewal");
        contender(&store).renew(&mut resumed).await.unwrap();
        assert!(resumed.is_valid());
        contender(&store).release(&resumed).await.unwrap();
        assert!(store.record().set.unwrap().holders.is_empty());
        assert_eq!(store.record().state, LockState::Released);
        // Released again while the lease is still valid: nothing of ours is left, as
        // promised (rule 4 for a release: `release_permit`).
        contender(&store).release(&resumed).await.unwrap();
    }
}

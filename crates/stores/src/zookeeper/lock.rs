//! [`ZkLock`]: one contender for one lock path, and the [`LockBackend`] it implements.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::Mutex;
use tokio::time::Instant;
use zookeeper_client::{Error as ZkError, Stat};

use super::cleanup::{Cleanup, spawn_cleanup};
use super::kafka_kit;
use super::queue::{Child, Contender, Entry, QUEUE_RETRIES, name_of, version_of};
use super::semaphore::{self, Member, Verdict};
use super::session::{Generation, ZkSession};
use super::{definite, permanent, session_ended};
use lockwarden_core::error::{Cause, While};
use lockwarden_core::{
    AcquireRequest, Attempt, ForeignRecord, HeldBy, HolderDeadline, Lease, LockBackend, LockError,
    LockRecord, LockState, LostReason, Mode, Queueing, SafetyMargins, Stored, UnknownFields,
    Version,
};
use lockwarden_core::{CompletedRun, RunMemory};

/// One lock path in ZooKeeper, as seen by one contender: each `ZkLock` has at most one
/// znode in the queue. Use one `ZkLock` per would-be holder.
pub struct ZkLock {
    pub(super) session: Arc<ZkSession>,
    /// Absolute path of the lock's parent znode (chroot included).
    pub(super) dir: String,
    pub(super) url: String,
    pub(super) margins: SafetyMargins,
    pub(super) state: Mutex<Contender>,
}

/// How a queue entry another ZooKeeper client wrote (kafka-kit's, Curator's) is named
/// as the holder: lockwarden never takes such an entry over; it waits until the entry
/// is deleted.
pub const FOREIGN_QUEUE_ENTRY: &str = "foreign queue entry ";

impl ZkLock {
    /// A contender for the lock whose queue lives under `path` (absolute, chroot
    /// included) on `session`'s ensemble.
    pub fn new(session: Arc<ZkSession>, path: &str) -> Result<ZkLock, LockError> {
        let url = format!("zk://{}{path}", session.servers);
        super::path_name(path).map_err(|e| LockError::Backend {
            url: url.clone(),
            message: format!("invalid lock path: {e}"),
        })?;
        Ok(ZkLock {
            session,
            dir: path.to_string(),
            url,
            margins: SafetyMargins::default(),
            state: Mutex::new(Contender::default()),
        })
    }

    pub fn with_margins(mut self, margins: SafetyMargins) -> Self {
        self.margins = margins;
        self
    }

    /// The lock's parent znode (chroot included).
    pub fn path(&self) -> &str {
        &self.dir
    }

    pub fn session(&self) -> &Arc<ZkSession> {
        &self.session
    }

    /// The name of this contender's znode in the queue, if it has one.
    pub async fn queue_entry(&self) -> Option<String> {
        self.state
            .lock()
            .await
            .entry
            .as_ref()
            .map(|e| e.name.clone())
    }

    pub(super) fn node(&self, name: &str) -> String {
        format!("{}/{name}", self.dir)
    }

    pub(super) fn error(&self, op: &str, e: ZkError) -> LockError {
        if permanent(&e) {
            LockError::Backend {
                url: self.url.clone(),
                message: format!("{op}: {e}"),
            }
        } else {
            self.unavailable(While::new(op, e))
        }
    }

    pub(super) fn unavailable(&self, cause: impl Into<Cause>) -> LockError {
        LockError::Unavailable {
            url: self.url.clone(),
            cause: cause.into(),
        }
    }

    pub(super) fn lost(&self, reason: LostReason) -> LockError {
        LockError::Lost {
            url: self.url.clone(),
            reason,
        }
    }

    /// Bounds one request: the client queues requests while it reconnects, and an
    /// attempt must not hang past the session's own lifetime.
    /// A disconnected session is jeopardy: the server may still count it alive, or
    /// may expire it and delete our entry at `last contact + timeout`, which wakes
    /// every waiter at once (no lock-delay on ZooKeeper). So the holder stops claiming
    /// now rather than at its deadline (docs/design.md §3, ZooKeeper); a renewal after
    /// the reconnect restores the deadline from its own send.
    fn end_claim_while_disconnected(
        &self,
        lease: &mut Lease,
        generation: &Generation,
    ) -> LockError {
        lease.deadline = HolderDeadline::expired();
        self.unavailable(format!(
            "ZooKeeper session {:#x} is {}; the lock is not claimed until it reconnects",
            generation.id,
            generation.state()
        ))
    }

    pub(super) async fn bounded<T>(
        generation: &Generation,
        request: impl Future<Output = Result<T, ZkError>>,
    ) -> Result<T, ZkError> {
        let result = tokio::time::timeout(generation.timeout, request)
            .await
            .unwrap_or(Err(ZkError::Timeout));
        if let Err(e) = &result {
            generation.note_error(e);
        }
        result
    }

    /// A queue member's record as stored: ours, with the fence taken from `czxid`, or
    /// a description of whatever else is there.
    pub fn stored(name: &str, data: &[u8], stat: &Stat) -> Stored {
        Stored {
            record: LockRecord::from_json(&kafka_kit::record_part(data))
                .map(|record| semaphore::fenced(record, stat))
                .map_err(|found| {
                    kafka_kit::describe(data, SystemTime::now()).map_or(found, ForeignRecord::new)
                }),
            version: version_of(name, stat),
        }
    }

    /// The holder as a record, also when the holder is not a lockwarden contender
    /// (rule 6: reported, with what was found, never deleted).
    pub fn holder_record(name: &str, stored: Stored, stat: &Stat, lease: Duration) -> LockRecord {
        match stored.record {
            Ok(record) => record,
            Err(found) => LockRecord {
                holder: format!("{FOREIGN_QUEUE_ENTRY}{name}: {found}"),
                nonce: String::new(),
                revision: String::new(),
                fence: Generation::fence_of(stat),
                lease,
                state: LockState::Held,
                data: None,
                acquired_at: wall_clock(stat.ctime),
                renewed_at: wall_clock(stat.mtime),
                set: None,
                history: Vec::new(),
                runs: Default::default(),
                unknown: UnknownFields::new(),
            },
        }
    }
}

impl ZkLock {
    /// Deletes the queue entry that `version` (`<znode name>:<data version>`, as a
    /// lease of this backend carries it) names, conditioned on that data version,
    /// whichever session owns it: how a process that did not acquire the lock (such as
    /// `lockwarden unlock`, while a keeper process holds the session) releases it.
    /// `nonce` tells, when the entry is gone, whether the lock was released or taken
    /// over.
    ///
    /// Errors: `Lost(EntryGone)` when the entry is gone and nobody else holds the lock;
    /// `Lost(TakenOver)` when another acquisition now holds it; `Lost(NotOurs)` when the
    /// entry was rewritten since `version`. A lost reply is resolved by deleting again.
    pub async fn release_entry(&self, version: &Version, nonce: &str) -> Result<(), LockError> {
        let (name, data_version) = version
            .0
            .rsplit_once(':')
            .and_then(|(name, v)| Some((name, v.parse::<i32>().ok()?)))
            .filter(|(name, _)| super::sequence_of(name).is_some())
            .ok_or_else(|| LockError::Backend {
                url: self.url.clone(),
                message: format!(
                    "{:?} is not a ZooKeeper lock version (QUEUE-ENTRY:NUMBER)",
                    version.0
                ),
            })?;
        let generation = self.session.generation(&self.url).await?;
        let path = self.node(name);
        let mut uncertain = false;
        for _ in 0..QUEUE_RETRIES {
            let deleted = Self::bounded(
                &generation,
                generation.client.delete(&path, Some(data_version)),
            )
            .await;
            match deleted {
                Ok(()) => return Ok(()),
                Err(ZkError::NoNode) if uncertain => return Ok(()),
                Err(ZkError::NoNode) => return Err(self.entry_gone(nonce).await),
                Err(ZkError::BadVersion) => return Err(self.lost(LostReason::NotOurs)),
                Err(e) if definite(&e) || session_ended(&e) => {
                    return Err(self.error(&format!("deleting queue entry {name}"), e));
                }
                Err(e) => {
                    tracing::debug!(url = %self.url, error = %e, "queue entry delete outcome unknown; retrying");
                    uncertain = true;
                }
            }
        }
        Err(self.unavailable(format!(
            "deleting queue entry {name}: no answer from ZooKeeper"
        )))
    }

    /// Our entry's turn, judged on the entries ahead of it (as just read): acquired,
    /// busy (remembering what to watch), or refused when a lockwarden entry ahead
    /// names other permits, our entry then leaving the queue.
    async fn take_turn(
        &self,
        st: &mut Contender,
        generation: &Generation,
        ahead: &[Member],
        req: &AcquireRequest,
        sent: Instant,
    ) -> Result<Attempt, LockError> {
        if let Some(stored) = semaphore::disagreement(ahead, req.permits) {
            st.watched.clear();
            if let Some(entry) = st.entry.take() {
                self.leave(entry).await;
            }
            return Err(LockError::PermitsDisagree {
                url: self.url.clone(),
                stored,
                requested: req.permits.total,
            });
        }
        let modes: Vec<Mode> = ahead.iter().map(Member::mode).collect();
        match (semaphore::verdict(&modes, req.permits), st.entry.as_ref()) {
            (_, None) => Err(self.unavailable("our queue entry was forgotten meanwhile; retrying")),
            (Verdict::Granted, Some(entry)) => {
                let lease = self.granted(entry, generation, ahead, req, sent);
                st.watched.clear();
                Ok(Attempt::Acquired(lease))
            }
            (Verdict::Waiting { departures, watch }, Some(_)) => {
                let holder = Self::blocking_holder(generation, ahead, &watch, req);
                st.watched = watch.into_iter().map(|k| ahead[k].name.clone()).collect();
                Ok(Attempt::Busy {
                    holder,
                    retry_in: None,
                    // 0 = the next departure lets us in, as for the mutex.
                    queue_position: Some(u32::try_from(departures - 1).unwrap_or(u32::MAX)),
                })
            }
        }
    }

    /// The lease of our granted `entry`: its holder deadline counts the session
    /// timeout from `sent`, taken before the queue read that showed it granted.
    fn granted(
        &self,
        entry: &Entry,
        generation: &Generation,
        ahead: &[Member],
        req: &AcquireRequest,
        sent: Instant,
    ) -> Lease {
        let mut record = semaphore::fenced(entry.record.clone(), &entry.stat);
        // A permit's lease carries every holder granted so far: the granted entries
        // ahead of ours, and ours (the controller shows the counts).
        if let Some(own) = record.set.as_ref().and_then(|s| s.holders.first().cloned()) {
            let mut set = semaphore::summary(ahead, req.permits.total)
                .and_then(|s| s.record.ok())
                .and_then(|r| r.set)
                .unwrap_or_default();
            set.permits = req.permits.total;
            set.waiting_writer = None;
            set.last_fence = set.last_fence.max(own.fence);
            set.holders.push(own);
            record.set = Some(set);
        }
        let version = version_of(&entry.name, &entry.stat);
        let deadline = HolderDeadline::after_write(sent, generation.timeout, &self.margins);
        Lease::new(record, version, deadline)
    }

    /// Who a waiting entry is told holds the key, `watch` being the entries ahead
    /// whose change can let it in.
    fn blocking_holder(
        generation: &Generation,
        ahead: &[Member],
        watch: &[usize],
        req: &AcquireRequest,
    ) -> LockRecord {
        // The head of the queue is granted, whatever wrote it.
        let head = &ahead[0];
        // Another client's entry that our permit waits for (it counts as exclusive) is
        // what blocks us, granted or not: it is named, not the lockwarden holders
        // granted before it.
        let foreign_blocker = watch
            .iter()
            .map(|&k| &ahead[k])
            .find(|m| m.stored.record.is_err());
        // On a semaphore key, the holders granted ahead of us (the counts a waiting
        // DistributedLock shows); otherwise the head, whatever wrote it.
        match foreign_blocker {
            Some(blocker) if !req.permits.is_mutex() => Self::holder_record(
                &blocker.name,
                blocker.stored.clone(),
                &blocker.stat,
                generation.timeout,
            ),
            _ => (!req.permits.is_mutex())
                .then(|| semaphore::summary(ahead, req.permits.total))
                .flatten()
                .and_then(|s| s.record.ok())
                .unwrap_or_else(|| {
                    Self::holder_record(
                        &head.name,
                        head.stored.clone(),
                        &head.stat,
                        generation.timeout,
                    )
                }),
        }
    }

    /// Reclaim: deletes the entries ahead of ours that hold or wait under our holder
    /// name but belong to another session — an earlier run of this holder, whose
    /// session may be dead but not yet expired, or kept alive by its `lock` keeper —
    /// each conditioned on the data version just read. Only lockwarden entries: a
    /// foreign entry names no holder we could compare. Returns the first one deleted.
    async fn reclaim_ahead(
        &self,
        generation: &Generation,
        ahead: &[Member],
        req: &AcquireRequest,
    ) -> Result<Option<HeldBy>, LockError> {
        let mut reclaimed = None;
        for member in ahead {
            let Ok(record) = &member.stored.record else {
                continue;
            };
            if record.holder != req.holder || member.stat.ephemeral_owner == generation.id {
                continue;
            }
            let deleted = Self::bounded(
                generation,
                generation
                    .client
                    .delete(&self.node(&member.name), Some(member.stat.version)),
            )
            .await;
            match deleted {
                // Gone meanwhile (its session ended): nothing left to take back.
                Ok(()) | Err(ZkError::NoNode) => {}
                // Rewritten since we read it: not the entry we decided on; look again.
                Err(ZkError::BadVersion) => continue,
                Err(e) => return Err(self.error("deleting our holder's earlier entry", e)),
            }
            tracing::warn!(url = %self.url, entry = %member.name, holder = %record.holder, fence = %record.fence, "reclaimed: deleted this holder's entry of another session");
            reclaimed = reclaimed.or(Some(HeldBy::from_record(record)));
        }
        Ok(reclaimed)
    }

    /// Deletes our entry now (conditioned on its version), or in the background if
    /// ZooKeeper does not answer: it must not stay queued.
    async fn leave(&self, entry: Entry) {
        let path = self.node(&entry.name);
        let generation = entry.generation;
        let deleted = Self::bounded(
            &generation,
            generation.client.delete(&path, Some(entry.stat.version)),
        )
        .await;
        match deleted {
            Ok(()) | Err(ZkError::NoNode) => {}
            Err(e) if session_ended(&e) => {}
            Err(e) => {
                tracing::debug!(url = %self.url, error = %e, "leaving the queue: deleting in the background");
                spawn_cleanup(generation, path, Cleanup::Node);
            }
        }
    }

    /// The entry of acquisition `nonce` is gone: released (`EntryGone`), or taken over
    /// by whoever holds the lock now (`TakenOver`)?
    async fn entry_gone(&self, nonce: &str) -> LockError {
        match self.inspect().await {
            // On a semaphore key others hold their own permits: ours was released.
            Ok(Some(Stored { record: Ok(r), .. }))
                if r.state == LockState::Held && r.nonce != nonce && r.set.is_none() =>
            {
                self.lost(LostReason::TakenOver(HeldBy::from_record(&r)))
            }
            _ => self.lost(LostReason::EntryGone),
        }
    }
}

// `try_acquire`'s steps: one pass of the queue protocol per call of `queue_pass`,
// every step on the contender state held under one lock for the whole of
// `try_acquire`.
impl ZkLock {
    /// What a ZooKeeper queue cannot do: force on a key with permits, a lock-delay,
    /// priorities and weights.
    fn check_supported(&self, req: &AcquireRequest) -> Result<(), LockError> {
        if req.force && !req.permits.is_mutex() {
            // Force deletes every entry ahead of ours: on a key with permits that takes
            // away permits others hold in good standing, so it is refused.
            return Err(LockError::Backend {
                url: self.url.clone(),
                message: "force is not supported with permits > 1".into(),
            });
        }
        if !req.lock_delay.is_zero() {
            return Err(lock_delay_refused(&self.url));
        }
        if req.queue.is_some_and(|q| q != Queueing::default()) {
            return Err(ranks_refused(&self.url));
        }
        Ok(())
    }

    /// One pass: our entry in the queue (joining it if need be), the queue read, and
    /// our place in it judged. `None`: the queue or the session changed under us;
    /// look again. `forced_from` keeps whom force or reclaim took the key from across
    /// passes.
    async fn queue_pass(
        &self,
        st: &mut Contender,
        req: &AcquireRequest,
        forced_from: &mut Option<HeldBy>,
    ) -> Result<Option<Attempt>, LockError> {
        st.forget_ended_session();
        let Some(generation) = self.live_generation(st).await? else {
            return Ok(None);
        };
        if st.entry.is_none() {
            let entry = self.enqueue(&generation, st, req).await?;
            st.entry = Some(entry);
        }
        let Some(entry) = st.entry.as_ref() else {
            return Ok(None);
        };
        let (name, prefix) = (entry.name.clone(), entry.prefix.clone());

        let sent = Instant::now();
        let queue = match self.queue(&generation).await {
            Ok(queue) => queue,
            Err(e) if session_ended(&e) => return Ok(None),
            Err(e) => return Err(self.error("listing the queue", e)),
        };
        self.clean_up_duplicates(&generation, &queue, &name, &prefix);
        match queue.iter().position(|c| c.name == name) {
            None => {
                // Deleted by someone (force), or the session just expired: queue
                // again, at the back.
                tracing::warn!(url = %self.url, entry = %name, "our queue entry disappeared; queueing again");
                st.entry = None;
                st.watched.clear();
                Ok(None)
            }
            Some(i) if req.force && i > 0 => {
                // The first pass removed the holder; a later pass (after a
                // concurrent change) must not overwrite whom we took over from.
                let removed = self.force_ahead(&generation, &queue[..i]).await?;
                *forced_from = forced_from.take().or(removed);
                Ok(None)
            }
            Some(i) => {
                self.judge_place(st, &generation, &queue[..i], req, sent, forced_from)
                    .await
            }
        }
    }

    /// The session our queue state lives on (our entry's, a pending create's, or the
    /// current one); `None` when it has just ended (look again, on a new one).
    async fn live_generation(&self, st: &Contender) -> Result<Option<Arc<Generation>>, LockError> {
        let generation = match (&st.entry, &st.pending) {
            (Some(entry), _) => entry.generation.clone(),
            (None, Some(pending)) => pending.generation.clone(),
            (None, None) => self.session.generation(&self.url).await?,
        };
        if !generation.is_connected() {
            if generation.is_gone() {
                return Ok(None);
            }
            return Err(self.unavailable(format!(
                "ZooKeeper session {:#x} is {}",
                generation.id,
                generation.state()
            )));
        }
        Ok(Some(generation))
    }

    /// Deletes, in the background, the entries a create of ours with a lost reply left
    /// beside `name` (the same protected `prefix`).
    fn clean_up_duplicates(
        &self,
        generation: &Arc<Generation>,
        queue: &[Child],
        name: &str,
        prefix: &str,
    ) {
        for duplicate in queue
            .iter()
            .filter(|c| c.name.starts_with(prefix) && c.name != name)
        {
            spawn_cleanup(
                generation.clone(),
                self.node(&duplicate.name),
                Cleanup::Node,
            );
        }
    }

    /// Our entry stands behind the queue entries `ahead`: reclaim our holder name's
    /// entries of other sessions among them (then look again), or take our turn.
    async fn judge_place(
        &self,
        st: &mut Contender,
        generation: &Arc<Generation>,
        ahead: &[Child],
        req: &AcquireRequest,
        sent: Instant,
        forced_from: &mut Option<HeldBy>,
    ) -> Result<Option<Attempt>, LockError> {
        let ahead = match self.members(generation, ahead).await {
            Ok(ahead) => ahead,
            Err(e) if session_ended(&e) => return Ok(None),
            Err(e) => return Err(self.error("reading the queue", e)),
        };
        if req.reclaim
            && let Some(from) = self.reclaim_ahead(generation, &ahead, req).await?
        {
            // Our holder name's entry of another session is gone: look again.
            *forced_from = forced_from.take().or(Some(from));
            return Ok(None);
        }
        let mut attempt = self.take_turn(st, generation, &ahead, req, sent).await?;
        if let Attempt::Acquired(lease) = &mut attempt {
            lease.forced_from = forced_from.clone();
        }
        Ok(Some(attempt))
    }
}

#[async_trait]
impl LockBackend for ZkLock {
    fn url(&self) -> &str {
        &self.url
    }

    fn margins(&self) -> SafetyMargins {
        self.margins
    }

    /// Joins the queue (or keeps our place in it) and reports the holder. The lease is
    /// the session timeout; `req.lease` does not apply to ZooKeeper. Whether our entry
    /// is granted follows the rule in `semaphore` (for a mutex: it is first).
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Attempt, LockError> {
        self.check_supported(req)?;
        let mut st = self.state.lock().await;
        let mut forced_from = None;
        for _ in 0..QUEUE_RETRIES {
            if let Some(attempt) = self.queue_pass(&mut st, req, &mut forced_from).await? {
                return Ok(attempt);
            }
        }
        Err(self.unavailable("the queue kept changing while we read it; retrying"))
    }
    /// One `exists` on our znode: it proves the session alive at the server at or after
    /// `t_sent`, so the server cannot expire it (and delete the znode) before
    /// `t_sent + session timeout`.
    async fn renew(&self, lease: &mut Lease) -> Result<(), LockError> {
        let mut st = self.state.lock().await;
        let Some(entry) = st
            .entry
            .as_mut()
            .filter(|e| name_of(&lease.version) == Some(e.name.as_str()))
        else {
            return Err(self.lost(LostReason::EntryGone));
        };
        let generation = entry.generation.clone();
        if generation.is_gone() {
            st.entry = None;
            return Err(self.lost(LostReason::SessionExpired));
        }
        if !generation.is_connected() {
            return Err(self.end_claim_while_disconnected(lease, &generation));
        }
        let path = self.node(&entry.name);
        let sent = Instant::now();
        match Self::bounded(&generation, generation.client.check_stat(&path)).await {
            Ok(Some(stat)) if stat.ephemeral_owner == generation.id => {
                entry.stat = stat;
                let version = version_of(&entry.name, &stat);
                let record = lease.record.clone();
                lease.confirm(record, version, sent, &self.margins);
                Ok(())
            }
            Ok(Some(_)) => {
                st.entry = None;
                Err(self.lost(LostReason::NotOurs))
            }
            Ok(None) => {
                st.entry = None;
                Err(self.lost(LostReason::EntryGone))
            }
            Err(e) if session_ended(&e) => {
                st.entry = None;
                Err(self.lost(LostReason::SessionExpired))
            }
            // The connection was lost under the request.
            Err(_) if !generation.is_connected() => {
                Err(self.end_claim_while_disconnected(lease, &generation))
            }
            Err(e) => Err(self.error("checking our queue entry", e)),
        }
    }

    /// Wakes the holder task as soon as the session of our entry leaves
    /// `SyncConnected`, so its renewal ends the claim then (docs/design.md §3,
    /// ZooKeeper).
    async fn in_jeopardy(&self) {
        let generation = self
            .state
            .lock()
            .await
            .entry
            .as_ref()
            .map(|e| e.generation.clone());
        match generation {
            Some(generation) => generation.disconnected().await,
            None => std::future::pending().await,
        }
    }

    /// The memory of completed runs is a znode beside the lock path (`runs.rs`).
    fn keeps_runs(&self) -> Result<(), LockError> {
        Ok(())
    }

    async fn completed_runs(&self, _granted: &Lease) -> Result<RunMemory, LockError> {
        self.stored_runs().await
    }

    async fn runs_beside_the_record(&self) -> Result<Option<RunMemory>, LockError> {
        self.stored_runs().await.map(Some)
    }

    async fn release_completed(
        &self,
        lease: &Lease,
        done: CompletedRun,
        keep: usize,
    ) -> Result<(), LockError> {
        self.release_recording(lease, done, keep).await
    }

    /// Deletes our znode, conditioned on its version. A lost reply is resolved by
    /// deleting again: `NoNode` then means the first delete landed.
    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        let mut st = self.state.lock().await;
        st.watched.clear();
        let Some(entry) = st
            .entry
            .take_if(|e| name_of(&lease.version) == Some(e.name.as_str()))
        else {
            return Err(self.lost(LostReason::EntryGone));
        };
        drop(st);
        let generation = entry.generation.clone();
        let path = self.node(&entry.name);
        let mut expected = Some(entry.stat.version);
        let mut uncertain = false;
        let give_up = Instant::now() + generation.timeout;
        loop {
            if generation.is_gone() {
                return Err(self.lost(LostReason::SessionExpired));
            }
            let deleted =
                Self::bounded(&generation, generation.client.delete(&path, expected)).await;
            match deleted {
                Ok(()) => return Ok(()),
                Err(ZkError::NoNode) if uncertain => return Ok(()),
                Err(ZkError::NoNode) => return Err(self.lost(LostReason::EntryGone)),
                Err(ZkError::BadVersion) => {
                    // Someone rewrote our znode's data; it is still ours if our session
                    // owns it, and it must go or it blocks the queue.
                    match Self::bounded(&generation, generation.client.check_stat(&path)).await {
                        Ok(Some(stat)) if stat.ephemeral_owner == generation.id => {
                            expected = Some(stat.version);
                            continue;
                        }
                        Ok(None) => return Ok(()),
                        Ok(Some(_)) => return Err(self.lost(LostReason::NotOurs)),
                        Err(e) => {
                            tracing::debug!(url = %self.url, error = %e, "release: re-reading our entry failed");
                            uncertain = true;
                        }
                    }
                }
                Err(e) if session_ended(&e) => {
                    return Err(self.lost(LostReason::SessionExpired));
                }
                Err(e) if definite(&e) => return Err(self.error("deleting our queue entry", e)),
                Err(e) => {
                    tracing::debug!(url = %self.url, error = %e, "release outcome unknown; retrying");
                    uncertain = true;
                }
            }
            if Instant::now() >= give_up {
                // Our znode must not outlive this release: it would block the queue for
                // as long as the (shared, long-lived) session lives.
                spawn_cleanup(generation, path, Cleanup::Node);
                return Err(self.unavailable(
                    "release not confirmed; the queue entry is deleted in the background (or with the session)",
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The head of the queue as the holder; on a semaphore key (the head names more
    /// than one permit), with every granted lockwarden entry in its holder set.
    async fn inspect(&self) -> Result<Option<Stored>, LockError> {
        let generation = self.session.generation(&self.url).await?;
        for _ in 0..QUEUE_RETRIES {
            let queue = self
                .queue(&generation)
                .await
                .map_err(|e| self.error("listing the queue", e))?;
            if queue.is_empty() {
                return Ok(None);
            }
            let members = self
                .members(&generation, &queue)
                .await
                .map_err(|e| self.error("reading the queue", e))?;
            let Some(head) = members.first() else {
                continue;
            };
            if let Ok(LockRecord { set: Some(set), .. }) = &head.stored.record {
                return Ok(semaphore::summary(&members, set.permits));
            }
            // The head of the queue holds the lock whatever wrote it (a kafka-kit or
            // Curator entry too): report it as the holder.
            let version = head.stored.version.clone();
            let holder = Self::holder_record(
                &head.name,
                head.stored.clone(),
                &head.stat,
                generation.timeout,
            );
            return Ok(Some(Stored {
                record: Ok(holder),
                version,
            }));
        }
        Err(self.unavailable("the queue kept changing while we read it; retrying"))
    }

    /// Finds the znode of this acquisition (same nonce) owned by our live session. A
    /// restarted process has a new session, and the old one's ephemeral znodes are gone
    /// (or will be once it expires): `Lost(SessionExpired)`. The znode then belongs to
    /// this `ZkLock`: another one that still has it would delete it when dropped.
    async fn resume(&self, holder: &str, nonce: &str) -> Result<Lease, LockError> {
        let mut st = self.state.lock().await;
        let generation = self.session.generation(&self.url).await?;
        let queue = self
            .queue(&generation)
            .await
            .map_err(|e| self.error("listing the queue", e))?;
        if queue.is_empty() {
            return Err(self.lost(LostReason::SessionExpired));
        }
        // One round trip for every entry's data.
        let members = self
            .members(&generation, &queue)
            .await
            .map_err(|e| self.error("reading the queue", e))?;
        let ours =
            members
                .iter()
                .enumerate()
                .find_map(|(position, member)| match &member.stored.record {
                    Ok(record) if record.nonce == nonce => Some((position, member, record.clone())),
                    _ => None,
                });
        if let Some((position, member, record)) = ours {
            let stat = member.stat;
            if stat.ephemeral_owner != generation.id {
                // Made by another session (ours before a restart): it cannot be
                // renewed from here and disappears when that session expires.
                return Err(self.lost(LostReason::SessionExpired));
            }
            if record.holder != holder {
                return Err(self.lost(LostReason::NotOurs));
            }
            let version = member.stored.version.clone();
            let prefix = member
                .name
                .trim_end_matches(|c: char| c.is_ascii_digit())
                .to_string();
            let entry = Entry {
                generation: generation.clone(),
                prefix,
                name: member.name.clone(),
                stat,
                record: record.clone(),
            };
            // This contender now owns the entry; one it had before must not linger.
            if let Some(previous) = st.entry.replace(entry).filter(|e| e.name != member.name) {
                spawn_cleanup(
                    previous.generation,
                    self.node(&previous.name),
                    Cleanup::Node,
                );
            }
            st.pending = None;
            st.watched.clear();
            let modes: Vec<Mode> = members[..position].iter().map(Member::mode).collect();
            let asked = semaphore::permits_of(&record);
            if semaphore::verdict(&modes, asked) != Verdict::Granted {
                // Still waiting in the queue: not a held lock. The entry is kept (a
                // `try_acquire` continues from its place; `abandon` or drop removes it).
                return Err(self.lost(LostReason::NotOurs));
            }
            return Ok(Lease::new(record, version, HolderDeadline::expired()));
        }
        Err(self.lost(LostReason::SessionExpired))
    }

    /// Leaves the queue: deletes our znode, and any a create with a lost reply left.
    async fn abandon(&self) {
        let mut st = self.state.lock().await;
        st.watched.clear();
        let entry = st.entry.take();
        let pending = st.pending.take();
        drop(st);
        if let Some(entry) = entry {
            self.leave(entry).await;
        }
        if let Some(pending) = pending {
            spawn_cleanup(
                pending.generation,
                self.node(&pending.prefix),
                Cleanup::Prefix,
            );
        }
    }

    fn watches_changes(&self) -> bool {
        true
    }

    /// Watches the children whose change can let us in (for a mutex, only our
    /// predecessor): resolves when one of them is deleted (or changes, or the session
    /// ends), or after `timeout`.
    async fn changed(&self, timeout: Duration) {
        let watched = {
            let st = self.state.lock().await;
            match &st.entry {
                Some(entry) if !st.watched.is_empty() => Some((
                    entry.generation.clone(),
                    st.watched
                        .iter()
                        .map(|name| self.node(name))
                        .collect::<Vec<_>>(),
                )),
                _ => None,
            }
        };
        let Some((generation, paths)) = watched else {
            tokio::time::sleep(timeout).await;
            return;
        };
        let wait = async {
            let registered = futures::future::join_all(
                paths
                    .iter()
                    .map(|path| generation.client.check_and_watch_stat(path)),
            )
            .await;
            let mut watchers = Vec::with_capacity(registered.len());
            for result in registered {
                match result {
                    // Already gone: look again now.
                    Ok((None, _)) => return,
                    Ok((Some(_), watcher)) => watchers.push(Box::pin(watcher.changed())),
                    // Disconnected or similar: the others, or the timeout, wake us.
                    Err(_) => {}
                }
            }
            if watchers.is_empty() {
                std::future::pending::<()>().await;
            }
            // Dropping the other watchers removes them from the server.
            futures::future::select_all(watchers).await;
        };
        let _ = tokio::time::timeout(timeout, wait).await;
    }
}

impl Drop for ZkLock {
    /// A contender dropped without `abandon()` (e.g. a cancelled acquisition) must
    /// not leave its znode in the queue for the life of the shared session.
    fn drop(&mut self) {
        let st = self.state.get_mut();
        let (entry, pending) = (st.entry.take(), st.pending.take());
        if let Some(entry) = entry {
            spawn_cleanup(entry.generation, self.node(&entry.name), Cleanup::Node);
        }
        if let Some(pending) = pending {
            spawn_cleanup(
                pending.generation,
                self.node(&pending.prefix),
                Cleanup::Prefix,
            );
        }
    }
}

fn wall_clock(ms: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// docs/design.md §6.4: the entries' sequence is the queue every client of the key
/// obeys ("the lowest sequence holds"); a grant by priority or weight would let one of
/// them hold next to another.
fn ranks_refused(url: &str) -> LockError {
    LockError::Backend {
        url: url.to_string(),
        message: "a queue priority or weight is not supported on ZooKeeper: its queue is the \
                  order of the entries, which kafka-kit, Curator and earlier lockwarden builds \
                  obey; they would hold the key beside a waiter granted out of that order"
            .into(),
    }
}

/// Rule 8 has nowhere to live on ZooKeeper: the holder's entry is ephemeral, so the
/// server deletes it when the session expires and every watcher (kafka-kit's and
/// Curator's included) is woken at once; no contender reads a lease it could extend.
pub(crate) fn lock_delay_refused(url: &str) -> LockError {
    LockError::Backend {
        url: url.to_string(),
        message: "a lock-delay is not supported on ZooKeeper: an expired session's entry is \
                  deleted by the server and every waiter takes over at once, so no delay \
                  can be stored; leave the lock-delay at 0"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockwarden_core::FenceToken;

    #[test]
    fn foreign_entries_are_described_not_parsed() {
        let stat = Stat {
            czxid: 42,
            mzxid: 42,
            pzxid: 42,
            ctime: 1_700_000_000_000,
            mtime: 1_700_000_000_000,
            version: 0,
            cversion: 0,
            aversion: 0,
            ephemeral_owner: 9,
            data_length: 0,
            num_children: 0,
        };
        let name = "_c_k-lock-0000000001";
        let stored = ZkLock::stored(name, br#"{"owner_id":"kafka-kit"}"#, &stat);
        assert!(stored.record.is_err());
        let holder = ZkLock::holder_record(name, stored, &stat, Duration::from_secs(10));
        assert!(
            holder.holder.contains("foreign queue entry"),
            "{}",
            holder.holder
        );
        assert!(holder.holder.contains("kafka-kit"), "{}", holder.holder);
        assert_eq!(holder.fence, FenceToken(42));
    }
}

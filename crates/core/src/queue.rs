//! Queues on the stores with conditional writes (S3, DynamoDB, Kubernetes Lease),
//! docs/design.md §6.4: waiters register in the key's holder set and are granted in
//! (priority, ticket) order, a holder may take several permits (a weight).
//!
//! What the queue adds to §6.2's holder set:
//! - *Arrival order is the store's.* A waiter registers with one conditional write that
//!   takes the set's next ticket (a counter in the record): two waiters never get one
//!   ticket, and no clock orders them.
//! - *Only the head is granted.* The first waiter in grant order is granted as soon as
//!   what it asks for is free; nobody else is, while it is live. A contender with no
//!   registration is granted at once only when the queue is empty.
//! - *Rule 1 per entry, waiters included.* A waiter refreshes its own entry (a new
//!   revision) every third of its waiter lease; a contender drops an entry it has seen
//!   unchanged for that entry's lease plus the grace, in a write conditioned on the
//!   version that showed it. A refresh changes only the refreshing waiter's entry, so
//!   no waiter's refresh ever looks like the holder's renewal.
//! - *Safety does not depend on order.* Every grant is one conditional write of the
//!   whole set that keeps the permits; order is a fairness property on top.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::backend::{AcquireRequest, Attempt, RecordStore, StoreError};
use super::cas::CasLock;
use super::error::LockError;
use super::permits::{HolderSet, Mode, Permits, Queue, SetEntry};
use super::record::{FenceToken, LockRecord, UnknownFields, Version};
use super::semaphore::{Current, SetContender, holder_entry, lost_a_race, reclaimable, record_of};

/// What a contender that waits in a key's queue asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Queueing {
    /// Higher goes first; equal priorities go in arrival order.
    pub priority: i32,
    /// How many of the key's permits a shared holder takes.
    pub weight: u32,
}

impl Default for Queueing {
    fn default() -> Self {
        Queueing {
            priority: 0,
            weight: 1,
        }
    }
}

impl Queueing {
    /// Checks the weight against the key's permits; the error names what is wrong.
    pub fn validate(&self, permits: Permits) -> Result<(), WeightError> {
        let (weight, permits, mode) = (self.weight, permits.total, permits.mode);
        if weight == 0 {
            return Err(WeightError::Zero);
        }
        if weight > permits {
            return Err(WeightError::MoreThanPermits { weight, permits });
        }
        if weight > 1 && mode == Mode::Exclusive {
            return Err(WeightError::Exclusive { weight, permits });
        }
        Ok(())
    }
}

/// A weight that no grant of the key could honour.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WeightError {
    #[error("weight must be at least 1")]
    Zero,
    #[error("weight {weight} is more than the key's {permits} permits: it could never be granted")]
    MoreThanPermits { weight: u32, permits: u32 },
    #[error(
        "weight {weight} on an exclusive holder: an exclusive holder takes all {permits} permits \
         already; a weight is for shared holders"
    )]
    Exclusive { weight: u32, permits: u32 },
}

/// How long a waiter's entry lives without a refresh (rule 1 per entry), at most: a
/// dead waiter stops blocking the queue this long (plus the grace) after its last
/// refresh. A request with a shorter lease uses its lease. It is the default lease: a
/// waiter survives the stall a holder of the default lease survives (a controller's
/// reconciles slowed by an overloaded API server, a slow store); at 10 s the suite's 22
/// waiters of two controllers on one key were dropped on a loaded machine and lost
/// their place to a grant made while they were out (docs/design.md §6.4, Q4).
pub const WAITER_LEASE: Duration = Duration::from_secs(30);

/// How often the head of the queue looks at the key while it waits: the hand-off slack
/// between a release and the head's grant, besides one read and one write.
pub const HEAD_POLL: Duration = Duration::from_millis(100);

/// The waiter lease of a request.
fn waiter_lease(req: &AcquireRequest) -> Duration {
    WAITER_LEASE.min(req.lease)
}

/// Whether our entry's refresh is overdue: two thirds of its waiter lease have passed
/// since the last write of it landed (it is due at one third).
fn refresh_overdue(st: &SetContender, req: &AcquireRequest) -> bool {
    st.waiting_written
        .is_some_and(|t| t.elapsed() >= waiter_lease(req) * 2 / 3)
}

/// Whether `set` has room now for an entry in `mode` taking `weight` permits.
fn fits(set: &HolderSet, mode: Mode, weight: u32) -> bool {
    match mode {
        Mode::Exclusive => set.holders.is_empty(),
        Mode::Shared => {
            set.holders.iter().all(|h| h.mode == Mode::Shared)
                && set.in_use() + weight <= set.permits
        }
    }
}

/// Where a waiter stands, for status and progress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueView {
    /// 0 = next.
    pub position: usize,
    /// Registered waiters, this one included.
    pub length: usize,
    /// How many later arrivals were granted before it (by priority).
    pub overtaken: u32,
    /// When it may expect to be granted, from the key's recent hold times: `None`
    /// until the key has some.
    pub expected_start: Option<SystemTime>,
}

impl QueueView {
    /// Where the waiter with `nonce` stands in `set`'s queue, estimated at `now`.
    pub fn of(set: &HolderSet, nonce: &str, now: SystemTime) -> Option<QueueView> {
        Self::find(set, now, |w| w.nonce == nonce)
    }

    /// Where the (first) waiter named `holder` stands: how the controller finds its
    /// own, whose holder identity names one DistributedLock.
    pub fn of_holder(set: &HolderSet, holder: &str, now: SystemTime) -> Option<QueueView> {
        Self::find(set, now, |w| w.holder == holder)
    }

    fn find(
        set: &HolderSet,
        now: SystemTime,
        ours: impl Fn(&SetEntry) -> bool,
    ) -> Option<QueueView> {
        let queue = set.queue.as_ref()?;
        let order = queue.in_order();
        let position = order.iter().position(|w| ours(w))?;
        Some(QueueView {
            position,
            length: order.len(),
            overtaken: order[position].overtaken,
            expected_start: expected_start(set, &order[..=position], now),
        })
    }
}

/// The estimate: the current holders finish after the key's mean hold time (counted
/// from their grant, never less than zero), and each waiter ahead then holds for the
/// mean hold time on its share of the permits. A crude model, stated as such in
/// docs/design.md §6.4: its error is measured by `scripts/bench`.
fn expected_start(set: &HolderSet, up_to_us: &[&SetEntry], now: SystemTime) -> Option<SystemTime> {
    let queue = set.queue.as_ref()?;
    if queue.hold_ms.is_empty() {
        return None;
    }
    let mean =
        Duration::from_millis(queue.hold_ms.iter().sum::<u64>() / queue.hold_ms.len() as u64);
    let left =
        |h: &SetEntry| mean.saturating_sub(now.duration_since(h.acquired_at()).unwrap_or_default());
    let first_free = set.holders.iter().map(left).min().unwrap_or_default();
    // Permits taken by those ahead of us (and us), in holds of the whole key.
    let ahead: u32 = up_to_us[..up_to_us.len() - 1]
        .iter()
        .map(|w| w.permits_taken(set.permits))
        .sum();
    let rounds = ahead / set.permits.max(1);
    Some(now + first_free + mean * rounds)
}

/// The record's summary for a queued set with waiters but no holder: held (foreign
/// tools wait while the queue drains, docs/design.md §6.4), in the head's name.
pub(super) fn summary_holder(set: &HolderSet) -> Option<String> {
    let head = set
        .queue
        .as_ref()?
        .in_order()
        .first()
        .map(|w| w.holder.clone())?;
    Some(format!("queued: {head}"))
}

impl<S: RecordStore> CasLock<S> {
    /// One attempt of a queued contender on the set read (expired entries already
    /// dropped). `Ok(None)`: a write lost a race; read again.
    pub(super) async fn queued_attempt(
        &self,
        st: &mut SetContender,
        req: &AcquireRequest,
        current: Current,
    ) -> Result<Option<Attempt>, LockError> {
        self.check_queue_can_be_kept()?;
        let queueing = req.queue.unwrap_or_default();
        if let Some(busy) = self.held_without_queue(st, req, &current) {
            return Ok(Some(busy));
        }
        let Current {
            mut set,
            version,
            unknown,
            another_tool: _,
        } = current;
        let queue = set.queue.get_or_insert_with(|| Queue {
            next_ticket: 1,
            ..Queue::default()
        });
        let ours = our_registration(st, queue);
        let our_turn = is_our_turn(queue, ours.as_ref());
        let weight = match req.permits.mode {
            Mode::Exclusive => 1,
            Mode::Shared => queueing.weight,
        };
        // With `reclaim`, our earlier run's entry leaves the set only in the write that
        // grants us: a registration or refresh keeps it, or a restart that still has
        // waiters ahead would free that permit without anyone reporting a takeover.
        let reclaimed = reclaimable(&set, req);
        let grantable = reclaimed.as_ref().map_or(&set, |(without, _)| without);
        if our_turn && fits(grantable, req.permits.mode, weight) {
            let (set, forced_from) = match reclaimed {
                Some((without, from)) => (without, Some(from)),
                None => (set, None),
            };
            let granted = self
                .grant_queued(st, req, set, ours, weight, (version.as_ref(), &unknown))
                .await?;
            return Ok(granted.map(|mut lease| {
                lease.forced_from = forced_from;
                Attempt::Acquired(lease)
            }));
        }
        let current = (version.as_ref(), &unknown);
        match ours {
            None => {
                self.register(st, req, set, weight, queueing.priority, current)
                    .await
            }
            Some(entry) => {
                self.refresh(st, req, set, entry, queueing.priority, current)
                    .await
            }
        }
    }

    /// A queue lives in the key's record: a key deleted on release cannot keep one.
    fn check_queue_can_be_kept(&self) -> Result<(), LockError> {
        if self.delete_on_release {
            return Err(LockError::Backend {
                url: self.url(),
                message: "a queue cannot be kept on a key that is deleted on release \
                          (s3lockCompatible): nobody would hold the record the queue lives in; \
                          turn the queue or s3lock compatibility off"
                    .into(),
            });
        }
        Ok(())
    }

    /// Held by another tool, or by holders in the shape without a queue (which a
    /// build without queues may be renewing): never rewritten into a queued set
    /// while held, or that holder would read its key as foreign and lose it. Busy,
    /// waiting unregistered; `None` when the key may take a queue.
    fn held_without_queue(
        &self,
        st: &SetContender,
        req: &AcquireRequest,
        current: &Current,
    ) -> Option<Attempt> {
        let set = &current.set;
        let unqueued_holders =
            (current.another_tool.is_some() || set.queue.is_none()) && !set.holders.is_empty();
        if !unqueued_holders {
            return None;
        }
        let takeover_after = |lease| self.margins.takeover_after(lease);
        let retry_in = st.next_expiry(set, takeover_after).min(req.lease / 3);
        let holder = current
            .another_tool
            .clone()
            .unwrap_or_else(|| record_of(set.clone(), &current.unknown));
        Some(unregistered(holder, retry_in))
    }

    /// Registers a new waiter entry with the set's next ticket — or, when the queue is
    /// at its bound, waits unregistered, behind every registered waiter.
    async fn register(
        &self,
        st: &mut SetContender,
        req: &AcquireRequest,
        set: HolderSet,
        weight: u32,
        priority: i32,
        (version, unknown): (Option<&Version>, &UnknownFields),
    ) -> Result<Option<Attempt>, LockError> {
        let mut entry = SetEntry::new(
            &req.holder,
            FenceToken(0),
            waiter_lease(req),
            req.permits.mode,
            None,
        );
        entry.weight = weight;
        entry.priority = priority;
        let mut registered = set.clone();
        let queue = registered.queue.get_or_insert_with(Queue::default);
        let full = queue.waiters.len() >= Queue::MAX_WAITERS;
        entry.ticket = match kept_ticket(st, queue) {
            Some(ticket) => ticket,
            None => {
                queue.next_ticket += 1;
                queue.next_ticket - 1
            }
        };
        queue.waiters.push(entry.clone());
        if full || registered.to_json().len() > Queue::MAX_SET_BYTES {
            let retry_in = waiter_lease(req) / 3;
            return Ok(Some(unregistered(record_of(set, unknown), retry_in)));
        }
        self.write_waiter(st, req, registered, entry, version, unknown)
            .await
    }

    /// Refreshes our entry when a third of its waiter lease has passed (rule 1 per
    /// entry), or at once when our priority changed; otherwise only reports our place.
    async fn refresh(
        &self,
        st: &mut SetContender,
        req: &AcquireRequest,
        mut set: HolderSet,
        entry: SetEntry,
        priority: i32,
        (version, unknown): (Option<&Version>, &UnknownFields),
    ) -> Result<Option<Attempt>, LockError> {
        let due = st
            .waiting_written
            .is_none_or(|t| t.elapsed() >= waiter_lease(req) / 3);
        if !due && entry.priority == priority {
            return Ok(Some(busy(&set, unknown, &entry, req, st)));
        }
        let mut refreshed = entry.renewed();
        refreshed.priority = priority;
        let queue = set.queue.get_or_insert_with(Queue::default);
        for w in queue.waiters.iter_mut().filter(|w| w.nonce == entry.nonce) {
            *w = refreshed.clone();
        }
        self.write_waiter(st, req, set, refreshed, version, unknown)
            .await
    }

    /// Writes the set with our registration or its refresh. `Ok(None)`: lost a race.
    async fn write_waiter(
        &self,
        st: &mut SetContender,
        req: &AcquireRequest,
        set: HolderSet,
        entry: SetEntry,
        version: Option<&Version>,
        unknown: &UnknownFields,
    ) -> Result<Option<Attempt>, LockError> {
        let sent = Instant::now();
        match self
            .write_set(version, &record_of(set.clone(), unknown))
            .await
        {
            Ok(_) => {
                st.waiting = Some(entry.clone());
                st.waiting_written = Some(sent);
                st.ticket = Some(entry.ticket);
                Ok(Some(busy(&set, unknown, &entry, req, st)))
            }
            Err(StoreError::Conflict { .. }) => {
                lost_a_race();
                let refreshing = st.waiting.as_ref().is_some_and(|w| w.nonce == entry.nonce);
                if !refreshing || refresh_overdue(st, req) {
                    // A registration: read again at once (arrival order is at stake).
                    // So does a refresh that two thirds of the waiter lease found
                    // failing: on a slow store, n waiters refreshing one record lose
                    // most races, and one crowded out to its lease's end is dropped.
                    return Ok(None);
                }
                // A refresh is not urgent (due at a third of the waiter lease, needed
                // only by its end): try again at a later look rather than at once, so
                // that waiters racing each other do not crowd out the holder's renewal.
                let mut attempt = busy(&set, unknown, &entry, req, st);
                if let Attempt::Busy { retry_in, .. } = &mut attempt {
                    *retry_in = Some(Duration::from_millis(rand::random_range(50..250)));
                }
                Ok(Some(attempt))
            }
            // It may have landed: keep its nonce, so the next attempt finds it (or
            // registers again when it did not land).
            Err(StoreError::Indeterminate(_)) => {
                st.waiting = Some(entry);
                Ok(None)
            }
            Err(e) => Err(self.store_error(e)),
        }
    }

    /// The head's grant: the key's next fence, our entry among the holders (with the
    /// ticket we waited with), our registration out of the queue, and every earlier
    /// arrival we overtook counted; one conditional write. `Ok(None)`: lost a race.
    async fn grant_queued(
        &self,
        st: &mut SetContender,
        req: &AcquireRequest,
        mut set: HolderSet,
        registered: Option<SetEntry>,
        weight: u32,
        replacing: (Option<&Version>, &UnknownFields),
    ) -> Result<Option<super::backend::Lease>, LockError> {
        let fence = self.next_fence(&set)?;
        let queue = set.queue.get_or_insert_with(Queue::default);
        let ticket = match &registered {
            Some(e) => e.ticket,
            None => {
                let t = queue.next_ticket.max(1);
                queue.next_ticket = t + 1;
                t
            }
        };
        queue
            .waiters
            .retain(|w| Some(&w.nonce) != registered.as_ref().map(|r| &r.nonce));
        for w in queue.waiters.iter_mut().filter(|w| w.ticket < ticket) {
            w.overtaken += 1;
        }
        queue.record_grant(SystemTime::now());
        let mut entry = holder_entry(req, fence);
        entry.weight = weight;
        entry.priority = req.queue.unwrap_or_default().priority;
        entry.ticket = ticket;
        let lease = self
            .write_grant(st, replacing, set, entry, req.lock_delay)
            .await?;
        if lease.is_some() {
            st.waiting = None;
            st.waiting_written = None;
            st.ticket = None;
        }
        Ok(lease)
    }
}

/// Our registration, if it is (still) in `queue`: a registration dropped as expired
/// (we did not refresh in time) or never landed is forgotten, to be made again (with
/// the ticket it had, if its write landed: [`kept_ticket`]).
fn our_registration(st: &mut SetContender, queue: &Queue) -> Option<SetEntry> {
    let ours = st
        .waiting
        .as_ref()
        .and_then(|w| queue.waiters.iter().find(|e| e.nonce == w.nonce))
        .cloned();
    if ours.is_none()
        && let (Some(lost), Some(written)) = (st.waiting.take(), st.waiting_written)
    {
        // Others saw it unrefreshed for its waiter lease: this process stalled (or
        // the registration's write never landed). Worth seeing: it can cost the
        // waiter its place to a grant made while it was out.
        tracing::warn!(
            holder = %lost.holder,
            ticket = st.ticket,
            since_last_refresh = ?written.elapsed(),
            "queue registration dropped by others; registering again with its ticket"
        );
    }
    ours
}

/// The ticket a registration made again keeps: the one the store gave our earlier
/// registration of this acquisition, which others dropped because we missed its
/// refreshes for its waiter lease (a stall: a dead waiter never comes back). Arrival
/// order is kept for every waiter that lives (docs/design.md §6.4). The store issued
/// it (our write of it landed) and never issues it again, so no other waiter has it;
/// the check is for a record rewritten by something else.
fn kept_ticket(st: &SetContender, queue: &Queue) -> Option<u64> {
    st.ticket
        .filter(|t| *t < queue.next_ticket && queue.waiters.iter().all(|w| w.ticket != *t))
}

/// Only the head is granted: our registration when it is first in grant order, or an
/// unregistered contender when nobody waits.
fn is_our_turn(queue: &Queue, ours: Option<&SetEntry>) -> bool {
    let head = queue.in_order().first().map(|w| w.nonce.clone());
    match ours {
        Some(e) => head.as_ref() == Some(&e.nonce),
        None => queue.waiters.is_empty(),
    }
}

/// Busy, registered: our position, and when to look again — the head often (the
/// hand-off slack), the others by their position or when their refresh is due.
fn busy(
    set: &HolderSet,
    unknown: &UnknownFields,
    ours: &SetEntry,
    req: &AcquireRequest,
    st: &SetContender,
) -> Attempt {
    let position = set
        .queue
        .as_ref()
        .and_then(|q| q.position(&ours.nonce))
        .unwrap_or_default();
    let refresh_in = (waiter_lease(req) / 3)
        .saturating_sub(st.waiting_written.map_or(Duration::ZERO, |t| t.elapsed()));
    // The head looks every HEAD_POLL; the others less often the further back they
    // are (a waiter moves up one place per grant), and at least when their refresh is
    // due: n waiters cost about 10 × ln(n) reads a second, not 10 × n.
    let retry_in = HEAD_POLL
        .saturating_mul(u32::try_from(position + 1).unwrap_or(u32::MAX))
        .min(refresh_in)
        .max(Duration::from_millis(5));
    Attempt::Busy {
        holder: record_of(set.clone(), unknown),
        retry_in: Some(retry_in),
        queue_position: Some(u32::try_from(position).unwrap_or(u32::MAX)),
    }
}

/// Busy, not registered (another tool's lock, holders without a queue, a full queue).
fn unregistered(holder: LockRecord, retry_in: Duration) -> Attempt {
    Attempt::Busy {
        holder,
        retry_in: Some(retry_in.max(Duration::from_millis(5))),
        queue_position: None,
    }
}

/// The queue's rules (docs/design.md §6.4) on the in-memory store, real time with
/// short leases, as in `semaphore`'s tests.
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::{Instant, sleep};

    use super::*;
    use crate::backend::LockBackend;
    use crate::cas::tests::{LEASE, MARGINS, TAKEOVER_AFTER, acquired};
    use crate::memory::{Fault, MemoryStore};
    use crate::record::LockState;

    fn contender(store: &MemoryStore) -> CasLock<MemoryStore> {
        CasLock::new(store.clone()).with_margins(MARGINS)
    }

    fn queued(holder: &str, priority: i32) -> AcquireRequest {
        AcquireRequest {
            queue: Some(Queueing {
                priority,
                weight: 1,
            }),
            ..AcquireRequest::new(holder, LEASE)
        }
    }

    fn weighted(holder: &str, permits: u32, weight: u32) -> AcquireRequest {
        AcquireRequest {
            permits: Permits::semaphore(permits),
            queue: Some(Queueing {
                priority: 0,
                weight,
            }),
            ..AcquireRequest::new(holder, LEASE)
        }
    }

    /// Busy: the position it reports (`None`: not registered).
    async fn waits(lock: &CasLock<MemoryStore>, req: &AcquireRequest) -> Option<u32> {
        match lock.try_acquire(req).await {
            Ok(Attempt::Busy { queue_position, .. }) => queue_position,
            other => panic!("{} should wait: {other:?}", req.holder),
        }
    }

    fn stored_set(store: &MemoryStore) -> HolderSet {
        store.record().set.expect("a holder set")
    }

    /// Q4: a waiter's entry lives as long as a default holder's lease (30 s), or its
    /// own lease when that is shorter — not 10 s, which let a loaded controller's
    /// waiters be dropped and passed.
    #[tokio::test]
    async fn rule1_per_entry_a_waiters_lease_is_the_default_lease_or_its_own_if_shorter() {
        let store = MemoryStore::new("mem://locks/queue-waiter-lease");
        let (la, lb, lc) = (contender(&store), contender(&store), contender(&store));
        let _a = acquired(&la, &queued("a", 0)).await;
        let mut long = queued("long", 0);
        long.lease = Duration::from_secs(120);
        let mut short = queued("short", 0);
        short.lease = Duration::from_secs(4);
        waits(&lb, &long).await.expect("registered");
        waits(&lc, &short).await.expect("registered");
        let waiters = stored_set(&store).queue.unwrap().waiters;
        let lease_of = |h: &str| waiters.iter().find(|w| w.holder == h).unwrap().lease();
        assert_eq!(WAITER_LEASE, Duration::from_secs(30));
        assert_eq!(lease_of("long"), WAITER_LEASE);
        assert_eq!(lease_of("short"), Duration::from_secs(4));
    }

    #[tokio::test]
    async fn order_grants_follow_tickets_not_the_order_of_attempts() {
        let store = MemoryStore::new("mem://locks/queue-order");
        let (la, l1, l2, l3) = (
            contender(&store),
            contender(&store),
            contender(&store),
            contender(&store),
        );
        let a = acquired(&la, &queued("a", 0)).await;
        assert_eq!(waits(&l1, &queued("w1", 0)).await, Some(0));
        assert_eq!(waits(&l2, &queued("w2", 0)).await, Some(1));
        assert_eq!(waits(&l3, &queued("w3", 0)).await, Some(2));
        la.release(&a).await.unwrap();
        // The last to arrive looks first, then the second: neither is the head.
        assert_eq!(waits(&l3, &queued("w3", 0)).await, Some(2));
        assert_eq!(waits(&l2, &queued("w2", 0)).await, Some(1));
        let w1 = acquired(&l1, &queued("w1", 0)).await;
        // Fences increase in grant order, a newcomer queues behind the waiters.
        assert_eq!(w1.fence(), FenceToken(2));
        let l4 = contender(&store);
        assert_eq!(waits(&l4, &queued("w4", 0)).await, Some(2));
        l1.release(&w1).await.unwrap();
        assert_eq!(waits(&l3, &queued("w3", 0)).await, Some(1));
        let w2 = acquired(&l2, &queued("w2", 0)).await;
        assert_eq!(w2.fence(), FenceToken(3));
        let set = stored_set(&store);
        let tickets: Vec<u64> = set
            .queue
            .unwrap()
            .waiters
            .iter()
            .map(|w| w.ticket)
            .collect();
        assert_eq!(tickets, vec![4, 5], "w3 and w4 keep their tickets");
    }

    #[tokio::test]
    async fn a_waiter_dropped_for_missed_refreshes_registers_again_with_its_ticket() {
        let store = MemoryStore::new("mem://locks/queue-stalled-waiter");
        let (la, stalled, next) = (contender(&store), contender(&store), contender(&store));
        // The holder outlives the test: only the stalled waiter's entry expires.
        let long = AcquireRequest {
            lease: Duration::from_secs(600),
            ..queued("a", 0)
        };
        let a = acquired(&la, &long).await;
        assert_eq!(waits(&stalled, &queued("stalled", 0)).await, Some(0));
        let ticket = stored_set(&store).queue.unwrap().waiters[0].ticket;
        assert_eq!(waits(&next, &queued("next", 0)).await, Some(1));
        // "stalled" misses its refreshes: "next", looking on, drops its entry once it
        // has stayed unchanged for its waiter lease plus the grace.
        let since = Instant::now();
        while stored_set(&store).queue.unwrap().waiters.len() > 1 {
            assert!(
                since.elapsed() < TAKEOVER_AFTER * 20,
                "the stalled waiter's entry was never dropped"
            );
            sleep(Duration::from_millis(20)).await;
            waits(&next, &queued("next", 0)).await;
        }
        assert_eq!(waits(&next, &queued("next", 0)).await, Some(0));
        // Back, it registers again with the ticket it had: ahead of "next" again.
        assert_eq!(waits(&stalled, &queued("stalled", 0)).await, Some(0));
        let set = stored_set(&store);
        let queue = set.queue.unwrap();
        let again = queue
            .waiters
            .iter()
            .find(|w| w.holder == "stalled")
            .unwrap();
        assert_eq!(again.ticket, ticket, "a new ticket: sent to the back");
        assert_eq!(queue.next_ticket, ticket + 2, "no ticket was issued again");
        assert_eq!(waits(&next, &queued("next", 0)).await, Some(1));
        la.release(&a).await.unwrap();
        assert_eq!(waits(&next, &queued("next", 0)).await, Some(1));
        let first = acquired(&stalled, &queued("stalled", 0)).await;
        stalled.release(&first).await.unwrap();
        let second = acquired(&next, &queued("next", 0)).await;
        assert!(second.fence() > first.fence());
        // Granted, it forgets the ticket: its next acquisition queues anew.
        assert_eq!(waits(&stalled, &queued("stalled", 0)).await, Some(0));
        let set = stored_set(&store);
        assert!(set.queue.unwrap().waiters[0].ticket > ticket + 1);
    }

    /// A waiter's refresh that loses a race tries again at a later look while it is
    /// merely due, and at once (read again, write again) once it is overdue: n waiters
    /// refreshing one record on a slow store must not crowd one out until it is dropped.
    #[tokio::test]
    async fn a_refresh_losing_a_race_tries_again_at_once_only_when_overdue() {
        let store = MemoryStore::new("mem://locks/queue-crowded-refresh");
        let (la, w) = (contender(&store), contender(&store));
        let long = AcquireRequest {
            lease: Duration::from_secs(600),
            ..queued("a", 0)
        };
        let _a = acquired(&la, &long).await;
        let req = AcquireRequest {
            lease: Duration::from_millis(900),
            ..queued("w", 0)
        };
        assert_eq!(waits(&w, &req).await, Some(0));
        let renewals = |store: &MemoryStore| stored_set(store).queue.unwrap().waiters[0].clone();
        let registered = renewals(&store);
        // Due (a third of 900 ms), not overdue: the lost race waits for a later look.
        sleep(Duration::from_millis(350)).await;
        store.next_write(Fault::Conflict);
        let (_, writes) = store.requests();
        assert_eq!(waits(&w, &req).await, Some(0));
        assert_eq!(store.requests().1, writes + 1, "one write, lost");
        assert_eq!(renewals(&store), registered, "not refreshed yet");
        // Overdue (two thirds): read again and write again within the same attempt.
        sleep(Duration::from_millis(300)).await;
        store.next_write(Fault::Conflict);
        let (_, writes) = store.requests();
        assert_eq!(waits(&w, &req).await, Some(0));
        assert_eq!(
            store.requests().1,
            writes + 2,
            "the lost write, then the refresh"
        );
        assert_ne!(
            renewals(&store),
            registered,
            "refreshed in the same attempt"
        );
    }

    #[tokio::test]
    async fn rule5_reclaim_on_a_queued_key_drops_the_earlier_entry_only_in_its_grant() {
        let store = MemoryStore::new("mem://locks/queue-reclaim");
        let reclaim = |holder: &str| AcquireRequest {
            reclaim: true,
            ..queued(holder, 0)
        };
        let (la, lb, restarted) = (contender(&store), contender(&store), contender(&store));
        let a = acquired(&la, &queued("a", 0)).await;
        assert_eq!(waits(&lb, &queued("b", 0)).await, Some(0));
        // "a" restarts while "b" waits ahead of it: it registers behind "b", and its
        // earlier run's entry stays in the set (no permit freed, nobody granted).
        assert_eq!(waits(&restarted, &reclaim("a")).await, Some(1));
        let set = stored_set(&store);
        assert!(
            set.entry(a.nonce()).is_some(),
            "the earlier entry was dropped"
        );
        assert_eq!(waits(&lb, &queued("b", 0)).await, Some(0));
        // "b" goes first. The earlier run released meanwhile, so the restart's grant
        // has nothing left to reclaim and reports no takeover.
        la.release(&a).await.unwrap();
        let b = acquired(&lb, &queued("b", 0)).await;
        lb.release(&b).await.unwrap();
        let again = acquired(&restarted, &reclaim("a")).await;
        assert!(again.forced_from.is_none(), "nothing was left to reclaim");
        // With nobody ahead, a restart reclaims in the write that grants it.
        let restarted_again = contender(&store);
        let third = acquired(&restarted_again, &reclaim("a")).await;
        let from = third.forced_from.as_ref().expect("reported");
        assert_eq!(from.fence, again.fence());
        assert!(stored_set(&store).entry(again.nonce()).is_none());
        assert!(third.fence() > again.fence());
    }

    #[tokio::test]
    async fn priority_a_later_higher_priority_waiter_goes_next_and_the_overtaken_count_shows() {
        let store = MemoryStore::new("mem://locks/queue-priority");
        let (la, low, high) = (contender(&store), contender(&store), contender(&store));
        let a = acquired(&la, &queued("a", 0)).await;
        assert_eq!(waits(&low, &queued("low", 0)).await, Some(0));
        assert_eq!(waits(&high, &queued("high", 5)).await, Some(0));
        // No holder is preempted: the high priority waits for a's release.
        assert_eq!(waits(&high, &queued("high", 5)).await, Some(0));
        assert_eq!(stored_set(&store).holders[0].holder, "a");
        la.release(&a).await.unwrap();
        assert_eq!(waits(&low, &queued("low", 0)).await, Some(1));
        let h = acquired(&high, &queued("high", 5)).await;
        let set = stored_set(&store);
        let low_entry = &set.queue.as_ref().unwrap().waiters[0];
        assert_eq!((low_entry.holder.as_str(), low_entry.overtaken), ("low", 1));
        let view = QueueView::of(&set, &low_entry.nonce, SystemTime::now()).unwrap();
        assert_eq!((view.position, view.length, view.overtaken), (0, 1, 1));
        high.release(&h).await.unwrap();
        acquired(&low, &queued("low", 0)).await;
    }

    #[tokio::test]
    async fn weights_never_exceed_the_permits_and_a_heavy_waiter_is_not_passed_by_light_ones() {
        let store = MemoryStore::new("mem://locks/queue-weights");
        let (l1, l2, l3) = (contender(&store), contender(&store), contender(&store));
        let one = acquired(&l1, &weighted("one", 4, 1)).await;
        let three = acquired(&l2, &weighted("three", 4, 3)).await;
        assert_eq!(stored_set(&store).in_use(), 4);
        let heavy = contender(&store);
        assert_eq!(waits(&heavy, &weighted("heavy", 4, 3)).await, Some(0));
        l1.release(&one).await.unwrap();
        // One permit is free, but the head needs three: a light later arrival waits
        // behind it rather than take the free permit.
        assert_eq!(waits(&l3, &weighted("light", 4, 1)).await, Some(1));
        assert_eq!(waits(&heavy, &weighted("heavy", 4, 3)).await, Some(0));
        l2.release(&three).await.unwrap();
        acquired(&heavy, &weighted("heavy", 4, 3)).await;
        acquired(&l3, &weighted("light", 4, 1)).await;
        let set = stored_set(&store);
        assert_eq!(set.in_use(), 4);
        assert!(set.queue.unwrap().waiters.is_empty());
    }

    #[tokio::test]
    async fn rule1_per_entry_a_dead_holder_is_taken_over_while_waiters_keep_refreshing() {
        let store = MemoryStore::new("mem://locks/queue-dead-holder");
        let la = contender(&store);
        let _dead = acquired(&la, &queued("dead", 0)).await;
        // Every waiter's observation starts after this: the earliest takeover is the
        // holder's lease plus the grace from here.
        let written = Instant::now();
        let waiters: Vec<_> = (0..10).map(|_| contender(&store)).collect();
        let names: Vec<String> = (0..10).map(|i| format!("w{i}")).collect();
        for (lock, name) in waiters.iter().zip(&names) {
            waits(lock, &queued(name, 0)).await;
        }
        let since = Instant::now();
        // Every waiter keeps refreshing (each refresh changes the record's version):
        // the head is granted once the dead holder's own entry has stayed unchanged
        // for its lease plus the grace, and not before.
        let granted = 'outer: loop {
            for (lock, name) in waiters.iter().zip(&names) {
                if let Attempt::Acquired(lease) = lock.try_acquire(&queued(name, 0)).await.unwrap()
                {
                    break 'outer lease;
                }
            }
            assert!(since.elapsed() < TAKEOVER_AFTER * 20, "never taken over");
            sleep(Duration::from_millis(20)).await;
        };
        assert!(
            written.elapsed() >= TAKEOVER_AFTER,
            "taken before the lease ran out"
        );
        assert_eq!(granted.record.holder, "w0", "the head, first to arrive");
        assert_eq!(granted.fence(), FenceToken(2));
    }

    #[tokio::test]
    async fn rule1_per_entry_a_dead_waiter_at_the_head_stops_blocking_after_its_waiter_lease() {
        let store = MemoryStore::new("mem://locks/queue-dead-waiter");
        let (la, dead, next) = (contender(&store), contender(&store), contender(&store));
        let a = acquired(&la, &queued("a", 0)).await;
        assert_eq!(waits(&dead, &queued("dead", 0)).await, Some(0));
        // Its last refresh: its waiter lease (the request's, 300 ms) counts from here.
        let refreshed = Instant::now();
        assert_eq!(waits(&next, &queued("next", 0)).await, Some(1));
        la.release(&a).await.unwrap();
        let since = Instant::now();
        let lease = loop {
            if let Attempt::Acquired(lease) = next.try_acquire(&queued("next", 0)).await.unwrap() {
                break lease;
            }
            assert!(
                since.elapsed() < TAKEOVER_AFTER * 20,
                "the dead waiter blocked for ever"
            );
            sleep(Duration::from_millis(20)).await;
        };
        assert!(
            refreshed.elapsed() >= TAKEOVER_AFTER,
            "a waiter dropped before its lease and the grace ran out"
        );
        assert_eq!(lease.record.holder, "next");
        assert!(stored_set(&store).queue.unwrap().waiters.is_empty());
    }

    #[tokio::test]
    async fn a_queued_contender_never_rewrites_a_key_held_without_a_queue() {
        let store = MemoryStore::new("mem://locks/queue-plain");
        let (la, lq) = (contender(&store), contender(&store));
        // A holder of the shape without queues (a build without them may be renewing
        // it): rewriting it into a queued set would make that holder lose its lock.
        let mut a = acquired(&la, &AcquireRequest::new("a", LEASE)).await;
        let version = store.stored().map(|s| s.version);
        assert_eq!(
            waits(&lq, &queued("q", 0)).await,
            None,
            "waits unregistered"
        );
        assert_eq!(
            store.stored().map(|s| s.version),
            version,
            "nothing written"
        );
        la.renew(&mut a).await.unwrap();
        la.release(&a).await.unwrap();
        // Released: the queued contender takes it, and the key is a queued set now,
        // continuing the fences.
        let q = acquired(&lq, &queued("q", 0)).await;
        assert_eq!(q.fence(), FenceToken(2));
        assert!(stored_set(&store).queue.is_some());
    }

    #[tokio::test]
    async fn a_contender_without_a_queue_joins_the_queue_a_key_has() {
        let store = MemoryStore::new("mem://locks/queue-join");
        let (la, l1, plain) = (contender(&store), contender(&store), contender(&store));
        let a = acquired(&la, &queued("a", 0)).await;
        assert_eq!(waits(&l1, &queued("w1", 0)).await, Some(0));
        let unqueued = AcquireRequest::new("plain", LEASE);
        assert_eq!(waits(&plain, &unqueued).await, Some(1));
        la.release(&a).await.unwrap();
        assert_eq!(waits(&plain, &unqueued).await, Some(1), "no overtaking");
        acquired(&l1, &queued("w1", 0)).await;
    }

    #[tokio::test]
    async fn waiters_keep_a_released_key_held_for_other_tools() {
        let store = MemoryStore::new("mem://locks/queue-summary");
        let (la, l1) = (contender(&store), contender(&store));
        let a = acquired(&la, &queued("a", 0)).await;
        waits(&l1, &queued("w1", 0)).await;
        la.release(&a).await.unwrap();
        let record = store.record();
        assert_eq!(
            record.state,
            LockState::Held,
            "the head is about to take it"
        );
        assert_eq!(record.holder, "queued: w1");
        let w1 = acquired(&l1, &queued("w1", 0)).await;
        l1.release(&w1).await.unwrap();
        assert_eq!(store.record().state, LockState::Released);
    }

    #[tokio::test]
    async fn abandoning_takes_the_registration_out_of_the_queue() {
        let store = MemoryStore::new("mem://locks/queue-abandon");
        let (la, l1) = (contender(&store), contender(&store));
        let _a = acquired(&la, &queued("a", 0)).await;
        waits(&l1, &queued("w1", 0)).await;
        assert_eq!(stored_set(&store).queue.unwrap().waiters.len(), 1);
        l1.abandon().await;
        assert!(stored_set(&store).queue.unwrap().waiters.is_empty());
    }

    #[test]
    fn a_queued_set_is_foreign_to_a_build_without_queues() {
        let mut set = HolderSet {
            permits: 1,
            queue: Some(Queue::default()),
            ..HolderSet::default()
        };
        set.holders.push(SetEntry::new(
            "a",
            FenceToken(1),
            LEASE,
            Mode::Exclusive,
            None,
        ));
        let json: serde_json::Value = serde_json::from_str(&set.to_json()).unwrap();
        // A build without queues requires `holders`: it reads this as foreign.
        assert!(json.get("holders").is_none(), "{json}");
        assert_eq!(json["granted"][0]["holder"], "a");
        assert_eq!(HolderSet::from_json(&set.to_json()).unwrap(), set);
        // A set without a queue keeps today's shape.
        set.queue = None;
        set.permits = 2;
        let json: serde_json::Value = serde_json::from_str(&set.to_json()).unwrap();
        assert!(json.get("granted").is_none() && json.get("holders").is_some());
        // The two shapes are not mixed, weights stay within the permits.
        let err = HolderSet::from_json(r#"{"permits":2,"granted":[]}"#).unwrap_err();
        assert!(err.what.contains("disagree"), "{err}");
        let mut heavy = SetEntry::new("h", FenceToken(1), LEASE, Mode::Shared, None);
        heavy.weight = 3;
        let over = HolderSet {
            permits: 2,
            holders: vec![heavy],
            queue: Some(Queue::default()),
            ..HolderSet::default()
        };
        let err = HolderSet::from_json(&over.to_json()).unwrap_err();
        assert!(err.what.contains("weight 3 on 2 permits"), "{err}");
    }

    #[test]
    fn a_full_queue_with_every_permit_held_fits_a_lease() {
        let name =
            |role: &str, i: usize| format!("cluster-{i:03}/namespace-of-a-team/{role}-{i:04}-job");
        let mut queue = Queue {
            next_ticket: 10_000_000,
            hold_ms: vec![3_600_000; Queue::HOLD_TIMES],
            ..Queue::default()
        };
        let mut set = HolderSet {
            permits: Permits::MAX,
            last_fence: FenceToken(u64::MAX / 2),
            ..HolderSet::default()
        };
        for i in 0..Permits::MAX as usize {
            let mut e = SetEntry::new(
                &name("holder", i),
                FenceToken(9_000_000 + i as u64),
                WAITER_LEASE,
                Mode::Shared,
                None,
            );
            e.ticket = 9_000_000 + i as u64;
            set.holders.push(e);
        }
        for i in 0..Queue::MAX_WAITERS {
            let mut e = SetEntry::new(
                &name("waiter", i),
                FenceToken(0),
                WAITER_LEASE,
                Mode::Shared,
                None,
            );
            (e.ticket, e.priority, e.overtaken) = (9_500_000 + i as u64, -1_000_000_000, 1000);
            queue.waiters.push(e);
        }
        set.queue = Some(queue);
        let bytes = set.to_json().len();
        assert!(bytes <= Queue::MAX_SET_BYTES, "{bytes} bytes");
    }

    #[test]
    fn queueing_validation_names_the_problem() {
        let q = |weight| Queueing {
            priority: 0,
            weight,
        };
        assert!(q(3).validate(Permits::semaphore(4)).is_ok());
        let err = q(5)
            .validate(Permits::semaphore(4))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("weight 5 is more than the key's 4 permits"),
            "{err}"
        );
        assert!(
            q(0).validate(Permits::semaphore(4))
                .unwrap_err()
                .to_string()
                .contains("at least 1")
        );
        let err = q(2)
            .validate(Permits {
                total: 4,
                mode: Mode::Exclusive,
            })
            .unwrap_err()
            .to_string();
        assert!(err.contains("exclusive"), "{err}");
    }

    #[test]
    fn the_expected_start_counts_the_holds_ahead() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut holder = SetEntry::new("h", FenceToken(1), LEASE, Mode::Exclusive, None);
        holder.acquired_at_ms = 1_000_000_000 - 4_000; // held 4 s
        let waiter = |name: &str, ticket| {
            let mut e = SetEntry::new(name, FenceToken(0), LEASE, Mode::Exclusive, None);
            e.ticket = ticket;
            e
        };
        let set = HolderSet {
            permits: 1,
            holders: vec![holder],
            queue: Some(Queue {
                next_ticket: 3,
                waiters: vec![waiter("w1", 1), waiter("w2", 2)],
                hold_ms: vec![8_000, 12_000],
                ..Queue::default()
            }),
            ..HolderSet::default()
        };
        let w2 = &set.queue.as_ref().unwrap().waiters[1];
        let view = QueueView::of(&set, &w2.nonce, now).unwrap();
        // Mean hold 10 s: the holder has 6 s left, then w1 holds 10 s.
        assert_eq!(view.expected_start, Some(now + Duration::from_secs(16)));
        assert_eq!((view.position, view.length), (1, 2));
    }
}

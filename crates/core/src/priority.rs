//! Whose request to a store this is: a holder's (renewing or releasing a lock it holds)
//! or a contender's (everything else); and [`RequestSlots`], the bound of requests in
//! flight that lets a holder's go first (docs/design.md §3, "Holders go first at the
//! bound"): a late renewal costs a held lock, a late acquisition only its wait. The AWS
//! stores bound their requests with it, and the controller its Kubernetes client's.
//!
//! The priority is carried by the task, not by the [`RecordStore`](crate::RecordStore)
//! calls: the holder task sets it around its renewal and release, and every store call
//! made inside them — by [`CasLock`](crate::CasLock), a permit's protocol, a store's own
//! retries — inherits it without each layer passing it on.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

tokio::task_local! {
    static CURRENT: RequestPriority;
}

/// Which waiting store requests go first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestPriority {
    /// Renewing or releasing a held lock: first.
    Holder,
    /// Acquiring, looking, waiting (the default): after every holder.
    Contender,
}

impl RequestPriority {
    /// The priority of the requests the current task makes: [`Contender`](Self::Contender)
    /// outside any [`scope`](Self::scope).
    pub fn current() -> RequestPriority {
        CURRENT
            .try_with(|priority| *priority)
            .unwrap_or(RequestPriority::Contender)
    }

    /// Runs `requests` with this priority.
    pub fn scope<F: Future>(self, requests: F) -> impl Future<Output = F::Output> {
        CURRENT.scope(self, requests)
    }
}

/// A bound of requests in flight whose waiters are served by [`RequestPriority`]: every
/// holder's request before any contender's, and within a class in the [`WaitOrder`]
/// given (tokio's `Semaphore` serves one queue, oldest first).
///
/// A slot freed while requests wait goes straight to the next waiter, so a waiter exists
/// only while no slot is free. A waiter that gives up (its caller dropped it, or its
/// wait timed out) leaves its place in the queue behind; the next slot freed skips it,
/// and a slot handed to it just as it gave up is freed again when the hand-off is
/// dropped.
#[derive(Debug)]
pub struct RequestSlots {
    order: WaitOrder,
    state: Mutex<SlotsState>,
}

/// Which waiter of a class a freed slot goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitOrder {
    /// Arrival order: for waits with no limit, where any other order could starve one.
    OldestFirst,
    /// For waits that each end at a deadline (a store request's attempt timeout, a
    /// renewal's request timeout). Behind a store that cannot keep up, oldest first
    /// serves only requests that have already waited nearly all of it, and an
    /// acquisition's second request (its create after its read) goes to the back and
    /// times out, so almost none completes. Newest first serves requests that can still
    /// finish and lets the oldest time out (*not sent*) and be tried again. With a short
    /// queue the order makes no difference.
    NewestFirst,
}

#[derive(Debug)]
struct SlotsState {
    free: usize,
    holders: VecDeque<oneshot::Sender<RequestSlot>>,
    contenders: VecDeque<oneshot::Sender<RequestSlot>>,
}

/// One request's right to be in flight; freed (to the next waiter) when dropped.
#[derive(Debug)]
pub struct RequestSlot {
    /// `None` once taken back without freeing (a hand-off nobody took).
    slots: Option<Arc<RequestSlots>>,
}

/// How a request gets its slot: at once, or when one is handed to it.
#[derive(Debug)]
pub enum Admission {
    Now(RequestSlot),
    /// Resolves with the slot when it is this request's turn.
    Queued(oneshot::Receiver<RequestSlot>),
}

impl RequestSlots {
    /// `count` slots (0 is taken as 1), each class's waiters served in `order`.
    pub fn new(count: usize, order: WaitOrder) -> Arc<RequestSlots> {
        Arc::new(RequestSlots {
            order,
            state: Mutex::new(SlotsState {
                free: count.max(1),
                holders: VecDeque::new(),
                contenders: VecDeque::new(),
            }),
        })
    }

    /// A slot now if one is free, else a place in `priority`'s queue.
    pub fn admit(self: &Arc<Self>, priority: RequestPriority) -> Admission {
        let mut state = self.state.lock().expect("request slots");
        if state.free > 0 {
            state.free -= 1;
            return Admission::Now(self.slot());
        }
        let (hand_off, handed) = oneshot::channel();
        match priority {
            RequestPriority::Holder => state.holders.push_back(hand_off),
            RequestPriority::Contender => state.contenders.push_back(hand_off),
        }
        Admission::Queued(handed)
    }

    /// Waits for a slot as `priority`.
    pub async fn acquire(self: &Arc<Self>, priority: RequestPriority) -> RequestSlot {
        match self.admit(priority) {
            Admission::Now(slot) => slot,
            Admission::Queued(handed) => handed.await.expect("the slots outlive their waiters"),
        }
    }

    fn next_of<T>(&self, waiters: &mut VecDeque<T>) -> Option<T> {
        match self.order {
            WaitOrder::OldestFirst => waiters.pop_front(),
            WaitOrder::NewestFirst => waiters.pop_back(),
        }
    }

    fn slot(self: &Arc<Self>) -> RequestSlot {
        RequestSlot {
            slots: Some(self.clone()),
        }
    }

    /// Gives a freed slot to the next waiter still waiting, holders first, or keeps it
    /// free.
    fn free_one(self: &Arc<Self>) {
        let mut state = self.state.lock().expect("request slots");
        let state = &mut *state;
        loop {
            let Some(next) = self
                .next_of(&mut state.holders)
                .or_else(|| self.next_of(&mut state.contenders))
            else {
                state.free += 1;
                return;
            };
            match next.send(self.slot()) {
                Ok(()) => return,
                // That waiter gave up: taken back without freeing it (this loop still
                // holds the lock), the slot goes to the next one.
                Err(mut unsent) => unsent.slots = None,
            }
        }
    }
}

impl Drop for RequestSlot {
    fn drop(&mut self) {
        if let Some(slots) = self.slots.take() {
            slots.free_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_scope_sets_the_priority_of_what_runs_inside_it_only() {
        assert_eq!(RequestPriority::current(), RequestPriority::Contender);
        let inside = RequestPriority::Holder
            .scope(async {
                tokio::task::yield_now().await;
                RequestPriority::current()
            })
            .await;
        assert_eq!(inside, RequestPriority::Holder);
        assert_eq!(RequestPriority::current(), RequestPriority::Contender);
    }

    fn now(admission: Admission) -> RequestSlot {
        match admission {
            Admission::Now(permit) => permit,
            Admission::Queued(_) => panic!("queued with a slot free"),
        }
    }

    fn queued(admission: Admission) -> oneshot::Receiver<RequestSlot> {
        match admission {
            Admission::Queued(received) => received,
            Admission::Now(_) => panic!("a slot while none was free"),
        }
    }

    fn free(slots: &RequestSlots) -> usize {
        slots.state.lock().unwrap().free
    }

    /// docs/design.md §3, "Holders go first at the bound": every holder's request
    /// before any contender's, in either order within a class.
    #[test]
    fn holders_go_first_at_the_bound() {
        for (order, first, second) in [
            (WaitOrder::OldestFirst, 0, 1),
            (WaitOrder::NewestFirst, 1, 0),
        ] {
            let slots = RequestSlots::new(1, order);
            let in_flight = now(slots.admit(RequestPriority::Contender));
            let mut contenders = [
                queued(slots.admit(RequestPriority::Contender)),
                queued(slots.admit(RequestPriority::Contender)),
            ];
            let mut holders = [
                queued(slots.admit(RequestPriority::Holder)),
                queued(slots.admit(RequestPriority::Holder)),
            ];
            let mut served = Vec::new();
            drop(in_flight);
            for _ in 0..4 {
                let waiting = holders.iter_mut().map(|h| ("holder", h));
                let waiting = waiting.chain(contenders.iter_mut().map(|c| ("contender", c)));
                let mut now_served = waiting
                    .enumerate()
                    .filter_map(|(i, (who, w))| w.try_recv().ok().map(|slot| (i % 2, who, slot)));
                let (i, who, slot) = now_served.next().expect("one waiter served");
                assert!(now_served.next().is_none(), "one slot, one waiter served");
                served.push((who, i));
                drop(slot);
            }
            assert_eq!(
                served,
                [
                    ("holder", first),
                    ("holder", second),
                    ("contender", first),
                    ("contender", second)
                ],
                "{order:?}"
            );
            assert_eq!(free(&slots), 1, "the slot is free again");
        }
    }

    #[test]
    fn a_contender_waiting_for_the_bound_is_served_once_no_holder_waits() {
        let slots = RequestSlots::new(2, WaitOrder::NewestFirst);
        let (a, b) = (
            now(slots.admit(RequestPriority::Holder)),
            now(slots.admit(RequestPriority::Contender)),
        );
        let mut contender = queued(slots.admit(RequestPriority::Contender));
        let mut holder = queued(slots.admit(RequestPriority::Holder));
        drop(a);
        let holder = holder.try_recv().expect("the holder first");
        drop(b);
        let contender = contender
            .try_recv()
            .expect("the contender with no holder waiting");
        drop((holder, contender));
        assert_eq!(free(&slots), 2);
    }

    #[test]
    fn a_waiter_that_gave_up_does_not_keep_a_permit() {
        let slots = RequestSlots::new(1, WaitOrder::NewestFirst);
        let in_flight = now(slots.admit(RequestPriority::Contender));
        let gave_up = queued(slots.admit(RequestPriority::Holder));
        let mut waiting = queued(slots.admit(RequestPriority::Contender));
        drop(gave_up);
        drop(in_flight);
        let permit = waiting.try_recv().expect("skips the one that gave up");
        // Handed to a waiter that then gives up without taking it: freed again.
        let late = queued(slots.admit(RequestPriority::Holder));
        drop(permit);
        assert_eq!(free(&slots), 0, "handed to the late waiter");
        drop(late);
        assert_eq!(free(&slots), 1, "freed when the hand-off was dropped");
        drop(now(slots.admit(RequestPriority::Contender)));
        assert_eq!(free(&slots), 1);
    }
}

//! The permits of a [`RequestGate`](super::RequestGate): a counting semaphore whose
//! waiters are served by [`RequestPriority`], every holder's request before any
//! contender's, each class in arrival order (docs/design.md §3, "Holders go first at
//! the bound"). tokio's `Semaphore` serves one queue in arrival order only.
//!
//! A permit freed while requests wait goes straight to the next waiter, so a waiter
//! exists only while no permit is free. A waiter that gives up (its caller dropped it,
//! or its wait timed out) leaves its slot in the queue behind; the next permit freed
//! skips it, and a permit handed to it just as it gave up is freed again when the
//! hand-off is dropped.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use lockwarden_core::RequestPriority;

#[derive(Debug)]
pub(super) struct Permits {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    free: usize,
    holders: VecDeque<oneshot::Sender<Permit>>,
    contenders: VecDeque<oneshot::Sender<Permit>>,
}

/// One request's right to be in flight; freed (to the next waiter) when dropped.
#[derive(Debug)]
pub(super) struct Permit {
    /// `None` once handed back without freeing (a hand-off nobody took).
    permits: Option<Arc<Permits>>,
}

/// How a request gets its permit: at once, or when one is handed to it.
pub(super) enum Admission {
    Now(Permit),
    Queued(oneshot::Receiver<Permit>),
}

impl Permits {
    pub(super) fn new(count: usize) -> Arc<Permits> {
        Arc::new(Permits {
            state: Mutex::new(State {
                free: count,
                holders: VecDeque::new(),
                contenders: VecDeque::new(),
            }),
        })
    }

    /// A permit now if one is free, else a place in `priority`'s queue.
    pub(super) fn admit(self: &Arc<Self>, priority: RequestPriority) -> Admission {
        let mut state = self.state.lock().expect("permits");
        if state.free > 0 {
            state.free -= 1;
            return Admission::Now(Permit {
                permits: Some(self.clone()),
            });
        }
        let (hand_off, received) = oneshot::channel();
        match priority {
            RequestPriority::Holder => state.holders.push_back(hand_off),
            RequestPriority::Contender => state.contenders.push_back(hand_off),
        }
        Admission::Queued(received)
    }

    /// Gives a freed permit to the first waiter still waiting, holders first, or
    /// keeps it free.
    fn free_one(self: &Arc<Self>) {
        let mut state = self.state.lock().expect("permits");
        loop {
            let Some(next) = state
                .holders
                .pop_front()
                .or_else(|| state.contenders.pop_front())
            else {
                state.free += 1;
                return;
            };
            let permit = Permit {
                permits: Some(self.clone()),
            };
            match next.send(permit) {
                Ok(()) => return,
                // That waiter gave up: the permit is not freed by its drop (this
                // loop still holds it), it goes to the next one.
                Err(mut unsent) => {
                    unsent.permits = None;
                }
            }
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(permits) = self.permits.take() {
            permits.free_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now(admission: Admission) -> Permit {
        match admission {
            Admission::Now(permit) => permit,
            Admission::Queued(_) => panic!("queued with a permit free"),
        }
    }

    fn queued(admission: Admission) -> oneshot::Receiver<Permit> {
        match admission {
            Admission::Queued(received) => received,
            Admission::Now(_) => panic!("a permit while none was free"),
        }
    }

    fn free(permits: &Permits) -> usize {
        permits.state.lock().unwrap().free
    }

    /// docs/design.md §3, "Holders go first at the bound".
    #[test]
    fn holders_go_first_at_the_bound() {
        let permits = Permits::new(1);
        let in_flight = now(permits.admit(RequestPriority::Contender));
        let mut first_contender = queued(permits.admit(RequestPriority::Contender));
        let mut second_contender = queued(permits.admit(RequestPriority::Contender));
        let mut first_holder = queued(permits.admit(RequestPriority::Holder));
        let mut second_holder = queued(permits.admit(RequestPriority::Holder));

        drop(in_flight);
        let holder = first_holder.try_recv().expect("the first holder goes next");
        assert!(second_holder.try_recv().is_err());
        assert!(first_contender.try_recv().is_err(), "a holder waits");
        drop(holder);
        let holder = second_holder.try_recv().expect("then the second");
        assert!(first_contender.try_recv().is_err(), "a holder waits");
        drop(holder);
        let contender = first_contender.try_recv().expect("then the contenders");
        assert!(second_contender.try_recv().is_err());
        drop(contender);
        drop(second_contender.try_recv().expect("in their order"));
        assert_eq!(free(&permits), 1, "the permit is free again");
    }

    #[test]
    fn a_contender_waiting_for_the_bound_is_served_once_no_holder_waits() {
        let permits = Permits::new(2);
        let (a, b) = (
            now(permits.admit(RequestPriority::Holder)),
            now(permits.admit(RequestPriority::Contender)),
        );
        let mut contender = queued(permits.admit(RequestPriority::Contender));
        let mut holder = queued(permits.admit(RequestPriority::Holder));
        drop(a);
        let holder = holder.try_recv().expect("the holder first");
        drop(b);
        let contender = contender
            .try_recv()
            .expect("the contender with no holder waiting");
        drop((holder, contender));
        assert_eq!(free(&permits), 2);
    }

    #[test]
    fn a_waiter_that_gave_up_does_not_keep_a_permit() {
        let permits = Permits::new(1);
        let in_flight = now(permits.admit(RequestPriority::Contender));
        let gave_up = queued(permits.admit(RequestPriority::Holder));
        let mut waiting = queued(permits.admit(RequestPriority::Contender));
        drop(gave_up);
        drop(in_flight);
        let permit = waiting.try_recv().expect("skips the one that gave up");
        // Handed to a waiter that then gives up without taking it: freed again.
        let late = queued(permits.admit(RequestPriority::Holder));
        drop(permit);
        assert_eq!(free(&permits), 0, "handed to the late waiter");
        drop(late);
        assert_eq!(free(&permits), 1, "freed when the hand-off was dropped");
        drop(now(permits.admit(RequestPriority::Contender)));
        assert_eq!(free(&permits), 1);
    }
}

//! Leave to send to a store whose requests in flight are bounded, taken before the
//! engine builds a request (docs/design.md §3, "Requests in flight are bounded").
//!
//! A store's bound (the AWS stores' `RequestGate`) makes requests wait for one of a
//! fixed number of slots. Waiting *inside* a store call, a holder's renewal keeps
//! everything the engine built for it: the next record (a clone with its history), the
//! engine's future and the store's. Behind an overloaded store every held lock has a
//! renewal waiting, so that is paid once per lock. The holder task therefore asks for
//! an [`Admission`] first, in a stage that carries nothing of the lease (`held.rs`,
//! `Pending::Admitting`), and builds the renewal once admitted; the requests the
//! renewal then sends to the same store (the write, and a read if its outcome is
//! unknown) go through on that admission without waiting again — they cannot take a
//! second slot, which would let holders that each hold one wait for each other
//! forever.
//!
//! The admission is carried by the task (a task-local, [`Admission::scope`]), so the
//! store layer's signatures stay as they are and a store without a bound has nothing
//! to do.

use std::any::Any;
use std::future::Future;
use tokio::time::Instant;

tokio::task_local! {
    static ADMITTED: Admission;
}

/// One slot of one store's bound, held by the task that waited for it.
pub struct Admission {
    /// Which bound the slot is of: only that store's requests pass on it.
    bound: usize,
    /// When the task asked for it: a write sent on it counts as sent then.
    asked: Instant,
    /// The slot itself, given back when the admission is dropped.
    _slot: Box<dyn Any + Send + Sync>,
}

impl Admission {
    /// A slot of the bound identified by `bound` (unique while the bound lives, e.g. its
    /// address), asked for at `asked`; `slot` is given back when this is dropped.
    pub fn new(bound: usize, asked: Instant, slot: Box<dyn Any + Send + Sync>) -> Self {
        Admission {
            bound,
            asked,
            _slot: slot,
        }
    }

    /// Runs `work` holding this admission: its requests to the bound that issued it go
    /// through without waiting; the slot is given back when `work` ends (or is dropped).
    pub async fn scope<F: Future>(self, work: F) -> F::Output {
        ADMITTED.scope(self, work).await
    }
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("bound", &self.bound)
            .field("asked", &self.asked)
            .finish_non_exhaustive()
    }
}

/// Whether the running task holds an admission of the bound `bound`.
pub fn holds(bound: usize) -> bool {
    ADMITTED.try_with(|a| a.bound == bound).unwrap_or(false)
}

/// The instant a write sent now counts as sent (rule 2): when the running task asked
/// for its admission, if it holds one, else now. So a renewal that waited for the
/// store's bound spends that wait from its own holder deadline, as it did when the wait
/// was inside the store call.
pub fn send_time() -> Instant {
    ADMITTED
        .try_with(|a| a.asked)
        .unwrap_or_else(|_| Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    struct Slot(Arc<AtomicBool>);
    impl Drop for Slot {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn an_admission_passes_its_own_bound_only_and_dates_the_send_from_the_ask() {
        let given_back = Arc::new(AtomicBool::new(false));
        let asked = Instant::now() - Duration::from_secs(3);
        let admission = Admission::new(7, asked, Box::new(Slot(given_back.clone())));
        assert!(!holds(7), "outside the scope nothing is held");
        let before = Instant::now();
        assert!(
            send_time() >= before,
            "without an admission a send is dated now"
        );
        admission
            .scope(async {
                assert!(holds(7));
                assert!(!holds(8), "another store's bound is not passed");
                assert_eq!(send_time(), asked);
                assert!(!given_back.load(Ordering::SeqCst));
            })
            .await;
        assert!(given_back.load(Ordering::SeqCst), "the slot is given back");
        assert!(!holds(7));
    }
}

//! The guard's reads of each lock's record: one at start, then one every poll from a
//! task of its own, each sent and answered on the guard's monotonic clock.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};

use super::deadline::{Read, Seen};
use lockwarden_core::LockBackend;

/// A task reading one lock, aborted when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One read, given up after `timeout` (a hung read must not hold the next one back).
pub(super) async fn read_once(backend: &dyn LockBackend, nonce: &str, timeout: Duration) -> Read {
    let sent = Instant::now();
    let seen = match tokio::time::timeout(timeout, backend.inspect()).await {
        Ok(Ok(stored)) => Seen::of(stored.as_ref(), nonce),
        Ok(Err(e)) => Seen::NoAnswer(e.to_string()),
        Err(_) => Seen::NoAnswer(format!(
            "no answer within {}",
            humantime::format_duration(timeout)
        )),
    };
    Read {
        sent,
        replied: Instant::now(),
        seen,
    }
}

/// A read of lock `index` every `poll` from `start`, each given up after `poll`, so one
/// read at most is in flight and a hung one costs one poll.
async fn read_every(
    index: usize,
    backend: Arc<dyn LockBackend>,
    nonce: String,
    poll: Duration,
    start: Instant,
    reads: mpsc::Sender<(usize, Read)>,
) {
    let mut next = start;
    loop {
        sleep_until(next).await;
        next = Instant::now() + poll;
        let read = read_once(backend.as_ref(), &nonce, poll).await;
        if reads.send((index, read)).await.is_err() {
            return;
        }
    }
}

/// Every lock's reader task, and the channel they send on, open while the guard runs
/// (the readers only end with the guard: dropped, the tasks are aborted).
pub(super) struct Readers {
    tasks: Vec<AbortOnDrop>,
    sender: mpsc::Sender<(usize, Read)>,
}

impl Readers {
    /// Readers for `locks` locks, and where their reads arrive, tagged with the index
    /// of the lock.
    pub(super) fn new(locks: usize) -> (Readers, mpsc::Receiver<(usize, Read)>) {
        let (sender, reads) = mpsc::channel(4 * locks);
        let readers = Readers {
            tasks: Vec::with_capacity(locks),
            sender,
        };
        (readers, reads)
    }

    /// Starts the reads of lock `index` ([`read_every`]).
    pub(super) fn start(
        &mut self,
        index: usize,
        backend: Arc<dyn LockBackend>,
        nonce: String,
        poll: Duration,
        start: Instant,
    ) {
        let reads = self.sender.clone();
        self.tasks.push(AbortOnDrop(tokio::spawn(read_every(
            index, backend, nonce, poll, start, reads,
        ))));
    }
}

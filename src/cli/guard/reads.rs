//! The guard's reads of each lock's record: one at start, then one every poll from a
//! task of its own, each sent and answered on the guard's monotonic clock.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
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

/// How often the first read of a lock is tried when it gets no answer, a second apart.
/// Before COMMAND starts a read that fails only delays it, and a guard starting beside a
/// busy node's other containers may wait seconds for its first connection (a TLS
/// handshake, a token to present): seen on a loaded 2-core node, a first read that
/// went unanswered for 5 s kept a Job from ever running.
const FIRST_READ_ATTEMPTS: u32 = 4;

/// The first read of the lock at `url`: [`read_once`] with the connect timeout, tried
/// again while it gets no answer, up to [`FIRST_READ_ATTEMPTS`] times. An answer that the
/// lock is not ours is final at once.
pub(super) async fn first_read(backend: &dyn LockBackend, nonce: &str, url: &str) -> Read {
    let mut attempt = 1;
    loop {
        let read = read_once(backend, nonce, lockwarden_core::CONNECT_TIMEOUT).await;
        match &read.seen {
            Seen::NoAnswer(cause) if attempt < FIRST_READ_ATTEMPTS => {
                tracing::warn!(%url, %cause, attempt, "the lock could not be read yet; trying again");
                attempt += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            _ => return read,
        }
    }
}

/// How often a lock is read while the guard hurries ([`Readers::hurry`]): a renewal it
/// asked for is due within milliseconds.
pub(super) const HURRIED_POLL: Duration = Duration::from_millis(25);

/// A read of lock `index` every `poll` from `start` (every [`HURRIED_POLL`] while
/// `hurry` names an instant to come), each given up after `poll`, so one read at most
/// is in flight and a hung one costs one poll.
async fn read_every(
    index: usize,
    backend: Arc<dyn LockBackend>,
    nonce: String,
    poll: Duration,
    start: Instant,
    reads: mpsc::Sender<(usize, Read)>,
    mut hurry: watch::Receiver<Option<Instant>>,
) {
    let mut next = start;
    loop {
        tokio::select! {
            () = sleep_until(next) => {}
            // Told to hurry: the next read goes now.
            Ok(()) = hurry.changed() => {
                hurry.borrow_and_update();
                next = Instant::now();
                continue;
            }
        }
        let now = Instant::now();
        let hurried = hurry.borrow().is_some_and(|until| now < until);
        next = now + if hurried { HURRIED_POLL } else { poll };
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
    hurry: Arc<watch::Sender<Option<Instant>>>,
}

impl Readers {
    /// Readers for `locks` locks, and where their reads arrive, tagged with the index
    /// of the lock.
    pub(super) fn new(locks: usize) -> (Readers, mpsc::Receiver<(usize, Read)>) {
        let (sender, reads) = mpsc::channel(4 * locks);
        let readers = Readers {
            tasks: Vec::with_capacity(locks),
            sender,
            hurry: Arc::new(watch::channel(None).0),
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
        let hurry = self.hurry.subscribe();
        self.tasks.push(AbortOnDrop(tokio::spawn(read_every(
            index, backend, nonce, poll, start, reads, hurry,
        ))));
    }

    /// Has every lock read at once and then every [`HURRIED_POLL`] until `for_`
    /// has passed (a renewal was asked for); the handle to do so from another task.
    pub(super) fn hurry(&self) -> impl Fn(Duration) + Send + 'static {
        let hurry = self.hurry.clone();
        move |for_| {
            hurry.send_replace(Some(Instant::now() + for_));
        }
    }

    /// Keeps `task` running until the readers end (with the guard).
    pub(super) fn alongside(&mut self, task: tokio::task::JoinHandle<()>) {
        self.tasks.push(AbortOnDrop(task));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockwarden_core::memory::{Fault, MemoryStore};
    use lockwarden_core::{AcquireRequest, Attempt, CasLock};

    /// Told to hurry, a reader reads at once and then every HURRIED_POLL until the
    /// instant it was given, then at its poll again. On paused time: every read is
    /// stamped with the instant it was sent.
    #[tokio::test(start_paused = true)]
    async fn a_hurried_reader_reads_at_once_and_every_hurried_poll_until_told() {
        let store = MemoryStore::new("mem://guard/hurried");
        let lock = CasLock::new(store.clone());
        let req = AcquireRequest::new("holder", Duration::from_secs(30));
        let Ok(Attempt::Acquired(lease)) = lock.try_acquire(&req).await else {
            panic!("acquire");
        };
        let poll = Duration::from_secs(1);
        let (mut readers, mut reads) = Readers::new(1);
        let start = Instant::now();
        readers.start(
            0,
            Arc::new(lock),
            lease.nonce().to_string(),
            poll,
            start + poll,
        );
        let hurry = readers.hurry();
        tokio::time::sleep(Duration::from_millis(300)).await;
        hurry(Duration::from_millis(200));
        let mut sent = Vec::new();
        while sent.len() < 12 {
            let (_, read) = reads.recv().await.expect("a read");
            sent.push((read.sent - start).as_millis());
        }
        // At once (300 ms), every 25 ms while hurried (the last scheduled from 475 ms, before
        // 500 ms), then a poll apart.
        assert_eq!(
            sent,
            [
                300, 325, 350, 375, 400, 425, 450, 475, 500, 1500, 2500, 3500
            ]
        );
    }

    #[tokio::test]
    async fn a_first_read_that_gets_no_answer_is_tried_again_and_an_answer_ends_it() {
        let store = MemoryStore::new("mem://guard");
        let lock = CasLock::new(store.clone());
        let req = AcquireRequest::new("holder", Duration::from_secs(30));
        let Ok(Attempt::Acquired(lease)) = lock.try_acquire(&req).await else {
            panic!("acquire");
        };
        tokio::time::pause();
        store.next_read(Fault::Unavailable);
        let (reads_before, _) = store.requests();
        let read = first_read(&lock, lease.nonce(), "mem://guard").await;
        assert!(matches!(read.seen, Seen::Ours { .. }), "{:?}", read.seen);
        let tried = store.requests().0 - reads_before;
        assert_eq!(tried, 2, "one read unanswered, then one answered");
        // An answer that it is not ours is final.
        let read = first_read(&lock, "another-acquisition", "mem://guard").await;
        assert!(matches!(read.seen, Seen::NotOurs(_)), "{:?}", read.seen);
        // Never an answer: given up after FIRST_READ_ATTEMPTS tries.
        for _ in 0..FIRST_READ_ATTEMPTS + 1 {
            store.next_read(Fault::Unavailable);
        }
        let (reads_before, _) = store.requests();
        let read = first_read(&lock, lease.nonce(), "mem://guard").await;
        assert!(matches!(read.seen, Seen::NoAnswer(_)), "{:?}", read.seen);
        let tried = store.requests().0 - reads_before;
        assert_eq!(tried, FIRST_READ_ATTEMPTS as usize);
    }
}

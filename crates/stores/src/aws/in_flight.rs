//! Requests in flight per AWS client, bounded (issue 45).
//!
//! Each request of an SDK client takes a connection of its own from the client's pool
//! for as long as it is in flight, and the pool opens a new one when none is idle. A
//! store that slows down therefore drew one socket per request waiting on it: 3,400–3,800
//! of them at 10,000 S3 locks, the footprint growing exactly when the store struggles.
//! A [`RequestGate`] lets at most [`requests_in_flight`] operations of one client
//! through at once; the others wait here, in order, and the waiting is counted
//! ([`InFlightStats`], the controller's `lockwarden_store_requests_waiting` and
//! `lockwarden_store_request_wait_seconds_total`). An operation sends one attempt at a
//! time (the SDK retries after the previous attempt ended), so the sockets in use stay
//! within the bound plus the connections still closing.
//!
//! The gate is *before* the SDK's call, not in its HTTP client: a request waiting inside
//! the SDK has already built its orchestrator state (configuration layers, interceptor
//! context, the signed request), about 10 KB, and 10,000 locks behind an overloaded
//! store kept that much each while they waited. Here an operation waits as the closure
//! that builds it; its SDK future is built (and boxed) only once it may go.
//!
//! A holder's renewal waits even earlier: the holder task asks the store for an
//! [`Admission`] (`RecordStore::admit`, [`RequestGate::admit`]) before it clones its
//! lease, and builds the renewal once admitted; the renewal's requests then go on the
//! admission's slot ([`RequestGate::run`] lets a task holding one through at once), so
//! a lock's waiting renewal keeps no next record and no engine or store future.
//!
//! Why waiting is safe: the engine takes a write's send time *before* it calls the store
//! (`CasLock`: `let sent = Instant::now()`), and the holder deadline counts from that
//! instant (docs/design.md, rule 2). A renewal that waits here therefore spends its own
//! deadline while it waits, and the holder still gives up before any contender can take
//! over; the bound can make a renewal late, never unsafe. A renewal that waited for its
//! admission counts as sent when it asked (`lockwarden_core::admission::send_time`), the
//! same instant. The wait is itself limited to the client's attempt timeout: past it
//! the operation fails as never sent.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lockwarden_core::admission::{self, Admission};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::DEFAULT_REQUESTS_IN_FLIGHT;

static REQUESTS_IN_FLIGHT: AtomicUsize = AtomicUsize::new(DEFAULT_REQUESTS_IN_FLIGHT);

/// Sets the bound of requests in flight per client for the clients built from now on
/// (the controller's `--store-requests-in-flight`); 0 is taken as 1.
pub fn set_requests_in_flight(limit: usize) {
    REQUESTS_IN_FLIGHT.store(limit.max(1), Ordering::Relaxed);
}

/// The bound of requests in flight per client that new clients get.
pub fn requests_in_flight() -> usize {
    REQUESTS_IN_FLIGHT.load(Ordering::Relaxed)
}

/// What the bounded clients of one service have done, summed over its clients.
#[derive(Debug, Default)]
pub struct InFlightStats {
    in_flight: AtomicU64,
    waiting: AtomicU64,
    waited: AtomicU64,
    wait_nanos: AtomicU64,
}

impl InFlightStats {
    pub const fn new() -> Self {
        InFlightStats {
            in_flight: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            waited: AtomicU64::new(0),
            wait_nanos: AtomicU64::new(0),
        }
    }

    /// Requests on the wire now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Requests waiting for the bound now.
    pub fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Requests that had to wait, since the process started.
    pub fn waited(&self) -> u64 {
        self.waited.load(Ordering::Relaxed)
    }

    /// Time requests spent waiting, since the process started.
    pub fn wait_time(&self) -> Duration {
        Duration::from_nanos(self.wait_nanos.load(Ordering::Relaxed))
    }
}

/// An operation that waited its whole limit for the bound and was never sent.
#[derive(Debug, thiserror::Error)]
#[error(
    "not sent: waited {waited:?} for one of the {limit} requests in flight to the store \
     (the store is slower than the locks on it need; see --store-requests-in-flight)"
)]
pub struct NotAdmitted {
    pub waited: Duration,
    pub limit: usize,
}

/// The requests in flight of one client: at most a fixed number of its operations at
/// once; see the module documentation. Cloned with the client it bounds.
#[derive(Debug, Clone)]
pub struct RequestGate {
    bound: Option<Arc<Bound>>,
}

#[derive(Debug)]
struct Bound {
    permits: Arc<Semaphore>,
    limit: usize,
    /// The longest an operation waits for a permit: the client's attempt timeout.
    wait_limit: Duration,
    stats: &'static InFlightStats,
}

impl RequestGate {
    /// At most `limit` operations at once (0 is taken as 1), each waiting at most
    /// `wait_limit`, counted in `stats`.
    pub fn bounded(limit: usize, wait_limit: Duration, stats: &'static InFlightStats) -> Self {
        let limit = limit.max(1);
        RequestGate {
            bound: Some(Arc::new(Bound {
                permits: Arc::new(Semaphore::new(limit)),
                limit,
                wait_limit,
                stats,
            })),
        }
    }

    /// No bound: for an SDK client the caller built and bounds itself (tests,
    /// benchmarks of the bare store).
    pub fn unbounded() -> Self {
        RequestGate { bound: None }
    }

    /// Runs the operation `build` makes once fewer than the bound are in flight. The
    /// operation's future is built only then, and boxed, so a waiting one holds only
    /// `build`'s captures. A task holding an [`Admission`] of this gate goes at once, on
    /// its admission's slot.
    pub async fn run<F, T>(&self, build: impl FnOnce() -> F) -> Result<T, NotAdmitted>
    where
        F: Future<Output = T>,
    {
        let Some(bound) = &self.bound else {
            return Ok(Box::pin(build()).await);
        };
        let slot = if admission::holds(bound.id()) {
            None
        } else {
            Some(bound.slot().await?)
        };
        bound.stats.in_flight.fetch_add(1, Ordering::Relaxed);
        let _in_flight = Decrement(&bound.stats.in_flight);
        let output = Box::pin(build()).await;
        drop(slot);
        Ok(output)
    }

    /// Waits for a slot, for requests the running task then sends within the
    /// admission's scope (`lockwarden_core::admission`). `None`: no bound, or the task
    /// already holds one of this gate.
    pub async fn admit(&self) -> Result<Option<Admission>, NotAdmitted> {
        let Some(bound) = &self.bound else {
            return Ok(None);
        };
        if admission::holds(bound.id()) {
            return Ok(None);
        }
        let asked = tokio::time::Instant::now();
        let slot = bound.slot().await?;
        Ok(Some(Admission::new(bound.id(), asked, Box::new(slot))))
    }
}

impl Bound {
    /// This bound's identity for admissions: its semaphore's address, unique while it
    /// lives (an admission keeps it alive through its slot).
    fn id(&self) -> usize {
        Arc::as_ptr(&self.permits) as usize
    }

    /// One of the permits, waiting at most the wait limit; the waiting is counted.
    async fn slot(&self) -> Result<OwnedSemaphorePermit, NotAdmitted> {
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            return Ok(permit);
        }
        let stats = self.stats;
        let began = Instant::now();
        stats.waiting.fetch_add(1, Ordering::Relaxed);
        // Leaves the count even when the caller drops this future.
        let waiting = Decrement(&stats.waiting);
        let permit =
            tokio::time::timeout(self.wait_limit, self.permits.clone().acquire_owned()).await;
        drop(waiting);
        let waited = began.elapsed();
        stats.waited.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        stats.wait_nanos.fetch_add(nanos, Ordering::Relaxed);
        match permit {
            Ok(permit) => Ok(permit.expect("the semaphore is never closed")),
            Err(_) => Err(NotAdmitted {
                waited,
                limit: self.limit,
            }),
        }
    }
}

/// Takes one off a counter when dropped: on every path out of a request, cancellation
/// included.
struct Decrement<'a>(&'a AtomicU64);

impl Drop for Decrement<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The most a store request's future may take while it waits for the gate, in bytes:
/// the closure that would build the request and the gate's own state, not the SDK's
/// input (each store's `a_request_waiting_for_the_gate_holds_no_sdk_input`).
#[cfg(test)]
const WAITING_REQUEST_MAX: usize = 1536;

/// Options for a client of an endpoint nothing answers on (127.0.0.1:1), for tests that
/// never send.
#[cfg(test)]
pub(crate) fn unreachable_endpoint() -> super::AwsOptions {
    super::AwsOptions {
        endpoint: Some("http://127.0.0.1:1".into()),
        region: Some("us-east-1".into()),
        credentials: Some(super::Credentials::new("key", "secret", None)),
        request_timeout: None,
    }
}

/// Checks that each of `store`'s requests (`kind`: its name in the message) is at most
/// [`WAITING_REQUEST_MAX`] bytes while it waits: its future is not polled here, so its
/// size is what a waiting request keeps.
#[cfg(test)]
pub(crate) fn assert_waiting_requests_are_small(
    store: &dyn lockwarden_core::RecordStore,
    kind: &str,
) {
    use lockwarden_core::{FenceToken, LockRecord, Version};
    let record = LockRecord::new_acquisition("a", FenceToken(1), Duration::from_secs(30), None);
    let version = Version("r1".into());
    let sizes = [
        ("read", std::mem::size_of_val(&*store.read())),
        ("create", std::mem::size_of_val(&*store.create(&record))),
        (
            "replace",
            std::mem::size_of_val(&*store.replace(&version, &record)),
        ),
        ("delete", std::mem::size_of_val(&*store.delete(&version))),
    ];
    for (op, size) in sizes {
        assert!(
            size <= WAITING_REQUEST_MAX,
            "a waiting {kind} {op} is {size} bytes"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task holding an admission sends all its requests on its one slot — with a
    /// bound of 1, a second slot would never come — while other tasks wait for it.
    #[tokio::test]
    async fn an_admitted_task_sends_on_its_slot_and_others_wait_for_it() {
        static STATS: InFlightStats = InFlightStats::new();
        let gate = RequestGate::bounded(1, Duration::from_secs(60), &STATS);
        let admission = gate.admit().await.unwrap().expect("a bounded gate admits");
        let other = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.run(|| async { "other" }).await })
        };
        let sent = admission
            .scope(async {
                assert!(gate.admit().await.unwrap().is_none(), "admitted already");
                let mut sent = Vec::new();
                for n in 0..3 {
                    let reply = tokio::time::timeout(
                        Duration::from_secs(30),
                        gate.run(|| async move { n }),
                    )
                    .await
                    .expect("sent on the admission's slot, without waiting")
                    .unwrap();
                    sent.push(reply);
                }
                tokio::time::timeout(Duration::from_secs(60), async {
                    while STATS.waiting() != 1 {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                })
                .await
                .expect("the other task waits for the slot");
                sent
            })
            .await;
        assert_eq!(sent, [0, 1, 2]);
        assert_eq!(other.await.unwrap().unwrap(), "other", "the slot came back");
        assert_eq!((STATS.waiting(), STATS.in_flight()), (0, 0));
    }

    #[tokio::test]
    async fn a_request_that_waits_past_its_limit_fails_as_never_sent() {
        static STATS: InFlightStats = InFlightStats::new();
        let gate = RequestGate::bounded(1, Duration::from_millis(200), &STATS);
        let (release, held) = tokio::sync::oneshot::channel::<()>();
        let first = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.run(|| held).await })
        };
        tokio::time::timeout(Duration::from_secs(60), async {
            while STATS.in_flight() != 1 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the first request in flight");
        let built = std::sync::atomic::AtomicBool::new(false);
        let second = gate
            .run(|| {
                built.store(true, Ordering::SeqCst);
                async {}
            })
            .await;
        let refused = second.expect_err("no permit came within its limit");
        assert_eq!(refused.limit, 1);
        assert!(refused.waited >= Duration::from_millis(200), "{refused:?}");
        assert!(
            refused.to_string().contains("not sent")
                && refused.to_string().contains("--store-requests-in-flight"),
            "{refused}"
        );
        assert!(!built.load(Ordering::SeqCst), "the request was never built");
        assert_eq!((STATS.waiting(), STATS.waited()), (0, 1));
        release.send(()).unwrap();
        first.await.unwrap().unwrap().unwrap();
        assert_eq!(STATS.in_flight(), 0);
    }
}

//! Requests in flight per AWS client, bounded (issue 45).
//!
//! Each request of an SDK client takes a connection of its own from the client's pool
//! for as long as it is in flight, and the pool opens a new one when none is idle. A
//! store that slows down therefore drew one socket per request waiting on it: 3,400–3,800
//! of them at 10,000 S3 locks, the footprint growing exactly when the store struggles.
//! [`BoundedHttpClient`] wraps the client's HTTP client so that at most
//! [`requests_in_flight`] requests of one client are on the wire; the others wait here,
//! in order, and the waiting is counted ([`InFlightStats`], the controller's
//! `lockwarden_store_requests_waiting` and `lockwarden_store_request_wait_seconds_total`).
//!
//! Why waiting is safe: the engine takes a write's send time *before* it calls the store
//! (`CasLock`: `let sent = Instant::now()`), and the holder deadline counts from that
//! instant (docs/design.md, rule 2). A renewal that waits here therefore spends its own
//! deadline while it waits, and the holder still gives up before any contender can take
//! over; the bound can make a renewal late, never unsafe. The SDK's attempt timeout
//! covers the wait too, so a request never waits longer than one attempt may take.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use tokio::sync::Semaphore;

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

/// The requests in flight of one client: its permits, and the service's counters.
#[derive(Debug)]
struct Bound {
    permits: Semaphore,
    stats: &'static InFlightStats,
}

/// An HTTP client that lets at most a fixed number of requests through at once; see the
/// module documentation.
#[derive(Debug, Clone)]
pub(crate) struct BoundedHttpClient {
    inner: SharedHttpClient,
    bound: Arc<Bound>,
}

impl BoundedHttpClient {
    /// `inner`, with at most `limit` requests in flight, counted in `stats`.
    pub(crate) fn new(
        inner: SharedHttpClient,
        limit: usize,
        stats: &'static InFlightStats,
    ) -> BoundedHttpClient {
        BoundedHttpClient {
            inner,
            bound: Arc::new(Bound {
                permits: Semaphore::new(limit.max(1)),
                stats,
            }),
        }
    }
}

impl HttpClient for BoundedHttpClient {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(BoundedConnector {
            inner: self.inner.http_connector(settings, components),
            bound: self.bound.clone(),
        })
    }
}

#[derive(Debug)]
struct BoundedConnector {
    inner: SharedHttpConnector,
    bound: Arc<Bound>,
}

impl HttpConnector for BoundedConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let inner = self.inner.clone();
        let bound = self.bound.clone();
        HttpConnectorFuture::new(async move {
            let stats = bound.stats;
            let permit = match bound.permits.try_acquire() {
                Ok(permit) => permit,
                Err(_) => {
                    let began = Instant::now();
                    stats.waiting.fetch_add(1, Ordering::Relaxed);
                    // Leaves the count even when the attempt's timeout drops this future.
                    let _waiting = Decrement(&stats.waiting);
                    let permit = bound
                        .permits
                        .acquire()
                        .await
                        .expect("the semaphore is never closed");
                    stats.waited.fetch_add(1, Ordering::Relaxed);
                    let waited = u64::try_from(began.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    stats.wait_nanos.fetch_add(waited, Ordering::Relaxed);
                    permit
                }
            };
            stats.in_flight.fetch_add(1, Ordering::Relaxed);
            let _in_flight = Decrement(&stats.in_flight);
            // The permit goes with the response's head. A small body follows at once on
            // the same connection, so the sockets in use stay within the bound plus the
            // responses whose bodies are still being read.
            let response = inner.call(request).await;
            drop(permit);
            response
        })
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

#[cfg(all(test, feature = "s3"))]
mod tests {
    use std::net::TcpListener;
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::aws::{AwsOptions, Credentials};

    /// A store that accepts connections and never answers: every request stays in
    /// flight. Returns its address and the connections it accepted.
    fn silent_store() -> (String, Arc<Mutex<Vec<std::net::TcpStream>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let address = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let kept = accepted.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                kept.lock().unwrap().push(stream);
            }
        });
        (address, accepted)
    }

    async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_beyond_the_bound_wait_without_opening_connections() {
        let (endpoint, accepted) = silent_store();
        let aws = AwsOptions {
            endpoint: Some(endpoint),
            region: Some("us-east-1".into()),
            credentials: Some(Credentials::new("key", "secret", None)),
            request_timeout: Some(Duration::from_secs(300)),
        };
        // Process-wide: read when a client is built, so only this test's client has it.
        set_requests_in_flight(3);
        let config = crate::s3::client_config(&aws, &Default::default()).await;
        set_requests_in_flight(DEFAULT_REQUESTS_IN_FLIGHT);
        let client = aws_sdk_s3::Client::from_conf(config.build());
        let stats = &crate::s3::IN_FLIGHT;
        let (in_flight_before, waiting_before) = (stats.in_flight(), stats.waiting());

        let requests: Vec<_> = (0..10)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move {
                    client
                        .get_object()
                        .bucket("b")
                        .key(format!("k{i}"))
                        .send()
                        .await
                })
            })
            .collect();
        eventually("3 requests on the wire and 7 waiting", || {
            stats.in_flight() - in_flight_before == 3 && stats.waiting() - waiting_before == 7
        })
        .await;
        eventually("the store to accept the 3 connections", || {
            accepted.lock().unwrap().len() == 3
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            accepted.lock().unwrap().len(),
            3,
            "the waiting requests opened no connection"
        );

        // A cancelled request (an attempt's timeout, a dropped renewal) leaves both counts.
        for request in &requests {
            request.abort();
        }
        eventually("the counts to return to where they were", || {
            stats.in_flight() == in_flight_before && stats.waiting() == waiting_before
        })
        .await;
    }
}

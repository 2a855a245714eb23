//! Observability of `lockwarden controller`: Prometheus metrics (`prometheus-client`,
//! OpenMetrics text) and a tiny HTTP/1.1 server for `/metrics`, `/healthz`, `/readyz`.
//!
//! Metrics:
//! - `lockwarden_locks{phase}`: locks this controller knows, by the phase it last wrote;
//! - `lockwarden_acquire_duration_seconds`: first acquisition attempt → `Held`;
//! - `lockwarden_renewals_total`: renewals of held locks that the store accepted;
//! - `lockwarden_renew_failures_total`: held locks whose renewals failed past the
//!   holder deadline (`Expiring`) or that were lost while held;
//! - `lockwarden_backend_request_duration_seconds{backend,operation}`: `try_acquire`
//!   and `release` calls made by the controller;
//! - `lockwarden_jobs_stopped_total{reason}`: gated Jobs suspended because their lock
//!   was no longer held (`reason`: the lock's `LeaseExpiring`, `Lost`, `LockDeleted`,
//!   `NotHeld`), counted once per stop.
//! - `lockwarden_pods_deleted_total{reason}`: gated Pods deleted for the same reasons
//!   (`lockwarden.io/on-lock-lost: delete`).
//! - `lockwarden_reconcile_errors_total{category}`: failed reconciles of DistributedLocks
//!   by what failed (`store_unavailable`, `conflict`, `invalid`, `kubernetes_api`: see
//!   `controller::reconcile::ErrorCategory`), counted by the error policy;
//! - `lockwarden_release_errors_total`: releases of a lock (or the look for it after a
//!   restart) that the store did not confirm, on every release path of the reconciler.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::api::LockPhase;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabels {
    backend: String,
    operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CategoryLabels {
    category: String,
}

type HistogramFamily = Family<BackendLabels, Histogram, fn() -> Histogram>;

fn request_histogram() -> Histogram {
    // 1 ms .. ~16 s
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// The controller's metrics and readiness; shared by reconciles and the HTTP server.
pub struct Telemetry {
    registry: Registry,
    locks: Family<PhaseLabels, Gauge>,
    acquire: Histogram,
    renewals: Counter,
    renew_failures: Counter,
    requests: HistogramFamily,
    jobs_stopped: Family<ReasonLabels, Counter>,
    pods_deleted: Family<ReasonLabels, Counter>,
    reconcile_errors: Family<CategoryLabels, Counter>,
    release_errors: Counter,
    /// Object (uid) → the phase counted for it in `locks`.
    phases: Mutex<HashMap<String, LockPhase>>,
    ready: AtomicBool,
}

impl Default for Telemetry {
    fn default() -> Self {
        Self::new()
    }
}

impl Telemetry {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let locks = Family::<PhaseLabels, Gauge>::default();
        registry.register(
            "lockwarden_locks",
            "DistributedLocks by phase",
            locks.clone(),
        );
        // 10 ms .. ~5.8 min
        let acquire = Histogram::new(exponential_buckets(0.01, 2.0, 16));
        registry.register(
            "lockwarden_acquire_duration_seconds",
            "Time from the first acquisition attempt to Held",
            acquire.clone(),
        );
        // The OpenMetrics encoder appends `_total`.
        let renewals = Counter::default();
        registry.register(
            "lockwarden_renewals",
            "Renewals of held locks that the store accepted",
            renewals.clone(),
        );
        let renew_failures = Counter::default();
        registry.register(
            "lockwarden_renew_failures",
            "Held locks whose renewals failed past the holder deadline, or that were lost",
            renew_failures.clone(),
        );
        let requests: HistogramFamily = Family::new_with_constructor(request_histogram);
        registry.register(
            "lockwarden_backend_request_duration_seconds",
            "Duration of backend requests made by the controller",
            requests.clone(),
        );
        let jobs_stopped = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "lockwarden_jobs_stopped",
            "Gated Jobs suspended because their lock was no longer held, by the lock's reason",
            jobs_stopped.clone(),
        );
        let pods_deleted = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "lockwarden_pods_deleted",
            "Gated Pods deleted because their lock was no longer held, by the lock's reason",
            pods_deleted.clone(),
        );
        let reconcile_errors = Family::<CategoryLabels, Counter>::default();
        registry.register(
            "lockwarden_reconcile_errors",
            "Failed reconciles of DistributedLocks, by category",
            reconcile_errors.clone(),
        );
        let release_errors = Counter::default();
        registry.register(
            "lockwarden_release_errors",
            "Releases of DistributedLocks that the store did not confirm",
            release_errors.clone(),
        );
        Telemetry {
            registry,
            locks,
            acquire,
            renewals,
            renew_failures,
            requests,
            jobs_stopped,
            pods_deleted,
            reconcile_errors,
            release_errors,
            phases: Mutex::default(),
            ready: AtomicBool::new(false),
        }
    }

    /// Counts a gated Job stopped (suspended) because its lock was no longer held.
    pub fn count_job_stopped(&self, reason: &str) {
        self.jobs_stopped
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Counts a gated Pod deleted because its lock was no longer held.
    pub fn count_pod_deleted(&self, reason: &str) {
        self.pods_deleted
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Counts a failed reconcile of a DistributedLock in its `category`.
    pub fn count_reconcile_error(&self, category: &str) {
        self.reconcile_errors
            .get_or_create(&CategoryLabels {
                category: category.to_string(),
            })
            .inc();
    }

    /// Counts a release the store did not confirm.
    pub fn count_release_error(&self) {
        self.release_errors.inc();
    }

    /// Records the phase of the object `uid` (`None`: forget it, e.g. deleted).
    pub fn set_phase(&self, uid: &str, phase: Option<LockPhase>) {
        let mut phases = self.phases.lock().expect("phases");
        let old = match phase {
            Some(p) => phases.insert(uid.to_string(), p),
            None => phases.remove(uid),
        };
        if old == phase {
            return;
        }
        if let Some(old) = old {
            self.gauge(old).dec();
        }
        if let Some(new) = phase {
            self.gauge(new).inc();
        }
    }

    fn gauge(&self, phase: LockPhase) -> Gauge {
        self.locks.get_or_create_owned(&PhaseLabels {
            phase: phase.to_string(),
        })
    }

    pub fn observe_acquire(&self, waited: Duration) {
        self.acquire.observe(waited.as_secs_f64());
    }

    /// The counter itself, for holder tasks.
    pub fn renewals(&self) -> Counter {
        self.renewals.clone()
    }

    /// The counter itself, for holder tasks.
    pub fn renew_failures(&self) -> Counter {
        self.renew_failures.clone()
    }

    pub fn observe_request(&self, backend: &str, operation: &str, took: Duration) {
        self.requests
            .get_or_create(&BackendLabels {
                backend: backend.to_string(),
                operation: operation.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The metrics in OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String");
        out
    }
}

/// Binds `addr` and serves `/metrics`, `/healthz` and `/readyz` on a task of its own.
/// Returns the bound address (useful with port 0).
pub async fn serve(addr: SocketAddr, telemetry: Arc<Telemetry>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tracing::info!(address = %bound, "serving /metrics, /healthz, /readyz");
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let telemetry = telemetry.clone();
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(
                            Duration::from_secs(10),
                            handle(stream, &telemetry),
                        )
                        .await;
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "metrics server: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    Ok(bound)
}

/// One request per connection: read the head, answer with Content-Length, close.
async fn handle(mut stream: TcpStream, telemetry: &Telemetry) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > 16 * 1024 {
            break;
        }
    }
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let text = "text/plain; charset=utf-8";
    let (status, content_type, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            telemetry.encode(),
        ),
        ("GET" | "HEAD", "/healthz") => ("200 OK", text, "ok\n".to_string()),
        ("GET" | "HEAD", "/readyz") if telemetry.is_ready() => ("200 OK", text, "ok\n".into()),
        ("GET" | "HEAD", "/readyz") => (
            "503 Service Unavailable",
            text,
            "not ready: DistributedLocks not listed yet\n".into(),
        ),
        ("GET" | "HEAD", _) => ("404 Not Found", text, "not found\n".into()),
        _ => (
            "405 Method Not Allowed",
            text,
            "method not allowed\n".into(),
        ),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if method != "HEAD" {
        response.extend_from_slice(body.as_bytes());
    }
    stream.write_all(&response).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        stream.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn readiness_and_phase_gauge() {
        let telemetry = Arc::new(Telemetry::new());
        let addr = serve(([127, 0, 0, 1], 0).into(), telemetry.clone())
            .await
            .unwrap();
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200 "));
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503 "));
        telemetry.set_ready();
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200 "));

        telemetry.set_phase("a", Some(LockPhase::Waiting));
        telemetry.set_phase("a", Some(LockPhase::Held));
        telemetry.set_phase("b", Some(LockPhase::Held));
        telemetry.set_phase("b", Some(LockPhase::Held));
        telemetry.set_phase("c", None);
        let metrics = get(addr, "/metrics").await;
        assert!(
            metrics.contains("lockwarden_locks{phase=\"Held\"} 2\n"),
            "{metrics}"
        );
        assert!(
            metrics.contains("lockwarden_locks{phase=\"Waiting\"} 0\n"),
            "{metrics}"
        );
        telemetry.set_phase("a", None);
        assert!(
            telemetry
                .encode()
                .contains("lockwarden_locks{phase=\"Held\"} 1\n")
        );
    }

    #[test]
    fn jobs_stopped_counts_by_reason() {
        let telemetry = Telemetry::new();
        telemetry.count_job_stopped("Lost");
        telemetry.count_job_stopped("Lost");
        telemetry.count_job_stopped("LeaseExpiring");
        let metrics = telemetry.encode();
        assert!(
            metrics.contains("lockwarden_jobs_stopped_total{reason=\"Lost\"} 2\n"),
            "{metrics}"
        );
        assert!(
            metrics.contains("lockwarden_jobs_stopped_total{reason=\"LeaseExpiring\"} 1\n"),
            "{metrics}"
        );
    }

    #[test]
    fn reconcile_errors_count_by_category_and_release_errors_in_total() {
        let telemetry = Telemetry::new();
        let metrics = telemetry.encode();
        assert!(
            metrics.contains("lockwarden_release_errors_total 0\n"),
            "{metrics}"
        );
        telemetry.count_reconcile_error("store_unavailable");
        telemetry.count_reconcile_error("store_unavailable");
        telemetry.count_reconcile_error("invalid");
        telemetry.count_release_error();
        let metrics = telemetry.encode();
        assert!(
            metrics
                .contains("lockwarden_reconcile_errors_total{category=\"store_unavailable\"} 2\n"),
            "{metrics}"
        );
        assert!(
            metrics.contains("lockwarden_reconcile_errors_total{category=\"invalid\"} 1\n"),
            "{metrics}"
        );
        assert!(
            metrics.contains("# TYPE lockwarden_reconcile_errors counter\n"),
            "{metrics}"
        );
        assert!(
            metrics.contains("lockwarden_release_errors_total 1\n"),
            "{metrics}"
        );
    }
}

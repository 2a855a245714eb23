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
//!
//! On-call metrics (docs/metrics.md has the full table, the loss-reason mapping and the
//! series count). Labelled by `namespace` and `backend` (`kubernetes`, `s3`,
//! `dynamodb`, `zookeeper`) only — never by lock name, so that the number of series
//! grows with namespaces, not with locks:
//! - `lockwarden_wait_duration_seconds{namespace,backend}`: histogram, wait → Held
//!   (0 when the key was free), observed at each acquisition;
//! - `lockwarden_hold_duration_seconds{namespace,backend}`: histogram, Held → the hold
//!   ended (released, lost, deleted, made invalid);
//! - `lockwarden_oldest_wait_seconds{namespace,backend}`: gauge, age of the oldest wait
//!   going on now (0 when none): histograms only see waits that ended;
//! - `lockwarden_expiring_seconds{namespace,backend}`: gauge, how long the lock that has
//!   been `LeaseExpiring` longest has been so (0 when none);
//! - `lockwarden_queue_length{namespace,backend}`: gauge, where the store reports a
//!   queue position (ZooKeeper; the others have no queue yet — a queue issue is
//!   planned): the queue as the furthest waiting lock of the pair sees it (its position,
//!   0 = next, plus one), 0 when none waits;
//! - `lockwarden_handoffs_total{namespace,backend}`: acquisitions after waiting for
//!   another holder (without force);
//! - `lockwarden_takeovers_total{namespace,backend}`: acquisitions by force
//!   (`spec.force`) of a key someone else held;
//! - `lockwarden_lock_losses_total{namespace,backend,reason}`: held locks lost, by
//!   [`LossReason`];
//! - `lockwarden_leader`: 1 on the replica that runs the controller, 0 on a standby.
//!
//! Every series of a (namespace, backend) pair is created, at zero, the first time a
//! lock of that pair has its status written, so that `rate()`/`increase()` and alerts
//! see a zero before the first event, and the series count is a formula of the pairs.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use lockwarden_api::LockPhase;

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

/// The only labels of the on-call metrics: bounded by namespaces × backends.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LockLabels {
    namespace: String,
    backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LossLabels {
    namespace: String,
    backend: String,
    reason: String,
}

/// Why a held lock was lost, for `lockwarden_lock_losses_total{reason}`. The controller
/// maps what it knows onto these (`controller::reconcile::loss_reason`; docs/metrics.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossReason {
    /// The lease ran out while the store was reachable (a ZooKeeper session expired,
    /// the record no longer carries our nonce, a lock not resumable after a restart).
    Expired,
    /// Someone took it by force while our renewals were succeeding.
    TakenOver,
    /// Renewals had been failing (`LeaseExpiring`) before the loss: the store could not
    /// be reached in time, whatever the store said when it answered again.
    StoreUnavailable,
    /// The record was deleted, released or replaced by someone else (a person with
    /// `lockwarden release --force`, `kubectl delete lease`, another tool).
    ReleasedByHand,
}

impl LossReason {
    pub const ALL: [LossReason; 4] = [
        LossReason::Expired,
        LossReason::TakenOver,
        LossReason::StoreUnavailable,
        LossReason::ReleasedByHand,
    ];

    /// The `reason` label.
    pub fn as_str(self) -> &'static str {
        match self {
            LossReason::Expired => "expired",
            LossReason::TakenOver => "taken_over",
            LossReason::StoreUnavailable => "store_unavailable",
            LossReason::ReleasedByHand => "released_by_hand",
        }
    }
}

/// What a status write said about a lock, for the on-call metrics.
#[derive(Clone, Copy, Debug)]
pub struct LockView<'a> {
    pub namespace: &'a str,
    pub backend: &'a str,
    pub phase: Option<LockPhase>,
    /// `status.waitingSince` while waiting.
    pub waiting_since: Option<SystemTime>,
    /// Held, but renewals failing past the holder deadline (`LeaseExpiring`).
    pub expiring: bool,
    /// The position a store with a queue (ZooKeeper) reported.
    pub queue_position: Option<u32>,
}

/// What the metrics keep about one lock (by uid) between status writes.
#[derive(Debug)]
struct Tracked {
    labels: LockLabels,
    waiting_since: Option<SystemTime>,
    expiring_since: Option<SystemTime>,
    queue_position: Option<u32>,
    /// Written `Waiting` since its last acquisition: the next one is a hand-off.
    waited: bool,
}

/// The code of the reconcile-error categories (`controller::reconcile::ErrorCategory`),
/// created at zero so that alerts on their rate see them before the first error.
const ERROR_CATEGORIES: [&str; 4] = ["store_unavailable", "conflict", "invalid", "kubernetes_api"];

type HistogramFamily = Family<BackendLabels, Histogram, fn() -> Histogram>;
type LockHistograms = Family<LockLabels, Histogram, fn() -> Histogram>;
type SecondsGauges = Family<LockLabels, Gauge<f64, AtomicU64>>;

/// Buckets of the wait and hold histograms: 0.1 s × 4^k, k = 0..9 (0.1 s .. ~7.3 h),
/// plus `+Inf`. Few on purpose: every bucket is a series per namespace and backend.
pub const LOCK_BUCKETS: usize = 10;

/// Series of one (namespace, backend) pair: two histograms (`LOCK_BUCKETS` + `+Inf`
/// buckets, `_sum`, `_count` each), the two live gauges, hand-offs, takeovers and one
/// loss counter per [`LossReason`]. A pair in which a waiting lock reported a queue
/// position has one more (`lockwarden_queue_length`). docs/metrics.md states the same
/// formula.
pub const SERIES_PER_PAIR: usize = 2 * (LOCK_BUCKETS + 3) + 2 + 2 + LossReason::ALL.len();

fn lock_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.1, 4.0, LOCK_BUCKETS as u16))
}

fn loss_labels(labels: &LockLabels, reason: LossReason) -> LossLabels {
    LossLabels {
        namespace: labels.namespace.clone(),
        backend: labels.backend.clone(),
        reason: reason.as_str().to_string(),
    }
}

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
    wait: LockHistograms,
    hold: LockHistograms,
    oldest_wait: SecondsGauges,
    expiring: SecondsGauges,
    queue_length: Family<LockLabels, Gauge>,
    handoffs: Family<LockLabels, Counter>,
    takeovers: Family<LockLabels, Counter>,
    losses: Family<LossLabels, Counter>,
    leader: Gauge,
    /// Object (uid) → the phase counted for it in `locks`.
    phases: Mutex<HashMap<String, LockPhase>>,
    /// Object (uid) → what the live gauges are computed from.
    tracked: Mutex<HashMap<String, Tracked>>,
    /// The (namespace, backend) pairs whose series exist.
    pairs: Mutex<HashSet<LockLabels>>,
    /// The pairs in which a waiting lock reported a queue position.
    queued: Mutex<HashSet<LockLabels>>,
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
        for category in ERROR_CATEGORIES {
            reconcile_errors
                .get_or_create(&CategoryLabels {
                    category: category.into(),
                })
                .inc_by(0);
        }
        let release_errors = Counter::default();
        registry.register(
            "lockwarden_release_errors",
            "Releases of DistributedLocks that the store did not confirm",
            release_errors.clone(),
        );
        let wait: LockHistograms = Family::new_with_constructor(lock_histogram);
        registry.register(
            "lockwarden_wait_duration_seconds",
            "Time from the start of a wait to Held (0 when the key was free), by namespace and backend",
            wait.clone(),
        );
        let hold: LockHistograms = Family::new_with_constructor(lock_histogram);
        registry.register(
            "lockwarden_hold_duration_seconds",
            "Time from Held to the end of the hold (released, lost, deleted), by namespace and backend",
            hold.clone(),
        );
        let oldest_wait = SecondsGauges::default();
        registry.register(
            "lockwarden_oldest_wait_seconds",
            "Age of the oldest wait going on now (0: none), by namespace and backend",
            oldest_wait.clone(),
        );
        let expiring = SecondsGauges::default();
        registry.register(
            "lockwarden_expiring_seconds",
            "How long the longest-expiring held lock has had renewals failing past its deadline (0: none)",
            expiring.clone(),
        );
        let queue_length = Family::<LockLabels, Gauge>::default();
        registry.register(
            "lockwarden_queue_length",
            "Waiting queue length as the furthest waiting lock sees it (stores with a queue: ZooKeeper)",
            queue_length.clone(),
        );
        let handoffs = Family::<LockLabels, Counter>::default();
        registry.register(
            "lockwarden_handoffs",
            "Acquisitions after waiting for another holder, without force",
            handoffs.clone(),
        );
        let takeovers = Family::<LockLabels, Counter>::default();
        registry.register(
            "lockwarden_takeovers",
            "Acquisitions by force (spec.force) of a key someone else held",
            takeovers.clone(),
        );
        let losses = Family::<LossLabels, Counter>::default();
        registry.register(
            "lockwarden_lock_losses",
            "Held locks lost, by namespace, backend and reason",
            losses.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "lockwarden_leader",
            "1 on the replica that runs the controller (the leader), 0 on a standby",
            leader.clone(),
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
            wait,
            hold,
            oldest_wait,
            expiring,
            queue_length,
            handoffs,
            takeovers,
            losses,
            leader,
            phases: Mutex::default(),
            tracked: Mutex::default(),
            pairs: Mutex::default(),
            queued: Mutex::default(),
            ready: AtomicBool::new(false),
        }
    }

    /// Whether this replica runs the controller (`lockwarden_leader`).
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Creates every series of the pair at zero, once (see the module doc).
    fn ensure_pair(&self, labels: &LockLabels) {
        let mut pairs = self.pairs.lock().expect("pairs");
        if pairs.contains(labels) {
            return;
        }
        self.wait.get_or_create_owned(labels);
        self.hold.get_or_create_owned(labels);
        self.oldest_wait.get_or_create_owned(labels);
        self.expiring.get_or_create_owned(labels);
        self.handoffs.get_or_create(labels).inc_by(0);
        self.takeovers.get_or_create(labels).inc_by(0);
        for reason in LossReason::ALL {
            self.losses
                .get_or_create(&loss_labels(labels, reason))
                .inc_by(0);
        }
        pairs.insert(labels.clone());
    }

    /// Records what a status write said about the object `uid`: its phase (as
    /// [`set_phase`](Self::set_phase)) and, for the live gauges, when its wait began,
    /// since when it has been expiring, its queue position.
    pub fn observe_status(&self, uid: &str, view: LockView<'_>) {
        self.set_phase(uid, view.phase);
        let labels = LockLabels {
            namespace: view.namespace.to_string(),
            backend: view.backend.to_string(),
        };
        self.ensure_pair(&labels);
        let mut tracked = self.tracked.lock().expect("tracked");
        let entry = tracked.entry(uid.to_string()).or_insert_with(|| Tracked {
            labels: labels.clone(),
            waiting_since: None,
            expiring_since: None,
            queue_position: None,
            waited: false,
        });
        entry.labels = labels;
        let waiting = view.phase == Some(LockPhase::Waiting);
        entry.waiting_since = if waiting {
            view.waiting_since
                .or(entry.waiting_since)
                .or_else(|| Some(SystemTime::now()))
        } else {
            None
        };
        entry.queue_position = view.queue_position.filter(|_| waiting);
        if entry.queue_position.is_some() {
            // The first position reported in a pair creates its queue-length series
            // (only stores with a queue report one: ZooKeeper today).
            let mut queued = self.queued.lock().expect("queued");
            if !queued.contains(&entry.labels) {
                self.queue_length.get_or_create_owned(&entry.labels);
                queued.insert(entry.labels.clone());
            }
        }
        entry.waited = match view.phase {
            Some(LockPhase::Waiting) => true,
            // A wait that ended without acquiring is not followed by a hand-off.
            Some(LockPhase::Released | LockPhase::Lost | LockPhase::Failed) => false,
            _ => entry.waited,
        };
        entry.expiring_since = if view.expiring {
            entry.expiring_since.or_else(|| Some(SystemTime::now()))
        } else {
            None
        };
    }

    /// Forgets the object `uid` (deleted): its phase and its part in the live gauges.
    pub fn forget(&self, uid: &str) {
        self.set_phase(uid, None);
        self.tracked.lock().expect("tracked").remove(uid);
    }

    /// Whether the object `uid` was last written as `LeaseExpiring`.
    pub fn was_expiring(&self, uid: &str) -> bool {
        let tracked = self.tracked.lock().expect("tracked");
        tracked.get(uid).is_some_and(|t| t.expiring_since.is_some())
    }

    /// An acquisition of the object `uid` after waiting `waited`: the wait histogram,
    /// and a hand-off (it had been `Waiting`) or a takeover (`forced`).
    pub fn count_acquired(
        &self,
        uid: &str,
        namespace: &str,
        backend: &str,
        waited: Duration,
        forced: bool,
    ) {
        let labels = LockLabels {
            namespace: namespace.to_string(),
            backend: backend.to_string(),
        };
        self.ensure_pair(&labels);
        self.wait
            .get_or_create(&labels)
            .observe(waited.as_secs_f64());
        let had_waited = {
            let mut tracked = self.tracked.lock().expect("tracked");
            tracked
                .get_mut(uid)
                .map(|t| std::mem::replace(&mut t.waited, false))
                .unwrap_or(false)
        };
        if forced {
            self.takeovers.get_or_create(&labels).inc();
        } else if had_waited {
            self.handoffs.get_or_create(&labels).inc();
        }
    }

    /// The end of a hold that began at `acquired_at` (wall clock: a resumed lock keeps
    /// the time of its acquisition).
    pub fn observe_hold(&self, namespace: &str, backend: &str, acquired_at: SystemTime) {
        let labels = LockLabels {
            namespace: namespace.to_string(),
            backend: backend.to_string(),
        };
        self.ensure_pair(&labels);
        let held = SystemTime::now()
            .duration_since(acquired_at)
            .unwrap_or_default();
        self.hold.get_or_create(&labels).observe(held.as_secs_f64());
    }

    /// A held lock lost for `reason`.
    pub fn count_loss(&self, namespace: &str, backend: &str, reason: LossReason) {
        let labels = LockLabels {
            namespace: namespace.to_string(),
            backend: backend.to_string(),
        };
        self.ensure_pair(&labels);
        self.losses
            .get_or_create(&loss_labels(&labels, reason))
            .inc();
    }

    /// Sets the live gauges from what is tracked now, for every known pair (0 where
    /// nothing waits or expires): called at each scrape, so their values are as of it.
    fn refresh_live_gauges(&self) {
        let now = SystemTime::now();
        let age = |since: SystemTime| now.duration_since(since).unwrap_or_default().as_secs_f64();
        let mut oldest: HashMap<LockLabels, f64> = HashMap::new();
        let mut expiring: HashMap<LockLabels, f64> = HashMap::new();
        let mut queue: HashMap<LockLabels, u32> = HashMap::new();
        for t in self.tracked.lock().expect("tracked").values() {
            if let Some(since) = t.waiting_since {
                let o = oldest.entry(t.labels.clone()).or_default();
                *o = o.max(age(since));
            }
            if let Some(since) = t.expiring_since {
                let e = expiring.entry(t.labels.clone()).or_default();
                *e = e.max(age(since));
            }
            if let Some(position) = t.queue_position {
                // Position 0 is the next in line: a queue of at least position + 1.
                let q = queue.entry(t.labels.clone()).or_default();
                *q = (*q).max(position.saturating_add(1));
            }
        }
        for labels in self.pairs.lock().expect("pairs").iter() {
            let get = |m: &HashMap<LockLabels, f64>| m.get(labels).copied().unwrap_or(0.0);
            self.oldest_wait.get_or_create(labels).set(get(&oldest));
            self.expiring.get_or_create(labels).set(get(&expiring));
        }
        for labels in self.queued.lock().expect("queued").iter() {
            let position = queue.get(labels).copied().unwrap_or(0);
            self.queue_length
                .get_or_create(labels)
                .set(i64::from(position));
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
        self.refresh_live_gauges();
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

    fn view<'a>(namespace: &'a str, backend: &'a str, phase: LockPhase) -> LockView<'a> {
        LockView {
            namespace,
            backend,
            phase: Some(phase),
            waiting_since: None,
            expiring: false,
            queue_position: None,
        }
    }

    /// Lines of the exposition whose series carry `namespace=`.
    fn labelled_series(metrics: &str) -> usize {
        metrics
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains("namespace=\""))
            .count()
    }

    #[test]
    fn series_per_pair_follow_the_formula_whatever_the_number_of_locks() {
        let telemetry = Telemetry::new();
        assert_eq!(labelled_series(&telemetry.encode()), 0);
        // Many locks in one (namespace, backend) pair: the series of one pair.
        for uid in 0..50 {
            telemetry.observe_status(&uid.to_string(), view("a", "s3", LockPhase::Held));
        }
        assert_eq!(
            labelled_series(&telemetry.encode()),
            SERIES_PER_PAIR,
            "{}",
            telemetry.encode()
        );
        telemetry.observe_status("z", view("a", "zookeeper", LockPhase::Waiting));
        assert_eq!(labelled_series(&telemetry.encode()), 2 * SERIES_PER_PAIR);
        let queued = LockView {
            queue_position: Some(1),
            ..view("a", "zookeeper", LockPhase::Waiting)
        };
        telemetry.observe_status("z", queued);
        assert_eq!(
            labelled_series(&telemetry.encode()),
            2 * SERIES_PER_PAIR + 1
        );
    }

    #[test]
    fn handoffs_takeovers_losses_and_live_gauges() {
        let telemetry = Telemetry::new();
        let waiting = LockView {
            waiting_since: Some(SystemTime::now() - Duration::from_secs(100)),
            queue_position: Some(3),
            ..view("ns", "zookeeper", LockPhase::Waiting)
        };
        telemetry.observe_status("b", waiting);
        let metrics = telemetry.encode();
        let oldest = metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix(
                    "lockwarden_oldest_wait_seconds{namespace=\"ns\",backend=\"zookeeper\"} ",
                )
            })
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{metrics}"));
        assert!(oldest >= 100.0, "{metrics}");
        assert!(
            metrics.contains("lockwarden_queue_length{namespace=\"ns\",backend=\"zookeeper\"} 4\n"),
            "{metrics}"
        );
        telemetry.count_acquired("b", "ns", "zookeeper", Duration::from_secs(100), false);
        telemetry.observe_status("b", view("ns", "zookeeper", LockPhase::Held));
        // Acquired without waiting, and by force: no hand-off, one takeover.
        telemetry.count_acquired("c", "ns", "zookeeper", Duration::ZERO, false);
        telemetry.count_acquired("d", "ns", "zookeeper", Duration::ZERO, true);
        telemetry.observe_status(
            "b",
            LockView {
                expiring: true,
                ..view("ns", "zookeeper", LockPhase::Held)
            },
        );
        assert!(telemetry.was_expiring("b"));
        telemetry.count_loss("ns", "zookeeper", LossReason::StoreUnavailable);
        telemetry.set_leader(true);
        let metrics = telemetry.encode();
        for line in [
            "lockwarden_oldest_wait_seconds{namespace=\"ns\",backend=\"zookeeper\"} 0.0\n",
            "lockwarden_queue_length{namespace=\"ns\",backend=\"zookeeper\"} 0\n",
            "lockwarden_handoffs_total{namespace=\"ns\",backend=\"zookeeper\"} 1\n",
            "lockwarden_takeovers_total{namespace=\"ns\",backend=\"zookeeper\"} 1\n",
            "lockwarden_wait_duration_seconds_count{namespace=\"ns\",backend=\"zookeeper\"} 3\n",
            "lockwarden_lock_losses_total{namespace=\"ns\",backend=\"zookeeper\",reason=\"store_unavailable\"} 1\n",
            "lockwarden_lock_losses_total{namespace=\"ns\",backend=\"zookeeper\",reason=\"taken_over\"} 0\n",
            "lockwarden_leader 1\n",
        ] {
            assert!(metrics.contains(line), "{line} in:\n{metrics}");
        }
        assert!(
            !metrics.contains(
                "lockwarden_expiring_seconds{namespace=\"ns\",backend=\"zookeeper\"} 0.0\n"
            ),
            "{metrics}"
        );
        telemetry.forget("b");
        assert!(
            telemetry.encode().contains(
                "lockwarden_expiring_seconds{namespace=\"ns\",backend=\"zookeeper\"} 0.0\n"
            )
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

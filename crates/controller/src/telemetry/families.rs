//! The metric families, their labels and buckets, and their registration: one group per
//! job, registered in the order `/metrics` lists them.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PhaseLabels {
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct BackendLabels {
    pub backend: String,
    pub operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StoreLabels {
    pub backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CategoryLabels {
    pub category: String,
}

/// The only labels of the on-call metrics: bounded by namespaces × backends.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct LockLabels {
    pub namespace: String,
    pub backend: String,
}

impl LockLabels {
    pub fn of(namespace: &str, backend: &str) -> LockLabels {
        LockLabels {
            namespace: namespace.to_string(),
            backend: backend.to_string(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct LossLabels {
    pub namespace: String,
    pub backend: String,
    pub reason: String,
}

impl LossLabels {
    pub fn of(labels: &LockLabels, reason: LossReason) -> LossLabels {
        LossLabels {
            namespace: labels.namespace.clone(),
            backend: labels.backend.clone(),
            reason: reason.as_str().to_string(),
        }
    }
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

fn request_histogram() -> Histogram {
    // 1 ms .. ~16 s
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// `metric`, registered in `registry` as `name` with `help`.
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// The locks and their work: phases, acquisitions, renewals, store requests.
pub(super) struct LockMetrics {
    pub locks: Family<PhaseLabels, Gauge>,
    pub acquire: Histogram,
    pub renewals: Counter,
    pub renew_failures: Counter,
    pub requests: HistogramFamily,
}

impl LockMetrics {
    pub fn register(registry: &mut Registry) -> LockMetrics {
        let locks = registered(
            registry,
            "lockwarden_locks",
            "DistributedLocks by phase",
            Family::default(),
        );
        let acquire = registered(
            registry,
            "lockwarden_acquire_duration_seconds",
            "Time from the first acquisition attempt to Held",
            // 10 ms .. ~5.8 min
            Histogram::new(exponential_buckets(0.01, 2.0, 16)),
        );
        // The OpenMetrics encoder appends `_total` to a counter's name.
        let renewals = registered(
            registry,
            "lockwarden_renewals",
            "Renewals of held locks that the store accepted",
            Counter::default(),
        );
        let renew_failures = registered(
            registry,
            "lockwarden_renew_failures",
            "Held locks whose renewals failed past the holder deadline, or that were lost",
            Counter::default(),
        );
        let requests = registered(
            registry,
            "lockwarden_backend_request_duration_seconds",
            "Duration of backend requests made by the controller",
            Family::new_with_constructor(request_histogram as fn() -> Histogram),
        );
        LockMetrics {
            locks,
            acquire,
            renewals,
            renew_failures,
            requests,
        }
    }
}

/// Gated workloads stopped because their lock was no longer held, by kind.
pub(super) struct StopCounters {
    pub jobs_stopped: Family<ReasonLabels, Counter>,
    pub pods_deleted: Family<ReasonLabels, Counter>,
}

impl StopCounters {
    pub fn register(registry: &mut Registry) -> StopCounters {
        StopCounters {
            jobs_stopped: registered(
                registry,
                "lockwarden_jobs_stopped",
                "Gated Jobs suspended because their lock was no longer held, by the lock's reason",
                Family::default(),
            ),
            pods_deleted: registered(
                registry,
                "lockwarden_pods_deleted",
                "Gated Pods deleted because their lock was no longer held, by the lock's reason",
                Family::default(),
            ),
        }
    }
}

/// Failed reconciles by category (each created at zero) and unconfirmed releases.
pub(super) struct ErrorCounters {
    pub reconcile_errors: Family<CategoryLabels, Counter>,
    pub release_errors: Counter,
}

impl ErrorCounters {
    pub fn register(registry: &mut Registry) -> ErrorCounters {
        let reconcile_errors: Family<CategoryLabels, Counter> = registered(
            registry,
            "lockwarden_reconcile_errors",
            "Failed reconciles of DistributedLocks, by category",
            Family::default(),
        );
        for category in ERROR_CATEGORIES {
            reconcile_errors
                .get_or_create(&CategoryLabels {
                    category: category.into(),
                })
                .inc_by(0);
        }
        let release_errors = registered(
            registry,
            "lockwarden_release_errors",
            "Releases of DistributedLocks that the store did not confirm",
            Counter::default(),
        );
        ErrorCounters {
            reconcile_errors,
            release_errors,
        }
    }
}

/// The on-call metrics, labelled by namespace and backend only (the module doc).
pub(super) struct OnCall {
    pub wait: LockHistograms,
    pub hold: LockHistograms,
    pub oldest_wait: SecondsGauges,
    pub expiring: SecondsGauges,
    pub queue_length: Family<LockLabels, Gauge>,
    pub handoffs: Family<LockLabels, Counter>,
    pub takeovers: Family<LockLabels, Counter>,
    pub losses: Family<LossLabels, Counter>,
}

impl OnCall {
    pub fn register(registry: &mut Registry) -> OnCall {
        let lock_histograms = || Family::new_with_constructor(lock_histogram as fn() -> Histogram);
        OnCall {
            wait: registered(
                registry,
                "lockwarden_wait_duration_seconds",
                "Time from the start of a wait to Held (0 when the key was free), by namespace and backend",
                lock_histograms(),
            ),
            hold: registered(
                registry,
                "lockwarden_hold_duration_seconds",
                "Time from Held to the end of the hold (released, lost, deleted), by namespace and backend",
                lock_histograms(),
            ),
            oldest_wait: registered(
                registry,
                "lockwarden_oldest_wait_seconds",
                "Age of the oldest wait going on now (0: none), by namespace and backend",
                SecondsGauges::default(),
            ),
            expiring: registered(
                registry,
                "lockwarden_expiring_seconds",
                "How long the longest-expiring held lock has had renewals failing past its deadline (0: none)",
                SecondsGauges::default(),
            ),
            queue_length: registered(
                registry,
                "lockwarden_queue_length",
                "Waiting queue length as the furthest waiting lock sees it (queued keys: ZooKeeper's, and S3, DynamoDB or Lease locks with spec.queue)",
                Family::default(),
            ),
            handoffs: registered(
                registry,
                "lockwarden_handoffs",
                "Acquisitions after waiting for another holder, without force",
                Family::default(),
            ),
            takeovers: registered(
                registry,
                "lockwarden_takeovers",
                "Acquisitions by force (spec.force) of a key someone else held",
                Family::default(),
            ),
            losses: registered(
                registry,
                "lockwarden_lock_losses",
                "Held locks lost, by namespace, backend and reason",
                Family::default(),
            ),
        }
    }
}

/// The store clients' bounded requests in flight (`--store-requests-in-flight`), read
/// from the stores' own counters whenever `/metrics` is encoded.
pub(super) struct StoreRequests {
    pub in_flight: Family<StoreLabels, Gauge>,
    pub waiting: Family<StoreLabels, Gauge>,
    pub waits: Family<StoreLabels, Counter>,
    pub wait_seconds: Family<StoreLabels, Counter<f64, AtomicU64>>,
}

impl StoreRequests {
    pub fn register(registry: &mut Registry) -> StoreRequests {
        StoreRequests {
            in_flight: registered(
                registry,
                "lockwarden_store_requests_in_flight",
                "Requests to the store on the wire now, by backend (S3 and DynamoDB: at most --store-requests-in-flight per client)",
                Family::default(),
            ),
            waiting: registered(
                registry,
                "lockwarden_store_requests_waiting",
                "Requests waiting in the controller for the bound of requests in flight, by backend",
                Family::default(),
            ),
            waits: registered(
                registry,
                "lockwarden_store_request_waits",
                "Requests that waited for the bound of requests in flight, by backend",
                Family::default(),
            ),
            wait_seconds: registered(
                registry,
                "lockwarden_store_request_wait_seconds",
                "Time requests spent waiting for the bound of requests in flight, by backend",
                Family::default(),
            ),
        }
    }
}

/// `lockwarden_leader`: whether this replica runs the controller.
pub(super) fn register_leader(registry: &mut Registry) -> Gauge {
    registered(
        registry,
        "lockwarden_leader",
        "1 on the replica that runs the controller (the leader), 0 on a standby",
        Gauge::default(),
    )
}

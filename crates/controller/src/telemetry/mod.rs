//! Observability of `lockwarden controller`: Prometheus metrics (`prometheus-client`,
//! OpenMetrics text) and a tiny HTTP/1.1 server for `/metrics`, `/healthz`, `/readyz`
//! ([`serve`]).
//!
//! Files: this one ([`Telemetry`], its construction, readiness and encoding),
//! `families.rs` (the metric families, their labels and buckets, registered one group
//! per job), `on_call.rs` (the on-call metrics per namespace and backend, and what the
//! controller tells them), `record.rs` (the other recording methods) and `server.rs`
//! (the HTTP endpoints).
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
//!   queue position — every ZooKeeper key (its entries are a queue), and keys with
//!   `spec.queue` on S3, DynamoDB and Leases (docs/design.md §6.4): the queue as the
//!   furthest waiting lock of the pair sees it (its position, 0 = next, plus one), 0
//!   when none waits;
//! - `lockwarden_handoffs_total{namespace,backend}`: acquisitions after waiting for
//!   another holder (without force);
//! - `lockwarden_takeovers_total{namespace,backend}`: acquisitions by force
//!   (`spec.force`) of a key someone else held;
//! - `lockwarden_lock_losses_total{namespace,backend,reason}`: held locks lost, by
//!   [`LossReason`];
//! - `lockwarden_leader`: 1 on the replica that runs the controller, 0 on a standby.
//! - `lockwarden_store_requests_in_flight{backend}`, `…_waiting{backend}` (gauges) and
//!   `lockwarden_store_request_waits_total{backend}`,
//!   `lockwarden_store_request_wait_seconds_total{backend}`: the S3 and DynamoDB
//!   clients' requests on the wire, and those waiting for `--store-requests-in-flight`
//!   (`lockwarden_stores::set_requests_in_flight`).
//!
//! Every series of a (namespace, backend) pair is created, at zero, the first time a
//! lock of that pair has its status written, so that `rate()`/`increase()` and alerts
//! see a zero before the first event, and the series count is a formula of the pairs.

mod families;
mod on_call;
mod record;
mod server;
#[cfg(test)]
mod tests;

pub use families::{LOCK_BUCKETS, LossReason, SERIES_PER_PAIR};
pub use on_call::LockView;
pub use server::serve;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use families::{ErrorCounters, LockLabels, LockMetrics, OnCall, StopCounters, StoreRequests};
use lockwarden_api::LockPhase;
use on_call::Tracked;

/// The controller's metrics and readiness; shared by reconciles and the HTTP server.
pub struct Telemetry {
    registry: Registry,
    lock: LockMetrics,
    stops: StopCounters,
    errors: ErrorCounters,
    on_call: OnCall,
    leader: Gauge,
    store_requests: StoreRequests,
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
    /// Every metric registered (in the order `/metrics` lists them), none counted yet,
    /// not ready.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let lock = LockMetrics::register(&mut registry);
        let stops = StopCounters::register(&mut registry);
        let errors = ErrorCounters::register(&mut registry);
        let on_call = OnCall::register(&mut registry);
        let leader = families::register_leader(&mut registry);
        let store_requests = StoreRequests::register(&mut registry);
        Telemetry {
            registry,
            lock,
            stops,
            errors,
            on_call,
            leader,
            store_requests,
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

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The metrics in OpenMetrics text format.
    pub fn encode(&self) -> String {
        self.refresh_live_gauges();
        self.refresh_store_requests();
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String");
        out
    }
}

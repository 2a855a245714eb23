//! What the controller records besides the on-call metrics: locks by phase, acquisition
//! latency, renewals, store request latency, errors, and gated workloads stopped.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use super::Telemetry;
use super::families::{BackendLabels, CategoryLabels, PhaseLabels, ReasonLabels};
use lockwarden_api::LockPhase;

impl Telemetry {
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
        self.lock.locks.get_or_create_owned(&PhaseLabels {
            phase: phase.to_string(),
        })
    }

    pub fn observe_acquire(&self, waited: Duration) {
        self.lock.acquire.observe(waited.as_secs_f64());
    }

    /// The counter itself, for holder tasks.
    pub fn renewals(&self) -> Counter {
        self.lock.renewals.clone()
    }

    /// The counter itself, for holder tasks.
    pub fn renew_failures(&self) -> Counter {
        self.lock.renew_failures.clone()
    }

    pub fn observe_request(&self, backend: &str, operation: &str, took: Duration) {
        self.lock
            .requests
            .get_or_create(&BackendLabels {
                backend: backend.to_string(),
                operation: operation.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    /// Counts a gated Job stopped (suspended) because its lock was no longer held.
    pub fn count_job_stopped(&self, reason: &str) {
        self.stops
            .jobs_stopped
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Counts a gated Pod deleted because its lock was no longer held.
    pub fn count_pod_deleted(&self, reason: &str) {
        self.stops
            .pods_deleted
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Counts a failed reconcile of a DistributedLock in its `category`.
    pub fn count_reconcile_error(&self, category: &str) {
        self.errors
            .reconcile_errors
            .get_or_create(&CategoryLabels {
                category: category.to_string(),
            })
            .inc();
    }

    /// Counts a release the store did not confirm.
    pub fn count_release_error(&self) {
        self.errors.release_errors.inc();
    }
}

impl Telemetry {
    /// Copies the stores' request counters (`lockwarden_stores::requests_in_flight_stats`)
    /// into their metrics; the counters only grow, so each is raised by what it gained.
    pub(super) fn refresh_store_requests(&self) {
        let metrics = &self.store_requests;
        for (kind, stats) in lockwarden_stores::requests_in_flight_stats() {
            let labels = super::families::StoreLabels {
                backend: kind.as_str().to_string(),
            };
            let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            metrics
                .in_flight
                .get_or_create(&labels)
                .set(gauge(stats.in_flight()));
            metrics
                .waiting
                .get_or_create(&labels)
                .set(gauge(stats.waiting()));
            let waits = metrics.waits.get_or_create(&labels);
            waits.inc_by(stats.waited().saturating_sub(waits.get()));
            let seconds = metrics.wait_seconds.get_or_create(&labels);
            seconds.inc_by((stats.wait_time().as_secs_f64() - seconds.get()).max(0.0));
        }
    }
}

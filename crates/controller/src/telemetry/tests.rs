//! The metrics' unit tests: series per pair, the on-call metrics through a scenario,
//! the counters.

use std::time::{Duration, SystemTime};

use super::*;

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
        !metrics
            .contains("lockwarden_expiring_seconds{namespace=\"ns\",backend=\"zookeeper\"} 0.0\n"),
        "{metrics}"
    );
    telemetry.forget("b");
    assert!(
        telemetry
            .encode()
            .contains("lockwarden_expiring_seconds{namespace=\"ns\",backend=\"zookeeper\"} 0.0\n")
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
        metrics.contains("lockwarden_reconcile_errors_total{category=\"store_unavailable\"} 2\n"),
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

#[test]
fn store_requests_in_flight_are_listed_per_bounded_backend_from_the_start() {
    // Created at each scrape from the stores' own counters, so that an alert on
    // `lockwarden_store_requests_waiting` sees a value before the first wait.
    let metrics = Telemetry::new().encode();
    for backend in ["s3", "dynamodb"] {
        for family in [
            "lockwarden_store_requests_in_flight",
            "lockwarden_store_requests_waiting",
            "lockwarden_store_request_waits_total",
            "lockwarden_store_request_wait_seconds_total",
        ] {
            let series = format!("{family}{{backend=\"{backend}\"}} ");
            assert!(
                metrics.lines().any(|l| l.starts_with(&series)),
                "no {series}in:\n{metrics}"
            );
        }
    }
    assert!(
        !metrics.contains("lockwarden_store_requests_in_flight{backend=\"zookeeper\"}"),
        "ZooKeeper has no bound: a session is one connection"
    );
}

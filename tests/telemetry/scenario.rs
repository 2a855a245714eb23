//! The on-call metrics on a real controller through a scripted scenario (acquire, wait,
//! hand-off, forced takeover, a record deleted by hand, a ZooKeeper queue, a loss
//! through the fault proxy), each metric asserted as it moves; the scrapes, captured
//! once a second, then drive `promtool test rules` over the chart's alerts, and the
//! last one must carry every metric and label the dashboard and the alerts reference.

use super::support::locks::{
    aws_secret, lease_lock_timed, patch_spec, s3_lock, timed, wait_acquired, wait_phase,
    zookeeper_backend,
};
use k8s_openapi::api::coordination::v1::Lease;
use lockwarden::api::LockPhase;
use lockwarden::controller::{LeaderElectionArgs, OnLostLeadership, run_elected_with};
use serde_json::json;

use super::monitoring::{self, Capture, Expected, labels, pair, value};
use super::*;

/// `monitoring.prometheusRule.waitingTooLong.thresholdSeconds` in these tests.
const WAIT_THRESHOLD: f64 = 3.0;

/// The chart's alerts with thresholds and `for` small enough for a test run (the
/// defaults are minutes: values, not code, decide them).
const TEST_VALUES: &[&str] = &[
    "monitoring.prometheusRule.leaseExpiring.for=0s",
    "monitoring.prometheusRule.waitingTooLong.thresholdSeconds=3",
    "monitoring.prometheusRule.waitingTooLong.for=0s",
    "monitoring.prometheusRule.backendErrors.threshold=0",
    "monitoring.prometheusRule.backendErrors.for=0s",
    "monitoring.prometheusRule.noLeader.for=0s",
];

const ALERTS: [&str; 5] = [
    "LockwardenLockLost",
    "LockwardenLeaseExpiring",
    "LockwardenWaitingTooLong",
    "LockwardenBackendErrorsRising",
    "LockwardenNoLeader",
];

/// A fresh namespace (with the CRD), an in-process controller watching it whose
/// /metrics is scraped from now on, and the namespace's locks.
async fn observed(prefix: &str) -> (kube::Client, String, Capture, Api<DistributedLock>) {
    // The engine's and the controller's warnings in a failing test's output.
    support::kube::test_logs();
    let (client, ns) = support::kube::namespace_with_crd(prefix).await;
    let port = start_controller(&client, &ns).await;
    let locks = Api::namespaced(client.clone(), &ns);
    (client, ns, Capture::start(port), locks)
}

/// An in-process controller watching `namespace`, serving /metrics; its port once ready.
async fn start_controller(client: &kube::Client, namespace: &str) -> u16 {
    let port = support::free_port();
    let config = support::kube::metrics_config("metrics", Some(namespace.to_string()), port);
    support::kube::spawn_controller(client.clone(), config);
    eventually("/readyz to be 200", TIMEOUT, || async {
        get(port, "/readyz").await.filter(|(c, _)| *c == 200)
    })
    .await;
    port
}

async fn create(locks: &Api<DistributedLock>, lock: DistributedLock) {
    support::kube::create(locks, &lock).await;
}

/// Creates `lock` and waits until it is Acquired.
async fn acquire(locks: &Api<DistributedLock>, lock: DistributedLock) {
    let name = lock.metadata.name.clone().expect("a named lock");
    create(locks, lock).await;
    wait_acquired(locks, &name, TIMEOUT).await;
}

fn is(body: &str, series: &str, expected: f64) -> bool {
    value(body, series) == Some(expected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_call_metrics_move_and_alerts_fire_through_a_scripted_scenario() {
    let (client, ns, capture, locks) = observed("metrics-scenario").await;
    let k8s = |name: &str| pair(name, &ns, "kubernetes");
    let s3 = |name: &str| pair(name, &ns, "s3");
    let zk = |name: &str| pair(name, &ns, "zookeeper");
    let loss = |backend: &str, reason: &str| {
        format!(
            "lockwarden_lock_losses_total{{namespace=\"{ns}\",backend=\"{backend}\",reason=\"{reason}\"}}"
        )
    };

    // 1. Acquire a free key: one wait observed (of ~0 s), no hand-off; this replica leads.
    acquire(&locks, lease_lock_timed("first", "k1", "30s", "1s")).await;
    capture
        .mark_when("the first acquisition to be counted", |m| {
            is(m, &k8s("lockwarden_wait_duration_seconds_count"), 1.0)
                && is(m, &k8s("lockwarden_handoffs_total"), 0.0)
                && is(m, &k8s("lockwarden_oldest_wait_seconds"), 0.0)
                && is(m, "lockwarden_leader", 1.0)
        })
        .await;

    // 2. Wait: a second lock on the same Lease; the oldest-wait gauge grows past the
    //    alert's threshold.
    create(&locks, lease_lock_timed("second", "k1", "30s", "1s")).await;
    wait_phase(&locks, "second", LockPhase::Waiting, TIMEOUT).await;
    let waited_long = capture
        .mark_when("the oldest wait to pass the threshold", |m| {
            value(m, &k8s("lockwarden_oldest_wait_seconds")).is_some_and(|v| v > WAIT_THRESHOLD)
        })
        .await;

    // 3. Hand-off: the first lets go; the second acquires after its wait.
    patch_spec(&locks, "first", json!({ "release": true })).await;
    wait_acquired(&locks, "second", TIMEOUT).await;
    capture
        .mark_when("a hand-off, a finished hold and no wait left", |m| {
            is(m, &k8s("lockwarden_handoffs_total"), 1.0)
                && is(m, &k8s("lockwarden_hold_duration_seconds_count"), 1.0)
                && is(m, &k8s("lockwarden_wait_duration_seconds_count"), 2.0)
                && is(m, &k8s("lockwarden_oldest_wait_seconds"), 0.0)
        })
        .await;

    // 4. Forced takeover: a third lock takes the Lease by force; the second loses it.
    let mut third = lease_lock_timed("third", "k1", "30s", "1s");
    third.spec.force = true;
    acquire(&locks, third).await;
    wait_phase(&locks, "second", LockPhase::Lost, TIMEOUT).await;
    capture
        .mark_when("a takeover and a loss by takeover", |m| {
            is(m, &k8s("lockwarden_takeovers_total"), 1.0)
                && is(m, &loss("kubernetes", "taken_over"), 1.0)
                && is(m, &k8s("lockwarden_handoffs_total"), 1.0)
                && is(m, &k8s("lockwarden_hold_duration_seconds_count"), 2.0)
        })
        .await;

    // 5. Released by hand: a held lock's Lease is deleted under it.
    acquire(&locks, lease_lock_timed("fourth", "k2", "30s", "1s")).await;
    support::kube::delete(&Api::<Lease>::namespaced(client.clone(), &ns), "k2").await;
    wait_phase(&locks, "fourth", LockPhase::Lost, TIMEOUT).await;
    capture
        .mark_when("a loss released by hand", |m| {
            is(m, &loss("kubernetes", "released_by_hand"), 1.0)
        })
        .await;

    // 6. A ZooKeeper queue: the waiter's position is the queue length; deleting the
    //    holder hands the key over.
    let zookeeper = tokio::task::spawn_blocking(support::zookeeper::ZooKeeper::shared)
        .await
        .unwrap();
    let path = format!("/{}/queue", support::unique("metrics"));
    let on_zookeeper = |name: &str| {
        let mut lock = lease_lock_timed(name, "unused", "30s", "5s");
        lock.spec.backend = zookeeper_backend(&zookeeper.connect_string(), &path);
        lock
    };
    acquire(&locks, on_zookeeper("zk-first")).await;
    create(&locks, on_zookeeper("zk-second")).await;
    wait_phase(&locks, "zk-second", LockPhase::Waiting, TIMEOUT).await;
    capture
        .mark_when("the queue length of the ZooKeeper waiter", |m| {
            value(m, &zk("lockwarden_queue_length")).is_some_and(|v| v >= 1.0)
        })
        .await;
    support::kube::delete(&locks, "zk-first").await;
    wait_acquired(&locks, "zk-second", TIMEOUT).await;
    capture
        .mark_when("the ZooKeeper hand-off and an empty queue", |m| {
            is(m, &zk("lockwarden_handoffs_total"), 1.0)
                && is(m, &zk("lockwarden_queue_length"), 0.0)
                && is(m, &zk("lockwarden_oldest_wait_seconds"), 0.0)
        })
        .await;
    // Let the ZooKeeper key go now, with a release: the rest of the scenario runs for a
    // minute on a loaded machine, and a session that expired there would be a loss the
    // alert expectations below do not list.
    support::kube::delete(&locks, "zk-second").await;
    support::eventually("zk-second released and gone", TIMEOUT, || async {
        locks
            .get_opt("zk-second")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;

    // 7. A loss through the fault proxy: S3 (moto) behind a partitioning proxy. The
    //    renewals fail (LeaseExpiring: the gauge rises), a contender reaching S3
    //    directly takes the key once the lease has run out, and when the proxy heals
    //    the holder learns it lost: store_unavailable, since its renewals had failed.
    let moto = tokio::task::spawn_blocking(support::moto::Moto::shared)
        .await
        .unwrap();
    let secret = aws_secret(&client, &ns).await;
    let bucket = moto.new_bucket("metrics").await;
    let proxy = support::proxy::Proxy::start(moto.port());
    let held = s3_lock("held", &bucket, "locks/k", proxy.endpoint(), &secret.name);
    // A 10 s lease: each renewal may take 2.5 s (a quarter of it), a write and a read
    // on a loaded machine's shared moto, so that once the proxy heals one gets through.
    acquire(&locks, timed(held, "10s", "2s")).await;
    proxy.set_mode(support::proxy::Mode::Blackhole);
    let expiring_at = capture
        .mark_when("the expiring gauge to rise", |m| {
            value(m, &s3("lockwarden_expiring_seconds")).is_some_and(|v| v > 0.0)
        })
        .await;
    let errors_at = capture
        .mark_when("a renew failure to be counted", |m| {
            value(m, "lockwarden_renew_failures_total").is_some_and(|v| v >= 1.0)
        })
        .await;
    let contender = s3_lock(
        "contender",
        &bucket,
        "locks/k",
        moto.endpoint(),
        &secret.name,
    );
    acquire(&locks, timed(contender, "10s", "2s")).await;
    proxy.set_mode(support::proxy::Mode::Pass);
    wait_phase(&locks, "held", LockPhase::Lost, TIMEOUT).await;
    let lost_at = capture
        .mark_when(
            "a loss by an unavailable store, and no lease expiring",
            |m| {
                is(m, &loss("s3", "store_unavailable"), 1.0)
                    && is(m, &s3("lockwarden_expiring_seconds"), 0.0)
                    && is(m, &s3("lockwarden_handoffs_total"), 1.0)
                    && is(m, &loss("s3", "taken_over"), 0.0)
            },
        )
        .await;
    let last = capture.latest();
    let scrapes = capture.stop();

    // Every metric and label the dashboard and the alerts reference is exposed.
    let groups = monitoring::rendered_rules(TEST_VALUES);
    let mut expressions = monitoring::dashboard_expressions();
    expressions.extend(
        monitoring::rules(&groups)
            .iter()
            .map(|r| r["expr"].as_str().expect("expr").to_string()),
    );
    monitoring::assert_referenced_names_are_exposed(&expressions, &last);

    // Each alert fires where the scenario should fire it, and not before.
    let k8s_pair = |reason: &str| {
        labels(&[
            ("namespace", ns.as_str()),
            ("backend", "kubernetes"),
            ("reason", reason),
        ])
    };
    let expected = vec![
        Expected {
            at: waited_long,
            alert: "LockwardenWaitingTooLong",
            firing: vec![labels(&[
                ("namespace", ns.as_str()),
                ("backend", "kubernetes"),
            ])],
        },
        Expected {
            at: waited_long,
            alert: "LockwardenLockLost",
            firing: vec![],
        },
        Expected {
            at: waited_long,
            alert: "LockwardenLeaseExpiring",
            firing: vec![],
        },
        Expected {
            at: expiring_at,
            alert: "LockwardenLeaseExpiring",
            firing: vec![labels(&[("namespace", ns.as_str()), ("backend", "s3")])],
        },
        Expected {
            at: errors_at,
            alert: "LockwardenBackendErrorsRising",
            firing: vec![labels(&[])],
        },
        Expected {
            at: lost_at,
            alert: "LockwardenLockLost",
            firing: vec![
                k8s_pair("released_by_hand"),
                k8s_pair("taken_over"),
                labels(&[
                    ("namespace", ns.as_str()),
                    ("backend", "s3"),
                    ("reason", "store_unavailable"),
                ]),
            ],
        },
        Expected {
            at: scrapes.len() - 1,
            alert: "LockwardenNoLeader",
            firing: vec![],
        },
    ];
    monitoring::promtool_test(
        &monitoring::promtool_dir("scenario"),
        &groups,
        &scrapes,
        &expected,
    );
}

/// A quiet controller (one lock held, nothing else happening) fires no alert; a
/// standby (another identity holds the leader Lease) fires `LockwardenNoLeader`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_controller_fires_no_alert_and_a_standby_fires_no_leader() {
    let (client, ns, capture, locks) = observed("metrics-quiet").await;
    acquire(&locks, lease_lock_timed("quiet", "k", "30s", "2s")).await;
    let held = capture
        .mark_when("the held lock to be counted", |m| {
            is(m, "lockwarden_locks{phase=\"Held\"}", 1.0)
        })
        .await;
    // A few more scrapes of nothing happening.
    eventually("five more scrapes", TIMEOUT, || async {
        (capture.scraped() > held + 5).then_some(())
    })
    .await;
    let scrapes = capture.stop();
    let groups = monitoring::rendered_rules(TEST_VALUES);
    let quiet: Vec<Expected> = ALERTS
        .iter()
        .map(|alert| Expected {
            at: scrapes.len() - 1,
            alert,
            firing: vec![],
        })
        .collect();
    monitoring::promtool_test(
        &monitoring::promtool_dir("quiet"),
        &groups,
        &scrapes,
        &quiet,
    );

    // A standby: the leader Lease is held (and fresh) under another identity.
    let lease_name = support::unique("metrics-leader");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": { "name": lease_name },
        "spec": {
            "holderIdentity": "someone-else",
            "leaseDurationSeconds": 3600,
            "acquireTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(k8s_openapi::jiff::Timestamp::now()),
            "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(k8s_openapi::jiff::Timestamp::now()),
        },
    }))
    .unwrap();
    Api::<Lease>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
    let standby_port = support::free_port();
    let config = support::kube::metrics_config("metrics", Some(ns.clone()), standby_port);
    let election = LeaderElectionArgs {
        leader_elect: true,
        leader_election_namespace: ns.clone(),
        leader_election_lease: lease_name,
        leader_election_lease_duration: Duration::from_secs(15),
        leader_election_identity: Some("standby".into()),
    };
    // Not `run_elected`: an election that ends would exit this whole test binary.
    tokio::spawn(run_elected_with(
        client.clone(),
        config,
        election,
        OnLostLeadership::Return,
    ));
    let standby = Capture::start(standby_port);
    let at = standby
        .mark_when("the standby to say it does not lead", |m| {
            is(m, "lockwarden_leader", 0.0)
        })
        .await;
    let scrapes = standby.stop();
    let no_leader = [Expected {
        at,
        alert: "LockwardenNoLeader",
        firing: vec![labels(&[])],
    }];
    monitoring::promtool_test(
        &monitoring::promtool_dir("standby"),
        &groups,
        &scrapes,
        &no_leader,
    );
}

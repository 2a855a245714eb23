//! The number of series of the on-call metrics is a formula of (namespace, backend)
//! pairs, not of locks: many locks across many namespaces and all four backends, on a
//! control plane of the test's own with a controller watching every namespace.
//!
//! The size the issue names: 1,000 locks across 100 namespaces, 10 per namespace over
//! the four backends (3, 3, 2, 2). It runs in under a minute on the 2-core test
//! machine (long leases: no renewal during the test), so the suite runs it in full.

use super::support::kube::{
    ControlPlane, create, install_lockwarden_crd, metrics_config, spawn_controller,
};
use super::support::locks::{
    acquired, aws_secret, dynamodb_backend, lease_lock, lock_on, s3_lock, zookeeper_backend,
};
use kube::api::ListParams;
use lockwarden::api::SecretRef;
use lockwarden::telemetry::SERIES_PER_PAIR;

use super::monitoring::samples;
use super::*;

const BACKENDS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_count_follows_the_formula_across_namespaces_and_backends() {
    let (namespaces, per_namespace) = (100, 10);
    // docs/metrics.md states the formula with this number.
    assert_eq!(SERIES_PER_PAIR, 34);
    let plane = tokio::task::spawn_blocking(ControlPlane::start)
        .await
        .unwrap();
    let client = plane.client().await;
    install_lockwarden_crd(&client).await;
    // Both servers start at once. The moto is this test's own: its 500 S3 and DynamoDB
    // acquisitions in a burst would otherwise slow the shared one for a minute on a
    // loaded machine, past the request timeout of the scenario's short S3 lease, which
    // then cannot learn in time that it lost (a CI failure).
    let (moto, zookeeper) = tokio::join!(
        tokio::task::spawn_blocking(support::moto::Moto::start),
        tokio::task::spawn_blocking(support::zookeeper::ZooKeeper::shared),
    );
    let (moto, zookeeper) = (moto.unwrap(), zookeeper.unwrap());
    let bucket = moto.new_bucket("cardinality").await;
    let table = moto.new_table("cardinality", "key").await;
    let root = format!("/{}", support::unique("cardinality"));

    let port = support::free_port();
    spawn_controller(client.clone(), metrics_config("cardinality", None, port));

    let mut apis = Vec::new();
    for n in 0..namespaces {
        let ns = plane.namespace(&client, "cardinality").await;
        let SecretRef { name: secret } = aws_secret(&client, &ns).await;
        let locks = Api::<DistributedLock>::namespaced(client.clone(), &ns);
        for j in 0..per_namespace {
            let name = format!("card-lock-{n}-{j}");
            let key = format!("{ns}/{name}");
            let secret_ref = SecretRef {
                name: secret.clone(),
            };
            // Each backend as the fixtures spell it (moto path-style, with the Secret).
            let backend = match j % BACKENDS {
                0 => lease_lock(&name, &name).spec.backend,
                1 => {
                    s3_lock(&name, &bucket, &key, moto.endpoint(), &secret)
                        .spec
                        .backend
                }
                2 => dynamodb_backend(&table, &key, moto.endpoint(), secret_ref),
                _ => zookeeper_backend(&zookeeper.connect_string(), &format!("{root}/{key}")),
            };
            // Long leases: renewals of many locks must not load the machine.
            let lock = lock_on(&name, backend, "120s", "40s");
            create(&locks, &lock).await;
        }
        apis.push(locks);
    }
    let total = namespaces * per_namespace;
    eventually(
        &format!("all {total} locks to be acquired"),
        Duration::from_secs(600),
        || async {
            let mut held = 0;
            for locks in &apis {
                held += locks
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .iter()
                    .filter(|l| acquired(l))
                    .count();
            }
            (held == total).then_some(())
        },
    )
    .await;

    let (_, body) = get(port, "/metrics").await.expect("/metrics");
    let all = samples(&body);
    let labelled = all.keys().filter(|s| s.contains("namespace=\"")).count();
    let pairs = namespaces * BACKENDS;
    eprintln!(
        "{total} locks in {namespaces} namespaces: {labelled} series labelled by namespace \
         ({pairs} pairs × {SERIES_PER_PAIR}), {} series in all",
        all.len()
    );
    assert_eq!(
        labelled,
        pairs * SERIES_PER_PAIR,
        "series labelled by namespace: {pairs} pairs × {SERIES_PER_PAIR} (nothing waited, so \
         no queue-length series) expected; /metrics:\n{body}"
    );
    assert!(
        !body.contains("card-lock-"),
        "a lock's name is in /metrics:\n{body}"
    );
}

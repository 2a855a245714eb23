//! The number of series of the on-call metrics is a formula of (namespace, backend)
//! pairs, not of locks: many locks across many namespaces and all four backends, on a
//! control plane of the test's own with a controller watching every namespace.
//!
//! The size the issue names: 1,000 locks across 100 namespaces, 10 per namespace over
//! the four backends (3, 3, 2, 2). It runs in under a minute on the 2-core test
//! machine (long leases: no renewal during the test), so the suite runs it in full.

use super::support::kube::{ControlPlane, install_lockwarden_crd};
use super::support::locks::{acquired, aws_secret, lock_on};
use kube::api::ListParams;
use lockwarden::api::{
    BackendSpec, DynamoDbBackend, KubernetesBackend, S3Backend, SecretRef, ZooKeeperBackend,
};
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
    let moto = tokio::task::spawn_blocking(support::moto::Moto::shared)
        .await
        .unwrap();
    let zookeeper = tokio::task::spawn_blocking(support::zookeeper::ZooKeeper::shared)
        .await
        .unwrap();
    let bucket = moto.new_bucket("cardinality").await;
    let table = moto.new_table("cardinality", "key").await;
    let root = format!("/{}", support::unique("cardinality"));

    let port = support::free_port();
    let config = ControllerConfig {
        cluster_name: "cardinality".into(),
        namespace: None,
        metrics_address: Some(([127, 0, 0, 1], port).into()),
        ..Default::default()
    };
    tokio::spawn(controller::run(client.clone(), config));

    let mut apis = Vec::new();
    for n in 0..namespaces {
        let ns = plane.namespace(&client, "cardinality").await;
        let SecretRef { name: secret } = aws_secret(&client, &ns).await;
        let locks = Api::<DistributedLock>::namespaced(client.clone(), &ns);
        for j in 0..per_namespace {
            let name = format!("card-lock-{n}-{j}");
            let key = format!("{ns}/{name}");
            let secret_ref = Some(SecretRef {
                name: secret.clone(),
            });
            let backend = match j % BACKENDS {
                0 => BackendSpec {
                    kubernetes: Some(KubernetesBackend {
                        lease_name: name.clone(),
                        namespace: None,
                    }),
                    ..Default::default()
                },
                1 => BackendSpec {
                    s3: Some(S3Backend {
                        bucket: bucket.clone(),
                        key: key.clone(),
                        region: Some(support::moto::REGION.into()),
                        endpoint: Some(moto.endpoint()),
                        force_path_style: Some(true),
                        s3lock_compatible: None,
                        credentials_secret_ref: secret_ref,
                    }),
                    ..Default::default()
                },
                2 => BackendSpec {
                    dynamodb: Some(DynamoDbBackend {
                        table: table.clone(),
                        key: key.clone(),
                        region: Some(support::moto::REGION.into()),
                        endpoint: Some(moto.endpoint()),
                        credentials_secret_ref: secret_ref,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                _ => BackendSpec {
                    zookeeper: Some(ZooKeeperBackend {
                        servers: zookeeper
                            .connect_string()
                            .split(',')
                            .map(String::from)
                            .collect(),
                        path: format!("{root}/{key}"),
                        chroot: None,
                        session_timeout: None,
                    }),
                    ..Default::default()
                },
            };
            // Long leases: renewals of many locks must not load the machine.
            let lock = lock_on(&name, backend, "120s", "40s");
            locks
                .create(&PostParams::default(), &lock)
                .await
                .unwrap_or_else(|e| panic!("create {ns}/{name}: {e}"));
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

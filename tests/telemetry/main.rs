//! `lockwarden controller` observability: /healthz, /readyz and /metrics of an
//! in-process controller against a real API server, with a Kubernetes-Lease lock;
//! [`scenario`]: the on-call metrics through a scripted scenario and the chart's alerts
//! evaluated by `promtool test rules` over its scrapes; [`cardinality`]: the series
//! count across namespaces and backends.

mod cardinality;
mod monitoring;
mod scenario;
use lockwarden_testsupport as support;

use std::time::Duration;

use kube::api::{Api, PostParams};
use lockwarden::api::conditions::{self, ACQUIRED};
use lockwarden::api::{BackendSpec, DistributedLock, DistributedLockSpec, KubernetesBackend};
use support::eventually;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Generous: the test machine is a loaded 2-core box.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(90);

/// `GET path` over HTTP/1.1: (status code, body), or `None` if not reachable.
pub(crate) async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response))
        .await
        .ok()?
        .ok()?;
    let response = String::from_utf8(response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))?
        .trim()
        .parse()
        .ok()?;
    assert_eq!(length, body.len(), "Content-Length of {path}");
    Some((code, body.to_string()))
}

/// The value of the sample `name` (with its labels, as exposed) in `metrics`.
fn sample(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix(name)?
            .strip_prefix(' ')?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_health_and_readiness() {
    let (client, namespace) = support::kube::namespace_with_crd("telemetry").await;
    let port = support::free_port();
    let config = support::kube::metrics_config("test-cluster", Some(namespace.clone()), port);
    support::kube::spawn_controller(client.clone(), config);

    let (code, _) = eventually("/healthz to answer", TIMEOUT, || get(port, "/healthz")).await;
    assert_eq!(code, 200);
    eventually("/readyz to be 200", TIMEOUT, || async {
        get(port, "/readyz").await.filter(|(c, _)| *c == 200)
    })
    .await;
    let (code, _) = get(port, "/nothing-here").await.expect("404 page");
    assert_eq!(code, 404);

    let locks = Api::<DistributedLock>::namespaced(client.clone(), &namespace);
    let lock = DistributedLock::new(
        "db",
        DistributedLockSpec {
            backend: BackendSpec {
                kubernetes: Some(KubernetesBackend {
                    lease_name: "db-lease".into(),
                    namespace: None,
                }),
                ..Default::default()
            },
            lease_duration: "30s".into(),
            // Short, so that renewals are counted within the test.
            renew_interval: "1s".into(),
            ..Default::default()
        },
    );
    support::kube::create(&locks, &lock).await;
    eventually("db to be Acquired", TIMEOUT, || async {
        let lock = locks.get("db").await.ok()?;
        conditions::is_true(&lock.status?.conditions, ACQUIRED).then_some(())
    })
    .await;

    let metrics = eventually("/metrics to count the held lock", TIMEOUT, || async {
        let (code, body) = get(port, "/metrics").await?;
        assert_eq!(code, 200);
        (sample(&body, "lockwarden_locks{phase=\"Held\"}") == Some(1.0)).then_some(body)
    })
    .await;
    let acquires = sample(&metrics, "lockwarden_acquire_duration_seconds_count")
        .unwrap_or_else(|| panic!("no acquire histogram in:\n{metrics}"));
    assert!(acquires >= 1.0, "{metrics}");
    assert!(
        metrics.contains("lockwarden_renew_failures_total 0"),
        "{metrics}"
    );
    eventually("/metrics to count renewals", TIMEOUT, || async {
        let (_, body) = get(port, "/metrics").await?;
        (sample(&body, "lockwarden_renewals_total")? >= 2.0).then_some(())
    })
    .await;
    assert!(
        metrics.contains(
            "lockwarden_backend_request_duration_seconds_count{backend=\"kubernetes\",operation=\"acquire\"}"
        ),
        "{metrics}"
    );
}

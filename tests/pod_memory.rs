//! Pod gating watches only gated Pods (docs/design.md §6.1 "Any Pod": a server-side
//! label selector, never every Pod of the cluster). Shown by memory: the controller,
//! run as the built binary, cluster-wide, has its resident set measured (VmRSS from
//! /proc) with no other Pods in the cluster and again with 5,000 ungated, unlabelled
//! Pods; the growth must stay within 10 MB. A controller that cached those Pods
//! would hold every one of them (several KB each as stored, more once parsed).
//!
//! Its own test binary: creating 5,000 Pods takes the API server a while, and the
//! controller is cluster-wide, so it must not see other tests' objects.

use lockwarden_testsupport as support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use lockwarden::api::DistributedLock;
use lockwarden::controller::gating::{FENCE_ANNOTATION, TEMPLATE_ANNOTATION};
use lockwarden::controller::pods::has_gate;
use serde_json::json;
use support::cli::Cli;
use support::eventually;
use support::kube::{ControlPlane, gated_pod, namespace_with_crd};
use support::locks::lease_lock;

/// Generous: the test machine is a loaded 2-core box.
const TIMEOUT: Duration = Duration::from_secs(120);
const CROWD: usize = 5_000;
const MAX_GROWTH_KB: u64 = 10 * 1024;

/// The resident set of process `pid`, in KiB.
fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}

/// An ordinary Pod, as a Deployment of some other application would make it: labels,
/// annotations, a few environment variables; no lockwarden gate or label.
fn crowd_pod(i: usize) -> Pod {
    let env: Vec<_> = (0..8)
        .map(|e| json!({ "name": format!("SETTING_{e}"), "value": format!("value-{i}-{e}") }))
        .collect();
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("crowd-{i}"),
            "labels": { "app": "crowd", "tier": "backend", "shard": format!("s{}", i % 16) },
            "annotations": { "example.com/build": "0123456789abcdef".repeat(8) },
        },
        "spec": {
            "containers": [{
                "name": "app", "image": "registry.example.com/crowd/app:1.2.3",
                "args": ["--port=8080", "--verbose"], "env": env,
                "resources": { "requests": { "cpu": "10m", "memory": "16Mi" } },
            }],
        },
    }))
    .unwrap()
}

/// Creates a template lock and a gated Pod on it in `ns`, and waits until the
/// controller has ungated the Pod: its Pod watch is live and has caught up.
async fn probe(client: &kube::Client, ns: &str, name: &str) {
    let mut template = lease_lock(name, name);
    template.spec.release = true;
    Api::<DistributedLock>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    pods.create(
        &PostParams::default(),
        &gated_pod(name, &[(TEMPLATE_ANNOTATION, name)], true, true),
    )
    .await
    .unwrap();
    eventually(
        &format!("probe Pod {name} to be ungated"),
        TIMEOUT,
        || async {
            let pod = pods.get(name).await.ok()?;
            (!has_gate(&pod) && pod.annotations().contains_key(FENCE_ANNOTATION)).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_memory_does_not_grow_with_ungated_pods() {
    let (client, gated) = namespace_with_crd("mem-gated").await;
    let crowd = ControlPlane::shared().namespace(&client, "mem-crowd").await;

    let cli = Cli::kube();
    let controller = cli.spawn(&[
        "controller",
        "--cluster-name",
        "mem",
        "--metrics-address",
        "127.0.0.1:0",
    ]);
    let pid = controller.id().expect("controller pid");
    probe(&client, &gated, "before").await;
    let before = rss_kb(pid);

    let started = Instant::now();
    let pods = Api::<Pod>::namespaced(client.clone(), &crowd);
    let created = futures::stream::iter(0..CROWD)
        .map(|i| {
            let pods = pods.clone();
            async move {
                let pod = crowd_pod(i);
                // A loaded API server may answer 429/5xx: try again.
                for _ in 0..20 {
                    if pods.create(&PostParams::default(), &pod).await.is_ok() {
                        return true;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                false
            }
        })
        .buffer_unordered(48)
        .filter(|ok| futures::future::ready(*ok))
        .count()
        .await;
    assert_eq!(created, CROWD, "could not create every Pod");
    eprintln!("created {CROWD} ungated Pods in {:?}", started.elapsed());

    // The controller has seen everything up to now: a Pod gated after the crowd was
    // ungated.
    probe(&client, &gated, "after").await;
    let after = rss_kb(pid);
    eprintln!(
        "controller VmRSS: {before} kB with no other Pods, {after} kB with {CROWD} ungated \
         Pods (growth {} kB, allowed {MAX_GROWTH_KB} kB)",
        after as i64 - before as i64
    );
    assert!(
        after <= before + MAX_GROWTH_KB,
        "the controller grew by {} kB with {CROWD} Pods it should not watch",
        after - before
    );
    drop(controller);
}

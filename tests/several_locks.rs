//! Several locks for one workload (docs/design.md §6.1): `lockwarden.io/locks` and
//! `lockwarden.io/lock-templates`, against a real kube-apiserver (with
//! kube-controller-manager's Job controller) and in-process controllers.
//!
//! - A Job takes its locks one at a time in key order, whatever order its annotation
//!   writes them in, claiming the next only once the previous is held; it starts with
//!   every fence; losing either lock suspends it, and it restarts with new fences.
//! - Two workloads on two controllers ("clusters") need the same two keys, written in
//!   opposite orders: over 20 rounds they never run at once and never deadlock.

use lockwarden_testsupport as support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use lockwarden::api::{DistributedLock, KubernetesBackend, LockPhase};
use lockwarden::backend::LeaseStore;
use lockwarden::controller::gating::lockset::parse_fences;
use lockwarden::controller::jobs::{
    CLAIM_ANNOTATION, FENCES_ANNOTATION, LOCKS_ANNOTATION, LOST_FENCE_ANNOTATION,
    STATUS_ANNOTATION, TEMPLATES_ANNOTATION, template_annotation,
};
use lockwarden::controller::pods::has_gate;
use lockwarden::lock::{AcquireRequest, Attempt, CasLock, LockBackend};
use serde_json::json;
use support::eventually;
use support::kube::{create, gated_pod};
use support::locks::{lease_lock_timed, phase, wait_acquired};
use support::overlap::OverlapWatch;
use support::workloads::create_held;

/// Generous: the test machine is a loaded 2-core box.
const TIMEOUT: Duration = Duration::from_secs(90);

fn is_suspended(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false)
}

fn template_fences(job: &Job) -> Option<String> {
    template_annotation(job, FENCES_ANNOTATION).cloned()
}

/// A lock on Lease `lease` (in `lease_ns`, or the lock's own namespace), created
/// released: it is acquired only when a workload claims it, so the order in which a
/// workload claims its locks is the order in which they are acquired.
fn idle_lock(name: &str, lease: &str, lease_ns: Option<&str>) -> DistributedLock {
    let mut lock = lease_lock_timed(name, lease, "6s", "2s");
    lock.spec.backend.kubernetes = Some(KubernetesBackend {
        lease_name: lease.into(),
        namespace: lease_ns.map(str::to_string),
    });
    lock.spec.release = true;
    lock
}

/// Takes Lease `lease` of namespace `ns` as an outside holder (another cluster, a CLI).
async fn hold_outside(
    client: &Client,
    ns: &str,
    lease: &str,
    force: bool,
) -> (CasLock<LeaseStore>, lockwarden::lock::Lease) {
    let outsider = CasLock::new(LeaseStore::new(client.clone(), ns, lease));
    let mut req = AcquireRequest::new("other-cluster/ops/holder", Duration::from_secs(60));
    req.force = force;
    let held = eventually(
        &format!("the outsider to take {lease}"),
        TIMEOUT,
        || async {
            match outsider.try_acquire(&req).await {
                Ok(Attempt::Acquired(lease)) => Some(lease),
                _ => None,
            }
        },
    )
    .await;
    (outsider, held)
}

/// A Job needing two named locks, written in the order opposite to their keys' order:
/// it claims the first in key order, waits there while an outsider holds it (the
/// second untouched), starts with both fences once it is free, and is suspended when
/// the second is taken over — then starts again with new fences once free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_takes_its_locks_in_key_order_and_a_loss_of_either_suspends_it() {
    let (client, ns) = support::kube::namespace_with_controller("several-job", "several").await;
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), &ns);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    // zeta names key k8s://ns/k-a, alpha k8s://ns/k-b: key order is zeta, alpha.
    for (name, lease) in [("zeta", "k-a"), ("alpha", "k-b")] {
        create(&locks, &idle_lock(name, lease, None)).await;
    }
    let (outsider, outside) = hold_outside(&client, &ns, "k-a", false).await;
    create_held(&jobs, "load", &[(LOCKS_ANNOTATION, "alpha,zeta")]).await;

    // Waiting on the first lock in key order; the second is not claimed meanwhile.
    eventually(
        "the Job to wait for zeta, first in key order",
        TIMEOUT,
        || async {
            let job = jobs.get("load").await.ok()?;
            let status = job.annotations().get(STATUS_ANNOTATION)?;
            status
                .starts_with(
                    "lock 1 of 2 in order: waiting for lock zeta: held by other-cluster/ops/holder",
                )
                .then_some(())
        },
    )
    .await;
    let alpha = locks.get("alpha").await.unwrap();
    assert!(
        !alpha.annotations().contains_key(CLAIM_ANNOTATION),
        "alpha was claimed before zeta was held: {:?}",
        alpha.metadata.annotations
    );
    assert_eq!(phase(&alpha), Some(LockPhase::Released));
    assert!(is_suspended(&jobs.get("load").await.unwrap()));

    // Free: both taken in order, the Job started with both fences (in taken order).
    outsider.release(&outside).await.unwrap();
    let started = eventually("the Job to start with both fences", TIMEOUT, || async {
        jobs.get("load")
            .await
            .ok()
            .filter(|j| !is_suspended(j) && template_fences(j).is_some())
    })
    .await;
    let fences = template_fences(&started).unwrap();
    let (zeta, alpha) = (
        wait_acquired(&locks, "zeta", TIMEOUT).await,
        wait_acquired(&locks, "alpha", TIMEOUT).await,
    );
    let fence = |l: &DistributedLock| l.status.as_ref().unwrap().fence.unwrap();
    assert_eq!(
        fences,
        format!("zeta={},alpha={}", fence(&zeta), fence(&alpha))
    );
    assert!(fence(&zeta) > outside.fence().0 as i64);
    // The real Job controller made its Pods from the template, fences and all.
    eventually("the Job's Pods to carry the fences", TIMEOUT, || async {
        let pods = support::kube::job_pods(&client, &ns, "load").await;
        (!pods.is_empty()
            && pods
                .iter()
                .all(|p| p.annotations().get(FENCES_ANNOTATION) == Some(&fences)))
        .then_some(())
    })
    .await;

    // The second lock taken over by force: the Job is suspended, remembering both
    // fences it ran with, and both locks are let go to be taken anew.
    let (forcer, forced) = hold_outside(&client, &ns, "k-b", true).await;
    eventually("the Job suspended after losing alpha", TIMEOUT, || async {
        let job = jobs.get("load").await.ok()?;
        (is_suspended(&job) && job.annotations().get(LOST_FENCE_ANNOTATION) == Some(&fences))
            .then_some(())
    })
    .await;
    // What it said when it stopped: the Event (the status annotation moves on at once
    // to the next wait, "waiting for lock zeta: still releasing", so it may be gone).
    let status = support::kube::wait_event(
        &client,
        &ns,
        "load",
        "Warning",
        "Suspended",
        &format!("ran with fence {fences} and no longer holds locks"),
    )
    .await;
    assert!(status.contains("lock alpha is Lost"), "{status}");

    // Once the forcer lets go, it starts again with a new acquisition of each.
    forcer.release(&forced).await.unwrap();
    let again = eventually(
        "the Job to start again with new fences",
        TIMEOUT,
        || async {
            jobs.get("load")
                .await
                .ok()
                .filter(|j| !is_suspended(j) && template_fences(j).is_some_and(|f| f != fences))
        },
    )
    .await;
    let new = template_fences(&again).unwrap();
    let by_name = |f: &str| -> BTreeMap<String, i64> {
        parse_fences(f)
            .into_iter()
            .map(|(n, f)| (n.to_string(), f))
            .collect()
    };
    let (old, new) = (by_name(&fences), by_name(&new));
    assert!(new["zeta"] > old["zeta"], "{old:?} -> {new:?}");
    assert!(new["alpha"] > forced.fence().0 as i64, "{new:?}");
}

/// Ungated, not finished, not being deleted: a Pod free to run.
fn pod_runs(pod: &Pod) -> bool {
    let ended = matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    !has_gate(pod) && !ended && pod.metadata.deletion_timestamp.is_none()
}

/// Plays the kubelet: the Pod's containers ended.
async fn succeed(pods: &Api<Pod>, name: &str) {
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({ "status": { "phase": "Succeeded" } })),
    )
    .await
    .unwrap_or_else(|e| panic!("set Pod {name} Succeeded: {e}"));
}

/// How long one round may take: both workloads run one after the other, each after a
/// cross-controller hand-off of two Leases (waiters poll a Lease at most every 2 s).
const ROUND_BOUND: Duration = Duration::from_secs(60);
const ROUNDS: usize = 20;

/// Two Pods per round, one per controller ("cluster"), needing Leases X and Y: one
/// lists its templates as x,y, the other as y,x. Taken in one global order, they
/// never deadlock (each round completes within [`ROUND_BOUND`]) and never run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_orders_never_deadlock_across_two_controllers() {
    let (client, ns_a, ns_b, keys) = support::kube::two_clusters("several").await;
    let label = format!("several-test={}", support::unique_suffix());
    let (locks_a, locks_b): (Api<DistributedLock>, Api<DistributedLock>) = (
        Api::namespaced(client.clone(), &ns_a),
        Api::namespaced(client.clone(), &ns_b),
    );
    // Templates (released: a template never holds its key itself).
    for (api, x, y) in [(&locks_a, "x", "y"), (&locks_b, "x2", "y2")] {
        for (name, lease) in [(x, "lease-x"), (y, "lease-y")] {
            create(api, &idle_lock(name, lease, Some(&keys))).await;
        }
    }
    let (pods_a, pods_b): (Api<Pod>, Api<Pod>) = (
        Api::namespaced(client.clone(), &ns_a),
        Api::namespaced(client.clone(), &ns_b),
    );
    let watch = OverlapWatch::start(
        vec![pods_a.clone(), pods_b.clone()],
        watcher::Config::default().labels(&label),
        pod_runs,
    );
    let mut rounds = Vec::new();
    for round in 0..ROUNDS {
        let started = Instant::now();
        let name = format!("r{round}");
        for (api, templates) in [(&pods_a, "x,y"), (&pods_b, "y2,x2")] {
            let mut pod = gated_pod(&name, &[(TEMPLATES_ANNOTATION, templates)], true, true);
            let (k, v) = label.split_once('=').unwrap();
            pod.labels_mut().insert(k.into(), v.into());
            create(api, &pod).await;
        }
        // Whichever runs first finishes; then the other must run and finish.
        let mut done = Vec::new();
        while done.len() < 2 {
            let (api, ns) = eventually(
                &format!("round {round}: a workload to run"),
                ROUND_BOUND,
                || async {
                    for (api, ns) in [(&pods_a, &ns_a), (&pods_b, &ns_b)] {
                        if done.contains(ns) {
                            continue;
                        }
                        let pod = api.get(&name).await.ok()?;
                        if !has_gate(&pod) {
                            return Some((api.clone(), ns.clone()));
                        }
                    }
                    None
                },
            )
            .await;
            succeed(&api, &name).await;
            done.push(ns);
        }
        let took = started.elapsed();
        assert!(
            took <= ROUND_BOUND,
            "round {round} took {took:.1?}, over the {ROUND_BOUND:?} bound"
        );
        rounds.push(took);
    }
    // Both workloads of the last round let go of their locks.
    for api in [&locks_a, &locks_b] {
        eventually("every per-Pod lock to be let go", TIMEOUT, || async {
            let list = api.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .all(|l| l.owner_references().is_empty())
                .then_some(())
        })
        .await;
    }
    watch.assert_none();
    let total: Duration = rounds.iter().sum();
    let max = rounds.iter().max().unwrap();
    println!(
        "{ROUNDS} rounds, two workloads each: mean {:.1?}, max {max:.1?} per round (bound {ROUND_BOUND:?})",
        total / ROUNDS as u32
    );
    for api in [&pods_a, &pods_b] {
        let _ = api
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&label),
            )
            .await;
    }
}

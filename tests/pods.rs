//! Pod gating (docs/design.md §6.1 "Any Pod") against a real kube-apiserver, with the
//! controller running in-process, scoped to each test's own namespace.
//!
//! There is no scheduler or kubelet: a Pod whose gate is removed stays Pending, which
//! is all these tests need (the gate is what lockwarden controls). A test that needs a
//! Pod to end sets its phase through the status subresource, as a kubelet would. The
//! shared control plane runs the ReplicaSet and Deployment controllers, so a
//! Deployment's deleted Pod is replaced by a new, gated one.

use lockwarden_testsupport as support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use kube::{Client, ResourceExt};
use lockwarden::api::{DistributedLock, LockPhase};
use lockwarden::controller::FINALIZER;
use lockwarden::controller::gating::{
    CLAIM_ANNOTATION, HOLDER_ANNOTATION, LOCK_ANNOTATION, ON_LOCK_LOST_ANNOTATION,
    STATUS_ANNOTATION, TEMPLATE_ANNOTATION,
};
use lockwarden::controller::pods::has_gate;
use serde_json::json;
use support::eventually;
use support::kube::{create, delete, gated_pod, wait_event};
use support::locks::{lease_lock, lease_lock_timed, lease_template, phase, wait_acquired};
use support::workloads::{self, BadRow, Workload, create_held};

/// Generous: the test machine is a loaded 2-core box.
const TIMEOUT: Duration = Duration::from_secs(90);
const CLUSTER: &str = "pods-cluster";

/// A client, the CRD, a fresh namespace, a controller watching that namespace, and the
/// namespace's locks and Pods.
async fn setup(prefix: &str) -> (Client, String, Api<DistributedLock>, Api<Pod>) {
    workloads::namespace_for(prefix, CLUSTER).await
}

fn fence_of(pod: &Pod) -> Option<i64> {
    pod.fence()
}

/// Ungated (by anyone) and neither terminating nor finished: free to run.
fn released(pod: &Pod) -> bool {
    let ended = matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    !has_gate(pod) && pod.metadata.deletion_timestamp.is_none() && !ended
}

/// Waits until Pod `name` has lost its gate; returns it.
async fn wait_ungated(pods: &Api<Pod>, name: &str) -> Pod {
    Pod::wait_started(pods, name).await
}

/// Every version of the namespace's Pods from now on (a watch from the list's
/// resourceVersion, so nothing after this call is missed), in order.
struct PodVersions {
    seen: Arc<Mutex<Vec<Pod>>>,
    task: tokio::task::JoinHandle<()>,
}

impl PodVersions {
    async fn start(pods: &Api<Pod>) -> PodVersions {
        let from = pods
            .list(&ListParams::default())
            .await
            .unwrap()
            .metadata
            .resource_version
            .unwrap();
        let stream = pods
            .watch(&WatchParams::default().timeout(290), &from)
            .await
            .unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let into = seen.clone();
        let task = tokio::spawn(async move {
            let mut stream = stream.boxed();
            while let Ok(Some(event)) = stream.try_next().await {
                match event {
                    WatchEvent::Added(p) | WatchEvent::Modified(p) | WatchEvent::Deleted(p) => {
                        into.lock().unwrap().push(p)
                    }
                    WatchEvent::Bookmark(_) => {}
                    WatchEvent::Error(e) => panic!("pod watch failed: {e}"),
                }
            }
        });
        PodVersions { seen, task }
    }

    fn of(&self, name: &str) -> Vec<Pod> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|p| p.name_any() == name)
            .cloned()
            .collect()
    }
}

impl Drop for PodVersions {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Every watched version of Pod `name` once the watch has seen it ungated: none
/// without the gate lacks the fence, and the first one was gated.
async fn assert_never_ungated_without_fence(versions: &PodVersions, name: &str) {
    let all = eventually("the watch to see the ungated Pod", TIMEOUT, || async {
        let all = versions.of(name);
        all.iter().any(|p| !has_gate(p)).then_some(all)
    })
    .await;
    let unfenced: Vec<_> = all
        .iter()
        .filter(|p| !has_gate(p) && fence_of(p).is_none())
        .map(|p| p.resource_version())
        .collect();
    assert!(
        unfenced.is_empty(),
        "versions without the gate and without the fence: {unfenced:?}"
    );
    assert!(has_gate(&all[0]), "the watch saw the Pod created gated");
    eprintln!(
        "{} versions of the Pod watched; none ungated without its fence",
        all.len()
    );
}

/// A gated Pod naming a lock whose key another holder has: it keeps its gate, and says
/// whom it waits for; once the holder releases, one write removes the gate and adds a
/// fence above the holder's. A watch from before the Pod was created sees no version
/// without the gate that lacks the fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gated_pod_keeps_its_gate_while_its_lock_is_held_elsewhere() {
    let (client, ns, locks, pods) = setup("pods-elsewhere").await;
    // Every version of the Pod, from before it exists.
    let versions = PodVersions::start(&pods).await;
    let (pod, outsider, lease) = workloads::held_back_by_an_outsider::<Pod>(&client, &ns).await;
    assert!(pod.finalizers().iter().any(|f| f == FINALIZER));
    let lock = locks.get("contested").await.unwrap();
    assert_eq!(
        lock.annotations().get(CLAIM_ANNOTATION),
        Some(&format!("pod/blocked/{}", pod.uid().unwrap()))
    );

    let started = workloads::started_once_the_outsider_lets_go(&pods, &outsider, &lease).await;
    let fence = fence_of(&started).expect("ungated with a fence");
    assert_eq!(
        started.annotations().get(HOLDER_ANNOTATION),
        Some(&format!("{CLUSTER}/{ns}/contested"))
    );
    let lock = wait_acquired(&locks, "contested", TIMEOUT).await;
    assert_eq!(lock.status.unwrap().fence, Some(fence));
    let says = format!("fence {fence}");
    wait_event(&client, &ns, "blocked", "Normal", "Started", &says).await;

    // The watch has seen the ungated version too (the write that removed the gate).
    assert_never_ungated_without_fence(&versions, "blocked").await;
}

/// The Deployment of examples/pod-gated.yaml (3 replicas, one lock per Pod from one
/// template, one Lease): exactly one Pod is ungated; over 3 hand-offs (the ungated Pod
/// deleted each time, the ReplicaSet making a new gated one) a watch of every Pod
/// version never sees two ungated, non-terminating Pods at once, and each hand-off
/// ungates another Pod with a higher fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_pods_are_ungated_one_at_a_time_over_three_hand_offs() {
    let (client, ns, _, pods) = setup("pods-deploy").await;
    let text =
        std::fs::read_to_string(support::repo_root().join("examples/pod-gated.yaml")).unwrap();
    let mut docs = text.split("\n---\n");
    let template: DistributedLock = serde_yaml_ng::from_str(docs.next().unwrap()).unwrap();
    let deployment: Deployment = serde_yaml_ng::from_str(docs.next().unwrap()).unwrap();
    create(&Api::namespaced(client.clone(), &ns), &template).await;

    // Every version of every Pod, from before the Deployment exists.
    let versions = PodVersions::start(&pods).await;
    create(
        &Api::<Deployment>::namespaced(client.clone(), &ns),
        &deployment,
    )
    .await;

    let mut last_fence = 0;
    let mut active: Option<String> = None;
    for hand_off in 0..=3 {
        let started = Instant::now();
        let pod = wait_next_active(&pods, active.as_deref(), last_fence).await;
        let fence = fence_of(&pod).unwrap();
        eprintln!(
            "hand-off {hand_off}: {} ungated with fence {fence} after {:?}",
            pod.name_any(),
            started.elapsed()
        );
        last_fence = fence;
        active = Some(pod.name_any());
        if hand_off < 3 {
            delete(&pods, &pod.name_any()).await;
        }
    }
    assert_never_two_released(&versions, active.as_deref().unwrap()).await;
}

/// Waits until one Pod of the singleton Deployment other than `previous` is ungated
/// with a fence above `above`, the two others gated and waiting for its holder;
/// returns it.
async fn wait_next_active(pods: &Api<Pod>, previous: Option<&str>, above: i64) -> Pod {
    let (pod, gated) = eventually(
        &format!("one Pod other than {previous:?} ungated, two gated"),
        TIMEOUT,
        || async {
            let (free, gated) =
                workloads::listed_free_and_held(pods, "app=singleton", released).await?;
            (free.len() == 1
                && gated.len() == 2
                && Some(free[0].name_any().as_str()) != previous
                && fence_of(&free[0])? > above)
                .then(|| (free[0].clone(), gated))
        },
    )
    .await;
    // The waiting Pods name the active one's holder.
    let holder = pod.annotations()[HOLDER_ANNOTATION].clone();
    assert!(
        holder.contains(&format!("/pod/{}/", pod.name_any())),
        "{holder}"
    );
    for waiting in &gated {
        let waiting = waiting.name_any();
        eventually(
            &format!("{waiting} to wait for {holder}"),
            TIMEOUT,
            || async {
                let p = pods.get(&waiting).await.ok()?;
                p.annotations()
                    .get(STATUS_ANNOTATION)?
                    .contains(&format!("held by {holder}"))
                    .then_some(())
            },
        )
        .await;
    }
    pod
}

/// Goes through every watched Pod version in order, once the watch has seen `last`
/// ungated, and fails if two Pods were ever ungated (and neither terminating nor
/// finished) at once.
async fn assert_never_two_released(versions: &PodVersions, last: &str) {
    eventually("the watch to see the last hand-off", TIMEOUT, || async {
        versions.of(last).iter().any(released).then_some(())
    })
    .await;
    let seen = versions.seen.lock().unwrap().clone();
    let mut free: BTreeMap<String, bool> = BTreeMap::new();
    let mut violations = Vec::new();
    for pod in &seen {
        free.insert(pod.name_any(), released(pod));
        let now: Vec<_> = free.iter().filter(|(_, f)| **f).map(|(n, _)| n).collect();
        if now.len() > 1 {
            violations.push(format!("{now:?} ungated at once"));
        }
    }
    assert!(
        violations.is_empty(),
        "two Pods ungated at once: {violations:?}"
    );
    eprintln!(
        "{} Pod versions watched; never two ungated at once",
        seen.len()
    );
}

/// A lock template with `permits: 2` and three gated Pods (docs/design.md §6.2): two
/// are ungated at once with their own fences, the third stays gated saying no permit
/// is free, and deleting an ungated Pod lets it go with a higher fence. A watch of
/// every Pod version never sees more than two ungated at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_with_two_permits_ungates_two_pods_at_a_time() {
    let (_, _, locks, pods) = setup("pods-permits").await;
    let watch = support::overlap::OverlapWatch::at_most(
        2,
        vec![pods.clone()],
        kube::runtime::watcher::Config::default(),
        released,
    );
    let mut template = lease_template("readers", "replicas");
    template.spec.permits = 2;
    create(&locks, &template).await;
    let names = ["replica-a", "replica-b", "replica-c"];
    for name in names {
        create_held(&pods, name, &[(TEMPLATE_ANNOTATION, "readers")]).await;
    }
    let (free, gated) = eventually("two Pods ungated, one waiting", TIMEOUT, || async {
        let (free, gated) = workloads::free_and_held(&pods, &names, released).await?;
        // (name, fence) of each ungated Pod, once all have their fence.
        let free: Vec<(String, i64)> = free
            .iter()
            .map(|p| Some((p.name_any(), fence_of(p)?)))
            .collect::<Option<_>>()?;
        let [waiting] = <[Pod; 1]>::try_from(gated).ok()?;
        let status = waiting.annotations().get(STATUS_ANNOTATION)?;
        status
            .contains("no permit free: 2 of 2 in use by 2 holders")
            .then_some((free, waiting.name_any()))
    })
    .await;
    assert_ne!(free[0].1, free[1].1, "one fence per permit: {free:?}");
    delete(&pods, &free[0].0).await;
    let next = wait_ungated(&pods, &gated).await;
    let fence = fence_of(&next).expect("ungated with a fence");
    assert!(
        fence > free[0].1.max(free[1].1),
        "fence {fence} after {free:?}"
    );
    assert!(
        released(&pods.get(&free[1].0).await.unwrap()),
        "the other keeps running"
    );
    watch.assert_none();
}

/// A Pod that succeeds lets its named lock go (released, unclaimed) and loses its
/// finalizer; a Pod that is deleted has its own lock deleted and then goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_lock_is_let_go_when_the_pod_succeeds_or_is_deleted() {
    let (client, ns, locks, pods) = setup("pods-end").await;
    let db = lease_lock("db", "db-key");
    let [succeeds, deleted] =
        workloads::named_and_queued::<Pod>(&client, &ns, &db, ["succeeds", "deleted"]).await;
    let own = format!("deleted-{}", &deleted.uid().unwrap()[..8]);
    let own_lock = wait_acquired(&locks, &own, TIMEOUT).await;
    assert_eq!(own_lock.status.as_ref().unwrap().fence, fence_of(&deleted));
    assert_eq!(
        own_lock.spec.holder_identity.as_deref(),
        Some(format!("{CLUSTER}/{ns}/pod/deleted/{}", deleted.uid().unwrap()).as_str())
    );
    assert_eq!(own_lock.owner_references()[0].kind, "Pod");

    // Succeeded, as a kubelet would report it.
    succeeds_and_lets_go(&pods, &locks, "succeeds", "db").await;
    wait_event(
        &client,
        &ns,
        "succeeds",
        "Normal",
        "Released",
        &format!("released lock db (fence {})", fence_of(&succeeds).unwrap()),
    )
    .await;

    delete(&pods, "deleted").await;
    wait_gone_with_its_lock(&pods, &locks, "deleted", &own).await;
}

/// Pod `pod` succeeds (as a kubelet would report it); its named lock `lock` is then
/// let go (Released, `spec.release` set, unclaimed) and the Pod's finalizer dropped.
async fn succeeds_and_lets_go(
    pods: &Api<Pod>,
    locks: &Api<DistributedLock>,
    pod: &str,
    lock: &str,
) {
    set_phase(pods, pod, "Succeeded").await;
    eventually(
        &format!("Pod {pod}'s lock {lock} released and unclaimed, its finalizer gone"),
        TIMEOUT,
        || async {
            let lock = locks.get(lock).await.ok()?;
            let pod = pods.get(pod).await.ok()?;
            (phase(&lock) == Some(LockPhase::Released)
                && lock.spec.release
                && !lock.annotations().contains_key(CLAIM_ANNOTATION)
                && !pod.finalizers().iter().any(|f| f == FINALIZER))
            .then_some(())
        },
    )
    .await;
}

/// Sets Pod `name`'s phase through the status subresource, as its kubelet would.
async fn set_phase(pods: &Api<Pod>, name: &str, phase: &str) {
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({ "status": { "phase": phase } })),
    )
    .await
    .unwrap_or_else(|e| panic!("set Pod {name} {phase}: {e}"));
}

/// Waits until Pod `name` and its own lock (from a template) `own` are both gone.
async fn wait_gone_with_its_lock(
    pods: &Api<Pod>,
    locks: &Api<DistributedLock>,
    name: &str,
    own: &str,
) {
    eventually(
        &format!("Pod {name} and its own lock gone"),
        TIMEOUT,
        || async {
            let pod_gone = pods.get_opt(name).await.ok()?.is_none();
            let lock_gone = locks.get_opt(own).await.ok()?.is_none();
            (pod_gone && lock_gone).then_some(())
        },
    )
    .await;
}

/// A Pod bound to a node may still be running its containers after it is deleted
/// (their grace period): its lock is kept — the status annotation says so — until the
/// kubelet reports a terminal phase (played here: there is no kubelet), then let go,
/// and the finalizer dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_pod_on_a_node_keeps_its_lock_until_it_has_stopped() {
    let (_, _, locks, pods) = setup("pods-terminating").await;
    create(&locks, &lease_lock("db", "db-key")).await;
    create_held(&pods, "bound", &[(LOCK_ANNOTATION, "db")]).await;
    let pod = wait_ungated(&pods, "bound").await;
    // Bound as the scheduler would (a gated Pod could not be).
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding", "metadata": { "name": "bound" },
        "target": { "apiVersion": "v1", "kind": "Node", "name": "node-1" },
    });
    pods.create_subresource::<_, serde_json::Value>(
        "binding",
        "bound",
        &Default::default(),
        &binding,
    )
    .await
    .unwrap();
    delete(&pods, "bound").await;
    eventually(
        "the deleted Pod to say it keeps its lock",
        TIMEOUT,
        || async {
            let p = pods.get("bound").await.ok()?;
            p.annotations()
                .get(STATUS_ANNOTATION)?
                .contains("once its processes have ended")
                .then_some(())
        },
    )
    .await;
    let lock = locks.get("db").await.unwrap();
    assert_eq!(phase(&lock), Some(LockPhase::Held));
    assert_eq!(lock.status.as_ref().unwrap().fence, fence_of(&pod));
    assert!(!lock.spec.release && lock.annotations().contains_key(CLAIM_ANNOTATION));

    // The kubelet reports the containers stopped.
    set_phase(&pods, "bound", "Failed").await;
    // (A bound Pod's object goes when its kubelet deletes it for good: not here.)
    eventually(
        "the lock let go and the finalizer gone",
        TIMEOUT,
        || async {
            let lock = locks.get("db").await.ok()?;
            let pod = pods.get_opt("bound").await.ok()?;
            let finalized = pod.is_none_or(|p| !p.finalizers().iter().any(|f| f == FINALIZER));
            (finalized && lock.spec.release && !lock.annotations().contains_key(CLAIM_ANNOTATION))
                .then_some(())
        },
    )
    .await;
}

/// A running Pod on lock `db` (a Lease renewed every 2 s, so a takeover is noticed
/// quickly) with `on-lock-lost: policy` (none: the default); the lock then taken over
/// by force. Returns the Pod's fence.
async fn pod_losing_its_lock(client: &Client, ns: &str, pod: &str, policy: Option<&str>) -> i64 {
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    create(&locks, &lease_lock_timed("db", "db-lease", "6s", "2s")).await;
    let mut annotations = vec![(LOCK_ANNOTATION, "db")];
    annotations.extend(policy.map(|p| (ON_LOCK_LOST_ANNOTATION, p)));
    create_held(&pods, pod, &annotations).await;
    let fence = fence_of(&wait_ungated(&pods, pod).await).unwrap();
    force(&locks, "db-lease").await;
    fence
}

/// Another lock, `forcer`, takes Lease `lease` by force.
async fn force(locks: &Api<DistributedLock>, lease: &str) {
    let mut forcer = lease_lock("forcer", lease);
    forcer.spec.force = true;
    create(locks, &forcer).await;
}

/// `on-lock-lost` unset (`delete`, the default for Pods): a Pod whose lock is taken
/// over is deleted, with a Warning naming the fence it ran with and the reason, and its
/// lock is let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_lock_lost_delete_deletes_the_pod() {
    let (client, ns, telemetry) =
        support::kube::namespace_with_observed_controller("pods-loss-delete", CLUSTER).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), &ns);
    let fence = pod_losing_its_lock(&client, &ns, "doomed", None).await;
    let note = wait_event(
        &client,
        &ns,
        "doomed",
        "Warning",
        "Deleted",
        &format!("fence {fence}"),
    )
    .await;
    assert!(note.contains("Lost") && note.contains("lock db"), "{note}");
    eventually("the Pod gone and its lock let go", TIMEOUT, || async {
        let gone = pods.get_opt("doomed").await.ok()?.is_none();
        let lock = locks.get("db").await.ok()?;
        (gone && lock.spec.release && !lock.annotations().contains_key(CLAIM_ANNOTATION))
            .then_some(())
    })
    .await;
    let metrics = telemetry.encode();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("lockwarden_pods_deleted_total{reason=\"Lost\"}")),
        "{metrics}"
    );
}

/// `on-lock-lost: ignore`: a Warning that the Pod runs with a fence it no longer holds,
/// and nothing else: the Pod stays, not terminating.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_lock_lost_ignore_keeps_the_pod_with_a_warning() {
    let (client, ns, _, pods) = setup("pods-loss-ignore").await;
    let fence = pod_losing_its_lock(&client, &ns, "stubborn", Some("ignore")).await;
    let note = wait_event(&client, &ns, "stubborn", "Warning", "LockNotHeld", "").await;
    assert!(
        note.contains(&format!("running with fence {fence}")) && note.contains("lock db is Lost"),
        "{note}"
    );
    let pod = pods.get("stubborn").await.unwrap();
    assert!(pod.metadata.deletion_timestamp.is_none());
    assert!(!has_gate(&pod));
    assert_eq!(fence_of(&pod), Some(fence));
}

/// One Pod per kind of bad input (a lock `db` exists in the namespace): (Pod,
/// annotations, gated, Event reason, words in the Event).
#[rustfmt::skip]
fn bad_rows() -> Vec<BadRow<'static>> {
    vec![
        ("no-lock", &[], true, "InvalidLockAnnotation", "names no lock"),
        ("bad-policy", &[(LOCK_ANNOTATION, "db"), (ON_LOCK_LOST_ANNOTATION, "suspend")], true, "InvalidLockAnnotation", "\"suspend\" is not one of delete, ignore"),
        ("both", &[(LOCK_ANNOTATION, "db"), (TEMPLATE_ANNOTATION, "db")], true, "InvalidLockAnnotation", "a Pod names one lock"),
        ("other-namespace", &[(LOCK_ANNOTATION, "elsewhere/db")], true, "InvalidLockAnnotation", "another namespace"),
        ("missing", &[(LOCK_ANNOTATION, "nope")], true, "LockNotFound", "nope does not exist"),
        ("no-gate", &[(LOCK_ANNOTATION, "db")], false, "NotGated", "no scheduling gate"),
    ]
}

/// Bad input, one row each: a Warning Event saying what is wrong, and the Pod keeps its
/// gate (no fence); a Pod gated without the label is never seen (it keeps its gate and
/// is not touched); and the controller still ungates a good Pod afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gives_a_warning_and_leaves_the_pod_gated() {
    let (client, ns, locks, pods) = setup("pods-bad").await;
    create(&locks, &lease_lock("db", "db-key")).await;
    let unlabelled = gated_pod("unlabelled", &[(LOCK_ANNOTATION, "db")], true, false);
    create(&pods, &unlabelled).await;
    workloads::bad_input_is_called_out::<Pod>(&client, &ns, &bad_rows()).await;
    // The lock of the bad rows was never claimed; a good Pod takes it.
    create_held(&pods, "good", &[(LOCK_ANNOTATION, "db")]).await;
    wait_ungated(&pods, "good").await;
    let unlabelled = pods.get("unlabelled").await.unwrap();
    assert!(has_gate(&unlabelled));
    assert!(unlabelled.finalizers().is_empty());
    assert!(!unlabelled.annotations().contains_key(STATUS_ANNOTATION));
}

/// The Pod rules of the documented RBAC (docs/architecture.md), with the lock,
/// Lease and Event rules the Kubernetes-Lease backend needs.
fn pod_controller_rules() -> serde_json::Value {
    workloads::controller_rules(json!([
        {"apiGroups": [""], "resources": ["pods"],
         "verbs": ["get", "list", "watch", "patch", "delete"]},
    ]))
}

/// The controller running as an identity with only [`pod_controller_rules`] gates Pods
/// end to end: per-Pod locks from a template (create, ungate, delete on loss, let go)
/// and a named lock (claim, ungate, release when the Pod succeeds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_gating_works_with_the_documented_rbac() {
    let (admin, ns) =
        support::kube::namespace_with_controller_as(pod_controller_rules(), "pods-rbac", CLUSTER)
            .await;
    let locks: Api<DistributedLock> = Api::namespaced(admin.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    let named = lease_lock_timed("named", "named-key", "6s", "2s");
    let [_, queued] =
        workloads::named_and_queued::<Pod>(&admin, &ns, &named, ["named-pod", "queued-pod"]).await;
    wait_event(&admin, &ns, "named-pod", "Normal", "Started", "").await;

    // The queued Pod's key taken by force: the Pod is deleted, its own lock with it.
    force(&locks, "queue-key").await;
    wait_event(&admin, &ns, "queued-pod", "Warning", "Deleted", "").await;
    let own = format!("queued-pod-{}", &queued.uid().unwrap()[..8]);
    wait_gone_with_its_lock(&pods, &locks, "queued-pod", &own).await;

    succeeds_and_lets_go(&pods, &locks, "named-pod", "named").await;
}

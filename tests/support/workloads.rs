//! Job and Pod gating (docs/design.md §6) behave alike where the design says they do:
//! a workload created held back (a suspended Job; a Pod with lockwarden's scheduling
//! gate and watch label) waits for its lock, says for whom, and is let go with a fence.
//! The bodies here run on either kind ([`Workload`]), so tests/jobs.rs and tests/pods.rs
//! check those shared properties with one piece of code, each on its own kind.

use std::fmt::Debug;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::{Client, Resource, ResourceExt};
use lockwarden::api::DistributedLock;
use lockwarden::backend::LeaseStore;
use lockwarden::controller::gating::{
    FENCE_ANNOTATION, LOCK_ANNOTATION, STATUS_ANNOTATION, TEMPLATE_ANNOTATION,
};
use lockwarden::controller::pods::has_gate;
use lockwarden::lock::{AcquireRequest, CasLock, Lease};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::eventually;
use super::kube::{create, wait_event};
use super::locks::{hold_lease, lease_lock, lease_template};

/// Generous: the test machine is a loaded 2-core box.
const TIMEOUT: Duration = Duration::from_secs(90);

/// The holder of [`held_back_by_an_outsider`]'s Lease: another cluster's.
pub const OUTSIDER: &str = "other-cluster/ops/nightly";

/// A kind lockwarden gates: how a test builds one, and how it reads the gate and fence.
#[allow(async_fn_in_trait)]
pub trait Workload:
    Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Serialize
    + Debug
    + Send
    + Sync
    + 'static
{
    /// Workload `name` with `annotations`, created held back (`held`) or not.
    fn build(name: &str, annotations: &[(&str, &str)], held: bool) -> Self;
    /// Still held back: a suspended Job, a gated Pod.
    fn is_held(&self) -> bool;
    /// The fence lockwarden let it go with (on a Job's pod template, on a Pod); a
    /// fence annotation that is not a number fails the test.
    fn fence(&self) -> Option<i64>;
    /// Waits until workload `name` is let go; returns it.
    async fn wait_started(api: &Api<Self>, name: &str) -> Self;
}

fn number(fence: &String) -> i64 {
    fence
        .parse()
        .unwrap_or_else(|e| panic!("fence annotation {fence:?}: {e}"))
}

impl Workload for Job {
    fn build(name: &str, annotations: &[(&str, &str)], held: bool) -> Self {
        super::kube::job(name, annotations, held)
    }

    fn is_held(&self) -> bool {
        self.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false)
    }

    fn fence(&self) -> Option<i64> {
        let meta = self.spec.as_ref()?.template.metadata.as_ref()?;
        meta.annotations.as_ref()?.get(FENCE_ANNOTATION).map(number)
    }

    /// Unsuspended, and started for real: the Job controller made its Pods from the
    /// template, fence and all.
    async fn wait_started(jobs: &Api<Job>, name: &str) -> Job {
        let job = eventually(
            &format!("Job {name} to be unsuspended"),
            TIMEOUT,
            || async { jobs.get(name).await.ok().filter(|j| !j.is_held()) },
        )
        .await;
        let fence = job
            .fence()
            .unwrap_or_else(|| panic!("{name} has no fence annotation"));
        let client = jobs.clone().into_client();
        let ns = job.namespace().unwrap();
        super::kube::wait_pods_with_fence(&client, &ns, name, fence).await;
        job
    }
}

impl Workload for Pod {
    /// Labelled for lockwarden's watch, gated or not.
    fn build(name: &str, annotations: &[(&str, &str)], held: bool) -> Self {
        super::kube::gated_pod(name, annotations, held, true)
    }

    fn is_held(&self) -> bool {
        has_gate(self)
    }

    fn fence(&self) -> Option<i64> {
        self.annotations().get(FENCE_ANNOTATION).map(number)
    }

    /// Ungated (no scheduler runs here: it stays Pending).
    async fn wait_started(pods: &Api<Pod>, name: &str) -> Pod {
        eventually(&format!("Pod {name} to be ungated"), TIMEOUT, || async {
            pods.get(name).await.ok().filter(|p| !has_gate(p))
        })
        .await
    }
}

/// The documented RBAC (docs/architecture.md) of a controller gating workloads: the
/// rules for its locks and the Kubernetes-Lease backend's (Leases, Events), then
/// `kinds` (the rules for the workload kinds it serves).
pub fn controller_rules(kinds: serde_json::Value) -> serde_json::Value {
    let mut rules = serde_json::json!([
        {"apiGroups": ["lockwarden.io"], "resources": ["distributedlocks"],
         "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
        {"apiGroups": ["lockwarden.io"], "resources": ["distributedlocks/status"],
         "verbs": ["patch"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "verbs": ["get", "create", "update", "delete"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    ]);
    let all = rules.as_array_mut().expect("an array");
    all.extend(kinds.as_array().expect("an array of rules").iter().cloned());
    rules
}

/// Creates workload `name` with `annotations`, held back as lockwarden expects (a
/// suspended Job; a gated, labelled Pod); returns it as created.
pub async fn create_held<W: Workload>(api: &Api<W>, name: &str, annotations: &[(&str, &str)]) -> W {
    create(api, &W::build(name, annotations, true)).await
}

/// A fresh namespace on the shared control plane, served by an in-process controller
/// (cluster name `cluster`): a client, the namespace, and the APIs of its locks and of
/// its workloads of kind `W`.
pub async fn namespace_for<W: Workload>(
    prefix: &str,
    cluster: &str,
) -> (Client, String, Api<DistributedLock>, Api<W>) {
    let (client, ns) = super::kube::namespace_with_controller(prefix, cluster).await;
    let locks = Api::namespaced(client.clone(), &ns);
    let workloads = Api::namespaced(client.clone(), &ns);
    (client, ns, locks, workloads)
}

/// Another cluster's holder ([`OUTSIDER`]) takes Lease `contested` directly in the
/// store; a workload `blocked` naming lock `contested` (on that Lease) then stays held
/// back with no fence, a Normal Waiting Event and its status annotation naming that
/// holder. Returns the workload and the outsider's handle and lease.
pub async fn held_back_by_an_outsider<W: Workload>(
    client: &Client,
    ns: &str,
) -> (W, CasLock<LeaseStore>, Lease) {
    let request = AcquireRequest::new(OUTSIDER, Duration::from_secs(60));
    let (outsider, lease) = hold_lease(client, ns, "contested", &request).await;
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), ns);
    create(&locks, &lease_lock("contested", "contested")).await;
    let workloads: Api<W> = Api::namespaced(client.clone(), ns);
    create_held(&workloads, "blocked", &[(LOCK_ANNOTATION, "contested")]).await;
    let held_by = format!("held by {OUTSIDER}");
    let note = wait_event(client, ns, "blocked", "Normal", "Waiting", &held_by).await;
    assert!(
        note.contains(&held_by),
        "the Event names the holder: {note}"
    );
    let blocked = workloads.get("blocked").await.unwrap();
    assert!(blocked.is_held(), "let go while the lock is held elsewhere");
    assert_eq!(
        blocked.fence(),
        None,
        "a fence while the lock is held elsewhere"
    );
    assert_eq!(
        blocked.annotations()[STATUS_ANNOTATION],
        format!("waiting for lock contested: {held_by}")
    );
    (blocked, outsider, lease)
}

/// [`held_back_by_an_outsider`]'s outsider lets go: `blocked` starts, with a fence
/// above the outsider's. Returns it.
pub async fn started_once_the_outsider_lets_go<W: Workload>(
    workloads: &Api<W>,
    outsider: &CasLock<LeaseStore>,
    lease: &Lease,
) -> W {
    use lockwarden::lock::LockBackend;
    outsider.release(lease).await.unwrap();
    let started = W::wait_started(workloads, "blocked").await;
    let fence = started.fence().expect("let go with a fence");
    assert!(
        fence > lease.fence().0 as i64,
        "fence {fence} not above the outsider's {}",
        lease.fence().0
    );
    started
}

/// A named lock (`named`, given) and a template `queue` on Lease `queue-key`; workload
/// `names[0]` names the lock, `names[1]` the template. Waits until both have started;
/// returns them in that order.
pub async fn named_and_queued<W: Workload>(
    client: &Client,
    ns: &str,
    named: &DistributedLock,
    names: [&str; 2],
) -> [W; 2] {
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), ns);
    create(&locks, named).await;
    create(&locks, &lease_template("queue", "queue-key")).await;
    let workloads: Api<W> = Api::namespaced(client.clone(), ns);
    let lock = named.name_any();
    let annotations = [
        (LOCK_ANNOTATION, lock.as_str()),
        (TEMPLATE_ANNOTATION, "queue"),
    ];
    for (name, annotation) in names.iter().zip(annotations) {
        create_held(&workloads, name, &[annotation]).await;
    }
    [
        W::wait_started(&workloads, names[0]).await,
        W::wait_started(&workloads, names[1]).await,
    ]
}

/// Workloads `names`, split into those `free` says run and the others (in `names`'
/// order); `None` when one cannot be read.
pub async fn free_and_held<W: Workload>(
    api: &Api<W>,
    names: &[&str],
    free: fn(&W) -> bool,
) -> Option<(Vec<W>, Vec<W>)> {
    let mut all = Vec::new();
    for name in names {
        all.push(api.get(name).await.ok()?);
    }
    Some(all.into_iter().partition(free))
}

/// The workloads of `api` labelled `selector`, terminating ones left out, split into
/// those `free` says run and the others; `None` when the list fails.
pub async fn listed_free_and_held<W: Workload>(
    api: &Api<W>,
    selector: &str,
    free: impl Fn(&W) -> bool,
) -> Option<(Vec<W>, Vec<W>)> {
    let list = api
        .list(&kube::api::ListParams::default().labels(selector))
        .await
        .ok()?;
    Some(
        list.items
            .into_iter()
            .filter(|w| w.meta().deletion_timestamp.is_none())
            .partition(|w| free(w)),
    )
}

/// One row of bad input: (workload, annotations, created held back, Event reason,
/// words in the Event).
pub type BadRow<'a> = (&'a str, &'a [(&'a str, &'a str)], bool, &'a str, &'a str);

/// Creates one workload per row, then checks each: a Warning Event with the row's
/// reason and words, and the workload left as created (held back or not) without a
/// fence. Returns each row's workload and the Event's note, in row order.
pub async fn bad_input_is_called_out<W: Workload>(
    client: &Client,
    ns: &str,
    rows: &[BadRow<'_>],
) -> Vec<(W, String)> {
    let workloads: Api<W> = Api::namespaced(client.clone(), ns);
    for (name, annotations, held, _, _) in rows {
        create(&workloads, &W::build(name, annotations, *held)).await;
    }
    let mut seen = Vec::new();
    for (name, _, held, reason, words) in rows {
        let note = wait_event(client, ns, name, "Warning", reason, words).await;
        eprintln!("{name}: {reason}: {note}");
        assert!(note.contains(words), "{name}: {note:?} lacks {words:?}");
        let workload = workloads.get(name).await.unwrap();
        assert_eq!(workload.is_held(), *held, "{name} was left as created");
        assert_eq!(workload.fence(), None, "{name} got a fence");
        seen.push((workload, note));
    }
    seen
}

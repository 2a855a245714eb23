//! lockwarden as Kueue's AdmissionCheck controller (docs/design.md §6.6), against a real
//! Kueue, kube-apiserver, kube-controller-manager and node: Workloads whose ClusterQueue
//! asks lockwarden's check are admitted only once their locks are held, with their
//! fences on the Pods; the checks' states for what cannot (yet) be admitted; and
//! lockwarden's own Job gating leaving Kueue's Jobs to Kueue.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use lockwarden::api::{DistributedLock, admission_config_crd};
use lockwarden::controller::ControllerConfig;

use super::*;
use crate::support::kube::{
    client_from_kubeconfig, install_crd, install_lockwarden_crd, wait_event,
};
use crate::support::locks::lease_lock;
use crate::support::timescale::{
    NEVER_WITHIN, PENDING_TIMEOUT, RETRY_AFTER, RETRY_AFTER_SECONDS, STILL_NOT_WITHIN,
};

/// The holder identities' first part.
const CLUSTER: &str = "kueue-test";
/// The check's controller name.
const LOCKWARDEN: &str = "lockwarden.io/lock";

/// A ClusterQueue asking lockwarden's check, its LocalQueue, and the check's parameters
/// naming template `pool` of the test's namespace.
struct Scene {
    node: &'static Node,
    client: Client,
    ns: String,
    queue: String,
    check: String,
}

/// Both of lockwarden's CRDs, Established.
pub(super) async fn install_crds(client: &Client) {
    install_lockwarden_crd(client).await;
    install_crd(client, &admission_config_crd()).await;
}

/// Creates a cluster-scoped LockAdmissionConfig.
async fn create_config(client: &Client, name: &str, spec: Value) {
    let api = Api::<DynamicObject>::all_with(
        client.clone(),
        &kube::api::ApiResource::erase::<lockwarden::api::LockAdmissionConfig>(&()),
    );
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "lockwarden.io/v1alpha1",
        "kind": "LockAdmissionConfig",
        "metadata": { "name": name },
        "spec": spec,
    }))
    .unwrap();
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("create LockAdmissionConfig {name}: {e}"));
}

/// An AdmissionCheck of lockwarden's whose parameters name LockAdmissionConfig `config`.
pub(super) async fn create_check(client: &Client, name: &str, config: &str) {
    create(
        client,
        "AdmissionCheck",
        "admissionchecks",
        None,
        json!({
            "metadata": { "name": name },
            "spec": {
                "controllerName": LOCKWARDEN,
                "parameters": {
                    "apiGroup": "lockwarden.io", "kind": "LockAdmissionConfig", "name": config,
                },
            },
        }),
    )
    .await;
}

/// A LockAdmissionConfig of `spec` and an AdmissionCheck of lockwarden's naming it;
/// the check's name.
pub(super) async fn lockwarden_check(client: &Client, spec: Value) -> String {
    let (config, check) = (unique("locks"), unique("lockwarden"));
    create_config(client, &config, spec).await;
    create_check(client, &check, &config).await;
    check
}

/// Creates `template` in `ns`.
async fn create_template(client: &Client, ns: &str, template: &DistributedLock) {
    Api::<DistributedLock>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), template)
        .await
        .expect("create the template");
}

/// A ClusterQueue for `ns` alone (quota for 10 of the test's Pods at once, so only the
/// locks limit them) asking `checks`, and a LocalQueue in `ns`.
pub(super) async fn create_queues(client: &Client, ns: &str, checks: &[&str]) -> (String, String) {
    Queues {
        namespace_only: true,
        checks,
        cpu: "100m",
        memory: "160Mi",
        preemption: None,
    }
    .create(client, ns)
    .await
}

/// A template of `permits` on a Lease of the namespace, released (a template).
fn pool_template(permits: u32) -> DistributedLock {
    let mut template = lease_lock("pool", "pool-lease");
    template.spec.release = true;
    template.spec.permits = permits;
    template.spec.lease_duration = "20s".into();
    template.spec.renew_interval = "4s".into();
    template
}

/// The identity the test's controller in `ns` runs as.
pub(super) fn controller_user(ns: &str) -> String {
    format!("lockwarden-kueue-{ns}")
}

/// The API server's audit log over the test so far: lockwarden's identity wrote no Job
/// of `ns` at all (so never its `spec.suspend`), while Kueue's unsuspending writes are
/// there (the log does record them). Returns how many Job writes Kueue made.
pub(super) fn assert_no_job_write_by_lockwarden(node: &Node, ns: &str) -> usize {
    let user = controller_user(ns);
    let writes: Vec<Value> = node
        .plane()
        .audit_events()
        .into_iter()
        .filter(|e| e["objectRef"]["resource"] == "jobs" && e["objectRef"]["namespace"] == ns)
        .collect();
    let ours: Vec<&Value> = writes
        .iter()
        .filter(|e| e["user"]["username"] == user.as_str())
        .collect();
    assert!(
        ours.is_empty(),
        "lockwarden ({user}) wrote Kueue's Jobs: {:#?}",
        ours.iter()
            .map(|e| (&e["verb"], &e["objectRef"]["name"], &e["requestObject"]))
            .collect::<Vec<_>>()
    );
    let unsuspends = writes
        .iter()
        .filter(|e| e["verb"] != "create" && e["requestObject"]["spec"]["suspend"] == false)
        .count();
    assert!(
        unsuspends > 0,
        "the audit log shows no write unsuspending a Job of {ns}: {} Job writes",
        writes.len()
    );
    unsuspends
}

/// The controller, in-process, for `ns` with the AdmissionCheck controller on, as its own
/// identity (the audit log tells its writes apart).
pub(super) async fn start_controller(node: &Node, ns: &str) -> tokio::task::JoinHandle<()> {
    let user = controller_user(ns);
    let kubeconfig = node.plane().user_kubeconfig(&user, Some("system:masters"));
    let client = client_from_kubeconfig(&kubeconfig).await;
    let config = ControllerConfig {
        cluster_name: CLUSTER.into(),
        namespace: Some(ns.to_string()),
        kueue_admission_check: true,
        ..Default::default()
    };
    tokio::spawn(async move {
        if let Err(e) = lockwarden::controller::run(client, config).await {
            panic!("controller failed: {e}");
        }
    })
}

impl Scene {
    /// The namespace, both CRDs, the template (`template`, if any) and config, the
    /// check, the queues, and the controller.
    async fn new(
        prefix: &str,
        template: Option<DistributedLock>,
    ) -> (Scene, tokio::task::JoinHandle<()>) {
        let (node, client, ns) = setup(prefix).await;
        install_crds(&client).await;
        if let Some(template) = template {
            create_template(&client, &ns, &template).await;
        }
        let check = lockwarden_check(
            &client,
            json!({ "templates": [{ "namespace": ns, "name": "pool" }] }),
        )
        .await;
        let (_, queue) = create_queues(&client, &ns, &[&check]).await;
        let controller = start_controller(node, &ns).await;
        let scene = Scene {
            node,
            client,
            ns,
            queue,
            check,
        };
        (scene, controller)
    }

    /// Whether Job `name` is (still) suspended: not admitted.
    async fn suspended(&self, name: &str) -> bool {
        let job = self.jobs().get(name).await.expect("read the Job");
        job.spec.and_then(|s| s.suspend) == Some(true)
    }

    fn jobs(&self) -> Api<Job> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// A queued Job whose container prints the fence Kueue's podSetUpdates gave its Pod
    /// and then works for `seconds`.
    async fn submit(&self, name: &str, seconds: u32) -> Job {
        let script = format!("echo \"fence=$FENCE\"; sleep {seconds}");
        let job = with_fence_env(queued_job(self.node, name, &self.queue, &script));
        self.jobs()
            .create(&PostParams::default(), &job)
            .await
            .unwrap_or_else(|e| panic!("create Job {name}: {e}"))
    }

    /// Our check's entry in the Job's Workload, once it has one.
    async fn check_state(&self, job: &Job) -> Option<Value> {
        let workload = workloads_of(&self.client, &self.ns, job)
            .await
            .into_iter()
            .next()?;
        workload.data["status"]["admissionChecks"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == self.check.as_str())
            .cloned()
    }

    async fn wait_complete(&self, name: &str) -> Job {
        wait_complete(&self.jobs(), name).await
    }

    async fn pod_fences(&self, name: &str) -> Vec<i64> {
        pod_fences(&self.client, &self.ns, name).await
    }
}

/// Waits for Job `name` to complete; fails at once if it failed.
pub(super) async fn wait_complete(jobs: &Api<Job>, name: &str) -> Job {
    eventually(&format!("Job {name} to complete"), TIMEOUT, || async {
        let job = jobs.get(name).await.ok()?;
        let conditions = job.status.as_ref()?.conditions.clone()?;
        if let Some(failed) = conditions
            .iter()
            .find(|c| c.type_ == "Failed" && c.status == "True")
        {
            panic!("Job {name} failed: {failed:?}");
        }
        conditions
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True")
            .then_some(job)
    })
    .await
}

/// The fence annotation of the Pods of Job `name`.
pub(super) async fn pod_fences(client: &Client, ns: &str, name: &str) -> Vec<i64> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("job-name={name}")))
        .await
        .expect("list the Job's Pods")
        .items
        .iter()
        .map(|p| {
            p.annotations()
                .get("lockwarden.io/fence")
                .unwrap_or_else(|| panic!("Pod {} of Job {name} has no fence", p.name_any()))
                .parse()
                .expect("a fence is a number")
        })
        .collect()
}

/// What a watch over a namespace's Jobs saw: the most unsuspended and unfinished at
/// once, and when each Job was first seen unsuspended and first seen finished.
#[derive(Clone, Debug, Default)]
pub(super) struct Watched {
    pub most: usize,
    pub started: Vec<(String, std::time::Instant)>,
    pub finished: Vec<(String, std::time::Instant)>,
}

impl Watched {
    /// The Jobs in the order they were first seen unsuspended.
    pub fn order(&self) -> Vec<String> {
        self.started.iter().map(|(n, _)| n.clone()).collect()
    }

    /// Fences distinct, and rising across every hand-off: a Job first seen running
    /// after another was seen finished has the higher fence. (Two Jobs admitted side by
    /// side on two permits may be unsuspended by Kueue in either order, so their
    /// fences are not compared.)
    pub fn assert_fences_rise(&self, fences: &BTreeMap<String, i64>) {
        let mut distinct: Vec<i64> = fences.values().copied().collect();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            fences.len(),
            "two Jobs share a fence: {fences:?}"
        );
        let mut hand_offs = 0;
        for (later, started) in &self.started {
            for (earlier, ended) in &self.finished {
                if ended < started {
                    hand_offs += 1;
                    assert!(
                        fences[later] > fences[earlier],
                        "{later} started after {earlier} finished with fence {} <= {}: {fences:?}",
                        fences[later],
                        fences[earlier]
                    );
                }
            }
        }
        assert!(
            hand_offs > 0,
            "no Job started after another finished: {self:?}"
        );
    }
}

/// Watches the namespace's Jobs (see [`Watched`]).
pub(super) fn watch_running(
    client: &Client,
    ns: &str,
) -> (Arc<Mutex<Watched>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Watched::default()));
    let record = seen.clone();
    let jobs = Api::<Job>::namespaced(client.clone(), ns);
    let task = tokio::spawn(async move {
        let mut running: BTreeMap<String, bool> = BTreeMap::new();
        let mut stream = watcher(jobs, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Some(Ok(job)) = stream.next().await {
            let name = job.name_any();
            let unsuspended = job.spec.as_ref().and_then(|s| s.suspend) == Some(false);
            let done = job
                .status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True");
            running.insert(name.clone(), unsuspended && !done);
            let now = std::time::Instant::now();
            let mut seen = record.lock().unwrap();
            seen.most = seen.most.max(running.values().filter(|r| **r).count());
            if unsuspended && !seen.started.iter().any(|(n, _)| *n == name) {
                seen.started.push((name.clone(), now));
            }
            if done && !seen.finished.iter().any(|(n, _)| *n == name) {
                seen.finished.push((name, now));
            }
        }
    });
    (seen, task)
}

/// Three Kueue Jobs on a `permits: 2` template: never more than two admitted and
/// unsuspended at once (a watch over the whole run), all three complete, each one's
/// Pods carry the fence of its own lock, and the fences are distinct and increase in
/// grant order: the Job admitted after another finished has the higher fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueue_three_jobs_on_a_semaphore_of_two_run_at_most_two_at_once_with_rising_fences() {
    let (scene, controller) = Scene::new("kueue-sem", Some(pool_template(2))).await;
    let (seen, watch) = watch_running(&scene.client, &scene.ns);
    let names = ["first", "second", "third"];
    for name in names {
        scene.submit(name, 8).await;
    }
    for name in names {
        scene.wait_complete(name).await;
    }
    let seen = seen.lock().unwrap().clone();
    watch.abort();
    let (most, order) = (seen.most, seen.order());
    assert!(most <= 2, "{most} Jobs ran at once on a semaphore of 2");
    assert_eq!(order.len(), 3, "not every Job was seen running: {order:?}");
    let mut fences = BTreeMap::new();
    for name in &order {
        let on_pods = scene.pod_fences(name).await;
        assert!(!on_pods.is_empty(), "Job {name} has no Pods left to read");
        assert!(
            on_pods.windows(2).all(|w| w[0] == w[1]),
            "Job {name}'s Pods carry different fences: {on_pods:?}"
        );
        fences.insert(name.clone(), on_pods[0]);
    }
    seen.assert_fences_rise(&fences);
    let unsuspends = assert_no_job_write_by_lockwarden(scene.node, &scene.ns);
    eprintln!(
        "admitted {order:?} with fences {fences:?}; at most {most} at once; audit: \
         {unsuspends} Job writes unsuspending by Kueue, none by lockwarden"
    );
    controller.abort();
}

/// A template that does not exist (yet): the Workload waits `Pending` with a message
/// naming it, its Job stays suspended; once the template is created the Job runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueue_a_missing_template_keeps_the_workload_pending_naming_it_until_it_appears() {
    let (scene, controller) = Scene::new("kueue-missing", None).await;
    let job = scene.submit("waits", 1).await;
    let check = eventually(
        "the check to name the missing template",
        TIMEOUT,
        || async {
            let check = scene.check_state(&job).await?;
            (check["state"] == "Pending"
                && check["message"].as_str()?.contains("pool")
                && check["message"].as_str()?.contains("does not exist"))
            .then_some(check)
        },
    )
    .await;
    eprintln!("pending: {}", check["message"]);
    assert!(scene.suspended("waits").await, "admitted without its lock");
    Api::<DistributedLock>::namespaced(scene.client.clone(), &scene.ns)
        .create(&PostParams::default(), &pool_template(1))
        .await
        .unwrap();
    scene.wait_complete("waits").await;
    assert_eq!(scene.pod_fences("waits").await.len(), 1);
    controller.abort();
}

/// The Active condition of AdmissionCheck `name`, once lockwarden set it.
async fn active(client: &Client, name: &str) -> (String, String) {
    let checks = Api::<DynamicObject>::all_with(
        client.clone(),
        &resource("AdmissionCheck", "admissionchecks"),
    );
    eventually(
        &format!("AdmissionCheck {name}'s Active condition"),
        TIMEOUT,
        || async {
            let check = checks.get(name).await.ok()?;
            let active = check.data["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Active")?
                .clone();
            Some((
                active["status"].as_str()?.to_string(),
                active["message"].as_str()?.to_string(),
            ))
        },
    )
    .await
}

/// Parameters that cannot be used make the check `Active=False` naming why, and Kueue
/// admits nothing of its ClusterQueue; a check with usable parameters is `Active=True`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueue_invalid_parameters_make_the_admission_check_inactive() {
    let (scene, controller) = Scene::new("kueue-params", Some(pool_template(1))).await;
    assert_eq!(active(&scene.client, &scene.check).await.0, "True");
    let broken = unique("broken");
    create_check(&scene.client, &broken, "no-such-config").await;
    let (status, message) = active(&scene.client, &broken).await;
    assert_eq!(status, "False", "{message}");
    assert!(
        message.contains("no-such-config") && message.contains("does not exist"),
        "{message}"
    );

    // A ClusterQueue asking the broken check admits nothing.
    let (_, queue) = create_queues(&scene.client, &scene.ns, &[&broken]).await;
    let job = queued_job(scene.node, "never", &queue, "true");
    let job = scene
        .jobs()
        .create(&PostParams::default(), &job)
        .await
        .unwrap();
    tokio::time::sleep(NEVER_WITHIN).await;
    for w in workloads_of(&scene.client, &scene.ns, &job).await {
        assert!(
            !condition(&w, "QuotaReserved") && !condition(&w, "Admitted"),
            "{:?}",
            w.data["status"]
        );
    }
    assert!(scene.suspended("never").await, "Job never was admitted");
    controller.abort();
}

/// A ClusterQueue asking two of lockwarden's checks: the second is `Active=False`
/// naming the first (one check takes all of a ClusterQueue's locks, in one order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueue_a_second_lockwarden_check_on_a_cluster_queue_is_inactive() {
    let (scene, controller) = Scene::new("kueue-second", Some(pool_template(1))).await;
    let second = lockwarden_check(
        &scene.client,
        json!({ "templates": [{ "namespace": scene.ns, "name": "pool" }] }),
    )
    .await;
    create_queues(&scene.client, &scene.ns, &[&scene.check, &second]).await;
    let (status, message) = eventually("the second check to be inactive", TIMEOUT, || async {
        let (status, message) = active(&scene.client, &second).await;
        (status == "False").then_some((status, message))
    })
    .await;
    assert!(
        message.contains(&scene.check) && message.contains("one lockwarden check per ClusterQueue"),
        "{status}: {message}"
    );
    // The first check stays active.
    assert_eq!(active(&scene.client, &scene.check).await.0, "True");
    controller.abort();
}

/// A Job whose pod template already sets `lockwarden.io/fence`: Kueue's podSetUpdates
/// could never add it, so the check says `Rejected` naming the annotation, and the Job
/// is never admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueue_a_pod_template_that_sets_the_fence_itself_is_rejected() {
    let (scene, controller) = Scene::new("kueue-clash", Some(pool_template(1))).await;
    let mut job = queued_job(scene.node, "clash", &scene.queue, "true");
    job.spec.as_mut().unwrap().template.metadata = Some(
        serde_json::from_value(json!({ "annotations": { "lockwarden.io/fence": "1" } })).unwrap(),
    );
    let job = scene
        .jobs()
        .create(&PostParams::default(), &job)
        .await
        .unwrap();
    let check = eventually("the check to be Rejected", TIMEOUT, || async {
        let check = scene.check_state(&job).await?;
        (check["state"] == "Rejected").then_some(check)
    })
    .await;
    assert!(
        check["message"]
            .as_str()
            .unwrap()
            .contains("lockwarden.io/fence"),
        "{check}"
    );
    tokio::time::sleep(STILL_NOT_WITHIN).await;
    assert!(scene.suspended("clash").await, "Job clash was admitted");
    controller.abort();
}

/// A Kueue Job that also names a lockwarden lock (gating on its own, as for a plain Job):
/// lockwarden's Job gating leaves it to Kueue with a Warning and writes nothing to it;
/// Kueue admits it (its ClusterQueue asks no lockwarden check) and it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueue_managed_job_with_a_lock_annotation_is_left_to_kueue() {
    let (scene, controller) = Scene::new("kueue-left", Some(pool_template(1))).await;
    let (_, plain_queue) = create_queues(&scene.client, &scene.ns, &[]).await;
    let mut job = queued_job(scene.node, "left", &plain_queue, "true");
    job.metadata.annotations = Some(
        [(
            "lockwarden.io/lock-template".to_string(),
            "pool".to_string(),
        )]
        .into(),
    );
    scene
        .jobs()
        .create(&PostParams::default(), &job)
        .await
        .unwrap();
    wait_event(
        &scene.client,
        &scene.ns,
        "left",
        "Warning",
        "ManagedElsewhere",
        "Kueue admits it",
    )
    .await;
    let done = scene.wait_complete("left").await;
    assert!(
        !done
            .finalizers()
            .iter()
            .any(|f| f.starts_with("lockwarden.io")),
        "lockwarden put its finalizer on a Kueue Job: {:?}",
        done.finalizers()
    );
    assert!(!done.annotations().contains_key("lockwarden.io/status"));
    assert_no_job_write_by_lockwarden(scene.node, &scene.ns);
    controller.abort();
}

/// Eviction by preemption: a running low-priority Job is preempted by a high-priority
/// one in a ClusterQueue with room for one. Kueue resets the low Workload's check to
/// `Pending`; lockwarden lets its acquisition go only once its Pods have ended, the
/// high Job runs with the next fence, and the low Job, admitted again, carries a newer
/// fence than both (a re-admission never reuses the fence of a run that may still be
/// stopping).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueue_eviction_by_preemption_lets_go_after_the_pods_and_readmits_with_a_new_fence() {
    let (node, client, ns) = setup("kueue-preempt").await;
    install_crds(&client).await;
    // Queued, so the high Workload, waiting first, is granted before the low one's
    // next request.
    let mut template = pool_template(1);
    template.spec.queue = true;
    create_template(&client, &ns, &template).await;
    let check = lockwarden_check(
        &client,
        json!({ "templates": [{ "namespace": ns, "name": "pool" }], "pendingTimeout": "2m" }),
    )
    .await;
    let (low, high) = (unique("low"), unique("high"));
    for (name, value) in [(&low, 10), (&high, 1000)] {
        create(
            &client,
            "WorkloadPriorityClass",
            "workloadpriorityclasses",
            None,
            json!({ "metadata": { "name": name }, "value": value }),
        )
        .await;
    }
    // Room for one of the test's Pods (10m CPU each), and preemption by priority.
    let (_, queue) = Queues {
        namespace_only: true,
        checks: &[&check],
        cpu: "10m",
        memory: "16Mi",
        preemption: Some(json!({ "withinClusterQueue": "LowerPriority" })),
    }
    .create(&client, &ns)
    .await;
    let controller = start_controller(node, &ns).await;
    let jobs = Api::<Job>::namespaced(client.clone(), &ns);
    let submit = |name: &'static str, class: String, script: &'static str| {
        let mut job = with_fence_env(queued_job(node, name, &queue, script));
        job.metadata
            .labels
            .get_or_insert_default()
            .insert("kueue.x-k8s.io/priority-class".into(), class);
        let jobs = jobs.clone();
        async move { jobs.create(&PostParams::default(), &job).await.unwrap() }
    };
    // The low Job's first run works until it is preempted; a later run ends at once.
    submit(
        "low",
        low.clone(),
        "echo fence=$FENCE; if [ \"$FENCE\" -le 1 ]; then sleep 600; fi",
    )
    .await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let first = eventually(
        "the low Job's Pod to run with its fence",
        TIMEOUT,
        || async {
            let pod = pods
                .list(&ListParams::default().labels("job-name=low"))
                .await
                .ok()?
                .items
                .into_iter()
                .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))?;
            pod.annotations()
                .get("lockwarden.io/fence")?
                .parse::<i64>()
                .ok()
        },
    )
    .await;

    submit("high", high.clone(), "echo fence=$FENCE").await;
    wait_complete(&jobs, "high").await;
    let high_fence = pod_fences(&client, &ns, "high").await[0];
    wait_complete(&jobs, "low").await;
    let low_fences = pod_fences(&client, &ns, "low").await;
    assert!(
        high_fence > first,
        "the preempting Job ran with fence {high_fence}, not above the preempted run's {first}"
    );
    assert!(
        low_fences.iter().all(|f| *f > high_fence),
        "the re-admitted low Job's Pods carry {low_fences:?}, not above {high_fence} \
         (first run {first})"
    );
    eprintln!(
        "low ran with {first}, was preempted; high ran with {high_fence}; low again with {low_fences:?}"
    );
    controller.abort();
}

/// One key shared with a second cluster: a second controller (another cluster name)
/// holds plain DistributedLocks on the S3 key of the Kueue check's `permits: 2`
/// template. The key's record, read every 200 ms, never lists more than two holders,
/// both clusters' holders appear in it, and every Kueue Job completes once the other
/// cluster lets its permits go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueue_a_key_shared_with_another_cluster_never_has_more_than_its_permits() {
    use crate::support::locks::{aws_secret, s3_lock, timed};
    use crate::support::moto::Moto;
    use crate::support::trials::direct_s3_backend;

    let (node, client, ns) = setup("kueue-shared").await;
    let other_ns = node.namespace(&client, "kueue-other").await;
    install_crds(&client).await;
    for namespace in [&ns, &other_ns] {
        aws_secret(&client, namespace).await;
    }
    let moto = Moto::shared();
    let bucket = moto.new_bucket("kueue-shared").await;
    let key = unique("shared");
    let lock_on_key = |name: &str| {
        let mut lock = timed(
            s3_lock(name, &bucket, &key, moto.endpoint(), "aws"),
            "10s",
            "3s",
        );
        lock.spec.permits = 2;
        lock
    };
    let mut template = lock_on_key("pool");
    template.spec.release = true;
    create_template(&client, &ns, &template).await;
    let check = lockwarden_check(&client, json!({ "templates": [{ "name": "pool" }] })).await;
    let (_, queue) = create_queues(&client, &ns, &[&check]).await;
    let controller = start_controller(node, &ns).await;

    // The other cluster: its own controller and two plain locks holding both permits.
    let other_config = ControllerConfig {
        cluster_name: "kueue-other".into(),
        namespace: Some(other_ns.clone()),
        ..Default::default()
    };
    let other_client = client.clone();
    let other = tokio::spawn(async move {
        if let Err(e) = lockwarden::controller::run(other_client, other_config).await {
            panic!("the other cluster's controller failed: {e}");
        }
    });
    let other_locks = Api::<DistributedLock>::namespaced(client.clone(), &other_ns);
    for name in ["other-1", "other-2"] {
        other_locks
            .create(&PostParams::default(), &lock_on_key(name))
            .await
            .unwrap();
        crate::support::locks::wait_acquired(&other_locks, name, TIMEOUT).await;
    }

    // The record, sampled from here to the end.
    let record = direct_s3_backend(&bucket, &key).await;
    let samples: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let sink = samples.clone();
    let sampler = tokio::spawn(async move {
        loop {
            if let Ok(Some(stored)) = record.inspect().await
                && let Ok(record) = stored.record
            {
                let holders = record
                    .set
                    .map(|s| s.holders.into_iter().map(|h| h.holder).collect())
                    .unwrap_or_default();
                sink.lock().unwrap().push(holders);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });

    let scene = Scene {
        node,
        client: client.clone(),
        ns: ns.clone(),
        queue,
        check,
    };
    let names = ["one", "two", "three"];
    for name in names {
        scene.submit(name, 4).await;
    }
    // The Kueue Jobs wait while the other cluster holds both permits.
    let first = scene.jobs().get("one").await.unwrap();
    eventually(
        "a Kueue Job waiting with 2 of 2 in use",
        TIMEOUT,
        || async {
            let check = scene.check_state(&first).await?;
            check["message"]
                .as_str()?
                .contains("2 of 2 in use")
                .then_some(())
        },
    )
    .await;
    for name in ["other-1", "other-2"] {
        other_locks
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "release": true } })),
            )
            .await
            .unwrap();
    }
    for name in names {
        scene.wait_complete(name).await;
    }
    sampler.abort();
    let samples = samples.lock().unwrap().clone();
    let most = samples.iter().map(Vec::len).max().unwrap_or(0);
    let of = |cluster: &str| {
        samples
            .iter()
            .flatten()
            .any(|h| h.starts_with(&format!("{cluster}/")))
    };
    assert!(
        most <= 2,
        "the record listed {most} holders of a 2-permit key"
    );
    assert!(
        of("kueue-other") && of(CLUSTER),
        "both clusters' holders should appear in the record: {samples:?}"
    );
    eprintln!(
        "{} reads of the shared record: at most {most} holders, both clusters among them",
        samples.len()
    );
    controller.abort();
    other.abort();
}

/// `weightFromPodCount`: each Workload's own lock takes as many permits as it has Pods.
/// A Job of 3 Pods on a 2-permit template could never hold its lock: its check is
/// `Rejected` naming both numbers and it is never admitted; a Job of 2 Pods takes both
/// permits and runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueue_a_workload_with_more_pods_than_permits_is_rejected() {
    let (node, client, ns) = setup("kueue-weight").await;
    install_crds(&client).await;
    let mut template = pool_template(2);
    template.spec.queue = true;
    create_template(&client, &ns, &template).await;
    let check = lockwarden_check(
        &client,
        json!({ "templates": [{ "name": "pool" }], "weightFromPodCount": true }),
    )
    .await;
    let (_, queue) = create_queues(&client, &ns, &[&check]).await;
    let controller = start_controller(node, &ns).await;
    let scene = Scene {
        node,
        client: client.clone(),
        ns: ns.clone(),
        queue,
        check,
    };
    let pods = |name: &str, count: i32| {
        let mut job = with_fence_env(queued_job(node, name, &scene.queue, "echo fence=$FENCE"));
        let spec = job.spec.as_mut().unwrap();
        spec.parallelism = Some(count);
        spec.completions = Some(count);
        job
    };
    let wide = scene
        .jobs()
        .create(&PostParams::default(), &pods("wide", 3))
        .await
        .unwrap();
    let check = eventually("the 3-Pod Workload's check Rejected", TIMEOUT, || async {
        let check = scene.check_state(&wide).await?;
        (check["state"] == "Rejected").then_some(check)
    })
    .await;
    let message = check["message"].as_str().unwrap();
    assert!(
        message.contains("3 permits") && message.contains("which has 2"),
        "{message}"
    );
    scene
        .jobs()
        .create(&PostParams::default(), &pods("pair", 2))
        .await
        .unwrap();
    scene.wait_complete("pair").await;
    let fences = pod_fences(&client, &ns, "pair").await;
    assert_eq!(fences.len(), 2, "{fences:?}");
    assert!(fences.windows(2).all(|w| w[0] == w[1]), "{fences:?}");
    assert!(scene.suspended("wide").await, "the 3-Pod Job was admitted");
    controller.abort();
}

/// A Workload waiting for its lock holds its ClusterQueue's quota: after the
/// parameters' `pendingTimeout` with quota reserved its check says `Retry` with
/// `requeueAfterSeconds` = `retryAfter` and a message saying so, Kueue gives the quota
/// back (the Workload is evicted and requeued), and once the holder lets the key go the
/// Workload is admitted and runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueue_a_workload_waiting_past_its_pending_timeout_gives_the_quota_back_and_runs_later() {
    let (node, client, ns) = setup("kueue-timeout").await;
    install_crds(&client).await;
    create_template(&client, &ns, &pool_template(1)).await;
    let check = lockwarden_check(
        &client,
        json!({
            "templates": [{ "name": "pool" }],
            "pendingTimeout": PENDING_TIMEOUT,
            "retryAfter": RETRY_AFTER,
        }),
    )
    .await;
    let (_, queue) = create_queues(&client, &ns, &[&check]).await;
    let controller = start_controller(node, &ns).await;
    // Another holder of the template's key (its Lease), in the same namespace.
    let locks = Api::<DistributedLock>::namespaced(client.clone(), &ns);
    locks
        .create(&PostParams::default(), &lease_lock("blocker", "pool-lease"))
        .await
        .unwrap();
    crate::support::locks::wait_acquired(&locks, "blocker", TIMEOUT).await;

    let scene = Scene {
        node,
        client: client.clone(),
        ns: ns.clone(),
        queue,
        check,
    };
    let job = scene.submit("patient", 1).await;
    let retry = eventually(
        "the check to say Retry after the pending timeout",
        TIMEOUT,
        || async {
            let check = scene.check_state(&job).await?;
            (check["state"] == "Retry").then_some(check)
        },
    )
    .await;
    assert_eq!(retry["requeueAfterSeconds"], RETRY_AFTER_SECONDS, "{retry}");
    let message = retry["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("pendingTimeout {PENDING_TIMEOUT}"))
            && message.contains("quota goes back"),
        "{message}"
    );
    // Kueue took the quota back.
    eventually("the Workload's quota given back", TIMEOUT, || async {
        let workload = workloads_of(&client, &ns, &job).await.into_iter().next()?;
        (!condition(&workload, "QuotaReserved")).then_some(())
    })
    .await;
    assert!(
        scene.suspended("patient").await,
        "admitted while the key was held"
    );
    locks.delete("blocker", &Default::default()).await.unwrap();
    scene.wait_complete("patient").await;
    assert_eq!(scene.pod_fences("patient").await.len(), 1);
    controller.abort();
}

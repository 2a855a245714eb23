//! lockwarden on a real node (tests/support/node.rs: kube-scheduler, containerd and a
//! kubelet beside a control plane of their own): the chart installed with `helm install`
//! from lockwarden's image built by the repository's Dockerfile, the controller running
//! in a Pod on its RBAC alone, and gated workloads whose containers really run and read
//! their fence; failover.rs: locks held through the controller's SIGKILL and its Pod's deletion.
//!
//! Every connection stays on 127.0.0.1: the Pods use `hostNetwork: true`, the
//! controller reaches the API server through `KUBERNETES_SERVICE_HOST/PORT` set to its
//! loopback address (there is no kube-proxy for the `kubernetes` Service), and its
//! probes go to `host: 127.0.0.1`. Two host-network Pods cannot share a port on one
//! node, so the release runs one replica with the `Recreate` strategy; the standby
//! takeover stays covered by the process-level leader-election tests.
//!
//! Run with `--test-threads=16` (every test of the binary at once; the suite runner
//! passes the same): the tests that only share the node and the release's controller
//! run side by side, and what must not overlap is ordered by two locks, not by the
//! harness's threads ([`CONTROLLER`], [`KUBELET`]; taken in that order of the kubelet's
//! first). A test that faults the release's controller (SIGSTOP, scaled to zero, killed
//! or upgraded: guard.rs, failover.rs) takes [`CONTROLLER`] alone, since every test
//! relying on it holds locks it renews and Jobs it gates, which its outage would expire
//! or stop; the trial that cuts the kubelet from the API server takes [`KUBELET`] alone,
//! since no Pod on the node starts, stops or reports while it lasts. The durations of
//! the tests that wait out real time come from `support::timescale`.

mod failover;
mod guard;
mod once;
mod stop;
use lockwarden_testsupport as support;

use std::path::Path;
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use lockwarden::api::DistributedLock;
use serde_json::{Value, json};
use support::kube::install_lockwarden_crd;
use support::locks::{acquired, lease_lock, wait_acquired};
use support::node::Node;
use support::{eventually, free_port, repo_root, tool, unique};

/// Generous: a loaded 2-core machine, and a Pod's start includes its image's unpacking.
const TIMEOUT: Duration = Duration::from_secs(180);

/// The release's namespace (privileged: the test release needs hostNetwork).
const RELEASE_NAMESPACE: &str = "lockwarden-system";
const RELEASE: &str = "lockwarden";
/// The release's `clusterName`: the first part of every holder identity it writes.
const CLUSTER_NAME: &str = "node-test";

/// The failover test's namespace: the release may read Secrets there (its S3 locks'
/// credentials), so it exists before the release and has this fixed name.
const FAILOVER_NAMESPACE: &str = "node-failover";
/// The same for stop.rs's S3 trials: a namespace of their own, so that nothing of
/// theirs is still there when the failover test counts and watches every lock of its
/// namespace.
const STOP_NAMESPACE: &str = "node-stop";
/// once.rs's S3 locks' namespace, for the same reason.
const ONCE_NAMESPACE: &str = "node-once";

/// The chart's test-only values for a one-node cluster with no Pod network.
fn release_values(node: &Node, metrics_port: u16) -> Value {
    let (repository, tag) = node
        .images()
        .lockwarden
        .rsplit_once(':')
        .expect("an image reference with a tag");
    json!({
        "image": { "repository": repository, "tag": tag, "pullPolicy": "Never" },
        "clusterName": CLUSTER_NAME,
        "replicaCount": 1,
        "strategy": { "type": "Recreate" },
        "hostNetwork": true,
        "terminationGracePeriodSeconds": support::timescale::RELEASE_GRACE_SECONDS,
        "metrics": { "port": metrics_port },
        "probes": { "host": "127.0.0.1" },
        "rbac": { "secretNamespaces": [FAILOVER_NAMESPACE, STOP_NAMESPACE, ONCE_NAMESPACE] },
        "extraEnv": [
            { "name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1" },
            { "name": "KUBERNETES_SERVICE_PORT", "value": node.plane().port().to_string() },
        ],
    })
}

/// `helm ARGS` against the node's control plane.
fn helm(node: &Node, args: &[&str]) -> Output {
    let helm_home = node.dir().join("helm");
    Command::new(tool("HELM"))
        .args(args)
        .arg("--kubeconfig")
        .arg(node.plane().kubeconfig_path())
        .env("HELM_CACHE_HOME", helm_home.join("cache"))
        .env("HELM_CONFIG_HOME", helm_home.join("config"))
        .env("HELM_DATA_HOME", helm_home.join("data"))
        .output()
        .expect("run helm")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The chart installed once per test binary with `helm install` (the CRD from the
/// chart's `crds/`).
fn release() {
    static RELEASE_ONCE: OnceLock<Result<(), String>> = OnceLock::new();
    let result = RELEASE_ONCE.get_or_init(|| {
        std::thread::spawn(install_release).join().map_err(|p| {
            p.downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "helm install panicked".into())
        })
    });
    if let Err(msg) = result {
        panic!("the release did not install:\n{msg}");
    }
}

fn install_release() {
    let node = Node::shared();
    let values = node.dir().join("release-values.yaml");
    std::fs::write(
        &values,
        serde_json::to_string_pretty(&release_values(node, free_port())).unwrap(),
    )
    .expect("write the release's values");
    // rbac.secretNamespaces: a Role in each, so the namespaces first.
    for namespace in [FAILOVER_NAMESPACE, STOP_NAMESPACE, ONCE_NAMESPACE] {
        let out = Command::new(tool("KUBECTL"))
            .arg("--kubeconfig")
            .arg(node.plane().kubeconfig_path())
            .args(["create", "namespace", namespace])
            .output()
            .expect("run kubectl");
        assert!(
            out.status.success(),
            "kubectl create namespace {namespace}: {}",
            text_of(&out)
        );
    }
    let chart = repo_root().join("charts/lockwarden");
    let out = helm(
        node,
        &[
            "install",
            RELEASE,
            &chart.display().to_string(),
            "--namespace",
            RELEASE_NAMESPACE,
            "--create-namespace",
            "--values",
            &values.display().to_string(),
        ],
    );
    assert!(
        out.status.success(),
        "helm install failed:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// The Pods of the release's Deployment.
async fn controller_pods(client: &Client) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), RELEASE_NAMESPACE)
        .list(&ListParams::default().labels("app.kubernetes.io/instance=lockwarden"))
        .await
        .expect("list the controller's Pods")
        .items
}

/// The PID of the controller container's `lockwarden` process on this host: the one in
/// the Pod's cgroup (other lockwarden processes may run on the machine).
pub(crate) fn controller_pid(pod: &Pod) -> Option<i32> {
    let uid = pod.metadata.uid.as_deref()?;
    // The cgroupfs driver names a Pod's cgroup pod<uid>.
    let needle = format!("pod{uid}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        let cgroup = std::fs::read_to_string(e.path().join("cgroup")).ok()?;
        (comm.trim() == "lockwarden" && cgroup.contains(&needle)).then_some(pid)
    })
}

fn condition(pod: &Pod, type_: &str) -> Option<(String, Option<String>)> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

fn is_true(pod: &Pod, type_: &str) -> bool {
    condition(pod, type_).is_some_and(|(status, _)| status == "True")
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// What a Pod is doing, for failure messages: phase, conditions, container states.
fn describe(pod: &Pod) -> String {
    let status = pod.status.as_ref();
    format!(
        "{} phase {:?} conditions {:?} containers {:?}",
        pod.name_any(),
        phase(pod),
        status.and_then(|s| s.conditions.as_ref()).map(|c| c
            .iter()
            .map(|c| format!("{}={} {:?}", c.type_, c.status, c.reason))
            .collect::<Vec<_>>()),
        status.and_then(|s| s.container_statuses.as_ref()).map(|c| c
            .iter()
            .map(|c| format!("{}: {:?}", c.name, c.state))
            .collect::<Vec<_>>()),
    )
}

/// Waits (up to `TIMEOUT`) until the release's controller Pod is Running and Ready;
/// returns it. A failure shows every Pod's state and the kubelet's log.
async fn wait_controller_ready(node: &Node, client: &Client) -> Pod {
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let pods = controller_pods(client).await;
        if let Some(pod) = pods
            .iter()
            .find(|p| phase(p) == "Running" && is_true(p, "Ready"))
        {
            return pod.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the controller Pod is not Running and Ready after {TIMEOUT:?}: {:?}\nkubelet log:\n{}",
            pods.iter().map(describe).collect::<Vec<_>>(),
            node.kubelet_log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Tests that rely on the release's controller share it (read); a test that faults it
/// (SIGSTOP, scale to zero, SIGKILL, Pod deletion, upgrade) takes it alone
/// ([`exclusive`]), so no other test sees its faults: their locks would expire and their
/// Jobs stop while it is out.
static CONTROLLER: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Tests that run Pods on the node share the kubelet (read); the trial that cuts it from
/// the API server takes it alone ([`exclusive`]): while it is cut no Pod on the node
/// starts, stops or reports its state, whosever it is. Taken before [`CONTROLLER`].
static KUBELET: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// `lock` for writing, taken only when no test holds it: unlike `write()` (tokio's lock
/// is fair), a writer waiting here never holds back new readers, so the tests that
/// share the node run side by side first and those that take it alone after them, one
/// at a time. It first gives the tests started with it (all of them, with
/// `--test-threads=16`) two seconds to take their shares, which they do first thing.
async fn exclusive(
    lock: &'static tokio::sync::RwLock<()>,
) -> tokio::sync::RwLockWriteGuard<'static, ()> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    loop {
        if let Ok(guard) = lock.try_write() {
            return guard;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What a test shares with the others until dropped: the kubelet and the release's
/// controller.
struct Shared {
    _controller: tokio::sync::RwLockReadGuard<'static, ()>,
    _kubelet: tokio::sync::RwLockReadGuard<'static, ()>,
}

/// The node, its admin client, the CRD (installed by the release) and the release's
/// controller Ready; the guard shares the kubelet and the controller with other tests
/// until dropped.
async fn with_controller() -> (&'static Node, Client, Shared) {
    let kubelet = KUBELET.read().await;
    let controller = CONTROLLER.read().await;
    let (node, client) = controller_ready().await;
    let shared = Shared {
        _controller: controller,
        _kubelet: kubelet,
    };
    (node, client, shared)
}

/// How long a trivial Pod (the workload image, host network) takes on this node from
/// its creation to `Running`: the measured floor the failover test's leases are sized
/// by (`timescale::failover_lease`), measured once per binary. The caller shares the
/// kubelet.
async fn pod_start(node: &Node, client: &Client) -> Duration {
    support::timescale::pod_start(|| async {
        let ns = node.namespace(client, "node-timescale").await;
        let pods = Api::<Pod>::namespaced(client.clone(), &ns);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": "start" },
            "spec": {
                "hostNetwork": true,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "containers": [{
                    "name": "start", "image": node.images().workload, "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                }],
            },
        }))
        .unwrap();
        let created = std::time::Instant::now();
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("create the Pod to time");
        eventually("the timed Pod Running", TIMEOUT, || async {
            pods.get("start")
                .await
                .ok()
                .filter(|p| phase(p) == "Running")
        })
        .await;
        let took = created.elapsed();
        delete_namespace(client, &ns).await;
        took
    })
    .await
}

/// The node, its admin client, the CRD and the release's controller Ready.
async fn controller_ready() -> (&'static Node, Client) {
    let node = Node::shared();
    release();
    let client = node.client().await;
    install_lockwarden_crd(&client).await;
    wait_controller_ready(node, &client).await;
    (node, client)
}

/// A container's output, read from the kubelet through the API server.
async fn logs(client: &Client, ns: &str, pod: &str) -> String {
    Api::<Pod>::namespaced(client.clone(), ns)
        .logs(pod, &LogParams::default())
        .await
        .unwrap_or_else(|e| panic!("read the logs of {ns}/{pod}: {e}"))
}

/// The node is Ready, and an ordinary Pod (the workload image, host network) runs to
/// completion there: its output is read back through the API server from the kubelet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_is_ready_and_runs_a_pod() {
    let _kubelet = KUBELET.read().await;
    let node = Node::shared();
    let client = node.client().await;
    let ns = node.namespace(&client, "node-pod").await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "hello" },
        "spec": {
            "hostNetwork": true,
            "restartPolicy": "Never",
            "containers": [{
                "name": "hello", "image": node.images().workload, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "echo hello from $(hostname)"],
            }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create a Pod");
    let done = eventually("Pod hello to succeed", TIMEOUT, || async {
        pods.get("hello")
            .await
            .ok()
            .filter(|p| phase(p) == "Succeeded")
    })
    .await;
    assert_eq!(
        done.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(support::node::NODE_NAME),
        "bound by the scheduler to the node"
    );
    let out = logs(&client, &ns, "hello").await;
    assert!(out.starts_with("hello from "), "the Pod's output: {out:?}");
    delete_namespace(&client, &ns).await;
}

/// `helm install` with the image built from the repository's Dockerfile: the controller
/// Pod runs that image, as uid 65532, and is Running and Ready (its probes pass); it
/// acquires a DistributedLock (a Lease) on the chart's RBAC alone, with the
/// ServiceAccount token the kubelet mounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_runs_the_controller_which_acquires_a_lock() {
    let (node, client, _shared) = with_controller().await;
    let pod = wait_controller_ready(node, &client).await;
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(
        spec.containers[0].image.as_deref(),
        Some(node.images().lockwarden.as_str())
    );
    assert_eq!(spec.host_network, Some(true));
    let user = spec.security_context.as_ref().and_then(|s| s.run_as_user);
    assert_eq!(user, Some(65532));
    assert!(
        spec.volumes.iter().flatten().any(|v| v.projected.is_some()),
        "the ServiceAccount token volume is mounted: {:?}",
        spec.volumes
    );

    let ns = node.namespace(&client, "node-lock").await;
    let locks = Api::<DistributedLock>::namespaced(client.clone(), &ns);
    locks
        .create(&PostParams::default(), &lease_lock("first", "first"))
        .await
        .expect("create a DistributedLock");
    let lock = wait_acquired(&locks, "first", TIMEOUT).await;
    let status = lock.status.as_ref().unwrap();
    let holder = status.holder.clone().unwrap_or_default();
    assert!(
        holder.starts_with(&format!("{CLUSTER_NAME}/")),
        "held by the in-cluster controller (cluster name {CLUSTER_NAME}): {holder:?}"
    );
    let lease = Api::<Lease>::namespaced(client.clone(), &ns)
        .get("first")
        .await
        .expect("the Lease the controller wrote");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some(holder.as_str())
    );
    delete_namespace(&client, &ns).await;
}

/// The chart's *default* render is admitted by a server-side dry-run into a namespace
/// enforcing Pod Security "restricted", without a PodSecurity warning; the test
/// release's render (hostNetwork) is warned about there, so the check is live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_render_is_admitted_under_pod_security_restricted() {
    let node = Node::shared();
    let client = node.client().await;
    let ns = node.namespace(&client, "node-psa").await;
    let namespaces = Api::<Namespace>::all(client.clone());
    let labels = json!({ "metadata": { "labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }}});
    namespaces
        .patch(&ns, &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .expect("label the namespace");
    let chart = repo_root().join("charts/lockwarden");
    let render = |values: Option<&Path>| {
        let mut args = vec![
            "template".to_string(),
            "psa".into(),
            chart.display().to_string(),
            "--namespace".into(),
            ns.clone(),
        ];
        if let Some(values) = values {
            args.extend(["--values".into(), values.display().to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = helm(node, &args);
        assert!(out.status.success(), "helm template: {}", text(&out.stderr));
        text(&out.stdout)
    };
    let dry_run = |manifests: String| {
        kubectl_with_input(
            node,
            &["apply", "--dry-run=server", "-n", &ns, "-f", "-"],
            &manifests,
        )
    };

    let out = dry_run(render(None));
    let stderr = text(&out.stderr);
    assert!(
        out.status.success(),
        "the default render is refused: {stderr}"
    );
    assert!(
        text(&out.stdout).contains("deployment.apps/psa-lockwarden"),
        "{}",
        text(&out.stdout)
    );
    assert!(
        !stderr.contains("PodSecurity"),
        "the default render violates restricted: {stderr}"
    );

    // Release values first written by release(); write them here too so this test does
    // not depend on another test having installed the release.
    let values = node.dir().join(unique("psa-values"));
    std::fs::write(&values, release_values(node, 8080).to_string()).unwrap();
    let out = dry_run(render(Some(&values)));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("would violate PodSecurity") && stderr.contains("host namespaces"),
        "the hostNetwork render is not warned about under restricted: {stderr}"
    );
    delete_namespace(&client, &ns).await;
}

/// A Job of one hostNetwork Pod running the workload image, gated on `lock`, whose
/// container prints its fence from the environment and from a downward-API file,
/// appends three lines with it to `register/lines`, waits for `register/go-<name>`,
/// and appends a last line.
fn gated_job(name: &str, lock: &str, image: &str, register: &Path) -> Job {
    let script = format!(
        r#"echo "fence from env: $LOCKWARDEN_FENCE"
echo "fence from file: $(cat /etc/lockwarden/fence)"
for i in 1 2 3; do echo "{name} $LOCKWARDEN_FENCE $i" >> /register/lines; sleep 0.1; done
while [ ! -e /register/go-{name} ]; do sleep 0.1; done
echo "{name} $LOCKWARDEN_FENCE last" >> /register/lines"#
    );
    let container = json!({
        "name": "work", "image": image, "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
        "env": [{ "name": "LOCKWARDEN_FENCE", "valueFrom": { "fieldRef": {
            "fieldPath": "metadata.annotations['lockwarden.io/fence']" } } }],
        "volumeMounts": [
            { "name": "lockwarden", "mountPath": "/etc/lockwarden", "readOnly": true },
            { "name": "register", "mountPath": "/register" },
        ],
    });
    let volumes = json!([
        { "name": "lockwarden", "downwardAPI": { "items": [{ "path": "fence",
            "fieldRef": { "fieldPath": "metadata.annotations['lockwarden.io/fence']" } }] } },
        { "name": "register", "hostPath": { "path": register, "type": "Directory" } },
    ]);
    gated_host_network_job(name, lock, container, Some(volumes))
}

/// A suspended Job gated on `lock` of one hostNetwork Pod, never restarted nor retried
/// and stopped within a second, that runs `container` (with the Pod's `volumes`, if
/// any).
fn gated_host_network_job(name: &str, lock: &str, container: Value, volumes: Option<Value>) -> Job {
    let mut job = json!({
        "metadata": { "name": name, "annotations": { "lockwarden.io/lock": lock } },
        "spec": {
            "suspend": true,
            "backoffLimit": 0,
            "template": { "spec": {
                "hostNetwork": true,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [container],
            }},
        },
    });
    if let Some(volumes) = volumes {
        job["spec"]["template"]["spec"]["volumes"] = volumes;
    }
    serde_json::from_value(job).expect("a Job")
}

/// The register's lines, `(job, fence, what)`.
fn register_lines(register: &Path) -> Vec<(String, i64, String)> {
    std::fs::read_to_string(register.join("lines"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let mut parts = l.split(' ');
            let job = parts.next().unwrap_or_default().to_string();
            let fence = parts
                .next()
                .and_then(|f| f.parse().ok())
                .unwrap_or_else(|| panic!("register line without a fence: {l:?}"));
            (job, fence, parts.next().unwrap_or_default().to_string())
        })
        .collect()
}

/// Waits until Job `job`'s container has appended its first line; returns its fence.
async fn wait_first_line(register: &Path, job: &str) -> i64 {
    eventually(
        &format!("Job {job}'s first register line"),
        TIMEOUT,
        || async {
            register_lines(register)
                .into_iter()
                .find(|(j, _, _)| j == job)
                .map(|(_, fence, _)| fence)
        },
    )
    .await
}

async fn job_pod(client: &Client, ns: &str, job: &str) -> Pod {
    let pods = support::kube::job_pods(client, ns, job).await;
    assert_eq!(pods.len(), 1, "Job {job} has one Pod: {pods:?}");
    pods.into_iter().next().unwrap()
}

async fn wait_job_complete(client: &Client, ns: &str, job: &str) {
    let jobs = Api::<Job>::namespaced(client.clone(), ns);
    eventually(&format!("Job {job} to complete"), TIMEOUT, || async {
        let job = jobs.get(job).await.ok()?;
        job.status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True")
            .then_some(())
    })
    .await
}

/// Two gated Jobs on one DistributedLock: the first one's container prints the fence
/// of the lock's `status.fence` (from the environment and the downward-API file) and
/// registers lines with it; the second stays suspended while the first runs, and its
/// first register line comes after the first Job's last, with a higher fence, equal to
/// the lock's `status.fence` then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gated_jobs_run_one_after_another_with_their_fences() {
    let (node, client, _shared) = with_controller().await;
    let ns = node.namespace(&client, "node-jobs").await;
    let register = node.host_dir("register");
    let locks = Api::<DistributedLock>::namespaced(client.clone(), &ns);
    let jobs = Api::<Job>::namespaced(client.clone(), &ns);
    locks
        .create(
            &PostParams::default(),
            &lease_lock("migration", "migration"),
        )
        .await
        .expect("create the lock");
    let image = &node.images().workload;
    jobs.create(
        &PostParams::default(),
        &gated_job("first", "migration", image, &register),
    )
    .await
    .expect("create Job first");
    let first_fence = wait_first_line(&register, "first").await;
    // The first Job runs: the lock is held for it, with the fence its container read.
    let lock = locks.get("migration").await.unwrap();
    assert!(acquired(&lock), "the lock is held while Job first runs");
    assert_eq!(lock.status.as_ref().unwrap().fence, Some(first_fence));

    jobs.create(
        &PostParams::default(),
        &gated_job("second", "migration", image, &register),
    )
    .await
    .expect("create Job second");
    // The controller sees the second Job and keeps it suspended (the lock is taken).
    eventually("Job second to be reported waiting", TIMEOUT, || async {
        let job = jobs.get("second").await.ok()?;
        let status = job.annotations().get("lockwarden.io/status")?.clone();
        (job.spec?.suspend == Some(true)).then_some(status)
    })
    .await;
    assert!(
        register_lines(&register)
            .iter()
            .all(|(j, _, _)| j == "first"),
        "Job second ran while first held the lock: {:?}",
        register_lines(&register)
    );

    std::fs::write(register.join("go-first"), "").unwrap();
    wait_job_complete(&client, &ns, "first").await;
    let second_fence = wait_first_line(&register, "second").await;
    let lock = locks.get("migration").await.unwrap();
    assert!(acquired(&lock), "the lock is held while Job second runs");
    assert_eq!(lock.status.as_ref().unwrap().fence, Some(second_fence));
    assert!(
        second_fence > first_fence,
        "fences {first_fence} then {second_fence}"
    );
    std::fs::write(register.join("go-second"), "").unwrap();
    wait_job_complete(&client, &ns, "second").await;

    let lines = register_lines(&register);
    let last_of_first = lines.iter().rposition(|(j, _, _)| j == "first").unwrap();
    let first_of_second = lines.iter().position(|(j, _, _)| j == "second").unwrap();
    assert!(
        last_of_first < first_of_second,
        "Job second's first line is not after Job first's last: {lines:?}"
    );
    assert_eq!(lines[last_of_first].2, "last", "{lines:?}");
    for (job, fence) in [("first", first_fence), ("second", second_fence)] {
        assert!(
            lines
                .iter()
                .filter(|(j, _, _)| j == job)
                .all(|(_, f, _)| *f == fence),
            "Job {job} registered another fence than {fence}: {lines:?}"
        );
        let pod = job_pod(&client, &ns, job).await;
        let out = logs(&client, &ns, &pod.name_any()).await;
        assert!(
            out.contains(&format!("fence from env: {fence}\n"))
                && out.contains(&format!("fence from file: {fence}\n")),
            "Job {job}'s container did not print fence {fence}: {out:?}"
        );
    }
    delete_namespace(&client, &ns).await;
}

/// A gated Pod (examples/pod-gated.yaml: a lock template on a key another lock holds)
/// under the real scheduler: `PodScheduled=False` reason `SchedulingGated` while the key
/// is held elsewhere; once that lock is released the Pod is ungated, scheduled and
/// Running, and its container prints the fence of its own lock from its downward-API
/// file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gated_pod_is_scheduling_gated_while_held_elsewhere_then_runs_with_its_fence() {
    let (node, client, _shared) = with_controller().await;
    let ns = node.namespace(&client, "node-gated-pod").await;
    let locks = Api::<DistributedLock>::namespaced(client.clone(), &ns);
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    locks
        .create(&PostParams::default(), &lease_lock("holder", "singleton"))
        .await
        .expect("create the holding lock");
    let holder = wait_acquired(&locks, "holder", TIMEOUT).await;
    let mut template = lease_lock("singleton", "singleton");
    template.spec.release = true;
    locks
        .create(&PostParams::default(), &template)
        .await
        .expect("create the template");

    let pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": "worker",
            "labels": { "lockwarden.io/gated": "true" },
            "annotations": { "lockwarden.io/lock-template": "singleton",
                             "lockwarden.io/on-lock-lost": "delete" },
        },
        "spec": {
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 1,
            "schedulingGates": [{ "name": "lockwarden.io/lock" }],
            "containers": [{
                "name": "worker", "image": node.images().workload, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "echo active with fence $(cat /etc/lockwarden/fence); sleep 3600"],
                "volumeMounts": [{ "name": "lockwarden", "mountPath": "/etc/lockwarden", "readOnly": true }],
            }],
            "volumes": [{ "name": "lockwarden", "downwardAPI": { "items": [{ "path": "fence",
                "fieldRef": { "fieldPath": "metadata.annotations['lockwarden.io/fence']" } }] } }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create the gated Pod");
    // The controller made the Pod's own lock, which waits for the key.
    let waiting = eventually(
        "the Pod reported waiting, SchedulingGated",
        TIMEOUT,
        || async {
            let pod = pods.get("worker").await.ok()?;
            let status = pod.annotations().get("lockwarden.io/status")?.clone();
            (condition(&pod, "PodScheduled")
                == Some(("False".into(), Some("SchedulingGated".into())))
                && status.contains("waiting"))
            .then_some(status)
        },
    )
    .await;
    assert!(
        acquired(&locks.get("holder").await.unwrap()),
        "the key is held elsewhere while the Pod is gated ({waiting})"
    );
    let pod = pods.get("worker").await.unwrap();
    assert_eq!(phase(&pod), "Pending");
    assert!(pod.spec.as_ref().unwrap().node_name.is_none());

    let release = json!({ "spec": { "release": true } });
    locks
        .patch("holder", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .expect("release the holding lock");
    let running = eventually("the Pod to run", TIMEOUT, || async {
        pods.get("worker").await.ok().filter(|p| {
            phase(p) == "Running"
                && is_true(p, "PodScheduled")
                && p.spec
                    .as_ref()
                    .is_some_and(|s| s.scheduling_gates.as_ref().is_none_or(|g| g.is_empty()))
        })
    })
    .await;
    let fence = fence_of(&running, "the running Pod's fence annotation");
    let own = own_lock_of(&locks, "worker", "the Pod's own DistributedLock").await;
    assert_eq!(own.status.as_ref().and_then(|s| s.fence), Some(fence));
    assert!(fence > holder.status.as_ref().unwrap().fence.unwrap());
    let out = eventually("the container's output", TIMEOUT, || async {
        let out = pods.logs("worker", &LogParams::default()).await.ok()?;
        (!out.is_empty()).then_some(out)
    })
    .await;
    assert_eq!(out.trim(), format!("active with fence {fence}"));
    delete_namespace(&client, &ns).await;
}

/// Deletes a test's namespace (its Pods are stopped by the kubelet; the node's teardown
/// checks nothing is left).
async fn delete_namespace(client: &Client, ns: &str) {
    Api::<Namespace>::all(client.clone())
        .delete(ns, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete namespace {ns}: {e}"));
}

/// An example file applied to the node with kubectl, its image swapped for the local
/// workload image (nothing else changed: its Pods use the node's loopback-only Pod
/// network, which they never need).
async fn apply_example(node: &Node, ns: &str, file: &str) {
    let text = std::fs::read_to_string(repo_root().join("examples").join(file))
        .unwrap_or_else(|e| panic!("read examples/{file}: {e}"));
    assert!(text.contains("image: busybox:1.36"), "examples/{file}");
    let text = text.replace(
        "image: busybox:1.36",
        &format!("image: {}", node.images().workload),
    );
    let out = kubectl_with_input(node, &["apply", "-n", ns, "-f", "-"], &text);
    assert!(
        out.status.success(),
        "kubectl apply examples/{file}: {}",
        text_of(&out)
    );
}

/// kubectl on the node's cluster with `args`, `input` on its stdin; its output.
fn kubectl_with_input(node: &Node, args: &[&str], input: &str) -> Output {
    let mut child = Command::new(tool("KUBECTL"))
        .arg("--kubeconfig")
        .arg(node.plane().kubeconfig_path())
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run kubectl");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().expect("kubectl output")
}

/// The fence the controller annotated `pod` with; `what` names it if it is missing.
fn fence_of(pod: &Pod, what: &str) -> i64 {
    pod.annotations()
        .get("lockwarden.io/fence")
        .and_then(|f| f.parse().ok())
        .expect(what)
}

/// The DistributedLock that the Pod named `pod` owns (a gated Pod's own lock); `what`
/// names it if there is none.
async fn own_lock_of(locks: &Api<DistributedLock>, pod: &str, what: &str) -> DistributedLock {
    locks
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|l| {
            l.owner_references()
                .iter()
                .any(|o| o.kind == "Pod" && o.name == pod)
        })
        .expect(what)
}

/// What a watch saw of one DistributedLock's status: the fences it carried, in order,
/// and whether it was `Released` after holding.
#[derive(Clone, Default)]
struct FencesSeen {
    fences: Vec<i64>,
    released: bool,
}

/// Watches DistributedLock `name` until dropped, recording its status's fences.
struct StatusFences {
    seen: std::sync::Arc<std::sync::Mutex<FencesSeen>>,
    task: tokio::task::JoinHandle<()>,
}

impl StatusFences {
    fn seen(&self) -> FencesSeen {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for StatusFences {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn status_fences(locks: Api<DistributedLock>, name: &str) -> StatusFences {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let seen = std::sync::Arc::new(std::sync::Mutex::new(FencesSeen::default()));
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let record = seen.clone();
    let task = tokio::spawn(async move {
        let mut events = watcher(locks, config).applied_objects().boxed();
        while let Some(event) = events.next().await {
            let Ok(lock) = event else { continue };
            let Some(status) = lock.status else { continue };
            let mut seen = record.lock().unwrap();
            if let Some(fence) = status.fence
                && seen.fences.last() != Some(&fence)
            {
                seen.fences.push(fence);
            }
            let released = status.phase == Some(lockwarden::api::LockPhase::Released);
            seen.released |= released && !seen.fences.is_empty();
        }
    });
    StatusFences { seen, task }
}

fn text_of(out: &Output) -> String {
    format!("{}{}", text(&out.stdout), text(&out.stderr))
}

/// examples/job-gated.yaml as written (the image swapped): the Job runs once its lock
/// is held and its container prints the lock's fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_job_gated_runs_on_the_node_with_its_fence() {
    let (node, client, _shared) = with_controller().await;
    let ns = node.namespace(&client, "node-example-job").await;
    // The lock is released (status.fence cleared) as soon as the Job completes, which
    // may be before this test looks: record every fence its status carries meanwhile.
    let locks = Api::<DistributedLock>::namespaced(client.clone(), &ns);
    let fences = status_fences(locks, "schema-migration");
    apply_example(node, &ns, "job-gated.yaml").await;
    wait_job_complete(&client, &ns, "migrate-schema").await;
    let fence = eventually("the lock released", TIMEOUT, || async {
        let seen = fences.seen();
        seen.released.then_some(seen.fences)
    })
    .await;
    assert_eq!(fence.len(), 1, "the lock held with one fence: {fence:?}");
    let fence = fence[0];
    let pod = job_pod(&client, &ns, "migrate-schema").await;
    let out = logs(&client, &ns, &pod.name_any()).await;
    assert_eq!(out.trim(), format!("migrating with fence {fence}"));
    delete_namespace(&client, &ns).await;
}

/// examples/job-kubectl-wait.yaml with a locally built kubectl image: a plain Job whose
/// init container waits with `kubectl wait --for=condition=Acquired` on its own RBAC
/// (the ServiceAccount token the kubelet mounts), then runs. Besides the images, the
/// one change is the way to the API server: on this node it is on 127.0.0.1 only, so
/// the Pod uses the host's network and the init container gets the loopback
/// `KUBERNETES_SERVICE_HOST`/`PORT` (there is no kube-proxy for the `kubernetes`
/// Service).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_job_kubectl_wait_runs_on_the_node() {
    let (node, client, _shared) = with_controller().await;
    let ns = node.namespace(&client, "node-example-wait").await;
    let file = "job-kubectl-wait.yaml";
    let text = std::fs::read_to_string(repo_root().join("examples").join(file)).unwrap();
    for image in [
        "image: busybox:1.36",
        "image: registry.k8s.io/kubectl:v1.36.3",
    ] {
        assert!(text.contains(image), "examples/{file} names {image}");
    }
    let text = text
        .replace(
            "image: busybox:1.36",
            &format!("image: {}", node.images().workload),
        )
        .replace(
            "image: registry.k8s.io/kubectl:v1.36.3",
            &format!("image: {}", node.images().kubectl()),
        );
    let mut documents = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
        let mut object: Value = serde::Deserialize::deserialize(document).expect("YAML");
        if object["kind"] == "Job" {
            let pod = &mut object["spec"]["template"]["spec"];
            pod["hostNetwork"] = json!(true);
            pod["initContainers"][0]["env"] = json!([
                { "name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1" },
                { "name": "KUBERNETES_SERVICE_PORT", "value": node.plane().port().to_string() },
            ]);
            for container in ["initContainers", "containers"] {
                pod[container][0]["imagePullPolicy"] = json!("Never");
            }
        }
        documents.push(serde_json::to_string(&object).unwrap());
    }
    let out = kubectl_with_input(
        node,
        &["apply", "-n", &ns, "-f", "-"],
        &documents.join("\n---\n"),
    );
    assert!(
        out.status.success(),
        "kubectl apply examples/{file}: {}",
        text_of(&out)
    );
    wait_job_complete(&client, &ns, "report-export").await;
    let lock = Api::<DistributedLock>::namespaced(client.clone(), &ns)
        .get("report-export")
        .await
        .expect("the example's lock");
    assert!(
        acquired(&lock),
        "the lock stays held by its DistributedLock"
    );
    let pod = job_pod(&client, &ns, "report-export").await;
    let waited = Api::<Pod>::namespaced(client.clone(), &ns)
        .logs(
            &pod.name_any(),
            &LogParams {
                container: Some("wait-for-lock".into()),
                ..LogParams::default()
            },
        )
        .await
        .expect("the init container's output");
    assert!(
        waited.contains("report-export condition met"),
        "kubectl wait did not see the lock Acquired: {waited:?}"
    );
    let out = logs(&client, &ns, &pod.name_any()).await;
    assert_eq!(out.trim(), "exporting while report-export is held");
    delete_namespace(&client, &ns).await;
}

/// examples/pod-gated.yaml as written (the image swapped): of the Deployment's three
/// Pods exactly one is ungated and Running, printing its own lock's fence from its
/// downward-API file; the other two stay SchedulingGated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_pod_gated_runs_one_pod_on_the_node_with_its_fence() {
    let (node, client, _shared) = with_controller().await;
    let ns = node.namespace(&client, "node-example-pod").await;
    apply_example(node, &ns, "pod-gated.yaml").await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let (active, gated) = eventually("one singleton Pod Running, two gated", TIMEOUT, || async {
        let list = pods
            .list(&ListParams::default().labels("app=singleton"))
            .await
            .ok()?;
        let (running, rest): (Vec<Pod>, Vec<Pod>) =
            list.items.into_iter().partition(|p| phase(p) == "Running");
        let gated = rest
            .iter()
            .filter(|p| {
                condition(p, "PodScheduled")
                    == Some(("False".into(), Some("SchedulingGated".into())))
            })
            .count();
        (running.len() == 1 && gated == 2).then(|| (running[0].clone(), gated))
    })
    .await;
    assert_eq!(gated, 2);
    let fence = fence_of(&active, "the active Pod's fence");
    let own = own_lock_of(
        &Api::<DistributedLock>::namespaced(client.clone(), &ns),
        &active.name_any(),
        "the active Pod's own lock",
    )
    .await;
    assert!(acquired(&own));
    assert_eq!(own.status.as_ref().and_then(|s| s.fence), Some(fence));
    let name = active.name_any();
    let out = eventually("the active container's output", TIMEOUT, || async {
        let out = pods.logs(&name, &LogParams::default()).await.ok()?;
        (!out.is_empty()).then_some(out)
    })
    .await;
    assert_eq!(out.trim(), format!("active with fence {fence}"));
    delete_namespace(&client, &ns).await;
}

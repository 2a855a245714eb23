//! `lockwarden guard` on the real node (docs/design.md §3 rule 9, §6.3): a gated Job
//! on a Kubernetes Lease lock whose container ignores SIGTERM (a shell with
//! `trap '' TERM`, `terminationGracePeriodSeconds: 30`) runs under the guard, in the
//! busybox image (the guard binary is the static one `lockwarden install` copies from
//! lockwarden's image). The controller holding the lock is taken out, so nobody renews
//! the Lease and nobody stops the Pod but the guard; a contender on the host (the engine
//! in-process, with the admin client) waits for the Lease and writes to the loopback
//! register the moment it acquires. The Job's last write must arrive before the
//! contender's first. Three faults:
//!
//! - the release's controller SIGSTOPped;
//! - the controller cut from the API server, which on Leases is the store: the
//!   release's own way there (`KUBERNETES_SERVICE_PORT`) is a value every node test
//!   shares, so for this test the release is scaled to zero and a `lockwarden
//!   controller` on the host takes its place, reaching the API server through a fault
//!   proxy that is blackholed;
//! - the controller SIGSTOPped and the kubelet cut from the API server (its proxy,
//!   `Node::kubelet_api`, blackholed) at once.
//!
//! The guard reads the Lease from the API server itself, which none of these cut.
//!
//! Each fault is one window: its workloads (a Job and a gated Pod, each on a key of its
//! own with its own register and contender) are armed side by side and the fault taken
//! once for all of them, so the release's controller is out three times, not seven.
//! Scales (`support::timescale`): the cut window's first Job runs at full scale
//! (Kubernetes' default 30 s grace, the 37 s lock-delay the controller gives it, the
//! 43 s stored lease the guard counts: the suite's full-scale instance of rule 9 on the
//! node), every other trial at suite scale (3 s, 9 s, 15 s); `LOCKWARDEN_NODE_TRIALS=N`
//! runs N windows of a Job and a Pod at full scale per fault. Every margin is printed
//! with the min and median, and each must be positive.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, PostParams, PropagationPolicy};
use kube::{Client, ResourceExt};
use lockwarden::api::DistributedLock;
use lockwarden::backend::{ConnectOptions, KubernetesOptions, Target};
use lockwarden::lock::LockBackend;
use serde_json::json;

use super::{
    CONTROLLER, KUBELET, RELEASE_NAMESPACE, TIMEOUT, controller_pid, controller_ready,
    wait_controller_ready,
};
use crate::support::kube::grant_default_service_account;
use crate::support::locks::lease_lock_timed;
use crate::support::node::Node;
use crate::support::proxy::{Mode, Proxy};
use crate::support::timescale::{
    CONTENDER_HEAD_START, CONTENDER_LEASE, CONTENDER_TIMEOUT, LAST_WRITE_IN_FLIGHT, Scale,
    WORKLOAD_LEASE, WORKLOAD_RENEW, long_run,
};
use crate::support::trials::{
    RecordSampler, Register, assert_lock_delay, contend, monotonic_now, report_margins,
};
use crate::support::{ServerProcess, eventually, tool, unique};
/// The workload's container, for podFailurePolicy.
const CONTAINER: &str = "writer";

/// Sends SIGCONT to the stopped process when dropped, so a failing trial never leaves
/// the controller stopped for the tests after it.
struct Stopped(i32);

impl Stopped {
    fn stop(pid: i32) -> Stopped {
        // SAFETY: kill(2) with a pid and a signal number; no memory is passed.
        assert_eq!(
            unsafe { libc::kill(pid, libc::SIGSTOP) },
            0,
            "SIGSTOP {pid}"
        );
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// `get` on Leases for the namespace's default service account: the guard reads the
/// Lease itself.
async fn allow_reading_leases(client: &Client, ns: &str) {
    let rules = json!([{ "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"] }]);
    grant_default_service_account(client, ns, "guard", rules).await;
}

/// The guarded Pod spec of examples/guarded-job.yaml: an init container copies the
/// guard from lockwarden's image, and the busybox container runs
/// `lockwarden guard -- sh -c …`, a shell that ignores SIGTERM and writes `job N` to the
/// register every 100 ms through busybox's nc (host network: the register and the API
/// server are on the host's loopback, hence the service's host and port); its grace is
/// `scale`'s, and with it the lock-delay the controller gives its lock.
fn guarded_pod_spec(node: &Node, register_port: u16, scale: Scale) -> serde_json::Value {
    let script = format!(
        "trap '' TERM; i=0; while true; do i=$((i+1)); echo \"job $i\"; sleep 0.1; done \
         | nc 127.0.0.1 {register_port}"
    );
    let from_annotation = |variable: &str, annotation: &str| {
        json!({ "name": variable, "valueFrom": { "fieldRef": {
            "fieldPath": format!("metadata.annotations['{annotation}']") } } })
    };
    json!({
        "hostNetwork": true,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": scale.grace_seconds(),
        "volumes": [{ "name": "guard", "emptyDir": {} }],
        "initContainers": [{
            "name": "install-guard", "image": node.images().lockwarden,
            "imagePullPolicy": "Never",
            "command": ["/usr/local/bin/lockwarden", "install", "/guard"],
            "volumeMounts": [{ "name": "guard", "mountPath": "/guard" }],
        }],
        "containers": [{
            "name": CONTAINER, "image": node.images().workload, "imagePullPolicy": "Never",
            "command": ["/guard/lockwarden", "guard", "--", "sh", "-c", script],
            "volumeMounts": [{ "name": "guard", "mountPath": "/guard" }],
            "env": [
                from_annotation("LOCKWARDEN_URL", "lockwarden.io/url"),
                from_annotation("LOCKWARDEN_NONCE", "lockwarden.io/nonce"),
                from_annotation("LOCKWARDEN_FENCE", "lockwarden.io/fence"),
                { "name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1" },
                { "name": "KUBERNETES_SERVICE_PORT", "value": node.plane().port().to_string() },
            ],
        }],
    })
}

/// The gated, guarded workload a trial runs on the lock template: a Job (its Pod made
/// by the Job controller, stopped by suspending it) or a bare Pod (gated by
/// lockwarden's scheduling gate, stopped by deleting it).
#[derive(Clone, Copy)]
pub enum Workload {
    Job,
    Pod,
}

impl Workload {
    /// Creates the workload `name` with `spec` as its Pod spec, gated on the lock
    /// template `template` (with `on-lock-lost: POLICY` if given).
    async fn create(
        self,
        client: &Client,
        ns: &str,
        name: &str,
        (template, on_lock_lost): (&str, Option<&str>),
        spec: serde_json::Value,
    ) {
        let mut annotations = json!({ "lockwarden.io/lock-template": template });
        if let Some(policy) = on_lock_lost {
            annotations["lockwarden.io/on-lock-lost"] = json!(policy);
        }
        match self {
            Workload::Job => {
                let job: Job = serde_json::from_value(json!({
                    "metadata": { "name": name, "annotations": annotations },
                    "spec": {
                        "suspend": true,
                        "backoffLimit": 0,
                        "podFailurePolicy": { "rules": [{
                            "action": "Ignore",
                            "onExitCodes": {
                                "containerName": CONTAINER, "operator": "In", "values": [4, 6],
                            },
                        }]},
                        "template": { "spec": spec },
                    },
                }))
                .expect("a Job");
                Api::<Job>::namespaced(client.clone(), ns)
                    .create(&PostParams::default(), &job)
                    .await
                    .expect("create the Job");
            }
            Workload::Pod => {
                let mut spec = spec;
                spec["schedulingGates"] = json!([{ "name": "lockwarden.io/lock" }]);
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {
                        "name": name,
                        "annotations": annotations,
                        "labels": { "lockwarden.io/gated": "true" },
                    },
                    "spec": spec,
                }))
                .expect("a Pod");
                Api::<Pod>::namespaced(client.clone(), ns)
                    .create(&PostParams::default(), &pod)
                    .await
                    .expect("create the Pod");
            }
        }
    }

    /// Deletes the workload (a Job's Pods with it, in the background).
    async fn delete(self, client: &Client, ns: &str, name: &str) {
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        let deleted = match self {
            Workload::Job => Api::<Job>::namespaced(client.clone(), ns)
                .delete(name, &params)
                .await
                .map(drop),
            Workload::Pod => Api::<Pod>::namespaced(client.clone(), ns)
                .delete(name, &params)
                .await
                .map(drop),
        };
        deleted.unwrap_or_else(|e| panic!("delete {name}: {e}"));
    }

    /// Whether none of the workload's Pods exists any more.
    async fn pods_gone(self, client: &Client, ns: &str, name: &str) -> bool {
        match self {
            Workload::Job => crate::support::kube::job_pods(client, ns, name)
                .await
                .is_empty(),
            Workload::Pod => Api::<Pod>::namespaced(client.clone(), ns)
                .get_opt(name)
                .await
                .unwrap_or_else(|e| panic!("get Pod {name}: {e}"))
                .is_none(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Workload::Job => "job",
            Workload::Pod => "pod",
        }
    }
}

/// What one trial measured, in seconds on CLOCK_MONOTONIC.
struct Trial {
    /// The contender's first arrival minus the workload's last: positive is safe.
    margin: f64,
    stop_to_job_last: f64,
    stop_to_contender_first: f64,
    lock_delay: Option<String>,
}

/// How the controller holding the workloads' locks is taken out of a window's trials.
enum Fault<'a> {
    /// The release's controller process is SIGSTOPped (SIGCONT when the trial ends).
    Sigstop,
    /// As `Sigstop`, and the kubelet is cut from the API server at the same moment
    /// (its proxy blackholed; passing again when the trial ends): nothing that talks to
    /// the API server on the Pod's behalf can stop it either.
    SigstopAndKubeletCut,
    /// The controller reaches the API server through this proxy, which is cut
    /// (blackholed; passing again when the trial ends).
    Cut(&'a Proxy),
}

/// What undoes a fault when dropped: SIGCONT to the stopped process, or the proxy
/// passing again.
struct Undo<'a> {
    _stopped: Option<Stopped>,
    cut: Vec<&'a Proxy>,
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        for proxy in &self.cut {
            proxy.set_mode(Mode::Pass);
        }
    }
}

impl<'a> Fault<'a> {
    /// Inflicts the fault; the CLOCK_MONOTONIC time it took effect.
    async fn inflict(&self, node: &'a Node, client: &Client) -> (f64, Undo<'a>) {
        match self {
            Fault::Sigstop | Fault::SigstopAndKubeletCut => {
                let pod = wait_controller_ready(node, client).await;
                let pid = controller_pid(&pod).expect("the controller's process on this host");
                let at = monotonic_now();
                let mut cut = Vec::new();
                if matches!(self, Fault::SigstopAndKubeletCut) {
                    node.kubelet_api().set_mode(Mode::Blackhole);
                    cut.push(node.kubelet_api());
                }
                let stopped = Some(Stopped::stop(pid));
                (
                    at,
                    Undo {
                        _stopped: stopped,
                        cut,
                    },
                )
            }
            Fault::Cut(proxy) => {
                let at = monotonic_now();
                proxy.set_mode(Mode::Blackhole);
                (
                    at,
                    Undo {
                        _stopped: None,
                        cut: vec![*proxy],
                    },
                )
            }
        }
    }
}

/// One guarded workload of a window, running under the guard, its contender observing
/// the key: ready for the fault.
struct Armed {
    workload: Workload,
    name: String,
    template_name: String,
    register: Arc<Register>,
    lock_delay: Option<String>,
}

/// The contender's task: it ends with the backend and its lease once it acquired.
type Contender = tokio::task::JoinHandle<(Arc<dyn LockBackend>, lockwarden::lock::Lease)>;

/// Starts `workload` number `n` at `scale` on a template of its own (a key of its own),
/// waits for its first write under the guard, checks the lock-delay the controller gave
/// its lock, and starts its contender.
async fn arm(
    node: &Node,
    client: &Client,
    ns: &str,
    n: usize,
    (workload, scale): (Workload, Scale),
) -> (Armed, Contender) {
    let key = unique("guard");
    let suffix = &key[key.len() - 6..];
    let (port, register) = Register::serve().await;
    let locks = Api::<DistributedLock>::namespaced(client.clone(), ns);
    let template_name = format!("guard-tpl-{n}-{suffix}");
    let name = format!("guard-{}-{n}-{suffix}", workload.name());
    let mut template = lease_lock_timed(&template_name, &key, WORKLOAD_LEASE, WORKLOAD_RENEW);
    template.spec.release = true;
    locks
        .create(&PostParams::default(), &template)
        .await
        .expect("create the template");
    let spec = guarded_pod_spec(node, port, scale);
    workload
        .create(client, ns, &name, (&template_name, None), spec)
        .await;
    eventually("the guarded workload's first write", TIMEOUT, || async {
        (!register.of("job").is_empty()).then_some(())
    })
    .await;
    let own_lock = own_lock(&locks, &name).await;
    assert_lock_delay(&own_lock, scale);
    let contender = contend(lease_backend(client, ns, &key).await, port, CONTENDER_LEASE).await;
    let armed = Armed {
        workload,
        name,
        template_name,
        register,
        lock_delay: own_lock.spec.lock_delay.clone(),
    };
    (armed, contender)
}

/// One window's trials at once: every workload of `cases` armed side by side, one fault
/// for all of them, and each margin measured on its own register. Nothing undoes the
/// fault before every contender has written: until then each workload can be stopped by
/// its guard alone.
async fn window<'a>(
    node: &'a Node,
    client: &Client,
    ns: &str,
    (first, cases): (usize, &[(Workload, Scale)]),
    fault: &Fault<'a>,
) -> Vec<Trial> {
    let (armed, contenders): (Vec<Armed>, Vec<Contender>) = futures::future::join_all(
        cases
            .iter()
            .enumerate()
            .map(|(i, case)| arm(node, client, ns, first + i, *case)),
    )
    .await
    .into_iter()
    .unzip();
    tokio::time::sleep(CONTENDER_HEAD_START).await;

    // The fault: no renewal from the controller, and no stop of the workloads from it.
    let (stopped_at, undo) = fault.inflict(node, client).await;
    let won = futures::future::join_all(contenders.into_iter().map(|contender| async move {
        tokio::time::timeout(CONTENDER_TIMEOUT, contender)
            .await
            .expect("the contender acquires within CONTENDER_TIMEOUT of the fault")
            .expect("the contender task")
    }))
    .await;
    // Every contender wrote; from here on nothing a workload writes can be safe. They go
    // (their Pods too), then the controller resumes.
    for a in &armed {
        a.workload.delete(client, ns, &a.name).await;
    }
    drop(undo);
    for a in &armed {
        eventually(
            "the workload's Pods gone",
            Duration::from_secs(180),
            || async {
                a.workload
                    .pods_gone(client, ns, &a.name)
                    .await
                    .then_some(())
            },
        )
        .await;
    }
    tokio::time::sleep(LAST_WRITE_IN_FLIGHT).await;
    let locks = Api::<DistributedLock>::namespaced(client.clone(), ns);
    let mut trials = Vec::new();
    for (a, (contender_backend, contender_lease)) in armed.iter().zip(won) {
        let job_last = *a
            .register
            .of("job")
            .last()
            .expect("the workload wrote to the register");
        let contender_first = a.register.of("contender")[0];
        let _ = contender_backend.release(&contender_lease).await;
        let _ = locks
            .delete(&a.template_name, &DeleteParams::default())
            .await;
        trials.push(Trial {
            margin: contender_first - job_last,
            stop_to_job_last: job_last - stopped_at,
            stop_to_contender_first: contender_first - stopped_at,
            lock_delay: a.lock_delay.clone(),
        });
    }
    trials
}

/// The workload `name`'s own lock, as the controller made it from the template.
async fn own_lock(locks: &Api<DistributedLock>, name: &str) -> DistributedLock {
    eventually("the workload's own lock", TIMEOUT, || async {
        let list = locks.list(&Default::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|l| l.name_any().starts_with(&format!("{name}-")))
    })
    .await
}

/// The engine on the host on the Lease `ns/key`, straight to the API server.
async fn lease_backend(client: &Client, ns: &str, key: &str) -> Arc<dyn LockBackend> {
    let options = ConnectOptions {
        kubernetes: KubernetesOptions {
            client: Some(client.clone()),
            ..KubernetesOptions::default()
        },
        ..ConnectOptions::default()
    };
    Target::parse(&format!("k8s://{ns}/{key}"))
        .unwrap()
        .connect(&options)
        .await
        .expect("a Lease backend")
}

/// What takes the controller holding the workloads' locks out of a window.
#[derive(Clone, Copy)]
enum Outage {
    /// [`Fault::Sigstop`].
    Sigstop,
    /// [`Fault::Cut`], the controller being a [`HostController`] behind a proxy.
    ControllerCut,
    /// [`Fault::SigstopAndKubeletCut`].
    SigstopAndKubeletCut,
}

/// Runs the trials of `suite` (each a workload and a scale) under `outage` in a
/// namespace of their own, side by side in one window of the fault, printing each
/// margin under `label`, and asserts every one is positive. `LOCKWARDEN_NODE_TRIALS=N`:
/// N windows of a Job and a Pod at full scale.
async fn guarded_trials(label: &str, outage: Outage, suite: &[(Workload, Scale)]) {
    // The kubelet cut stops every Pod on the node from starting, stopping or reporting:
    // alone with the kubelet then. Alone with the controller always: stopping it,
    // cutting it off or scaling it to zero is not other tests' business.
    let (_kubelet_shared, _kubelet_alone) = match outage {
        Outage::SigstopAndKubeletCut => (None, Some(super::exclusive(&KUBELET).await)),
        _ => (Some(KUBELET.read().await), None),
    };
    let _alone = super::exclusive(&CONTROLLER).await;
    let (node, client) = controller_ready().await;
    let ns = node.namespace(&client, &format!("node-{label}")).await;
    allow_reading_leases(&client, &ns).await;
    let api = matches!(outage, Outage::ControllerCut).then(|| Proxy::start(node.plane().port()));
    let host = match &api {
        Some(api) => Some(HostController::start(node, &client, &ns, api).await),
        None => None,
    };
    let fault = match outage {
        Outage::Sigstop => Fault::Sigstop,
        Outage::SigstopAndKubeletCut => Fault::SigstopAndKubeletCut,
        Outage::ControllerCut => Fault::Cut(api.as_ref().expect("the controller's proxy")),
    };
    let windows: Vec<Vec<(Workload, Scale)>> = match long_run() {
        Some(n) => vec![vec![(Workload::Job, Scale::Full), (Workload::Pod, Scale::Full)]; n],
        None => vec![suite.to_vec()],
    };
    let mut margins: Vec<(String, f64)> = Vec::new();
    let mut first = 0;
    for cases in &windows {
        for (n, (workload, scale)) in cases.iter().enumerate() {
            println!(
                "{label} ({}): trial {}: {}",
                workload.name(),
                first + n,
                scale.describe()
            );
        }
        let trials = window(node, &client, &ns, (first, cases), &fault).await;
        for (n, ((workload, scale), trial)) in cases.iter().zip(trials).enumerate() {
            let case = format!("{label} ({}, {})", workload.name(), scale.name());
            println!(
                "{case}: trial {}: margin {:+.3} s (fault → its last write {:.3} s, fault → \
                 contender's first write {:.3} s; its lock's lockDelay {:?})",
                first + n,
                trial.margin,
                trial.stop_to_job_last,
                trial.stop_to_contender_first,
                trial.lock_delay
            );
            margins.push((case, trial.margin));
        }
        first += cases.len();
    }
    drop(host);
    let mut cases: Vec<&String> = margins.iter().map(|(c, _)| c).collect();
    cases.sort();
    cases.dedup();
    for case in cases {
        let of: Vec<f64> = margins
            .iter()
            .filter(|(c, _)| c == case)
            .map(|(_, m)| *m)
            .collect();
        report_margins(case, &of);
    }
    super::delete_namespace(&client, &ns).await;
    if matches!(outage, Outage::ControllerCut) {
        wait_controller_ready(node, &client).await;
    }
}

/// The guarded Job's and the guarded Pod's (lockwarden's scheduling gate) last writes
/// arrive before their contenders' first, after the controller holding their Lease
/// locks is SIGSTOPped: the guard alone stops them (docs/design.md §3 rule 9, §6.3).
/// Both in one window, at suite scale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_stops_a_job_and_a_pod_ignoring_sigterm_before_the_contender_when_the_controller_is_sigstopped_on_a_lease()
 {
    guarded_trials(
        "guard",
        Outage::Sigstop,
        &[(Workload::Job, Scale::Suite), (Workload::Pod, Scale::Suite)],
    )
    .await;
}

/// The release's controller scaled to zero and a `lockwarden controller` on the host in
/// its place, for one namespace, reaching the API server through a proxy. Dropped: the
/// host controller is killed and the release scaled back to one replica (kubectl, so it
/// runs in a panic's unwinding too); the caller waits for it to be Ready.
struct HostController {
    _process: ServerProcess,
    kubeconfig: PathBuf,
}

/// `kubectl scale` of the release's Deployment to `replicas`.
fn scale_release(kubeconfig: &Path, replicas: u32) -> std::process::Output {
    Command::new(tool("KUBECTL"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["scale", "deployment", "-n", RELEASE_NAMESPACE])
        .args(["-l", "app.kubernetes.io/instance=lockwarden"])
        .arg(format!("--replicas={replicas}"))
        .output()
        .expect("run kubectl scale")
}

impl HostController {
    async fn start(node: &Node, client: &Client, ns: &str, api: &Proxy) -> HostController {
        let admin = node.plane().kubeconfig_path().to_path_buf();
        let out = scale_release(&admin, 0);
        assert!(
            out.status.success(),
            "kubectl scale the release to 0: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The release's controller gone first: one controller gates the Job. It ignores
        // SIGTERM (PID 1 without a handler), so rather than wait out the chart's 30 s
        // grace its Pods are deleted with 1 s: a Pod object goes only once the kubelet
        // has killed its containers, so gone means its process is gone too.
        for pod in super::controller_pods(client).await {
            let _ = Api::<Pod>::namespaced(client.clone(), RELEASE_NAMESPACE)
                .delete(&pod.name_any(), &DeleteParams::default().grace_period(1))
                .await;
        }
        eventually("the release's controller gone", TIMEOUT, || async {
            super::controller_pods(client)
                .await
                .is_empty()
                .then_some(())
        })
        .await;
        let dir = node.dir().join(unique("host-controller"));
        std::fs::create_dir_all(&dir).unwrap();
        let kubeconfig = dir.join("through-proxy.kubeconfig");
        let text = std::fs::read_to_string(&admin).unwrap();
        std::fs::write(
            &kubeconfig,
            text.replace(
                node.plane().url(),
                &format!("https://127.0.0.1:{}", api.port()),
            ),
        )
        .unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lockwarden"));
        cmd.args([
            "controller",
            "--cluster-name",
            "node-guard-host",
            "--watch-namespace",
            ns,
            "--metrics-address",
            "127.0.0.1:0",
        ])
        .env("KUBECONFIG", &kubeconfig);
        HostController {
            _process: ServerProcess::start("host-controller", cmd, &dir),
            kubeconfig: admin,
        }
    }
}

impl Drop for HostController {
    fn drop(&mut self) {
        let out = scale_release(&self.kubeconfig, 1);
        if !out.status.success() {
            eprintln!(
                "guard: kubectl scale the release back to 1 failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// The guarded Jobs' and the guarded Pod's last writes arrive before their contenders'
/// first, after the controller holding their Lease locks is cut from the API server,
/// its store: the release's controller is replaced for the test by one on the host that
/// reaches the API server through a fault proxy (the release's own way there is a value
/// every node test shares), and the proxy blackholes. The guard reads the Lease itself
/// and stops the work (docs/design.md §3 rule 9, §6.3). One window of three trials: a
/// Job at full scale (the suite's full-scale instance of rule 9: the 30 s grace, the
/// 37 s lock-delay, the 43 s stored lease the guard counts), a Job and a Pod at suite
/// scale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_stops_a_job_and_a_pod_ignoring_sigterm_before_the_contender_when_the_controller_is_cut_from_the_api_server_on_a_lease()
 {
    guarded_trials(
        "guard-cut",
        Outage::ControllerCut,
        &[
            (Workload::Job, Scale::Full),
            (Workload::Job, Scale::Suite),
            (Workload::Pod, Scale::Suite),
        ],
    )
    .await;
}

/// As the SIGSTOP window, with the kubelet cut from the API server too (a fault proxy
/// between them) from the moment the controller stops: the work's stop comes from the
/// guard alone, which reads the Lease from the API server itself. A Job and a Pod in one
/// window, at suite scale (the cut stops every Pod on the node from reporting, so this
/// window runs alone with the kubelet; short, well inside the node's monitor grace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_stops_a_job_and_a_pod_ignoring_sigterm_before_the_contender_when_the_controller_is_sigstopped_and_the_kubelet_cut_on_a_lease()
 {
    guarded_trials(
        "guard-kubelet",
        Outage::SigstopAndKubeletCut,
        &[(Workload::Job, Scale::Suite), (Workload::Pod, Scale::Suite)],
    )
    .await;
}

/// Deleting the DistributedLock of a running guarded Job (docs/design.md §6.3, "every
/// release path waits for the processes"): the controller stops the Job (for good:
/// `on-lock-lost: fail`) and deletes its Pod with its 30 s grace, which the shell as
/// the guard's child ignores; the lock stays held (renewed, the Lease still the Job's)
/// until the Pod has ended, and only then is it released. A sampler reads the Lease
/// every 200 ms: no read before the Job's last write shows it free or someone else's,
/// and the contender's first write comes after the Job's last. At full scale (the
/// suite's one instance of this release path; it shares the controller, so it runs
/// beside the other tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_before_next_deleting_the_lock_of_a_running_guarded_job_releases_it_only_once_its_processes_ended_on_a_lease()
 {
    let (node, client, _shared) = super::with_controller().await;
    let ns = node.namespace(&client, "node-guard-delete").await;
    allow_reading_leases(&client, &ns).await;
    let key = unique("guard-delete");
    let (port, register) = Register::serve().await;
    let locks = Api::<DistributedLock>::namespaced(client.clone(), &ns);
    let template_name = "guard-delete-tpl";
    let name = "guard-delete-job";
    let scale = Scale::Full;
    println!("guard-delete: {}", scale.describe());
    let mut template = lease_lock_timed(template_name, &key, WORKLOAD_LEASE, WORKLOAD_RENEW);
    template.spec.release = true;
    locks
        .create(&PostParams::default(), &template)
        .await
        .expect("create the template");
    // `fail`: stopped for good, so the Job does not wait for the key again (it would
    // race the contender for it; fair order is another matter).
    let spec = guarded_pod_spec(node, port, scale);
    Workload::Job
        .create(&client, &ns, name, (template_name, Some("fail")), spec)
        .await;
    eventually("the guarded Job's first write", TIMEOUT, || async {
        (!register.of("job").is_empty()).then_some(())
    })
    .await;
    let own = own_lock(&locks, name).await;
    assert_lock_delay(&own, scale);
    let sampler = RecordSampler::start(lease_backend(&client, &ns, &key).await);
    let contender = contend(
        lease_backend(&client, &ns, &key).await,
        port,
        CONTENDER_LEASE,
    )
    .await;
    tokio::time::sleep(CONTENDER_HEAD_START).await;

    let deleted_at = monotonic_now();
    locks
        .delete(&own.name_any(), &DeleteParams::default())
        .await
        .expect("delete the Job's lock");
    let (contender_backend, contender_lease) = tokio::time::timeout(CONTENDER_TIMEOUT, contender)
        .await
        .expect("the contender acquires within CONTENDER_TIMEOUT of the lock's deletion")
        .expect("the contender task");
    eventually("the Job's Pods gone", Duration::from_secs(180), || async {
        Workload::Job
            .pods_gone(&client, &ns, name)
            .await
            .then_some(())
    })
    .await;
    tokio::time::sleep(LAST_WRITE_IN_FLIGHT).await;
    let job_last = *register.of("job").last().expect("the Job wrote");
    let contender_first = register.of("contender")[0];
    let samples = sampler.stop();
    println!(
        "guard-delete: margin {:+.3} s (deletion → Job's last write {:.3} s, → contender's \
         first write {:.3} s; {} reads of the Lease)",
        contender_first - job_last,
        job_last - deleted_at,
        contender_first - deleted_at,
        samples.len()
    );
    RecordSampler::assert_held_until(&samples, job_last, "the Job's");
    report_margins("guard-delete", &[contender_first - job_last]);
    let _ = contender_backend.release(&contender_lease).await;
    super::delete_namespace(&client, &ns).await;
}

/// Early hand-off on the guard's report (docs/design.md §6.3): a guarded Job whose
/// COMMAND exits 0 has its lock let go on its guard's report on the Pod, while the
/// kubelet is cut from the API server and so cannot report the exit. The release's
/// controller trusts the reports (the chart sets `LOCKWARDEN_TRUST_GUARD_REPORTS` where
/// it installs the report policy), and the Job's ServiceAccount is bound to the chart's
/// `lockwarden-guard-report` role, as docs/guide/guard.md tells users to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_job_hands_off_on_its_guards_report_before_the_kubelet_reports_the_exit() {
    // The kubelet cut stops every Pod on the node from reporting: alone with it.
    let _kubelet = super::exclusive(&KUBELET).await;
    let _controller = super::CONTROLLER.read().await;
    let (node, client) = controller_ready().await;
    let ns = node.namespace(&client, "node-guard-report").await;
    allow_reading_leases(&client, &ns).await;
    bind_the_guard_report_role(&client, &ns).await;

    let key = unique("guard-report");
    let (port, register) = Register::serve().await;
    let template = lease_lock_timed("report-tpl", &key, WORKLOAD_LEASE, WORKLOAD_RENEW);
    create_template(&client, &ns, template).await;
    // COMMAND writes once, then ends with 0 a few seconds later: time enough to cut the
    // kubelet after its write, before its exit. The nc it leaves is stopped by the guard.
    let script = format!("echo 'job 1' | nc 127.0.0.1 {port} & sleep 4; exit 0");
    let spec = guard_writing_on_its_pod(node, port, &script);
    let name = "reported";
    Workload::Job
        .create(&client, &ns, name, ("report-tpl", None), spec)
        .await;
    eventually("COMMAND's write under the guard", TIMEOUT, || async {
        (!register.of("job").is_empty()).then_some(())
    })
    .await;

    // From here on the kubelet cannot tell the API server that the container exited.
    node.kubelet_api().set_mode(Mode::Blackhole);
    let undo = Undo {
        _stopped: None,
        cut: vec![node.kubelet_api()],
    };
    let cut_at = monotonic_now();
    let jobs = Api::<Job>::namespaced(client.clone(), &ns);
    let status = eventually("the lock let go on the guard's report", TIMEOUT, || async {
        let job = jobs.get(name).await.ok()?;
        let status = job.annotations().get("lockwarden.io/status")?.clone();
        status.contains("ended in success").then_some(status)
    })
    .await;
    let let_go_after = monotonic_now() - cut_at;
    let pod = the_only_pod(&client, &ns).await;
    drop(undo);
    let report = format!("guard-ended.lockwarden.io/{CONTAINER}");
    assert_eq!(
        pod.annotations().get(&report).map(String::as_str),
        Some("succeeded"),
        "the guard's report on its Pod: {:?}",
        pod.annotations()
    );
    let terminated = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some()));
    assert!(
        !terminated,
        "the kubelet, cut off, cannot have reported the exit: {:?}",
        pod.status
    );
    println!(
        "guard's report: the lock was let go {let_go_after:.3} s after the kubelet was cut \
         (COMMAND exits 4 s after its write), the kubelet still reporting the container \
         running; the Job's status: {status}"
    );
    super::delete_namespace(&client, &ns).await;
}

/// The namespace's default ServiceAccount bound to the chart's `lockwarden-guard-report`
/// role, as docs/guide/guard.md tells users to: its guards may write their request and
/// their report on their own Pod.
async fn bind_the_guard_report_role(client: &Client, ns: &str) {
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": "guard-report" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "lockwarden-guard-report" },
        "subjects": [{ "kind": "ServiceAccount", "name": "default", "namespace": ns }],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .expect("bind the guard-report role");
}

/// `template` (a template lock: `spec.release`) created in `ns`.
async fn create_template(client: &Client, ns: &str, mut template: DistributedLock) {
    template.spec.release = true;
    Api::<DistributedLock>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &template)
        .await
        .expect("create the template");
}

/// The Pod of a test's namespace that has only one.
async fn the_only_pod(client: &Client, ns: &str) -> Pod {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .next()
        .expect("the Job's Pod")
}

/// [`guarded_pod_spec`] running `sh -c SCRIPT` under a guard that knows its Pod and
/// container from the downward API, as the chart's injection passes them: it writes its
/// request for a renewal and its report there.
fn guard_writing_on_its_pod(node: &Node, register_port: u16, script: &str) -> serde_json::Value {
    let mut spec = guarded_pod_spec(node, register_port, Scale::Suite);
    spec["containers"][0]["command"] =
        json!(["/guard/lockwarden", "guard", "--", "sh", "-c", script]);
    let field = |variable: &str, path: &str| json!({ "name": variable, "valueFrom": { "fieldRef": { "fieldPath": path } } });
    let env = spec["containers"][0]["env"].as_array_mut().unwrap();
    env.push(field("LOCKWARDEN_POD_NAME", "metadata.name"));
    env.push(field("LOCKWARDEN_POD_NAMESPACE", "metadata.namespace"));
    env.push(field("LOCKWARDEN_POD_UID", "metadata.uid"));
    env.push(json!({ "name": "LOCKWARDEN_CONTAINER_NAME", "value": CONTAINER }));
    spec
}

/// A renewal on the guard's request (docs/design.md §6.3): the lock renews every 90 s,
/// so a guard waiting for the schedule would start COMMAND at least 90 s after the Job
/// was created (the lock is taken after that). It starts well before: on the renewal it
/// asked for with its annotation, which the release's controller (trusting guard
/// reports) answered. The interval is long because the Pod's own start comes out of
/// it: on a node busy with other tests' Pods, the guard's container once started 43 s
/// after its Job was created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_command_starts_on_the_renewal_its_guard_asked_for() {
    const RENEW: Duration = Duration::from_secs(90);
    let _controller = super::CONTROLLER.read().await;
    let (node, client) = controller_ready().await;
    let ns = node.namespace(&client, "node-guard-asks").await;
    allow_reading_leases(&client, &ns).await;
    bind_the_guard_report_role(&client, &ns).await;
    let key = unique("guard-asks");
    let (port, register) = Register::serve().await;
    create_template(
        &client,
        &ns,
        lease_lock_timed("asks-tpl", &key, "300s", "90s"),
    )
    .await;
    let script = format!("echo 'job 1' | nc 127.0.0.1 {port}; exit 0");
    let spec = guard_writing_on_its_pod(node, port, &script);
    let name = "asks";
    let created = monotonic_now();
    Workload::Job
        .create(&client, &ns, name, ("asks-tpl", None), spec)
        .await;
    eventually("COMMAND's write under the guard", TIMEOUT, || async {
        register.of("job").first().copied()
    })
    .await;
    let started = register.of("job")[0] - created;
    let pod = the_only_pod(&client, &ns).await;
    let request = format!("guard-waiting.lockwarden.io/{CONTAINER}");
    assert!(
        pod.annotations().contains_key(&request),
        "the guard's request on its Pod: {:?}",
        pod.annotations()
    );
    assert!(
        started < RENEW.as_secs_f64(),
        "COMMAND started {started:.1} s after the Job was created: on the scheduled \
         renewal, not the one its guard asked for"
    );
    println!(
        "guard's request: COMMAND's first write {started:.3} s after the Job was created \
         (the scheduled renewal: {RENEW:?} after the lock was taken)"
    );
    super::delete_namespace(&client, &ns).await;
}

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
//! `LOCKWARDEN_NODE_TRIALS` (default 1) repeats each trial; every margin is printed with
//! the min and median, and each must be positive.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, PostParams, PropagationPolicy};
use kube::{Client, ResourceExt};
use lockwarden::api::DistributedLock;
use lockwarden::backend::{ConnectOptions, KubernetesOptions, Target};
use serde_json::json;

use super::trials::{Register, contend, monotonic_now, report_margins, trial_count};
use super::{
    CONTROLLER, RELEASE_NAMESPACE, TIMEOUT, controller_pid, controller_ready, wait_controller_ready,
};
use crate::support::locks::lease_lock_timed;
use crate::support::node::Node;
use crate::support::proxy::{Mode, Proxy};
use crate::support::{ServerProcess, eventually, tool, unique};

/// The Job's lease and renew interval: short, so a trial takes about a minute.
const LEASE: &str = "6s";
const RENEW: &str = "2s";
/// How long the contender sees the record before the fault: its observation (rule 1)
/// runs from the first read of the version the holder last wrote.
const CONTENDER_HEAD_START: Duration = Duration::from_secs(3);
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
    let role: Role = serde_json::from_value(json!({
        "metadata": { "name": "guard" },
        "rules": [{ "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"] }],
    }))
    .unwrap();
    Api::<Role>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &role)
        .await
        .expect("create the guard's Role");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": "guard" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "guard" },
        "subjects": [{ "kind": "ServiceAccount", "name": "default", "namespace": ns }],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .expect("create the guard's RoleBinding");
}

/// A gated Job with a lock template, as examples/guarded-job.yaml: an init container
/// copies the guard from lockwarden's image, and the busybox container runs
/// `lockwarden guard -- sh -c …`, a shell that ignores SIGTERM and writes `job N` to the
/// register every 100 ms through busybox's nc (host network: the register and the API
/// server are on the host's loopback, hence the service's host and port).
fn guarded_job(name: &str, template: &str, node: &Node, register_port: u16) -> Job {
    let script = format!(
        "trap '' TERM; i=0; while true; do i=$((i+1)); echo \"job $i\"; sleep 0.1; done \
         | nc 127.0.0.1 {register_port}"
    );
    let from_annotation = |variable: &str, annotation: &str| {
        json!({ "name": variable, "valueFrom": { "fieldRef": {
            "fieldPath": format!("metadata.annotations['{annotation}']") } } })
    };
    serde_json::from_value(json!({
        "metadata": { "name": name, "annotations": { "lockwarden.io/lock-template": template } },
        "spec": {
            "suspend": true,
            "backoffLimit": 0,
            "podFailurePolicy": { "rules": [{
                "action": "Ignore",
                "onExitCodes": { "containerName": CONTAINER, "operator": "In", "values": [4, 6] },
            }]},
            "template": { "spec": {
                "hostNetwork": true,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 30,
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
            }},
        },
    }))
    .expect("a Job")
}

/// What one trial measured, in seconds on CLOCK_MONOTONIC.
struct Trial {
    /// The contender's first arrival minus the Job's last: positive is safe.
    margin: f64,
    stop_to_job_last: f64,
    stop_to_contender_first: f64,
    lock_delay: Option<String>,
}

/// How the controller holding the Job's lock is taken out of the trial.
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

async fn one_trial<'a>(
    node: &'a Node,
    client: &Client,
    ns: &str,
    n: usize,
    fault: &Fault<'a>,
) -> Trial {
    let key = unique("guard");
    let suffix = &key[key.len() - 6..];
    let (port, register) = Register::serve().await;
    let locks = Api::<DistributedLock>::namespaced(client.clone(), ns);
    let jobs = Api::<Job>::namespaced(client.clone(), ns);
    let template_name = format!("guard-tpl-{n}-{suffix}");
    let job_name = format!("guard-job-{n}-{suffix}");
    let mut template = lease_lock_timed(&template_name, &key, LEASE, RENEW);
    template.spec.release = true;
    locks
        .create(&PostParams::default(), &template)
        .await
        .expect("create the template");
    jobs.create(
        &PostParams::default(),
        &guarded_job(&job_name, &template_name, node, port),
    )
    .await
    .expect("create the Job");
    eventually("the guarded Job's first write", TIMEOUT, || async {
        (!register.of("job").is_empty()).then_some(())
    })
    .await;
    let own_lock = eventually("the Job's own lock", TIMEOUT, || async {
        let list = locks.list(&Default::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|l| l.name_any().starts_with(&format!("{job_name}-")))
    })
    .await;
    let lock_delay = own_lock.spec.lock_delay.clone();

    // The contender: the engine on the host, straight to the API server.
    let options = ConnectOptions {
        kubernetes: KubernetesOptions {
            client: Some(client.clone()),
            ..KubernetesOptions::default()
        },
        ..ConnectOptions::default()
    };
    let backend = Target::parse(&format!("k8s://{ns}/{key}"))
        .unwrap()
        .connect(&options)
        .await
        .expect("a Lease backend");
    let contender = contend(backend, port, Duration::from_secs(6)).await;
    tokio::time::sleep(CONTENDER_HEAD_START).await;

    // The fault: no renewal from the controller, and no stop of the Job from it.
    let (stopped_at, undo) = fault.inflict(node, client).await;
    let (contender_backend, contender_lease) =
        tokio::time::timeout(Duration::from_secs(300), contender)
            .await
            .expect("the contender acquires within 300 s of the SIGSTOP")
            .expect("the contender task");
    // The contender wrote; from here on nothing the Job writes can be safe. The Job goes
    // (its Pods too), then the controller resumes.
    jobs.delete(
        &job_name,
        &DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        },
    )
    .await
    .expect("delete the Job");
    drop(undo);
    eventually("the Job's Pods gone", Duration::from_secs(180), || async {
        crate::support::kube::job_pods(client, ns, &job_name)
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    // A last write in flight arrives within a moment.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let job_last = *register
        .of("job")
        .last()
        .expect("the Job wrote to the register");
    let contender_first = register.of("contender")[0];
    let _ = contender_backend.release(&contender_lease).await;
    let _ = locks.delete(&template_name, &DeleteParams::default()).await;
    Trial {
        margin: contender_first - job_last,
        stop_to_job_last: job_last - stopped_at,
        stop_to_contender_first: contender_first - stopped_at,
        lock_delay,
    }
}

/// The guarded Job's last write arrives before the contender's first, after the
/// controller holding its Lease lock is SIGSTOPped: the guard alone stops it
/// (docs/design.md §3 rule 9, §6.3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_stops_a_job_ignoring_sigterm_before_the_contender_when_the_controller_is_sigstopped_on_a_lease()
 {
    // Alone with the controller: stopping it is not other tests' business.
    let _alone = CONTROLLER.write().await;
    let (node, client) = controller_ready().await;
    let ns = node.namespace(&client, "node-guard").await;
    allow_reading_leases(&client, &ns).await;
    let trials = trial_count();
    let mut margins = Vec::new();
    for n in 0..trials {
        let trial = one_trial(node, &client, &ns, n, &Fault::Sigstop).await;
        println!(
            "guard: trial {n}: margin {:+.3} s (SIGSTOP → Job's last write {:.3} s, SIGSTOP → \
             contender's first write {:.3} s; the Job's lock's lockDelay {:?})",
            trial.margin, trial.stop_to_job_last, trial.stop_to_contender_first, trial.lock_delay
        );
        margins.push(trial.margin);
    }
    report_margins("guard", &margins);
    super::delete_namespace(&client, &ns).await;
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
        // The release's controller gone first: one controller gates the Job.
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

/// The guarded Job's last write arrives before the contender's first, after the
/// controller holding its Lease lock is cut from the API server, its store: the
/// release's controller is replaced for the test by one on the host that reaches the
/// API server through a fault proxy (the release's own way there is a value every
/// node test shares), and the proxy blackholes. The guard reads the Lease itself and
/// stops the Job (docs/design.md §3 rule 9, §6.3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_stops_a_job_ignoring_sigterm_before_the_contender_when_the_controller_is_cut_from_the_api_server_on_a_lease()
 {
    let _alone = CONTROLLER.write().await;
    let (node, client) = controller_ready().await;
    let ns = node.namespace(&client, "node-guard-cut").await;
    allow_reading_leases(&client, &ns).await;
    let api = Proxy::start(node.plane().port());
    let host = HostController::start(node, &client, &ns, &api).await;
    let trials = trial_count();
    let mut margins = Vec::new();
    for n in 0..trials {
        let trial = one_trial(node, &client, &ns, n, &Fault::Cut(&api)).await;
        println!(
            "guard-cut: trial {n}: margin {:+.3} s (cut → Job's last write {:.3} s, cut → \
             contender's first write {:.3} s; the Job's lock's lockDelay {:?})",
            trial.margin, trial.stop_to_job_last, trial.stop_to_contender_first, trial.lock_delay
        );
        margins.push(trial.margin);
    }
    drop(host);
    report_margins("guard-cut", &margins);
    super::delete_namespace(&client, &ns).await;
    wait_controller_ready(node, &client).await;
}

/// As the SIGSTOP trial, with the kubelet cut from the API server too (a fault proxy
/// between them) from the moment the controller stops: the Pod's stop comes from the
/// guard alone, which reads the Lease from the API server itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_stops_a_job_ignoring_sigterm_before_the_contender_when_the_controller_is_sigstopped_and_the_kubelet_cut_on_a_lease()
 {
    let _alone = CONTROLLER.write().await;
    let (node, client) = controller_ready().await;
    let ns = node.namespace(&client, "node-guard-kubelet").await;
    allow_reading_leases(&client, &ns).await;
    let mut margins = Vec::new();
    for n in 0..trial_count() {
        let trial = one_trial(node, &client, &ns, n, &Fault::SigstopAndKubeletCut).await;
        println!(
            "guard-kubelet: trial {n}: margin {:+.3} s (SIGSTOP and kubelet cut → Job's last \
             write {:.3} s, → contender's first write {:.3} s; the Job's lock's lockDelay {:?})",
            trial.margin, trial.stop_to_job_last, trial.stop_to_contender_first, trial.lock_delay
        );
        margins.push(trial.margin);
    }
    report_margins("guard-kubelet", &margins);
    super::delete_namespace(&client, &ns).await;
}

//! A real Kubernetes node for integration tests: a control plane of its own (with what
//! a kubelet needs, `ControlPlaneOptions::for_node`), kube-scheduler, containerd and a
//! kubelet, all as child processes on loopback, and the images the tests run imported
//! into that containerd (no registry is reachable; Pods use `imagePullPolicy: Never`).
//!
//! `Node::shared()` starts one per test binary, and at most one runs per machine: the
//! kubelet and containerd have host paths no flag moves (`/var/lib/kubelet/device-plugins`,
//! `/var/log/containers`, `/var/lib/cni`, `/run/containerd/s`), so a machine-wide lock
//! file (`/run/lockwarden-node.lock`, `flock`) serializes node test binaries: an explicit
//! exception to "heavy servers once per test binary".
//!
//! Settings this host needs, each for a reason found on it:
//! - cgroup v1 (`failCgroupV1: false`), the `cgroupfs` driver (no systemd), swap allowed;
//!   every Pod cgroup under `/lockwarden-node` (`cgroupRoot`), so the teardown finds them;
//! - no CAP_SYS_RESOURCE in this VM: runc cannot write `oom_score_adj`, which surfaces
//!   as "can't get final child's PID from pipe: EOF" (CRI `restrict_oom_score_adj`);
//! - a loopback node IP is refused, so the node is named `localhost`, the kubelet binds
//!   to 127.0.0.1, and the API server reaches it by Hostname (`kubectl logs` works);
//! - images cannot be pulled again: image GC thresholds that never delete, and disk
//!   eviction thresholds that never evict.
//!
//! Network: the test Pods that talk to a server use `hostNetwork: true`, so every
//! connection stays on 127.0.0.1 (the API server, the kubelet, the controller's
//! probes). The kubelet reports the node Ready only once containerd has loaded a CNI
//! configuration, and containerd 1.6 refuses a sandbox whose network gives it no
//! `eth0` (a loopback-only configuration fails every Pod without hostNetwork with
//! "failed to find network info for sandbox"). So Pods without hostNetwork (the
//! examples, as written) get an isolated network: a bridge with no address, no
//! gateway and no NAT, host-local addresses in `CNI_SUBNET`, no iptables rule, no
//! route anywhere. Nothing connects to those addresses (no probes on such Pods).
//!
//! Teardown: at exit (`atexit`, which also runs when tests panicked) and before a start
//! (what a killed test binary left), a sweep kills by PID every process in the node's
//! cgroups and every containerd shim of its containerd (shims reparent to PID 1, which is
//! not systemd here), stops containerd and the kubelet, unmounts what lies under the
//! node's directories (the Pods' network namespaces too, which takes their veths),
//! deletes the bridge, removes its cgroups, its containerd data and its sandboxes' CNI
//! results, then checks that nothing is left: processes, mounts, cgroups, CNI results,
//! network interfaces (against those present before the start) and CNI iptables
//! chains. Anything left
//! makes the test binary exit non-zero, naming it.

use super::kube::{ControlPlane, ControlPlaneOptions, client_from_kubeconfig};
use super::proxy::Proxy;
use super::{ServerProcess, free_port, repo_root, tool, unique, wait_for_port, work_dir};

use k8s_openapi::api::core::v1::{Node as KubeNode, ServiceAccount};
use kube::Client;
use kube::api::Api;
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The node's name: a loopback IP is refused as a node IP, a hostname is not.
pub const NODE_NAME: &str = "localhost";

/// Held (flock) while a node runs on this machine.
const MACHINE_LOCK: &str = "/run/lockwarden-node.lock";
/// The node directory of the running (or last, if it was killed) node, for the sweep.
const STATE_FILE: &str = "/run/lockwarden-node.state";
/// containerd's sockets and the kubelet's root directory (which holds sockets too):
/// short paths, as a socket path has at most 107 bytes.
const SOCKET_DIR: &str = "/run/lockwarden-node";
/// The kubelet's cgroupRoot: every Pod's cgroup is below it, in every hierarchy.
const CGROUP_ROOT: &str = "lockwarden-node";
/// The name of the node's CNI network (its results are cached under /var/lib/cni).
const CNI_NETWORK: &str = "lockwarden-isolated";
/// Its bridge: no address, no gateway, no NAT, so nothing on it reaches anything else.
const CNI_BRIDGE: &str = "lwcni0";
/// Its Pod addresses (host-local IPAM, state in the node's directory).
const CNI_SUBNET: &str = "10.244.0.0/24";

/// How long the node may take to start (images imported, node Ready, taints gone).
/// About 10 s idle; the test machine is a loaded 2-core box.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(300);
/// How long another test binary's node may keep the machine lock.
const MACHINE_LOCK_TIMEOUT: Duration = Duration::from_secs(3600);

/// The images in the node's containerd.
pub struct Images {
    /// lockwarden's image, built from the repository's Dockerfile around this build's
    /// binary (`scripts/testenv lockwarden-image`).
    pub lockwarden: String,
    /// busybox (sh, cat, nc, …) and nothing else.
    pub workload: String,
    /// lockwarden as released at the previous release (`LOCKWARDEN_PREVIOUS_RELEASE`),
    /// from today's Dockerfile: the upgrade test starts from it. Imported only if its
    /// archive is there (`scripts/testenv` builds it; `scripts/demo --node` needs none):
    /// [`Images::previous`].
    previous: Option<String>,
    /// kubectl as the entrypoint of an otherwise empty image, imported only if its
    /// archive is there: [`Images::kubectl`].
    kubectl: Option<String>,
}

impl Images {
    /// The previous release's image; fails the calling test, naming the archive, when it
    /// was not imported (its archive missing): a test that needs it never passes without.
    pub fn previous(&self) -> &str {
        self.previous.as_deref().unwrap_or_else(|| {
            panic!(
                "the previous release's image was not imported into the node: its archive \
                 (LOCKWARDEN_PREVIOUS_IMAGE_ARCHIVE) is missing; run `scripts/testenv` first"
            )
        })
    }

    /// The kubectl image; fails the calling test, naming the archive, when it was not
    /// imported.
    pub fn kubectl(&self) -> &str {
        self.kubectl.as_deref().unwrap_or_else(|| {
            panic!(
                "the kubectl image was not imported into the node: its archive \
                 (LOCKWARDEN_KUBECTL_IMAGE_ARCHIVE) is missing; run `scripts/testenv` first"
            )
        })
    }
}

/// A running node and its control plane. Lives in a `static`; torn down at exit.
pub struct Node {
    plane: ControlPlane,
    dir: PathBuf,
    images: Images,
    /// lockwarden as one static binary, the one in [`Images::lockwarden`].
    static_binary: PathBuf,
    /// The kubelet's way to the API server (its kubeconfig names this proxy).
    kubelet_api: Proxy,
    processes: Mutex<NodeProcesses>,
    /// Network interfaces present before the node started.
    interfaces_before: Vec<String>,
    /// The machine lock, held as long as this binary runs (the kernel releases it).
    _machine_lock: File,
}

struct NodeProcesses {
    // Stopped in this order: nothing restarts containers once the kubelet is gone.
    kubelet: Option<ServerProcess>,
    scheduler: Option<ServerProcess>,
    containerd: Option<ServerProcess>,
}

impl Node {
    /// The node shared by every test in this binary, started on first use (blocking the
    /// calling thread). A failed start fails every test with the same message.
    pub fn shared() -> &'static Node {
        static SHARED: OnceLock<Result<Node, String>> = OnceLock::new();
        match SHARED.get_or_init(|| {
            let started = std::thread::Builder::new()
                .name("node".into())
                .spawn(Node::launch)
                .expect("spawn node thread")
                .join()
                .map_err(panic_message);
            if started.is_ok() {
                // SAFETY: registering a plain extern "C" function.
                unsafe { libc::atexit(teardown_at_exit) };
            }
            started
        }) {
            Ok(node) => node,
            Err(msg) => panic!("the node did not start:\n{msg}"),
        }
    }

    /// The node's control plane (its own: Node authorizer, ServiceAccount admission).
    pub fn plane(&self) -> &ControlPlane {
        &self.plane
    }

    /// An admin client bound to the calling test's runtime.
    pub async fn client(&self) -> Client {
        self.plane.client().await
    }

    pub fn images(&self) -> &Images {
        &self.images
    }

    /// lockwarden as one static binary, the one lockwarden's image has: mounted into a
    /// container (a hostPath of type File), it stands for a workload image built with
    /// the guard in it, which needs no init container to install it.
    pub fn static_binary(&self) -> &Path {
        &self.static_binary
    }

    /// This node's directory (logs, the kubelet's and containerd's state).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A fresh directory on the host for a test to mount as a hostPath volume.
    pub fn host_dir(&self, prefix: &str) -> PathBuf {
        let dir = self.dir.join("host").join(unique(prefix));
        std::fs::create_dir_all(&dir).expect("create a host directory");
        dir
    }

    /// A fresh namespace whose `default` ServiceAccount exists (the ServiceAccount
    /// admission plugin refuses Pods until it does).
    pub async fn namespace(&self, client: &Client, prefix: &str) -> String {
        let ns = self.plane.namespace(client, prefix).await;
        wait_service_account(client, &ns, "default").await;
        ns
    }

    /// The kubelet's log tail, for failure messages.
    pub fn kubelet_log_tail(&self, lines: usize) -> String {
        let processes = self.processes.lock().unwrap();
        processes
            .kubelet
            .as_ref()
            .map(|k| k.log_tail(lines))
            .unwrap_or_default()
    }

    fn launch() -> Node {
        let started = Instant::now();
        // Beside the node's start: a cold build takes minutes, the start about a minute,
        // and only the images need the binary.
        let binary = std::thread::spawn(static_binary);
        let machine_lock = take_machine_lock();
        // What a killed test binary left behind, before it can get in the way.
        if let Ok(previous) = std::fs::read_to_string(STATE_FILE) {
            let previous = PathBuf::from(previous.trim());
            eprintln!(
                "[support] a node ({}) was not torn down (its test binary was killed): {} \
                 processes, {} mounts, {} cgroup roots; sweeping",
                previous.display(),
                node_pids().len(),
                mounts_under(&previous).len(),
                node_cgroups().len()
            );
            let left = sweep(&previous);
            if !left.is_empty() {
                panic!(
                    "a previous node ({}) left things the sweep cannot remove:\n{}",
                    previous.display(),
                    left.join("\n")
                );
            }
        }
        let dir = work_dir(&unique("node"));
        std::fs::write(STATE_FILE, dir.display().to_string()).expect("write the node state file");
        let interfaces_before = interfaces();

        let plane = ControlPlane::start_with(ControlPlaneOptions::for_node());
        let scheduler = start_scheduler(&plane, &dir);
        let mut containerd = start_containerd(&dir);
        let kubelet_api = Proxy::start(plane.port());
        let kubelet = start_kubelet(&plane, &dir, &kubelet_api);
        // While the kubelet registers: no Pod runs before this returns.
        let binary = binary.join().expect("the static binary");
        let images = import_images(&mut containerd, &dir, &binary);
        let node = Node {
            plane,
            dir,
            images,
            static_binary: binary,
            kubelet_api,
            processes: Mutex::new(NodeProcesses {
                kubelet: Some(kubelet),
                scheduler: Some(scheduler),
                containerd: Some(containerd),
            }),
            interfaces_before,
            _machine_lock: machine_lock,
        };
        node.wait_ready();
        eprintln!(
            "[support] node {NODE_NAME} Ready and untainted after {:.1?}",
            started.elapsed()
        );
        node
    }

    /// Waits until the Node is Ready and has no taints (the node lifecycle controller
    /// removes the not-ready taint), so Pods without tolerations schedule.
    fn wait_ready(&self) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime for the node's readiness");
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        let mut last = String::new();
        rt.block_on(async {
            let client = client_from_kubeconfig(self.plane.kubeconfig_path()).await;
            let nodes = Api::<KubeNode>::all(client);
            loop {
                let state = match nodes.get_opt(NODE_NAME).await {
                    Ok(Some(node)) => node_state(&node),
                    Ok(None) => "not registered".to_string(),
                    Err(e) => format!("cannot read: {e}"),
                };
                if state == "Ready" {
                    return;
                }
                if state != last {
                    eprintln!("[support] node {NODE_NAME}: {state}");
                    last = state.clone();
                }
                self.assert_running();
                assert!(
                    Instant::now() < deadline,
                    "node {NODE_NAME} not ready after {STARTUP_TIMEOUT:?} ({state}); kubelet log:\n{}",
                    self.kubelet_log_tail(40)
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }

    /// Fails (with its log) if the kubelet or containerd exited.
    fn assert_running(&self) {
        let mut guard = self.processes.lock().unwrap();
        let processes = &mut *guard;
        for process in [&mut processes.kubelet, &mut processes.containerd]
            .into_iter()
            .flatten()
        {
            assert!(
                process.is_running(),
                "{} exited while the node was starting; log {}:\n{}",
                process.name,
                process.log.display(),
                process.log_tail(40)
            );
        }
    }

    /// Stops everything the node started and checks nothing is left; what is left.
    fn teardown(&self) -> Vec<String> {
        let mut processes = self.processes.lock().unwrap();
        for process in [
            processes.kubelet.take(),
            processes.scheduler.take(),
            processes.containerd.take(),
        ]
        .into_iter()
        .flatten()
        {
            let mut process = process;
            process.kill();
        }
        let mut left = sweep(&self.dir);
        let before = &self.interfaces_before;
        left.extend(
            interfaces()
                .into_iter()
                .filter(|i| !before.contains(i))
                .map(|i| format!("network interface {i}")),
        );
        if left.is_empty() {
            let _ = std::fs::remove_file(STATE_FILE);
        }
        left
    }

    /// The proxy between the kubelet and the API server: passing, except while a test
    /// cuts the kubelet off (such a test runs alone with the kubelet: tests/node's
    /// `KUBELET` lock, and sets it passing again before it ends, also when it fails).
    pub fn kubelet_api(&self) -> &Proxy {
        &self.kubelet_api
    }

    /// The node's containerd socket (`ctr --address`), to import an image built after
    /// the node started (`scripts/demo --node`).
    pub fn containerd_socket(&self) -> PathBuf {
        containerd_socket()
    }
}

/// At exit: the node's teardown; anything left fails the test binary.
extern "C" fn teardown_at_exit() {
    // The OnceLock is initialised (this is registered only after a successful start).
    let node = Node::shared();
    let started = Instant::now();
    let left = node.teardown();
    if left.is_empty() {
        eprintln!(
            "[support] node torn down in {:.1?}: no process, mount, cgroup, network namespace, \
             interface or CNI iptables rule left",
            started.elapsed()
        );
    } else {
        eprintln!(
            "[support] the node's teardown left behind:\n  {}",
            left.join("\n  ")
        );
        // SAFETY: ends the process at once, from an exit handler.
        unsafe { libc::_exit(1) };
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "the node start panicked".to_string())
}

/// Takes the machine-wide lock, waiting (and saying so) while another binary's node runs.
fn take_machine_lock() -> File {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(MACHINE_LOCK)
        .unwrap_or_else(|e| panic!("cannot open {MACHINE_LOCK} (the node tests need root): {e}"));
    let deadline = Instant::now() + MACHINE_LOCK_TIMEOUT;
    let mut said = false;
    // SAFETY: flock on an open descriptor.
    while unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        if !said {
            eprintln!("[support] another node runs on this machine; waiting for {MACHINE_LOCK}");
            said = true;
        }
        assert!(
            Instant::now() < deadline,
            "{MACHINE_LOCK} still held after {MACHINE_LOCK_TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    file
}

fn node_state(node: &KubeNode) -> String {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    match ready {
        Some(c) if c.status == "True" => {
            let taints: Vec<String> = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .map(|t| t.iter().map(|t| t.key.clone()).collect())
                .unwrap_or_default();
            if taints.is_empty() {
                "Ready".to_string()
            } else {
                format!("Ready, still tainted {taints:?}")
            }
        }
        Some(c) => format!(
            "not Ready: {} ({})",
            c.reason.as_deref().unwrap_or(""),
            c.message.as_deref().unwrap_or("")
        ),
        None => "no Ready condition yet".to_string(),
    }
}

async fn wait_service_account(client: &Client, ns: &str, name: &str) {
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), ns);
    super::eventually(
        &format!("ServiceAccount {ns}/{name}"),
        Duration::from_secs(120),
        || async { accounts.get_opt(name).await.ok().flatten() },
    )
    .await;
}

fn start_scheduler(plane: &ControlPlane, dir: &Path) -> ServerProcess {
    let port = free_port();
    let kubeconfig = plane.kubeconfig_path();
    let mut cmd = Command::new(tool("KUBE_SCHEDULER"));
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!(
            "--authentication-kubeconfig={}",
            kubeconfig.display()
        ))
        .arg(format!(
            "--authorization-kubeconfig={}",
            kubeconfig.display()
        ))
        .arg("--leader-elect=false")
        .arg("--bind-address=127.0.0.1")
        .arg(format!("--secure-port={port}"))
        .arg(format!(
            "--cert-dir={}",
            dir.join("scheduler-certs").display()
        ))
        .arg("--profiling=false")
        .arg("--v=1");
    let mut scheduler = ServerProcess::start("kube-scheduler", cmd, dir);
    wait_for_port(&mut scheduler, port, STARTUP_TIMEOUT);
    scheduler
}

fn kubelet_root() -> PathBuf {
    Path::new(SOCKET_DIR).join("kubelet")
}

fn containerd_socket() -> PathBuf {
    Path::new(SOCKET_DIR).join("containerd.sock")
}

/// containerd with its root and state in the node's directory, the CRI plugin set for
/// this host (see the module comment) and the isolated CNI network.
fn start_containerd(dir: &Path) -> ServerProcess {
    let cni_dir = dir.join("cni");
    std::fs::create_dir_all(&cni_dir).expect("create the CNI config dir");
    std::fs::create_dir_all(SOCKET_DIR).expect("create the containerd socket dir");
    let config = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [{
            "type": "bridge",
            "bridge": CNI_BRIDGE,
            "isGateway": false,
            "ipMasq": false,
            "hairpinMode": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[{ "subnet": CNI_SUBNET }]],
                "dataDir": dir.join("cni-ipam"),
            },
        }],
    });
    std::fs::write(
        cni_dir.join("10-lockwarden-isolated.conflist"),
        config.to_string(),
    )
    .expect("write the CNI config");
    let socket = containerd_socket();
    let toml = format!(
        r#"version = 2
root = "{root}"
state = "{state}"
# Snapshotters this host has no use for (they only log errors at start).
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[debug]
  level = "warn"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
"#,
        root = dir.join("containerd/root").display(),
        state = dir.join("containerd/state").display(),
        opt = dir.join("containerd/opt").display(),
        socket = socket.display(),
        pause = testenv_value("LOCKWARDEN_PAUSE_IMAGE"),
        cni_bin = tool("CNI_BIN_DIR").display(),
        cni_conf = cni_dir.display(),
    );
    let config_path = dir.join("containerd.toml");
    std::fs::write(&config_path, toml).expect("write containerd.toml");
    // A socket file left by an earlier node (its containerd gone) would pass for this
    // one's: a kubelet started on it found nobody listening and exited (a cold CI run's
    // demo_node). Remove it, and wait until the socket takes a connection.
    for stale in [socket.clone(), socket.with_extension("sock.ttrpc")] {
        let _ = std::fs::remove_file(stale);
    }
    let mut cmd = Command::new(tool("CONTAINERD"));
    cmd.arg("--config").arg(&config_path);
    let mut containerd = ServerProcess::start("containerd", cmd, dir);
    super::wait_until(&mut containerd, STARTUP_TIMEOUT, "its socket", || {
        std::os::unix::net::UnixStream::connect(&socket).is_ok()
    });
    containerd
}

/// A value `scripts/testenv env` prints that is not a path (an image reference).
fn testenv_value(name: &str) -> String {
    std::env::var(name)
        .ok()
        .or_else(|| super::testenv().get(name).cloned())
        .unwrap_or_else(|| panic!("{name} is not set; run `scripts/testenv` first"))
}

/// `ctr -n k8s.io ARGS` against the node's containerd.
fn ctr(args: &[&str]) -> std::process::Output {
    Command::new(tool("CONTAINERD_CTR"))
        .arg("--address")
        .arg(containerd_socket())
        .args(["--namespace", "k8s.io"])
        .args(args)
        .output()
        .expect("run ctr")
}

/// lockwarden built as one static binary (`scripts/static-binary`): the image's binary,
/// which `lockwarden install` copies into workload images (busybox here) for
/// `lockwarden guard`, so it must not need their C library. `LOCKWARDEN_STATIC_BINARY`
/// when scripts/test built it already; otherwise the script runs now, into this build's
/// target directory (cargo does nothing when it is up to date; a cold one takes minutes).
///
/// `LOCKWARDEN_STATIC_BUILD=PREFIX` (scripts/test, which builds it beside the tests):
/// the build is under way; it writes `PREFIX.path` and then `PREFIX.rc` (its exit
/// status), and this waits for them, so a node starts while the binary still builds.
fn static_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("LOCKWARDEN_STATIC_BINARY").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    if let Some(prefix) = std::env::var_os("LOCKWARDEN_STATIC_BUILD").filter(|p| !p.is_empty()) {
        return static_binary_built_elsewhere(Path::new(&prefix));
    }
    // <target>/debug/lockwarden: the same target directory, whatever named it.
    let target_dir = super::target_dir().to_path_buf();
    let started = Instant::now();
    let out = Command::new(repo_root().join("scripts/static-binary"))
        .env("CARGO_TARGET_DIR", &target_dir)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/static-binary");
    assert!(
        out.status.success(),
        "scripts/static-binary failed (its output above)"
    );
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    eprintln!(
        "[support] the static binary {} ({:.1?})",
        path.display(),
        started.elapsed()
    );
    path
}

/// The static binary scripts/test builds (see [`static_binary`]): waits for its
/// `PREFIX.rc`, then reads `PREFIX.path`; a failed build fails the node with its log.
fn static_binary_built_elsewhere(prefix: &Path) -> PathBuf {
    let file = |ext: &str| PathBuf::from(format!("{}.{ext}", prefix.display()));
    let started = Instant::now();
    let rc = loop {
        match std::fs::read_to_string(file("rc")) {
            Ok(rc) if !rc.trim().is_empty() => break rc.trim().to_string(),
            _ => {}
        }
        assert!(
            started.elapsed() < Duration::from_secs(3600),
            "the static binary's build ({}) did not finish in an hour",
            prefix.display()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(
        rc,
        "0",
        "scripts/static-binary failed; its log ({}.log):\n{}",
        prefix.display(),
        std::fs::read_to_string(file("log")).unwrap_or_default()
    );
    let path = PathBuf::from(
        std::fs::read_to_string(file("path"))
            .expect("the static build's path file")
            .trim(),
    );
    eprintln!(
        "[support] the static binary {} (waited {:.1?} for scripts/test's build)",
        path.display(),
        started.elapsed()
    );
    path
}

/// Imports the pause, workload and lockwarden images (the latter built now, around the
/// static binary) and, where their archives exist, the previous release's and the
/// kubectl image into the node's containerd, where the CRI plugin finds them.
fn import_images(containerd: &mut ServerProcess, dir: &Path, binary: &Path) -> Images {
    let images_dir = tool("LOCKWARDEN_NODE_IMAGES");
    let started = Instant::now();
    let binary = binary.display().to_string();
    let out = Command::new(repo_root().join("scripts/testenv"))
        .args(["lockwarden-image", &binary])
        .output()
        .expect("run scripts/testenv lockwarden-image");
    assert!(
        out.status.success(),
        "scripts/testenv lockwarden-image {binary} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lockwarden_archive = String::from_utf8_lossy(&out.stdout).trim().to_string();
    eprintln!(
        "[support] lockwarden's image for {binary}: {lockwarden_archive} ({:.1?})",
        started.elapsed()
    );
    // The previous release's and the kubectl image only if built: the tests that run
    // them fail without (`Images::previous`, `Images::kubectl`), nothing else needs them.
    let (previous_archive, kubectl_archive) = (
        optional_path("LOCKWARDEN_PREVIOUS_IMAGE_ARCHIVE"),
        optional_path("LOCKWARDEN_KUBECTL_IMAGE_ARCHIVE"),
    );
    for (name, archive) in [
        ("the previous release's image", &previous_archive),
        ("the kubectl image", &kubectl_archive),
    ] {
        if archive.is_none() {
            eprintln!(
                "[support] {name} is not imported: its archive is missing (`scripts/testenv` \
                 builds it); a test that runs it fails"
            );
        }
    }
    let archives = [
        Some(images_dir.join("pause.tar")),
        Some(images_dir.join("workload.tar")),
        Some(PathBuf::from(&lockwarden_archive)),
        previous_archive.clone(),
        kubectl_archive.clone(),
    ];
    for archive in archives.iter().flatten() {
        let out = ctr(&["images", "import", &archive.display().to_string()]);
        assert!(
            out.status.success(),
            "ctr images import {} failed: {}\ncontainerd log:\n{}",
            archive.display(),
            String::from_utf8_lossy(&out.stderr),
            containerd.log_tail(20)
        );
    }
    let _ = dir;
    eprintln!(
        "[support] images imported into the node's containerd after {:.1?}",
        started.elapsed()
    );
    Images {
        lockwarden: testenv_value("LOCKWARDEN_IMAGE"),
        workload: testenv_value("LOCKWARDEN_WORKLOAD_IMAGE"),
        previous: previous_archive.map(|_| testenv_value("LOCKWARDEN_PREVIOUS_IMAGE")),
        kubectl: kubectl_archive.map(|_| testenv_value("LOCKWARDEN_KUBECTL_IMAGE")),
    }
}

/// The path `scripts/testenv env` gives for `name` (or the variable), if that file
/// exists and is not empty.
fn optional_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var(name)
        .ok()
        .or_else(|| super::testenv().get(name).cloned())
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)?;
    std::fs::metadata(&path)
        .is_ok_and(|m| m.len() > 0)
        .then_some(path)
}

/// Creates the kubelet's cgroupRoot in every cgroup hierarchy (the kubelet refuses a
/// cgroupRoot that does not exist). A cpuset cgroup takes no process before it has CPUs
/// and memory nodes: its parent's.
fn create_cgroup_root() {
    for path in cgroup_hierarchies() {
        let root = path.join(CGROUP_ROOT);
        std::fs::create_dir_all(&root)
            .unwrap_or_else(|e| panic!("create cgroup {}: {e}", root.display()));
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(value) = std::fs::read_to_string(path.join(file)) {
                std::fs::write(root.join(file), value.trim())
                    .unwrap_or_else(|e| panic!("write {}/{file}: {e}", root.display()));
            }
        }
    }
}

/// The kubelet, as `system:node:localhost` (Node authorizer), bound to 127.0.0.1.
/// Its kubeconfig reaches the API server through `api`, a proxy a test may cut.
fn start_kubelet(plane: &ControlPlane, dir: &Path, api: &Proxy) -> ServerProcess {
    create_cgroup_root();
    let root = kubelet_root();
    std::fs::create_dir_all(&root).expect("create the kubelet root dir");
    let kubeconfig =
        plane.user_kubeconfig(&format!("system:node:{NODE_NAME}"), Some("system:nodes"));
    let text = std::fs::read_to_string(&kubeconfig).expect("read the kubelet's kubeconfig");
    std::fs::write(
        &kubeconfig,
        text.replace(plane.url(), &format!("https://127.0.0.1:{}", api.port())),
    )
    .expect("write the kubelet's kubeconfig");
    let (port, healthz_port) = (free_port(), free_port());
    let config = serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        // Only 127.0.0.1 reaches it; the API server (logs) presents no client certificate.
        "authentication": { "anonymous": { "enabled": true }, "webhook": { "enabled": false } },
        "authorization": { "mode": "AlwaysAllow" },
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": format!("/{CGROUP_ROOT}"),
        "failCgroupV1": false,
        "failSwapOn": false,
        "containerRuntimeEndpoint": format!("unix://{}", containerd_socket().display()),
        // Images cannot be pulled again: never collect them, never evict for disk.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "podLogsDir": dir.join("pod-logs"),
        "volumePluginDir": dir.join("volume-plugins"),
        // No iptables chains of the kubelet's own.
        "makeIPTablesUtilChains": false,
        "resolvConf": "/etc/resolv.conf",
        // Status quickly visible (the defaults only add latency in tests).
        "nodeStatusUpdateFrequency": "2s",
        "syncFrequency": "5s",
        "fileCheckFrequency": "5s",
    });
    let config_path = dir.join("kubelet-config.yaml");
    std::fs::write(&config_path, config.to_string()).expect("write the kubelet config");
    let mut cmd = Command::new(tool("KUBELET"));
    cmd.arg(format!("--config={}", config_path.display()))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--hostname-override={NODE_NAME}"))
        .arg(format!("--root-dir={}", root.display()))
        .arg(format!("--cert-dir={}", root.join("pki").display()))
        .arg("--v=1");
    let mut kubelet = ServerProcess::start("kubelet", cmd, dir);
    wait_for_port(&mut kubelet, healthz_port, STARTUP_TIMEOUT);
    kubelet
}

/// Network interfaces of this network namespace.
fn interfaces() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The node's cgroup in every mounted cgroup hierarchy that has one.
fn node_cgroups() -> Vec<PathBuf> {
    cgroup_hierarchies()
        .into_iter()
        .map(|h| h.join(CGROUP_ROOT))
        .filter(|p| p.is_dir())
        .collect()
}

/// The mounted cgroup hierarchies: `/sys/fs/cgroup` itself on cgroup v2, each
/// controller's directory below it on v1 (this host; symlinks such as `cpu,cpuacct`
/// aliases skipped).
fn cgroup_hierarchies() -> Vec<PathBuf> {
    let base = Path::new("/sys/fs/cgroup");
    if base.join("cgroup.controllers").exists() {
        return vec![base.to_path_buf()];
    }
    std::fs::read_dir(base)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.is_dir() && !p.is_symlink())
                .collect()
        })
        .unwrap_or_default()
}

/// Every cgroup directory below `root` (itself included), deepest first.
fn cgroup_tree(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
        out.push(dir);
    }
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out
}

/// PIDs of the processes in the node's cgroups (any hierarchy) and of the containerd
/// shims serving the node's containerd.
fn node_pids() -> Vec<i32> {
    let mut pids: Vec<i32> = Vec::new();
    for root in node_cgroups() {
        for cg in cgroup_tree(&root) {
            if let Ok(procs) = std::fs::read_to_string(cg.join("cgroup.procs")) {
                pids.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
        }
    }
    let socket = containerd_socket().display().to_string();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains("containerd-shim") && cmdline.contains(&socket) {
                pids.push(pid);
            }
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Mount points at or below `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir) || p.starts_with(SOCKET_DIR))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    points
}

/// Removes what a node with directory `dir` may have left (see the module comment) and
/// returns what is still there afterwards.
fn sweep(dir: &Path) -> Vec<String> {
    // The kubelet and containerd of a killed binary died with it (PR_SET_PDEATHSIG);
    // the shims and the containers did not. Kill those until none is left.
    let started = Instant::now();
    let deadline = started + Duration::from_secs(30);
    loop {
        let pids = node_pids();
        if pids.is_empty() || Instant::now() > deadline {
            break;
        }
        for pid in pids {
            // SAFETY: a signal to a PID found in the node's cgroups or as its shim.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for point in mounts_under(dir) {
        let c = std::ffi::CString::new(point.as_os_str().as_encoded_bytes()).expect("a path");
        // SAFETY: unmounting a path (lazily: a busy mount goes once unused).
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
    let killed = started.elapsed();
    // A cgroup goes once its last process has been reaped; give PID 1 a moment.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut busy = false;
        for root in node_cgroups() {
            for cg in cgroup_tree(&root) {
                busy |= std::fs::remove_dir(&cg).is_err();
            }
        }
        if !busy || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let cgroups_gone = started.elapsed();
    // With their network namespaces gone, the Pods' veths are gone; the bridge stays.
    if Path::new("/sys/class/net").join(CNI_BRIDGE).exists() {
        let _ = Command::new("ip")
            .args(["link", "delete", CNI_BRIDGE])
            .status();
    }
    // The containerd data (images, snapshots) is large and of no use after the run, the
    // kubelet's root holds nothing of use either; the logs stay. (Not while something is
    // still mounted there: that is reported below.)
    // containerd caches each sandbox's CNI results (its network's and the implicit
    // loopback's) under /var/lib/cni/results, named after the sandbox.
    let sandboxes = sandbox_ids(dir);
    remove_entries("/var/lib/cni/results", |p| {
        let name = p.file_name().unwrap_or_default().to_string_lossy();
        sandboxes.iter().any(|id| name.contains(id.as_str()))
    });
    if mounts_under(dir).is_empty() {
        let _ = std::fs::remove_dir_all(dir.join("containerd"));
        let _ = std::fs::remove_dir_all(kubelet_root());
    }
    // Host paths outside the node's directory: the kubelet's symlinks to its Pods' logs,
    // the CNI results of its network.
    remove_entries("/var/log/containers", |p| {
        std::fs::read_link(p).is_ok_and(|target| target.starts_with(dir))
    });

    let removed = started.elapsed();
    let mut left = Vec::new();
    left.extend(
        node_pids()
            .into_iter()
            .map(|pid| format!("process {pid}: {}", process_name(pid))),
    );
    left.extend(
        mounts_under(dir)
            .into_iter()
            .map(|p| format!("mount {}", p.display())),
    );
    left.extend(
        node_cgroups()
            .into_iter()
            .map(|p| format!("cgroup {}", p.display())),
    );
    if let Ok(entries) = std::fs::read_dir("/var/lib/cni/results") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if sandboxes.iter().any(|id| name.contains(id.as_str())) {
                left.push(format!("CNI result /var/lib/cni/results/{name}"));
            }
        }
    }
    let netns = dir.join("containerd/state/io.containerd.grpc.v1.cri/netns");
    if netns.exists() {
        left.push(format!("network namespaces in {}", netns.display()));
    }
    left.extend(
        cni_iptables_chains()
            .into_iter()
            .map(|c| format!("iptables chain {c}")),
    );
    if started.elapsed() > Duration::from_secs(5) {
        eprintln!(
            "[support] node sweep: processes gone after {killed:.1?}, cgroups after \
             {cgroups_gone:.1?}, data removed after {removed:.1?}, checked after {:.1?}",
            started.elapsed()
        );
    }
    left
}

/// The IDs of the Pod sandboxes the node's containerd made.
fn sandbox_ids(dir: &Path) -> Vec<String> {
    let mut ids = Vec::new();
    for part in ["root", "state"] {
        let sandboxes = dir
            .join("containerd")
            .join(part)
            .join("io.containerd.grpc.v1.cri/sandboxes");
        if let Ok(entries) = std::fs::read_dir(sandboxes) {
            ids.extend(
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned()),
            );
        }
    }
    ids.sort();
    ids.dedup();
    ids
}

fn remove_entries(dir: &str, matches: impl Fn(&Path) -> bool) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if matches(&e.path()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

fn process_name(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// iptables chains the CNI plugins make (`CNI-…`), if iptables is installed at all (the
/// bridge plugin makes them only for ipMasq, which is off).
fn cni_iptables_chains() -> Vec<String> {
    let Ok(out) = Command::new("iptables-save").output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|chain| chain.starts_with("CNI-"))
        .map(str::to_string)
        .collect()
}

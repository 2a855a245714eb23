//! The servers and long-lived processes every schedule reuses: two API servers with
//! three controller processes, moto, a 3-node ZooKeeper ensemble, and one fault proxy
//! per contender and server, so a network fault hits one contender only.
//!
//! Everything here is started once per test binary and lives in a `static`; schedules
//! isolate themselves with fresh keys.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::support::kube::{ControlPlane, install_lockwarden_crd};
use crate::support::moto::Moto;
use crate::support::proxy::{Mode, Proxy};
use crate::support::zookeeper::ZooKeeper;
use crate::support::{ServerProcess, unique_suffix, work_dir};

/// Name of the Secret with the (distinctive, fake) AWS credentials in every
/// controller's namespace.
pub const SECRET_NAME: &str = "chaos-aws";

/// The network paths of one contender: its own proxy in front of each server.
pub struct Paths {
    /// In front of the contender's API server.
    pub api: Proxy,
    moto: OnceLock<Proxy>,
    zk: OnceLock<Vec<Proxy>>,
}

impl Paths {
    fn new(api_port: u16) -> Paths {
        Paths {
            api: Proxy::start(api_port),
            moto: OnceLock::new(),
            zk: OnceLock::new(),
        }
    }

    pub fn moto(&self) -> &Proxy {
        self.moto
            .get_or_init(|| Proxy::start(world().moto().port()))
    }

    pub fn zk(&self) -> &[Proxy] {
        self.zk.get_or_init(|| {
            world()
                .zookeeper()
                .nodes()
                .iter()
                .map(|n| Proxy::start(n.port()))
                .collect()
        })
    }

    /// The contender's ZooKeeper connect string (its proxies).
    pub fn zk_connect(&self) -> String {
        self.zk()
            .iter()
            .map(Proxy::address)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Every proxy of this contender that exists now.
    pub fn all(&self) -> Vec<&Proxy> {
        let mut all = vec![&self.api];
        all.extend(self.moto.get());
        if let Some(zk) = self.zk.get() {
            all.extend(zk.iter());
        }
        all
    }

    pub fn heal(&self) {
        for p in self.all() {
            p.set_mode(Mode::Pass);
        }
    }
}

/// A `lockwarden controller` process watching one namespace of one API server,
/// through its own proxy to that API server.
pub struct Controller {
    /// Its cluster name, the first part of its holder identities.
    pub cluster: String,
    pub namespace: String,
    /// 0: the shared (east) API server; 1: the harness's own (west) one.
    pub plane: usize,
    pub paths: Paths,
    kubeconfig: PathBuf,
    dir: PathBuf,
    process: Mutex<Option<ServerProcess>>,
    starts: Mutex<u32>,
}

impl Controller {
    fn start_process(&self) {
        let mut slot = self.process.lock().unwrap();
        if slot.is_some() {
            return;
        }
        self.spawn_into(&mut slot);
    }

    fn spawn_into(&self, slot: &mut Option<ServerProcess>) {
        let mut n = self.starts.lock().unwrap();
        *n += 1;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lockwarden"));
        cmd.args([
            "controller",
            "--cluster-name",
            &self.cluster,
            "--watch-namespace",
            &self.namespace,
            "--metrics-address",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ])
        .env("KUBECONFIG", &self.kubeconfig)
        // Everything the controller says, so the secret check reads as much as possible.
        .env("LOCKWARDEN_LOG", "lockwarden=debug");
        *slot = Some(ServerProcess::start(
            &format!("controller-{}-{}", self.cluster, *n),
            cmd,
            &self.dir,
        ));
    }

    /// What a kubelet does for a crashed container: a process that exited on its own
    /// (not killed by a fault) is started again. Returns whether it had to.
    fn restart_if_exited(&self) -> bool {
        let mut slot = self.process.lock().unwrap();
        let exited = slot.as_mut().is_some_and(|p| !p.is_running());
        if exited {
            let log = slot.take().map(|p| p.log.display().to_string());
            eprintln!(
                "[chaos] controller {} exited on its own (log {log:?}); restarting it",
                self.cluster
            );
            self.spawn_into(&mut slot);
        }
        exited
    }

    /// SIGKILL: nothing released, nothing flushed.
    pub fn kill(&self) {
        if let Some(mut p) = self.process.lock().unwrap().take() {
            p.kill();
        }
    }

    /// Starts it if it is not running (after a kill), and resumes it if stopped.
    pub fn ensure_running(&self) {
        {
            let mut slot = self.process.lock().unwrap();
            if let Some(p) = slot.as_mut() {
                if p.is_running() {
                    p.signal(libc::SIGCONT);
                    return;
                }
                slot.take();
            }
        }
        self.start_process();
    }

    pub fn signal(&self, sig: i32) {
        if let Some(p) = self.process.lock().unwrap().as_ref() {
            p.signal(sig);
        }
    }

    /// The directory with every log this controller's processes wrote.
    pub fn log_dir(&self) -> &Path {
        &self.dir
    }

    /// Its holder identity for a lock named `name` in its namespace.
    pub fn holder(&self, name: &str) -> String {
        format!("{}/{}/{}", self.cluster, self.namespace, name)
    }
}

/// A slot for command-line contenders: its proxies, a kubeconfig through its API
/// proxy, and the process groups of its commands now running (for `cli-sigkill`).
/// A guarded round's `lockwarden guard` reaches the store through proxies of its own
/// (`guard_paths`), so a fault can cut the guard off while its holder renews, or the
/// holder while the guard reads on.
pub struct CliSlot {
    pub paths: Paths,
    pub kubeconfig: PathBuf,
    pub guard_paths: Paths,
    pub guard_kubeconfig: PathBuf,
    running: Mutex<Vec<u32>>,
    /// The holders (`run`) of guarded rounds now running, for `cli-holder-sigstop`:
    /// SIGSTOP reaches the holder process alone, never its command, the guard.
    holders: Mutex<Vec<u32>>,
    /// Holders stopped by `cli-holder-sigstop`, to be continued when it ends.
    stopped: Mutex<Vec<u32>>,
}

impl CliSlot {
    pub fn started(&self, pid: Option<u32>) {
        self.running.lock().unwrap().extend(pid);
    }

    pub fn ended(&self, pid: Option<u32>) {
        self.running.lock().unwrap().retain(|p| Some(*p) != pid);
    }

    /// SIGKILL to the process group of every command of this slot now running: the
    /// machine they run on dies (a `run` and its command together).
    pub fn kill_all(&self) -> usize {
        let running = self.running.lock().unwrap().clone();
        for pid in &running {
            // SAFETY: kill(2) with a negative pid signals that process group; plain integers.
            unsafe { libc::kill(-(*pid as i32), libc::SIGKILL) };
        }
        running.len()
    }

    /// A guarded round's holder started (`pid` leads its process group, the guard in it).
    pub fn holder_started(&self, pid: Option<u32>) {
        self.started(pid);
        self.holders.lock().unwrap().extend(pid);
    }

    pub fn holder_ended(&self, pid: Option<u32>) {
        self.ended(pid);
        self.holders.lock().unwrap().retain(|p| Some(*p) != pid);
    }

    /// SIGSTOP to every holder process now running and not stopped yet (not to its
    /// process group: the guard runs on); how many were stopped by this call.
    pub fn stop_holders(&self) -> usize {
        let holders = self.holders.lock().unwrap().clone();
        let mut stopped = self.stopped.lock().unwrap();
        let mut n = 0;
        for pid in holders {
            if !stopped.contains(&pid) {
                // SAFETY: kill(2) on one process; plain integers.
                unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
                stopped.push(pid);
                n += 1;
            }
        }
        n
    }

    /// SIGCONT to every holder [`CliSlot::stop_holders`] stopped.
    pub fn continue_holders(&self) -> usize {
        let stopped = std::mem::take(&mut *self.stopped.lock().unwrap());
        for pid in &stopped {
            // SAFETY: as above.
            unsafe { libc::kill(*pid as i32, libc::SIGCONT) };
        }
        stopped.len()
    }
}

pub struct World {
    pub east: &'static ControlPlane,
    /// In a mutex: the API-server restart fault needs it mutably.
    west: Mutex<ControlPlane>,
    west_kubeconfig: PathBuf,
    moto: OnceLock<Moto>,
    zookeeper: OnceLock<ZooKeeper>,
    /// 0: east, 1: west, 2: west2 (a second controller on the west API server, for
    /// Leases, which live in one cluster only).
    pub controllers: Vec<Controller>,
    /// Engine contenders' paths, by slot.
    pub engines: Vec<Paths>,
    /// Command-line contenders' slots.
    pub clis: Vec<CliSlot>,
    /// The fake AWS credentials in the Secret: (access key id, secret access key).
    pub secret_values: (String, String),
    pub dir: PathBuf,
    /// Controller processes that exited on their own and were started again.
    pub crash_restarts: AtomicU64,
}

/// Engine slots a mutex plan draws from.
pub const ENGINE_SLOTS: usize = 2;
/// Engine network paths in the world: a semaphore plan spreads its contenders over
/// all of them.
pub const ENGINE_PATHS: usize = 6;
pub const CLI_SLOTS: usize = 2;

static WORLD: OnceLock<World> = OnceLock::new();

/// The tests of a binary share its world's servers, controllers and proxies and inject
/// faults into them: one plan at a time. (A tokio mutex: it is held across awaits, and
/// works across the tests' runtimes.)
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The world, started on first use (blocks; call from a blocking context).
pub fn world() -> &'static World {
    // On a plain thread: starting it drives a runtime of its own, which must not
    // happen on a thread that is inside one (a test's runtime, a blocking task).
    WORLD.get_or_init(|| {
        std::thread::spawn(World::start)
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

impl World {
    fn start() -> World {
        let dir = work_dir("chaos");
        let east = ControlPlane::shared();
        let west = ControlPlane::start();
        let secret_values = (
            format!("AKIACHAOS{}", unique_suffix().to_uppercase()),
            format!("chaos-secret-{}-{}", unique_suffix(), unique_suffix()),
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut controllers = Vec::new();
        for (cluster, plane) in [("east", 0usize), ("west", 1), ("west2", 1)] {
            let cp: &ControlPlane = if plane == 0 { east } else { &west };
            let namespace = rt.block_on(async {
                let client = cp.client().await;
                install_lockwarden_crd(&client).await;
                let ns = cp.namespace(&client, &format!("chaos-{cluster}")).await;
                let secret: Secret = serde_json::from_value(json!({
                    "metadata": {"name": SECRET_NAME},
                    "stringData": {
                        "AWS_ACCESS_KEY_ID": secret_values.0,
                        "AWS_SECRET_ACCESS_KEY": secret_values.1,
                    },
                }))
                .unwrap();
                Api::<Secret>::namespaced(client, &ns)
                    .create(&PostParams::default(), &secret)
                    .await
                    .expect("create the credentials Secret");
                ns
            });
            let paths = Paths::new(cp.port());
            let kubeconfig = dir.join(format!("{cluster}.kubeconfig"));
            let text = std::fs::read_to_string(cp.kubeconfig_path()).unwrap();
            std::fs::write(
                &kubeconfig,
                text.replace(cp.url(), &format!("https://127.0.0.1:{}", paths.api.port())),
            )
            .unwrap();
            let ctl_dir = dir.join(format!("controller-{cluster}"));
            std::fs::create_dir_all(&ctl_dir).unwrap();
            let controller = Controller {
                cluster: cluster.to_string(),
                namespace,
                plane,
                paths,
                kubeconfig,
                dir: ctl_dir,
                process: Mutex::new(None),
                starts: Mutex::new(0),
            };
            controller.start_process();
            controllers.push(controller);
        }
        let engines = (0..ENGINE_PATHS).map(|_| Paths::new(west.port())).collect();
        let through = |paths: &Paths, name: String| {
            let kubeconfig = dir.join(format!("{name}.kubeconfig"));
            let text = std::fs::read_to_string(west.kubeconfig_path()).unwrap();
            std::fs::write(
                &kubeconfig,
                text.replace(
                    west.url(),
                    &format!("https://127.0.0.1:{}", paths.api.port()),
                ),
            )
            .unwrap();
            kubeconfig
        };
        let clis = (0..CLI_SLOTS)
            .map(|slot| {
                let paths = Paths::new(west.port());
                let kubeconfig = through(&paths, format!("cli-{slot}"));
                let guard_paths = Paths::new(west.port());
                let guard_kubeconfig = through(&guard_paths, format!("cli-{slot}-guard"));
                CliSlot {
                    paths,
                    kubeconfig,
                    guard_paths,
                    guard_kubeconfig,
                    running: Mutex::new(Vec::new()),
                    holders: Mutex::new(Vec::new()),
                    stopped: Mutex::new(Vec::new()),
                }
            })
            .collect();
        let west_kubeconfig = west.kubeconfig_path().to_path_buf();
        eprintln!(
            "[chaos] world ready; logs and history under {}",
            dir.display()
        );
        // The kubelet's part: restart controllers that exit on their own.
        std::thread::spawn(|| {
            loop {
                std::thread::sleep(Duration::from_millis(500));
                if let Some(w) = WORLD.get() {
                    for c in &w.controllers {
                        if c.restart_if_exited() {
                            w.crash_restarts.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            }
        });
        World {
            east,
            west: Mutex::new(west),
            west_kubeconfig,
            moto: OnceLock::new(),
            zookeeper: OnceLock::new(),
            controllers,
            engines,
            clis,
            secret_values,
            dir,
            crash_restarts: AtomicU64::new(0),
        }
    }

    /// Sends `sig` to the west API server (e.g. SIGSTOP / SIGCONT).
    pub fn signal_west_apiserver(&self, sig: i32) {
        self.west.lock().unwrap().apiserver().signal(sig);
    }

    /// Kills the west API server and starts it again (blocks until it is ready).
    pub fn restart_west_apiserver(&self) {
        // On a plain thread: the readiness probe runs a tokio runtime of its own.
        std::thread::scope(|s| {
            s.spawn(|| self.west.lock().unwrap().restart_apiserver())
                .join()
                .unwrap()
        });
    }

    fn kubeconfig(&self, plane: usize) -> &Path {
        if plane == 0 {
            self.east.kubeconfig_path()
        } else {
            &self.west_kubeconfig
        }
    }

    pub fn moto(&self) -> &Moto {
        self.moto.get_or_init(Moto::start)
    }

    pub fn zookeeper(&self) -> &ZooKeeper {
        self.zookeeper.get_or_init(ZooKeeper::start_ensemble)
    }

    /// Every contender's paths back to `Pass`, every controller running.
    pub fn heal(&self) {
        for c in &self.clis {
            c.continue_holders();
        }
        for c in &self.controllers {
            c.paths.heal();
            c.ensure_running();
        }
        for e in self
            .engines
            .iter()
            .chain(self.clis.iter().flat_map(|c| [&c.paths, &c.guard_paths]))
        {
            e.heal();
        }
    }

    /// A kube client to `plane`, direct (not through any proxy), with timeouts.
    pub async fn direct_client(&self, plane: usize) -> kube::Client {
        crate::support::kube::client_from_kubeconfig(self.kubeconfig(plane)).await
    }

    /// A kube client to the west API server through an engine slot's proxy, with
    /// short timeouts so a partition fails requests instead of hanging them.
    pub async fn engine_kube_client(&self, slot: usize) -> kube::Client {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.west_kubeconfig).unwrap();
        let mut config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .unwrap();
        config.cluster_url = format!("https://127.0.0.1:{}", self.engines[slot].api.port())
            .parse()
            .unwrap();
        config.connect_timeout = Some(Duration::from_secs(1));
        config.read_timeout = Some(Duration::from_secs(2));
        config.write_timeout = Some(Duration::from_secs(2));
        kube::Client::try_from(config).unwrap()
    }
}

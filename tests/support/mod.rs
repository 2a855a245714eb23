//! Test support: real servers on free loopback ports, started by the test binary.
//!
//! Every integration test binary and the benchmarks use this crate
//! (`use lockwarden_testsupport as support;`, so their `support::…` and
//! `crate::support::…` paths name it); it is compiled once, not into each of them.
//! Servers are real processes (kube-apiserver + etcd, moto, ZooKeeper, versitygw,
//! dynalite, PostgreSQL, a node) installed by
//! `scripts/testenv`; a test whose server is missing fails with a message naming that
//! script — it never passes by skipping.
//!
//! Heavy servers are started once per test binary (see each module's `shared()`), and
//! every test uses its own keys / namespaces. Child processes are spawned from one
//! long-lived thread with `PR_SET_PDEATHSIG`, so they die with the test binary even
//! when they live in a `static` that is never dropped.
//!
//! That reaches only direct children. Every server's data and cwd are under the run's
//! [`work_dir`], so a **guard process**, started with the run's directory (in a session
//! of its own, so nothing aimed at the test binary's group reaches it), watches the
//! test binary's PID and, once it has exited — normally, after a failed test, or
//! killed by SIGKILL — kills every process whose cwd or arguments are under that
//! directory: grandchildren such as ZooKeeper's JVM, and servers that scripts started
//! in sessions of their own (`scripts/dev`'s `setsid`, under `scripts/demo`).
//! `scripts/test` checks at its end that no process under `tmp/servers` outlived it.
pub mod cli;
pub mod dynalite;
pub mod keys;
pub mod kube;
pub mod kubectl;
pub mod kueue;
pub mod locks;
pub mod moto;
pub mod node;
pub mod once;
pub mod overlap;
pub mod postgres;
pub mod proxy;
pub mod register;
pub mod stores;
pub mod timescale;
pub mod tofu;
pub mod trials;
pub mod versitygw;
pub mod workloads;
pub mod zookeeper;

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// The environment `scripts/testenv env` prints, read once per test binary.
fn testenv() -> &'static HashMap<String, String> {
    static ENV: OnceLock<HashMap<String, String>> = OnceLock::new();
    ENV.get_or_init(|| {
        let script = repo_root().join("scripts/testenv");
        let out = Command::new(&script)
            .arg("env")
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    })
}

/// Path of an installed test tool: the environment variable `name` if set, else the
/// path `scripts/testenv env` gives. Panics (fails the test) if it does not exist.
pub fn tool(name: &str) -> PathBuf {
    let path = std::env::var(name)
        .ok()
        .or_else(|| testenv().get(name).cloned())
        .unwrap_or_default();
    let path = PathBuf::from(path);
    assert!(
        !path.as_os_str().is_empty() && path.exists(),
        "test server {name} is not installed (looked for {:?}); run `scripts/testenv` first",
        path
    );
    path
}

/// The repository's root: the checkout the running test binary belongs to.
///
/// Taken at run time from `CARGO_MANIFEST_DIR` (cargo and `scripts/run-tests` set it to
/// the package under test), not from this crate's compile-time path: cargo does not
/// rebuild a path dependency when the checkout moves, so a second clone sharing the
/// cached target directory would otherwise read the charts and scripts of whichever
/// clone built this crate first (or of one since deleted).
pub fn repo_root() -> PathBuf {
    let is_root = |dir: &Path| dir.join("tests/support/Cargo.toml").is_file();
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .and_then(|dir| dir.ancestors().find(|d| is_root(d)).map(Path::to_path_buf))
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .ancestors()
                .nth(2)
                .expect("tests/support is two levels below the repository's root")
                .to_path_buf()
        })
}

/// The profile's directory Cargo built the running test binary (or benchmark) into:
/// it runs as `<target>/<profile>/deps/<name>-<hash>`. What Cargo gives an
/// integration test at compile time (`CARGO_BIN_EXE_*`, `CARGO_TARGET_TMPDIR`), a
/// library it depends on has to find from there.
pub(crate) fn profile_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("the running test binary's path");
        let deps = exe
            .parent()
            .filter(|d| d.file_name() == Some("deps".as_ref()));
        deps.and_then(Path::parent)
            .unwrap_or_else(|| {
                panic!(
                    "{} is not a test binary Cargo built (<target>/<profile>/deps/…)",
                    exe.display()
                )
            })
            .to_path_buf()
    })
}

/// The target directory of this run's build (`CARGO_TARGET_DIR`, whatever named it).
pub fn target_dir() -> &'static Path {
    profile_dir().parent().expect("<target>/<profile>")
}

/// Where test processes claim ports ([`free_port`]): one file per port, locked
/// (`flock`) by the claiming process for as long as it lives. Machine-wide, not per
/// target directory: two suites on one machine share its ports.
const PORT_CLAIMS: &str = "lockwarden-test-ports";
/// The range [`free_port`] draws from: below Linux's ephemeral range (32768–60999 by
/// default), where `bind(0)` listeners and the local ends of outgoing connections
/// take their ports, so neither can take a claimed port between its claim and the
/// server's bind.
const CLAIMED_PORTS: std::ops::Range<u16> = 15000..32000;

/// A free TCP port on 127.0.0.1 for a server this test binary starts, unique across
/// every process on the machine: test binaries run side by side (`scripts/test`), and
/// a port merely bound and released can be handed to another process before the
/// server binds it, whose readiness probe is then answered by the wrong server. The
/// port is claimed by an exclusive `flock` on `$TMPDIR/lockwarden-test-ports/PORT`,
/// held until this process exits (the kernel releases it even after SIGKILL; the
/// servers it started die with it), and checked free by a bind.
pub fn free_port() -> u16 {
    use rand::Rng;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    static CLAIMS: Mutex<Vec<File>> = Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join(PORT_CLAIMS);
    if std::fs::create_dir(&dir).is_ok() {
        // Shared by every user's runs (root's suite, an unprivileged quick run).
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777));
    }
    let mut claims = CLAIMS.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = rand::rng();
    for _ in 0..10_000 {
        let port = rng.random_range(CLAIMED_PORTS);
        let Ok(file) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(dir.join(port.to_string()))
            .or_else(|_| std::fs::File::open(dir.join(port.to_string())))
        else {
            continue;
        };
        // SAFETY: flock(2) on a file descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            continue; // another process (or this one) holds it
        }
        if TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue; // something outside the claims listens there
        }
        claims.push(file);
        return port;
    }
    panic!(
        "no free port in {CLAIMED_PORTS:?} on 127.0.0.1 after 10,000 tries (claims in {})",
        dir.display()
    );
}

/// What a successful `scripts/demo` run printed, and its dev directory.
pub struct DemoRun {
    pub stdout: String,
    pub stderr: String,
    /// `LOCKWARDEN_DEV`: the servers' state and logs.
    pub dev: PathBuf,
}

/// How long `scripts/demo` may take before [`run_demo`] stops it: many times what it
/// takes here (a minute or two; the node's, with its image, a few), so that only a hang
/// reaches it.
const DEMO_DEADLINE: Duration = Duration::from_secs(20 * 60);

/// `scripts/demo ARGS` with the lockwarden `binary` under test and a dev directory of
/// its own (named after `name`); fails the test unless it exits successfully within
/// [`DEMO_DEADLINE`]. Its output goes to files in the dev directory (not pipes: a server
/// it leaves behind holding a pipe would keep the test waiting for the pipe's end), and
/// a demo that runs past the deadline is stopped (its session: it runs in one of its
/// own) and fails the test with what it printed so far.
pub fn run_demo(name: &str, args: &[&str], binary: &str) -> DemoRun {
    let dev = work_dir(&unique(name));
    let (out_path, err_path) = (dev.join("demo.stdout"), dev.join("demo.stderr"));
    let mut cmd = Command::new(repo_root().join("scripts/demo"));
    cmd.args(args)
        .env("LOCKWARDEN_BIN", binary)
        .env("LOCKWARDEN_DEV", &dev)
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).expect("create the demo's stdout file"))
        .stderr(File::create(&err_path).expect("create the demo's stderr file"));
    // SAFETY: setsid(2) only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("run scripts/demo");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for scripts/demo") {
            break Some(status);
        }
        if started.elapsed() > DEMO_DEADLINE {
            // SIGTERM to its session runs the demo's traps (they stop what it started).
            unsafe { libc::kill(-(child.id() as i32), libc::SIGTERM) };
            let stopping = Instant::now();
            while child.try_wait().ok().flatten().is_none()
                && stopping.elapsed() < Duration::from_secs(60)
            {
                std::thread::sleep(Duration::from_millis(200));
            }
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    match status {
        Some(status) => assert!(
            status.success(),
            "scripts/demo {} failed ({status}):\n{stdout}\n{stderr}",
            args.join(" "),
        ),
        None => panic!(
            "scripts/demo {} still ran after {DEMO_DEADLINE:?}: stopped. What it printed:\n{stdout}\n{stderr}",
            args.join(" "),
        ),
    }
    DemoRun {
        stdout,
        stderr,
        dev,
    }
}

/// Where server logs and data go; kept after the run so a failing test can be read.
/// The first call also starts the run's guard process ([`start_guard`]).
pub fn work_dir(name: &str) -> PathBuf {
    let dir = run_dir().join(name);
    std::fs::create_dir_all(&dir).expect("create server work dir");
    dir
}

/// This test binary's directory under `<target>/tmp/servers` (Cargo's
/// `CARGO_TARGET_TMPDIR`), guarded.
pub fn run_dir() -> &'static Path {
    static RUN: OnceLock<PathBuf> = OnceLock::new();
    RUN.get_or_init(|| {
        let base = target_dir().join("tmp/servers");
        let dir = base.join(format!("{}-{}", std::process::id(), unique_suffix()));
        std::fs::create_dir_all(&dir).expect("create server work dir");
        start_guard(&dir);
        dir
    })
}

/// The guard's script: waits for the test binary (`$1`) to be gone (or a zombie), then
/// kills every process but itself whose cwd or command line is under `$2`, and again
/// a moment later for any that was starting meanwhile.
const GUARD: &str = r#"
parent=$1 run=$2
alive() { [ -d "/proc/$parent" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$parent/status" 2>/dev/null; }
while alive; do sleep 0.5; done
for round in 1 2; do
  for proc in /proc/[0-9]*; do
    pid=${proc#/proc/}
    [ "$pid" = "$$" ] && continue
    cwd=$(readlink "$proc/cwd" 2>/dev/null) || continue
    args=$(tr '\0' ' ' < "$proc/cmdline" 2>/dev/null)
    case "$cwd/ $args" in
      *"$run/"*) kill -KILL "$pid" 2>/dev/null && echo "guard: killed $pid ($args)" ;;
    esac
  done
  sleep 1
done
"#;

/// Starts the guard of `run` (see the module documentation). Its log is `guard.log`.
fn start_guard(run: &Path) {
    let log = File::create(run.join("guard.log")).expect("create guard log");
    let mut cmd = Command::new("sh");
    cmd.args(["-c", GUARD, "lockwarden-test-guard"])
        .arg(std::process::id().to_string())
        .arg(run)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("dup guard log"))
        .stderr(log)
        // Not inside the run directory: it must not match itself by its cwd.
        .current_dir("/");
    unsafe {
        cmd.pre_exec(|| {
            // A session of its own: outlives the test binary, and a signal to the test
            // binary's process group does not reach it.
            libc::setsid();
            Ok(())
        });
    }
    let guard = cmd.spawn().expect("start the test servers' guard process");
    eprintln!("[support] guard of {} is pid {}", run.display(), guard.id());
    // Not waited for: it exits after the test binary; init reaps it.
    std::mem::forget(guard);
}
/// A short random string for per-test keys, namespaces and paths.
pub fn unique_suffix() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..10].to_string()
}

/// A unique name with a readable prefix, e.g. `unique("canary")` -> `canary-3f9a0c1b2d`.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", unique_suffix())
}

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `cmd` from a thread that lives as long as the test binary, so that
/// PR_SET_PDEATHSIG (which fires when the *spawning thread* exits) only fires when
/// the whole binary exits.
fn spawn_from_keeper(cmd: Command) -> io::Result<Child> {
    static KEEPER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let keeper = KEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("server-keeper".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawn keeper thread");
        Mutex::new(tx)
    });
    let (tx, rx) = mpsc::channel();
    keeper
        .lock()
        .unwrap()
        .send((cmd, tx))
        .expect("keeper thread alive");
    rx.recv().expect("keeper thread alive")
}

/// A running server process. Killed (with its process group) on drop; its combined
/// stdout/stderr stays in `log`.
/// The process slot of a server that can be stopped and started again on its port.
/// Claims the empty slot for a new start and numbers it (each start logs to a file of
/// its own); panics if a process is still running there.
pub fn claim_slot<'a>(
    slot: &'a Mutex<Option<ServerProcess>>,
    starts: &AtomicU32,
    what: &str,
) -> (MutexGuard<'a, Option<ServerProcess>>, u32) {
    let guard = slot.lock().unwrap();
    assert!(guard.is_none(), "{what} is already running");
    (guard, starts.fetch_add(1, Ordering::Relaxed) + 1)
}

/// Whether a process in `slot` runs (it may have exited on its own).
pub fn slot_is_running(slot: &Mutex<Option<ServerProcess>>) -> bool {
    slot.lock()
        .unwrap()
        .as_mut()
        .is_some_and(|s| s.is_running())
}

/// The log tail of the process in `slot`, if one runs (for failure messages).
pub fn slot_log_tail(slot: &Mutex<Option<ServerProcess>>, lines: usize) -> String {
    slot.lock()
        .unwrap()
        .as_ref()
        .map(|s| s.log_tail(lines))
        .unwrap_or_default()
}

pub struct ServerProcess {
    pub name: String,
    pub log: PathBuf,
    child: Child,
    /// The server's exit was collected: its PID (and so its process group's ID) may
    /// already belong to another process, which a group signal must never reach.
    reaped: bool,
}

impl ServerProcess {
    /// Starts `program args…` with output to `<work_dir>/<name>.log`.
    pub fn start(name: &str, mut cmd: Command, dir: &Path) -> ServerProcess {
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log).expect("create server log");
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup log"))
            .stderr(out)
            .current_dir(dir);
        unsafe {
            cmd.pre_exec(|| {
                // Own process group (so kill reaches grandchildren such as java), and die
                // with the test binary.
                libc::setpgid(0, 0);
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let program = cmd.get_program().to_owned();
        let child = spawn_from_keeper(cmd)
            .unwrap_or_else(|e| panic!("cannot start {name} ({program:?}): {e}"));
        eprintln!(
            "[support] started {name} (pid {}), log: {}",
            child.id(),
            log.display()
        );
        ServerProcess {
            name: name.to_string(),
            log,
            child,
            reaped: false,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal to the server's process group (e.g. SIGSTOP / SIGCONT); nothing
    /// once its exit was collected.
    pub fn signal(&self, sig: i32) {
        if self.reaped {
            return;
        }
        unsafe {
            libc::kill(-(self.child.id() as i32), sig);
        }
    }

    /// Whether the process is still running. Looks without collecting its exit
    /// (`WNOWAIT`): until [`ServerProcess::kill`] does, the exited server stays a
    /// zombie that keeps its PID, so the group signal there cannot reach a process
    /// that reused it (each server leads a group of its own).
    pub fn is_running(&mut self) -> bool {
        if self.reaped {
            return false;
        }
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let looked = unsafe {
            libc::waitid(
                libc::P_PID,
                self.child.id(),
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        looked == 0 && unsafe { info.si_pid() } == 0
    }

    /// The last `lines` lines of the server's log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Kills the server (and what it started in its group) and collects its exit;
    /// again, once it has, does nothing.
    pub fn kill(&mut self) {
        if self.reaped {
            return;
        }
        self.signal(libc::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.reaped = true;
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits until `addr` accepts TCP connections, failing with the server's log tail.
pub fn wait_for_port(server: &mut ServerProcess, port: u16, timeout: Duration) {
    wait_until(
        server,
        timeout,
        &format!("port {port} to accept connections"),
        || TcpStream::connect(("127.0.0.1", port)).is_ok(),
    );
}

/// Whether something on `port` answers `GET path` with an HTTP status line (any
/// status: an S3 server refuses the unsigned request, and that is an answer).
pub fn http_answers(port: u16, path: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(10)));
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.")
}

/// Polls `ready` every 50 ms until it holds; panics with the log tail if the server
/// exits or `timeout` passes first.
pub fn wait_until(
    server: &mut ServerProcess,
    timeout: Duration,
    what: &str,
    mut ready: impl FnMut() -> bool,
) {
    let deadline = Instant::now() + timeout;
    loop {
        if ready() {
            return;
        }
        if !server.is_running() {
            panic!(
                "{} exited while waiting for {what}; log {}:\n{}",
                server.name,
                server.log.display(),
                server.log_tail(40)
            );
        }
        if Instant::now() > deadline {
            panic!(
                "{} not ready after {timeout:?} waiting for {what}; log {}:\n{}",
                server.name,
                server.log.display(),
                server.log_tail(40)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Async polling with a generous deadline: waits until `check` returns `Some`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

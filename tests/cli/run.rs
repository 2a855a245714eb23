//! `run`: the command runs only while the lock is held, is terminated when the lock is
//! stolen, and gets SIGTERM passed on.

use super::*;
use support::proxy::{Mode, Proxy};

/// A lock stolen with `lock --force` by another process: `run` terminates its command
/// (SIGTERM) and exits 4; the thief's lock is left alone.
async fn stolen_while_running(lw: &Cli, url: &str, lease: &str, grace: &str) {
    // The command records its pid, then waits; on SIGTERM it records that and exits.
    let script = "trap 'echo terminated > term.txt; exit 143' TERM; \
                  echo \"$LOCKWARDEN_FENCE\" > started.txt; \
                  while true; do sleep 0.1; done";
    let runner = lw.spawn(&[
        "run", url, "--lease", lease, "--holder", "runner", "--grace", grace, "--", "sh", "-c",
        script,
    ]);
    let started = lw.path("started.txt");
    let run_fence: u64 = eventually("the command under `run` to start", || async {
        std::fs::read_to_string(&started)
            .ok()
            .and_then(|s| s.trim().parse().ok())
    })
    .await;

    let out = lw
        .run(&[
            "lock",
            url,
            "--force",
            "-o",
            "thief.lock",
            "--holder",
            "thief",
        ])
        .await;
    out.ok();
    assert!(
        out.stderr.contains(&format!(
            "took the lock over from runner (fence {run_fence})"
        )),
        "{out:#?}"
    );
    let thief = lw.read_json("thief.lock");
    assert!(fence(&thief) > run_fence);

    let stolen_at = Instant::now();
    let out = finish(runner, String::new()).await;
    println!(
        "{url}: run noticed the takeover and exited {:.2?} after it",
        stolen_at.elapsed()
    );
    out.code(4)
        .one_line_error(&[url, "lock lost", "thief", "SIGTERM"]);
    assert_eq!(
        std::fs::read_to_string(lw.path("term.txt")).unwrap_or_default(),
        "terminated\n",
        "the command got SIGTERM"
    );
    // The thief still holds it: `run` did not release someone else's lock.
    let status = lw.status(url).await;
    assert_eq!(status["state"], "held", "{status}");
    assert_eq!(status["holder"], "thief", "{status}");
    assert_eq!(fence(&status), fence(&thief));
    lw.unlock("thief.lock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_run_exits_4_and_terminates_its_command_when_the_lock_is_stolen() {
    let bucket = Moto::shared().new_bucket("cli-steal").await;
    let lw = Cli::aws();
    // A 3 s lease leaves at most 440 ms of grace before the holder deadline.
    stolen_while_running(&lw, &format!("s3://{bucket}/stolen"), "3s", "400ms").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_run_exits_4_and_terminates_its_command_when_the_lock_is_stolen() {
    let lw = Cli::new();
    let url = zk_url("steal");
    // The lease is the 10 s session timeout: at most 3.216 s of grace.
    stolen_while_running(&lw, &url, "10s", "3s").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_passes_sigterm_to_its_command_and_releases() {
    let bucket = Moto::shared().new_bucket("cli-sigterm").await;
    let lw = Cli::aws();
    let url = format!("s3://{bucket}/terminated");
    let script = "trap 'echo terminated > term.txt; exit 143' TERM; \
                  echo started > started.txt; while true; do sleep 0.1; done";
    let runner = lw.spawn(&["run", &url, "--", "sh", "-c", script]);
    let pid = runner.id().expect("run's pid");
    let started = lw.path("started.txt");
    eventually("the command under `run` to start", || async {
        started.exists().then_some(())
    })
    .await;
    // SAFETY: kill(2) on a child of this test.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    let out = finish(runner, String::new()).await;
    out.code(143);
    assert_eq!(
        std::fs::read_to_string(lw.path("term.txt")).unwrap_or_default(),
        "terminated\n"
    );
    assert_eq!(lw.status(&url).await["state"], "released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_of_a_held_lock_exits_3_without_running_the_command() {
    let plane = ControlPlane::shared();
    let namespace = plane.namespace(&plane.client().await, "cli-held").await;
    let lw = Cli::kube();
    let url = format!("k8s://{namespace}/busy");
    lw.run(&["lock", &url, "-o", "a.lock"]).await.ok();
    let out = lw
        .run(&["run", &url, "--", "sh", "-c", "touch ran.txt"])
        .await;
    out.code(3).one_line_error(&[&url, "lock already held by"]);
    assert!(!lw.path("ran.txt").exists(), "the command must not run");
    // A command that cannot be found: 127, and the lock is given back.
    lw.unlock("a.lock").await;
    let out = lw.run(&["run", &url, "--", "/nonexistent/command"]).await;
    out.code(127)
        .one_line_error(&[&url, "/nonexistent/command"]);
    assert_eq!(lw.status(&url).await["state"], "released");
}

// Seconds of CLOCK_MONOTONIC, the clock `run` logs its holder deadline on and the
// register stamps with.
pub(super) use support::register::monotonic_now;

/// What the guarded resource saw (support::register: each line stamped with its
/// kernel arrival on CLOCK_MONOTONIC).
pub(super) use support::register::Register;

/// Waits until each of `writers` has written once to `register`.
pub(super) async fn wait_for_writes(register: &Register, writers: &Writers, what: &str) {
    eventually(what, || async {
        let seen = register.writers();
        writers
            .names()
            .iter()
            .all(|name| seen.contains(*name))
            .then_some(())
    })
    .await;
}

/// Waits until `n` writers' connections to `register` have closed: none of them runs
/// any more.
pub(super) async fn wait_for_closed(register: &Register, n: usize, what: &str) {
    eventually(what, || async { (register.closed() >= n).then_some(()) }).await;
}

/// A writer, `bash -c "$WRITER" _ NAME`: ignores SIGTERM, connects to the register
/// and writes `NAME N` every 50 ms, forever.
pub(super) const WRITER: &str = "trap '' TERM; exec 3<>/dev/tcp/127.0.0.1/$REGISTER || exit 70; \
                      i=0; while :; do i=$((i+1)); echo \"$1 $i\" >&3 || exit 71; sleep 0.05; done";

/// `text` without terminal colour sequences (`ESC [ … m`).
pub(super) fn without_colours(text: &str) -> String {
    let mut plain = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

/// The value of the first `deadline_monotonic=SECONDS` in `log` (colour codes
/// removed), or of the last: a holder deadline on CLOCK_MONOTONIC, as `run` and
/// `guard` log it.
pub(super) fn logged_deadline(log: &str, last: bool) -> Option<f64> {
    let mut each = log.split("deadline_monotonic=").skip(1);
    let rest = if last { each.last() } else { each.next() }?;
    rest.split_whitespace().next()?.parse().ok()
}

/// A logged deadline is not trusted blindly: the last read showing the holder's
/// revision was sent before the store was cut at `cut`, so the deadline is at most
/// the cut plus the lease's holder validity.
pub(super) fn assert_deadline_within_validity(deadline: f64, cut: f64, lease: Duration) {
    let validity = lockwarden::lock::SafetyMargins::default().holder_validity(lease);
    assert!(
        deadline <= cut + validity.as_secs_f64(),
        "the logged deadline {deadline} is after the cut {cut} plus {validity:?}"
    );
}

/// No write of `writes` arrived after `limit`; `what` names them and the limit.
pub(super) fn assert_none_after(writes: &[(f64, String)], limit: f64, what: &str) {
    let late: Vec<_> = writes.iter().filter(|(t, _)| *t > limit).collect();
    assert!(late.is_empty(), "{} {what}: {late:?}", late.len());
}

/// Spawns `cmd`, lockwarden `what` (`run` or `guard`) over `writers`, logging its
/// deadline, with the writers pointed at the register on `port`; returns it once each
/// writer has written.
pub(super) async fn spawn_writing(
    what: &str,
    cmd: &mut tokio::process::Command,
    port: u16,
    register: &Register,
    writers: &Writers,
) -> Child {
    let child = cmd
        .env("LOCKWARDEN_LOG", "lockwarden=info")
        .env("REGISTER", port.to_string())
        .env("WRITER", WRITER)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn lockwarden {what}: {e}"));
    let waiting = format!("every writer under {what} to write");
    wait_for_writes(register, writers, &waiting).await;
    child
}

/// Commands whose writers must all be gone by the holder deadline (rule 7).
pub(super) enum Writers {
    /// COMMAND itself ignores SIGTERM and keeps writing.
    IgnoringSigterm,
    /// COMMAND, a shell that dies of SIGTERM, waits for two writers that ignore it: one
    /// in the background (`… &`, same process group) and one double-forked into a
    /// session of its own (`setsid`, its parent gone at once: an orphan, re-parented).
    InTheBackground,
}

impl Writers {
    pub(super) fn script(&self) -> &'static str {
        match self {
            Writers::IgnoringSigterm => "exec bash -c \"$WRITER\" _ main",
            Writers::InTheBackground => {
                "bash -c \"$WRITER\" _ background >/dev/null 2>&1 & \
                 ( setsid bash -c \"$WRITER\" _ setsid >/dev/null 2>&1 & ); wait"
            }
        }
    }

    pub(super) fn names(&self) -> &'static [&'static str] {
        match self {
            Writers::IgnoringSigterm => &["main"],
            Writers::InTheBackground => &["background", "setsid"],
        }
    }
}

/// `run` holds `url` while `writers` write to a loopback register; the store behind
/// `proxy` is then cut off, so renewals stop and `run`'s holder deadline comes. Every
/// write must arrive before that deadline (which `run` logs on CLOCK_MONOTONIC), and
/// the deadline is no later than the cut plus the holder validity of the lease (so
/// the logged figure is not trusted blindly). Returns the margins: the deadline minus
/// the last write.
async fn writes_end_by_the_holder_deadline(
    lw: &Cli,
    url: &str,
    flags: &[&str],
    lease: Duration,
    proxy: &Proxy,
    writers: Writers,
) -> f64 {
    let (port, register) = Register::serve().await;
    // One grace for both stores: within the bound of the 3 s lease on S3 (440 ms), and
    // so of the longer one on ZooKeeper.
    let grace = "400ms";
    let mut args = vec!["run", url, "--grace", grace, "--holder", "writer"];
    args.extend(flags);
    args.extend(["--", "bash", "-c", writers.script()]);
    let mut cmd = lw.command(&args);
    let runner = spawn_writing("run", &mut cmd, port, &register, &writers).await;
    // Two renewals' worth of holding, then the store is cut off.
    tokio::time::sleep(lease / 2).await;
    let cut = monotonic_now();
    proxy.set_mode(Mode::Blackhole);
    // Past the deadline, let `run`'s release through (or find the lock gone).
    tokio::time::sleep(lease + Duration::from_secs(1)).await;
    proxy.set_mode(Mode::Pass);
    let out = finish(runner, String::new()).await;
    out.code(4);
    assert!(out.stderr.contains("lock lost"), "{out:#?}");
    let deadline = logged_deadline(&without_colours(&out.stderr), false)
        .unwrap_or_else(|| panic!("run logged no holder deadline: {out:#?}"));
    assert_deadline_within_validity(deadline, cut, lease);
    // Every writer's connection closes: none is left running.
    let n = writers.names().len();
    wait_for_closed(&register, n, "every writer to be gone").await;
    let writes = register.writes();
    let (last, line) = writes
        .iter()
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .cloned()
        .expect("writes");
    let after = format!("writes after the holder deadline {deadline}");
    assert_none_after(&writes, deadline, &after);
    println!(
        "{url}: {} writes, the last ({line:?}) {:.0} ms before the holder deadline; \
         the store was cut {:.0} ms before it",
        writes.len(),
        (deadline - last) * 1e3,
        (deadline - cut) * 1e3
    );
    deadline - last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule7_run_stops_a_command_that_ignores_sigterm_or_backgrounds_a_writer_by_the_holder_deadline_on_s3()
 {
    let moto = tokio::task::spawn_blocking(Moto::shared).await.unwrap();
    let bucket = moto.new_bucket("cli-rule7").await;
    for writers in [Writers::IgnoringSigterm, Writers::InTheBackground] {
        let proxy = Proxy::start(moto.port());
        let endpoint = proxy.endpoint();
        let lw = Cli::aws();
        let url = format!("s3://{bucket}/{}", unique("rule7"));
        let flags = ["--endpoint", &endpoint, "--lease", "3s"];
        let lease = Duration::from_secs(3);
        writes_end_by_the_holder_deadline(&lw, &url, &flags, lease, &proxy, writers).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule7_run_stops_a_command_that_ignores_sigterm_or_backgrounds_a_writer_by_the_holder_deadline_on_zookeeper()
 {
    let zk = tokio::task::spawn_blocking(ZooKeeper::shared)
        .await
        .unwrap();
    for writers in [Writers::IgnoringSigterm, Writers::InTheBackground] {
        let proxy = Proxy::start(zk.nodes()[0].port());
        let url = format!(
            "zk://{}/lockwarden-cli/{}",
            proxy.address(),
            unique("rule7")
        );
        let lw = Cli::new();
        let flags = ["--session-timeout", "4s"];
        let lease = Duration::from_secs(4);
        writes_end_by_the_holder_deadline(&lw, &url, &flags, lease, &proxy, writers).await;
    }
}

/// COMMAND backgrounds a writer that ignores SIGTERM, in a session of its own, and
/// exits: the writer is still work under the lock, so `run` stops it before releasing
/// (after --grace), and nothing is written once `run` has exited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule7_run_stops_what_its_command_left_running_before_releasing() {
    let bucket = Moto::shared().new_bucket("cli-rule7-left").await;
    let lw = Cli::aws();
    let url = format!("s3://{bucket}/left");
    let (port, register) = Register::serve().await;
    let script = "( setsid bash -c \"$WRITER\" _ left >/dev/null 2>&1 & ); sleep 0.5";
    let mut cmd = lw.command(&[
        "run", &url, "--lease", "3s", "--grace", "300ms", "--", "bash", "-c", script,
    ]);
    cmd.env("REGISTER", port.to_string()).env("WRITER", WRITER);
    let out = cmd.output().await.expect("run");
    let exited = monotonic_now();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("exited and left") && stderr.contains("SIGKILL"),
        "{stderr}"
    );
    wait_for_closed(&register, 1, "the writer's connection to close").await;
    let writes = register.writes();
    assert!(!writes.is_empty(), "the left-behind writer never wrote");
    assert!(
        writes.iter().all(|(t, _)| *t <= exited),
        "writes after run exited: {writes:?} (exited at {exited})"
    );
    assert_eq!(lw.status(&url).await["state"], "released");
}

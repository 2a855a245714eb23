//! `guard`: the node-side stop (docs/design.md §3 rule 9). A `lockwarden run` keeper
//! holds the lock through one fault proxy; the guard reads the record through another
//! and stops its command's whole tree by the deadline it derives from its own reads.
//! S3 (moto) and Kubernetes Leases (kube-apiserver; there the store *is* the API
//! server, so "the holder cut off" is the controller's situation when it is partitioned).

use super::run::{
    Register, Writers, assert_deadline_within_validity, assert_none_after, logged_deadline,
    monotonic_now, spawn_writing, wait_for_closed, without_colours,
};
use super::*;
use support::proxy::{Mode, Proxy};

/// The keeper's lease: long enough that a 300 ms grace fits the guard's bound, and that
/// the keeper rides out the shared moto's stalls on a loaded machine. At 4 s a keeper
/// once lost its lock to them and released it before the guard's first read ("not held
/// with this nonce (released)"): its renewals come every third of the lease, and a
/// stall of under 3 s between two of them passed its holder deadline.
const LEASE: Duration = Duration::from_secs(8);

/// A holder that renews: `run` through `proxy`, whose command records the nonce and
/// fence the guard needs (what the controller puts in the Pod's annotations).
async fn keeper(lw: &Cli, url: &str, path: &StorePath) -> (Child, String, String) {
    keeper_writing(lw, url, path, "held.txt").await
}

/// [`keeper`], recording the nonce and fence in `file` (one per keeper of a test).
async fn keeper_writing(
    lw: &Cli,
    url: &str,
    path: &StorePath,
    file: &str,
) -> (Child, String, String) {
    let script = format!("echo \"$LOCKWARDEN_NONCE $LOCKWARDEN_FENCE\" > {file}; exec sleep 600");
    let lease = format!("{}s", LEASE.as_secs());
    let mut args = vec!["run", url, "--lease", &lease, "--holder", "keeper"];
    args.extend(path.flags());
    args.extend(["--", "sh", "-c", &script]);
    let holder = path
        .apply(&mut lw.command(&args))
        .spawn()
        .expect("spawn the keeper");
    let held = lw.path(file);
    let (nonce, fence) = eventually("the keeper to hold the lock", || async {
        let text = std::fs::read_to_string(&held).ok()?;
        let (nonce, fence) = text.trim().split_once(' ')?;
        Some((nonce.to_string(), fence.to_string()))
    })
    .await;
    (holder, nonce, fence)
}

/// The lock's store.
#[derive(Clone, Copy, Debug)]
enum Store {
    S3,
    Lease,
}

/// One process's way to the store, through its own fault proxy: S3 by `--endpoint`,
/// the API server by a kubeconfig naming the proxy (the serving certificate names
/// 127.0.0.1, whatever the port).
struct StorePath {
    proxy: Proxy,
    flags: Vec<String>,
    kubeconfig: Option<std::path::PathBuf>,
}

impl StorePath {
    fn new(store: Store, dir: &std::path::Path, name: &str) -> StorePath {
        match store {
            Store::S3 => {
                let proxy = Proxy::start(Moto::shared().port());
                let flags = vec!["--endpoint".to_string(), proxy.endpoint()];
                StorePath {
                    proxy,
                    flags,
                    kubeconfig: None,
                }
            }
            Store::Lease => {
                let plane = ControlPlane::shared();
                let proxy = Proxy::start(plane.port());
                let admin = std::fs::read_to_string(plane.kubeconfig_path()).unwrap();
                let direct = format!("127.0.0.1:{}", plane.port());
                assert!(admin.contains(&direct), "{admin}");
                let path = dir.join(format!("{name}.kubeconfig"));
                let through = proxy.address();
                std::fs::write(&path, admin.replace(&direct, &through)).unwrap();
                StorePath {
                    proxy,
                    flags: Vec::new(),
                    kubeconfig: Some(path),
                }
            }
        }
    }

    fn flags(&self) -> impl Iterator<Item = &str> {
        self.flags.iter().map(String::as_str)
    }

    fn apply<'a>(&self, cmd: &'a mut tokio::process::Command) -> &'a mut tokio::process::Command {
        if let Some(kubeconfig) = &self.kubeconfig {
            cmd.env("KUBECONFIG", kubeconfig);
        }
        cmd
    }
}

/// A fresh lock URL on `store`, and the CLI that reaches it directly.
async fn fresh_lock(store: Store) -> (Cli, String) {
    match store {
        Store::S3 => {
            let moto = tokio::task::spawn_blocking(Moto::shared).await.unwrap();
            let bucket = moto.new_bucket("cli-guard").await;
            (Cli::aws(), format!("s3://{bucket}/{}", unique("guard")))
        }
        Store::Lease => {
            let plane = tokio::task::spawn_blocking(ControlPlane::shared)
                .await
                .unwrap();
            let namespace = plane.namespace(&plane.client().await, "cli-guard").await;
            (
                Cli::kube(),
                format!("k8s://{namespace}/{}", unique("guard")),
            )
        }
    }
}

/// How the guard runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum As {
    /// A child of the test, as on a terminal.
    Child,
    /// PID 1 of a PID namespace of its own (with its own /proc), as a container's
    /// entrypoint: orphans come to it, and its SIGKILL sweep is `kill(-1)` too.
    Pid1,
}

/// Which side loses the store.
#[derive(Clone, Copy, Debug)]
enum Cut {
    /// The holder: renewals stop, a contender takes over after observing the expiry.
    Holder,
    /// The guard: it can no longer confirm anything, though the holder renews on.
    Guard,
}

/// The guard runs `writers`; the store is then cut off from `cut`'s side. Every write
/// of the guarded processes must reach the register before the guard's deadline (which
/// it logs on CLOCK_MONOTONIC and which is checked against the cut), and, when the
/// holder was cut, before a contender's first write. Returns the margin of the last
/// guarded write before the earliest of those.
async fn guarded_writes_end_in_time(store: Store, cut: Cut, writers: Writers, pid: As) -> f64 {
    let (lw, url) = fresh_lock(store).await;
    let holder_path = StorePath::new(store, lw.dir(), "holder");
    let guard_path = StorePath::new(store, lw.dir(), "guard");
    let (_holder, nonce, fence) = keeper(&lw, &url, &holder_path).await;

    let (port, register) = Register::serve().await;
    let mut args = vec!["guard", "--url", &url, "--grace", "300ms"];
    args.extend(guard_path.flags());
    args.extend(["--", "bash", "-c", writers.script()]);
    let wrapper: &[&str] = match pid {
        As::Child => &[],
        As::Pid1 => &["unshare", "--pid", "--fork", "--mount-proc"],
    };
    let mut cmd = lw.command_under(wrapper, &args);
    guard_path.apply(&mut cmd);
    // The acquisition as the Pod gets it from its annotations: in the environment.
    cmd.env("LOCKWARDEN_NONCE", &nonce)
        .env("LOCKWARDEN_FENCE", &fence);
    let guard = spawn_writing("guard", &mut cmd, port, &register, &writers).await;
    tokio::time::sleep(LEASE / 2).await;
    let cut_at = monotonic_now();
    let contender = match cut {
        Cut::Holder => {
            holder_path.proxy.set_mode(Mode::Blackhole);
            // The next holder, straight to the store: it writes once it has the lock.
            let mut cmd = lw.command(&[
                "run",
                &url,
                "--wait",
                "60",
                "--holder",
                "contender",
                "--",
                "bash",
                "-c",
                "echo contender 1 >/dev/tcp/127.0.0.1/$REGISTER",
            ]);
            cmd.env("REGISTER", port.to_string());
            Some(cmd.spawn().expect("spawn the contender"))
        }
        Cut::Guard => {
            guard_path.proxy.set_mode(Mode::Blackhole);
            None
        }
    };
    let out = finish(guard, String::new()).await;
    out.code(6);
    assert!(
        out.stderr.contains("could not be confirmed") && out.stderr.contains("SIGKILL"),
        "{out:#?}"
    );
    let logged = without_colours(&out.stderr);
    if pid == As::Pid1 {
        assert!(
            logged
                .lines()
                .any(|l| l.ends_with(" pid=1") || l.contains(" pid=1 ")),
            "not PID 1: {out:#?}"
        );
    }
    // The deadline the guard stopped by: the last it logged.
    let deadline = logged_deadline(&logged, true)
        .unwrap_or_else(|| panic!("the guard logged no deadline: {out:#?}"));
    assert_deadline_within_validity(deadline, cut_at, LEASE);
    let n = writers.names().len();
    wait_for_closed(&register, n, "every guarded writer to be gone").await;
    let mut limit = deadline;
    if let Some(contender) = contender {
        let out = finish(contender, String::new()).await;
        out.ok();
        let first: f64 = register
            .writes()
            .iter()
            .filter(|(_, line)| line.starts_with("contender"))
            .map(|(t, _)| *t)
            .next()
            .unwrap_or_else(|| panic!("the contender never wrote: {out:#?}"));
        println!(
            "{url}: the contender's first write {:.0} ms after the guard's deadline",
            (first - deadline) * 1e3
        );
        limit = limit.min(first);
    }
    let guarded: Vec<_> = register
        .writes()
        .into_iter()
        .filter(|(_, line)| !line.starts_with("contender"))
        .collect();
    let last = guarded.iter().map(|(t, _)| *t).fold(f64::MIN, f64::max);
    // The guard's log says when it signalled what, should a write come late.
    let after =
        format!("guarded writes after {limit} (deadline {deadline}); the guard's log:\n{logged}");
    assert_none_after(&guarded, limit, &after);
    println!(
        "{url} ({cut:?} cut): {} guarded writes, the last {:.0} ms before the guard's deadline, \
         which came {:.0} ms after the cut",
        guarded.len(),
        (deadline - last) * 1e3,
        (deadline - cut_at) * 1e3
    );
    limit - last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule9_the_guard_stops_a_command_that_ignores_sigterm_or_backgrounds_a_writer_before_a_contender_takes_over_on_s3()
 {
    for writers in [Writers::IgnoringSigterm, Writers::InTheBackground] {
        guarded_writes_end_in_time(Store::S3, Cut::Holder, writers, As::Child).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule9_the_guard_stops_its_command_by_its_deadline_when_its_own_reads_are_cut_on_s3() {
    guarded_writes_end_in_time(Store::S3, Cut::Guard, Writers::IgnoringSigterm, As::Child).await;
}

/// As a container's entrypoint: PID 1 of its own PID namespace (root may create one, as
/// the test servers' harness runs), the double-forked writer re-parented to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule9_the_guard_as_pid_1_stops_every_writer_of_its_namespace_by_its_deadline_on_s3() {
    guarded_writes_end_in_time(Store::S3, Cut::Guard, Writers::InTheBackground, As::Pid1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule9_the_guard_stops_a_command_that_ignores_sigterm_before_a_contender_takes_over_on_a_lease()
 {
    guarded_writes_end_in_time(
        Store::Lease,
        Cut::Holder,
        Writers::IgnoringSigterm,
        As::Child,
    )
    .await;
}

/// `guard` of the acquisition (`url`, `nonce`, `fence`) as the Pod's annotations give
/// it, then `rest`: flags, `--` and COMMAND.
fn guard_args<'a>(url: &'a str, nonce: &'a str, fence: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["guard", "--url", url, "--nonce", nonce, "--fence", fence];
    args.extend(rest);
    args
}

/// The guard starts COMMAND once it has seen a renewal, passes the fence on, and exits
/// with COMMAND's status; a grace the stored lease does not leave is refused before
/// COMMAND starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_runs_its_command_after_a_renewal_and_exits_with_its_status() {
    let (lw, url) = fresh_lock(Store::S3).await;
    let path = StorePath::new(Store::S3, lw.dir(), "holder");
    let (_holder, nonce, fence) = keeper(&lw, &url, &path).await;
    let started = Instant::now();
    let sh = [
        "--",
        "sh",
        "-c",
        "echo \"$LOCKWARDEN_FENCE\" > fence.txt; exit 3",
    ];
    let out = lw.run(&guard_args(&url, &nonce, &fence, &sh)).await;
    out.code(3);
    assert_eq!(
        std::fs::read_to_string(lw.path("fence.txt"))
            .unwrap()
            .trim(),
        fence
    );
    println!(
        "the guard waited for a renewal and ran its command in {:.2?}",
        started.elapsed()
    );
    let touch = ["--", "touch", "ran.txt"];
    let too_long = ["--grace", "3s", "--", "touch", "ran.txt"];
    let out = lw.run(&guard_args(&url, &nonce, &fence, &too_long)).await;
    out.code(2)
        .one_line_error(&["--grace 3s", "8s lease", "at most 1s 623ms"]);
    let other: u64 = fence.parse::<u64>().unwrap() + 1;
    let out = lw
        .run(&guard_args(&url, &nonce, &other.to_string(), &touch))
        .await;
    out.code(2).one_line_error(&["--fence", "has fence"]);
    let out = lw.run(&guard_args(&url, "not-ours", &fence, &touch)).await;
    out.code(4)
        .one_line_error(&[&url, "not held with this nonce", "keeper"]);
    assert!(!lw.path("ran.txt").exists(), "the command must not run");
}

/// A workload on several locks: the guard reads each one, starts COMMAND once both have
/// shown a renewal (COMMAND gets the plural variables), and stops it when either cannot
/// be confirmed, naming that lock. The single-lock variables are set but empty, as the
/// downward API gives them to a workload whose single-lock annotations are absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule9_the_guard_of_several_locks_stops_its_command_when_either_cannot_be_confirmed_on_s3()
{
    let (lw, db) = fresh_lock(Store::S3).await;
    let bucket = format!("{db}-bucket");
    let db_path = StorePath::new(Store::S3, lw.dir(), "db");
    let bucket_path = StorePath::new(Store::S3, lw.dir(), "bucket");
    let guard_path = StorePath::new(Store::S3, lw.dir(), "guard");
    let (_db_keeper, db_nonce, db_fence) = keeper_writing(&lw, &db, &db_path, "db.txt").await;
    let (_bucket_keeper, bucket_nonce, bucket_fence) =
        keeper_writing(&lw, &bucket, &bucket_path, "bucket.txt").await;
    let urls = format!("db={db} bucket={bucket}");
    let fences = format!("db={db_fence},bucket={bucket_fence}");
    let mut args = vec!["guard", "--grace", "300ms"];
    args.extend(guard_path.flags());
    args.extend([
        "--",
        "sh",
        "-c",
        "echo \"$LOCKWARDEN_FENCES|$LOCKWARDEN_URLS\" > env.txt; exec sleep 600",
    ]);
    let mut cmd = lw.command(&args);
    cmd.env("LOCKWARDEN_URL", "")
        .env("LOCKWARDEN_NONCE", "")
        .env("LOCKWARDEN_FENCE", "")
        .env("LOCKWARDEN_URLS", &urls)
        .env(
            "LOCKWARDEN_NONCES",
            format!("bucket={bucket_nonce},db={db_nonce}"),
        )
        .env("LOCKWARDEN_FENCES", &fences);
    let mut guard = cmd.spawn().expect("spawn lockwarden guard");
    // The shell creates env.txt before echo writes to it: wait for the whole line.
    let seen = eventually("the guarded command to start", || async {
        std::fs::read_to_string(lw.path("env.txt"))
            .ok()
            .filter(|line| line.ends_with('\n'))
    });
    let seen = tokio::select! {
        seen = seen => seen,
        _ = guard.wait() => panic!("the guard exited first: {:#?}", finish(guard, String::new()).await),
    };
    assert_eq!(seen.trim(), format!("{fences}|{urls}"));
    // The bucket's holder is cut off: its renewals stop, the db's go on.
    bucket_path.proxy.set_mode(Mode::Blackhole);
    let out = finish(guard, String::new()).await;
    out.code(6)
        .one_line_error(&[&bucket, "could not be confirmed", "sent SIGTERM"]);
    assert!(!out.stderr.contains(&format!("{db}:")), "{out:#?}");
}

//! `run`: the command runs only while the lock is held, is terminated when the lock is
//! stolen, and gets SIGTERM passed on.

use super::*;

/// A lock stolen with `lock --force` by another process: `run` terminates its command
/// (SIGTERM) and exits 4; the thief's lock is left alone.
async fn stolen_while_running(lw: &Cli, url: &str, lease: &str) {
    // The command records its pid, then waits; on SIGTERM it records that and exits.
    let script = "trap 'echo terminated > term.txt; exit 143' TERM; \
                  echo \"$LOCKWARDEN_FENCE\" > started.txt; \
                  while true; do sleep 0.1; done";
    let runner = lw.spawn(&[
        "run", url, "--lease", lease, "--holder", "runner", "--grace", "30s", "--", "sh", "-c",
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
    stolen_while_running(&lw, &format!("s3://{bucket}/stolen"), "3s").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_run_exits_4_and_terminates_its_command_when_the_lock_is_stolen() {
    let lw = Cli::new();
    let url = zk_url("steal");
    stolen_while_running(&lw, &url, "10s").await;
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

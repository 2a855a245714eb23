//! Once per run (docs/design.md §6.7) from the CLI: `run --run-key` on two hosts runs
//! each run once, against the real stores that keep a memory of completed runs.

use super::*;

/// `run --run-key` as `host`: COMMAND appends `host run` to the shared register.
async fn run_as(lw: &Cli, url: &str, host: &str, run: &str, exit: u8) -> Out {
    let script = format!("echo \"{host} {run} $LOCKWARDEN_FENCE\" >> register.txt; exit {exit}");
    lw.run(&[
        "run",
        url,
        "--wait",
        "60",
        "--holder",
        host,
        "--run-key",
        run,
        "--",
        "sh",
        "-c",
        &script,
    ])
    .await
}

fn register(lw: &Cli) -> Vec<String> {
    std::fs::read_to_string(lw.path("register.txt"))
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

/// Acceptance, per store: a run completed on one host is not run again on another
/// (exit 7, COMMAND not started, the message names who completed it, where and with
/// which fence); a failed run is not recorded and runs again elsewhere; `status` lists
/// the completed runs.
async fn each_run_once(backend: Backend) {
    let key = if backend == Backend::ZooKeeper {
        ""
    } else {
        "nightly"
    };
    let (cli, url) = fresh_lock(backend, "cli-once", key).await;
    let (lw, url) = (&cli, url.as_str());
    let slot = "2026-12-03T02:00:00Z";
    run_as(lw, url, "east", slot, 0).await.ok();
    let out = run_as(lw, url, "west", slot, 0).await;
    out.code(7).one_line_error(&[
        url,
        &format!("run {slot} already completed"),
        "by east with fence",
        "the command was not started",
    ]);
    assert_eq!(register(lw).len(), 1, "{:?}", register(lw));
    assert_ne!(lw.status(url).await["state"], "held", "released at once");

    // A failed run is not recorded: the other host runs it.
    let next = "2026-12-03T03:00:00Z";
    run_as(lw, url, "east", next, 1).await.code(1);
    run_as(lw, url, "west", next, 0).await.ok();
    run_as(lw, url, "east", next, 0).await.code(7);
    let runs: Vec<String> = register(lw)
        .iter()
        .map(|l| l.split(' ').take(2).collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(
        runs,
        [
            format!("east {slot}"),
            format!("east {next}"),
            format!("west {next}")
        ]
    );

    let status = lw.status(url).await;
    let completed = status["runs"]["completed"]
        .as_array()
        .expect("runs in status");
    let seen: Vec<(&str, &str)> = completed
        .iter()
        .map(|r| (r["run"].as_str().unwrap(), r["holder"].as_str().unwrap()))
        .collect();
    assert_eq!(seen, [(slot, "east"), (next, "west")], "{status}");
    assert_eq!(status["runs"]["dropped"], 0, "{status}");
    // The fence each run completed with is the one its COMMAND got.
    let west_fence: u64 = register(lw)[2].split(' ').nth(2).unwrap().parse().unwrap();
    assert_eq!(completed[1]["fence"], west_fence, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_a_completed_run_is_not_repeated_on_another_host_on_every_store() {
    on_each(&EVERY_BACKEND, each_run_once).await;
}

/// The memory is bounded: with `--runs-kept 3`, five runs keep the last three and
/// count two as dropped; a run scheduled before the oldest kept is not run again (it
/// may have completed and been forgotten), a later one is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_the_memory_keeps_its_bound_and_refuses_a_run_older_than_it_reaches() {
    let (lw, url) = fresh_lock(Backend::S3, "cli-once-bound", "hourly").await;
    let slot = |h: u32| format!("2026-12-03T{h:02}:00:00Z");
    for h in 1..=5 {
        let script = "true";
        lw.run(&[
            "run",
            &url,
            "--run-key",
            &slot(h),
            "--runs-kept",
            "3",
            "--",
            "sh",
            "-c",
            script,
        ])
        .await
        .ok();
    }
    let status = lw.status(&url).await;
    let kept: Vec<&str> = status["runs"]["completed"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| r["run"].as_str().unwrap())
        .collect();
    assert_eq!(kept, [slot(3), slot(4), slot(5)], "{status}");
    assert_eq!(status["runs"]["dropped"], 2, "{status}");
    lw.run(&["run", &url, "--run-key", &slot(2), "--", "touch", "ran.txt"])
        .await
        .code(7)
        .one_line_error(&["not older than the oldest run the key still remembers"]);
    assert!(!lw.path("ran.txt").exists(), "not started");
    lw.run(&["run", &url, "--run-key", &slot(6), "--", "touch", "ran.txt"])
        .await
        .ok();
    assert!(lw.path("ran.txt").exists());
}

/// Bad input: a run key that names no run, `--run-key` on a shared or queued lock, on
/// a key that cannot remember (deleted on release) — each refused with a clear error, the command
/// never started, the key left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_once_refusals_name_what_is_wrong() {
    let (lw, url) = fresh_lock(Backend::S3, "cli-once-bad", "k").await;
    let refused = |args: &[&str]| {
        let mut all = vec!["run", url.as_str()];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--", "touch", "ran.txt"]);
        all.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let long = "x".repeat(400);
    let cases: [(Vec<String>, i32, &[&str]); 5] = [
        (
            refused(&["--run-key", ""]),
            2,
            &["--run-key", "must not be empty"],
        ),
        (
            refused(&["--run-key", &long]),
            2,
            &["--run-key", "at most 320 bytes"],
        ),
        (
            refused(&["--run-key", "r", "--permits", "3"]),
            2,
            &["--run-key r", "not with --permits"],
        ),
        (
            refused(&["--run-key", "r", "--queue"]),
            2,
            &["--run-key r", "not with --queue"],
        ),
        (
            refused(&["--run-key", "r", "--s3lock-compatible"]),
            1,
            &[
                "deleted on release",
                "cannot keep a memory of completed runs",
            ],
        ),
    ];
    for (args, code, needles) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        lw.run(&args).await.code(code).one_line_error(needles);
    }
    assert!(!lw.path("ran.txt").exists());
    assert_eq!(
        lw.status(&url).await["state"],
        "absent",
        "the key untouched"
    );
}

/// Memory bound, on the real stores through the engine: 200 runs completed through one
/// key leave the last 64, the other 136 counted as dropped, within the byte bound; the
/// next grant still finds the last run completed.
async fn two_hundred_runs(key: support::keys::Key) {
    use lockwarden::lock::{AcquireRequest, Attempt, CompletedRun, RunCheck, RunKey, RunMemory};
    let lock = key.handle().await;
    let run = |i: u64| {
        let at = std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + i * 3600);
        RunKey::scheduled(format!("ns/hourly@{}", lockwarden::lock::rfc3339(at)), at).unwrap()
    };
    let req = AcquireRequest::new("host-a", Duration::from_secs(30));
    let take = || async {
        match lock.try_acquire(&req).await.expect("acquire") {
            Attempt::Acquired(lease) => lease,
            Attempt::Busy { holder, .. } => panic!("held by {}", holder.holder),
        }
    };
    for i in 0..200 {
        let lease = take().await;
        let memory = lock.completed_runs(&lease).await.expect("the memory");
        assert_eq!(memory.check(&run(i)), RunCheck::New, "run {i}");
        let done = CompletedRun::now(&run(i), lease.fence(), "host-a", Some("east"));
        lock.release_completed(&lease, done, RunMemory::DEFAULT_KEEP)
            .await
            .expect("release recording the run");
    }
    let lease = take().await;
    let memory = &lock.completed_runs(&lease).await.expect("the memory");
    assert_eq!(memory.runs.len(), 64);
    assert_eq!(memory.dropped, 136);
    assert!(memory.to_text().len() <= RunMemory::MAX_BYTES);
    assert!(matches!(memory.check(&run(199)), RunCheck::Completed(_)));
    assert!(matches!(
        memory.check(&run(10)),
        RunCheck::BeyondMemory { dropped: 136, .. }
    ));
    lock.release(&lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_two_hundred_runs_keep_64_and_count_136_on_every_store() {
    use support::keys::Key;
    let (s3, dynamo, lease) = tokio::join!(Key::s3(), Key::dynamo(), Key::lease());
    let zookeeper = tokio::task::spawn_blocking(Key::zookeeper).await.unwrap();
    tokio::join!(
        two_hundred_runs(s3),
        two_hundred_runs(dynamo),
        two_hundred_runs(lease),
        two_hundred_runs(zookeeper)
    );
}

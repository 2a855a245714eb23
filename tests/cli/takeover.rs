//! `lock --force` and `unlock` of a lock someone else took over.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_force_with_wait_takes_over_only_when_the_wait_runs_out() {
    let bucket = Moto::shared().new_bucket("cli-force-wait").await;
    let lw = Cli::aws();
    let url = format!("s3://{bucket}/forced");
    lw.run(&["lock", &url, "-o", "old.lock", "--holder", "old"])
        .await
        .ok();
    let began = Instant::now();
    let out = lw
        .run(&["lock", &url, "-o", "new.lock", "--force", "--wait", "2"])
        .await;
    out.ok();
    assert!(
        began.elapsed() >= Duration::from_secs(2),
        "--force --wait 2 must wait 2s before taking over"
    );
    assert!(
        out.stderr.contains("took the lock over from old (fence 1)"),
        "{out:#?}"
    );
    assert_eq!(fence(&lw.read_json("new.lock")), 2);
    lw.run(&["unlock", "old.lock"])
        .await
        .code(3)
        .one_line_error(&["lock mismatch"]);
    lw.unlock("new.lock").await;
}

/// `unlock` of a lock someone else took over: "lock mismatch", exit 3, and their lock
/// stays held; `--force` only removes the stale file. Unlocking twice: "already
/// unlocked", exit 1.
async fn unlock_after_takeover(backend: Backend) {
    let (cli, url) = fresh_lock(backend, "cli-mismatch", "contested").await;
    let (lw, url) = (&cli, url.as_str());
    lw.run(&["lock", url, "-o", "mine.lock", "--holder", "me"])
        .await
        .ok();
    lw.run(&[
        "lock",
        url,
        "--force",
        "-o",
        "theirs.lock",
        "--holder",
        "them",
    ])
    .await
    .ok();
    let theirs = lw.read_json("theirs.lock");

    let out = lw.run(&["unlock", "mine.lock"]).await;
    out.code(3).one_line_error(&[url, "lock mismatch", "them"]);
    assert!(out.stdout.is_empty(), "{out:#?}");
    assert!(lw.path("mine.lock").exists(), "kept without --force");
    let status = lw.status(url).await;
    assert_eq!(status["state"], "held", "{status}");
    assert_eq!(status["holder"], "them", "{status}");
    assert_eq!(fence(&status), fence(&theirs));

    // --force: the error is ignored and the file removed; their lock is untouched.
    let out = lw.run(&["unlock", "--force", "mine.lock"]).await;
    out.ok();
    assert_eq!(out.stdout, "delete mine.lock\n", "{out:#?}");
    assert!(out.stderr.contains("lock mismatch"), "{out:#?}");
    assert!(!lw.path("mine.lock").exists());
    let status = lw.status(url).await;
    assert_eq!(status["state"], "held", "{status}");
    assert_eq!(status["holder"], "them", "{status}");

    // Unlocked twice: already unlocked.
    std::fs::copy(lw.path("theirs.lock"), lw.path("copy.lock")).expect("copy");
    lw.unlock("theirs.lock").await;
    let out = lw.run(&["unlock", "copy.lock"]).await;
    out.code(1).one_line_error(&[url, "already unlocked"]);
    let out = lw.run(&["unlock", "-f", "copy.lock"]).await;
    out.ok();
    assert!(!lw.path("copy.lock").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_of_a_taken_over_lock_reports_mismatch_and_leaves_it_on_s3_dynamodb_and_zookeeper() {
    const STORES: [Backend; 3] = [Backend::DynamoDb, Backend::S3, Backend::ZooKeeper];
    on_each(&STORES, unlock_after_takeover).await;
}

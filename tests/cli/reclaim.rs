//! `--reclaim`: a restarted owner takes back at once the lock its own holder name still
//! holds from an earlier run, on every backend — never someone else's, always with the
//! next fence and a warning line; the earlier run's lock file no longer unlocks.

use super::*;

/// `lock URL --holder HOLDER FLAGS -o FILE`.
async fn lock_as(lw: &Cli, url: &str, holder: &str, flags: &[&str], file: &str) -> Out {
    let mut args = vec!["lock", url, "--holder", holder];
    args.extend(flags);
    args.extend(["-o", file]);
    lw.run(&args).await
}

async fn reclaim_cycle(backend: Backend) {
    let (cli, url) = fresh_lock(backend, "cli-reclaim", "batch").await;
    let (lw, url, fences) = (&cli, url.as_str(), backend.fences());
    // The earlier run of batch-1: locked, never unlocked.
    lock_as(lw, url, "batch-1", &[], "first.lock").await.ok();
    let f1 = fence(&lw.read_json("first.lock"));

    // Restarted without --reclaim: held (by itself), exit 3.
    lock_as(lw, url, "batch-1", &[], "again.lock")
        .await
        .code(3)
        .one_line_error(&[url, "lock already held by batch-1"]);
    // --reclaim under another name is no takeover.
    lock_as(lw, url, "batch-2", &["--reclaim"], "other.lock")
        .await
        .code(3)
        .one_line_error(&[url, "lock already held by batch-1"]);
    assert!(!lw.path("other.lock").exists());

    // With --reclaim: at once, the next fence, a warning naming both fences.
    let out = lock_as(lw, url, "batch-1", &["--reclaim"], "again.lock").await;
    out.ok();
    let again = lw.read_json("again.lock");
    let f2 = fence(&again);
    assert_next_fence(fences, f1, f2);
    assert!(
        out.stderr.contains(&format!(
            "warning: {url}: reclaimed the lock batch-1 still held from an earlier run \
             (fence {f1}, now fence {f2})"
        )),
        "{out:#?}"
    );
    let status = lw.status(url).await;
    assert_eq!(status["holder"], "batch-1", "{status}");
    assert_eq!(fence(&status), f2);
    // The earlier run's lock file does not release the reclaimed lock.
    let stale = lw.run(&["unlock", "first.lock"]).await;
    assert_ne!(stale.code, 0, "{stale:#?}");
    assert_eq!(fence(&lw.status(url).await), f2);
    lw.unlock("again.lock").await;

    // `run --reclaim` takes back what `lock` of the same holder left.
    lock_as(lw, url, "batch-1", &[], "third.lock").await.ok();
    let f3 = fence(&lw.read_json("third.lock"));
    let out = lw
        .run(&[
            "run",
            url,
            "--holder",
            "batch-1",
            "--reclaim",
            "--",
            "sh",
            "-c",
            "echo $LOCKWARDEN_FENCE > fence.txt",
        ])
        .await;
    out.ok();
    assert!(
        out.stderr.contains("reclaimed the lock batch-1"),
        "{out:#?}"
    );
    let f4: u64 = std::fs::read_to_string(lw.path("fence.txt"))
        .expect("fence.txt")
        .trim()
        .parse()
        .expect("a fence");
    assert_next_fence(fences, f3, f4);
    // Released when COMMAND ended (ZooKeeper: the queue is empty, so no record at all).
    let after = lw.status(url).await;
    assert_ne!(after["state"], "held", "{after}");
}

/// On ZooKeeper, what is taken back is the queue entry of an earlier session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaim_takes_back_only_this_holders_lock_on_every_backend() {
    on_each(&EVERY_BACKEND, reclaim_cycle).await;
}

//! `--reclaim`: a restarted owner takes back at once the lock its own holder name still
//! holds from an earlier run, on every backend — never someone else's, always with the
//! next fence and a warning line; the earlier run's lock file no longer unlocks.

use super::*;

async fn reclaim_cycle(lw: &Cli, url: &str, fences: Fences) {
    // The earlier run of batch-1: locked, never unlocked.
    lw.run(&["lock", url, "--holder", "batch-1", "-o", "first.lock"])
        .await
        .ok();
    let f1 = fence(&lw.read_json("first.lock"));

    // Restarted without --reclaim: held (by itself), exit 3.
    lw.run(&["lock", url, "--holder", "batch-1", "-o", "again.lock"])
        .await
        .code(3)
        .one_line_error(&[url, "lock already held by batch-1"]);
    // --reclaim under another name is no takeover.
    lw.run(&[
        "lock",
        url,
        "--holder",
        "batch-2",
        "--reclaim",
        "-o",
        "other.lock",
    ])
    .await
    .code(3)
    .one_line_error(&[url, "lock already held by batch-1"]);
    assert!(!lw.path("other.lock").exists());

    // With --reclaim: at once, the next fence, a warning naming both fences.
    let out = lw
        .run(&[
            "lock",
            url,
            "--holder",
            "batch-1",
            "--reclaim",
            "-o",
            "again.lock",
        ])
        .await;
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
    lw.run(&["lock", url, "--holder", "batch-1", "-o", "third.lock"])
        .await
        .ok();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_reclaim_takes_back_only_this_holders_lock() {
    let bucket = Moto::shared().new_bucket("cli-reclaim").await;
    reclaim_cycle(
        &Cli::aws(),
        &format!("s3://{bucket}/batch"),
        Fences::PlusOne,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_reclaim_takes_back_only_this_holders_lock() {
    let table = Moto::shared().new_table("cli-reclaim", "key").await;
    reclaim_cycle(
        &Cli::aws(),
        &format!("dynamodb://{table}/batch"),
        Fences::PlusOne,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_reclaim_takes_back_the_entry_of_an_earlier_session() {
    reclaim_cycle(&Cli::new(), &zk_url("reclaim"), Fences::Increasing).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_reclaim_takes_back_only_this_holders_lock() {
    let plane = ControlPlane::shared();
    let client = plane.client().await;
    let namespace = plane.namespace(&client, "cli-reclaim").await;
    reclaim_cycle(
        &Cli::kube(),
        &format!("k8s://{namespace}/batch"),
        Fences::PlusOne,
    )
    .await;
}

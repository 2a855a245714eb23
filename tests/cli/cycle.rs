//! lock → a second lock fails → unlock → lock again → run, on every backend;
//! what the lock files hold.

use super::*;

/// Acceptance, per backend: lock → a second lock fails with exit 3 → unlock → lock
/// again with fence + 1; then `run` continues the sequence, passes the fence and the
/// exit code, and releases.
async fn lock_cycle(backend: Backend) {
    let key = match backend {
        Backend::S3 => "locks/lock-object",
        Backend::DynamoDb | Backend::Kubernetes => "db-migration",
        Backend::ZooKeeper => "",
    };
    let (cli, url) = fresh_lock(backend, "cli-cycle", key).await;
    let (lw, url, fences) = (&cli, url.as_str(), backend.fences());
    // lock
    let out = lw
        .run(&["lock", url, "-o", "first.lock", "--lease", "5m"])
        .await;
    out.ok();
    assert_eq!(
        out.stdout,
        format!("{url} has been locked\ncreate first.lock\n"),
        "{out:#?}"
    );
    let first = lw.read_json("first.lock");
    assert_eq!(first["url"], url);
    assert_eq!(first["lease"], "5m");
    let holder = first["holder"].as_str().expect("holder").to_string();
    assert!(
        holder.starts_with("tester@"),
        "default holder is user@host:pid: {holder}"
    );
    for field in ["nonce", "version", "acquiredAt"] {
        assert!(
            first[field].as_str().is_some_and(|s| !s.is_empty()),
            "{field} missing in {first}"
        );
    }
    let f1 = fence(&first);

    // A second lock fails: held, exit 3, names the holder and fence; writes no file.
    let out = lw.run(&["lock", url, "-o", "second.lock"]).await;
    out.code(3)
        .one_line_error(&[url, &format!("lock already held by {holder} (fence {f1})")]);
    assert!(out.stdout.is_empty(), "{out:#?}");
    assert!(!lw.path("second.lock").exists());

    // status reads it without acquiring.
    let status = lw.status(url).await;
    assert_eq!(status["state"], "held", "{status}");
    assert_eq!(status["holder"], holder.as_str(), "{status}");
    assert_eq!(fence(&status), f1);

    // unlock
    let out = lw.unlock("first.lock").await;
    assert_eq!(
        out.stdout,
        format!("{url} has been unlocked\ndelete first.lock\n")
    );
    assert!(!lw.path("first.lock").exists());

    // lock again: fence + 1
    let out = lw
        .run(&[
            "lock",
            url,
            "-o",
            "third.lock",
            "--holder",
            "third",
            "--data",
            "hello",
        ])
        .await;
    out.ok();
    let third = lw.read_json("third.lock");
    let f2 = fence(&third);
    assert_next_fence(fences, f1, f2);
    assert_eq!(third["holder"], "third");
    let status = lw.status(url).await;
    assert_eq!(status["holder"], "third", "{status}");
    assert_eq!(status["data"], "hello", "{status}");
    lw.unlock("third.lock").await;

    // run: the fence goes to the command, its exit code comes back, the lock is
    // released afterwards — and while it runs, the lock is held by it.
    let script = format!(
        "echo \"$LOCKWARDEN_FENCE $LOCKWARDEN_HOLDER $LOCKWARDEN_URL\" > env.txt; \
         {bin} status \"$LOCKWARDEN_URL\" -o json > during.json; exit 7",
        bin = bin()
    );
    let out = lw
        .run(&[
            "run", url, "--wait", "60", "--holder", "runner", "--", "sh", "-c", &script,
        ])
        .await;
    out.code(7);
    let env = std::fs::read_to_string(lw.path("env.txt")).expect("env.txt");
    let parts: Vec<&str> = env.split_whitespace().collect();
    assert_eq!(parts.len(), 3, "{env:?}");
    let f3: u64 = parts[0].parse().expect("LOCKWARDEN_FENCE is a number");
    assert_next_fence(fences, f2, f3);
    assert_eq!(parts[1], "runner");
    assert_eq!(parts[2], url);
    let during = lw.read_json("during.json");
    assert_eq!(during["state"], "held", "{during}");
    assert_eq!(during["holder"], "runner", "{during}");
    assert_eq!(fence(&during), f3);

    // Released afterwards: the next lock succeeds at once with the next fence.
    let out = lw.run(&["lock", url, "-o", "fourth.lock"]).await;
    out.ok();
    assert_next_fence(fences, f3, fence(&lw.read_json("fourth.lock")));
    lw.unlock("fourth.lock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_unlock_relock_and_run_on_every_backend() {
    on_each(&EVERY_BACKEND, lock_cycle).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_lock_file_has_s3lock_fields_and_default_name() {
    let bucket = Moto::shared().new_bucket("cli-file").await;
    let lw = Cli::aws();
    let url = format!("s3://{bucket}/lock-object");
    let out = lw.run(&["lock", &url]).await;
    out.ok();
    assert_eq!(
        out.stdout,
        format!("{url} has been locked\ncreate lock-object.lock\n")
    );
    let file = lw.read_json("lock-object.lock");
    assert_eq!(file["Bucket"], bucket.as_str());
    assert_eq!(file["Key"], "lock-object");
    assert_eq!(file["Id"], file["nonce"]);
    assert_eq!(file["ETag"], file["version"]);
    assert_eq!(file["lease"], "1h", "lock's default lease");
    // The ETag in the file is the object's.
    let head = Moto::shared()
        .s3_client()
        .await
        .head_object()
        .bucket(&bucket)
        .key("lock-object")
        .send()
        .await
        .expect("head lock object");
    assert_eq!(file["ETag"], head.e_tag().unwrap_or_default());
    std::fs::copy(lw.path("lock-object.lock"), lw.path("stale.lock")).expect("copy");
    lw.unlock("lock-object.lock").await;

    // A lock file is never overwritten (it is what unlocks its lock): the lock just
    // taken is released again.
    std::fs::rename(lw.path("stale.lock"), lw.path("lock-object.lock")).expect("rename");
    let out = lw.run(&["lock", &url]).await;
    out.code(1)
        .one_line_error(&[&url, "lock-object.lock already exists", "released again"]);
    assert_eq!(lw.status(&url).await["state"], "released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_custom_partition_key_is_remembered_by_the_lock_file() {
    let table = Moto::shared().new_table("cli-pk", "LockID").await;
    let lw = Cli::aws();
    let url = format!("dynamodb://{table}/x");
    lw.run(&["lock", &url, "--partition-key", "LockID"])
        .await
        .ok();
    let file = lw.read_json("x.lock");
    assert_eq!(file["backend"]["partitionKey"], "LockID", "{file}");
    // Without the flag, the table's key schema does not match: an error, exit 1.
    lw.run(&["status", &url])
        .await
        .code(1)
        .one_line_error(&[&url]);
    // unlock needs no flag: the lock file says.
    lw.unlock("x.lock").await;
}

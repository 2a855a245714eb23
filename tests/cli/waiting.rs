//! `--wait`: acquiring when the holder unlocks, failing at the deadline.

use super::*;

/// `--wait` acquires as soon as the holder unlocks (the delay is printed), and fails
/// cleanly, with exit 3, when its deadline passes first.
async fn wait_for_unlock(backend: Backend) {
    let (cli, url) = fresh_lock(backend, "cli-wait", "waited").await;
    let (lw, url) = (&cli, url.as_str());
    lw.run(&["lock", url, "-o", "holder.lock"]).await.ok();
    let holder = lw.read_json("holder.lock");

    // Deadline: still held after 2 s.
    let began = Instant::now();
    let out = lw
        .run(&["lock", url, "-o", "late.lock", "--wait", "2"])
        .await;
    let took = began.elapsed();
    assert_eq!(out.code, 3, "{out:#?}");
    let error = out
        .stderr
        .lines()
        .find(|l| l.starts_with("lockwarden: error:"))
        .unwrap_or_else(|| panic!("no error line: {out:#?}"));
    assert!(error.contains(url), "{error}");
    assert!(
        error.contains(&format!(
            "lock already held by {} (fence {})",
            holder["holder"].as_str().unwrap(),
            fence(&holder)
        )),
        "{error}"
    );
    assert!(error.contains("gave up after waiting 2s"), "{error}");
    assert!(
        out.stderr.contains("waiting for"),
        "plain progress lines without a terminal: {out:#?}"
    );
    assert!(took >= Duration::from_secs(2), "gave up early: {took:?}");
    assert!(!lw.path("late.lock").exists());
    println!("--wait 2 on a held lock gave up after {took:.2?}");

    // Acquire as soon as it is unlocked.
    let mut waiter = lw.spawn(&["lock", url, "-o", "waiter.lock", "--wait", "120"]);
    let seen = stderr_until(&mut waiter, "waiting for").await;
    lw.run(&["unlock", "holder.lock"]).await.ok();
    let unlocked = Instant::now();
    let out = finish(waiter, seen).await;
    let delay = unlocked.elapsed();
    out.ok();
    assert!(
        out.stdout.contains(&format!("{url} has been locked")),
        "{out:#?}"
    );
    println!("{url}: waiter acquired {delay:.2?} after the holder's unlock returned");
    // The pollers back off to 1 s between attempts; the rest is process start-up on a
    // loaded machine.
    assert!(
        delay < Duration::from_secs(30),
        "waiter took {delay:?} after unlock"
    );
    let waited = lw.read_json("waiter.lock");
    assert!(fence(&waited) > fence(&holder));
    lw.unlock("waiter.lock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_acquires_when_the_holder_unlocks_and_fails_at_the_deadline_on_s3_and_zookeeper() {
    on_each(&[Backend::S3, Backend::ZooKeeper], wait_for_unlock).await;
}

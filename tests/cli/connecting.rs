//! A store that begins serving only after `lock` started: the command keeps trying to
//! reach it for its connect timeout (5 s; `--wait` extends it) instead of failing at
//! once with "backend unavailable".

use super::*;
use support::proxy::{Mode, Proxy};

/// Runs `lock URL` while `proxy` — the only way to the store — resets every
/// connection (a server whose port is open but which does not serve yet); once the
/// command has been turned away at least once and `refused_for` has passed since it
/// started, the proxy starts passing. The command must then lock.
async fn lock_while_the_store_starts(
    lw: &Cli,
    url: &str,
    proxy: &Proxy,
    extra: &[&str],
    refused_for: Duration,
) {
    proxy.set_mode(Mode::Refuse);
    let mut args = vec!["lock", url, "-o", "early.lock"];
    args.extend_from_slice(extra);
    let started = Instant::now();
    let child = lw.spawn(&args);
    eventually(
        "the command to reach the store that is not serving",
        || async { (proxy.accepted() > 0 && started.elapsed() >= refused_for).then_some(()) },
    )
    .await;
    proxy.set_mode(Mode::Pass);
    let out = finish(child, String::new()).await;
    out.ok();
    println!(
        "{url}: locked {:.2?} after the start, {} connections turned away or passed",
        started.elapsed(),
        proxy.accepted()
    );
    lw.unlock("early.lock").await;
}

/// A proxy in front of the shared ZooKeeper, and a fresh lock URL through it: the
/// store as the command sees it.
async fn zookeeper_behind_a_proxy(prefix: &str) -> (Proxy, String) {
    let zk = tokio::task::spawn_blocking(ZooKeeper::shared)
        .await
        .unwrap();
    let proxy = Proxy::start(zk.nodes()[0].port());
    let url = format!("zk://{}/lockwarden-cli/{}", proxy.address(), unique(prefix));
    (proxy, url)
}

/// A proxy in front of the shared moto (the command reaches it by `--endpoint`).
async fn moto_behind_a_proxy() -> Proxy {
    let moto = tokio::task::spawn_blocking(Moto::shared).await.unwrap();
    Proxy::start(moto.port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_reaches_a_zookeeper_that_starts_serving_after_the_command() {
    let (proxy, url) = zookeeper_behind_a_proxy("late-zk").await;
    lock_while_the_store_starts(&Cli::new(), &url, &proxy, &[], Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_reaches_an_s3_endpoint_that_starts_serving_after_the_command() {
    let proxy = moto_behind_a_proxy().await;
    let endpoint = proxy.endpoint();
    let (lw, url) = fresh_lock(Backend::S3, "cli-late", "late").await;
    // Longer than the AWS SDK's own retries of a failed connection, shorter than the
    // connect timeout.
    let refused_for = Duration::from_secs(3);
    lock_while_the_store_starts(&lw, &url, &proxy, &["--endpoint", &endpoint], refused_for).await;
}

/// Longer than the connect timeout: `--wait` keeps the command trying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_with_wait_reaches_a_dynamodb_endpoint_that_serves_after_the_connect_timeout() {
    let proxy = moto_behind_a_proxy().await;
    let (lw, url) = fresh_lock(Backend::DynamoDb, "cli-late", "late").await;
    let flags = ["--endpoint", &proxy.endpoint(), "--wait", "60s"];
    lock_while_the_store_starts(&lw, &url, &proxy, &flags, Duration::from_secs(7)).await;
}

/// `status` too keeps trying a store that does not serve yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reaches_a_zookeeper_that_starts_serving_after_the_command() {
    let (proxy, url) = zookeeper_behind_a_proxy("late-status").await;
    proxy.set_mode(Mode::Refuse);
    let lw = Cli::new();
    let child = lw.spawn(&["status", &url, "-o", "json"]);
    eventually("status to reach the store that is not serving", || async {
        (proxy.accepted() > 0).then_some(())
    })
    .await;
    proxy.set_mode(Mode::Pass);
    let out = finish(child, String::new()).await;
    out.ok();
    let status: Value = serde_json::from_str(&out.stdout).expect("status JSON");
    assert_eq!(status["state"], "absent", "{status}");
}

/// `unlock` too: the lock file's store refuses connections when the command starts
/// (a ZooKeeper restarting), and serves a moment later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_reaches_a_zookeeper_that_starts_serving_after_the_command() {
    let (proxy, url) = zookeeper_behind_a_proxy("late-unlock").await;
    let lw = Cli::new();
    lw.run(&["lock", &url, "-o", "late.lock"]).await.ok();
    let before = proxy.accepted();
    proxy.set_mode(Mode::Refuse);
    let child = lw.spawn(&["unlock", "late.lock"]);
    eventually("unlock to reach the store that is not serving", || async {
        (proxy.accepted() > before).then_some(())
    })
    .await;
    proxy.set_mode(Mode::Pass);
    let out = finish(child, String::new()).await;
    out.ok();
    assert!(out.stdout.contains("has been unlocked"), "{out:#?}");
    let status = lw.run(&["status", &url, "-o", "json"]).await;
    let status: Value = serde_json::from_str(&status.ok().stdout).expect("status JSON");
    assert_eq!(status["state"], "absent", "{status}");
}

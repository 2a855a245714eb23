//! `spec.backend.zookeeper.sessionTimeout` (and the CLI's `--session-timeout`) reach
//! ZooKeeper: the lock's session is opened with that timeout, as the server itself
//! reports it (`cons`: `to=` per connection), and locks asking for different timeouts
//! in one process get sessions of their own.

use lockwarden_testsupport as support;

use std::process::Stdio;
use std::time::Duration;

use lockwarden::api::DistributedLockSpec;
use lockwarden::backend::{ConnectOptions, Target, connect};
use lockwarden::lock::{AcquireRequest, Attempt, LockBackend};
use serde_json::json;
use support::zookeeper::ZooKeeper;

const BIN: &str = env!("CARGO_BIN_EXE_lockwarden");
/// Generous: the test machine is a loaded 2-core box.
const TIMEOUT: Duration = Duration::from_secs(60);

/// The session timeout (ms) the server negotiated for the session that owns the
/// queue entries under `path`, from `cons` on every node; one per entry, in queue order.
async fn server_timeouts(zk: &ZooKeeper, path: &str) -> Option<Vec<u64>> {
    let raw = zk.connect().await;
    let mut children = raw.list_children(path).await.ok()?;
    if children.is_empty() {
        return None;
    }
    children.sort_by_key(|c| c.rsplit('-').next().unwrap_or_default().to_string());
    let mut timeouts = Vec::new();
    for child in children {
        let (_, stat) = raw.get_data(&format!("{path}/{child}")).await.ok()?;
        let sid = format!("sid=0x{:x},", stat.ephemeral_owner);
        let mut found = None;
        for node in zk.nodes() {
            let cons = node.four_letter("cons").ok()?;
            found = found.or_else(|| {
                let line = cons.lines().find(|l| l.contains(&sid))?;
                let to = line.split("to=").nth(1)?;
                to.split([',', ')']).next()?.parse::<u64>().ok()
            });
        }
        timeouts.push(found?);
    }
    Some(timeouts)
}

/// The ensemble shared by this test binary (started off the async runtime).
async fn zookeeper() -> &'static ZooKeeper {
    tokio::task::spawn_blocking(ZooKeeper::shared)
        .await
        .expect("ZooKeeper starts")
}

async fn acquire(backend: &dyn LockBackend, holder: &str) {
    let request = AcquireRequest::new(holder, Duration::from_secs(30));
    match backend.try_acquire(&request).await {
        Ok(Attempt::Acquired(_) | Attempt::Busy { .. }) => {}
        other => panic!("{holder}: joining the queue failed: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_distributed_lock_with_a_4s_session_timeout_gets_a_4s_session() {
    let zk = zookeeper().await;
    let path = format!("/session-timeout/{}", support::unique_suffix());
    let spec: DistributedLockSpec = serde_json::from_value(json!({
        "backend": { "zookeeper": {
            "servers": zk.connect_string().split(',').collect::<Vec<_>>(),
            "path": path,
            "sessionTimeout": "4s",
        } }
    }))
    .expect("a DistributedLock spec");
    let target = spec.backend.target("default").expect("a valid spec");
    let options = spec.backend.connect_options();
    assert_eq!(
        options.zookeeper.session_timeout,
        Some(Duration::from_secs(4))
    );
    let holder = connect(&target, &options).await.expect("connect");
    acquire(holder.as_ref(), "four-seconds").await;
    // A second lock in this process that asks for the default timeout (10 s) must not
    // share the 4 s session.
    let default_target: Target =
        Target::parse(&format!("zk://{}{path}", zk.connect_string())).expect("a lock URL");
    let waiter = connect(&default_target, &ConnectOptions::default())
        .await
        .expect("connect");
    acquire(waiter.as_ref(), "default").await;

    let timeouts = support::eventually("both sessions in cons", TIMEOUT, || {
        server_timeouts(zk, &path)
    })
    .await;
    assert_eq!(timeouts, [4000, 10000], "negotiated session timeouts");
    holder.abandon().await;
    waiter.abandon().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_session_timeout_flag_reaches_zookeeper() {
    let zk = zookeeper().await;
    let path = format!("/session-timeout/{}", support::unique_suffix());
    let url = format!("zk://{}{path}", zk.connect_string());
    let mut run = tokio::process::Command::new(BIN)
        .args(["run", "--session-timeout", "4s", &url, "--", "sleep", "60"])
        .env_remove("LOCKWARDEN_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("start lockwarden run");
    let timeouts = support::eventually("the run's session in cons", TIMEOUT, || {
        server_timeouts(zk, &path)
    })
    .await;
    assert_eq!(timeouts, [4000], "negotiated session timeout");
    run.kill().await.expect("stop lockwarden run");
}

/// The same through the operator: a DistributedLock with `sessionTimeout: 5s` is held
/// by a session the server negotiated at 5 s (5 s, not 4 s: the test above owns the
/// process-wide 4 s session of this ensemble, bound to its own runtime).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_opens_the_session_timeout_a_distributed_lock_asks_for() {
    use kube::api::{Api, PostParams};
    use lockwarden::api::DistributedLock;

    let zk = zookeeper().await;
    let (client, ns) =
        support::kube::namespace_with_controller("session-timeout", "session-cluster").await;
    let path = format!("/session-timeout/{}", support::unique_suffix());
    let lock: DistributedLock = serde_json::from_value(json!({
        "apiVersion": "lockwarden.io/v1alpha1",
        "kind": "DistributedLock",
        "metadata": { "name": "five-seconds" },
        "spec": { "backend": { "zookeeper": {
            "servers": zk.connect_string().split(',').collect::<Vec<_>>(),
            "path": path,
            "sessionTimeout": "5s",
        } } }
    }))
    .expect("a DistributedLock");
    let locks: Api<DistributedLock> = Api::namespaced(client, &ns);
    locks
        .create(&PostParams::default(), &lock)
        .await
        .expect("create the lock");
    support::locks::wait_acquired(&locks, "five-seconds", TIMEOUT).await;
    let timeouts = support::eventually("the operator's session in cons", TIMEOUT, || {
        server_timeouts(zk, &path)
    })
    .await;
    assert_eq!(timeouts, [5000], "negotiated session timeout");
}

//! The holder history of a key (docs/backends.md "Holder history"), on real servers.
//!
//! - On S3, DynamoDB and Leases: a release, an observed expiry and a forced takeover
//!   each leave the grant they end closed as such, with the next grant's fence one
//!   higher, and the history keeps the last `HISTORY_LEN` grants only.
//! - ZooKeeper keeps no history (its entries are ephemeral): the key's history is its
//!   current holder.
//! - The acceptance scenario of issue 30: two controllers ("clusters") hand one Lease
//!   key back and forth five times; each cluster's DistributedLock status, the
//!   library call and `lockwarden status --history` all show the five grants in order
//!   with their fences and clusters.

use lockwarden_testsupport as support;

use std::time::Duration;

use kube::Api;
use kube::api::PostParams;
use lockwarden::api::{DistributedLock, KubernetesBackend, LockPhase};
use lockwarden::backend::LeaseStore;
use lockwarden::lock::{AcquireRequest, Attempt, CasLock, Grant, HISTORY_LEN, LockBackend};
use serde_json::{Value, json};

use support::cli::Cli;
use support::eventually;
use support::keys::Key;
use support::locks::{acquire_now as acquired, lease_lock_timed, patch_spec};

/// Long enough that nothing expires unless a test lets it.
const LEASE: Duration = Duration::from_secs(60);
/// The lease of the holder a test lets expire.
const SHORT: Duration = Duration::from_secs(1);
/// Generous: a loaded 2-core machine.
const TIMEOUT: Duration = Duration::from_secs(90);

fn request(holder: &str, cluster: &str, lease: Duration) -> AcquireRequest {
    AcquireRequest {
        cluster: Some(cluster.into()),
        ..AcquireRequest::new(holder, lease)
    }
}

/// Each grant as (holder, cluster, fence, how it ended).
fn seen(history: &[Grant]) -> Vec<(String, String, u64, String)> {
    history
        .iter()
        .map(|g| {
            (
                g.holder.clone(),
                g.cluster.clone().unwrap_or_default(),
                g.fence.0,
                g.ended.to_string(),
            )
        })
        .collect()
}

fn grant(holder: &str, cluster: &str, fence: u64, ended: &str) -> (String, String, u64, String) {
    (holder.into(), cluster.into(), fence, ended.into())
}

/// Released, expired (observed by the next holder), forced, held — then more grants
/// than the history keeps.
async fn each_ending_is_recorded_by_the_writer_that_knows_it(key: Key) {
    let (a, b, c, d) = (
        key.handle().await,
        key.handle().await,
        key.handle().await,
        key.handle().await,
    );
    let first = acquired(a.as_ref(), &request("a", "east", LEASE)).await;
    a.release(&first).await.expect("a releases");
    // b never renews: c observes its lease run out and takes the key over.
    acquired(b.as_ref(), &request("b", "west", SHORT)).await;
    let c_req = request("c", "east", LEASE);
    eventually("c to take over b's expired lease", TIMEOUT, || async {
        match c.try_acquire(&c_req).await {
            Ok(Attempt::Acquired(lease)) => Some(lease),
            _ => None,
        }
    })
    .await;
    let forced = AcquireRequest {
        force: true,
        ..request("d", "west", LEASE)
    };
    let last = acquired(d.as_ref(), &forced).await;

    let f = first.fence().0;
    let expected = [
        grant("a", "east", f, "released"),
        grant("b", "west", f + 1, "expired"),
        grant("c", "east", f + 2, "forced"),
        grant("d", "west", f + 3, "held"),
    ];
    // The same from any contender, and from a fresh one that wrote nothing.
    for reader in [&a, &key.handle().await] {
        let history = reader.history().await.expect("the key's history");
        assert_eq!(seen(&history), expected, "{}", key_url(reader.as_ref()));
        assert!(history[..3].iter().all(|g| g.ended_at().is_some()));
        assert!(history.iter().all(|g| g.acquired_at().is_some()));
    }

    // Only the last grants are kept.
    d.release(&last).await.expect("d releases");
    let mut fence = last.fence().0;
    for i in 0..HISTORY_LEN + 2 {
        let held = acquired(a.as_ref(), &request(&format!("h{i}"), "east", LEASE)).await;
        fence = held.fence().0;
        a.release(&held).await.expect("released");
    }
    let history = b.history().await.expect("the key's history");
    assert_eq!(history.len(), HISTORY_LEN, "{history:?}");
    let fences: Vec<u64> = history.iter().map(|g| g.fence.0).collect();
    let first_kept = fence + 1 - HISTORY_LEN as u64;
    assert_eq!(fences, (first_kept..=fence).collect::<Vec<_>>());
    assert!(history.iter().all(|g| g.ended.to_string() == "released"));
}

fn key_url(lock: &dyn LockBackend) -> String {
    lock.url().to_string()
}

support::on_each_store! {
    s3_each_ending_is_recorded_by_the_writer_that_knows_it: each_ending_is_recorded_by_the_writer_that_knows_it(s3);
    dynamodb_each_ending_is_recorded_by_the_writer_that_knows_it: each_ending_is_recorded_by_the_writer_that_knows_it(dynamo);
    lease_each_ending_is_recorded_by_the_writer_that_knows_it: each_ending_is_recorded_by_the_writer_that_knows_it(lease);
}

/// ZooKeeper's entries are ephemeral and written once: no history is kept, and the
/// key's history is its current holder (docs/backends.md says why).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_keeps_no_history_and_shows_the_current_holder() {
    let key = Key::zookeeper();
    let (a, b) = (key.handle().await, key.handle().await);
    let first = acquired(a.as_ref(), &request("a", "east", LEASE)).await;
    a.release(&first).await.expect("a releases");
    let second = acquired(b.as_ref(), &request("b", "west", LEASE)).await;
    let history = a.history().await.expect("the key's history");
    assert_eq!(seen(&history), [grant("b", "", second.fence().0, "held")]);
    b.release(&second).await.expect("b releases");
    assert!(a.history().await.expect("the key's history").is_empty());
}

/// A lock on the shared Lease `lease` of namespace `keys`, released or not.
fn shared_key_lock(lease: &str, keys: &str, release: bool) -> DistributedLock {
    let mut lock = lease_lock_timed("history", lease, "6s", "2s");
    lock.spec.backend.kubernetes = Some(KubernetesBackend {
        lease_name: lease.into(),
        namespace: Some(keys.into()),
    });
    lock.spec.release = release;
    lock
}

async fn set_release(locks: &Api<DistributedLock>, release: bool) {
    patch_spec(locks, "history", json!({ "release": release })).await;
}

/// Waits until the lock holds the key with a fence above `above`; returns that fence.
async fn held_above(locks: &Api<DistributedLock>, cluster: &str, above: i64) -> i64 {
    eventually(
        &format!("{cluster}'s lock to hold the key with a fence above {above}"),
        TIMEOUT,
        || async {
            let lock = locks.get("history").await.ok()?;
            let status = lock.status?;
            (status.phase == Some(LockPhase::Held))
                .then_some(status.fence?)
                .filter(|f| *f > above)
        },
    )
    .await
}

/// (cluster, fence, ended) of the last five entries of `status.history`.
fn status_grants(lock: &DistributedLock) -> Vec<(String, i64, String)> {
    let history = lock
        .status
        .as_ref()
        .and_then(|s| s.history.clone())
        .unwrap_or_default();
    history
        .iter()
        .skip(history.len().saturating_sub(5))
        .map(|g| {
            (
                g.cluster.clone().unwrap_or_default(),
                g.fence,
                g.ended.clone(),
            )
        })
        .collect()
}

/// Issue 30's acceptance: after 5 hand-offs across two clusters, the key's history
/// shows the 5 grants in order with their fences, from either cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hand_offs_across_two_clusters_show_in_order_from_either_cluster() {
    let (client, ns_a, ns_b, keys) = support::kube::two_clusters("history").await;
    let lease = "shared-key";
    let (a, b): (Api<DistributedLock>, Api<DistributedLock>) = (
        Api::namespaced(client.clone(), &ns_a),
        Api::namespaced(client.clone(), &ns_b),
    );
    a.create(
        &PostParams::default(),
        &shared_key_lock(lease, &keys, false),
    )
    .await
    .expect("cluster-a's lock");
    b.create(&PostParams::default(), &shared_key_lock(lease, &keys, true))
        .await
        .expect("cluster-b's lock");

    // Grant 1 to cluster-a, then four hand-offs, alternating: the taker first asks
    // for the key (and waits), then the holder lets go.
    let mut grants = vec![("cluster-a", held_above(&a, "cluster-a", 0).await)];
    for step in 0..4 {
        let (holder, taker, taker_cluster) = if step % 2 == 0 {
            (&a, &b, "cluster-b")
        } else {
            (&b, &a, "cluster-a")
        };
        set_release(taker, false).await;
        set_release(holder, true).await;
        let previous = grants.last().unwrap().1;
        let fence = held_above(taker, taker_cluster, previous).await;
        grants.push((taker_cluster, fence));
    }
    // cluster-b asks for the key again and waits behind grant 5.
    set_release(&b, false).await;
    let fences: Vec<i64> = grants.iter().map(|(_, f)| *f).collect();
    let first = fences[0];
    assert_eq!(
        fences,
        (first..first + 5).collect::<Vec<_>>(),
        "one grant each"
    );
    let expected: Vec<(String, i64, String)> = grants
        .iter()
        .enumerate()
        .map(|(i, (cluster, fence))| {
            let ended = if i == 4 { "held" } else { "released" };
            (cluster.to_string(), *fence, ended.to_string())
        })
        .collect();

    // cluster-a holds grant 5: its status, written when it acquired, shows all five.
    let holder = a.get("history").await.expect("cluster-a's lock");
    assert_eq!(
        status_grants(&holder),
        expected,
        "cluster-a's status.history"
    );
    // cluster-b waits for the key: the status it writes for the holder it waits for
    // carries the same history.
    let holder_identity = format!("cluster-a/{ns_a}/history");
    let waiting = eventually(
        "cluster-b to wait for cluster-a's grant 5",
        TIMEOUT,
        || async {
            let lock = b.get("history").await.ok()?;
            let status = lock.status.as_ref()?;
            (status.phase == Some(LockPhase::Waiting)
                && status.holder.as_deref() == Some(holder_identity.as_str()))
            .then_some(lock)
        },
    )
    .await;
    assert_eq!(
        status_grants(&waiting),
        expected,
        "cluster-b's status.history"
    );
    let history = waiting.status.unwrap().history.unwrap();
    assert_eq!(history.last().unwrap().holder, holder_identity);

    // The library call (the kubectl plugin's) and `lockwarden status --history`.
    let store = CasLock::new(LeaseStore::new(client.clone(), &keys, lease));
    let from_store = store.history().await.expect("the key's history");
    let tail: Vec<(String, i64, String)> = from_store
        .iter()
        .skip(from_store.len() - 5)
        .map(|g| {
            (
                g.cluster.clone().unwrap_or_default(),
                g.fence.0 as i64,
                g.ended.to_string(),
            )
        })
        .collect();
    assert_eq!(tail, expected, "LockBackend::history");

    let url = format!("k8s://{keys}/{lease}");
    let cli = Cli::kube();
    let out = cli.run(&["status", &url, "--history", "-o", "json"]).await;
    out.ok();
    let doc: Value = serde_json::from_str(&out.stdout).expect("status -o json");
    let entries = doc["history"].as_array().expect("a history array");
    let tail: Vec<(String, i64, String)> = entries
        .iter()
        .skip(entries.len() - 5)
        .map(|g| {
            (
                g["cluster"].as_str().unwrap_or_default().to_string(),
                g["fence"].as_i64().unwrap(),
                g["ended"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(tail, expected, "lockwarden status --history -o json");
    let table = cli.run(&["status", &url, "--history"]).await;
    table.ok();
    assert!(
        table
            .stdout
            .contains("history: last 5 grants, oldest first"),
        "{}",
        table.stdout
    );
}

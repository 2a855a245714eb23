//! Keys with more than one permit through the operator (docs/design.md §6.2): five
//! DistributedLocks with `permits: 2` on one key hold two at a time, and deleting a
//! holder hands its permit to one waiter, on every store; a lock naming other permits
//! goes Failed.

use std::collections::BTreeMap;

use kube::runtime::watcher;
use support::overlap::OverlapWatch;

use super::*;

const PERMITS: usize = 2;
const LOCKS: usize = 5;

/// Holding its permit: Acquired=True, and not being deleted. A deleted lock releases
/// its permit before its finalizer goes, and its last status still says True until the
/// object is gone, so a lock being deleted counts as letting go.
fn holds(lock: &DistributedLock) -> bool {
    acquired(lock) && lock.metadata.deletion_timestamp.is_none()
}

/// The locks of `names` that hold a permit now, and the fence each holds with.
async fn holders(locks: &Api<DistributedLock>, names: &[String]) -> BTreeMap<String, i64> {
    let mut held = BTreeMap::new();
    for name in names {
        if let Ok(Some(lock)) = locks.get_opt(name).await
            && holds(&lock)
        {
            let fence = lock.status.as_ref().and_then(|s| s.fence).unwrap();
            held.insert(name.clone(), fence);
        }
    }
    held
}

/// Waits until exactly [`PERMITS`] of `names` hold and every other one is Waiting with
/// the key's permits all in use; returns the holders with their fences.
async fn two_hold_the_rest_wait(
    locks: &Api<DistributedLock>,
    names: &[String],
) -> BTreeMap<String, i64> {
    eventually(
        &format!("{PERMITS} of {names:?} to hold and the rest to wait"),
        TIMEOUT,
        || async {
            let held = holders(locks, names).await;
            if held.len() != PERMITS {
                return None;
            }
            for name in names.iter().filter(|n| !held.contains_key(*n)) {
                let lock = locks.get(name).await.ok()?;
                let status = lock.status.as_ref()?;
                let full = status.permits_in_use == Some(PERMITS as u32)
                    && status.holders == Some(PERMITS as u32);
                if phase(&lock) != Some(LockPhase::Waiting) || !full {
                    return None;
                }
            }
            Some(held)
        },
    )
    .await
}

/// Five locks with `permits: 2` on the key `backend` names: never more than two hold at
/// once (a watch of every status), exactly two hold while the others wait, and each
/// deletion of a holder hands its permit to one waiter with a higher fence, until
/// every lock has held.
async fn two_permits_among_five(prefix: &str, locks: &Api<DistributedLock>, backend: BackendSpec) {
    let watch = OverlapWatch::at_most(
        PERMITS,
        vec![locks.clone()],
        watcher::Config::default(),
        holds,
    );
    let names: Vec<String> = (0..LOCKS).map(|i| format!("{prefix}-{i}")).collect();
    for name in &names {
        let mut lock = support::locks::lock_on(name, backend.clone(), "30s", "10s");
        lock.spec.permits = PERMITS as u32;
        create(locks, &lock).await;
    }
    let mut remaining = names.clone();
    let mut held_once = BTreeMap::new();
    let mut held = two_hold_the_rest_wait(locks, &remaining).await;
    let first_grants: Vec<i64> = held.values().copied().collect();
    assert_ne!(first_grants[0], first_grants[1], "one fence per grant");
    // Hand permits over until every lock has held one.
    while held_once.len() < LOCKS {
        held_once.extend(held.clone());
        if held_once.len() == LOCKS {
            break;
        }
        let (gone, _) = held.iter().next().map(|(n, f)| (n.clone(), *f)).unwrap();
        let latest = *held.values().max().unwrap();
        let started = Instant::now();
        locks.delete(&gone, &DeleteParams::default()).await.unwrap();
        remaining.retain(|n| *n != gone);
        let stayed: Vec<String> = held.keys().filter(|n| **n != gone).cloned().collect();
        let waiting = remaining.len() - PERMITS;
        eventually(
            &format!("{gone}'s permit to go to one waiter"),
            TIMEOUT,
            || async {
                let now = if waiting == 0 {
                    holders(locks, &remaining).await
                } else {
                    two_hold_the_rest_wait(locks, &remaining).await
                };
                (now.len() == PERMITS).then_some(now)
            },
        )
        .await;
        let now = holders(locks, &remaining).await;
        assert!(
            stayed.iter().all(|n| now.get(n) == held.get(n)),
            "the other holder keeps its permit and fence: before {held:?}, now {now:?}"
        );
        let (newcomer, fence) = now
            .iter()
            .find(|(n, _)| !held.contains_key(*n))
            .expect("a waiter took the permit");
        // Woken by the release (same controller), not by its poll: printed, not asserted.
        eprintln!(
            "{prefix}: {gone}'s permit went to {newcomer} in {} ms",
            started.elapsed().as_millis()
        );
        assert!(
            *fence > latest,
            "{newcomer}'s fence {fence} must exceed every earlier grant ({latest})"
        );
        held = now;
    }
    assert_eq!(
        held_once.len(),
        LOCKS,
        "every lock held a permit: {held_once:?}"
    );
    watch.assert_none();
}

/// The Kubernetes Lease backend (the holder set in the Lease's annotation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_permits_among_five_locks_on_a_lease() {
    let (_client, ns, locks) = setup("ctl-sem-lease").await;
    let backend = BackendSpec {
        kubernetes: Some(lockwarden::api::KubernetesBackend {
            lease_name: "nightly".into(),
            namespace: Some(ns),
        }),
        ..Default::default()
    };
    two_permits_among_five("lease", &locks, backend).await;
}

/// S3 (moto).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_permits_among_five_locks_on_s3() {
    let (locks, moto, secret) = setup_on_moto("ctl-sem-s3").await;
    let bucket = moto.new_bucket("ctl-sem").await;
    let lock = s3_lock(
        "unused",
        &bucket,
        "locks/nightly",
        moto.endpoint(),
        &secret.name,
    );
    two_permits_among_five("s3", &locks, lock.spec.backend).await;
}

/// DynamoDB (moto).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_permits_among_five_locks_on_dynamodb() {
    let (locks, moto, secret) = setup_on_moto("ctl-sem-ddb").await;
    let table = moto.new_table("ctl-sem", "key").await;
    let backend = dynamodb_backend(&table, "nightly", moto.endpoint(), secret);
    two_permits_among_five("ddb", &locks, backend).await;
}

/// ZooKeeper (the first two entries of the queue hold; waiters watch the entries
/// ahead of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_permits_among_five_locks_on_zookeeper() {
    let (_client, _ns, locks) = setup("ctl-sem-zk").await;
    shared_zookeeper().await;
    let path = format!("/{}/nightly", support::unique("ctl-sem"));
    let mut backend = zk_lock("unused", &path).spec.backend;
    // A spelling of the server no other test uses: sessions are per spelling and live
    // on the runtime of the test that opened them (see `zk_lock`).
    let zk = backend.zookeeper.as_mut().expect("a ZooKeeper backend");
    let both = format!(
        "{},{}",
        zk.servers[0],
        zk.servers[0].replace("localhost", "127.0.0.1")
    );
    zk.servers = both.split(',').map(String::from).collect();
    two_permits_among_five("zk", &locks, backend).await;
}

/// A lock naming other permits than the key is held with goes Failed (reason
/// PermitsDisagree) with a message naming both numbers; so does a mutex on that key.
/// The holder keeps its permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_whose_permits_disagree_fails_naming_both() {
    let (_client, _ns, locks) = setup("ctl-sem-disagree").await;
    let mut holder = support::locks::lease_lock("holder", "shared-key");
    holder.spec.permits = 2;
    create(&locks, &holder).await;
    let held = wait_acquired(&locks, "holder", TIMEOUT).await;
    let status = held.status.unwrap();
    assert_eq!(
        (status.holders, status.permits_in_use),
        (Some(1), Some(1)),
        "one holder of the key's two permits"
    );

    for (name, permits, want) in [
        ("three", 3, "held with 2 permits but this lock asks for 3"),
        ("mutex", 1, "held with 2 permits but this lock asks for 1"),
    ] {
        let mut lock = support::locks::lease_lock(name, "shared-key");
        lock.spec.permits = permits;
        create(&locks, &lock).await;
        let failed = wait_phase(&locks, name, LockPhase::Failed, TIMEOUT).await;
        let condition = failed.acquired_condition().unwrap();
        assert_eq!(condition.reason, reason::PERMITS_DISAGREE, "{condition:?}");
        assert!(condition.message.contains(want), "{condition:?}");
    }
    assert!(acquired(&locks.get("holder").await.unwrap()));
}

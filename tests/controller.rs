//! The controller against a real API server, mostly with the Kubernetes-Lease backend
//! (it needs no other server). Each test runs its own controller, in-process or as a
//! `lockwarden controller` process, scoped to the test's own namespace.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use lockwarden::api::conditions::{self, ACQUIRED, reason};
use lockwarden::api::{BackendSpec, DistributedLock, LockPhase};
use lockwarden::backend::LeaseStore;
use lockwarden::controller::{self, ControllerConfig, FINALIZER};
use lockwarden::lock::{AcquireRequest, Attempt, CasLock, LockBackend};
use serde_json::json;
use support::eventually;
use support::kube::{ControlPlane, install_lockwarden_crd as install_crd};
use support::locks::{
    acquired, aws_secret, lease_lock_timed, phase, s3_lock, timed, wait_acquired,
};

/// Generous: the test machine is a loaded 2-core box.
const TIMEOUT: Duration = Duration::from_secs(60);
const CLUSTER: &str = "test-cluster";

/// A client, the CRD, a fresh namespace, and a controller watching that namespace.
async fn setup(prefix: &str) -> (Client, String, Api<DistributedLock>) {
    let (client, namespace) = support::kube::namespace_with_controller(prefix, CLUSTER).await;
    let locks = Api::namespaced(client.clone(), &namespace);
    (client, namespace, locks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn created_lock_is_acquired_with_status() {
    let (_client, ns, locks) = setup("ctl-acquire").await;
    locks
        .create(
            &PostParams::default(),
            &lease_lock_timed("db", "db-lease", "30s", "10s"),
        )
        .await
        .unwrap();
    let lock = wait_acquired(&locks, "db", TIMEOUT).await;
    let status = lock.status.clone().unwrap();
    assert_eq!(status.phase, Some(LockPhase::Held));
    assert_eq!(
        status.holder.as_deref(),
        Some(format!("{CLUSTER}/{ns}/db").as_str())
    );
    assert!(
        status.etag.as_deref().is_some_and(|e| !e.is_empty()),
        "{status:?}"
    );
    assert!(status.fence.is_some_and(|f| f >= 1), "{status:?}");
    assert!(
        status.nonce.is_some() && status.acquired_at.is_some(),
        "{status:?}"
    );
    assert_eq!(status.backend.as_deref(), Some("kubernetes"));
    assert_eq!(
        status.key.as_deref(),
        Some(format!("k8s://{ns}/db-lease").as_str())
    );
    assert_eq!(status.observed_generation, lock.metadata.generation);
    let cond = lock.acquired_condition().unwrap();
    assert_eq!(cond.reason, reason::LEASE_HELD);
    assert_eq!(cond.observed_generation, lock.metadata.generation);
    assert!(lock.finalizers().iter().any(|f| f == FINALIZER));
    // The Lease names the same holder.
    let lease = Api::<Lease>::namespaced(locks.clone().into_client(), &ns)
        .get("db-lease")
        .await
        .unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some(format!("{CLUSTER}/{ns}/db").as_str())
    );
}

/// The one lock of `names` that is Acquired, once all others are Waiting; panics if
/// two are Acquired at once.
async fn sole_holder(locks: &Api<DistributedLock>, names: &[String]) -> DistributedLock {
    eventually("one holder, the others waiting", TIMEOUT, || async {
        let mut holder = None;
        for name in names {
            let lock = locks.get(name).await.ok()?;
            if acquired(&lock) {
                assert!(holder.is_none(), "two locks acquired the same Lease");
                holder = Some(lock);
            } else if phase(&lock) != Some(LockPhase::Waiting) {
                return None;
            }
        }
        holder
    })
    .await
}

/// Locks on one key: exactly one is Acquired, the others Waiting (naming the
/// holder); deleting the holder hands the lock to a waiter, with a higher fence.
/// Three handoffs in a row; the latencies are printed (not asserted).
async fn hand_off_on_delete(
    locks: &Api<DistributedLock>,
    what: &str,
    make: impl Fn(&str) -> DistributedLock,
) {
    let mut names: Vec<String> = (0..4).map(|i| format!("contender-{i}")).collect();
    for name in &names {
        locks
            .create(&PostParams::default(), &make(name))
            .await
            .unwrap();
    }
    let mut latencies = Vec::new();
    let mut holder = sole_holder(locks, &names).await;
    while names.len() > 1 {
        let status = holder.status.clone().unwrap();
        // Waiters learn the new holder when their next attempt reports it (woken by the
        // release), which may be a moment after the new holder's status is written.
        for name in names.iter().filter(|n| **n != holder.name_any()) {
            eventually(
                &format!("{name} to wait on {:?}", status.holder),
                TIMEOUT,
                || async {
                    let waiter = locks.get(name).await.unwrap();
                    let waiting = waiter.acquired_condition()?.reason == reason::WAITING;
                    (waiting && waiter.status?.holder == status.holder).then_some(())
                },
            )
            .await;
        }
        let started = Instant::now();
        locks
            .delete(&holder.name_any(), &DeleteParams::default())
            .await
            .unwrap();
        names.retain(|n| *n != holder.name_any());
        let deadline = started + TIMEOUT;
        let next = 'found: loop {
            let mut held = Vec::new();
            for name in &names {
                let lock = locks.get(name).await.unwrap();
                if acquired(&lock) {
                    held.push(lock);
                }
            }
            assert!(held.len() <= 1, "two locks acquired the same Lease");
            if let Some(lock) = held.pop() {
                break 'found lock;
            }
            assert!(Instant::now() < deadline, "no waiter acquired the lock");
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        latencies.push(started.elapsed());
        assert!(next.status.as_ref().unwrap().fence.unwrap() > status.fence.unwrap());
        eventually("the deleted holder to be gone", TIMEOUT, || async {
            let gone = locks.get_opt(&holder.name_any()).await.ok()?.is_none();
            gone.then_some(())
        })
        .await;
        holder = sole_holder(locks, &names).await;
    }
    let mut sorted = latencies.clone();
    sorted.sort();
    eprintln!(
        "{what} handoff latency (delete request -> next lock's Acquired=True seen by a \
         polling client), ms: {:?}, p50 {}",
        latencies.iter().map(|l| l.as_millis()).collect::<Vec<_>>(),
        sorted[sorted.len() / 2].as_millis()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_one_lease_hand_off_on_delete() {
    let (_client, _ns, locks) = setup("ctl-handoff").await;
    hand_off_on_delete(&locks, "Lease", |name| {
        lease_lock_timed(name, "shared", "30s", "10s")
    })
    .await;
}

/// A ZooKeeper lock on the shared server, spelled `localhost:PORT`. The process-wide
/// ZooKeeper session registry keys sessions by that spelling and a session lives on
/// the runtime of the test that opened it, so each test that uses ZooKeeper spells the
/// server its own way (one runtime per test here; one for the whole process in
/// production).
fn zk_lock(name: &str, path: &str) -> DistributedLock {
    let zk = support::zookeeper::ZooKeeper::shared();
    let mut lock = lease_lock_timed(name, "unused", "30s", "10s");
    lock.spec.backend = BackendSpec {
        zookeeper: Some(lockwarden::api::ZooKeeperBackend {
            servers: zk
                .connect_string()
                .split(',')
                .map(|s| s.replace("127.0.0.1", "localhost"))
                .collect(),
            path: path.to_string(),
            chroot: None,
            session_timeout: None,
        }),
        ..Default::default()
    };
    lock
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_one_znode_hand_off_on_delete() {
    let (_client, _ns, locks) = setup("ctl-zk-handoff").await;
    tokio::task::spawn_blocking(support::zookeeper::ZooKeeper::shared)
        .await
        .unwrap();
    let path = format!("/{}/db", support::unique("ctl"));
    hand_off_on_delete(&locks, "ZooKeeper", |name| zk_lock(name, &path)).await;
}

/// The lease a ZooKeeper lock really gets is its session timeout (10 s), shorter than
/// the default `leaseDuration` (30 s); renewing every `renewInterval` (10 s) would then
/// come after the holder deadline each time and flap the status Held/LeaseExpiring.
/// The holder renews within the granted lease instead, so the object stays untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_lock_with_default_intervals_stays_held_without_status_writes() {
    let (_client, _ns, locks) = setup("ctl-zk-steady").await;
    tokio::task::spawn_blocking(support::zookeeper::ZooKeeper::shared)
        .await
        .unwrap();
    let path = format!("/{}/steady", support::unique("ctl"));
    let mut lock = zk_lock("steady", &path);
    // ZooKeeper sessions are shared per server list and bound to the runtime that
    // opened them, and every test has its own runtime: a spelling of its own.
    let port = support::zookeeper::ZooKeeper::shared().nodes()[0].port();
    lock.spec.backend.zookeeper.as_mut().unwrap().servers =
        vec![format!("localhost:{port}"), format!("127.0.0.1:{port}")];
    locks.create(&PostParams::default(), &lock).await.unwrap();
    let held = wait_acquired(&locks, "steady", TIMEOUT).await;
    let version = held.resource_version().unwrap();
    // Longer than one default renewInterval plus the session's holder deadline.
    let watch_until = Instant::now() + Duration::from_secs(14);
    while Instant::now() < watch_until {
        let lock = locks.get("steady").await.unwrap();
        assert_eq!(
            lock.resource_version().as_deref(),
            Some(version.as_str()),
            "the held ZooKeeper lock was rewritten: {:?}",
            lock.status
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_true_releases_the_lease() {
    let (client, ns, locks) = setup("ctl-release").await;
    locks
        .create(
            &PostParams::default(),
            &lease_lock_timed("job", "job-lease", "30s", "10s"),
        )
        .await
        .unwrap();
    wait_acquired(&locks, "job", TIMEOUT).await;
    locks
        .patch(
            "job",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"release": true}})),
        )
        .await
        .unwrap();
    let released = eventually("the lock to be Released", TIMEOUT, || async {
        locks
            .get("job")
            .await
            .ok()
            .filter(|l| phase(l) == Some(LockPhase::Released))
    })
    .await;
    assert!(!acquired(&released));
    assert_eq!(
        released.acquired_condition().unwrap().reason,
        reason::RELEASED
    );
    let leases = Api::<Lease>::namespaced(client, &ns);
    let lease = leases.get("job-lease").await.unwrap();
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    assert!(
        holder.is_empty(),
        "the Lease still names a holder: {holder:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_cause_no_status_writes() {
    let (client, ns, locks) = setup("ctl-quiet").await;
    locks
        .create(
            &PostParams::default(),
            &lease_lock_timed("quiet", "quiet-lease", "3s", "1s"),
        )
        .await
        .unwrap();
    let held = wait_acquired(&locks, "quiet", TIMEOUT).await;
    let version = held.resource_version().unwrap();
    let leases = Api::<Lease>::namespaced(client, &ns);
    // Watch the Lease being renewed several times; the lock object must not change.
    let mut renewals = 0;
    let mut last_lease = leases.get("quiet-lease").await.unwrap().resource_version();
    let deadline = Instant::now() + TIMEOUT;
    while renewals < 4 {
        assert!(Instant::now() < deadline, "the Lease was not renewed");
        let lease = leases.get("quiet-lease").await.unwrap().resource_version();
        if lease != last_lease {
            renewals += 1;
            last_lease = lease;
        }
        let lock = locks.get("quiet").await.unwrap();
        assert_eq!(
            lock.resource_version().as_deref(),
            Some(version.as_str()),
            "the lock object was written after {renewals} renewals: {:?}",
            lock.status
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("{renewals} Lease renewals, 0 writes to the DistributedLock");
}

/// A lock that cannot get its key within `acquireTimeout` ends `Failed` with reason
/// `AcquireTimeout`, and stays so (it does not acquire later, when the key frees up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_timeout_ends_in_failed() {
    let (_client, _ns, locks) = setup("ctl-timeout").await;
    locks
        .create(
            &PostParams::default(),
            &lease_lock_timed("owner", "busy", "30s", "10s"),
        )
        .await
        .unwrap();
    wait_acquired(&locks, "owner", TIMEOUT).await;
    let mut impatient = lease_lock_timed("impatient", "busy", "30s", "10s");
    impatient.spec.acquire_timeout = Some("2s".into());
    let started = Instant::now();
    locks
        .create(&PostParams::default(), &impatient)
        .await
        .unwrap();
    let failed = eventually("the impatient lock to fail", TIMEOUT, || async {
        locks
            .get("impatient")
            .await
            .ok()
            .filter(|l| phase(l) == Some(LockPhase::Failed))
    })
    .await;
    assert!(started.elapsed() >= Duration::from_secs(2));
    let cond = failed.acquired_condition().unwrap();
    assert_eq!(cond.reason, reason::ACQUIRE_TIMEOUT);
    assert_eq!(cond.status, conditions::FALSE);
    assert!(cond.message.contains("owner"), "{}", cond.message);
    // Events record the owner's acquisition and the failure.
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(
        locks.clone().into_client(),
        failed.metadata.namespace.as_deref().unwrap(),
    );
    eventually("Acquired and Failed events", TIMEOUT, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        let has = |reason: &str, name: &str| {
            list.items.iter().any(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
            })
        };
        (has("Acquired", "owner") && has("Failed", "impatient")).then_some(())
    })
    .await;
}

/// Runs a controller on its own runtime, so that it can be killed the way a crash
/// does: its tasks stop at once, nothing is released.
fn start_crashable_controller(namespace: &str) -> tokio::runtime::Runtime {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let config = ControllerConfig {
        cluster_name: CLUSTER.into(),
        namespace: Some(namespace.to_string()),
        ..Default::default()
    };
    runtime.spawn(async move {
        let client = ControlPlane::shared().client().await;
        let _ = controller::run(client, config).await;
    });
    runtime
}

/// A controller that dies while holding a lock, replaced by another within the
/// lease: the new one resumes the lock from `status.nonce`, with the same fence and
/// nonce, and keeps renewing the Lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_controller_resumes_held_lock() {
    let plane = ControlPlane::shared();
    let client = plane.client().await;
    install_crd(&client).await;
    let ns = plane.namespace(&client, "ctl-resume").await;
    let locks = Api::<DistributedLock>::namespaced(client.clone(), &ns);
    let leases = Api::<Lease>::namespaced(client.clone(), &ns);

    let first = start_crashable_controller(&ns);
    locks
        .create(
            &PostParams::default(),
            &lease_lock_timed("keep", "keep-lease", "10s", "2s"),
        )
        .await
        .unwrap();
    let held = wait_acquired(&locks, "keep", TIMEOUT).await;
    let before = held.status.clone().unwrap();
    first.shutdown_background();
    let crashed_at = leases.get("keep-lease").await.unwrap().resource_version();

    let second = start_crashable_controller(&ns);
    // The new controller renews the Lease: proof that it resumed (nobody else writes it).
    let lease = eventually("the Lease to be renewed again", TIMEOUT, || async {
        let lease = leases.get("keep-lease").await.ok()?;
        (lease.resource_version() != crashed_at).then_some(lease)
    })
    .await;
    let annotations = lease.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get("lockwarden.io/nonce"),
        before.nonce.as_ref(),
        "the Lease no longer carries the resumed nonce"
    );
    assert_eq!(
        lease.spec.as_ref().and_then(|s| s.holder_identity.clone()),
        before.holder
    );
    let after = locks.get("keep").await.unwrap();
    assert!(acquired(&after));
    let status = after.status.clone().unwrap();
    assert_eq!(status.fence, before.fence);
    assert_eq!(status.nonce, before.nonce);
    // Usually no status write at all; on a slow box the resumed lease may be shown
    // LeaseExpiring until its first renewal lands, which is a real transition.
    if after.resource_version() != held.resource_version() {
        eprintln!("resuming wrote the status (a slow first renewal)");
    }
    second.shutdown_background();
}

/// `spec.force` takes a held lock over (reason `Forced`, a Warning Event); the
/// previous holder learns at its next renewal and ends `Lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_takes_over_and_the_old_holder_is_lost() {
    let (client, ns, locks) = setup("ctl-force").await;
    locks
        .create(
            &PostParams::default(),
            &lease_lock_timed("old", "contested", "6s", "1s"),
        )
        .await
        .unwrap();
    let old = wait_acquired(&locks, "old", TIMEOUT).await;
    let mut forcer = lease_lock_timed("new", "contested", "6s", "1s");
    forcer.spec.force = true;
    locks.create(&PostParams::default(), &forcer).await.unwrap();
    let new = wait_acquired(&locks, "new", TIMEOUT).await;
    assert_eq!(new.acquired_condition().unwrap().reason, reason::FORCED);
    assert!(new.status.unwrap().fence > old.status.unwrap().fence);
    let lost = eventually("the old holder to be Lost", TIMEOUT, || async {
        locks
            .get("old")
            .await
            .ok()
            .filter(|l| phase(l) == Some(LockPhase::Lost))
    })
    .await;
    assert!(!acquired(&lost));
    assert_eq!(lost.acquired_condition().unwrap().reason, reason::LOST);
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client, &ns);
    eventually("a Warning Forced event", TIMEOUT, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| e.reason.as_deref() == Some("Forced") && e.type_.as_deref() == Some("Warning"))
            .then_some(())
    })
    .await;
}

/// Creates `lock` and checks it reaches Acquired=True with every status field set.
async fn assert_acquires(locks: &Api<DistributedLock>, lock: DistributedLock, kind: &str) {
    let name = lock.name_any();
    locks.create(&PostParams::default(), &lock).await.unwrap();
    let held = wait_acquired(locks, &name, TIMEOUT).await;
    let status = held.status.unwrap();
    assert_eq!(status.phase, Some(LockPhase::Held));
    assert_eq!(status.backend.as_deref(), Some(kind));
    assert_eq!(status.key, Some(lock.lock_key().unwrap()));
    assert!(
        status
            .holder
            .as_deref()
            .is_some_and(|h| h.ends_with(&format!("/{name}")))
    );
    assert!(
        status.etag.as_deref().is_some_and(|e| !e.is_empty()),
        "{status:?}"
    );
    assert!(status.fence.is_some_and(|f| f >= 1), "{status:?}");
    assert!(status.nonce.is_some(), "{status:?}");
}

/// S3 and DynamoDB (moto, credentials from a Secret in the lock's namespace) and
/// ZooKeeper: each lock reaches Acquired=True with its status filled in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_every_backend_are_acquired() {
    let (client, ns, locks) = setup("ctl-backends").await;
    let moto = tokio::task::spawn_blocking(support::moto::Moto::shared)
        .await
        .unwrap();
    let secret = aws_secret(&client, &ns).await;
    let bucket = moto.new_bucket("ctl").await;
    let table = moto.new_table("ctl", "key").await;
    let zk = tokio::task::spawn_blocking(support::zookeeper::ZooKeeper::shared)
        .await
        .unwrap();

    let s3 = s3_lock("on-s3", &bucket, "locks/db", moto.endpoint(), &secret.name);
    let mut dynamo = lease_lock_timed("on-dynamodb", "unused", "30s", "10s");
    dynamo.spec.backend = BackendSpec {
        dynamodb: Some(lockwarden::api::DynamoDbBackend {
            table,
            key: "db".into(),
            region: Some(support::moto::REGION.into()),
            endpoint: Some(moto.endpoint()),
            credentials_secret_ref: Some(secret),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut zookeeper = lease_lock_timed("on-zookeeper", "unused", "30s", "10s");
    zookeeper.spec.backend = BackendSpec {
        zookeeper: Some(lockwarden::api::ZooKeeperBackend {
            servers: zk.connect_string().split(',').map(String::from).collect(),
            path: format!("/{}/db", support::unique("ctl")),
            chroot: None,
            session_timeout: None,
        }),
        ..Default::default()
    };
    for (lock, kind) in [(s3, "s3"), (dynamo, "dynamodb"), (zookeeper, "zookeeper")] {
        let started = Instant::now();
        assert_acquires(&locks, lock, kind).await;
        eprintln!(
            "{kind}: Acquired=True after {} ms",
            started.elapsed().as_millis()
        );
    }
}

/// Two clusters (two API servers, one controller each, different cluster names)
/// contend for one S3 key: exactly one holds; deleting it lets the other cluster's
/// lock acquire, found by its polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_on_two_api_servers_exclude_each_other_on_one_key() {
    // Two clusters: the shared API server and one of this test's own, each with its
    // own controller, sharing only the S3 key.
    let east = ControlPlane::shared();
    let west = tokio::task::spawn_blocking(ControlPlane::start)
        .await
        .unwrap();
    let east_client = east.client().await;
    let west_client = west.client().await;
    install_crd(&east_client).await;
    install_crd(&west_client).await;
    let moto = tokio::task::spawn_blocking(support::moto::Moto::shared)
        .await
        .unwrap();
    let bucket = moto.new_bucket("ctl-clusters").await;
    let path = format!("s3://{bucket}/locks/db");
    let mut apis = Vec::new();
    for (cluster, plane, client) in [("east", east, east_client), ("west", &west, west_client)] {
        let ns = plane.namespace(&client, &format!("ctl-{cluster}")).await;
        let config = ControllerConfig {
            cluster_name: cluster.into(),
            namespace: Some(ns.clone()),
            ..Default::default()
        };
        tokio::spawn(controller::run(client.clone(), config));
        let locks = Api::<DistributedLock>::namespaced(client.clone(), &ns);
        let secret = aws_secret(&client, &ns).await;
        let lock = s3_lock("db", &bucket, "locks/db", moto.endpoint(), &secret.name);
        locks.create(&PostParams::default(), &lock).await.unwrap();
        apis.push(locks);
    }
    let deadline = Instant::now() + TIMEOUT;
    let (holder, waiter) = loop {
        let a = apis[0].get("db").await.unwrap();
        let b = apis[1].get("db").await.unwrap();
        match (acquired(&a), acquired(&b)) {
            (true, true) => panic!("both clusters hold {path}"),
            (true, false) if phase(&b) == Some(LockPhase::Waiting) => break (0, 1),
            (false, true) if phase(&a) == Some(LockPhase::Waiting) => break (1, 0),
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "no state with one cluster holding and one waiting: {:?} / {:?}",
            a.status,
            b.status
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    let started = Instant::now();
    apis[holder]
        .delete("db", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the other cluster to acquire", TIMEOUT, || async {
        let other = apis[waiter].get("db").await.ok()?;
        if let Ok(Some(first)) = apis[holder].get_opt("db").await {
            assert!(
                !(acquired(&first) && acquired(&other)),
                "both clusters hold {path}"
            );
        }
        acquired(&other).then_some(())
    })
    .await;
    eprintln!(
        "cross-cluster handoff (polling): {} ms",
        started.elapsed().as_millis()
    );
}

/// Rule 2 through the operator: with the backend unreachable (a partitioning proxy in
/// front of S3), `Acquired` turns False with reason LeaseExpiring, and True again when
/// the proxy heals in time. In a second partition a contender on the same key takes
/// over; by the time it holds the lock, the status must already say False.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_backend_turns_acquired_false_before_the_lease_expires() {
    let (client, ns, locks) = setup("ctl-partition").await;
    let moto = tokio::task::spawn_blocking(support::moto::Moto::shared)
        .await
        .unwrap();
    let secret = aws_secret(&client, &ns).await;
    let bucket = moto.new_bucket("ctl-partition").await;
    let proxy = support::proxy::Proxy::start(moto.port());
    let lock = timed(
        s3_lock(
            "partitioned",
            &bucket,
            "locks/partitioned",
            proxy.endpoint(),
            &secret.name,
        ),
        "6s",
        "2s",
    );
    locks.create(&PostParams::default(), &lock).await.unwrap();
    let held = wait_acquired(&locks, "partitioned", TIMEOUT).await;
    let fence = held.status.as_ref().and_then(|s| s.fence);
    let acquired_condition = |lock: &DistributedLock| {
        let status = lock.status.as_ref()?;
        conditions::find_condition(&status.conditions, ACQUIRED).cloned()
    };

    // 1. Partition, see LeaseExpiring, heal: the same acquisition is held again.
    proxy.set_mode(support::proxy::Mode::Blackhole);
    let partitioned = Instant::now();
    let reason = eventually("Acquired=False while partitioned", TIMEOUT, || async {
        let cond = acquired_condition(&locks.get("partitioned").await.ok()?)?;
        (cond.status == "False").then_some(cond.reason)
    })
    .await;
    assert_eq!(reason, conditions::reason::LEASE_EXPIRING);
    eprintln!(
        "Acquired=False {:?} after the partition (lease 6s)",
        partitioned.elapsed()
    );
    proxy.set_mode(support::proxy::Mode::Pass);
    let back = wait_acquired(&locks, "partitioned", TIMEOUT).await;
    assert_eq!(
        back.status.as_ref().and_then(|s| s.fence),
        fence,
        "the same acquisition recovers"
    );

    // 2. Partition again while a contender (reaching S3 directly) waits for the lease to
    // be observed expired and takes over.
    proxy.set_mode(support::proxy::Mode::Blackhole);
    let partitioned = Instant::now();
    let s3 = moto.s3_client().await;
    let contender = lockwarden::lock::CasLock::new(lockwarden::backend::S3Store::new(
        s3,
        &bucket,
        "locks/partitioned",
    ));
    let req = lockwarden::lock::AcquireRequest::new("contender", Duration::from_secs(30));
    let taken = lockwarden::lock::acquire(&contender, &req, lockwarden::lock::Wait::For(TIMEOUT))
        .await
        .expect("the contender takes over after the lease");
    let status_then =
        acquired_condition(&locks.get("partitioned").await.unwrap()).expect("a condition");
    eprintln!(
        "contender took over {:?} after the partition",
        partitioned.elapsed()
    );
    assert_eq!(
        status_then.status,
        "False",
        "the contender holds the lock (fence {}) while the DistributedLock still claims it: {status_then:?}",
        taken.fence()
    );
    assert!(taken.fence().0 as i64 > fence.unwrap_or(0));
    proxy.set_mode(support::proxy::Mode::Pass);
}

/// A `lockwarden controller` process, killed (SIGKILL) on drop.
struct ControllerProcess(std::process::Child);

impl ControllerProcess {
    fn start(kubeconfig: &std::path::Path, namespace: &str) -> Self {
        Self::start_with(kubeconfig, namespace, &[])
    }

    fn start_with(kubeconfig: &std::path::Path, namespace: &str, extra: &[&str]) -> Self {
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_lockwarden"))
            .args([
                "controller",
                "--cluster-name",
                CLUSTER,
                "--watch-namespace",
                namespace,
            ])
            // Each process its own free port: several run side by side here.
            .args(["--metrics-address", "127.0.0.1:0"])
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start lockwarden controller");
        ControllerProcess(child)
    }

    fn kill(&mut self) {
        let _ = self.0.kill(); // SIGKILL: nothing is released, nothing is flushed
        let _ = self.0.wait();
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// SIGKILL the controller process while it holds a lock and start it again within the
/// lease: the lock is still held with the same nonce and fence, the new process renews
/// it, and a contender polling the Lease meanwhile never acquires it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_controller_restarted_within_the_lease_keeps_the_lock() {
    let plane = ControlPlane::shared();
    let client = plane.client().await;
    install_crd(&client).await;
    let ns = plane.namespace(&client, "ctl-sigkill").await;
    let locks = Api::<DistributedLock>::namespaced(client.clone(), &ns);
    let mut controller = ControllerProcess::start(plane.kubeconfig_path(), &ns);
    locks
        .create(
            &PostParams::default(),
            &lease_lock_timed("db", "db-lease", "15s", "3s"),
        )
        .await
        .unwrap();
    let before = wait_acquired(&locks, "db", TIMEOUT).await.status.unwrap();

    // A contender on the same Lease, trying all along.
    let stop = Arc::new(AtomicBool::new(false));
    let contender = {
        let (client, ns, stop) = (client.clone(), ns.clone(), stop.clone());
        tokio::spawn(async move {
            let lock = CasLock::new(LeaseStore::new(client, &ns, "db-lease"));
            let req = AcquireRequest::new("contender", Duration::from_secs(15));
            let mut attempts = 0;
            while !stop.load(Ordering::SeqCst) {
                if let Ok(Attempt::Acquired(lease)) = lock.try_acquire(&req).await {
                    panic!(
                        "the contender acquired during the restart (fence {})",
                        lease.fence()
                    );
                }
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            attempts
        })
    };

    let leases = Api::<Lease>::namespaced(client.clone(), &ns);
    controller.kill();
    // Read after the kill, so that only the new process can change it.
    let version_at_kill = leases
        .get("db-lease")
        .await
        .unwrap()
        .metadata
        .resource_version;
    let restarted = Instant::now();
    let _controller = ControllerProcess::start(plane.kubeconfig_path(), &ns);
    eventually(
        "the restarted controller to renew the Lease",
        TIMEOUT,
        || async {
            let lease = leases.get("db-lease").await.ok()?;
            (lease.metadata.resource_version != version_at_kill).then_some(())
        },
    )
    .await;
    eprintln!(
        "renewed by the new process {:?} after the restart",
        restarted.elapsed()
    );
    let after = wait_acquired(&locks, "db", TIMEOUT).await.status.unwrap();
    assert_eq!(after.nonce, before.nonce, "the same acquisition is resumed");
    assert_eq!(after.fence, before.fence);
    let lease = leases.get("db-lease").await.unwrap();
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        before.holder.as_deref()
    );
    stop.store(true, Ordering::SeqCst);
    let attempts = contender.await.expect("the contender never acquired");
    assert!(attempts > 0);
}

/// HA: two `lockwarden controller --leader-elect` replicas, one active. SIGKILL the
/// leader: the standby is elected and resumes the held lock (same nonce and fence)
/// and renews it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_replica_takes_over_and_resumes_held_locks() {
    let plane = ControlPlane::shared();
    let client = plane.client().await;
    install_crd(&client).await;
    let ns = plane.namespace(&client, "ctl-ha").await;
    let locks = Api::<DistributedLock>::namespaced(client.clone(), &ns);
    let replica = |identity: &str| {
        ControllerProcess::start_with(
            plane.kubeconfig_path(),
            &ns,
            &[
                "--leader-elect",
                "--leader-election-namespace",
                &ns,
                "--leader-election-lease-duration",
                "3s",
                "--leader-election-identity",
                identity,
            ],
        )
    };
    let mut replicas = vec![("a", replica("a")), ("b", replica("b"))];
    locks
        .create(
            &PostParams::default(),
            &lease_lock_timed("db", "db-lease", "20s", "4s"),
        )
        .await
        .unwrap();
    let before = wait_acquired(&locks, "db", TIMEOUT).await.status.unwrap();

    let leases = Api::<Lease>::namespaced(client.clone(), &ns);
    let holder_of = |name: &'static str| {
        let leases = leases.clone();
        async move {
            leases
                .get(name)
                .await
                .ok()
                .and_then(|l| l.spec?.holder_identity)
                .filter(|h| !h.is_empty())
        }
    };
    let leader = eventually("a leader", TIMEOUT, || holder_of("lockwarden-controller")).await;
    let index = replicas
        .iter()
        .position(|(id, _)| *id == leader)
        .expect("a replica leads");
    let (_, mut killed) = replicas.remove(index);
    killed.kill();
    let version_at_kill = leases
        .get("db-lease")
        .await
        .unwrap()
        .metadata
        .resource_version;
    let killed_at = Instant::now();

    let standby = replicas[0].0;
    eventually("the standby to be elected", TIMEOUT, || async {
        (holder_of("lockwarden-controller").await.as_deref() == Some(standby)).then_some(())
    })
    .await;
    eventually("the new leader to renew the held lock", TIMEOUT, || async {
        let lease = leases.get("db-lease").await.ok()?;
        (lease.metadata.resource_version != version_at_kill).then_some(())
    })
    .await;
    eprintln!(
        "standby {standby} renewed the lock {:?} after the leader was killed",
        killed_at.elapsed()
    );
    let after = wait_acquired(&locks, "db", TIMEOUT).await.status.unwrap();
    assert_eq!(after.nonce, before.nonce, "the same acquisition is resumed");
    assert_eq!(after.fence, before.fence);
}

/// An API server that cannot be reached when the controller starts (restarting, a
/// network blip) is waited for: the controller keeps trying and then works, instead of
/// exiting with "is the CRD installed…" as if the CRD were missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_waits_for_an_unreachable_api_server_at_start() {
    let plane = ControlPlane::shared();
    let client = plane.client().await;
    install_crd(&client).await;
    let ns = plane.namespace(&client, "ctl-api-down").await;

    let proxy = support::proxy::Proxy::start(plane.port());
    proxy.set_mode(support::proxy::Mode::Refuse);
    let kubeconfig = kube::config::Kubeconfig::read_from(plane.kubeconfig_path()).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    config.cluster_url = format!("https://127.0.0.1:{}", proxy.port())
        .parse()
        .unwrap();
    let through_proxy = Client::try_from(config).unwrap();
    let controller = tokio::spawn(controller::run(
        through_proxy,
        ControllerConfig {
            cluster_name: CLUSTER.into(),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
    ));

    // A controller that gave up after the first refusal never connects twice.
    eventually(
        "the controller to retry the refused API server",
        TIMEOUT,
        || async { (proxy.accepted() >= 3).then_some(()) },
    )
    .await;
    assert!(
        !controller.is_finished(),
        "the controller exited while the API server was unreachable: {:?}",
        controller.await
    );

    proxy.set_mode(support::proxy::Mode::Pass);
    let locks: Api<DistributedLock> = Api::namespaced(client, &ns);
    locks
        .create(
            &PostParams::default(),
            &lease_lock_timed("late", "late-lease", "30s", "10s"),
        )
        .await
        .unwrap();
    wait_acquired(&locks, "late", TIMEOUT).await;
    controller.abort();
}

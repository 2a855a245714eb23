//! One lock's life under the in-process controller: acquired with status, released,
//! renewed without status writes, timed out, forced.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn created_lock_is_acquired_with_status() {
    let (_client, ns, locks) = setup("ctl-acquire").await;
    create(&locks, &lease_lock_timed("db", "db-lease", "30s", "10s")).await;
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

/// The lease a ZooKeeper lock really gets is its session timeout (10 s), shorter than
/// the default `leaseDuration` (30 s); renewing every `renewInterval` (10 s) would then
/// come after the holder deadline each time and flap the status Held/LeaseExpiring.
/// The holder renews within the granted lease instead, so the object stays untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_lock_with_default_intervals_stays_held_without_status_writes() {
    let (_client, _ns, locks) = setup("ctl-zk-steady").await;
    shared_zookeeper().await;
    let path = format!("/{}/steady", support::unique("ctl"));
    let mut lock = zk_lock("steady", &path);
    // ZooKeeper sessions are shared per server list and bound to the runtime that
    // opened them, and every test has its own runtime: a spelling of its own.
    let port = support::zookeeper::ZooKeeper::shared().nodes()[0].port();
    lock.spec.backend.zookeeper.as_mut().unwrap().servers =
        vec![format!("localhost:{port}"), format!("127.0.0.1:{port}")];
    create(&locks, &lock).await;
    let held = wait_acquired(&locks, "steady", TIMEOUT).await;
    let version = held.resource_version().unwrap();
    // Longer than one default renewInterval plus the session's holder deadline.
    let watch_until = Instant::now() + Duration::from_secs(14);
    while Instant::now() < watch_until {
        assert_unwritten(
            &locks,
            "steady",
            &version,
            "while the ZooKeeper lock is held",
        )
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Fails unless lock `name` is still at resourceVersion `version` (nothing wrote the
/// object); `when` says when it was looked at.
async fn assert_unwritten(locks: &Api<DistributedLock>, name: &str, version: &str, when: &str) {
    let lock = locks.get(name).await.unwrap();
    assert_eq!(
        lock.resource_version().as_deref(),
        Some(version),
        "{name} was written {when}: {:?}",
        lock.status
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_true_releases_the_lease() {
    let (client, ns, locks) = setup("ctl-release").await;
    create(&locks, &lease_lock_timed("job", "job-lease", "30s", "10s")).await;
    wait_acquired(&locks, "job", TIMEOUT).await;
    patch_spec(&locks, "job", json!({"release": true})).await;
    let released = wait_phase(&locks, "job", LockPhase::Released, TIMEOUT).await;
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
    create(
        &locks,
        &lease_lock_timed("quiet", "quiet-lease", "3s", "1s"),
    )
    .await;
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
        let after = format!("after {renewals} renewals");
        assert_unwritten(&locks, "quiet", &version, &after).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("{renewals} Lease renewals, 0 writes to the DistributedLock");
}

/// A lock that cannot get its key within `acquireTimeout` ends `Failed` with reason
/// `AcquireTimeout`, and stays so (it does not acquire later, when the key frees up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_timeout_ends_in_failed() {
    let (_client, _ns, locks) = setup("ctl-timeout").await;
    create(&locks, &lease_lock_timed("owner", "busy", "30s", "10s")).await;
    wait_acquired(&locks, "owner", TIMEOUT).await;
    let mut impatient = lease_lock_timed("impatient", "busy", "30s", "10s");
    impatient.spec.acquire_timeout = Some("2s".into());
    let started = Instant::now();
    locks
        .create(&PostParams::default(), &impatient)
        .await
        .unwrap();
    let failed = wait_phase(&locks, "impatient", LockPhase::Failed, TIMEOUT).await;
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

/// `spec.force` takes a held lock over (reason `Forced`, a Warning Event); the
/// previous holder learns at its next renewal and ends `Lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_takes_over_and_the_old_holder_is_lost() {
    let (client, ns, locks) = setup("ctl-force").await;
    create(&locks, &lease_lock_timed("old", "contested", "6s", "1s")).await;
    let old = wait_acquired(&locks, "old", TIMEOUT).await;
    let mut forcer = lease_lock_timed("new", "contested", "6s", "1s");
    forcer.spec.force = true;
    create(&locks, &forcer).await;
    let new = wait_acquired(&locks, "new", TIMEOUT).await;
    assert_eq!(new.acquired_condition().unwrap().reason, reason::FORCED);
    assert!(new.status.unwrap().fence > old.status.unwrap().fence);
    let lost = wait_phase(&locks, "old", LockPhase::Lost, TIMEOUT).await;
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

//! Locks on S3, DynamoDB and ZooKeeper; two clusters on one key; an unreachable
//! backend (rule 2 through the operator).

use super::*;

/// Creates `lock` and checks it reaches Acquired=True with every status field set.
async fn assert_acquires(locks: &Api<DistributedLock>, lock: DistributedLock, kind: &str) {
    let name = lock.name_any();
    create(locks, &lock).await;
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
    let (locks, moto, secret) = setup_on_moto("ctl-backends").await;
    let bucket = moto.new_bucket("ctl").await;
    let table = moto.new_table("ctl", "key").await;
    let zk = shared_zookeeper().await;

    let s3 = s3_lock("on-s3", &bucket, "locks/db", moto.endpoint(), &secret.name);
    let mut dynamo = lease_lock_timed("on-dynamodb", "unused", "30s", "10s");
    dynamo.spec.backend = dynamodb_backend(&table, "db", moto.endpoint(), secret);
    let mut zookeeper = lease_lock_timed("on-zookeeper", "unused", "30s", "10s");
    let path = format!("/{}/db", support::unique("ctl"));
    zookeeper.spec.backend = zookeeper_backend(&zk.connect_string(), &path);
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
    let moto = shared_moto().await;
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
        create(&locks, &lock).await;
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
    let first = apis[holder].get("db").await.unwrap();
    let first_fence = first
        .status
        .and_then(|s| s.fence)
        .expect("the holder's fence");
    let started = Instant::now();
    apis[holder]
        .delete("db", &DeleteParams::default())
        .await
        .unwrap();
    // Once deleted, the first object's status is no longer a claim: the controller
    // releases in the store, then removes its finalizer without rewriting the status,
    // so for a moment it can still say Acquired=True after the other cluster took over.
    // Order in the store is what counts, and the fence shows it: the other cluster's
    // acquisition must come after the first's (rule 3).
    let taken = eventually("the other cluster to acquire", TIMEOUT, || async {
        let other = apis[waiter].get("db").await.ok()?;
        acquired(&other).then_some(other)
    })
    .await;
    let second_fence = taken
        .status
        .and_then(|s| s.fence)
        .expect("the new holder's fence");
    assert!(
        second_fence > first_fence,
        "{path}: the other cluster's fence {second_fence} is not after the first's {first_fence} (rule 3)"
    );
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
    let (locks, moto, secret) = setup_on_moto("ctl-partition").await;
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
    create(&locks, &lock).await;
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

/// A lock created while its store does not serve yet (ZooKeeper behind a proxy that
/// resets every connection): the controller keeps trying for its connect timeout
/// without reporting `BackendError`, and acquires once the store serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_created_while_its_store_starts_is_acquired_without_a_backend_error() {
    use support::proxy::{Mode, Proxy};
    let (_client, _ns, locks) = setup("ctl-late-store").await;
    let zk = shared_zookeeper().await;
    let proxy = Proxy::start(zk.nodes()[0].port());
    proxy.set_mode(Mode::Refuse);
    let mut lock = zk_lock("late", &format!("/{}/db", support::unique("ctl-late")));
    // The proxy's own port: a spelling no other test uses (sessions are per spelling).
    lock.spec.backend.zookeeper.as_mut().unwrap().servers = vec![proxy.address()];
    create(&locks, &lock).await;
    let started = Instant::now();
    loop {
        let status = locks.get("late").await.unwrap().status.unwrap_or_default();
        assert!(
            status
                .conditions
                .iter()
                .all(|c| c.reason != reason::BACKEND_ERROR),
            "reported {:?} while the store was starting",
            status.conditions
        );
        if proxy.accepted() > 0 && started.elapsed() >= Duration::from_secs(2) {
            break;
        }
        assert!(started.elapsed() < TIMEOUT, "the controller never tried");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    proxy.set_mode(Mode::Pass);
    wait_acquired(&locks, "late", TIMEOUT).await;
}

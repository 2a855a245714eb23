//! The ZooKeeper backend against a real ZooKeeper: the queue recipe (mutual exclusion,
//! FIFO, handoff by watch), session liveness (renewal, expiry, a disconnect ends the
//! claim), foreign queue members, lost replies and resume; and keys with more than one
//! holder (semaphores, shared/exclusive).

use lockwarden_testsupport as support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockwarden::backend::{ZkLock, ZkSessions};
use lockwarden::lock::{
    AcquireRequest, Attempt, FenceToken, HeldLock, HolderState, Lease, LockBackend, LockError,
    LockRecord, LockState, LostReason, Mode as PermitMode, Permits, Queueing, RenewPolicy, Wait,
    acquire,
};
use rand::Rng;
use tokio::time::Instant;
use zookeeper_client::{Acls, Client, CreateMode};

use support::proxy::{Mode, Proxy};
use support::zookeeper::ZooKeeper;
use support::{eventually, unique};

/// Deadline for anything that should happen "promptly" on a loaded 2-core machine.
const PROMPTLY: Duration = Duration::from_secs(30);

/// A fresh lock path per test, two levels deep so parents are created too.
fn lock_path(test: &str) -> String {
    format!("/lockwarden-test/{}", unique(test))
}

fn request(holder: &str) -> AcquireRequest {
    AcquireRequest::new(holder, Duration::from_secs(10))
}

async fn raw_client() -> Client {
    ZooKeeper::shared().connect().await
}

/// `N` contenders for `path` on one new session (as in one process).
fn on_one_session<const N: usize>(path: &str) -> [ZkLock; N] {
    let sessions = ZkSessions::new();
    let connect = ZooKeeper::shared().connect_string();
    std::array::from_fn(|_| sessions.lock(&connect, path).expect("a valid lock path"))
}

/// A contender for `path` on a session of its own (as another process's).
fn on_own_session(path: &str) -> ZkLock {
    let [lock] = on_one_session(path);
    lock
}

/// A raw client, and `path` created (to put foreign children in it).
async fn raw_client_with(path: &str) -> Client {
    let raw = raw_client().await;
    raw.mkdir(path, &CreateMode::Persistent.with_acls(Acls::anyone_all()))
        .await
        .unwrap();
    raw
}

async fn expect_acquired(lock: &ZkLock, holder: &str) -> Lease {
    expect_granted(lock, &request(holder)).await
}

/// `(holder record, queue position)` of a busy attempt.
async fn expect_busy(lock: &ZkLock, holder: &str) -> (LockRecord, Option<u32>) {
    expect_waiting(lock, &request(holder)).await
}

async fn children(raw: &Client, path: &str) -> Vec<String> {
    let mut names = raw.list_children(path).await.expect("list lock children");
    names.sort();
    names
}

// ---------------------------------------------------------------- safety

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_exclusion_under_contention() {
    const CONTENDERS: usize = 16;
    const ROUNDS: usize = 100;
    let zk = ZooKeeper::shared();
    let path = lock_path("contention");
    // Two sessions, as two processes would have; each shared by half the contenders
    // (so contenders on one session are told apart by their protected names).
    let registries = [ZkSessions::new(), ZkSessions::new()];
    let holding = Arc::new(AtomicBool::new(false));
    let fences = Arc::new(Mutex::new(Vec::<FenceToken>::new()));
    let started = Instant::now();

    let mut tasks = Vec::new();
    for i in 0..CONTENDERS {
        let lock: Arc<dyn LockBackend> = Arc::new(
            registries[i % 2]
                .lock(&zk.connect_string(), &path)
                .expect("lock"),
        );
        let (holding, fences) = (holding.clone(), fences.clone());
        tasks.push(tokio::spawn(async move {
            let req = request(&format!("contender-{i}"));
            for round in 0..ROUNDS {
                let lease = acquire(&*lock, &req, Wait::Forever)
                    .await
                    .unwrap_or_else(|e| panic!("contender {i} round {round}: {e}"));
                assert!(
                    !holding.swap(true, Ordering::SeqCst),
                    "contender {i} acquired (fence {}) while another contender held the lock",
                    lease.fence()
                );
                {
                    let mut fences = fences.lock().unwrap();
                    if let Some(last) = fences.last() {
                        assert!(
                            lease.fence() > *last,
                            "fence went from {last} to {} (contender {i})",
                            lease.fence()
                        );
                    }
                    fences.push(lease.fence());
                }
                // Hold for a moment so that an overlapping holder would be caught.
                let hold = rand::rng().random_range(0..1500);
                tokio::time::sleep(Duration::from_micros(hold)).await;
                holding.store(false, Ordering::SeqCst);
                lock.release(&lease)
                    .await
                    .unwrap_or_else(|e| panic!("contender {i} round {round}: release: {e}"));
            }
        }));
    }
    let all = futures::future::join_all(tasks);
    let results = tokio::time::timeout(Duration::from_secs(600), all)
        .await
        .expect("contenders did not finish within 10 minutes");
    for result in results {
        result.expect("contender task");
    }
    let acquisitions = fences.lock().unwrap().len();
    assert_eq!(acquisitions, CONTENDERS * ROUNDS);
    eprintln!(
        "{acquisitions} acquisitions by {CONTENDERS} contenders on 2 sessions in {:?}",
        started.elapsed()
    );
    let raw = raw_client().await;
    assert!(
        children(&raw, &path).await.is_empty(),
        "every queue entry was deleted on release"
    );
}

/// Rule 8 has nowhere to live on ZooKeeper: the engine refuses a lock-delay with one
/// clear error, and leaves no queue entry behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule8_a_lock_delay_is_refused_on_zookeeper() {
    let zk = ZooKeeper::shared();
    let path = lock_path("lock-delay");
    let sessions = ZkSessions::new();
    let lock = sessions.lock(&zk.connect_string(), &path).expect("lock");
    let req = AcquireRequest {
        lock_delay: Duration::from_secs(30),
        ..request("delayed")
    };
    let err = lock.try_acquire(&req).await.expect_err("refused");
    let message = err.to_string();
    assert!(
        matches!(err, LockError::Backend { .. })
            && message.contains("a lock-delay is not supported on ZooKeeper"),
        "{message}"
    );
    assert!(!message.contains('\n'), "one line: {message}");
    let raw = raw_client().await;
    let queued = raw.list_children(&path).await.unwrap_or_default();
    assert!(queued.is_empty(), "no entry was queued: {queued:?}");
    // Without a delay the same key is taken as always.
    expect_acquired(&lock, "plain").await;
}

/// docs/design.md §6.4 on ZooKeeper: a queued request is an entry like any other (the
/// entries' order is the queue), mixed with unqueued ones; a priority or a weight is
/// refused before any entry is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_is_an_entry_in_order_and_a_priority_is_refused() {
    let zk = ZooKeeper::shared();
    let path = lock_path("queued");
    let sessions = [ZkSessions::new(), ZkSessions::new(), ZkSessions::new()];
    let lock = |i: usize| sessions[i].lock(&zk.connect_string(), &path).unwrap();
    let queued = |holder: &str, queueing: Queueing| AcquireRequest {
        queue: Some(queueing),
        ..request(holder)
    };
    let (holder, first, second) = (lock(0), lock(1), lock(2));
    let held = match holder
        .try_acquire(&queued("holder", Queueing::default()))
        .await
    {
        Ok(Attempt::Acquired(lease)) => lease,
        other => panic!("the queued holder should acquire: {other:?}"),
    };
    match first
        .try_acquire(&queued("first", Queueing::default()))
        .await
    {
        Ok(Attempt::Busy { queue_position, .. }) => assert_eq!(queue_position, Some(0)),
        other => panic!("first should queue: {other:?}"),
    }
    assert_eq!(expect_busy(&second, "second").await.1, Some(1));
    let ranked = Queueing {
        priority: 5,
        weight: 1,
    };
    let err = lock(0)
        .try_acquire(&queued("ranked", ranked))
        .await
        .expect_err("a priority is refused");
    assert!(
        matches!(err, LockError::Backend { .. })
            && err.to_string().contains("not supported on ZooKeeper"),
        "{err}"
    );
    let raw = raw_client().await;
    assert_eq!(
        raw.list_children(&path).await.unwrap().len(),
        3,
        "no entry for it"
    );
    holder.release(&held).await.expect("release");
    let granted = acquire(
        &first,
        &queued("first", Queueing::default()),
        Wait::For(PROMPTLY),
    )
    .await
    .expect("first in the entries' order");
    assert_eq!(expect_busy(&second, "second").await.1, Some(0));
    first.release(&granted).await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_order_of_waiters_is_kept() {
    const WAITERS: usize = 5;
    let zk = ZooKeeper::shared();
    let path = lock_path("fifo");
    let registries = [ZkSessions::new(), ZkSessions::new()];
    let holder = registries[0].lock(&zk.connect_string(), &path).unwrap();
    let held = expect_acquired(&holder, "holder").await;

    // Queue the waiters one after the other: that is their order.
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let waiter = Arc::new(registries[i % 2].lock(&zk.connect_string(), &path).unwrap());
        let (by, position) = expect_busy(&waiter, &format!("waiter-{i}")).await;
        assert_eq!(position, Some(i as u32), "waiter {i}'s queue position");
        assert_eq!(by.holder, "holder");
        assert_eq!(by.fence, held.fence());
        waiters.push(waiter);
    }

    // Start waiting in reverse order: the queue, not who asks first, decides.
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, waiter) in waiters.iter().enumerate().rev() {
        let (waiter, order) = (waiter.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let lease = acquire(&*waiter, &request(&format!("waiter-{i}")), Wait::Forever)
                .await
                .unwrap_or_else(|e| panic!("waiter {i}: {e}"));
            order.lock().unwrap().push((i, lease.fence()));
            waiter.release(&lease).await.expect("release");
        }));
    }
    holder.release(&held).await.expect("holder releases");
    tokio::time::timeout(PROMPTLY * 2, futures::future::join_all(tasks))
        .await
        .expect("every waiter acquired in turn")
        .into_iter()
        .for_each(|r| r.expect("waiter task"));

    let order = order.lock().unwrap().clone();
    let served: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(
        served,
        (0..WAITERS).collect::<Vec<_>>(),
        "waiters are served in queue order"
    );
    let mut last = held.fence();
    for (i, fence) in order {
        assert!(fence > last, "waiter {i}: fence {fence} after {last}");
        last = fence;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_wakes_the_next_waiter() {
    let path = lock_path("wake");
    let holder = on_own_session(&path);
    let waiter = Arc::new(on_own_session(&path));
    let held = expect_acquired(&holder, "holder").await;
    let holder_entry = holder
        .queue_entry()
        .await
        .expect("holder has a queue entry");
    assert_eq!(expect_busy(&waiter, "waiter").await.1, Some(0));

    // The waiter blocks on a watch on its predecessor, with a timeout far beyond the
    // test's deadlines: only the watch can wake it in time.
    const NEVER: Duration = Duration::from_secs(600);
    let sleeper = waiter.clone();
    let woke = tokio::spawn(async move {
        let began = Instant::now();
        sleeper.changed(NEVER).await;
        began.elapsed()
    });
    // Release only once the watch is registered on the server (`wchp`: watches by path).
    let watched = format!("{path}/{holder_entry}");
    let node = ZooKeeper::shared().node(0);
    eventually("the waiter's watch on the holder's znode", PROMPTLY, || {
        let listed = node.four_letter("wchp").unwrap_or_default();
        let found = listed.contains(&watched);
        async move { found.then_some(()) }
    })
    .await;

    let released = Instant::now();
    holder.release(&held).await.expect("release");
    let waited = tokio::time::timeout(PROMPTLY, woke)
        .await
        .expect("the release woke the waiter")
        .expect("waiter task");
    assert!(waited < NEVER, "woken by the watch, not the timeout");
    let next = expect_acquired(&waiter, "waiter").await;
    eprintln!(
        "handoff: waiter woke and acquired {:?} after the release began",
        released.elapsed()
    );
    assert!(
        next.fence() > held.fence(),
        "fence {} after {}",
        next.fence(),
        held.fence()
    );
    let current = waiter.inspect().await.unwrap().expect("a holder");
    let record = current.record.expect("a lockwarden record");
    assert_eq!(record.holder, "waiter");
    assert_eq!(record.fence, next.fence());
    assert_eq!(current.version, next.version);
    waiter.release(&next).await.unwrap();
    assert!(waiter.inspect().await.unwrap().is_none());
}

/// A contender for `path` that reaches ZooKeeper through a fault proxy (to be
/// partitioned away), on a session of `session`.
fn behind_a_proxy(path: &str, session: Duration) -> (Proxy, Arc<ZkLock>) {
    let proxy = Proxy::start(ZooKeeper::shared().node(0).port());
    let lock = ZkSessions::with_session_timeout(session)
        .lock(&proxy.address(), path)
        .expect("a valid lock path");
    (proxy, Arc::new(lock))
}

/// Releases `held` (of fence `fence`): `contender` acquires next, with a higher fence.
async fn released_to_the_next(held: HeldLock, contender: &ZkLock, fence: FenceToken) {
    held.release().await.expect("release");
    let next = acquire(contender, &request("contender"), Wait::For(PROMPTLY))
        .await
        .unwrap();
    assert!(next.fence() > fence);
    contender.release(&next).await.unwrap();
}

/// A lock held through a fault proxy (to be partitioned away), and a contender for it
/// that connects directly.
struct HeldBehindAProxy {
    proxy: Proxy,
    holder: Arc<ZkLock>,
    /// Renewed every third of the granted lease.
    held: HeldLock,
    contender: ZkLock,
    /// The lease granted: the session's negotiated timeout.
    session: Duration,
}

/// A fresh lock path for `test`, acquired by `holder` on a session of `session` behind a
/// proxy, and held.
async fn held_behind_a_proxy(test: &str, session: Duration) -> HeldBehindAProxy {
    let path = lock_path(test);
    let (proxy, holder) = behind_a_proxy(&path, session);
    let contender = on_own_session(&path);
    let lease = acquire(&*holder, &request("holder"), Wait::No)
        .await
        .expect("holder acquires");
    let session = lease.record.lease;
    let held = HeldLock::hold(holder.clone(), lease, RenewPolicy::for_lease(session));
    HeldBehindAProxy {
        proxy,
        holder,
        held,
        contender,
        session,
    }
}

/// Partitions the holder of `held` away (`proxy`) and waits until `lock` gets `req`
/// (`why`). Rule 2: by the time anyone else holds the lock, the holder has stopped
/// claiming it.
async fn granted_once_partitioned(
    proxy: &Proxy,
    held: &HeldLock,
    lock: &ZkLock,
    req: &AcquireRequest,
    why: &str,
) -> Lease {
    proxy.set_mode(Mode::Blackhole);
    let partitioned = Instant::now();
    let granted = acquire(lock, req, Wait::For(PROMPTLY)).await.expect(why);
    let state = held.state();
    assert!(
        !state.is_held(),
        "{} was granted while the cut-off holder still claims it: {state:?}",
        req.holder
    );
    eprintln!(
        "{} granted {:?} after the partition",
        req.holder,
        partitioned.elapsed()
    );
    granted
}

/// The cut-off holder's client gives up on its session and reports the lock lost.
async fn expect_lost_with_its_session(held: &HeldLock) {
    let mut states = held.watch();
    let lost = tokio::time::timeout(
        PROMPTLY,
        states.wait_for(|s| matches!(s, HolderState::Lost(_))),
    )
    .await
    .expect("the cut-off holder learns its session expired")
    .expect("holder state channel")
    .clone();
    assert_eq!(lost, HolderState::Lost(LostReason::SessionExpired));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expiry_makes_the_holder_report_lost_and_the_next_acquires() {
    const SESSION: Duration = Duration::from_secs(2);
    let HeldBehindAProxy {
        proxy,
        holder,
        held,
        contender,
        session,
    } = held_behind_a_proxy("expiry", SESSION).await;
    assert_eq!(session, SESSION, "the lease is the session timeout");
    let held_fence = held.fence();
    let (_, position) = expect_busy(&contender, "contender").await;
    assert_eq!(position, Some(0));

    let next = granted_once_partitioned(
        &proxy,
        &held,
        &contender,
        &request("contender"),
        "the contender acquires once the holder's session expired",
    )
    .await;
    assert!(next.fence() > held_fence);

    expect_lost_with_its_session(&held).await;
    match held.release().await {
        Err(LockError::Lost {
            reason: LostReason::SessionExpired,
            url,
        }) => assert!(url.starts_with("zk://"), "{url}"),
        other => panic!("releasing a lock lost with its session: {other:?}"),
    }

    // Healed: the same process queues again, on a new session.
    proxy.set_mode(Mode::Pass);
    let again = eventually("the holder's process to queue again", PROMPTLY, || async {
        match holder.try_acquire(&request("holder")).await {
            Ok(Attempt::Busy {
                holder,
                queue_position,
                ..
            }) => Some((holder, queue_position)),
            Ok(Attempt::Acquired(lease)) => panic!("acquired while the contender holds: {lease:?}"),
            Err(e) => {
                assert!(e.is_transient(), "{e}");
                None
            }
        }
    })
    .await;
    assert_eq!(again.0.holder, "contender");
    assert_eq!(again.1, Some(0));
    holder.abandon().await;
    contender.release(&next).await.unwrap();
}

/// Rule 2 on ZooKeeper (docs/design.md §3, ZooKeeper): once the holder's session is
/// disconnected the holder stops claiming at once, while the server still counts the
/// session alive and keeps its entry — seconds before the deadline of its last renewal,
/// which is all a holder without a lock-delay has to stop its work in. A reconnect
/// within the session timeout gives the claim back with the same entry and fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule2_a_disconnected_zookeeper_session_ends_the_claim_at_once() {
    // The controller's default session; the client declares it disconnected after 2/5
    // of it without a reply (4 s), the server expires it after all of it.
    const SESSION: Duration = Duration::from_secs(10);
    // Renewing every third of the session, as the controller does by default: the
    // disconnect usually comes between two renewals.
    let setup = held_behind_a_proxy("disconnect", SESSION).await;
    let (proxy, held, contender) = (setup.proxy, setup.held, setup.contender);
    let fence = held.fence();
    let mut states = held.watch();

    proxy.set_mode(Mode::Blackhole);
    let cut = Instant::now();
    let deadline_at_cut = *held.deadline().borrow();
    let expiring = tokio::time::timeout(
        PROMPTLY,
        states.wait_for(|s| matches!(s, HolderState::Expiring { .. })),
    )
    .await
    .expect("the holder stops claiming")
    .expect("holder state channel")
    .clone();
    let stopped = Instant::now();
    let HolderState::Expiring { last_error, .. } = &expiring else {
        unreachable!()
    };
    eprintln!(
        "stopped claiming {:?} after the cut, {:?} before the deadline of the last renewal \
         ({last_error})",
        stopped - cut,
        deadline_at_cut.saturating_duration_since(stopped)
    );
    assert!(
        last_error.contains("not claimed until it reconnects"),
        "stopped for the session's disconnect, not its deadline: {last_error}"
    );
    // Renewals every 3.3 s, the disconnect declared at most 4.5 s after the cut: the
    // deadline of the last renewal is at least 6.2 s after the cut.
    assert!(
        stopped + Duration::from_secs(1) < deadline_at_cut,
        "stopped only {:?} before the deadline",
        deadline_at_cut.saturating_duration_since(stopped)
    );
    // The server still counts the session alive: nobody else can have the lock yet.
    let (by, position) = expect_busy(&contender, "contender").await;
    assert_eq!((by.holder.as_str(), by.fence), ("holder", fence));
    assert_eq!(position, Some(0));

    // Healed within the session timeout: the same entry is claimed again.
    proxy.set_mode(Mode::Pass);
    let again = tokio::time::timeout(PROMPTLY, states.wait_for(HolderState::is_held))
        .await
        .expect("held again after the reconnect")
        .expect("holder state channel")
        .clone();
    assert!(
        matches!(again, HolderState::Held { fence: f, .. } if f == fence),
        "{again:?}"
    );
    released_to_the_next(held, &contender, fence).await;
}

/// The session is 4 s, not the 2 s of the cut-off tests: what is tested is that nothing
/// but renewals keeps the lock, and a loaded two-core machine has stalled the shared
/// server's JVM past a 2 s session's read timeout (the session went `Disconnected`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_the_lock_past_many_lease_durations() {
    const SESSION: Duration = Duration::from_secs(4);
    const LEASES: u32 = 4;
    let zk = ZooKeeper::shared();
    let path = lock_path("renewal");
    let sessions = ZkSessions::with_session_timeout(SESSION);
    let lock: Arc<ZkLock> = Arc::new(sessions.lock(&zk.connect_string(), &path).unwrap());
    let contender = ZkSessions::new().lock(&zk.connect_string(), &path).unwrap();

    let lease = acquire(&*lock, &request("holder"), Wait::No).await.unwrap();
    let (fence, version, nonce) = (
        lease.fence(),
        lease.version.clone(),
        lease.nonce().to_string(),
    );
    let held = HeldLock::hold(lock.clone(), lease, RenewPolicy::for_lease(SESSION));
    let mut states = held.watch();

    // Watch every state change for LEASES session timeouts (each renewal publishes
    // `Held` again), and check the queue from another session every half lease.
    let until = Instant::now() + SESSION * LEASES;
    let mut check_every = tokio::time::interval(SESSION / 2);
    let (mut checks, mut renewals) = (0, 0);
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(until) => break,
            changed = states.changed() => {
                changed.expect("holder task alive");
                let state = states.borrow_and_update().clone();
                assert!(state.is_held(), "the lock stopped being held: {state:?}");
                renewals += 1;
            }
            _ = check_every.tick() => {
                let (by, position) = expect_busy(&contender, "contender").await;
                assert_eq!(position, Some(0));
                assert_eq!(by.nonce, nonce, "the same acquisition holds");
                assert_eq!(by.fence, fence);
                checks += 1;
            }
        }
    }
    eprintln!(
        "{renewals} renewals and {checks} checks in {LEASES} session timeouts of {SESSION:?}"
    );
    // Renewing every third of the lease: about three per session timeout.
    assert!(renewals >= 2 * LEASES, "only {renewals} renewals");
    assert!(checks >= LEASES as usize, "only {checks} checks");
    assert_eq!(
        held.state(),
        HolderState::Held { fence, version },
        "still held, same znode, after {LEASES} session timeouts"
    );

    released_to_the_next(held, &contender, fence).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_children_are_reported_not_deleted() {
    let path = lock_path("foreign");
    let raw = raw_client_with(&path).await;
    // A kafka-kit / Curator style queue entry with their own data, and a child that is
    // not a queue member at all (no sequence suffix).
    let foreign_prefix = format!("_c_{}-lock-", uuid::Uuid::new_v4());
    let (foreign_stat, sequence) = raw
        .create(
            &format!("{path}/{foreign_prefix}"),
            br#"{"owner_id":"kafka-kit-7","timestamp":1700000000}"#,
            &CreateMode::EphemeralSequential.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    let foreign = format!("{foreign_prefix}{sequence}");
    raw.create(
        &format!("{path}/config"),
        b"not a queue member",
        &CreateMode::Persistent.with_acls(Acls::anyone_all()),
    )
    .await
    .unwrap();

    let [lock, other] = on_one_session(&path);
    let (by, position) = expect_busy(&lock, "lockwarden").await;
    assert_eq!(position, Some(0), "queued right behind the foreign entry");
    assert!(
        by.holder.contains("foreign queue entry") && by.holder.contains(&foreign),
        "{}",
        by.holder
    );
    assert!(
        by.holder.contains("kafka-kit-7"),
        "shows what was found: {}",
        by.holder
    );
    assert_eq!(by.fence, FenceToken(foreign_stat.czxid as u64));

    // inspect (CLI `status`) reports it as the holder too, saying what was found.
    let stored = lock.inspect().await.unwrap().expect("the foreign holder");
    let holder = stored.record.expect("the head of the queue holds");
    assert_eq!(holder.state, LockState::Held);
    assert!(
        // kafka-kit's node data is recognised and named (owner, and its missing TTL).
        holder.holder.contains(&foreign)
            && holder.holder.contains("kafka-kit lock of \"kafka-kit-7\"")
            && holder.holder.contains("no ttl_deadline"),
        "{}",
        holder.holder
    );
    assert_eq!(stored.version.0, format!("{foreign}:0"));

    // Not waiting: reported as held by the foreign entry, our entry removed.
    match acquire(&other, &request("impatient"), Wait::No).await {
        Err(LockError::Held { by, url }) => {
            assert!(by.holder.contains(&foreign), "{}", by.holder);
            assert!(url.starts_with("zk://") && url.ends_with(&path), "{url}");
        }
        other => panic!("expected Held, got {other:?}"),
    }
    let ours = lock.queue_entry().await.expect("still queued");
    assert_eq!(
        children(&raw, &path).await,
        {
            let mut all = vec![foreign.clone(), ours, "config".to_string()];
            all.sort();
            all
        },
        "the foreign entries are untouched; the impatient contender left"
    );
    lock.abandon().await;
    let mut left = vec![foreign.clone(), "config".to_string()];
    left.sort();
    assert_eq!(
        children(&raw, &path).await,
        left,
        "abandon removes only our own entry"
    );

    // When the foreign client lets go, we get the lock, with a higher fence.
    raw.delete(&format!("{path}/{foreign}"), None)
        .await
        .unwrap();
    let lease = expect_acquired(&lock, "lockwarden").await;
    assert!(lease.fence() > by.fence);
    lock.release(&lease).await.unwrap();
    assert_eq!(children(&raw, &path).await, vec!["config".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_takes_over_with_a_conditional_delete_and_a_higher_fence() {
    let zk = ZooKeeper::shared();
    let path = lock_path("force");
    let holder: Arc<ZkLock> =
        Arc::new(ZkSessions::new().lock(&zk.connect_string(), &path).unwrap());
    let lease = expect_acquired(&holder, "holder").await;
    let held_fence = lease.fence();
    let policy = RenewPolicy::for_lease(lease.record.lease);
    let held = HeldLock::hold(holder.clone(), lease, policy);

    let forcer = ZkSessions::new().lock(&zk.connect_string(), &path).unwrap();
    let mut req = request("forcer");
    req.force = true;
    let taken = match forcer.try_acquire(&req).await {
        Ok(Attempt::Acquired(lease)) => lease,
        other => panic!("force: {other:?}"),
    };
    let from = taken
        .forced_from
        .as_ref()
        .expect("records whom it took over from");
    assert_eq!((from.holder.as_str(), from.fence), ("holder", held_fence));
    assert!(taken.fence() > held_fence);

    // The old holder learns at its next renewal that its entry is gone.
    let lost = tokio::time::timeout(PROMPTLY, held.lost())
        .await
        .expect("the old holder notices");
    assert_eq!(lost, HolderState::Lost(LostReason::EntryGone));
    forcer.release(&taken).await.unwrap();
}

// ---------------------------------------------------------------- rule 4, resume

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_create_reply_is_found_by_its_protected_name() {
    let zk = ZooKeeper::shared();
    let path = lock_path("lost-reply");
    let raw = raw_client_with(&path).await;
    let proxy = Proxy::start(zk.node(0).port());
    let sessions = ZkSessions::new();
    let lock = Arc::new(sessions.lock(&proxy.address(), &path).unwrap());
    // Opens the session now, so the next request is the create (the next ping is a
    // while away), then lose every reply.
    assert!(lock.inspect().await.unwrap().is_none());
    proxy.set_mode(Mode::DropReplies);
    let attempt = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.try_acquire(&request("holder")).await })
    };
    let created = eventually(
        "the create to land while its reply is lost",
        PROMPTLY,
        || {
            let raw = raw.clone();
            let path = path.clone();
            async move { children(&raw, &path).await.into_iter().next() }
        },
    )
    .await;
    // The server applies the create before the proxy drops its reply: the count may
    // trail the znode by a moment.
    eventually("the create's reply to be dropped", PROMPTLY, || async {
        (proxy.dropped_replies() >= 1).then_some(())
    })
    .await;
    proxy.set_mode(Mode::Pass);

    // The attempt (or a retry, if it gave up while replies were still lost) adopts
    // the znode that landed instead of creating a second one.
    let first = attempt.await.expect("attempt task");
    let lease = match first {
        Ok(Attempt::Acquired(lease)) => lease,
        Ok(busy) => panic!("nobody else is queued: {busy:?}"),
        Err(e) => {
            assert!(e.is_transient(), "{e}");
            eventually("a retry to acquire", PROMPTLY, || async {
                match lock.try_acquire(&request("holder")).await {
                    Ok(Attempt::Acquired(lease)) => Some(lease),
                    Ok(busy) => panic!("nobody else is queued: {busy:?}"),
                    Err(_) => None,
                }
            })
            .await
        }
    };
    assert_eq!(lock.queue_entry().await.as_deref(), Some(created.as_str()));
    assert_eq!(
        children(&raw, &path).await,
        vec![created.clone()],
        "exactly one queue entry: the one whose reply was lost"
    );
    assert!(lease.version.0.starts_with(&created));
    lock.release(&lease).await.unwrap();
    assert!(children(&raw, &path).await.is_empty());
}

/// `resumer`, on the session of `lease`'s `holder`, adopts `lease` by its nonce: the
/// same fence and version; `before` holds of it as adopted, and a renewal claims it.
async fn resumed_as_it_was(
    resumer: &ZkLock,
    holder: &str,
    lease: &Lease,
    before: impl FnOnce(&Lease),
) -> Lease {
    let mut resumed = resumer.resume(holder, lease.nonce()).await.expect("resume");
    assert_eq!(resumed.fence(), lease.fence());
    assert_eq!(resumed.version, lease.version);
    before(&resumed);
    resumer.renew(&mut resumed).await.expect("renew");
    assert!(resumed.is_valid());
    resumed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_finds_the_acquisition_only_on_its_own_live_session() {
    let path = lock_path("resume");
    let [original, resumer] = on_one_session(&path);
    let lease = expect_acquired(&original, "holder").await;

    // Same process, same session (e.g. a holder task restarted): adopted, same fence,
    // valid only after a renewal.
    let resumed = resumed_as_it_was(&resumer, "holder", &lease, |resumed| {
        assert!(!resumed.is_valid(), "not claimed before a renewal");
    })
    .await;

    // A restarted process has a new session: the old one's znodes are not its own.
    let restarted = on_own_session(&path);
    for nonce in [lease.nonce(), "no-such-nonce"] {
        match restarted.resume("holder", nonce).await {
            Err(LockError::Lost {
                reason: LostReason::SessionExpired,
                ..
            }) => {}
            other => panic!("resume({nonce}) on a new session: {other:?}"),
        }
    }
    resumer.release(&resumed).await.expect("release");
    match original.renew(&mut lease.clone()).await {
        Err(LockError::Lost {
            reason: LostReason::EntryGone,
            ..
        }) => {}
        other => panic!("renewing a released entry: {other:?}"),
    }
}

// ---------------------------------------------------------------- more than one holder

/// A holder of one of `permits` permits (shared).
fn permit_request(holder: &str, permits: u32) -> AcquireRequest {
    AcquireRequest {
        permits: Permits::semaphore(permits),
        ..request(holder)
    }
}

/// A writer on a key with `permits` permits: alone while it holds.
fn writer_request(holder: &str, permits: u32) -> AcquireRequest {
    AcquireRequest {
        permits: Permits {
            total: permits,
            mode: PermitMode::Exclusive,
        },
        ..request(holder)
    }
}

async fn expect_granted(lock: &ZkLock, req: &AcquireRequest) -> Lease {
    let attempt = lock.try_acquire(req).await;
    let Ok(Attempt::Acquired(lease)) = attempt else {
        panic!(
            "{}: expected to acquire {}, got {attempt:?}",
            req.holder,
            lock.url()
        )
    };
    lease
}

/// `(first holder, queue position)` of a busy attempt.
async fn expect_waiting(lock: &ZkLock, req: &AcquireRequest) -> (LockRecord, Option<u32>) {
    match lock.try_acquire(req).await {
        Ok(Attempt::Busy {
            holder,
            queue_position,
            ..
        }) => (holder, queue_position),
        other => panic!(
            "{}: expected to wait for {}, got {other:?}",
            req.holder,
            lock.url()
        ),
    }
}

/// Whether the server has a watch on each of these znodes (`wchp`: watches by path).
fn watched_on_server(zk: &ZooKeeper, paths: &[String]) -> bool {
    let listed = zk.node(0).four_letter("wchp").unwrap_or_default();
    paths.iter().all(|p| listed.contains(p.as_str()))
}

/// A grant seen by [`acquire_by_watch`].
struct Grant {
    lease: Lease,
    /// Our entry was in the queue by then: the first attempt had returned.
    queued: Instant,
}

/// Acquires by hand, waiting on `changed` with a timeout far beyond the test's
/// deadlines: only a watch wakes it in time.
async fn acquire_by_watch(lock: &ZkLock, req: &AcquireRequest) -> Grant {
    let started = Instant::now();
    let mut queued = None;
    loop {
        let attempt = lock.try_acquire(req).await;
        if attempt.is_ok() {
            queued.get_or_insert_with(Instant::now);
        }
        match attempt {
            Ok(Attempt::Acquired(lease)) => {
                return Grant {
                    lease,
                    queued: queued.unwrap_or(started),
                };
            }
            Ok(Attempt::Busy { .. }) => {
                let began = Instant::now();
                lock.changed(PROMPTLY).await;
                assert!(
                    began.elapsed() < PROMPTLY,
                    "{}: woken by the timeout, not by a watch",
                    req.holder
                );
            }
            Err(e) if e.is_transient() => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("{}: {e}", req.holder),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_3_grant_three_at_once_and_a_release_wakes_the_fourth_by_watch() {
    let zk = ZooKeeper::shared();
    let path = lock_path("permits-3");
    let registries = [ZkSessions::new(), ZkSessions::new()];
    let locks: Vec<Arc<ZkLock>> = (0..4)
        .map(|i| Arc::new(registries[i % 2].lock(&zk.connect_string(), &path).unwrap()))
        .collect();
    let reqs: Vec<AcquireRequest> = (0..4)
        .map(|i| permit_request(&format!("holder-{i}"), 3))
        .collect();

    let mut held = Vec::new();
    for i in 0..3 {
        let lease = expect_granted(&locks[i], &reqs[i]).await;
        let set = lease.record.set.as_ref().expect("a permit says so");
        assert_eq!(set.permits, 3);
        // Every holder granted so far, ours last.
        assert_eq!(set.holders.len(), i + 1, "{set:?}");
        let own = set.holders.last().unwrap();
        assert_eq!(own.mode, PermitMode::Shared);
        assert_eq!(own.fence, lease.fence());
        assert_eq!(own.nonce, lease.nonce());
        held.push(lease);
    }
    assert!(
        held[0].fence() < held[1].fence() && held[1].fence() < held[2].fence(),
        "fences in grant order: {:?}",
        held.iter().map(Lease::fence).collect::<Vec<_>>()
    );
    let (first, position) = expect_waiting(&locks[3], &reqs[3]).await;
    // The summary counts every holder of the key (issue 24: not only the first).
    assert_eq!(first.holder, "holder-0, holder-1 and 1 more");
    assert_eq!(first.fence, held[0].fence());
    assert_eq!(position, Some(0), "the next release lets it in");

    // status: every holder with its fence.
    let stored = locks[3].inspect().await.unwrap().expect("held");
    let record = stored.record.expect("a lockwarden record");
    let set = record.set.expect("a semaphore key shows its holders");
    assert_eq!(set.permits, 3);
    assert_eq!(
        set.holders
            .iter()
            .map(|h| (h.holder.as_str(), h.fence))
            .collect::<Vec<_>>(),
        held.iter()
            .map(|l| (l.holder(), l.fence()))
            .collect::<Vec<_>>()
    );
    assert_eq!(set.waiting_writer, None);

    // The waiter blocks on watches (on the three holders' entries): released the
    // middle one, it wakes long before its timeout.
    const NEVER: Duration = Duration::from_secs(600);
    let sleeper = locks[3].clone();
    let woke = tokio::spawn(async move {
        let began = Instant::now();
        sleeper.changed(NEVER).await;
        began.elapsed()
    });
    let mut holders = Vec::new();
    for lock in &locks[..3] {
        holders.push(format!("{path}/{}", lock.queue_entry().await.unwrap()));
    }
    eventually("the waiter's watches on the holders", PROMPTLY, || {
        let found = watched_on_server(zk, &holders);
        async move { found.then_some(()) }
    })
    .await;
    locks[1].release(&held[1]).await.expect("release");
    let waited = tokio::time::timeout(PROMPTLY, woke)
        .await
        .expect("the release woke the waiter")
        .expect("waiter task");
    assert!(waited < NEVER, "woken by the watch, not the timeout");
    let fourth = expect_granted(&locks[3], &reqs[3]).await;
    assert!(fourth.fence() > held[2].fence(), "fences keep increasing");

    for (lock, lease) in [
        (&locks[0], &held[0]),
        (&locks[2], &held[2]),
        (&locks[3], &fourth),
    ] {
        lock.release(lease).await.expect("release");
    }
    assert!(locks[0].inspect().await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_excludes_readers_before_and_after_it() {
    let zk = ZooKeeper::shared();
    let path = lock_path("shared-exclusive");
    let sessions = ZkSessions::new();
    let lock = || sessions.lock(&zk.connect_string(), &path).unwrap();
    let (r1, r2, r3, w) = (lock(), lock(), lock(), lock());
    let (r1_req, r2_req, r3_req) = (
        permit_request("reader-1", 3),
        permit_request("reader-2", 3),
        permit_request("reader-3", 3),
    );
    let w_req = writer_request("writer", 3);

    let r1_lease = expect_granted(&r1, &r1_req).await;
    let r2_lease = expect_granted(&r2, &r2_req).await;
    let (first, position) = expect_waiting(&w, &w_req).await;
    assert_eq!(first.holder, "reader-1 and reader-2");
    assert_eq!(position, Some(1), "both readers must leave first");
    // A permit is free, but the writer queued first: the reader waits behind it.
    let (_, position) = expect_waiting(&r3, &r3_req).await;
    assert_eq!(position, Some(2), "the readers, then the writer");

    let stored = r1.inspect().await.unwrap().expect("held");
    let set = stored.record.unwrap().set.expect("a holder set");
    let names: Vec<&str> = set.holders.iter().map(|h| h.holder.as_str()).collect();
    assert_eq!(names, ["reader-1", "reader-2"]);
    let waiting = set.waiting_writer.expect("the writer waits first in line");
    assert_eq!(
        (waiting.holder.as_str(), waiting.mode),
        ("writer", PermitMode::Exclusive)
    );

    r1.release(&r1_lease).await.unwrap();
    assert_eq!(expect_waiting(&w, &w_req).await.1, Some(0));
    expect_waiting(&r3, &r3_req).await;

    r2.release(&r2_lease).await.unwrap();
    let w_lease = tokio::time::timeout(PROMPTLY, acquire_by_watch(&w, &w_req))
        .await
        .expect("the writer is granted once the readers left")
        .lease;
    let (by, position) = expect_waiting(&r3, &r3_req).await;
    assert_eq!(by.holder, "writer", "the writer holds alone");
    assert_eq!(position, Some(0));

    w.release(&w_lease).await.unwrap();
    let r3_lease = tokio::time::timeout(PROMPTLY, acquire_by_watch(&r3, &r3_req))
        .await
        .expect("the reader is granted once the writer left")
        .lease;
    assert!(
        r1_lease.fence() < r2_lease.fence()
            && r2_lease.fence() < w_lease.fence()
            && w_lease.fence() < r3_lease.fence(),
        "fences in grant order"
    );
    r3.release(&r3_lease).await.unwrap();
}

/// The permits disagree; the contender's entry is gone afterwards, the holder's kept.
async fn expect_disagreement(
    raw: &Client,
    path: &str,
    holder: &ZkLock,
    contender: &ZkLock,
    req: &AcquireRequest,
    stored_permits: u32,
) {
    match contender.try_acquire(req).await {
        Err(e @ LockError::PermitsDisagree { .. }) => {
            let LockError::PermitsDisagree {
                stored, requested, ..
            } = &e
            else {
                unreachable!()
            };
            assert_eq!((*stored, *requested), (stored_permits, req.permits.total));
            let message = e.to_string();
            assert!(
                message.contains(&format!("held with {stored_permits} permit"))
                    && message.contains(&format!("asks for {}", req.permits.total)),
                "{message}"
            );
        }
        other => panic!("{}: expected PermitsDisagree, got {other:?}", req.holder),
    }
    assert_eq!(contender.queue_entry().await, None);
    assert_eq!(
        children(raw, path).await,
        vec![holder.queue_entry().await.expect("the holder stays queued")],
        "only the holder's entry is left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disagreeing_permits_are_refused_and_the_contender_leaves_the_queue() {
    let raw = raw_client().await;
    // A semaphore of 3, and a contender asking for 2 or a mutex; a mutex holder, and a
    // semaphore contender.
    let rows = [
        (
            "disagree-sem",
            permit_request("three", 3),
            vec![permit_request("two", 2), request("mutex")],
        ),
        (
            "disagree-mutex",
            request("mutex"),
            vec![permit_request("two", 2)],
        ),
    ];
    for (name, held, asked) in rows {
        let path = lock_path(name);
        let [holder, contender] = on_one_session(&path);
        let lease = expect_granted(&holder, &held).await;
        if held.permits.total == 1 {
            assert_eq!(
                lease.record.set, None,
                "{name}: a mutex record is unchanged"
            );
        }
        for req in &asked {
            expect_disagreement(&raw, &path, &holder, &contender, req, held.permits.total).await;
        }
        holder.release(&lease).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_finds_a_permit_granted_behind_another_holder() {
    let path = lock_path("permits-resume");
    let [first, second, resumer] = on_one_session(&path);
    let first_lease = expect_granted(&first, &permit_request("first", 2)).await;
    let second_lease = expect_granted(&second, &permit_request("second", 2)).await;

    // The second entry is not first in the queue, and holds a permit all the same.
    let own = |lease: &Lease| {
        let set = lease.record.set.as_ref().expect("a permit says so");
        set.entry(lease.nonce()).cloned()
    };
    let resumed = resumed_as_it_was(&resumer, "second", &second_lease, |resumed| {
        assert_eq!(own(resumed), own(&second_lease));
        assert!(own(resumed).is_some());
    })
    .await;
    resumer.release(&resumed).await.expect("release");
    first.release(&first_lease).await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_is_refused_with_permits_and_nothing_is_queued() {
    let path = lock_path("permits-force");
    let [holder, forcer] = on_one_session(&path);
    let lease = expect_granted(&holder, &permit_request("holder", 2)).await;
    let mut req = permit_request("forcer", 2);
    req.force = true;
    match forcer.try_acquire(&req).await {
        Err(LockError::Backend { message, .. }) => {
            assert!(
                message.contains("force is not supported with permits > 1"),
                "{message}"
            )
        }
        other => panic!("force with permits: {other:?}"),
    }
    assert_eq!(forcer.queue_entry().await, None);
    let raw = raw_client().await;
    assert_eq!(
        children(&raw, &path).await,
        vec![holder.queue_entry().await.unwrap()]
    );
    holder.release(&lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_queue_entry_counts_as_a_writer() {
    let zk = ZooKeeper::shared();
    let path = lock_path("permits-foreign");
    let sessions = ZkSessions::new();
    let (reader_1, reader_2) = (
        sessions.lock(&zk.connect_string(), &path).unwrap(),
        sessions.lock(&zk.connect_string(), &path).unwrap(),
    );
    let first = expect_granted(&reader_1, &permit_request("reader-1", 3)).await;

    // A kafka-kit contender queues behind the reader: it waits for it, as for any
    // holder, and a reader behind it waits for the kafka-kit lock.
    let raw = raw_client().await;
    let foreign_prefix = format!("_c_{}-lock-", uuid::Uuid::new_v4());
    let (_, sequence) = raw
        .create(
            &format!("{path}/{foreign_prefix}"),
            format!(
                r#"{{"timestamp":"2026-01-01T00:00:00Z","ttl_deadline":"{}","owner_id":"kafka-kit-3"}}"#,
                "9999-01-01T00:00:00Z"
            )
            .as_bytes(),
            &CreateMode::EphemeralSequential.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    let foreign = format!("{foreign_prefix}{sequence}");
    let second_req = permit_request("reader-2", 3);
    let (by, position) = expect_waiting(&reader_2, &second_req).await;
    // Named after the entry that blocks it, the kafka-kit lock queued ahead (issue 24).
    assert!(
        by.holder.contains("kafka-kit") && by.holder.contains(&foreign),
        "{:?}",
        by.holder
    );
    assert_eq!(position, Some(1), "the reader, then the kafka-kit lock");

    reader_1.release(&first).await.unwrap();
    let (by, position) = expect_waiting(&reader_2, &second_req).await;
    assert!(
        by.holder.contains(&foreign) && by.holder.contains("kafka-kit-3"),
        "{}",
        by.holder
    );
    assert_eq!(position, Some(0));
    raw.delete(&format!("{path}/{foreign}"), None)
        .await
        .unwrap();
    let second = tokio::time::timeout(PROMPTLY, acquire_by_watch(&reader_2, &second_req))
        .await
        .expect("granted once the kafka-kit lock is gone")
        .lease;
    assert!(second.fence() > first.fence());
    reader_2.release(&second).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_lost_with_its_session_is_granted_to_a_waiter() {
    const SESSION: Duration = Duration::from_secs(2);
    let path = lock_path("permits-expiry");
    // One holder reaches ZooKeeper through a proxy that will partition it away.
    let (proxy, cut_off) = behind_a_proxy(&path, SESSION);
    let [steady, waiter] = on_one_session(&path);

    let lease = acquire(&*cut_off, &permit_request("cut-off", 2), Wait::No)
        .await
        .expect("first permit");
    let cut_off_fence = lease.fence();
    let held = HeldLock::hold(cut_off.clone(), lease, RenewPolicy::for_lease(SESSION));
    let steady_lease = expect_granted(&steady, &permit_request("steady", 2)).await;
    let waiter_req = permit_request("waiter", 2);
    assert_eq!(expect_waiting(&waiter, &waiter_req).await.1, Some(0));

    let granted = granted_once_partitioned(
        &proxy,
        &held,
        &waiter,
        &waiter_req,
        "the waiter gets the permit of the expired session",
    )
    .await;
    assert!(granted.fence() > cut_off_fence.max(steady_lease.fence()));
    expect_lost_with_its_session(&held).await;
    // The other permit was never in question.
    let mut steady_lease = steady_lease;
    steady.renew(&mut steady_lease).await.expect("still held");
    proxy.set_mode(Mode::Pass);
    steady.release(&steady_lease).await.unwrap();
    waiter.release(&granted).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_share_writers_are_alone_and_no_writer_waits_past_one_turn_of_the_others() {
    const READERS: usize = 8;
    const WRITERS: usize = 2;
    const PERMITS: u32 = 8;
    const ROUNDS: usize = 20;
    /// One hold, seen from the contender.
    struct Hold {
        who: usize,
        writer: bool,
        queued: Instant,
        acquired: Instant,
    }
    let zk = ZooKeeper::shared();
    let path = lock_path("readers-writers");
    let registries = [ZkSessions::new(), ZkSessions::new()];
    // (readers, writers) holding now, and the most readers seen together.
    let holding = Arc::new(Mutex::new((0usize, 0usize)));
    let most_readers = Arc::new(AtomicUsize::new(0));
    let holds = Arc::new(Mutex::new(Vec::<Hold>::new()));
    let started = Instant::now();

    let mut tasks = Vec::new();
    for i in 0..READERS + WRITERS {
        let writer = i >= READERS;
        let lock = registries[i % 2].lock(&zk.connect_string(), &path).unwrap();
        let (holding, most_readers, holds) = (holding.clone(), most_readers.clone(), holds.clone());
        tasks.push(tokio::spawn(async move {
            let req = if writer {
                writer_request(&format!("writer-{i}"), PERMITS)
            } else {
                permit_request(&format!("reader-{i}"), PERMITS)
            };
            for _ in 0..ROUNDS {
                let grant = acquire_by_watch(&lock, &req).await;
                let acquired = Instant::now();
                {
                    let mut now = holding.lock().unwrap();
                    assert_eq!(now.1, 0, "{} granted while a writer holds", req.holder);
                    if writer {
                        assert_eq!(now.0, 0, "{} granted while readers hold", req.holder);
                        now.1 += 1;
                    } else {
                        now.0 += 1;
                        most_readers.fetch_max(now.0, Ordering::SeqCst);
                    }
                }
                let hold = rand::rng().random_range(1_000..10_000);
                tokio::time::sleep(Duration::from_micros(hold)).await;
                {
                    let mut now = holding.lock().unwrap();
                    if writer {
                        now.1 -= 1;
                    } else {
                        now.0 -= 1;
                    }
                }
                holds.lock().unwrap().push(Hold {
                    who: i,
                    writer,
                    queued: grant.queued,
                    acquired,
                });
                lock.release(&grant.lease)
                    .await
                    .unwrap_or_else(|e| panic!("{}: release: {e}", req.holder));
            }
        }));
    }
    tokio::time::timeout(Duration::from_secs(120), futures::future::join_all(tasks))
        .await
        .expect("contenders did not finish within 2 minutes")
        .into_iter()
        .for_each(|r| r.expect("contender task"));

    let holds = std::mem::take(&mut *holds.lock().unwrap());
    let most_readers = most_readers.load(Ordering::SeqCst);
    eprintln!(
        "{} grants in {:?}; at most {most_readers} readers together",
        holds.len(),
        started.elapsed()
    );
    assert!(most_readers >= 2, "readers never held together");
    // The bound on a writer's wait (FIFO): once its entry is queued, every other
    // contender is granted at most once before it (its entry then ahead of the
    // writer's; any later one queues behind the writer, readers included).
    for writer in holds.iter().filter(|h| h.writer) {
        let mut before: Vec<usize> = holds
            .iter()
            .filter(|h| {
                h.who != writer.who && writer.queued < h.acquired && h.acquired < writer.acquired
            })
            .map(|h| h.who)
            .collect();
        before.sort();
        let times = before.len();
        before.dedup();
        assert_eq!(
            times,
            before.len(),
            "writer-{} waited {:?} while others were granted more than once each: {before:?}",
            writer.who,
            writer.acquired - writer.queued
        );
    }
    let raw = raw_client().await;
    assert!(children(&raw, &path).await.is_empty(), "every entry left");
}

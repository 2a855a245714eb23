//! Several locks on one key: one holder, the others waiting, handed on delete.

use super::*;

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

/// `--reconciles-in-flight 1` (docs/design.md §3, "Requests in flight are bounded"): a
/// controller with one reconcile slot still hands a lock from holder to waiter, and
/// serves a lock on another key meanwhile — no reconcile keeps the slot while it waits
/// for a holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_reconcile_slot_still_hands_every_lock_on() {
    let plane = ControlPlane::shared();
    let client = plane.client().await;
    install_crd(&client).await;
    let ns = plane.namespace(&client, "ctl-one-slot").await;
    let config = ControllerConfig {
        cluster_name: CLUSTER.into(),
        namespace: Some(ns.clone()),
        reconciles_in_flight: 1,
        ..Default::default()
    };
    tokio::spawn(controller::run(client.clone(), config));
    let locks = Api::<DistributedLock>::namespaced(client.clone(), &ns);
    hand_off_on_delete(&locks, "Lease, one reconcile slot", |name| {
        lease_lock_timed(name, "one-slot", "30s", "10s")
    })
    .await;
    support::kube::create(
        &locks,
        &lease_lock_timed("elsewhere", "another-key", "30s", "10s"),
    )
    .await;
    eventually("the lock on another key acquired", TIMEOUT, || async {
        acquired(&locks.get("elsewhere").await.ok()?).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_one_znode_hand_off_on_delete() {
    let (_client, _ns, locks) = setup("ctl-zk-handoff").await;
    shared_zookeeper().await;
    let path = format!("/{}/db", support::unique("ctl"));
    hand_off_on_delete(&locks, "ZooKeeper", |name| zk_lock(name, &path)).await;
}

/// Read requests (`getData`, `getChildren`, `exists`) the shared ZooKeeper has served
/// under the top-level znode `/{top}` (its `mntr` per-namespace read statistics).
fn zk_reads(top: &str) -> u64 {
    let mntr = support::zookeeper::ZooKeeper::shared().nodes()[0]
        .four_letter("mntr")
        .expect("mntr");
    let key = format!("zk_cnt_{top}_read_per_namespace");
    mntr.lines()
        .filter_map(|line| line.split_once('\t'))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// [`zk_reads`] once it has stayed the same for a second.
async fn settled_reads(top: &str) -> u64 {
    let settle = Duration::from_secs(1);
    let deadline = Instant::now() + TIMEOUT;
    let (mut last, mut since) = (zk_reads(top), Instant::now());
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let reads = zk_reads(top);
        if reads != last {
            (last, since) = (reads, Instant::now());
        } else if since.elapsed() >= settle {
            return reads;
        }
        assert!(
            Instant::now() < deadline,
            "reads under /{top} never paused for {settle:?}: the waiters poll"
        );
    }
}

async fn patch_release(locks: &Api<DistributedLock>, name: &str) {
    patch_spec(locks, name, json!({"release": true})).await;
}

async fn wait_queued(locks: &Api<DistributedLock>, name: &str, position: i32) {
    eventually(
        &format!("{name} to wait at {position}"),
        TIMEOUT,
        || async {
            let lock = locks.get(name).await.ok()?;
            let status = lock.status?;
            (status.phase == Some(LockPhase::Waiting) && status.queue_position == Some(position))
                .then_some(())
        },
    )
    .await;
}

/// ZooKeeper waiters wake on the store's watch of their predecessor instead of
/// polling. Three locks wait in one queue — two on one controller, one on another
/// controller (another namespace, another cluster name) — behind a holder that reads
/// nothing (an engine lease, not renewed): while it holds, ZooKeeper serves no read at
/// all under the lock's path. Then the hand-offs: from that holder (only the watch can
/// wake the next one), within a controller (its release also wakes the waiter), and
/// across controllers (again only the watch), each well before a waiter's fallback look.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_waiters_wake_on_the_watch_without_polling() {
    let (client, _ns, here) = setup("ctl-zk-watch").await;
    let (_, other_ns) =
        support::kube::namespace_with_controller("ctl-zk-watch", "other-cluster").await;
    let there = Api::<DistributedLock>::namespaced(client.clone(), &other_ns);
    let zk = shared_zookeeper().await;
    let top = support::unique("zkwatch");
    let path = format!("/{top}/db");
    let port = zk.nodes()[0].port();
    // Spellings of the servers no other test uses: sessions are bound to the runtime
    // that opened them (see `zk_lock`).
    let engine = lockwarden::backend::ZkSessions::new()
        .lock(&format!("localhost:{port},127.0.0.1:{port}"), &path)
        .unwrap();
    let holding = match engine
        .try_acquire(&AcquireRequest::new("engine", Duration::from_secs(10)))
        .await
    {
        Ok(Attempt::Acquired(lease)) => lease,
        other => panic!("the engine did not acquire a fresh path: {other:?}"),
    };
    let make = |name: &str| {
        let mut lock = zk_lock(name, &path);
        lock.spec.backend.zookeeper.as_mut().unwrap().servers =
            vec![format!("127.0.0.1:{port}"), format!("localhost:{port}")];
        lock
    };
    let create = PostParams::default();
    here.create(&create, &make("first")).await.unwrap();
    wait_queued(&here, "first", 0).await;
    here.create(&create, &make("second")).await.unwrap();
    wait_queued(&here, "second", 1).await;
    there.create(&create, &make("third")).await.unwrap();
    wait_queued(&there, "third", 2).await;

    // Each waiter reads once more after it shows its place: its own status write
    // wakes a reconcile that looks at the queue again and then sets its watch. Under
    // load those reads can come after the test sees the status, so the window starts
    // once the reads have settled (1 s without one).
    let before = settled_reads(&top).await;
    // A polling waiter looks at least every 2 s (its longest poll), each look a read
    // of the queue; three times that without a read shows that no waiter polls.
    let quiet_until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < quiet_until {
        let reads = zk_reads(&top);
        assert_eq!(
            reads,
            before,
            "{} reads under /{top} while the holder stayed: the waiters poll",
            reads - before
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // From the engine: nothing but the watch wakes `first`.
    let release_engine = async {
        engine.release(&holding).await.expect("engine release");
    };
    hand_off_promptly(release_engine, &here, "first").await;
    // Within a controller.
    hand_off_promptly(patch_release(&here, "first"), &here, "second").await;
    // Across controllers: nothing but the watch wakes `third`.
    hand_off_promptly(patch_release(&here, "second"), &there, "third").await;
}

/// Runs `release` and waits for `next` to hold, well before a waiter's fallback look
/// (30 s): it was woken by the release.
async fn hand_off_promptly(
    release: impl std::future::Future<Output = ()>,
    locks: &Api<DistributedLock>,
    next: &str,
) {
    let released = Instant::now();
    release.await;
    wait_acquired(locks, next, TIMEOUT).await;
    let latency = released.elapsed();
    assert!(
        latency < Duration::from_secs(20),
        "{next} acquired {latency:?} after the release: not woken by it"
    );
    eprintln!("ZooKeeper hand-off to {next} in {} ms", latency.as_millis());
}

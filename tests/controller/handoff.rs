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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_one_znode_hand_off_on_delete() {
    let (_client, _ns, locks) = setup("ctl-zk-handoff").await;
    shared_zookeeper().await;
    let path = format!("/{}/db", support::unique("ctl"));
    hand_off_on_delete(&locks, "ZooKeeper", |name| zk_lock(name, &path)).await;
}

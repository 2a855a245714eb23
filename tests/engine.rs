//! The lock protocol's safety rules (docs/design.md §3), one test per rule, run against the
//! real stores: S3 and DynamoDB on moto, Leases on kube-apiserver. (ZooKeeper, a
//! queue rather than a conditional-write store, has its own file.)
//!
//! `LOCKWARDEN_S3_SERVER=versitygw` / `LOCKWARDEN_DYNAMODB_SERVER=dynalite` run the S3 /
//! DynamoDB cases against those servers instead (`support::stores`).

use lockwarden_testsupport as support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_s3::primitives::ByteStream;
use lockwarden::backend::{DynamoStore, LeaseStore, S3Store, TableLayout};
use lockwarden::lock::{
    AcquireRequest, Attempt, CasLock, HeldLock, HolderState, Lease, LockBackend, LockError,
    LostReason, RenewPolicy, Wait, acquire, acquire_with_progress,
};
use rand::Rng;

use support::keys::Key;
use support::moto::{new_bucket_at, new_table_at};
use support::stores::{AwsServer, dynamodb_choice, dynamodb_shared, s3_choice, s3_shared};
use tokio::time::Instant;

fn request(holder: &str, lease: Duration) -> AcquireRequest {
    AcquireRequest::new(holder, lease)
}

/// Asserts that holds never overlap and fences strictly increase across them.
#[derive(Default)]
struct HoldChecker {
    held: AtomicBool,
    last_fence: AtomicU64,
    holds: AtomicU64,
}

impl HoldChecker {
    fn enter(&self, lease: &Lease) {
        assert!(
            lease.is_valid(),
            "acquired a lease that is already past its deadline"
        );
        assert!(
            !self.held.swap(true, Ordering::SeqCst),
            "two holders at once (second: fence {})",
            lease.fence()
        );
        let prev = self.last_fence.swap(lease.fence().0, Ordering::SeqCst);
        assert!(
            lease.fence().0 > prev,
            "fence went from {prev} to {}",
            lease.fence()
        );
        self.holds.fetch_add(1, Ordering::SeqCst);
    }

    fn exit(&self) {
        assert!(
            self.held.swap(false, Ordering::SeqCst),
            "exit without a hold"
        );
    }
}

const CONTENDERS: usize = 16;

async fn mutual_exclusion_under_contention(key: Key) {
    let checker = Arc::new(HoldChecker::default());
    // Contenders in this process tell each other about releases (as the controller's
    // same-cluster index does), so the emulators, which serve one request at a time,
    // spend their capacity on acquisitions rather than on polls. One waiter is woken
    // per release; the others poll on their own at random times and race it.
    let released = Arc::new(tokio::sync::Notify::new());
    let started = Instant::now();
    let each = support::timescale::contention_holds();
    let mut tasks = Vec::new();
    for c in 0..CONTENDERS {
        let (key, checker, released) = (key.clone(), checker.clone(), released.clone());
        tasks.push(tokio::spawn(async move {
            let lock = key.handle().await;
            let req = request(&format!("contender-{c}"), Duration::from_secs(60));
            let mut done = 0;
            while done < each {
                match lock.try_acquire(&req).await {
                    Ok(Attempt::Acquired(lease)) => {
                        checker.enter(&lease);
                        tokio::task::yield_now().await;
                        checker.exit();
                        lock.release(&lease)
                            .await
                            .expect("release of a lock we hold");
                        released.notify_one();
                        done += 1;
                        continue;
                    }
                    Ok(Attempt::Busy { .. }) => {}
                    Err(e) if e.is_transient() => {}
                    Err(e) => panic!("contender {c}: {e}"),
                }
                let poll = Duration::from_millis(rand::rng().random_range(500..2500));
                tokio::select! {
                    _ = released.notified() => {}
                    _ = tokio::time::sleep(poll) => {}
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("contender panicked");
    }
    let holds = checker.holds.load(Ordering::SeqCst);
    assert_eq!(holds as usize, CONTENDERS * each);
    eprintln!(
        "{holds} acquisitions by {CONTENDERS} contenders in {:?}",
        started.elapsed()
    );
}

/// A new contender for `key` that takes it at once as `holder`, for `lease_len`.
async fn new_holder(key: &Key, holder: &str, lease_len: Duration) -> (Arc<dyn LockBackend>, Lease) {
    let lock = key.handle().await;
    let lease = acquire(lock.as_ref(), &request(holder, lease_len), Wait::No)
        .await
        .unwrap();
    (lock, lease)
}

async fn expiry_takeover_only_after_the_observed_lease(key: Key) {
    let lease_len = Duration::from_secs(2);
    let (old, mut stale) = new_holder(&key, "stale-holder", lease_len).await;
    // The holder now stops renewing (paused, partitioned, crashed).
    let contender = key.handle().await;
    let started = Instant::now();
    let taken = acquire(
        contender.as_ref(),
        &request("contender", lease_len),
        Wait::For(Duration::from_secs(60)),
    )
    .await
    .expect("takeover after the lease");
    let waited = started.elapsed();
    assert!(
        waited >= lease_len,
        "took over after {waited:?}, before the {lease_len:?} lease had elapsed on our clock"
    );
    assert_eq!(taken.fence(), stale.fence().next());
    eprintln!("takeover after {waited:?} (lease {lease_len:?})");
    match old.renew(&mut stale).await {
        Err(LockError::Lost {
            reason: LostReason::TakenOver(by),
            ..
        }) => assert_eq!(by.holder, "contender"),
        other => panic!("the stale holder's renewal must report the takeover, got {other:?}"),
    }
}

async fn renewal_keeps_the_lock_past_many_lease_durations(key: Key) {
    // The property holds at any lease; 4 s gives each renewal a 1 s request timeout,
    // which a loaded 2-core machine's moto answers within (at 2 s, 0.5 s once was not).
    let lease_len = Duration::from_secs(4);
    let (holder, lease) = new_holder(&key, "renewer", lease_len).await;
    let fence = lease.fence();
    let held = HeldLock::hold(holder, lease, RenewPolicy::for_lease(lease_len));
    let contender = key.handle().await;
    let until = Instant::now() + lease_len * 3;
    let mut attempts = 0;
    while Instant::now() < until {
        match contender
            .try_acquire(&request("contender", lease_len))
            .await
        {
            Ok(Attempt::Busy { holder, .. }) => assert_eq!(holder.holder, "renewer"),
            Ok(Attempt::Acquired(l)) => {
                panic!("contender acquired a renewed lock (fence {})", l.fence())
            }
            Err(e) => assert!(e.is_transient(), "{e}"),
        }
        attempts += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(attempts > 10);
    assert_eq!(held.fence(), fence);
    held.release()
        .await
        .expect("still ours after three lease durations");
}

async fn release_wakes_a_waiter_and_the_fence_continues(key: Key) {
    let lease_len = Duration::from_secs(30);
    let (first, lease) = new_holder(&key, "first", lease_len).await;
    let fence = lease.fence();

    let waiting = Arc::new(tokio::sync::Notify::new());
    let waiter = {
        let (key, waiting) = (key.clone(), waiting.clone());
        tokio::spawn(async move {
            let lock = key.handle().await;
            let lease = acquire_with_progress(
                lock.as_ref(),
                &request("second", lease_len),
                Wait::For(Duration::from_secs(60)),
                |_, _| waiting.notify_one(),
            )
            .await
            .expect("the waiter acquires after the release");
            (Instant::now(), lock, lease)
        })
    };
    waiting.notified().await;
    let released = Instant::now();
    first.release(&lease).await.unwrap();
    let (acquired, second, lease2) = waiter.await.unwrap();
    eprintln!(
        "handoff: waiter acquired {:?} after the release",
        acquired - released
    );
    assert_eq!(
        lease2.fence(),
        fence.next(),
        "a release leaves a tombstone the next fence continues from"
    );

    second.release(&lease2).await.unwrap();
    let (_third, lease3) = new_holder(&key, "third", lease_len).await;
    assert_eq!(lease3.fence(), fence.next().next());
}

async fn force_takeover_is_conditional(key: Key) {
    let lease_len = Duration::from_secs(30);
    for round in 0..10 {
        let holder = key.handle().await;
        let forcer = key.handle().await;
        let mut lease = acquire(
            holder.as_ref(),
            &request("holder", lease_len),
            Wait::Forever,
        )
        .await
        .unwrap();
        // The holder renews as fast as it can while the forcer takes over.
        let renewing = tokio::spawn(async move {
            for _ in 0..20 {
                match holder.renew(&mut lease).await {
                    Ok(()) => {}
                    Err(LockError::Lost { .. }) => return (holder, lease, true),
                    Err(e) => assert!(e.is_transient(), "{e}"),
                }
            }
            (holder, lease, false)
        });
        let mut force = request("forcer", lease_len);
        force.force = true;
        let forced = forcer.try_acquire(&force).await.unwrap();
        let (holder, mut lease, lost) = renewing.await.unwrap();

        let stored = forcer.inspect().await.unwrap().expect("a record");
        let stored = stored.record.unwrap();
        match forced {
            Attempt::Acquired(forced) => {
                assert!(forced.forced_from.is_some());
                assert_eq!(
                    stored.nonce,
                    forced.nonce(),
                    "round {round}: the forced write must be the stored one"
                );
                // The displaced holder can never write again.
                let again = holder.renew(&mut lease).await;
                assert!(
                    lost || matches!(again, Err(LockError::Lost { .. })),
                    "round {round}: two holders: {again:?}"
                );
                forcer.release(&forced).await.unwrap();
            }
            Attempt::Busy { .. } => {
                assert_eq!(
                    stored.nonce,
                    lease.nonce(),
                    "round {round}: force lost every race; the holder keeps it"
                );
                holder.release(&lease).await.unwrap();
            }
        }
    }
}

macro_rules! rule_tests {
    ($backend:ident, $key:expr, $contention_key:expr) => {
        mod $backend {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mutual_exclusion_under_contention() {
                // Its own server where it is an emulator that serves one request at a
                // time, so the other tests neither slow it down nor wait for it.
                let (_own, key) = $contention_key.await;
                super::mutual_exclusion_under_contention(key).await
            }

            rule_tests!(@each $key;
                expiry_takeover_only_after_the_observed_lease,
                renewal_keeps_the_lock_past_many_lease_durations,
                release_wakes_a_waiter_and_the_fence_continues,
                force_takeover_is_conditional,
            );
        }
    };
    // One test per rule: `super::RULE` on a key `$key` makes.
    (@each $key:expr; $($rule:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $rule() {
                super::$rule($key.await).await
            }
        )+
    };
}

rule_tests!(
    s3,
    Key::s3(),
    Key::on_own_server_if_serialized(s3_choice(), Key::s3_on)
);

/// The API server is not an emulator: the shared one serves the contention test too.
async fn lease_for_contention() -> (Option<Box<dyn AwsServer>>, Key) {
    (None, Key::lease().await)
}
rule_tests!(
    dynamodb,
    Key::dynamo(),
    Key::on_own_server_if_serialized(dynamodb_choice(), Key::dynamo_on)
);
rule_tests!(kubernetes, Key::lease(), lease_for_contention());

/// Rule 4: the store applied our acquisition but the reply never came back. The
/// engine must end up holding the lock (it finds its own nonce), not wait on itself.
async fn lost_reply_acquire_finds_its_own_nonce(key: Key) {
    let proxy = support::proxy::Proxy::start(key.server_port());
    let through_proxy = key.via(proxy.endpoint());
    let lock = through_proxy.handle().await;
    let req = request("lost-reply", Duration::from_secs(30));
    // Warm up: after a release the engine knows the tombstone's version, so the next
    // acquisition is a single conditional write — the request whose reply we drop.
    let warm = acquire(
        lock.as_ref(),
        &request("warm-up", Duration::from_secs(30)),
        Wait::No,
    )
    .await
    .unwrap();
    lock.release(&warm).await.unwrap();

    proxy.set_mode(support::proxy::Mode::DropReplies);
    let first = lock.try_acquire(&req).await;
    assert!(
        matches!(&first, Err(e) if e.is_transient()),
        "with every reply dropped: {first:?}"
    );
    assert!(proxy.dropped_replies() > 0);

    // The write did land: another client sees it.
    let observer = key.handle().await;
    let stored = observer
        .inspect()
        .await
        .unwrap()
        .expect("the lost-reply write landed")
        .record
        .unwrap();
    assert_eq!(stored.holder, "lost-reply");

    proxy.set_mode(support::proxy::Mode::Pass);
    let lease = acquire(lock.as_ref(), &req, Wait::For(Duration::from_secs(30)))
        .await
        .expect("the engine must recognise its own landed write, not wait on itself");
    assert_eq!(lease.nonce(), stored.nonce);
    assert_eq!(lease.fence(), stored.fence);
    lock.release(&lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_lost_reply_acquire_finds_its_own_nonce() {
    lost_reply_acquire_finds_its_own_nonce(Key::s3().await).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_lost_reply_acquire_finds_its_own_nonce() {
    lost_reply_acquire_finds_its_own_nonce(Key::dynamo().await).await
}

/// Rule 4 for a holder: a renewal whose reply was lost landed; the next renewal must
/// not mistake the new version for a takeover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_lost_reply_renewal_is_recognised_as_ours() {
    let key = Key::s3().await;
    let proxy = support::proxy::Proxy::start(key.server_port());
    let lock = key.via(proxy.endpoint()).handle().await;
    let mut lease = acquire(
        lock.as_ref(),
        &request("renewer", Duration::from_secs(30)),
        Wait::No,
    )
    .await
    .unwrap();
    proxy.set_mode(support::proxy::Mode::DropReplies);
    assert!(lock.renew(&mut lease).await.is_err());
    proxy.set_mode(support::proxy::Mode::Pass);
    lock.renew(&mut lease)
        .await
        .expect("a renewal after a lost-reply renewal is still ours");
    lock.release(&lease).await.unwrap();
}

/// Rule 6: foreign or corrupt records are reported, never overwritten without force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_foreign_records_are_reported_not_overwritten() {
    let endpoint = s3_shared().endpoint();
    let client = support::moto::s3_client_for(&endpoint).await;
    let bucket = new_bucket_at(&endpoint, "foreign").await;
    for (name, body) in [
        (
            "s3lock-uuid",
            b"6ba7b810-9dad-11d1-80b4-00c04fd430c8".to_vec(),
        ),
        ("garbage", vec![0xde, 0xad, 0xbe, 0xef, 0x00, 0x01]),
        ("wrong-json", br#"{"lockwarden":1,"holder":42}"#.to_vec()),
    ] {
        client
            .put_object()
            .bucket(&bucket)
            .key(name)
            .body(ByteStream::from(body.clone()))
            .send()
            .await
            .unwrap();
        let lock = CasLock::new(S3Store::new(client.clone(), &bucket, name));
        match lock
            .try_acquire(&request("me", Duration::from_secs(10)))
            .await
        {
            // A bare UUID is a winebarrel/s3lock lock: held by s3lock, with no lease.
            Ok(Attempt::Busy { holder, .. }) if name == "s3lock-uuid" => {
                assert!(
                    holder.holder.contains("s3lock") && holder.holder.contains("6ba7b810"),
                    "{}",
                    holder.holder
                );
            }
            Err(LockError::Foreign { url, found }) if name != "s3lock-uuid" => {
                assert_eq!(url, format!("s3://{bucket}/{name}"));
                eprintln!("{name}: {found}");
            }
            other => panic!("{name}: expected a foreign-record error, got {other:?}"),
        }
        let after = client
            .get_object()
            .bucket(&bucket)
            .key(name)
            .send()
            .await
            .unwrap();
        let after = after.body.collect().await.unwrap().into_bytes();
        assert_eq!(
            after.as_ref(),
            body.as_slice(),
            "{name}: the foreign record was modified"
        );

        // Force takes over, conditionally, starting a new fence sequence.
        let mut force = request("me", Duration::from_secs(10));
        force.force = true;
        let Attempt::Acquired(lease) = lock.try_acquire(&force).await.unwrap() else {
            panic!("force")
        };
        assert_eq!(lease.fence().0, 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_foreign_records_are_reported_not_overwritten() {
    let endpoint = dynamodb_shared().endpoint();
    let client = support::moto::dynamodb_client_for(&endpoint).await;
    let table = new_table_at(&endpoint, "foreign", "key").await;
    let item = [
        ("key", AttributeValue::S("wrong-types".into())),
        ("ownerName", AttributeValue::N("7".into())),
        ("leaseDuration", AttributeValue::S("10s".into())),
        ("recordVersionNumber", AttributeValue::S("abc".into())),
    ];
    let mut put = client.put_item().table_name(&table);
    for (k, v) in item.clone() {
        put = put.item(k, v);
    }
    put.send().await.unwrap();
    let lock = CasLock::new(DynamoStore::new(
        client.clone(),
        TableLayout::new(&table),
        "wrong-types",
    ));
    match lock
        .try_acquire(&request("me", Duration::from_secs(10)))
        .await
    {
        Err(LockError::Foreign { found, .. }) => {
            assert!(found.what.contains("ownerName"), "{found}")
        }
        other => panic!("expected a foreign-record error, got {other:?}"),
    }
    let after = client
        .get_item()
        .table_name(&table)
        .key("key", AttributeValue::S("wrong-types".into()))
        .send()
        .await
        .unwrap();
    assert_eq!(
        after.item().unwrap().get("ownerName"),
        Some(&AttributeValue::N("7".into()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_foreign_records_are_reported_not_overwritten() {
    use k8s_openapi::api::coordination::v1::Lease as KubeLease;
    let Key::Lease {
        kubeconfig,
        namespace,
        name,
    } = Key::lease().await
    else {
        unreachable!()
    };
    let client = support::kube::client_from_kubeconfig(&kubeconfig).await;
    let api: kube::Api<KubeLease> = kube::Api::namespaced(client.clone(), &namespace);
    let corrupt: KubeLease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "annotations": {"lockwarden.io/nonce": "n", "lockwarden.io/lease-ms": "1000", "lockwarden.io/state": "bogus"}},
        "spec": {"holderIdentity": "x", "leaseDurationSeconds": 1}
    }))
    .unwrap();
    api.create(&Default::default(), &corrupt).await.unwrap();
    let lock = CasLock::new(LeaseStore::new(client, &namespace, &name));
    match lock
        .try_acquire(&request("me", Duration::from_secs(10)))
        .await
    {
        Err(LockError::Foreign { found, .. }) => assert!(found.what.contains("bogus"), "{found}"),
        other => panic!("expected a foreign-record error, got {other:?}"),
    }
    let after = api.get(&name).await.unwrap();
    assert_eq!(
        after.metadata.annotations.unwrap()["lockwarden.io/state"],
        "bogus"
    );
}

/// Rule 2 on a real store: when the store becomes unreachable the holder stops
/// claiming the lock before its lease could be seen expired by anyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_holder_stops_claiming_before_the_lease_can_expire_for_others() {
    let key = Key::s3().await;
    let proxy = support::proxy::Proxy::start(key.server_port());
    let lease_len = Duration::from_secs(3);
    let holder = key.via(proxy.endpoint()).handle().await;
    let lease = acquire(
        holder.as_ref(),
        &request("partitioned", lease_len),
        Wait::No,
    )
    .await
    .unwrap();
    let mut policy = RenewPolicy::for_lease(lease_len);
    policy.request_timeout = Duration::from_millis(500);
    let held = HeldLock::hold(holder, lease, policy);

    proxy.set_mode(support::proxy::Mode::Blackhole);
    // A contender starts observing at the moment of the partition (the earliest it
    // could possibly start); the holder must give up before it can take over.
    let contender = key.handle().await;
    let observed_from = Instant::now();
    let lost = held.lost();
    let taken = tokio::spawn(async move {
        acquire(
            contender.as_ref(),
            &request("contender", lease_len),
            Wait::For(Duration::from_secs(60)),
        )
        .await
        .map(|_| Instant::now())
    });
    let state = lost.await;
    let gave_up = Instant::now();
    assert!(matches!(state, HolderState::Expiring { .. }), "{state:?}");
    let taken_at = taken
        .await
        .unwrap()
        .expect("the contender takes over after the lease");
    assert!(
        gave_up < taken_at,
        "holder claimed the lock until {:?}, contender took it at {:?}",
        gave_up - observed_from,
        taken_at - observed_from
    );
    eprintln!(
        "holder gave up {:?} after the partition; contender acquired after {:?}",
        gave_up - observed_from,
        taken_at - observed_from
    );
    proxy.set_mode(support::proxy::Mode::Pass);
}

/// The documented option: deleting the record on release leaves nothing behind, and
/// the next acquisition starts the fence sequence again at 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_delete_on_release_removes_the_record_and_resets_the_fence() {
    let endpoint = s3_shared().endpoint();
    let client = support::moto::s3_client_for(&endpoint).await;
    let bucket = new_bucket_at(&endpoint, "delete").await;
    let lock =
        CasLock::new(S3Store::new(client.clone(), &bucket, "k")).with_delete_on_release(true);
    let req = request("deleter", Duration::from_secs(30));
    let first = acquire(&lock, &req, Wait::No).await.unwrap();
    assert_eq!(first.fence().0, 1);
    lock.release(&first).await.unwrap();
    let head = client.head_object().bucket(&bucket).key("k").send().await;
    assert!(
        head.is_err(),
        "the record should be gone after release: {head:?}"
    );
    let second = acquire(&lock, &req, Wait::No).await.unwrap();
    assert_eq!(
        second.fence().0,
        1,
        "delete-on-release resets the fence sequence"
    );
}

/// A table with a custom partition key name and a sort key, created by lockwarden.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_custom_partition_key_sort_key_and_table_creation() {
    let client = support::moto::dynamodb_client_for(&dynamodb_shared().endpoint()).await;
    let layout = TableLayout {
        table: support::unique("created"),
        partition_key: "lockName".into(),
        sort_key: Some(("scope".into(), "payments".into())),
    };
    let store = DynamoStore::new(client.clone(), layout.clone(), "db-migration");
    store.ensure_table().await.expect("table created on demand");
    store
        .ensure_table()
        .await
        .expect("and found the second time");
    let lock = CasLock::new(store);
    let lease = acquire(&lock, &request("sorted", Duration::from_secs(30)), Wait::No)
        .await
        .unwrap();
    let item = client
        .get_item()
        .table_name(&layout.table)
        .key("lockName", AttributeValue::S("db-migration".into()))
        .key("scope", AttributeValue::S("payments".into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    let item = item.item().expect("the lock item under both keys");
    assert_eq!(
        item.get("ownerName"),
        Some(&AttributeValue::S("sorted".into()))
    );
    assert_eq!(
        item.get("leaseDuration"),
        Some(&AttributeValue::S("30s".into()))
    );
    assert_eq!(
        item.get("fence"),
        Some(&AttributeValue::N(lease.fence().0.to_string()))
    );
    lock.release(&lease).await.unwrap();
}

/// lockwarden's S3 PUTs are signed by lockwarden, not by the SDK (`s3/put.rs`): on
/// versitygw, which verifies every SigV4 signature (moto accepts any), each write of
/// a lock's life is accepted for keys whose names need encoding, answers its
/// conditions as S3 does, carries the history in user metadata, and goes out as one
/// signed request each; a wrong secret is refused, so the accepted signatures were
/// checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_puts_signed_without_the_sdk_are_accepted_and_conditional() {
    use lockwarden::backend::s3::signed_puts;
    use lockwarden::lock::{FenceToken, LockRecord, LockState, RecordStore, StoreError};
    use support::moto::{aws_options_for, s3_client_for};
    use support::versitygw::VersityGw;

    let endpoint = VersityGw::shared().endpoint();
    let bucket = new_bucket_at(&endpoint, "signed").await;
    let client = s3_client_for(&endpoint).await;
    let puts = signed_puts(&aws_options_for(&endpoint), &Default::default())
        .await
        .expect("static credentials sign");
    for key in [
        "plain",
        "with space/and+plus=equals&amp;",
        "ünïcödé/κλειδί",
        "percent%2Fencoded",
        "tilde~star*(paren)!'",
        "deeper/a/b/c.lock",
    ] {
        let store = S3Store::new(client.clone(), &bucket, key).with_signed_puts(puts.clone());
        let sent = puts.attempts();
        let mut held =
            LockRecord::new_acquisition("me", FenceToken(1), Duration::from_secs(30), None);
        held.history = vec![lockwarden::lock::history::Grant::new(
            "me",
            None,
            FenceToken(1),
            std::time::SystemTime::now(),
        )];
        let v1 = store
            .create(&held)
            .await
            .unwrap_or_else(|e| panic!("{key}: create: {e}"));
        assert!(
            matches!(store.create(&held).await, Err(StoreError::Conflict { .. })),
            "{key}: If-None-Match: * on an existing object is a conflict"
        );
        let renewed = held.renewed();
        let v2 = store
            .replace(&v1, &renewed)
            .await
            .unwrap_or_else(|e| panic!("{key}: renew: {e}"));
        assert_ne!(v1, v2, "{key}: a renewal has a new ETag");
        assert!(
            matches!(
                store.replace(&v1, &renewed).await,
                Err(StoreError::Conflict { .. })
            ),
            "{key}: If-Match on a stale ETag is a conflict"
        );
        let released = renewed.released();
        let v3 = store
            .replace(&v2, &released)
            .await
            .unwrap_or_else(|e| panic!("{key}: release: {e}"));
        assert_eq!(
            puts.attempts() - sent,
            5,
            "{key}: every PUT went out signed by lockwarden, once"
        );
        let stored = store.read().await.unwrap().expect("the object is there");
        assert_eq!(stored.version, v3, "{key}");
        let record = stored.record.expect("lockwarden's record");
        assert_eq!(record.state, LockState::Released, "{key}");
        assert_eq!(
            record.revision, released.revision,
            "{key}: the body is the last PUT's"
        );
        assert_eq!(
            record.history.len(),
            1,
            "{key}: the history travels in the user metadata"
        );
    }

    let mut wrong = aws_options_for(&endpoint);
    wrong.credentials = Some(lockwarden::backend::Credentials::new(
        support::moto::ACCESS_KEY_ID,
        "not-the-secret",
        None,
    ));
    let forged = signed_puts(&wrong, &Default::default()).await.unwrap();
    let store = S3Store::new(client.clone(), &bucket, "forged").with_signed_puts(forged);
    let held = LockRecord::new_acquisition("me", FenceToken(1), Duration::from_secs(30), None);
    match store.create(&held).await {
        Err(StoreError::Rejected(why)) => assert!(why.contains("HTTP 403"), "{why}"),
        other => panic!("a PUT signed with the wrong secret was not refused: {other:?}"),
    }
}

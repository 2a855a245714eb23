//! The compatibility rule of docs/design.md §3 ("Stored formats that can evolve") on
//! the in-memory store, with the record codec in the loop ([`MemoryStore::encoded`]):
//! two builds on one key, today's and a newer one whose every write carries fields
//! today's does not know ([`NewerBuild`]). Neither loses the lock, and the newer
//! build's fields survive today's writes. (tests/formats.rs runs the same on the real
//! stores.)

use serde_json::Value;

use super::backend::{AcquireRequest, Attempt, Lease, LockBackend, RecordStore};
use super::cas::CasLock;
use super::cas::tests::{LEASE, MARGINS};
use super::memory::{MemoryStore, NewerBuild};
use super::permits::{Mode, Permits};

fn builds() -> (
    MemoryStore,
    CasLock<MemoryStore>,
    CasLock<NewerBuild<MemoryStore>>,
) {
    let store = MemoryStore::encoded("mem://locks/upgraded");
    let today = CasLock::new(store.clone()).with_margins(MARGINS);
    let newer = CasLock::new(NewerBuild::new(store.clone(), "newer")).with_margins(MARGINS);
    (store, today, newer)
}

fn req(holder: &str, permits: Permits) -> AcquireRequest {
    AcquireRequest {
        permits,
        ..AcquireRequest::new(holder, LEASE)
    }
}

async fn acquired<S: RecordStore>(lock: &CasLock<S>, req: &AcquireRequest) -> Lease {
    match lock.try_acquire(req).await {
        Ok(Attempt::Acquired(lease)) => lease,
        other => panic!("{} should have acquired: {other:?}", req.holder),
    }
}

async fn busy_with<S: RecordStore>(lock: &CasLock<S>, req: &AcquireRequest) -> String {
    match lock.try_acquire(req).await {
        Ok(Attempt::Busy { holder, .. }) => holder.holder,
        other => panic!("{} should have found the key held: {other:?}", req.holder),
    }
}

/// The newer build's record-level field, as the store keeps it now.
fn record_field(store: &MemoryStore) -> Value {
    store.body().expect("a record")["newerRecord"].clone()
}

#[tokio::test]
async fn a_rolling_upgrade_keeps_every_lock() {
    let (store, today, newer) = builds();
    let (old_req, new_req) = (req("today", Permits::MUTEX), req("newer", Permits::MUTEX));

    // The newer build holds: today's build reads its record as a holder's, not as
    // foreign, and the newer holder renews and releases as usual.
    let mut held = acquired(&newer, &new_req).await;
    assert_eq!(record_field(&store), "kept");
    assert_eq!(busy_with(&today, &old_req).await, "newer");
    newer
        .renew(&mut held)
        .await
        .expect("the newer holder renews");
    newer
        .release(&held)
        .await
        .expect("the newer holder releases");

    // Today's build takes the key over from the newer tombstone and keeps the field
    // through its acquisition, renewals and release.
    let mut held = acquired(&today, &old_req).await;
    assert_eq!(record_field(&store), "kept", "after today's acquisition");
    today.renew(&mut held).await.expect("today's holder renews");
    assert_eq!(record_field(&store), "kept", "after today's renewal");
    assert_eq!(busy_with(&newer, &new_req).await, "today");
    today.release(&held).await.expect("today's holder releases");
    assert_eq!(record_field(&store), "kept", "after today's release");

    // And back: the newer build acquires after today's release.
    let held = acquired(&newer, &new_req).await;
    newer.release(&held).await.unwrap();
}

#[tokio::test]
async fn a_rolling_upgrade_keeps_every_permit() {
    let (store, today, newer) = builds();
    let permits = Permits::semaphore(3);
    let (old_req, new_req) = (req("today", permits), req("newer", permits));

    let mut newer_held = acquired(&newer, &new_req).await;
    // A permit beside the newer build's: today's build reads its set, and its grant
    // carries every field of it.
    let mut today_held = acquired(&today, &old_req).await;
    let newer_fields_kept = |when: &str| {
        let body = store.body().expect("a record");
        assert_eq!(body["newerRecord"], "kept", "{when}: {body}");
        let set = &body["holders"];
        assert_eq!(set["newerSet"], "kept", "{when}: {body}");
        let entry = |holder: &str| {
            set["holders"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["holder"] == holder)
                .cloned()
        };
        if let Some(entry) = entry("newer") {
            assert_eq!(entry["newerEntry"], 1, "{when}: {body}");
        }
        if let Some(entry) = entry("today") {
            assert_eq!(entry.get("newerEntry"), None, "{when}: {body}");
        }
        body
    };
    newer_fields_kept("after today's grant");

    // Renewals interleave: each one finds the set last written by the other build,
    // loses the race, re-reads it and writes it back with what it does not know.
    for round in 0..3 {
        newer
            .renew(&mut newer_held)
            .await
            .unwrap_or_else(|e| panic!("round {round}: the newer holder renews: {e}"));
        today
            .renew(&mut today_held)
            .await
            .unwrap_or_else(|e| panic!("round {round}: today's holder renews: {e}"));
        newer_fields_kept(&format!("after today's renewal {round}"));
    }
    assert!(newer_held.is_valid() && today_held.is_valid());

    today
        .release(&today_held)
        .await
        .expect("today's holder releases");
    let body = newer_fields_kept("after today's release");
    assert_eq!(body["holders"]["holders"].as_array().unwrap().len(), 1);
    newer
        .renew(&mut newer_held)
        .await
        .expect("the newer holder still holds its permit");
    newer.release(&newer_held).await.unwrap();
    assert_eq!(store.record().set.unwrap().holders.len(), 0);
}

#[tokio::test]
async fn a_newer_exclusive_waiter_is_kept_and_honoured() {
    // The waiting-writer slot of a set is an entry too: today's build keeps the newer
    // writer's registration (and its field) while it admits nobody past it.
    let (store, today, newer) = builds();
    let permits = Permits::semaphore(2);
    let reader = req("today", permits);
    let held = acquired(&today, &reader).await;
    let writer = req(
        "newer",
        Permits {
            total: 2,
            mode: Mode::Exclusive,
        },
    );
    assert_eq!(busy_with(&newer, &writer).await, "today");
    let waiting = store
        .record()
        .set
        .unwrap()
        .waiting_writer
        .expect("registered");
    assert_eq!(waiting.unknown["newerEntry"], 1);
    // A second reader of today's build is not admitted past the newer writer.
    let other = CasLock::new(store.clone()).with_margins(MARGINS);
    busy_with(&other, &req("today-2", permits)).await;
    today.release(&held).await.unwrap();
    let set = store.record().set.unwrap();
    assert_eq!(set.waiting_writer.unwrap().unknown["newerEntry"], 1);
    let held = acquired(&newer, &writer).await;
    newer.release(&held).await.unwrap();
}

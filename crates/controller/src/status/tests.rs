//! The status a reconcile writes, built from what is known: phases, conditions,
//! history, queue places, and the CRD-revision fallback.

use super::*;

/// The API server's answer to an apply of `status.history` against a CRD from
/// before revision 3 is recognised; other refusals are not retried.
#[test]
fn a_crd_without_status_history_is_recognised() {
    assert!(undeclared_history(
        "failed to create typed patch object (ns/l; lockwarden.io/v1alpha1, Kind=DistributedLock): \
         .status.history: field not declared in schema"
    ));
    assert!(!undeclared_history(
        ".status.fence: field not declared in schema"
    ));
    assert!(!undeclared_history(
        "status.history: Too many: 9: must have at most 8 items"
    ));
}
use lockwarden_api::DistributedLockSpec;
use lockwarden_api::conditions::reason;

fn held(fence: i64) -> Desired {
    Desired {
        phase: Some(LockPhase::Held),
        backend: Some("kubernetes".into()),
        key: Some("k8s://ns/l".into()),
        holder: Some("c/ns/x".into()),
        etag: Some("1".into()),
        fence: Some(fence),
        nonce: Some("n".into()),
        acquired: (true, reason::LEASE_HELD, format!("held with fence {fence}")),
        ..Default::default()
    }
}

#[test]
fn writes_only_on_transitions() {
    let mut lock = DistributedLock::new("x", DistributedLockSpec::default());
    lock.metadata.generation = Some(1);
    let first = next_status(&lock, held(1)).expect("a new status is a change");
    assert!(first.renewed_at.is_some());
    assert_eq!(first.observed_generation, Some(1));
    lock.status = Some(first.clone());
    // The same knowledge again (a resync, a resume): nothing to write.
    assert_eq!(next_status(&lock, held(1)), None);
    // A new fence is a transition.
    let second = next_status(&lock, held(2)).expect("changed");
    assert_eq!(second.fence, Some(2));
    // A new generation is reported even when nothing else changed.
    lock.metadata.generation = Some(2);
    assert_eq!(
        next_status(&lock, held(1)).unwrap().observed_generation,
        Some(2)
    );
    // Leaving Held clears renewedAt.
    let waiting = Desired {
        phase: Some(LockPhase::Waiting),
        acquired: (false, reason::WAITING, "held by y".into()),
        ..Default::default()
    };
    assert_eq!(next_status(&lock, waiting).unwrap().renewed_at, None);
}

/// The stored status comes back from the API server with whole-second times; a
/// held lock with a sub-second `acquiredAt` must still compare equal to it.
#[test]
fn stored_times_compare_equal_after_a_round_trip() {
    let mut lock = DistributedLock::new("x", DistributedLockSpec::default());
    lock.metadata.generation = Some(1);
    let acquired_at = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_123);
    let desired = || Desired {
        acquired_at: time(acquired_at),
        ..held(1)
    };
    let written = next_status(&lock, desired()).expect("a new status is a change");
    let stored: DistributedLockStatus =
        serde_json::from_value(serde_json::to_value(&written).unwrap()).unwrap();
    lock.status = Some(stored);
    assert_eq!(next_status(&lock, desired()), None);
}

fn acquisition(forced_from: Option<&str>) -> Acquisition {
    Acquisition {
        holder: "c/ns/x".into(),
        fence: 7,
        nonce: "n".into(),
        version: "v1".into(),
        acquired_at: SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000),
        forced_from: forced_from.map(|h| lockwarden_core::HeldBy {
            holder: h.into(),
            fence: FenceToken(6),
            since: None,
            nonce: String::new(),
        }),
        occupancy: None,
        history: Vec::new(),
    }
}

fn acquired_condition(
    status: &DistributedLockStatus,
) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    conditions::find_condition(&status.conditions, ACQUIRED).expect("Acquired condition")
}

fn stale(t: Option<Time>) -> Option<Time> {
    t.map(|t| Time(t.0 - std::time::Duration::from_secs(3600)))
}

/// Renewals change neither the acquisition nor the phase, so a steady held lock
/// costs no status writes however old its `renewedAt` is.
#[test]
fn renewals_alone_cause_no_write() {
    let mut lock = DistributedLock::new("x", DistributedLockSpec::default());
    lock.metadata.generation = Some(3);
    let desired = || Desired::for_key("s3", "s3://b/k").held(&acquisition(None), None);
    let mut stored = next_status(&lock, desired()).expect("first write");
    stored.renewed_at = stale(stored.renewed_at.clone());
    lock.status = Some(stored.clone());
    assert_eq!(next_status(&lock, desired()), None);
    // Something else changing does refresh renewedAt.
    let expiring = Desired::for_key("s3", "s3://b/k").held(&acquisition(None), Some("timeout"));
    let next = next_status(&lock, expiring).expect("a transition");
    assert!(next.renewed_at > stored.renewed_at);
}

/// `status.history` costs no write of its own: a history that changed while
/// nothing else did (another waiter's view of the key) waits for the next write
/// that happens anyway, and that write carries it.
#[test]
fn the_history_rides_along_with_writes_that_happen_anyway() {
    let mut lock = DistributedLock::new("x", DistributedLockSpec::default());
    lock.metadata.generation = Some(1);
    let mut record = LockRecord::new_acquisition(
        "east/ns/a",
        FenceToken(4),
        std::time::Duration::from_secs(30),
        None,
    );
    let waiting = |r: &LockRecord| {
        Desired::for_key("s3", "s3://b/k")
            .waiting(&r.holder, r.fence, None)
            .with_history_of(r)
    };
    let first = next_status(&lock, waiting(&record)).expect("first write");
    let history = first
        .history
        .clone()
        .expect("written with the first status");
    assert_eq!((history[0].fence, history[0].ended.as_str()), (4, "held"));
    lock.status = Some(first);
    // Only the history differs: no write.
    record.history = history::after_release(&record, SystemTime::now());
    record.history.insert(
        0,
        Grant::new("west/ns/b", Some("west"), FenceToken(3), SystemTime::now()),
    );
    assert_eq!(next_status(&lock, waiting(&record)), None);
    // Held by us now: that write carries our acquisition's history.
    let ours = Acquisition {
        history: history::after_grant(
            Some(&record.released()),
            lockwarden_core::Ending::Released,
            Grant::new("c/ns/x", Some("c"), FenceToken(5), SystemTime::now()),
            SystemTime::now(),
        ),
        ..acquisition(None)
    };
    let held = next_status(&lock, Desired::for_key("s3", "s3://b/k").held(&ours, None))
        .expect("a transition");
    let fences: Vec<i64> = held.history.unwrap().iter().map(|g| g.fence).collect();
    assert_eq!(fences, [3, 4, 5]);
}

#[test]
fn the_condition_follows_phase_and_generation() {
    let mut lock = DistributedLock::new("x", DistributedLockSpec::default());
    lock.metadata.generation = Some(1);
    let base = || Desired::for_key("zookeeper", "zk://h:2181/l");
    let mut waiting =
        next_status(&lock, base().waiting("y", FenceToken(4), Some(2))).expect("first write");
    assert_eq!(waiting.phase, Some(LockPhase::Waiting));
    assert_eq!(waiting.holder.as_deref(), Some("y"));
    assert_eq!(waiting.queue_position, Some(2));
    let condition = acquired_condition(&waiting);
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("False", reason::WAITING)
    );
    assert_eq!(condition.message, "held by y (fence 4)");
    assert_eq!(condition.observed_generation, Some(1));
    let long_ago = stale(Some(condition.last_transition_time.clone())).unwrap();
    waiting.conditions[0].last_transition_time = long_ago.clone();
    lock.status = Some(waiting);

    // Same condition status, new message: written, transition time kept.
    let moved = next_status(&lock, base().waiting("z", FenceToken(5), Some(1)))
        .expect("a new holder is a change");
    let condition = acquired_condition(&moved);
    assert_eq!(condition.message, "held by z (fence 5)");
    assert_eq!(condition.last_transition_time, long_ago);

    // A new generation alone is a write, into the condition too.
    lock.metadata.generation = Some(2);
    let regenerated = next_status(&lock, base().waiting("y", FenceToken(4), Some(2)))
        .expect("a new generation is a change");
    assert_eq!(regenerated.observed_generation, Some(2));
    assert_eq!(
        acquired_condition(&regenerated).observed_generation,
        Some(2)
    );

    // Acquired: the condition turns True with a new transition time; queue and
    // renewedAt follow the phase.
    let held = next_status(&lock, base().held(&acquisition(None), None)).expect("changed");
    let condition = acquired_condition(&held);
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("True", reason::LEASE_HELD)
    );
    assert_ne!(condition.last_transition_time, long_ago);
    assert_eq!(held.queue_position, None);
    assert_eq!(held.fence, Some(7));
    assert_eq!(held.etag.as_deref(), Some("v1"));
    assert!(held.renewed_at.is_some());

    // Failed clears what belonged to the holder.
    lock.status = Some(held);
    let failed =
        next_status(&lock, base().failed(reason::FOREIGN, "foreign".into())).expect("changed");
    assert_eq!(failed.phase, Some(LockPhase::Failed));
    assert_eq!(failed.fence, None);
    assert_eq!(failed.nonce, None);
    assert_eq!(failed.renewed_at, None);
    assert_eq!(acquired_condition(&failed).status, "False");
}

#[test]
fn held_says_whether_it_can_be_relied_on() {
    let base = || Desired::for_key("s3", "s3://b/k");
    let held = base().held(&acquisition(None), None);
    assert_eq!(
        held.acquired,
        (true, reason::LEASE_HELD, "held with fence 7".to_string())
    );
    assert_eq!(held.backend.as_deref(), Some("s3"));
    assert_eq!(held.key.as_deref(), Some("s3://b/k"));
    let forced = base().held(&acquisition(Some("other")), None);
    assert_eq!(
        (forced.acquired.0, forced.acquired.1),
        (true, reason::FORCED)
    );
    assert!(
        forced
            .acquired
            .2
            .starts_with("taken over by force from other")
    );
    // Failing renewals win over everything: the lock is not claimed.
    let expiring = base().held(&acquisition(Some("other")), Some("timed out"));
    assert_eq!(
        expiring.acquired,
        (
            false,
            reason::LEASE_EXPIRING,
            "renewals failing, not claiming the lock: timed out".to_string()
        )
    );
    assert_eq!(expiring.phase, Some(LockPhase::Held));
}

#[test]
fn times_are_whole_seconds() {
    assert_eq!(now().0.subsec_nanosecond(), 0);
    let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_999);
    let whole = time(t).expect("representable");
    assert_eq!(whole.0.subsec_nanosecond(), 0);
    assert_eq!(whole.0.as_second(), 1_700_000_000);
}

#[test]
fn a_key_with_permits_reports_its_holders_and_permits_in_use() {
    let mut lock = DistributedLock::new("x", DistributedLockSpec::default());
    lock.metadata.generation = Some(1);
    let occupancy = Occupancy {
        holders: 2,
        in_use: 2,
        permits: 3,
    };
    let semaphore = Acquisition {
        occupancy: Some(occupancy),
        ..acquisition(None)
    };
    let held = next_status(
        &lock,
        Desired::for_key("s3", "s3://b/k").held(&semaphore, None),
    )
    .expect("first write");
    assert_eq!((held.holders, held.permits_in_use), (Some(2), Some(2)));
    assert_eq!(held.fence, Some(7), "the lock's own fence");
    assert_eq!(
        acquired_condition(&held).message,
        "held with fence 7 (2 holders, 2 of 3 permits in use)"
    );

    let full = Occupancy {
        holders: 3,
        in_use: 3,
        permits: 3,
    };
    let waiting =
        Desired::for_key("s3", "s3://b/k").waiting_for_permit("a", FenceToken(9), None, full);
    let waiting = next_status(&lock, waiting).expect("a change");
    assert_eq!(waiting.phase, Some(LockPhase::Waiting));
    assert_eq!(
        (waiting.holders, waiting.permits_in_use),
        (Some(3), Some(3))
    );
    assert_eq!(
        acquired_condition(&waiting).message,
        "no permit free: 3 holders, 3 of 3 permits in use (latest fence 9)"
    );

    // A mutex's status has neither (as before).
    lock.status = Some(waiting);
    let mutex = next_status(
        &lock,
        Desired::for_key("s3", "s3://b/k").held(&acquisition(None), None),
    )
    .expect("a change");
    assert_eq!((mutex.holders, mutex.permits_in_use), (None, None));
}

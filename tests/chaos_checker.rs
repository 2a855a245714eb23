//! Proofs that the fault-injection harness's checker can fail, on engine clients
//! (tests/chaos.rs runs the schedules it checks; tests/chaos_checker_commands.rs has
//! the proofs on `lockwarden run` and `guard`): each `checker_catches_*` test runs a
//! plan with correct contenders, which must pass and must have exercised the rule,
//! and the same plan with one contender broken on purpose (tests/chaos/flaws.rs), whose
//! violation must be reported, naming it (tests/chaos/proof.rs). The rules are in
//! docs/safety.md, "Fault-injection harness".
//!
//! Each of the three binaries runs one plan at a time on servers of its own
//! (tests/chaos/world.rs), so the three run side by side.

// The harness's modules are tests/chaos.rs's; the proofs use part of them.
#![allow(dead_code)]

use lockwarden_testsupport as support;

#[path = "chaos/cli.rs"]
mod cli;
#[path = "chaos/flaws.rs"]
mod flaws;
#[path = "chaos/history.rs"]
mod history;
#[path = "chaos/mirror.rs"]
mod mirror;
#[path = "chaos/proof.rs"]
mod proof;
#[path = "chaos/schedule.rs"]
mod schedule;
#[path = "chaos/world.rs"]
mod world;

use std::time::Duration;

use flaws::Flaw;
use lockwarden::lock::{Mode as LockMode, Permits, Queueing};
use proof::{
    SHORT_HOLD, at_least_one, correct_then_broken, engine_0_cut_off, mutex_engine, one_key_plan,
};
use schedule::{Backend, Contender, EngineSpec, Fault, Plan};
use support::proxy::Mode;

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// A plan on S3 with two engine clients and no controllers: slot 0 acquires first,
/// is partitioned (blackhole) for twice the lease, and slot 1 takes over meanwhile.
fn partition_plan(seed: u64, broken: bool) -> Plan {
    let nine_s = (Duration::from_secs(9), Duration::from_secs(9));
    let engines = vec![
        mutex_engine(0, Duration::ZERO, nine_s, broken),
        mutex_engine(1, Duration::from_millis(800), SHORT_HOLD, false),
    ];
    one_key_plan(seed, Backend::S3, 1, engines, vec![], engine_0_cut_off())
}

/// Proof that the checker can fail: a holder that keeps claiming (and writing) while
/// its holder task says `Expiring` overlaps the contender that took over, and its
/// writes are refused by the register. The same plan with a correct holder passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_catches_a_holder_that_ignores_its_deadline() {
    let reported = [
        (
            "(c) overlapping claims",
            "engine-0-broken",
            "the broken holder's overlap",
        ),
        (
            "(a)",
            "engine-0-broken",
            "the broken holder's refused writes",
        ),
    ];
    correct_then_broken(1, partition_plan, |_| Ok(()), &reported).await;
}

/// A semaphore plan on S3: one key with 2 permits and three engine clients. Slot 0
/// (fence 1) and slot 1 (fence 2, from 0.3 s) hold for 9 s, filling both permits;
/// slot 2 asks from 0.8 s on. Slot 0 is partitioned (blackhole) from 1.2 s for 7 s:
/// once its entry has been seen unchanged for its lease, slot 2 reclaims its permit.
fn permit_partition_plan(seed: u64, broken: bool) -> Plan {
    let contender = |slot: usize, start_ms: u64, hold: (u64, u64), ignores_deadline| {
        let (start_after, hold) = (millis(start_ms), (millis(hold.0), millis(hold.1)));
        EngineSpec {
            ignores_deadline,
            ..EngineSpec::new(
                slot,
                Some(0),
                slot,
                Permits::semaphore(2),
                start_after,
                hold,
            )
        }
    };
    let engines = vec![
        contender(0, 0, (9000, 9000), broken),
        contender(1, 300, (9000, 9000), false),
        contender(2, 800, (300, 800), false),
    ];
    one_key_plan(seed, Backend::S3, 2, engines, vec![], engine_0_cut_off())
}

/// The proof for semaphore schedules: a permit holder that keeps writing while its
/// holder task says `Expiring` overlaps the two holders of the key's permits after its
/// own was reclaimed; the same checker that passes the correct holder reports three
/// permits in flight (p) and writes after its entry left the store (r).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_catches_a_permit_holder_that_ignores_its_deadline() {
    let both_in_flight = |r: &history::Report| match r.permits_in_flight[..] {
        [(2, 2)] => Ok(()),
        ref other => Err(format!("both permits were not in use at once: {other:?}")),
    };
    let reported = [(
        "(r)",
        "engine-0-c0-broken",
        "the broken holder's writes after its permit was gone",
    )];
    let (_, broken) =
        correct_then_broken(5, permit_partition_plan, both_in_flight, &reported).await;
    let v = &broken.report.violations;
    // The holder named after the holders in flight is the one whose permit was taken.
    assert!(
        v.iter().any(|v| v.contains("(p) 3 permits in flight")
            && v.split("; ")
                .nth(1)
                .is_some_and(|flagged| flagged.starts_with("engine-0-c0-broken"))),
        "the third holder at once (the broken one) was not reported: {v:?}"
    );
}

/// A queued engine contender for the queue proofs, on key 0 of a 2-permit Lease key.
fn queued_contender(
    contender: usize,
    mode: LockMode,
    start_ms: u64,
    hold: (u64, u64),
) -> EngineSpec {
    let permits = Permits { total: 2, mode };
    let (start_after, hold) = (millis(start_ms), (millis(hold.0), millis(hold.1)));
    EngineSpec {
        queue: Some(Queueing::default()),
        ..EngineSpec::new(
            contender % 5,
            Some(0),
            contender,
            permits,
            start_after,
            hold,
        )
    }
}

/// A queue plan on a Lease: 2 permits, five contenders of priority 0 arriving over
/// 0.5 s and a sixth at 1 s, each holding 0.5–0.9 s, so a queue forms and drains while
/// the observer reads. With `flaw`, the sixth's engine reads every other waiter as ranked
/// behind it. A delay fault on an engine path nobody uses (slot 5) keeps the schedule
/// running for 8 s.
fn queue_order_plan(seed: u64, flaw: Option<Flaw>) -> Plan {
    let idle_path_delayed_for_8s = Fault::Network {
        target: Contender::Engine(5),
        mode: Mode::Delay(Duration::from_millis(1)),
        lasts: Duration::from_secs(8),
    };
    let mut engines: Vec<EngineSpec> = (0..5)
        .map(|c| queued_contender(c, LockMode::Shared, c as u64 * 100, (500, 900)))
        .collect();
    engines.push(EngineSpec {
        flaw,
        ..queued_contender(5, LockMode::Shared, 1000, (500, 900))
    });
    let faults = vec![(Duration::from_millis(500), idle_path_delayed_for_8s)];
    one_key_plan(seed, Backend::Lease, 2, engines, vec![], faults)
}

/// Proof that the order rule (o) can fail: an engine that grants itself ahead of
/// earlier arrivals is reported; the same plan with the real engine passes, with grants
/// checked against waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_catches_an_engine_that_grants_out_of_order() {
    let checked = |r: &history::Report| {
        at_least_one(
            r.queue_grants_checked,
            "no grant was checked against a waiter",
        )
    };
    let plan = |seed, broken: bool| queue_order_plan(seed, broken.then_some(Flaw::JumpsTheQueue));
    let reported = [("(o)", "engine-0-c5-broken", "the queue jumper's grants")];
    correct_then_broken(27_001, plan, checked, &reported).await;
}

/// A queue plan on a Lease: 2 permits; an exclusive contender takes both at once and
/// dies holding (no renewal, no release); four shared contenders queue from 0.3 s on.
/// With `flaw`, every engine reads each other entry's revision as the record's version,
/// so nobody claims the key again: that plan runs for [`STALLED_PLAN_RUNS`], not the
/// full liveness limit.
fn dead_holder_plan(seed: u64, flaw: Option<Flaw>) -> Plan {
    let mut engines = vec![EngineSpec {
        crashes_holding: true,
        ..queued_contender(0, LockMode::Exclusive, 0, (0, 0))
    }];
    engines.extend((1..5).map(|c| EngineSpec {
        flaw,
        ..queued_contender(c, LockMode::Shared, 200 + c as u64 * 100, (300, 600))
    }));
    let plan = one_key_plan(seed, Backend::Lease, 2, engines, vec![], vec![]);
    match flaw {
        Some(_) => Plan {
            liveness_limit: STALLED_PLAN_RUNS,
            ..plan
        },
        None => plan,
    }
}

/// How long the flawed dead-holder plan runs: its waiters never drop the dead entry, so
/// it would run until the liveness limit (60 s). Rule (q) reports the entry once it has
/// been seen unchanged for its lease's takeover plus 4 s of slack (7.25 s for the 3 s
/// lease): 20 s shows it with room for a loaded machine.
const STALLED_PLAN_RUNS: Duration = Duration::from_secs(20);

/// Proof that rule (q) can fail: engines that judge an entry by the whole record's
/// version never see a dead holder expire while the waiters' refreshes change the
/// record, and the checker reports the dead entry kept; the real engine drops it after
/// its lease and the same checker passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_catches_an_engine_that_observes_the_whole_records_version() {
    let seen = |r: &history::Report| match r.queue_longest_unchanged {
        t if t > 2.0 => Ok(()),
        t => Err(format!(
            "the dead holder was seen while waiters waited for only {t:.1}s"
        )),
    };
    let flaw = Flaw::ObservesTheRecordVersion;
    let plan = |seed, broken: bool| dead_holder_plan(seed, broken.then_some(flaw));
    let reported = [(
        "(q)",
        "engine-0-c0-exclusive-crashes",
        "the dead holder the waiters kept",
    )];
    correct_then_broken(27_003, plan, seen, &reported).await;
}

/// Rule (f)'s checker: a mirror whose S3 object was written by a higher fence behind
/// the register's back makes S3 refuse a write the register accepts, and that is
/// reported as a disagreement, not counted as agreement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_catches_s3_disagreeing_with_the_register() {
    use history::{History, Kind};
    let key = "s3://chaos/f".to_string();
    let h = History::new(21, false);
    h.mirror_to(mirror::S3Mirror::new(std::slice::from_ref(&key)).await);
    assert!(h.write_fenced(&key, "engine-a", Kind::Engine, 3).await);
    // Someone else wrote fence 9 to the S3 object only.
    h.mirror_write_behind_the_registers_back(&key, 9).await;
    assert!(
        h.write_fenced(&key, "engine-a", Kind::Engine, 4).await,
        "the register accepts 4"
    );
    let report = h.check(0.0, 1.0, &[], 100.0);
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.contains("(f) the register accepted fence 4")
                && v.contains("stale fence: object written by fence 9")),
        "{:?}",
        report.violations
    );
    assert_eq!(report.s3_fenced.acknowledged, 1);
}

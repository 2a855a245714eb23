//! Proofs that the fault-injection harness's checker can fail, on command-line holders:
//! a `lockwarden run` whose command outlives a lost lock, a `lockwarden guard` that
//! ignores its deadline (the engine clients' proofs are tests/chaos_checker.rs, which
//! says how each proof runs).

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

use proof::{SHORT_HOLD, at_least_one, correct_then_broken, mutex_engine, one_key_plan};
use schedule::{Backend, Contender, Fault, Plan};
use support::proxy::Mode;

/// A plan on S3 with one CLI slot and an engine client asking from `engine_from`, no
/// controllers: the slot's first round holds for 9 s (guarded as `guarded_share` says;
/// `broken`: its command hands its writes to a daemon), and `fault` strikes it.
fn cli_plan(
    seed: u64,
    broken: bool,
    guarded_share: f64,
    engine_from: Duration,
    fault: (Duration, Fault),
) -> Plan {
    let cli = cli::CliSpec {
        slot: 0,
        start_after: Duration::ZERO,
        lock_unlock_share: 0.0,
        hold: (Duration::from_secs(9), Duration::from_secs(9)),
        guarded_share,
        hands_writes_to_a_daemon: broken,
    };
    let engine = mutex_engine(0, engine_from, SHORT_HOLD, false);
    one_key_plan(seed, Backend::S3, 1, vec![engine], vec![cli], vec![fault])
}

/// A plan on S3 with a `lockwarden run` and an engine client and no controllers: the
/// `run` acquires first (its command writes for 9 s), is partitioned (blackhole) for
/// 7 s, and the engine client takes over meanwhile.
fn cli_partition_plan(seed: u64, broken: bool) -> Plan {
    let partition = Fault::Network {
        target: Contender::Cli(0),
        mode: Mode::Blackhole,
        lasts: Duration::from_secs(7),
    };
    let engine_from = Duration::from_secs(2);
    cli_plan(
        seed,
        broken,
        0.0,
        engine_from,
        (Duration::from_secs(3), partition),
    )
}

/// The same proof for command-line holders: `run` must stop its command when the lock
/// is lost. `run` stops every process of its command's tree by the holder deadline
/// (rule 7), so the broken command hands its writes to a daemon outside that tree (the
/// harness): they outlive the lock, overlap the engine client that took over, and are
/// refused by the fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_catches_a_run_whose_command_outlives_a_lost_lock() {
    let held = |r: &history::Report| at_least_one(r.cli_claims, "the `run` never held the lock");
    let reported = [
        (
            "(c) overlapping claims",
            "cli-0-broken",
            "the broken command's overlap",
        ),
        ("(a)", "cli-0-broken", "the broken command's refused writes"),
    ];
    let (correct, broken) = correct_then_broken(3, cli_partition_plan, held, &reported).await;
    let v = &broken.report.violations;
    // Rule (f): S3 itself, in its conditional write, refused what the register refused,
    // and no verdict of S3 differed from the register's.
    let (ok, bad) = (correct.report.s3_fenced, broken.report.s3_fenced);
    eprintln!("S3's verdicts: correct run {ok:?}, broken run {bad:?}");
    assert!(ok.acknowledged > 0 && ok.refused == 0, "{ok:?}");
    assert!(
        bad.refused > 0,
        "S3 refused none of the broken command's stale writes: {bad:?}"
    );
    assert!(
        !v.iter().any(|v| v.contains("(f)")),
        "S3 and the register disagreed: {v:?}"
    );
}

/// A plan on S3 with one guarded CLI slot and an engine client, no controllers: the
/// slot's first round is guarded (a `run` holder, `guard` running a writer for 9 s
/// with the holder's nonce and fence); its holder is SIGSTOPped from 3.5 s for 8 s,
/// past its stored lease, and the engine client takes over meanwhile.
fn guard_pause_plan(seed: u64, broken: bool) -> Plan {
    let pause = Fault::HolderPause {
        slot: 0,
        lasts: Duration::from_secs(8),
    };
    let engine_from = Duration::from_secs(3);
    cli_plan(
        seed,
        broken,
        1.0,
        engine_from,
        (Duration::from_millis(3500), pause),
    )
}

/// The same proof for `lockwarden guard` (docs/design.md §3 rule 9): its holder is
/// SIGSTOPped and cannot stop anything, so only the guard's own deadline stops the
/// writer. A correct guard stops its command's whole tree by that deadline and nothing
/// is reported; a guarded command that hands its writes to a daemon outside the
/// guard's tree (the harness, asked over the register's socket — no production knob
/// needed) writes on after the guard's logged deadline (g), overlaps the engine client
/// that took over (c), and is refused by the fence (a).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_catches_a_guard_that_ignores_its_deadline() {
    let guarded = |r: &history::Report| {
        eprintln!("guarded rounds of the correct plan: {:?}", r.guard_outcomes);
        at_least_one(r.guarded_claims, "the guarded command never wrote")?;
        match r.guard_outcomes.contains_key("stopped-unconfirmed") {
            true => Ok(()),
            false => Err(format!(
                "no guard had to stop its command by its own deadline: {:?}",
                r.guard_outcomes
            )),
        }
    };
    let reported = [
        (
            "(g)",
            "cli-0-guard-broken",
            "its writes after the guard's deadline",
        ),
        (
            "(c) overlapping claims",
            "cli-0-guard-broken",
            "its overlap with the next holder",
        ),
        ("(a)", "cli-0-guard-broken", "its refused writes"),
    ];
    correct_then_broken(5, guard_pause_plan, guarded, &reported).await;
}

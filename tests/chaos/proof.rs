//! The shape every proof that the checker can fail shares (tests/chaos_checker.rs,
//! tests/chaos_checker_commands.rs): a plan with correct contenders passes, the same
//! plan with one broken on purpose is reported, naming it.

use std::time::Duration;

use lockwarden::lock::Permits;

use crate::cli;
use crate::history;
use crate::schedule::{self, Backend, Contender, EngineSpec, Fault, Plan};
use crate::support::proxy::Mode;
use crate::world::SERIAL;

/// The checkers' proofs cut engine 0 off (blackhole) from 1.2 s for 7 s: longer than
/// its lease, so its permit or lock is taken over while it still believes it holds.
pub fn engine_0_cut_off() -> Vec<(Duration, Fault)> {
    vec![(
        Duration::from_millis(1200),
        Fault::Network {
            target: Contender::Engine(0),
            mode: Mode::Blackhole,
            lasts: Duration::from_secs(7),
        },
    )]
}

/// A plan on one key with `permits` on `backend`, without controllers.
pub fn one_key_plan(
    seed: u64,
    backend: Backend,
    permits: u32,
    engines: Vec<EngineSpec>,
    clis: Vec<cli::CliSpec>,
    faults: Vec<(Duration, Fault)>,
) -> Plan {
    Plan {
        seed,
        backend,
        keys: 1,
        permits: vec![permits],
        controllers: vec![],
        engines,
        clis,
        faults,
        liveness_limit: schedule::LIVENESS_LIMIT,
    }
}

/// An engine client of slot `slot` on a mutex key, asking from `start_after` and
/// holding for `hold`; `broken`: it ignores its holder deadline.
pub fn mutex_engine(
    slot: usize,
    start_after: Duration,
    hold: (Duration, Duration),
    broken: bool,
) -> EngineSpec {
    EngineSpec {
        ignores_deadline: broken,
        ..EngineSpec::new(slot, None, 0, Permits::MUTEX, start_after, hold)
    }
}

/// How long the engine client that takes over holds, in the proofs' plans.
pub const SHORT_HOLD: (Duration, Duration) =
    (Duration::from_millis(300), Duration::from_millis(800));

/// The shape of every `checker_catches_*` proof: `plan(seed, false)`, with correct
/// contenders, passes, and `tested` holds of its report (`Err` says what it lacked: a
/// plan that exercised nothing proves nothing); then the broken plan `plan(seed + 1,
/// true)` runs (again with the next seeds, up to `BROKEN_TRIES`, while one of
/// `reported` is missing), its violations are printed for the record, and each of
/// `reported` (rule, who, what it is) is among one run's. Returns both outcomes.
pub async fn correct_then_broken(
    seed: u64,
    plan: impl Fn(u64, bool) -> Plan,
    tested: impl Fn(&history::Report) -> Result<(), String>,
    reported: &[(&str, &str, &str)],
) -> (schedule::Outcome, schedule::Outcome) {
    let _serial = SERIAL.lock().await;
    let correct = schedule::run(plan(seed, false)).await;
    let r = &correct.report;
    assert!(
        r.violations.is_empty(),
        "the correct plan was reported: {:?}",
        r.violations
    );
    if let Err(lacked) = tested(r) {
        panic!("the correct plan tested nothing: {lacked}");
    }
    // A broken contender breaks a rule only when the schedule gives it the chance (a
    // queue jumper needs someone waiting ahead of it when it arrives), and a loaded
    // machine can shift a schedule out of that window. So the broken plan gets
    // BROKEN_TRIES seeds; the checker must report every violation in one of them.
    let mut broken = None;
    for attempt in 1..=BROKEN_TRIES {
        let outcome = schedule::run(plan(seed + attempt, true)).await;
        eprintln!(
            "violations reported for the broken plan (seed {}):\n{}",
            outcome.plan.seed,
            outcome.report.violations.join("\n")
        );
        let all_reported = reported
            .iter()
            .all(|(rule, who, _)| is_reported(&outcome.report.violations, rule, who));
        broken = Some(outcome);
        if all_reported {
            break;
        }
    }
    let broken = broken.expect("at least one try");
    for (rule, who, what) in reported {
        assert_reported(&broken.report.violations, rule, who, what);
    }
    (correct, broken)
}

/// How many seeds a broken plan gets to show its violation (see `correct_then_broken`).
const BROKEN_TRIES: u64 = 3;

fn is_reported(violations: &[String], rule: &str, who: &str) -> bool {
    violations
        .iter()
        .any(|v| v.contains(rule) && v.contains(who))
}

/// `tested` for `correct_then_broken`: the plan saw at least one of what it counts.
pub fn at_least_one(count: usize, lacked: &str) -> Result<(), String> {
    match count {
        0 => Err(lacked.to_string()),
        _ => Ok(()),
    }
}

/// Asserts that a violation of `rule` names `who`.
pub fn assert_reported(violations: &[String], rule: &str, who: &str, what: &str) {
    assert!(
        is_reported(violations, rule, who),
        "{what} ({rule}, {who}) was not reported: {violations:?}"
    );
}

//! Randomized fault-injection schedules with a fencing checker (issue 8).
//!
//! Each schedule (from a seed, printed) puts K locks on one backend and lets
//! contenders fight over them: two `lockwarden controller` processes (on two API
//! servers; for Leases, two namespaces of one) with one `DistributedLock` each per
//! key, engine clients (`HeldLock`), and `lockwarden run` / `lock` + `unlock` processes
//! (tests/chaos/cli.rs) — all on the same keys. Every holder writes to
//! a fenced register run by the harness while it claims the lock; faults are injected
//! at random (SIGKILL/SIGSTOP of controllers, network faults per contender through the
//! fault proxy, moto/ZooKeeper/API-server outages, ZooKeeper session expiry); the
//! history goes to a JSONL file and is checked. The rules are in docs/safety.md,
//! "Fault-injection harness".
//!
//! Semaphore schedules (`Plan::semaphore_from_seed`) put keys with 2–4 permits and
//! engine contenders only (some exclusive) under the faults that reach them, and check
//! the permit rules instead of the one-holder ones.
//!
//! Queue schedules (`Plan::queue_from_seed`, docs/design.md §6.4) are semaphore
//! schedules whose contenders wait in the key's queue with priorities and weights.
//!
//! `cargo test --test chaos` runs a short version (`CHAOS_SCHEDULES`, default 4: each
//! backend once; `semaphore_schedules`: `CHAOS_SEMAPHORE_SCHEDULES`, default 2;
//! `queue_schedules`: `CHAOS_QUEUE_SCHEDULES`, default 2);
//! `scripts/chaos --schedules N [--seed S] [--backend B] [--semaphore | --queue]` a
//! long one. The proofs that the checker can fail are tests/chaos_checker.rs.

// The harness's modules are shared with tests/chaos_checker.rs (the proofs that its
// checker can fail), which uses parts the schedules do not.
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
#[path = "chaos/schedule.rs"]
mod schedule;
#[path = "chaos/world.rs"]
mod world;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kube::api::{Api, ListParams};
use lockwarden::lock::Mode as LockMode;
use schedule::{Backend, EngineSpec, Plan};
use serde_json::json;
use world::{SERIAL, world};

fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Mutex schedules; with `CHAOS_SEMAPHORE=1` (`scripts/chaos --semaphore`) semaphore
/// schedules instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_schedules() {
    let kind = if std::env::var("CHAOS_QUEUE").is_ok_and(|v| v == "1") {
        Schedules::Queue
    } else if std::env::var("CHAOS_SEMAPHORE").is_ok_and(|v| v == "1") {
        Schedules::Semaphore
    } else {
        Schedules::Mutex
    };
    run_schedules(kind, "CHAOS_SCHEDULES", 4, "summary.json").await;
}

/// A short run of queue schedules (two by default): semaphore schedules whose
/// contenders wait in the key's queue with priorities and weights (docs/design.md
/// §6.4); `scripts/chaos --queue` runs many.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_schedules() {
    run_schedules(
        Schedules::Queue,
        "CHAOS_QUEUE_SCHEDULES",
        2,
        "summary-queue.json",
    )
    .await;
}

/// Which plans a run draws.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Schedules {
    Mutex,
    Semaphore,
    Queue,
}

/// A short run of semaphore schedules (two by default: two of the four stores).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_schedules() {
    run_schedules(
        Schedules::Semaphore,
        "CHAOS_SEMAPHORE_SCHEDULES",
        2,
        "summary-semaphore.json",
    )
    .await;
}

/// Runs `count_var` (default `default_n`) schedules and fails on any violation; the
/// summary goes to `summary_file` in the world's directory.
async fn run_schedules(schedules: Schedules, count_var: &str, default_n: u64, summary_file: &str) {
    let _serial = SERIAL.lock().await;
    // CHAOS_SEEDS=a,b,c reruns exactly those schedules.
    let listed: Option<Vec<u64>> = std::env::var("CHAOS_SEEDS").ok().map(|v| {
        v.split(',')
            .map(|s| {
                s.trim()
                    .parse()
                    .expect("CHAOS_SEEDS: comma-separated numbers")
            })
            .collect()
    });
    let n: u64 = listed
        .as_ref()
        .map_or_else(|| env(count_var).unwrap_or(default_n), |l| l.len() as u64);
    let base: u64 = env("CHAOS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            % 1_000_000
            * 1000
    });
    let only: Option<Backend> = std::env::var("CHAOS_BACKEND").ok().map(|b| {
        Backend::parse(&b).unwrap_or_else(|| {
            panic!("CHAOS_BACKEND={b:?}: expected one of lease, s3, dynamodb, zookeeper")
        })
    });
    let (kind, rerun) = match schedules {
        Schedules::Mutex => ("", ""),
        Schedules::Semaphore => ("semaphore ", " CHAOS_SEMAPHORE=1"),
        Schedules::Queue => ("queue ", " CHAOS_QUEUE=1"),
    };
    eprintln!(
        "[chaos] {n} {kind}schedules from seed {base} (rerun one: CHAOS_SEED=<seed> \
         CHAOS_SCHEDULES=1{})",
        rerun
    );
    let mut tally = Tally {
        base,
        n,
        file: summary_file,
        started: Some(Instant::now()),
        ..Tally::default()
    };
    for i in 0..n {
        let seed = listed.as_ref().map_or(base + i, |l| l[i as usize]);
        let plan = match schedules {
            Schedules::Mutex => Plan::from_seed(seed, only),
            Schedules::Semaphore => Plan::semaphore_from_seed(seed, only),
            Schedules::Queue => Plan::queue_from_seed(seed, only),
        };
        let outcome = schedule::run(plan).await;
        let r = &outcome.report;
        eprintln!(
            "[chaos] {}/{n} seed {} {}: {} violations, {} acquisitions, {} writes, \
             {} CLI claims ({} guarded), permits in flight (most, of) {:?}, liveness {:?} s, \
             {:.1?}",
            i + 1,
            outcome.plan.seed,
            outcome.plan.backend.name(),
            r.violations.len(),
            r.acquisitions,
            r.writes_accepted,
            r.cli_claims,
            r.guarded_claims,
            r.permits_in_flight,
            r.liveness
                .iter()
                .map(|l| (l * 1000.0).round() / 1000.0)
                .collect::<Vec<_>>(),
            outcome.wall
        );
        for v in &r.violations {
            eprintln!("[chaos] VIOLATION {v}");
        }
        tally.add(outcome);
        // After every schedule, so an interrupted long run still has its numbers.
        summarize(&tally, i + 1, None);
    }
    let secrets_found = secrets_in_logs().await;
    let summary = summarize(&tally, n, Some(secrets_found.len()));
    eprintln!(
        "[chaos] SUMMARY ({}):\n{summary}",
        world().dir.join(summary_file).display()
    );
    assert!(
        secrets_found.is_empty(),
        "secret values appear in logs/status/events: {secrets_found:?}"
    );
    let violations = &tally.violations;
    assert!(
        violations.is_empty(),
        "{} violations (history {:?}):\n{}",
        violations.len(),
        tally.history,
        violations.join("\n")
    );
}

/// What the schedules of a run add up to, so far.
#[derive(Default)]
struct Tally<'a> {
    /// The run's first seed, and how many schedules it plans.
    base: u64,
    n: u64,
    /// The summary's file name in the world's directory.
    file: &'a str,
    started: Option<Instant>,
    per_backend: BTreeMap<&'static str, u64>,
    faults: BTreeMap<String, u64>,
    liveness: BTreeMap<&'static str, Vec<f64>>,
    violations: Vec<String>,
    operations: usize,
    acquisitions: usize,
    writes_accepted: usize,
    stale_status_writes_rejected: usize,
    /// Holders' writes in flight when the lock changed hands, refused by the fence.
    writes_refused_in_flight: usize,
    claims: usize,
    /// Observer reads.
    polls: usize,
    /// Claims of command-line holders, and schedules in which one held a lock.
    cli_claims: usize,
    cli_schedules: usize,
    /// The last schedule's history.
    history: Option<std::path::PathBuf>,
    slowest: Duration,
    /// Keys with more than one permit: "most in flight at once/permits" -> keys.
    permits_in_flight: BTreeMap<String, u64>,
    exclusive_claims: usize,
    /// Claims of commands under `lockwarden guard`, and how guarded rounds ended.
    guarded_claims: usize,
    guard_outcomes: BTreeMap<String, usize>,
    /// S3 schedules, rule (f): register writes S3 acknowledged, stale ones S3 refused
    /// itself, puts without a verdict.
    s3_fenced: [usize; 3],
    /// Queued keys: grants checked against an earlier waiter (rule (o)), and the
    /// longest an entry stayed unchanged while others waited, outside faults (rule (q)).
    queue: (usize, f64),
}

impl Tally<'_> {
    fn add(&mut self, outcome: schedule::Outcome) {
        let r = &outcome.report;
        let backend = outcome.plan.backend.name();
        *self.per_backend.entry(backend).or_default() += 1;
        for (_, f) in &outcome.plan.faults {
            *self.faults.entry(f.kind()).or_default() += 1;
        }
        self.liveness
            .entry(backend)
            .or_default()
            .extend(&r.liveness);
        self.operations += r.operations;
        self.acquisitions += r.acquisitions;
        self.writes_accepted += r.writes_accepted;
        self.stale_status_writes_rejected += r.writes_rejected_stale_status;
        self.writes_refused_in_flight += r.writes_refused_in_flight;
        self.claims += r.claims;
        self.cli_claims += r.cli_claims;
        self.cli_schedules += usize::from(r.cli_claims > 0);
        self.polls += r.polls;
        for (most, permits) in &r.permits_in_flight {
            *self
                .permits_in_flight
                .entry(format!("{most}/{permits}"))
                .or_default() += 1;
        }
        self.exclusive_claims += r.exclusive_claims;
        self.queue.0 += r.queue_grants_checked;
        self.queue.1 = self.queue.1.max(r.queue_longest_unchanged);
        self.guarded_claims += r.guarded_claims;
        for (outcome, count) in &r.guard_outcomes {
            *self.guard_outcomes.entry(outcome.clone()).or_default() += count;
        }
        self.s3_fenced[0] += r.s3_fenced.acknowledged;
        self.s3_fenced[1] += r.s3_fenced.refused;
        self.s3_fenced[2] += r.s3_fenced.unverified;
        self.slowest = self.slowest.max(outcome.wall);
        self.violations.extend(r.violations.iter().cloned());
        self.history = Some(outcome.history_path);
    }
}

/// Writes the summary of the first `done` schedules (next to the history) and returns
/// it pretty-printed; `secrets`: where the run's end found the Secret's values.
fn summarize(t: &Tally, done: u64, secrets: Option<usize>) -> String {
    let mut live_summary = BTreeMap::new();
    for (backend, l) in &t.liveness {
        let mut l = l.clone();
        l.sort_by(f64::total_cmp);
        // lease + the slowest waiting poll (the controller's, 2 s) + 1 s; the
        // controllers' ZooKeeper lease is their 10 s session.
        let lease = if *backend == "zookeeper" { 10.0 } else { 3.0 };
        let bound = lease + 2.0 + 1.0;
        live_summary.insert(
            *backend,
            json!({
                "locks": l.len(),
                "p50_s": percentile(&l, 0.5),
                "p95_s": percentile(&l, 0.95),
                "p99_s": percentile(&l, 0.99),
                "max_s": l.last().copied().unwrap_or(0.0),
                "bound_s": bound,
                "within_bound": l.iter().filter(|x| **x <= bound).count(),
            }),
        );
    }
    let summary = json!({
        "seed": t.base,
        "schedules_planned": t.n,
        "schedules_done": done,
        "per_backend": t.per_backend,
        "faults": t.faults,
        "faults_total": t.faults.values().sum::<u64>(),
        "operations": t.operations,
        "acquisitions": t.acquisitions,
        "register_writes_accepted": t.writes_accepted,
        "stale_status_writes_rejected": t.stale_status_writes_rejected,
        "writes_refused_in_flight": t.writes_refused_in_flight,
        "claims": t.claims,
        "cli_claims": t.cli_claims,
        "schedules_where_a_cli_process_held_a_lock": t.cli_schedules,
        "guarded_claims": t.guarded_claims,
        "guarded_rounds_by_outcome": t.guard_outcomes,
        "observer_reads": t.polls,
        "violations": t.violations.len(),
        "controller_processes_restarted_after_exiting_on_their_own":
            world().crash_restarts.load(std::sync::atomic::Ordering::SeqCst),
        "liveness_after_heal": live_summary,
        "secret_values_found_in_logs_status_events": secrets,
        "wall_s": t.started.map_or(0, |s| s.elapsed().as_secs()),
        "slowest_schedule_s": t.slowest.as_secs(),
        "history": t.history.as_ref().map(|p| p.display().to_string()),
        "semaphore_keys": t.permits_in_flight.values().sum::<u64>(),
        "semaphore_keys_by_most_permits_in_flight_of_permits": t.permits_in_flight,
        "semaphore_exclusive_claims": t.exclusive_claims,
        "queue_grants_checked_for_order": t.queue.0,
        "queue_longest_unchanged_entry_with_waiters_s": (t.queue.1 * 10.0).round() / 10.0,
        "s3_fenced_writes": {
            "acknowledged_by_s3": t.s3_fenced[0],
            "stale_refused_by_s3": t.s3_fenced[1],
            "without_a_verdict": t.s3_fenced[2],
        },
    });
    let text = serde_json::to_string_pretty(&summary).unwrap();
    let _ = std::fs::write(world().dir.join(t.file), &text);
    text
}

/// Greps every controller log, the recorded history (which holds every watched
/// status) and the Events of the controllers' namespaces for the Secret's values.
/// Returns where they were found.
async fn secrets_in_logs() -> Vec<String> {
    let w = tokio::task::spawn_blocking(world).await.unwrap();
    let (id, key) = &w.secret_values;
    let mut found = Vec::new();
    let mut bytes_read = 0;
    let mut files = vec![w.dir.join("history.jsonl")];
    for c in &w.controllers {
        for entry in std::fs::read_dir(c.log_dir()).unwrap() {
            files.push(entry.unwrap().path());
        }
    }
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        bytes_read += text.len();
        if text.contains(id.as_str()) || text.contains(key.as_str()) {
            found.push(f.display().to_string());
        }
    }
    for c in &w.controllers {
        let client = w.direct_client(c.plane).await;
        let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client, &c.namespace)
            .list(&ListParams::default())
            .await
            .unwrap();
        let text = serde_json::to_string(&events.items).unwrap();
        bytes_read += text.len();
        if text.contains(id.as_str()) || text.contains(key.as_str()) {
            found.push(format!("Events in {}", c.namespace));
        }
    }
    // The check must have had something to read.
    assert!(bytes_read > 0, "no logs, statuses or events were collected");
    eprintln!("[chaos] secret check: {bytes_read} bytes of logs, statuses and events read");
    found
}

/// The plan generator can draw every fault kind on the backends it applies to (and
/// says which seed first does, to rerun one: `CHAOS_SEED=<seed> CHAOS_SCHEDULES=1`).
#[test]
fn plans_cover_every_fault_kind() {
    let mut first: BTreeMap<String, u64> = BTreeMap::new();
    for seed in 0..4000 {
        for (_, fault) in Plan::from_seed(seed, None).faults {
            first.entry(fault.kind()).or_insert(seed);
        }
    }
    eprintln!("first seed per fault kind: {first:?}");
    for kind in [
        "controller-sigkill-restart",
        "controller-sigstop-past-lease",
        "network-blackhole",
        "network-delay",
        "network-one-way-loss-requests",
        "network-one-way-loss-replies",
        "network-forward-then-drop-reply",
        "zookeeper-session-expiry",
        "moto-sigstop",
        "moto-restart",
        "zookeeper-node-restart",
        "zookeeper-quorum-loss",
        "apiserver-sigstop",
        "apiserver-restart",
        "cli-sigkill",
        "cli-holder-sigstop",
    ] {
        assert!(first.contains_key(kind), "no plan has a {kind} fault");
    }
}

/// Semaphore plans stay within their stated bounds (docs/safety.md, "Semaphore
/// schedules") and draw every store that has semaphores, exclusive contenders and
/// every fault kind that reaches engine contenders.
#[test]
fn semaphore_plans_stay_within_their_bounds() {
    let mut backends = BTreeMap::new();
    let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
    let mut exclusive_keys = 0;
    for seed in 0..3000 {
        let plan = Plan::semaphore_from_seed(seed, None);
        *backends.entry(plan.backend.name()).or_insert(0) += 1;
        assert!((1..=2).contains(&plan.keys) && plan.permits.len() == plan.keys);
        assert!(plan.controllers.is_empty() && plan.clis.is_empty());
        for (k, &n) in plan.permits.iter().enumerate() {
            assert!((2..=4).contains(&n), "seed {seed}: {n} permits");
            let on_key: Vec<&EngineSpec> =
                plan.engines.iter().filter(|e| e.key == Some(k)).collect();
            let count = on_key.len() as u32;
            assert!(
                (2 * n..=3 * n).contains(&count),
                "seed {seed}: {count} contenders for {n}"
            );
            assert!(on_key.iter().all(|e| e.permits.total == n));
            let exclusive = on_key
                .iter()
                .filter(|e| e.permits.mode == LockMode::Exclusive)
                .count();
            assert!(exclusive <= 2, "seed {seed}");
            exclusive_keys += usize::from(exclusive > 0);
        }
        for (_, fault) in &plan.faults {
            kinds.entry(fault.kind()).or_insert(seed);
        }
    }
    eprintln!(
        "backends {backends:?}, keys with exclusive contenders {exclusive_keys}, first seed per fault kind {kinds:?}"
    );
    assert_eq!(backends.len(), 4, "{backends:?}");
    assert!(exclusive_keys > 0);
    for kind in [
        "network-blackhole",
        "network-delay",
        "network-one-way-loss-requests",
        "network-one-way-loss-replies",
        "network-forward-then-drop-reply",
        "moto-sigstop",
        "moto-restart",
        "apiserver-sigstop",
        "apiserver-restart",
        "zookeeper-session-expiry",
        "zookeeper-node-restart",
        "zookeeper-quorum-loss",
    ] {
        assert!(
            kinds.contains_key(kind),
            "no semaphore plan has a {kind} fault"
        );
    }
}

/// The checker's rules on hand-made histories (no servers): each rule reports what it
/// must, and nothing else.
/// Rule (g) on hand-made histories: a guarded command's write after its guard's
/// latest deadline is reported, one before it is not, and writes whose guard logged
/// no deadline at all are reported too.
#[test]
fn checker_rule_g_on_synthetic_histories() {
    use history::{History, Kind};
    let key = "s3://b/g".to_string();
    let rule_g = |h: &History| -> Vec<String> {
        h.check(0.0, 1e6, &[], 1e6)
            .violations
            .into_iter()
            .filter(|v| v.contains("(g)"))
            .collect()
    };
    // The write lands at once (history time ~0 s).
    let h = History::new(31, false);
    assert!(h.write(&key, "cli-0-guard-k0-1", Kind::Cli, 1));
    h.guard_deadline(&key, "cli-0-guard-k0-1", Some(1000.0));
    assert_eq!(rule_g(&h), Vec::<String>::new());

    let h = History::new(32, false);
    h.guard_deadline(&key, "cli-0-guard-k0-1", Some(-1.0));
    assert!(h.write(&key, "cli-0-guard-k0-1", Kind::Cli, 1));
    // Another writer's write is not the guarded command's.
    assert!(h.write(&key, "engine-0", Kind::Engine, 2));
    let v = rule_g(&h);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].contains("1 time(s) after its guard's deadline"),
        "{v:?}"
    );

    let h = History::new(33, false);
    assert!(h.write(&key, "cli-0-guard-k0-1", Kind::Cli, 1));
    h.guard_deadline(&key, "cli-0-guard-k0-1", None);
    let v = rule_g(&h);
    assert!(v.len() == 1 && v[0].contains("logged no deadline"), "{v:?}");
}

/// Rule (a) on hand-made histories: a CLI write sent before a higher fence first
/// wrote but read by the harness after it (a line that waited in the socket) is a
/// write in flight, refused by the fence and counted; one sent after it is reported.
#[test]
fn checker_rule_a_tells_a_write_in_flight_from_a_write_after_the_takeover() {
    use history::{History, Kind};
    let key = "s3://b/a".to_string();
    let rule_a = |h: &History| -> (Vec<String>, usize) {
        let report = h.check(0.0, 1e6, &[], 1e6);
        let a = report
            .violations
            .into_iter()
            .filter(|v| v.contains("(a)"))
            .collect();
        (a, report.writes_refused_in_flight)
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let late_line = |sent_before_takeover: bool| {
        let h = History::new(34, false);
        let sent = h.now();
        assert!(h.write(&key, "engine-0", Kind::Engine, 2));
        let sent = if sent_before_takeover { sent } else { h.now() };
        let accepted =
            runtime.block_on(h.write_fenced_sent(&key, "cli-0-k0-1", Kind::Cli, 1, sent));
        assert!(!accepted, "the register refuses fence 1 after fence 2");
        rule_a(&h)
    };
    assert_eq!(late_line(true), (Vec::new(), 1));
    let (v, in_flight) = late_line(false);
    assert!(
        v.len() == 1 && v[0].contains("while claiming the lock") && in_flight == 0,
        "{v:?}"
    );
}

#[test]
fn checker_rules_on_synthetic_histories() {
    use history::{Claim, History, Kind};
    let key = "s3://b/k".to_string();
    let keys = std::slice::from_ref(&key);
    let claim = |who: &str, nonce: &str, fence, start, end| Claim {
        key: key.clone(),
        who: who.into(),
        nonce: nonce.into(),
        fence,
        start,
        end,
    };
    let rules = |h: &History, heal: f64| -> Vec<String> {
        h.check(heal, 20.0, keys, 60.0)
            .violations
            .iter()
            .map(|v| v.split(')').next().unwrap_or("").to_string())
            .collect()
    };

    // A clean history: two engine holders one after the other, fences 1 and 2.
    let h = History::new(1, false);
    h.poll_at(&key, 0.9, 1.0, Some(("a".into(), 1, "v1".into(), true)));
    h.claim(claim("engine-a", "a", 1, 1.0, 2.0));
    h.poll_at(&key, 2.4, 2.5, Some(("b".into(), 2, "v2".into(), true)));
    h.claim(claim("engine-b", "b", 2, 2.5, 9.0));
    assert!(h.write(&key, "engine-b", Kind::Engine, 2));
    assert_eq!(rules(&h, 3.0), Vec::<String>::new());

    // (a): an engine holder refused by the register; (b): a later acquisition with a
    // lower fence; (c): overlapping engine claims; (d): nobody after healing.
    let h = History::new(2, false);
    h.poll_at(&key, 0.9, 1.0, Some(("a".into(), 5, "v1".into(), true)));
    h.poll_at(&key, 1.9, 2.0, Some(("b".into(), 4, "v2".into(), true)));
    h.claim(claim("engine-a", "a", 5, 1.0, 3.0));
    h.claim(claim("engine-b", "b", 4, 2.0, 4.0));
    assert!(h.write(&key, "engine-a", Kind::Engine, 5));
    assert!(!h.write(&key, "engine-b", Kind::Engine, 4));
    assert_eq!(
        rules(&h, 10.0),
        ["seed 2: (a", "seed 2: (b", "seed 2: (c", "seed 2: (d"]
    );

    // A stale status write refused by the register is fencing at work, not a
    // violation.
    let h = History::new(3, false);
    h.claim(claim("engine-a", "a", 2, 0.0, 9.0));
    assert!(h.write(&key, "engine-a", Kind::Engine, 2));
    assert!(!h.write(&key, "east/lock", Kind::Controller, 1));
    assert_eq!(rules(&h, 1.0), Vec::<String>::new());

    // A controller's claim ends at its holder deadline, bounded from the store: the
    // last version of its nonce was first read complete at 1.0 s, so with a 3 s lease
    // it claims until 1.0 + 3 × 0.98 − 0.25 = 3.69 s, however long its status says
    // Acquired (a stopped controller). A takeover at 3.8 s is fine; one at 3.5 s is
    // an overlap.
    for (takeover, overlaps) in [(3.8, false), (3.5, true)] {
        let h = History::new(4, false);
        h.set_controller_lease(&key, Duration::from_secs(3));
        h.status_at(0.5, "east/l", &key, true, 1, "n", "east/ns/l", json!({}));
        h.poll_at(&key, 0.9, 1.0, Some(("n".into(), 1, "v1".into(), true)));
        h.poll_at(&key, 1.9, 2.0, Some(("n".into(), 1, "v1".into(), true)));
        h.poll_at(
            &key,
            takeover,
            takeover,
            Some(("m".into(), 2, "v2".into(), true)),
        );
        h.claim(claim("engine-m", "m", 2, takeover, 9.0));
        let found = rules(&h, 5.0);
        assert_eq!(
            found.iter().any(|v| v.ends_with("(c")),
            overlaps,
            "{found:?}"
        );
        assert!(!found.iter().any(|v| v.ends_with("(b")), "{found:?}");
    }

    // On ZooKeeper the claim ends with the last read that still found the znode.
    let h = History::new(5, true);
    h.status_at(0.5, "east/l", &key, true, 7, "n", "east/ns/l", json!({}));
    h.poll_at(&key, 0.9, 1.0, Some(("n".into(), 7, "z1".into(), true)));
    h.poll_at(&key, 1.9, 2.0, Some(("n".into(), 7, "z1".into(), true)));
    h.poll_at(&key, 2.1, 2.2, Some(("m".into(), 9, "z2".into(), true)));
    h.claim(claim("engine-m", "m", 9, 2.0, 9.0));
    assert_eq!(rules(&h, 5.0), Vec::<String>::new());
    h.claim(claim("engine-x", "x", 11, 1.5, 1.8));
    assert!(rules(&h, 5.0).iter().any(|v| v.ends_with("(c")));
}

/// The permit rules on hand-made histories (no servers): a key with 2 permits (3 in
/// one case). Liveness (d) is left out: these histories have no claims.
#[test]
fn permit_rules_on_synthetic_histories() {
    use history::History;
    let key = "s3://b/sem".to_string();
    let keys = std::slice::from_ref(&key);
    let check = |h: &History| -> Vec<String> {
        h.check(0.0, 20.0, keys, 60.0)
            .violations
            .into_iter()
            .filter(|v| !v.contains("(d)"))
            .collect()
    };
    let rules = |h: &History| -> Vec<String> {
        check(h)
            .iter()
            .map(|v| v.split(')').next().unwrap_or("").to_string())
            .collect()
    };
    let set = |h: &History, t: f64, last: u64, entries: &[(&str, u64)]| {
        let entries = entries.iter().map(|(n, f)| (n.to_string(), *f)).collect();
        h.set_poll_at(&key, t - 0.01, t, last, entries);
    };
    // Writes every 0.1 s from `from` to `to`.
    let writes = |h: &History, who: &str, fence: u64, weight: u32, from: f64, to: f64| {
        let mut t = from;
        while t <= to + 1e-9 {
            h.write_permit_at(&key, who, fence, weight, t);
            t += 0.1;
        }
    };

    // Clean: two shared holders together, then an exclusive one alone, then a shared
    // holder that asked after the exclusive one was seen and got a higher fence.
    let h = History::new(11, false);
    h.set_permits(&key, 2);
    set(&h, 0.1, 2, &[("na", 1), ("nb", 2)]);
    writes(&h, "a", 1, 1, 0.1, 1.0);
    writes(&h, "b", 2, 1, 0.2, 1.0);
    set(&h, 1.2, 2, &[]);
    set(&h, 1.3, 3, &[("nx", 3)]);
    writes(&h, "x", 3, 2, 1.3, 2.0);
    set(&h, 2.2, 3, &[]);
    h.acquired(&key, "c", 1.5, "nc", 4, "v4");
    set(&h, 2.4, 4, &[("nc", 4)]);
    writes(&h, "c", 4, 1, 2.4, 3.0);
    assert_eq!(check(&h), Vec::<String>::new());
    let r = h.check(0.0, 20.0, keys, 60.0);
    assert_eq!(r.permits_in_flight, [(2, 2)]);
    assert_eq!(r.exclusive_claims, 1);

    // (p): a third shared holder while two write; (r): a holder writing after a read
    // showed its permit gone. The one flagged under (p) is the holder missing from the
    // read that shows the newcomer, although its fence is not the lowest.
    let h = History::new(12, false);
    h.set_permits(&key, 2);
    set(&h, 0.1, 2, &[("na", 1), ("nb", 2)]);
    writes(&h, "a", 1, 1, 0.1, 2.0);
    writes(&h, "b", 2, 1, 0.1, 2.0);
    set(&h, 1.0, 3, &[("na", 1), ("nc", 3)]);
    writes(&h, "c", 3, 1, 1.0, 2.0);
    assert_eq!(rules(&h), ["seed 12: (p", "seed 12: (r"]);
    let flagged = check(&h);
    assert!(
        flagged[0]
            .split("; ")
            .nth(1)
            .is_some_and(|f| f.starts_with("b (fence 2")),
        "{flagged:?}"
    );
    assert!(flagged[1].contains("b wrote"), "{flagged:?}");

    // (p): an exclusive holder (all 3 permits) next to a shared one.
    let h = History::new(13, false);
    h.set_permits(&key, 3);
    writes(&h, "s", 1, 1, 0.1, 1.0);
    writes(&h, "x", 2, 3, 0.5, 1.0);
    assert_eq!(rules(&h), ["seed 13: (p"]);

    // (b): a fence granted to two nonces, and a new holder whose fence is not above the
    // last fence of the read before it.
    let h = History::new(14, false);
    h.set_permits(&key, 2);
    set(&h, 0.1, 5, &[("na", 5)]);
    set(&h, 0.2, 5, &[("na", 5), ("nb", 5)]);
    assert_eq!(rules(&h), ["seed 14: (b", "seed 14: (b", "seed 14: (b"]);
    // (b): an engine that began asking after fence 5 was seen, and got fence 4.
    let h = History::new(15, false);
    h.set_permits(&key, 2);
    set(&h, 0.1, 5, &[("na", 5)]);
    h.acquired(&key, "d", 0.2, "nd", 4, "v");
    assert_eq!(rules(&h), ["seed 15: (b"]);

    // A mutex key next to it keeps the one-holder rules: two overlapping claims.
    let mutex = "s3://b/mutex".to_string();
    let h = History::new(16, false);
    h.set_permits(&key, 2);
    writes(&h, "a", 1, 1, 0.1, 0.5);
    for (who, nonce, fence) in [("m1", "n1", 1), ("m2", "n2", 2)] {
        h.claim(history::Claim {
            key: mutex.clone(),
            who: who.into(),
            nonce: nonce.into(),
            fence,
            start: 0.0,
            end: 5.0,
        });
    }
    let found = h
        .check(0.0, 20.0, &[key.clone(), mutex.clone()], 60.0)
        .violations;
    assert!(
        found
            .iter()
            .any(|v| v.contains("(c)") && v.contains(&mutex)),
        "{found:?}"
    );
    assert!(!found.iter().any(|v| v.contains("(p)")), "{found:?}");
}

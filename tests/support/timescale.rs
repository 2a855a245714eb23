//! The one place for the durations of the tests that wait out real time (tests/node,
//! tests/kueue, tests/job_loss): leases and renewals, Pod grace periods and the
//! lock-delays they need, head starts, pending timeouts, polls.
//!
//! Each value is derived from the inequality of the rule its test checks (docs/design.md;
//! "rule N" is §3 rule N), and its doc comment says why a scaled value still exercises
//! that rule. A property that holds at any scale is tested at [`Scale::Suite`]; **one**
//! instance of each stays at [`Scale::Full`] in the suite (Kubernetes' default 30 s grace,
//! the 37 s lock-delay it needs), and `LOCKWARDEN_NODE_TRIALS=N` (the long runs:
//! `scripts/bench --only node`) runs N full-scale trials of every trial test instead.
//! What depends on this machine (a Pod's start on the node) is measured once per test
//! binary, printed (`timescale: …`), and a duration derived from it with a stated
//! safety factor.

use std::time::{Duration, Instant};

use lockwarden::lock::SafetyMargins;

/// δ, margin and grace of every store (rules 1, 2): δ = 2 %, margin = grace = 250 ms.
/// Every inequality below is written with them.
pub fn margins() -> SafetyMargins {
    SafetyMargins::default()
}

// ---------------------------------------------------------------------------------
// The stop-before-next trials (docs/design.md §6.3, rules 8 and 9): tests/node stop.rs
// and guard.rs, tests/kueue loss.rs.

/// The workload lock's lease `L` (and [`WORKLOAD_RENEW`]), the same at both scales.
///
/// Rule 2: the holder claims the lock until `t_sent + L(1 − δ) − margin` = 5.63 s after
/// its last write, which leaves room for a renewal on schedule (every `L/3` = 2 s) and
/// its request timeout (`L/4` = 1.5 s): 2 + 1.5 < 5.63, so the lock stays held while the
/// store is reachable. Rule 9's start needs one renewal seen within the stored lease
/// (`L + D` ≥ 6 s > 2 s). Short, so that the expiry after a fault is dominated by the
/// lock-delay `D`, which is what §6.3 is about.
pub const WORKLOAD_LEASE: &str = "6s";
/// The workload lock's renew interval: `L/3` (rule 2, above).
pub const WORKLOAD_RENEW: &str = "2s";
/// [`WORKLOAD_LEASE`] as a duration.
pub const WORKLOAD_LEASE_DURATION: Duration = Duration::from_secs(6);

/// How long a contender reads the record before the fault (rule 1: its observation
/// runs from its first read of the version the holder last wrote). It must have read
/// at least once after the holder's latest renewal: `≥ renew + one contender poll`
/// (2 s + 100 ms); 3 s. Not a scale: the same at both.
pub const CONTENDER_HEAD_START: Duration = Duration::from_secs(3);
/// How often a contender on the host tries the key (`support::trials::contend`): it
/// takes over at most one poll after the earliest instant it may, which the margins
/// count against the contender (a later first write only widens a margin, never makes
/// one).
pub const CONTENDER_POLL: Duration = Duration::from_millis(100);
/// The lease the contender on the host asks for: it only has to outlive the trial's
/// end (it is released then).
pub const CONTENDER_LEASE: Duration = Duration::from_secs(6);
/// How often the record sampler reads the store (`support::trials::RecordSampler`). A
/// release or takeover before the workload's last write stays visible for at least the
/// rest of the workload's grace, ≥ [`Scale::Suite`]'s 3 s ≫ 200 ms, so a sample shows
/// it.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(200);
/// A last write in flight (busybox `nc` on loopback) arrives within this after the
/// writer is gone; the register is read only after it.
pub const LAST_WRITE_IN_FLIGHT: Duration = Duration::from_secs(1);
/// An upper bound on the contender's wait after a fault, for a failure message only
/// (nothing waits it out when the test passes): far above the stored lease plus
/// grace of either scale (43.25 s at full scale).
pub const CONTENDER_TIMEOUT: Duration = Duration::from_secs(300);

/// The scale of one stop-before-next trial: the SIGTERM-ignoring workload's
/// `terminationGracePeriodSeconds` `G`, and with it the lock-delay `D` the controller
/// gives its lock (`gating::stop::needed_lock_delay`, §6.3) and the stored lease `L + D`
/// a contender (rule 1) and the guard (rule 9) count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Kubernetes' default grace, 30 s: `D` = 37 s, stored lease 43 s (docs/design.md
    /// §6.3's measured trials). One instance of each property stays at this scale.
    Full,
    /// `G` = 3 s: `D` = 9 s, stored lease 15 s. Rule 8's inequality
    /// `D ≥ (P − margin)/(1 − δ) − grace`, `P = W + G(1 + δ) + k`, holds for every `G`, and
    /// rule 9's `(L + D + grace)/(1 + δ) > (L + D)(1 − δ)` for every stored lease; what
    /// the scaled trial must keep is that the delay is *needed*: the workload, ignoring
    /// SIGTERM, runs its grace past the stop, `G(1 − δ)` = 2.94 s, longer than what a
    /// contender waits after the holder deadline without a delay (`grace + margin` +
    /// one contender poll = 0.6 s). So a missing or short delay still shows as a
    /// negative margin, as it did at full scale (docs/design.md §6.3: −29.3 s before it).
    Suite,
}

impl Scale {
    /// The workload's `terminationGracePeriodSeconds` `G`.
    pub fn grace_seconds(self) -> i64 {
        match self {
            Scale::Full => 30,
            Scale::Suite => 3,
        }
    }

    /// The lock-delay `D` the controller sets on a workload's own lock for
    /// [`Scale::grace_seconds`]: computed by the controller's own function, so the test
    /// states what it expects and checks the lock the controller made against it.
    pub fn lock_delay(self) -> Duration {
        lock_delay_for_grace(self.grace_seconds())
    }

    /// The stored lease `L + D`: what a contender observes (rule 1) and the guard counts
    /// (rule 9) after the holder's last write.
    pub fn stored_lease(self) -> Duration {
        WORKLOAD_LEASE_DURATION + self.lock_delay()
    }

    /// `spec.lockDelay` as the controller writes it (whole seconds).
    pub fn lock_delay_spec(self) -> String {
        format!("{}s", self.lock_delay().as_secs())
    }

    pub fn name(self) -> &'static str {
        match self {
            Scale::Full => "full scale",
            Scale::Suite => "suite scale",
        }
    }

    /// One line for a test's output: the durations this scale uses and the
    /// inequality's terms.
    pub fn describe(self) -> String {
        let m = margins();
        let d = self.lock_delay().as_secs_f64();
        let l = WORKLOAD_LEASE_DURATION.as_secs_f64();
        let grace = m.grace.as_secs_f64();
        format!(
            "{}: grace G {} s, lock-delay D {d} s, stored lease L + D {} s; earliest takeover \
             (L + D + grace)(1 − δ) = {:.2} s after the holder's last write, its deadline \
             L(1 − δ) − margin = {:.2} s",
            self.name(),
            self.grace_seconds(),
            l + d,
            (l + d + grace) * (1.0 - m.drift),
            l * (1.0 - m.drift) - m.margin.as_secs_f64(),
        )
    }
}

/// The lock-delay the controller gives a workload whose Pods have grace `grace_seconds`
/// and no preStop hook (rule 8, §6.3).
pub fn lock_delay_for_grace(grace_seconds: i64) -> Duration {
    let spec = k8s_openapi::api::core::v1::PodSpec {
        termination_grace_period_seconds: Some(grace_seconds),
        ..Default::default()
    };
    lockwarden::controller::gating::stop::needed_lock_delay(Some(&spec), &margins())
        .expect("a delay below the cap")
}

/// The scales a trial test runs: `suite` in the suite, or `LOCKWARDEN_NODE_TRIALS`
/// full-scale trials (the long runs repeat the full-scale property; `scripts/bench
/// --only node`).
pub fn trials(suite: &[Scale]) -> Vec<Scale> {
    match long_run() {
        Some(n) => vec![Scale::Full; n],
        None => suite.to_vec(),
    }
}

/// `LOCKWARDEN_NODE_TRIALS`, if set: how many full-scale trials a long run repeats.
pub fn long_run() -> Option<usize> {
    std::env::var("LOCKWARDEN_NODE_TRIALS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map(|n| n.max(1))
}

// ---------------------------------------------------------------------------------
// Contention (tests/engine.rs, docs/design.md rules 1–5).

/// How many holds each of tests/engine.rs's 16 contenders makes on one key, in the
/// suite: 25 (400 per store). Mutual exclusion is checked on every hold (the checker's
/// enter/exit), so a violation shows in any hold, the first as the last; more holds
/// only repeat the races. The full scale, 100 each (1,600 per store, most of the
/// engine binary's CPU and its test servers' in the suite), runs in `scripts/chaos
/// --contention 100` (`LOCKWARDEN_CONTENTION_HOLDS`).
pub fn contention_holds() -> usize {
    std::env::var("LOCKWARDEN_CONTENTION_HOLDS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(25, |n| n.max(1))
}

// ---------------------------------------------------------------------------------
// Loss (tests/job_loss.rs, docs/design.md §6.1, rules 1 and 2).

/// The loss trials' S3 lease and renew interval. Rule 2: the holder stops claiming at
/// `sent + 4 s × 0.98 − 0.25 s`; a contender observing the holder's last record from no
/// earlier than `sent` takes over no sooner than `(4 s + D + 0.25 s) × 0.98` later. Both
/// scale with `L`, so their difference does not depend on it; renewals every `L/4`.
pub const LOSS_LEASE: &str = "4s";
pub const LOSS_RENEW: &str = "1s";
/// The loss trials' Job grace, `G` = 1 s: `D` = 7 s. The control plane there has no
/// kubelet, so the Pods are never bound and end at once when deleted: the grace acts
/// only through the delay, and the property (the Job stopped before a contender
/// acquires) rests on rule 2 alone, which holds for every `D ≥ 0`, so it holds at 7 s as
/// at 37 s (Kubernetes' default grace). The delay a 30 s grace needs is exercised on a
/// real kubelet at full scale in tests/node stop.rs.
pub const LOSS_GRACE_SECONDS: i64 = 1;

// ---------------------------------------------------------------------------------
// The controller's failover (tests/node failover.rs, docs/design.md §5).

/// The held locks' renew interval in the failover test. After a failover the locks go
/// unrenewed for up to one renew interval plus the election lease plus a start (§5).
pub const FAILOVER_RENEW: Duration = Duration::from_secs(10);
/// The release's leader-election lease: the chart's default (`leaderElection.leaseDuration`),
/// at full scale: a leader renews it a third of it before it runs out (5 s), which a
/// loaded node must not miss, or the leader exits under every test of the binary.
pub const ELECTION_LEASE: Duration = Duration::from_secs(15);
/// The test release's controller Pod grace (`terminationGracePeriodSeconds`; the
/// chart's default is [`CHART_GRACE_SECONDS`]). The controller does not handle SIGTERM
/// (PID 1 without a handler), so every replacement of its Pod (an upgrade, a deletion)
/// waits out the grace while the old controller still leads and renews. §5's inequality
/// (`renew + election lease + start < L(1 − δ) − margin`) has no term for it: the old
/// controller renews until it is killed, so a 3 s grace changes no margin, only how long
/// each replacement takes. The failover test's normal Pod deletion, (b), deletes a Pod of
/// the chart's default grace (its full-scale instance).
pub const RELEASE_GRACE_SECONDS: i64 = 3;
/// The chart's default `terminationGracePeriodSeconds`.
pub const CHART_GRACE_SECONDS: i64 = 30;
/// The safety factor on a Pod's measured start for a controller Pod's start after a
/// fault: the measured start is of an idle trivial Pod; a controller's comes with the
/// node loaded by the test's own Pods and 100 locks.
pub const START_FACTOR: u32 = 4;
/// What a controller's start needs besides its Pod's: its process, the first election
/// round trip, resuming 100 locks (each a store read and a renewal) on a loaded 2-core
/// box, and after a forced deletion the old container's end (it holds the node's host
/// port until the kubelet kills it). Measured on this node with a 0.7 s Pod start: the
/// forced deletion's recovery took up to 43 s, 28 s beyond the election lease, so up to
/// 53 s unrenewed counting the renew interval (a 50 s lease lost 8 of 100 locks there;
/// docs/design.md §5 had 37 s); 35 s leaves the holder's deadline 10 s past that.
pub const START_ALLOWANCE: Duration = Duration::from_secs(35);

/// The failover test's lease for the held locks, from the measured Pod start `pod_start`
/// (§5): the longest unrenewed time `U = renew + election lease + START_FACTOR × start +
/// START_ALLOWANCE` must end before the holder's deadline (rule 2): `U < L(1 − δ) −
/// margin`, so `L = (U + margin)/(1 − δ)`, rounded up to 5 s. Printed with its terms.
pub fn failover_lease(pod_start: Duration) -> Duration {
    let m = margins();
    let unrenewed = FAILOVER_RENEW + ELECTION_LEASE + pod_start * START_FACTOR + START_ALLOWANCE;
    let lease = (unrenewed + m.margin).as_secs_f64() / (1.0 - m.drift);
    let lease = Duration::from_secs(((lease / 5.0).ceil() as u64) * 5);
    println!(
        "timescale: failover lease {lease:?}: renew {FAILOVER_RENEW:?} + election lease \
         {ELECTION_LEASE:?} + {START_FACTOR} × Pod start {pod_start:.2?} + {START_ALLOWANCE:?} \
         = {unrenewed:.2?} unrenewed at most, < L(1 − δ) − margin = {:.2?}",
        lease.mul_f64(1.0 - m.drift) - m.margin
    );
    lease
}

// ---------------------------------------------------------------------------------
// Kueue (tests/kueue, docs/design.md §6.6).

/// The admission check's `pendingTimeout` and `retryAfter` in the pending-timeout test:
/// the check says `Retry` after `pendingTimeout` with quota reserved and Kueue requeues
/// after `retryAfter`. The property (the quota goes back while the lock is held
/// elsewhere) needs only `pendingTimeout` > 0 and the holder to outlast it; 5 s and
/// 3 s keep the test within a few reconcile rounds.
pub const PENDING_TIMEOUT: &str = "5s";
pub const RETRY_AFTER: &str = "3s";
/// The `requeueAfterSeconds` [`RETRY_AFTER`] gives.
pub const RETRY_AFTER_SECONDS: i64 = 3;
/// How long a test watches for something that must *not* happen (Kueue admitting what
/// it may not): longer than Kueue's admission of a Workload whose checks are Ready
/// (about 1 s here) several times over.
pub const NEVER_WITHIN: Duration = Duration::from_secs(10);
/// The same after the check already said `Rejected` (a second look only).
pub const STILL_NOT_WITHIN: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------
// Measured floors.

/// How long a Pod of the workload image takes on this node from its creation to
/// `Running` (the image imported, host network): measured once per test binary by
/// `measure` (the first caller's), printed.
pub async fn pod_start<F, Fut>(measure: F) -> Duration
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Duration>,
{
    static POD_START: tokio::sync::OnceCell<Duration> = tokio::sync::OnceCell::const_new();
    *POD_START
        .get_or_init(|| async move {
            let started = Instant::now();
            let measured = measure().await;
            println!(
                "timescale: a Pod's start on this node (created → Running): {measured:.2?} \
                 (measured in {:.1?})",
                started.elapsed()
            );
            measured
        })
        .await
}

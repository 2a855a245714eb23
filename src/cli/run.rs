//! `lockwarden run URL -- COMMAND…`: hold the lock, renewed in the background, while
//! COMMAND runs; release it when COMMAND exits and exit with its status.
//!
//! COMMAND gets `LOCKWARDEN_FENCE` (pass it to whatever the lock protects, which
//! should reject writes carrying a lower fence), `LOCKWARDEN_HOLDER`, `LOCKWARDEN_URL`
//! and `LOCKWARDEN_NONCE`. If the lock is lost while COMMAND runs (taken over, record
//! deleted), or is not renewed `--grace` plus the kill margin before its holder
//! deadline, every process COMMAND started gets SIGTERM, then SIGKILL before the holder
//! deadline, and `run` exits with [`exit::LOST`] (docs/design.md §3 rule 7: `run` is
//! their child subreaper, so a process that double-forks or calls `setsid` is reached
//! too).

use std::ffi::OsString;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tokio::process::Child;
use tokio::signal::unix::{Signal, SignalKind};
use tokio::time::{Instant, sleep_until};

use super::output::display_command;
use super::progress::Progress;
pub use super::stop::{DEFAULT_GRACE, KILL_MARGIN, StopTimes, longest_grace};
use super::stop::{GraceTooLong, grace_up_to};
use super::stop::{exit_code, stop_leftovers, take_signals, terminate};
use super::{
    BackendArgs, CliError, PermitArgs, QueueArgs, SharingArgs, ValueError, default_holder,
    print_warning, release_or_log, sys,
};
use lockwarden_core::{
    AcquireRequest, FenceToken, HeldLock, HolderState, Lease, LockBackend, LockState, LostReason,
    Permits, Queueing, RenewPolicy, RunCheck, RunKey, RunMemory, SafetyMargins, Stored,
};
use lockwarden_stores::Target;

/// Lease of a lock held by `run`: renewed every third of it, so a `run` that dies
/// (SIGKILL, machine loss) holds others off for about this long.
pub const DEFAULT_LEASE: &str = "30s";

/// The grace `run` uses for a granted lease: the one asked for if it fits, refused
/// (never clamped) if not; without `--grace`, [`DEFAULT_GRACE`] or what fits.
pub fn grace_within(
    asked: Option<Duration>,
    granted: Duration,
    margins: &SafetyMargins,
) -> Result<Duration, GraceTooLong> {
    grace_up_to(
        asked,
        longest_grace(granted, margins),
        granted,
        "the holder deadline",
    )
}

#[derive(Args, Debug)]
#[command(after_help = "\
COMMAND gets LOCKWARDEN_FENCE, LOCKWARDEN_HOLDER, LOCKWARDEN_URL and LOCKWARDEN_NONCE in its \
environment. SIGTERM and SIGHUP sent to lockwarden are passed on to COMMAND; Ctrl-C reaches it \
from the terminal. run exits with COMMAND's status (128+N if signal N killed it), 3 if the lock \
is held elsewhere, 4 if the lock was lost while COMMAND ran (every process COMMAND started got \
SIGTERM, then SIGKILL before the holder deadline). On ZooKeeper the lease is the session timeout \
(10s).

More than one holder: `lockwarden run --permits 3 s3://locks/warehouse -- ./load.sh` runs at \
most 3 loads at once (a semaphore; each gets its own LOCKWARDEN_FENCE). Readers and a writer: \
`run --permits 16 --shared URL -- ./read.sh` and `run --permits 16 --exclusive URL -- \
./rewrite.sh`; the writer runs alone, and once it waits no new reader starts.")]
pub struct RunArgs {
    /// The lock: s3://BUCKET/KEY, dynamodb://TABLE/KEY, zk://HOST:PORT[,HOST:PORT...]/PATH or k8s://NAMESPACE/LEASE-NAME
    #[arg(value_name = "URL", value_parser = super::parse_target)]
    pub url: Target,

    /// Wait up to this long for the lock (seconds, or a duration such as 5m); 0 = do not wait
    #[arg(short, long, value_name = "SECS", value_parser = super::parse_wait)]
    pub wait: Option<Duration>,

    /// Lease: how long the lock outlives its last renewal (renewed every third of it)
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_LEASE, value_parser = super::parse_lease)]
    pub lease: Duration,

    /// After an expiry (never after a release), contenders wait this much longer than
    /// the lease before taking over, so the holder's work has time to stop: stored as
    /// part of the record's lease, which other tools honour too (at most 10m; not on
    /// ZooKeeper) [default: 0]
    #[arg(long, value_name = "DURATION", env = "LOCKWARDEN_LOCK_DELAY", value_parser = super::parse_lock_delay)]
    pub lock_delay: Option<Duration>,

    /// Holder identity stored with the lock [default: user@host:pid]
    #[arg(long, value_name = "ID", value_parser = super::parse_holder)]
    pub holder: Option<String>,

    /// Take back at once a lock that this --holder still holds from an earlier run that
    /// never released it (a restart), instead of waiting out its lease: only if the
    /// stored holder is this one, by a write conditioned on the version read, with a new
    /// fence. Unsafe if two live processes share the holder name
    #[arg(long, requires = "holder")]
    pub reclaim: bool,

    /// Free text stored with the lock (shown by `status`)
    #[arg(long, value_name = "TEXT")]
    pub data: Option<String>,

    /// How long COMMAND has between SIGTERM and SIGKILL when the lock is lost; both
    /// come before the holder deadline, so at most what the lease leaves (refused above
    /// it) [default: 10s, or that maximum if less]
    #[arg(long, value_name = "DURATION", value_parser = super::parse_duration)]
    pub grace: Option<Duration>,

    /// Once per run: the name of this run (e.g. its scheduled time). If the key
    /// remembers it as completed — here or on another host — COMMAND is not started,
    /// the lock is released and run exits 7; when COMMAND exits 0 the release records
    /// the run. Every store, but not a key deleted on release (--s3lock-compatible); a
    /// mutex, no --queue
    #[arg(long, value_name = "KEY", value_parser = super::args::parse_run_key)]
    pub run_key: Option<RunKey>,

    /// With --run-key: how many completed runs the key remembers, most recent first
    /// (older ones are counted as dropped) [default: 64]
    #[arg(long, value_name = "N", requires = "run_key", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub runs_kept: Option<u16>,

    /// The command to run while the lock is held (after `--`)
    #[arg(value_name = "COMMAND", required = true, num_args = 1.., trailing_var_arg = true)]
    pub command: Vec<OsString>,

    #[command(flatten)]
    pub permits: PermitArgs,

    #[command(flatten)]
    pub queue: QueueArgs,

    #[command(flatten)]
    pub sharing: SharingArgs,

    #[command(flatten)]
    pub backend: BackendArgs,
}

pub async fn run(args: RunArgs) -> Result<u8, CliError> {
    let how = How::from_flags(&args)?;
    let backend = args.url.connect(&args.backend.options(None)).await?;
    let url = backend.url().to_string();
    let margins = backend.margins();
    // The lease granted is the one asked for, except on a session-bound store
    // (ZooKeeper: the session timeout the server grants): there the grace can only be
    // checked once the lock is acquired.
    if !args.url.is_session_bound() {
        grace_within(args.grace, args.lease, &margins)?;
    }
    if args.run_key.is_some() {
        // Before waiting for the key: a key that cannot remember runs is refused now.
        backend.keeps_runs().map_err(CliError::Lock)?;
    }
    let lease = acquire(&args, how, backend.as_ref()).await?;
    super::output::warn_if_taken_over(&url, &lease);
    let runs = completed_runs(&args, backend.as_ref(), &lease).await?;
    let (held, grace) = hold(backend, lease, args.grace, &margins).await?;
    let held = once_per_run(&args, held, runs).await?;
    tracing::info!(%url, fence = %held.fence(), holder = %held.holder(), ?grace, "lock held; starting the command");
    let mut running = start(&args, held, grace).await?;
    let outcome = running.until_ended().await;
    running.end(outcome, args.lease).await
}

/// Holds the lock just acquired, renewed in the background, with the grace its granted
/// lease leaves; a lease that leaves less than `--grace` asks gives it back (ZooKeeper,
/// where the lease is known only now).
async fn hold(
    backend: Arc<dyn LockBackend>,
    lease: Lease,
    asked: Option<Duration>,
    margins: &SafetyMargins,
) -> Result<(HeldLock, Duration), CliError> {
    // The holder's own lease: the lock-delay the record carries is the contenders'
    // (rule 8), never time this holder may run.
    let granted = lease.holder_lease();
    let policy = RenewPolicy::for_lease(granted);
    let held = HeldLock::hold(backend, lease, policy);
    match grace_within(asked, granted, margins) {
        Ok(grace) => Ok((held, grace)),
        Err(refused) => {
            release_or_log(held, None, "after refusing --grace").await;
            Err(refused.into())
        }
    }
}

/// SIGTERM, SIGHUP and SIGINT, handled by `run` while COMMAND runs.
struct Signals {
    term: Signal,
    hup: Signal,
    int: Signal,
}

/// COMMAND running while `run` holds the lock.
struct Running {
    held: HeldLock,
    child: Child,
    signals: Signals,
    url: String,
    /// COMMAND as messages show it.
    shown: String,
    grace: Duration,
    /// `--run-key`: recorded with the release when COMMAND succeeds (§6.7).
    run: Option<RunToRecord>,
}

/// A run `run --run-key` records on success: which, and how many the key keeps.
struct RunToRecord {
    key: RunKey,
    keep: usize,
}

/// `--run-key`: the memory of the record our grant replaced says whether this run is
/// done. A run done (or too old to tell) is not started: the lock goes back at once.
async fn once_per_run(
    args: &RunArgs,
    held: HeldLock,
    runs: RunMemory,
) -> Result<HeldLock, CliError> {
    let Some(run) = &args.run_key else {
        return Ok(held);
    };
    let url = held.url().to_string();
    let detail = match runs.check(run) {
        RunCheck::New => return Ok(held),
        RunCheck::Completed(done) => done.describe(),
        RunCheck::BeyondMemory {
            oldest_kept,
            dropped,
        } => format!(
            "run {run} is not older than the oldest run the key still remembers ({}), and it \
             has forgotten {dropped} earlier ones: it may have completed",
            oldest_kept.run
        ),
    };
    release_or_log(held, None, "after finding the run completed").await;
    Err(CliError::AlreadyCompleted { url, detail })
}

/// With `--run-key`: the key's memory of completed runs as our grant finds it (an
/// unreadable one gives the lock back: the run must not start unchecked).
async fn completed_runs(
    args: &RunArgs,
    backend: &dyn LockBackend,
    lease: &Lease,
) -> Result<RunMemory, CliError> {
    if args.run_key.is_none() {
        return Ok(RunMemory::default());
    }
    match backend.completed_runs(lease).await {
        Ok(runs) => Ok(runs),
        Err(e) => {
            if let Err(release) = backend.release(lease).await {
                print_warning(&format!("releasing the lock failed: {release}"));
            }
            Err(CliError::Lock(e))
        }
    }
}

/// Starts COMMAND under the held lock; if it cannot start, the lock is given back.
async fn start(args: &RunArgs, held: HeldLock, grace: Duration) -> Result<Running, CliError> {
    let url = held.url().to_string();
    // Handle signals before COMMAND exists, so none can kill us and orphan it; adopt
    // COMMAND's orphans, so none leaves the tree `run` stops (rule 7).
    let kinds = [
        SignalKind::terminate(),
        SignalKind::hangup(),
        SignalKind::interrupt(),
    ];
    let signals = match take_signals(kinds, &url) {
        Ok([term, hup, int]) => Signals { term, hup, int },
        Err(refused) => {
            release_or_log(held, None, "after failing to handle signals").await;
            return Err(refused);
        }
    };

    let shown = display_command(&args.command);
    let child = match spawn(
        &args.command,
        held.fence(),
        held.holder(),
        &url,
        held.nonce(),
    ) {
        Ok(child) => child,
        Err(source) => {
            if let Err(e) = held.release().await {
                print_warning(&format!("releasing the lock failed: {e}"));
            }
            return Err(CliError::Spawn {
                url,
                command: shown,
                source,
            });
        }
    };
    let run = args.run_key.clone().map(|key| RunToRecord {
        key,
        keep: args.runs_kept.map_or(RunMemory::DEFAULT_KEEP, usize::from),
    });
    Ok(Running {
        held,
        child,
        signals,
        url,
        shown,
        grace,
        run,
    })
}

/// How COMMAND's run ended: it exited (what waiting for it gave), or the lock was lost
/// or not renewed in time (the holder's state then, and when COMMAND's processes stop).
type Outcome = Result<std::io::Result<ExitStatus>, (HolderState, StopTimes)>;

impl Running {
    /// Waits for COMMAND to exit, passing signals on, unless the lock is lost or not
    /// renewed `--grace` plus the kill margin before the holder deadline.
    async fn until_ended(&mut self) -> Outcome {
        let pid = self.child.id();
        let forward = |sig: i32| {
            if let Some(pid) = pid {
                let _ = sys::signal(pid, sig);
            }
        };
        let grace = self.grace;
        let lost = self.held.lost();
        tokio::pin!(lost);
        let mut deadline = self.held.deadline();
        let mut renewing = true;
        loop {
            // Every confirmed renewal moves the deadline, and the stop with it.
            let stop = StopTimes::before(*deadline.borrow_and_update(), grace);
            tokio::select! {
                status = self.child.wait() => return Ok(status),
                state = &mut lost => {
                    return Err((state, StopTimes::now(Instant::now(), *deadline.borrow(), grace)));
                }
                changed = deadline.changed(), if renewing => renewing = changed.is_ok(),
                _ = sleep_until(stop.term) => return Err((self.not_renewed(), stop)),
                _ = self.signals.term.recv() => forward(sys::SIGTERM),
                _ = self.signals.hup.recv() => forward(sys::SIGHUP),
                // The terminal sends Ctrl-C to COMMAND too; we wait for it to exit.
                _ = self.signals.int.recv() => {}
            }
        }
    }

    /// The holder's state when no renewal was confirmed in time: still held as far as
    /// the holder task knows, but not for `run`.
    fn not_renewed(&self) -> HolderState {
        match self.held.state() {
            HolderState::Held { fence, .. } => HolderState::Expiring {
                fence,
                last_error: format!(
                    "no renewal confirmed {} before the holder deadline",
                    humantime::format_duration(self.grace + KILL_MARGIN)
                ),
            },
            other => other,
        }
    }

    /// Stops what COMMAND left or, after a loss, all of it, by the holder deadline; then
    /// gives the lock back and says how `run` ends.
    async fn end(mut self, outcome: Outcome, lease: Duration) -> Result<u8, CliError> {
        let deadline = *self.held.deadline().borrow();
        let (url, shown, grace) = (self.url, self.shown, self.grace);
        match outcome {
            Ok(waited) => {
                // What COMMAND left running is still its work under the lock: it ends
                // before the release lets the next holder start (rule 7). Usually nothing
                // is left, and the release follows at once.
                if let Some(done) = stop_leftovers(&shown, deadline, grace).await {
                    print_warning(&format!("{done}, before releasing"));
                }
                finish(waited, self.held, &url, &shown, lease, self.run.as_ref()).await
            }
            Err((state, times)) => {
                let action = terminate(&mut self.child, &shown, deadline, times).await;
                let (backend, nonce) = (self.held.backend(), self.held.nonce().to_string());
                // A lock in jeopardy (not renewed in time) may still be ours: give it back,
                // without waiting long for a backend that is not answering.
                let within = Some(Duration::from_secs(10));
                release_or_log(self.held, within, "after stopping the command").await;
                Err(CliError::Lost {
                    url,
                    reason: loss_reason(&state, backend.as_ref(), &nonce).await,
                    action,
                })
            }
        }
    }
}

/// Starts COMMAND with the lock's fence, holder, URL and nonce in its environment.
fn spawn(
    command: &[OsString],
    fence: FenceToken,
    holder: &str,
    url: &str,
    nonce: &str,
) -> std::io::Result<Child> {
    tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .env("LOCKWARDEN_FENCE", fence.to_string())
        .env("LOCKWARDEN_HOLDER", holder)
        .env("LOCKWARDEN_URL", url)
        .env("LOCKWARDEN_NONCE", nonce)
        .spawn()
}

/// COMMAND ended while the lock was held: release it, and pass COMMAND's status on.
async fn finish(
    waited: std::io::Result<ExitStatus>,
    held: HeldLock,
    url: &str,
    shown: &str,
    lease: Duration,
    run: Option<&RunToRecord>,
) -> Result<u8, CliError> {
    match waited {
        Ok(status) => {
            tracing::info!(%url, %status, "command exited; releasing");
            // Only a success is a completed run; a failure leaves it to the next holder.
            let released = match run.filter(|_| status.success()) {
                Some(run) => {
                    held.release_completed(&run.key, Some(&sys::hostname()), run.keep)
                        .await
                }
                None => held.release().await,
            };
            if let Err(e) = released {
                print_warning(&format!(
                    "{e} (releasing after the command exited; the lease ends it in {})",
                    humantime::format_duration(lease)
                ));
            }
            Ok(exit_code(status))
        }
        Err(source) => {
            release_or_log(held, None, "after failing to wait for the command").await;
            Err(CliError::Io {
                context: format!("{url}: waiting for {shown:?}"),
                source,
            })
        }
    }
}

/// How `run` takes the key, from its checked flags.
struct How {
    permits: Permits,
    lock_delay: Duration,
    queue: Option<Queueing>,
    yield_to_pollers: Option<Duration>,
}

impl How {
    /// `run`'s flags for taking the key, each checked against the lock and the others.
    fn from_flags(args: &RunArgs) -> Result<How, ValueError> {
        let permits = args.permits.permits()?;
        let lock_delay = super::args::lock_delay_for(&args.url, args.lock_delay)?;
        super::args::check_state_lock(&args.url, &args.backend, permits, args.queue.queue)?;
        let queue = args.queue.queueing(&args.url, permits, &args.backend)?;
        let yield_to_pollers =
            args.sharing
                .yield_to_pollers(&args.url, &args.backend, permits, queue)?;
        super::args::check_run_key(args.run_key.as_ref(), permits, queue)?;
        Ok(How {
            permits,
            lock_delay,
            queue,
            yield_to_pollers,
        })
    }
}

/// Acquires the lock with progress on stderr.
async fn acquire(args: &RunArgs, how: How, backend: &dyn LockBackend) -> Result<Lease, CliError> {
    let req = AcquireRequest {
        holder: args.holder.clone().unwrap_or_else(default_holder),
        lease: args.lease,
        data: args.data.clone(),
        force: false,
        reclaim: args.reclaim,
        permits: how.permits,
        cluster: Some(sys::hostname()),
        lock_delay: how.lock_delay,
        queue: how.queue,
        yield_to_pollers: how.yield_to_pollers,
    };
    let mut progress = Progress::new(backend.url(), args.wait);
    let lease = super::acquire(backend, &req, args.wait, |by, q| progress.busy(by, q)).await;
    progress.finish();
    lease
}

/// Why the lock was lost, and who has it now when the loss itself does not say
/// (ZooKeeper: our entry was deleted).
async fn loss_reason(state: &HolderState, backend: &dyn LockBackend, nonce: &str) -> String {
    let mut reason = match state {
        HolderState::Lost(reason) => reason.to_string(),
        HolderState::Expiring { last_error, .. } => {
            format!("not renewed in time ({last_error})")
        }
        HolderState::Released => "released".to_string(),
        HolderState::Held { .. } => "lost".to_string(),
    };
    if !matches!(state, HolderState::Lost(LostReason::TakenOver(_)))
        && let Ok(Ok(Some(Stored { record: Ok(r), .. }))) =
            tokio::time::timeout(Duration::from_secs(5), backend.inspect()).await
        && r.state == LockState::Held
        && r.nonce != nonce
        // On a key with more than one permit the record names one holder of several.
        && r.set.as_ref().is_none_or(|set| set.entry(nonce).is_none())
    {
        reason.push_str(&format!(" (now held by {} (fence {}))", r.holder, r.fence));
    }
    reason
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn rule7_sigkill_comes_the_kill_margin_before_the_deadline_and_sigterm_the_grace_before_that() {
        let deadline = Instant::now() + Duration::from_secs(60);
        let stop = StopTimes::before(deadline, ms(3000));
        assert_eq!(stop.kill, deadline - KILL_MARGIN);
        assert_eq!(stop.term, deadline - KILL_MARGIN - ms(3000));
        assert!(stop.term <= stop.kill && stop.kill < deadline);
        // No grace: both at once, still before the deadline.
        let stop = StopTimes::before(deadline, Duration::ZERO);
        assert_eq!(
            (stop.term, stop.kill),
            (deadline - KILL_MARGIN, deadline - KILL_MARGIN)
        );
    }

    #[test]
    fn rule7_a_loss_learnt_from_the_store_stops_at_once_and_kills_by_the_deadline() {
        let now = Instant::now();
        // Learnt early: the whole grace, and SIGKILL well before the deadline.
        let deadline = now + Duration::from_secs(20);
        let stop = StopTimes::now(now, deadline, ms(2000));
        assert_eq!((stop.term, stop.kill), (now, now + ms(2000)));
        // Learnt late: SIGKILL still the kill margin before the deadline.
        let deadline = now + ms(700);
        let stop = StopTimes::now(now, deadline, ms(2000));
        assert_eq!((stop.term, stop.kill), (now, deadline - KILL_MARGIN));
        // Learnt after it (a lease resumed expired): everything at once.
        let stop = StopTimes::now(now + ms(900), deadline, ms(2000));
        assert_eq!((stop.term, stop.kill), (now + ms(900), now + ms(900)));
    }

    #[test]
    fn rule7_the_longest_grace_leaves_a_renewal_on_schedule_before_sigterm() {
        let margins = SafetyMargins::default();
        for (lease, longest) in [(30_000, 11_150), (10_000, 3_216), (3_000, 440), (1_000, 0)] {
            let lease = ms(lease);
            assert_eq!(longest_grace(lease, &margins), ms(longest), "{lease:?}");
            // A write sent at t0 and answered at once; the next renewal goes one
            // interval later and takes its whole request timeout: confirmed before
            // SIGTERM, so a healthy schedule never stops COMMAND.
            let t0 = Instant::now();
            let policy = RenewPolicy::for_lease(lease);
            let confirmed = t0 + policy.interval + policy.request_timeout;
            let deadline = t0 + margins.holder_validity(lease);
            let stop = StopTimes::before(deadline, longest_grace(lease, &margins));
            if longest > 0 {
                assert!(
                    confirmed <= stop.term,
                    "{lease:?}: {confirmed:?} > {:?}",
                    stop.term
                );
            }
            assert!(stop.kill < deadline);
        }
    }

    #[test]
    fn rule7_a_grace_above_what_the_lease_leaves_is_refused_not_clamped() {
        let margins = SafetyMargins::default();
        let lease = Duration::from_secs(3);
        assert_eq!(grace_within(Some(ms(440)), lease, &margins), Ok(ms(440)));
        let refused = grace_within(Some(ms(441)), lease, &margins)
            .unwrap_err()
            .to_string();
        for needle in ["--grace 441ms", "3s lease", "at most 440ms"] {
            assert!(refused.contains(needle), "{needle:?} not in {refused:?}");
        }
        // Without --grace: 10 s when the lease leaves that much, else what it leaves.
        assert_eq!(
            grace_within(None, Duration::from_secs(30), &margins),
            Ok(DEFAULT_GRACE)
        );
        assert_eq!(grace_within(None, lease, &margins), Ok(ms(440)));
        assert_eq!(
            grace_within(None, Duration::from_secs(1), &margins),
            Ok(Duration::ZERO)
        );
    }
}

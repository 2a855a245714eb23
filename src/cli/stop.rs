//! Stopping a command's whole process tree by a deadline (docs/design.md §3 rules 7
//! and 9): when SIGTERM and SIGKILL go ([`StopTimes`]), and the walk that delivers
//! them ([`stop_tree`]). Shared by `run` (the deadline is its own holder deadline) and
//! `guard` (the deadline it derives from the store's record on its own).

use std::collections::HashSet;
use std::process::ExitStatus;
use std::time::Duration;

use tokio::process::Child;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::time::{Instant, sleep_until};

use super::{CliError, sys, tree};
use lockwarden_core::{RenewPolicy, SafetyMargins};

/// Rule 7's k: how long before the holder deadline SIGKILL goes, the time to walk
/// `/proc`, signal every process of the tree and see each gone, with room for a
/// loaded machine's scheduling delays (tens to a hundred milliseconds on two busy cores).
pub const KILL_MARGIN: Duration = Duration::from_millis(500);

/// `--grace` when none is given, if the deadline leaves that much (else the most it
/// leaves).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// The longest `--grace` a granted lease leaves (rule 7): SIGTERM must not come while
/// renewals are on schedule. After a write sent at t the deadline is
/// `t + lease × (1 − δ) − margin`; the next renewal goes an interval after the reply
/// and may take its request timeout; SIGKILL comes the kill margin before the
/// deadline. Whole milliseconds, so the maximum a message names is itself accepted.
pub fn longest_grace(granted: Duration, margins: &SafetyMargins) -> Duration {
    let policy = RenewPolicy::for_lease(granted);
    let left = margins
        .holder_validity(granted)
        .saturating_sub(policy.interval + policy.request_timeout + KILL_MARGIN);
    Duration::from_millis(left.as_millis() as u64)
}

/// The grace asked for if it is at most `longest`, refused (never clamped) if not;
/// without `--grace`, [`DEFAULT_GRACE`] or `longest` if less. `deadline` names what
/// SIGKILL comes before, for the message.
pub fn grace_up_to(
    asked: Option<Duration>,
    longest: Duration,
    lease: Duration,
    deadline: &'static str,
) -> Result<Duration, GraceTooLong> {
    match asked {
        None => Ok(DEFAULT_GRACE.min(longest)),
        Some(grace) if grace <= longest => Ok(grace),
        Some(grace) => Err(GraceTooLong {
            grace,
            lease,
            longest,
            deadline,
        }),
    }
}

/// A `--grace` longer than the lease leaves (a usage error, exit 2): it is refused,
/// never clamped.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "--grace {}: a {} lease leaves at most {} (SIGKILL comes {} before {deadline}, \
     SIGTERM the grace before that, and renewals on schedule must not trigger it); \
     give a shorter --grace or a longer lease",
    humantime::format_duration(*grace),
    humantime::format_duration(*lease),
    humantime::format_duration(*longest),
    humantime::format_duration(KILL_MARGIN)
)]
pub struct GraceTooLong {
    pub grace: Duration,
    pub lease: Duration,
    /// The longest grace the lease leaves.
    pub longest: Duration,
    /// What SIGKILL comes before: the holder deadline (`run`) or the guard's.
    pub deadline: &'static str,
}

/// When COMMAND's processes are stopped (docs/design.md §3 rules 7 and 9), on this
/// process's monotonic clock, the one the deadline is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopTimes {
    /// SIGTERM to every process of the tree.
    pub term: Instant,
    /// SIGKILL to every process still alive, repeated until none is.
    pub kill: Instant,
}

impl StopTimes {
    /// For a holder deadline that is not moved by a renewal in time: SIGKILL a kill
    /// margin before it, SIGTERM `grace` before that, so the grace ends before the
    /// deadline rather than after it.
    pub fn before(deadline: Instant, grace: Duration) -> StopTimes {
        let kill = earlier(deadline, KILL_MARGIN);
        StopTimes {
            term: earlier(kill, grace),
            kill,
        }
    }

    /// For a loss learnt at `now` (taken over, record deleted, session expired), or
    /// processes COMMAND left behind when it exited: SIGTERM at once, SIGKILL after
    /// `grace` but never later than [`StopTimes::before`] would.
    pub fn now(now: Instant, deadline: Instant, grace: Duration) -> StopTimes {
        StopTimes {
            term: now,
            kill: (now + grace).min(earlier(deadline, KILL_MARGIN)).max(now),
        }
    }
}

/// `t - by`, or on a clock too young to go back that far, `t` itself: only at boot,
/// where no lease has been running for long either.
fn earlier(t: Instant, by: Duration) -> Instant {
    t.checked_sub(by).unwrap_or(t)
}

/// Handles `kinds` from now on and makes this process the subreaper of its orphaned
/// descendants (rule 7: leaving the process group or the session does not leave the
/// tree that is stopped). `url` names the lock in the error.
pub(crate) fn take_signals<const N: usize>(
    kinds: [SignalKind; N],
    url: &str,
) -> Result<[Signal; N], CliError> {
    let taken = (|| -> std::io::Result<Vec<Signal>> {
        let signals = kinds.into_iter().map(signal).collect::<Result<_, _>>()?;
        tree::become_subreaper()?;
        Ok(signals)
    })();
    match taken {
        Ok(signals) => Ok(signals
            .try_into()
            .unwrap_or_else(|_| unreachable!("one signal a kind"))),
        Err(source) => Err(CliError::Io {
            context: format!("{url}: cannot handle signals or adopt orphans"),
            source,
        }),
    }
}

/// COMMAND exited on its own: what it left running is still work under the lock, so
/// it stops by the deadline too (rule 7), SIGTERM at once and SIGKILL after `grace` at
/// the latest. What was done, if anything was left (usually nothing is).
pub(crate) async fn stop_leftovers(
    shown: &str,
    deadline: Instant,
    grace: Duration,
) -> Option<String> {
    let leftovers = tree::live_descendants(std::process::id());
    if leftovers.is_empty() {
        return None;
    }
    let times = StopTimes::now(Instant::now(), deadline, grace);
    let stopped = stop_tree(None, times).await;
    Some(format!(
        "{shown:?} exited and left {} process(es) running: sent SIGTERM to {}{}",
        leftovers.len(),
        stopped.termed,
        stopped.killing(times)
    ))
}

/// Ends every process of COMMAND's tree after the lock was lost, by `times` (rule 7).
/// Says what was done.
pub(crate) async fn terminate(
    child: &mut Child,
    shown: &str,
    deadline: Instant,
    times: StopTimes,
) -> String {
    let pid = child.id();
    tracing::info!(
        deadline_monotonic = sys::monotonic_seconds(deadline),
        term_monotonic = sys::monotonic_seconds(times.term),
        kill_monotonic = sys::monotonic_seconds(times.kill),
        "stopping the command's processes before the deadline"
    );
    let stopped = stop_tree(pid, times).await;
    // When the last process was seen gone: how much of the deadline the stop left,
    // for whoever checks a late write against it.
    let gone = Instant::now();
    tracing::info!(
        gone_monotonic = sys::monotonic_seconds(gone),
        deadline_monotonic = sys::monotonic_seconds(deadline),
        "every process of the command has ended"
    );
    let mut action = match pid {
        Some(pid) => format!(
            "sent SIGTERM to {shown:?} (pid {pid}){}",
            stopped.killing(times)
        ),
        None => format!("{shown:?} had already exited{}", stopped.killing(times)),
    };
    if let Ok(status) = child.wait().await {
        action.push_str(&format!("; it exited with {}", describe(status)));
    }
    action
}

/// What [`stop_tree`] did.
pub(crate) struct Stopped {
    pub termed: usize,
    pub killed: usize,
}

impl Stopped {
    /// The SIGKILL part, if any: `, then SIGKILL to N process(es) after …`.
    pub fn killing(&self, times: StopTimes) -> String {
        if self.killed == 0 {
            return String::new();
        }
        format!(
            ", then SIGKILL to {} process(es) after {}, by the deadline",
            self.killed,
            humantime::format_duration(round_ms(times.kill - times.term)),
        )
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

/// SIGTERM at `times.term` to `command` (COMMAND's pid, while it runs: it decides how
/// its own children stop, as when a terminal or a container runtime stops it, and a
/// shell whose children all got SIGTERM at once reports each as "Terminated"), or, when
/// COMMAND has exited, to every process it left; then SIGKILL at `times.kill` to every
/// process below `run` still alive, walking the tree again until none is (one forked
/// between a walk and its parent's SIGKILL is found by the next walk). Adopted orphans
/// are reaped; `command` is left for tokio to reap.
pub(crate) async fn stop_tree(command: Option<u32>, times: StopTimes) -> Stopped {
    let me = std::process::id();
    sleep_until(times.term).await;
    let mut termed = 0;
    match command {
        // Our own child, not yet reaped: its pid cannot have been recycled.
        Some(pid) => termed += usize::from(sys::signal(pid, sys::SIGTERM).is_ok()),
        None => {
            for process in tree::live_descendants(me) {
                termed += usize::from(tree::signal(&process, sys::SIGTERM).is_ok());
            }
        }
    }
    let mut killed = HashSet::new();
    loop {
        tree::reap_adopted(me, command);
        let live = tree::live_descendants(me);
        if live.is_empty() {
            break;
        }
        let now = Instant::now();
        if now >= times.kill {
            if me == 1 {
                // PID 1 of a PID namespace (a container's entrypoint): kill(-1) reaches
                // every other process of the namespace, also one that never was below
                // us (`kubectl exec` enters from outside, with no parent inside).
                sys::kill_every_other_process();
            }
            for process in &live {
                if tree::signal(process, sys::SIGKILL).is_ok() {
                    killed.insert(process.pid);
                }
            }
            // A process with SIGKILL pending dies when next scheduled.
            tokio::time::sleep(Duration::from_millis(1)).await;
        } else {
            sleep_until((now + Duration::from_millis(20)).min(times.kill)).await;
        }
    }
    Stopped {
        termed,
        killed: killed.len(),
    }
}

/// The shell's convention: the exit status, or 128 + the signal that killed it.
pub(crate) fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => (code & 0xff) as u8,
        (None, Some(sig)) => (128 + sig).clamp(0, 255) as u8,
        (None, None) => super::exit::ERROR,
    }
}

pub(crate) fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("status {code}"),
        (None, Some(sig)) => format!("signal {sig}"),
        _ => status.to_string(),
    }
}

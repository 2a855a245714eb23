//! COMMAND under the guard: started with its locks in its environment, run until it
//! ends on its own or a lock cannot be confirmed by the deadline, and then its whole
//! process tree stopped by that deadline (rule 9 through rule 7's stop,
//! [`crate::cli::stop`], shared with `run`).

use std::ffi::OsString;

use tokio::process::Child;
use tokio::time::{Instant, sleep_until};

use super::args::{GuardArgs, Guarded};
use super::deadline::{Read, Seen, Step, Watch, Watched};
use super::pid1::Signals;
use super::report;
use crate::cli::output::display_command;
use crate::cli::stop::{KILL_MARGIN, StopTimes, exit_code, stop_leftovers, terminate};
use crate::cli::{CliError, print_warning, sys};

/// Why the guard stopped COMMAND (the index of the lock that stopped it), and when it
/// had to.
enum Stop {
    Lost(usize, String),
    Unconfirmed(usize, String),
}

impl Stop {
    /// The guard's error for this stop, with what was done to COMMAND.
    fn error(self, locks: &[Watched], action: String) -> CliError {
        match self {
            Stop::Lost(i, reason) => CliError::Lost {
                url: locks[i].url.clone(),
                reason,
                action,
            },
            Stop::Unconfirmed(i, reason) => CliError::Unconfirmed {
                url: locks[i].url.clone(),
                reason,
                action,
            },
        }
    }
}

impl Watch {
    /// Runs COMMAND as the guard's child until it ends on its own or a lock cannot be
    /// confirmed by the deadline (which every observed renewal moves), then stops it.
    pub(super) async fn command(
        mut self,
        args: &GuardArgs,
        locks: &[Guarded],
        mut signals: Signals,
        mut deadline: Instant,
    ) -> Result<u8, CliError> {
        let url = self.urls();
        let grace = self.grace;
        let shown = display_command(&args.command);
        let environment = environment(locks, &self.locks);
        let mut child = spawn(&args.command, &environment).map_err(|source| CliError::Spawn {
            url: url.clone(),
            command: shown.clone(),
            source,
        })?;
        let pid = child.id();

        let outcome = loop {
            // Every observed renewal moves the deadline, and the stop with it.
            let stop = StopTimes::before(deadline, grace);
            tokio::select! {
                status = child.wait() => break Ok(status),
                // The readers only end with the guard: a dead one confirms nothing.
                Some((i, read)) = self.reads.recv() => match self.running(i, &read, deadline) {
                    Ok(moved) => deadline = moved,
                    Err(stopping) => break Err(stopping),
                },
                _ = sleep_until(stop.term) => break Err(self.unconfirmed(deadline, stop)),
                () = signals.pass_on(pid) => {}
            }
        };

        match outcome {
            Ok(waited) => {
                let status = waited.map_err(|source| CliError::Io {
                    context: format!("{url}: waiting for {shown:?}"),
                    source,
                })?;
                // COMMAND ended on its own: what it left running is still work under the
                // lock, so it stops by the deadline too, as under `run` (rule 7).
                if let Some(done) = stop_leftovers(&shown, deadline, grace).await {
                    print_warning(&done);
                }
                let code = exit_code(status);
                // Whatever signal comes meanwhile, the guard exits with COMMAND's code:
                // after a report, only a 0 keeps the Pod from counting as failed.
                if code == 0
                    && let Some(pod) = report::OwnPod::from_env(|name| std::env::var(name).ok())
                    && let Err(why) = report::ended_in_success(&pod).await
                {
                    print_warning(&format!(
                        "{shown:?} succeeded, but its Pod was not told at once ({why}); \
                         the lock is handed on when the kubelet reports the exit"
                    ));
                }
                Ok(code)
            }
            Err((stop, times)) => {
                let action = terminate(&mut child, &shown, deadline, times).await;
                Err(stop.error(&self.locks, action))
            }
        }
    }

    /// What lock `i`'s read means while COMMAND runs: the deadline COMMAND stops by from
    /// now on (a renewal moves it), or the stop a loss calls for.
    fn running(
        &mut self,
        i: usize,
        read: &Read,
        deadline: Instant,
    ) -> Result<Instant, (Stop, StopTimes)> {
        match self.locks[i].clock.read(read) {
            Step::Renewed { .. } => {
                // Every lock has a deadline since COMMAND started; the work
                // stops by the earliest.
                if let Some((moved, _)) = self.deadline() {
                    tracing::debug!(
                        deadline_monotonic = sys::monotonic_seconds(moved),
                        "renewal seen"
                    );
                    return Ok(moved);
                }
            }
            Step::Lost { at, why } => {
                let times = StopTimes::now(at.max(Instant::now()), deadline, self.grace);
                return Err((Stop::Lost(i, why), times));
            }
            Step::Unchanged => {
                if let Seen::NoAnswer(cause) = &read.seen {
                    tracing::warn!(url = %self.locks[i].url, %cause, "the lock could not be read");
                }
            }
        }
        Ok(deadline)
    }

    /// No renewal seen in time: COMMAND stops at `stop`, in the name of the lock whose
    /// deadline is the earliest.
    fn unconfirmed(&self, deadline: Instant, stop: StopTimes) -> (Stop, StopTimes) {
        let reason = format!(
            "no renewal seen {} before the deadline",
            humantime::format_duration(self.grace + KILL_MARGIN)
        );
        let (_, i) = self.deadline().unwrap_or((deadline, 0));
        (Stop::Unconfirmed(i, reason), stop)
    }
}

/// What COMMAND finds in its environment: LOCKWARDEN_FENCE, LOCKWARDEN_URL and
/// LOCKWARDEN_NONCE for one lock; LOCKWARDEN_FENCES, LOCKWARDEN_URLS and
/// LOCKWARDEN_NONCES (the annotations' formats) for several.
fn environment(locks: &[Guarded], watched: &[Watched]) -> Vec<(&'static str, String)> {
    if let [only] = locks
        && only.name.is_none()
    {
        return vec![
            ("LOCKWARDEN_FENCE", only.fence.to_string()),
            ("LOCKWARDEN_URL", watched[0].url.clone()),
            ("LOCKWARDEN_NONCE", only.nonce.clone()),
        ];
    }
    let name = |lock: &Guarded| lock.name.clone().unwrap_or_default();
    let joined = |separator: &str, value: &dyn Fn(usize, &Guarded) -> String| {
        let parts: Vec<String> = locks
            .iter()
            .enumerate()
            .map(|(i, lock)| format!("{}={}", name(lock), value(i, lock)))
            .collect();
        parts.join(separator)
    };
    vec![
        (
            "LOCKWARDEN_FENCES",
            joined(",", &|_, l| l.fence.to_string()),
        ),
        (
            "LOCKWARDEN_URLS",
            joined(" ", &|i, _| watched[i].url.clone()),
        ),
        ("LOCKWARDEN_NONCES", joined(",", &|_, l| l.nonce.clone())),
    ]
}

/// Starts COMMAND with `environment` added to the guard's own.
fn spawn(command: &[OsString], environment: &[(&'static str, String)]) -> std::io::Result<Child> {
    tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .envs(environment.iter().map(|(k, v)| (*k, v.as_str())))
        .spawn()
}

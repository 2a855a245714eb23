//! `lockwarden guard -- COMMAND…`: the node-side stop (docs/design.md §3 rule 9).
//!
//! A gated workload's lock is held by someone else (the controller); if that holder is
//! stopped or cut off, or the kubelet is cut off from the API server, nobody tells the
//! workload to stop. The guard runs as the container's entrypoint, runs COMMAND as its
//! child, reads the lock's record in the store on its own, and stops COMMAND's whole
//! process tree by a deadline it derives from what it read — whenever it cannot confirm
//! that the record still carries the acquisition's nonce.
//!
//! By job: `args.rs` the flags and the locks they name; `deadline.rs` what the reads
//! prove, the pure part ([`GuardDeadline`], and the earliest deadline of every lock);
//! `reads.rs` the reads themselves; `pid1.rs` the signals and orphans of an
//! entrypoint; `watch.rs` COMMAND's process tree and its stop, the process side shared
//! with `run` (`cli/stop.rs`); `report.rs` what it writes on its own Pod: its request
//! for a renewal, and its report that COMMAND ended in success. This file: the guard's
//! phases, in order.

pub(super) mod args;
mod deadline;
mod pid1;
mod reads;
mod report;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};

use super::stop::{StopTimes, grace_up_to};
use super::{CliError, sys};
use lockwarden_core::{FenceToken, LockBackend};
use lockwarden_stores::ConnectOptions;
use pid1::Signals;
use reads::{Readers, first_read};

pub use args::{GuardArgs, GuardArgsError, Guarded, several};
pub use deadline::{GuardDeadline, Read, Seen, Step, longest_guard_grace, poll_interval};
use deadline::{Watch, Watched};

pub async fn run(args: GuardArgs) -> Result<u8, CliError> {
    let locks = args.locks()?;
    let options = args.backend.options(None);
    refuse_unwatchable(&locks, &options)?;
    let mut backends = Vec::with_capacity(locks.len());
    for lock in &locks {
        backends.push(lock.url.connect(&options).await?);
    }
    let urls: Vec<String> = backends.iter().map(|b| b.url().to_string()).collect();
    let mut signals = Signals::take(&urls.join(" "))?;

    let firsts = first_reads(&locks, &backends, &urls).await?;
    let grace = one_grace(args.grace, &firsts, &backends)?;
    let revisions = revisions_read(&firsts);
    // The readers run until the guard returns.
    let (mut watch, mut readers) = start_watching(&locks, backends, urls, firsts, grace);
    if let Some(pod) = report::OwnPod::from_env(|name| std::env::var(name).ok()) {
        readers.alongside(tokio::spawn(ask_for_renewal(
            pod,
            revisions,
            readers.hurry(),
        )));
    }
    let deadline = match watch.first_renewal(&mut signals).await? {
        Started::Deadline(deadline) => deadline,
        Started::Signalled(code) => return Ok(code),
    };
    watch.command(&args, &locks, signals, deadline).await
}

/// Refuses, before anything is sent, a lock the guard cannot watch (a ZooKeeper one),
/// or one it could not read from this image.
fn refuse_unwatchable(locks: &[Guarded], options: &ConnectOptions) -> Result<(), CliError> {
    if let Some(bound) = locks.iter().find(|l| l.url.is_session_bound()) {
        return Err(CliError::Usage(format!(
            "{}: the guard cannot watch this lock: its queue entry lives until the holder's \
             session expires and is then deleted at once, so no read tells how long it stays \
             held (S3, DynamoDB and Kubernetes Leases can be guarded)",
            bound.url
        )));
    }
    // The guard runs inside the workload's image, which need not have what
    // lockwarden's own image has.
    if let Some(tls) = locks.iter().find(|l| l.url.needs_system_roots(options))
        && let Some(why) = lockwarden_stores::aws::missing_root_certificates()
    {
        return Err(CliError::Unreadable {
            cause: format!("{}: {why}", tls.url),
        });
    }
    Ok(())
}

/// The first reads: every lock must be ours, now. Each read with the stored lease of
/// our acquisition.
async fn first_reads(
    locks: &[Guarded],
    backends: &[Arc<dyn LockBackend>],
    urls: &[String],
) -> Result<Vec<(Read, Duration)>, CliError> {
    let mut firsts = Vec::with_capacity(locks.len());
    for ((lock, backend), url) in locks.iter().zip(backends).zip(urls) {
        let first = first_read(backend.as_ref(), &lock.nonce, url).await;
        let lease = ours_at_start(&first, url, lock.fence)?;
        firsts.push((first, lease));
    }
    Ok(firsts)
}

/// The revision each first read showed, in the order of the locks.
fn revisions_read(firsts: &[(Read, Duration)]) -> Vec<String> {
    firsts
        .iter()
        .filter_map(|(read, _)| match &read.seen {
            Seen::Ours { revision, .. } => Some(revision.clone()),
            _ => None,
        })
        .collect()
}

/// How long the guard reads every [`reads::HURRIED_POLL`] once its request is on its
/// Pod: the renewal takes the controller's watch and one store write, milliseconds; one
/// not seen by then comes on the schedule, at the usual polls.
const HURRY_FOR: Duration = Duration::from_secs(1);

/// Asks for a renewal on the guard's own Pod (`report::ask_for_renewal`), beside the
/// reads, and once asked has them `hurry`. Not asked (no role to write it, say), the
/// guard waits for the scheduled renewal, as without the request.
async fn ask_for_renewal(
    pod: report::OwnPod,
    revisions: Vec<String>,
    hurry: impl Fn(Duration) + Send + 'static,
) {
    match report::ask_for_renewal(&pod, &revisions).await {
        Ok(()) => {
            tracing::info!(?revisions, "asked for a renewal");
            hurry(HURRY_FOR);
        }
        Err(why) => {
            tracing::info!(%why, "could not ask for a renewal; waiting for the scheduled one")
        }
    }
}

/// One grace for COMMAND: what the lock leaving the least allows.
fn one_grace(
    asked: Option<Duration>,
    firsts: &[(Read, Duration)],
    backends: &[Arc<dyn LockBackend>],
) -> Result<Duration, CliError> {
    let (longest, lease) = firsts
        .iter()
        .zip(backends)
        .map(|((_, lease), backend)| (longest_guard_grace(*lease, &backend.margins()), *lease))
        .min()
        .expect("at least one lock");
    Ok(grace_up_to(asked, longest, lease, "the guard's deadline")?)
}

/// Starts reading every lock, a poll after its first read, and the watch over them.
fn start_watching(
    locks: &[Guarded],
    backends: Vec<Arc<dyn LockBackend>>,
    urls: Vec<String>,
    firsts: Vec<(Read, Duration)>,
    grace: Duration,
) -> (Watch, Readers) {
    let (mut readers, reads) = Readers::new(locks.len());
    let mut watched = Vec::with_capacity(locks.len());
    for (i, (((lock, backend), url), (first, lease))) in
        locks.iter().zip(backends).zip(urls).zip(firsts).enumerate()
    {
        let poll = poll_interval(lease);
        let mut clock = GuardDeadline::new(backend.margins());
        clock.read(&first);
        readers.start(i, backend, lock.nonce.clone(), poll, first.sent + poll);
        tracing::info!(%url, fence = %lock.fence, ?grace, ?poll, pid = std::process::id(), "waiting for a renewal");
        watched.push(Watched {
            url,
            clock,
            give_up: first.sent + lease,
            lease,
        });
    }
    let watch = Watch {
        grace,
        locks: watched,
        reads,
    };
    (watch, readers)
}

/// The stored lease of the acquisition the first read shows, if it is ours with the
/// fence we were given; else why the command must not start.
fn ours_at_start(first: &Read, url: &str, fence: FenceToken) -> Result<Duration, CliError> {
    match &first.seen {
        Seen::NoAnswer(cause) => Err(CliError::Unreadable {
            cause: cause.clone(),
        }),
        Seen::NotOurs(why) => Err(not_held(url, why)),
        Seen::Ours { fence: found, .. } if *found != fence => Err(CliError::Usage(format!(
            "--fence {fence}: the acquisition with this nonce has fence {found}"
        ))),
        Seen::Ours { lease, .. } => Ok(*lease),
    }
}

/// How the wait for the first renewal ended without an error.
enum Started {
    /// A renewal was seen: the command may start, to be stopped by this deadline.
    Deadline(Instant),
    /// The guard was told to stop first: its exit code.
    Signalled(u8),
}

impl Watch {
    /// COMMAND starts only once a renewal is seen on every lock: before that no deadline
    /// is known. A lock whose holder does not renew it by its `give_up` has been given
    /// up.
    async fn first_renewal(&mut self, signals: &mut Signals) -> Result<Started, CliError> {
        let deadline = loop {
            let now = Instant::now();
            let confirmed = |lock: &Watched| {
                lock.clock
                    .deadline()
                    .is_some_and(|d| StopTimes::before(d, self.grace).term > now)
            };
            if let Some((deadline, _)) = self.deadline()
                && self.locks.iter().all(confirmed)
            {
                break deadline;
            }
            let (waiting, give_up) = self
                .locks
                .iter()
                .enumerate()
                .filter(|(_, lock)| !confirmed(lock))
                .map(|(i, lock)| (i, lock.give_up))
                .min_by_key(|(_, at)| *at)
                .expect("a lock not yet confirmed");
            tokio::select! {
                // The readers only end with the guard: a dead one confirms nothing.
                Some((i, read)) = self.reads.recv() => {
                    if let Step::Lost { why, .. } = self.locks[i].clock.read(&read) {
                        return Err(not_held(&self.locks[i].url, &why));
                    }
                }
                _ = sleep_until(give_up) => {
                    let lock = &self.locks[waiting];
                    return Err(CliError::Unconfirmed {
                        url: lock.url.clone(),
                        reason: format!(
                            "no renewal seen within the stored lease ({})",
                            humantime::format_duration(lock.lease)
                        ),
                        action: "the command was not started".into(),
                    });
                }
                code = signals.told_to_stop() => return Ok(Started::Signalled(code)),
            }
        };
        tracing::info!(
            url = %self.urls(),
            until_monotonic = sys::monotonic_seconds(deadline),
            "renewal seen; starting the command"
        );
        Ok(Started::Deadline(deadline))
    }
}

fn not_held(url: &str, why: &str) -> CliError {
    CliError::NotHeld {
        url: url.to_string(),
        detail: why.to_string(),
    }
}

//! `lockwarden guard -- COMMAND…`: the node-side stop (docs/design.md §3 rule 9).
//!
//! A gated workload's lock is held by someone else (the controller); if that holder is
//! stopped or cut off, or the kubelet is cut off from the API server, nobody tells the
//! workload to stop. The guard runs as the container's entrypoint, runs COMMAND as its
//! child, reads the lock's record in the store on its own, and stops COMMAND's whole
//! process tree by a deadline it derives from what it read — whenever it cannot confirm
//! that the record still carries the acquisition's nonce.
//!
//! The pure part is [`GuardDeadline`] (what the reads prove); the rest is the process
//! side shared with `run` ([`super::stop`]) and the PID 1 duties of an entrypoint.

use std::ffi::OsString;
use std::time::Duration;

use clap::Args;
use tokio::process::Child;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};

use super::output::display_command;
use super::stop::{
    KILL_MARGIN, StopTimes, exit_code, grace_up_to, longest_grace, stop_tree, terminate,
};
use super::{BackendArgs, CliError, parse_fence, print_warning, sys, tree};
use lockwarden_core::{FenceToken, LockBackend, LockState, SafetyMargins, Stored};
use lockwarden_stores::Target;

/// What one read of the record showed about the acquisition the guard watches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Held with our nonce: the revision of our own entry (the record's, on a key with
    /// one permit), its stored lease (what contenders observe it for) and its fence.
    Ours {
        revision: String,
        lease: Duration,
        fence: FenceToken,
    },
    /// Not ours: another nonce, a released tombstone, no record, a foreign record.
    NotOurs(String),
    /// No answer (an error, a timeout): nothing learnt, nothing moves.
    NoAnswer(String),
}

impl Seen {
    /// Our acquisition (by `nonce`) in what a read returned. On a key with several
    /// permits only our own entry's revision proves a renewal: the other holders'
    /// writes change the record, not our entry.
    pub fn of(stored: Option<&Stored>, nonce: &str) -> Seen {
        let Some(stored) = stored else {
            return Seen::NotOurs("no record".into());
        };
        let record = match &stored.record {
            Ok(record) => record,
            Err(foreign) => return Seen::NotOurs(format!("a foreign record ({foreign})")),
        };
        if let Some(set) = &record.set {
            return match set.entry(nonce) {
                Some(entry) => Seen::Ours {
                    revision: entry.revision.clone(),
                    lease: Duration::from_millis(entry.lease_ms),
                    fence: entry.fence,
                },
                None => Seen::NotOurs("no permit of the key carries this nonce".into()),
            };
        }
        match (record.nonce == nonce, record.state) {
            (true, LockState::Held) => Seen::Ours {
                revision: record.revision.clone(),
                lease: record.lease,
                fence: record.fence,
            },
            (true, LockState::Released) => Seen::NotOurs("released".into()),
            (false, LockState::Held) => Seen::NotOurs(format!(
                "held by {} (fence {})",
                record.holder, record.fence
            )),
            (false, LockState::Released) => Seen::NotOurs(format!(
                "released, last by {} (fence {})",
                record.holder, record.fence
            )),
        }
    }
}

/// One read of the record: sent and answered on the guard's monotonic clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Read {
    pub sent: Instant,
    pub replied: Instant,
    pub seen: Seen,
}

/// What a read changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing new: the same revision, no answer, or the first revision seen.
    Unchanged,
    /// A renewal observed: the deadline moved to this instant.
    Renewed { deadline: Instant },
    /// The store says the lock is not ours, as of `at` (the reply).
    Lost { at: Instant, why: String },
}

/// Rule 9: the guard's deadline, from its own reads alone.
///
/// Seeing revision R says nothing about when R was written; what a linearizable read
/// does prove is that a revision R' first seen after R was written after the last read
/// that still showed R was served, so after that read was *sent*. A contender observes
/// R' for its stored lease plus the grace from no earlier than that write (rule 1), so
/// the work must stop by `t_send(last read showing R) + lease(R') × (1 − δ) − margin`.
/// Before the first renewal is seen, no deadline is known.
#[derive(Debug)]
pub struct GuardDeadline {
    margins: SafetyMargins,
    /// The revision last seen and the send time of the latest read showing it.
    latest: Option<(String, Instant)>,
    deadline: Option<Instant>,
}

impl GuardDeadline {
    pub fn new(margins: SafetyMargins) -> Self {
        GuardDeadline {
            margins,
            latest: None,
            deadline: None,
        }
    }

    /// The instant by which the work must have stopped, once a renewal was seen.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Takes one answered (or unanswered) read into account. Reads come in the order
    /// they were sent; each is answered (or given up) before the next is sent.
    pub fn read(&mut self, read: &Read) -> Step {
        let (revision, lease) = match &read.seen {
            Seen::NoAnswer(_) => return Step::Unchanged,
            Seen::NotOurs(why) => {
                return Step::Lost {
                    at: read.replied,
                    why: why.clone(),
                };
            }
            Seen::Ours {
                revision, lease, ..
            } => (revision, *lease),
        };
        match self.latest.take() {
            Some((seen, _)) if seen == *revision => {
                self.latest = Some((seen, read.sent));
                Step::Unchanged
            }
            Some((_, previous_sent)) => {
                // Written after `previous_sent`, observed by contenders for its own lease.
                let deadline = previous_sent + self.margins.holder_validity(lease);
                let deadline = self.deadline.map_or(deadline, |d| d.max(deadline));
                self.deadline = Some(deadline);
                self.latest = Some((revision.clone(), read.sent));
                Step::Renewed { deadline }
            }
            None => {
                self.latest = Some((revision.clone(), read.sent));
                Step::Unchanged
            }
        }
    }
}

/// How often the guard reads the record: a twentieth of the stored lease (at least
/// 100 ms), so that two polls are a small part of what the grace may use (rule 9).
pub fn poll_interval(lease: Duration) -> Duration {
    (lease / 20).max(Duration::from_millis(100))
}

/// The longest `--grace` for a stored lease: `run`'s bound (renewals on schedule must
/// not trigger SIGTERM), less two polls, since the guard's deadline runs from the send
/// of the read *before* the one that showed a renewal, and it sees the next renewal
/// only at its next read.
pub fn longest_guard_grace(lease: Duration, margins: &SafetyMargins) -> Duration {
    longest_grace(lease, margins).saturating_sub(2 * poll_interval(lease))
}

#[derive(Args, Debug)]
#[command(after_help = "\
The guard runs as a container's entrypoint (PID 1, exec form) in front of the workload's \
command. It reads the lock's record on its own (a linearizable read every twentieth of the \
stored lease) and starts COMMAND once it has seen one renewal carrying NONCE; from then on \
its deadline is the send time of the last read that showed the previous revision plus the \
stored lease × (1 − δ) − margin. If no renewal moves it in time, COMMAND gets SIGTERM at \
deadline − 500ms − grace and every process of the container SIGKILL at deadline − 500ms; a \
record that is not ours any more stops COMMAND at once. COMMAND gets LOCKWARDEN_FENCE, \
LOCKWARDEN_URL and LOCKWARDEN_NONCE. A workload on several locks passes --urls, --nonces and \
--fences (LOCKWARDEN_URLS, LOCKWARDEN_NONCES, LOCKWARDEN_FENCES: the Pod's lockwarden.io/urls, \
nonces and fences annotations): every lock is read, COMMAND starts once each has shown a \
renewal and stops by the earliest of their deadlines, and gets the three variables as given. \
SIGTERM, SIGINT and SIGHUP are passed on to COMMAND, \
orphans are reaped, and the guard exits with COMMAND's status (128+N for signal N); 4 if the \
lock is not held with NONCE (COMMAND stopped, or never started), 6 if the lock could not be \
confirmed by the deadline. S3, DynamoDB and Kubernetes Leases; not ZooKeeper (a queue entry \
lives until its session expires and then goes at once: no read tells how long it stays).

  lockwarden guard --url s3://locks/nightly --nonce \"$NONCE\" --fence \"$FENCE\" -- ./job.sh")]
pub struct GuardArgs {
    // The six below are plain strings checked by `GuardArgs::locks`: the downward API
    // gives a Pod every variable it names, as "" when the annotation is absent (a
    // workload has either the single-lock or the several-lock annotations), and clap
    // would take an empty variable as a value given.
    /// The lock: s3://BUCKET/KEY, dynamodb://TABLE/KEY or k8s://NAMESPACE/LEASE-NAME
    /// (the Pod's lockwarden.io/url annotation)
    #[arg(long, env = "LOCKWARDEN_URL", value_name = "URL")]
    pub url: Option<String>,

    /// The acquisition to guard (the Pod's lockwarden.io/nonce annotation)
    #[arg(long, env = "LOCKWARDEN_NONCE", value_name = "NONCE")]
    pub nonce: Option<String>,

    /// Its fence (the Pod's lockwarden.io/fence annotation), passed on to COMMAND
    #[arg(long, env = "LOCKWARDEN_FENCE", value_name = "N")]
    pub fence: Option<String>,

    /// Several locks, all guarded: NAME=URL per lock, space-separated (the Pod's
    /// lockwarden.io/urls annotation); with --nonces and --fences
    #[arg(long, env = "LOCKWARDEN_URLS", value_name = "NAME=URL …")]
    pub urls: Option<String>,

    /// NAME=NONCE per lock, comma-separated (lockwarden.io/nonces)
    #[arg(long, env = "LOCKWARDEN_NONCES", value_name = "NAME=NONCE,…")]
    pub nonces: Option<String>,

    /// NAME=N per lock, comma-separated (lockwarden.io/fences), passed on to COMMAND
    #[arg(long, env = "LOCKWARDEN_FENCES", value_name = "NAME=N,…")]
    pub fences: Option<String>,

    /// How long COMMAND has between SIGTERM and SIGKILL; both come before the guard's
    /// deadline, so at most what the stored lease leaves (refused above it) [default:
    /// 10s, or that maximum if less]
    #[arg(long, value_name = "DURATION", value_parser = super::parse_duration)]
    pub grace: Option<Duration>,

    /// The command to guard (after `--`)
    #[arg(value_name = "COMMAND", required = true, num_args = 1.., trailing_var_arg = true)]
    pub command: Vec<OsString>,

    #[command(flatten)]
    pub backend: BackendArgs,
}

/// One lock the guard watches: its name among several (`None` for the only one), where
/// it is stored, the acquisition and its fence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Guarded {
    pub name: Option<String>,
    pub url: Target,
    pub nonce: String,
    pub fence: FenceToken,
}

impl GuardArgs {
    /// The locks to guard: the one of --url/--nonce/--fence, or every one of
    /// --urls/--nonces/--fences; an empty value counts as not given.
    pub fn locks(&self) -> Result<Vec<Guarded>, String> {
        fn given(value: &Option<String>) -> Option<&str> {
            value.as_deref().filter(|v| !v.trim().is_empty())
        }
        let one = [
            ("--url", "url", given(&self.url)),
            ("--nonce", "nonce", given(&self.nonce)),
            ("--fence", "fence", given(&self.fence)),
        ];
        let several_ = [
            ("--urls", "urls", given(&self.urls)),
            ("--nonces", "nonces", given(&self.nonces)),
            ("--fences", "fences", given(&self.fences)),
        ];
        let any = |set: &[(&str, &str, Option<&str>)]| set.iter().any(|(_, _, v)| v.is_some());
        let complete = |set: &[(&str, &str, Option<&str>)]| -> Result<(), String> {
            match set.iter().find(|(_, _, v)| v.is_none()) {
                None => Ok(()),
                Some((flag, annotation, _)) => Err(format!(
                    "{flag} ({}) is missing or empty: is the Pod's lockwarden.io/{annotation} \
                     annotation set?",
                    env_name(flag)
                )),
            }
        };
        match (any(&one), any(&several_)) {
            (true, true) => Err(
                "both --url/--nonce/--fence and --urls/--nonces/--fences are given: a \
                 workload carries the one set for one lock or the other for several"
                    .into(),
            ),
            (false, false) => Err(
                "no lock to guard: give --url, --nonce and --fence (LOCKWARDEN_URL, \
                 LOCKWARDEN_NONCE, LOCKWARDEN_FENCE: the Pod's lockwarden.io/url, nonce and \
                 fence annotations), or --urls, --nonces and --fences for several locks"
                    .into(),
            ),
            (true, false) => {
                complete(&one)?;
                let [(_, _, Some(url)), (_, _, Some(nonce)), (_, _, Some(fence))] = one else {
                    unreachable!("checked complete")
                };
                Ok(vec![Guarded {
                    name: None,
                    url: Target::parse(url).map_err(|e| format!("--url: {e}"))?,
                    nonce: super::parse_nonce(nonce).map_err(|e| format!("--nonce: {e}"))?,
                    fence: parse_fence(fence).map_err(|e| format!("--fence: {e}"))?,
                }])
            }
            (false, true) => {
                complete(&several_)?;
                let [
                    (_, _, Some(urls)),
                    (_, _, Some(nonces)),
                    (_, _, Some(fences)),
                ] = several_
                else {
                    unreachable!("checked complete")
                };
                several(urls, nonces, fences)
            }
        }
    }
}

/// The environment variable of a guard flag (`--nonces` → `LOCKWARDEN_NONCES`).
fn env_name(flag: &str) -> String {
    format!("LOCKWARDEN_{}", flag.trim_start_matches('-').to_uppercase())
}

/// `NAME=VALUE` pairs split by `separator`, for the flag `flag`.
fn named_values<'a>(
    text: &'a str,
    separator: char,
    flag: &str,
) -> Result<Vec<(&'a str, &'a str)>, String> {
    let pairs: Vec<&str> = text
        .split(separator)
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    if pairs.is_empty() {
        return Err(format!(
            "{flag} ({}) is missing or empty: is the Pod's lockwarden.io/{} annotation set?",
            env_name(flag),
            flag.trim_start_matches('-')
        ));
    }
    pairs
        .into_iter()
        .map(|pair| match pair.split_once('=') {
            Some((name, value)) if !name.is_empty() && !value.is_empty() => Ok((name, value)),
            _ => Err(format!("{flag}: {pair:?} is not NAME=VALUE")),
        })
        .collect()
}

/// The locks of the plural annotations (README "Jobs"): `NAME=URL` space-separated,
/// `NAME=NONCE` and `NAME=FENCE` comma-separated, in the order of the fences; every
/// lock named once in each.
pub fn several(urls: &str, nonces: &str, fences: &str) -> Result<Vec<Guarded>, String> {
    let urls = named_values(urls, ' ', "--urls")?;
    let nonces = named_values(nonces, ',', "--nonces")?;
    let fences = named_values(fences, ',', "--fences")?;
    let find = |pairs: &[(&str, &str)], name: &str, flag: &str| -> Result<String, String> {
        match pairs.iter().filter(|(n, _)| *n == name).count() {
            1 => Ok(pairs
                .iter()
                .find(|(n, _)| *n == name)
                .unwrap()
                .1
                .to_string()),
            0 => Err(format!("{flag} names no lock {name:?} (--fences does)")),
            _ => Err(format!("{flag} names lock {name:?} more than once")),
        }
    };
    if urls.len() != fences.len() || nonces.len() != fences.len() {
        return Err(format!(
            "--urls, --nonces and --fences name {}, {} and {} locks: each must name every lock once",
            urls.len(),
            nonces.len(),
            fences.len()
        ));
    }
    fences
        .iter()
        .map(|(name, fence)| {
            let url = find(&urls, name, "--urls")?;
            let nonce = find(&nonces, name, "--nonces")?;
            Ok(Guarded {
                name: Some(name.to_string()),
                url: Target::parse(&url).map_err(|e| format!("--urls: {name}: {e}"))?,
                nonce: super::parse_nonce(&nonce).map_err(|e| format!("--nonces: {name}: {e}"))?,
                fence: parse_fence(fence).map_err(|e| format!("--fences: {name}: {e}"))?,
            })
        })
        .collect::<Result<Vec<_>, String>>()
        .and_then(|locks| {
            match locks
                .iter()
                .enumerate()
                .find(|(i, l)| locks[..*i].iter().any(|o| o.name == l.name))
            {
                Some((_, dup)) => Err(format!(
                    "--fences names lock {:?} more than once",
                    dup.name.as_deref().unwrap_or_default()
                )),
                None => Ok(locks),
            }
        })
}

/// Why the guard stopped COMMAND (the index of the lock that stopped it), and when it
/// had to.
enum Stop {
    Lost(usize, String),
    Unconfirmed(usize, String),
}

pub async fn run(args: GuardArgs) -> Result<u8, CliError> {
    let locks = args.locks().map_err(CliError::Usage)?;
    if let Some(bound) = locks.iter().find(|l| l.url.is_session_bound()) {
        return Err(CliError::Usage(format!(
            "{}: the guard cannot watch this lock: its queue entry lives until the holder's \
             session expires and is then deleted at once, so no read tells how long it stays \
             held (S3, DynamoDB and Kubernetes Leases can be guarded)",
            bound.url
        )));
    }
    let options = args.backend.options(None);
    // The guard runs inside the workload's image, which need not have what
    // lockwarden's own image has.
    if let Some(tls) = locks.iter().find(|l| l.url.needs_system_roots(&options))
        && let Some(why) = lockwarden_stores::aws::missing_root_certificates()
    {
        return Err(CliError::Unreadable {
            cause: format!("{}: {why}", tls.url),
        });
    }
    let mut backends = Vec::with_capacity(locks.len());
    for lock in &locks {
        backends.push(lock.url.connect(&options).await?);
    }
    let urls: Vec<String> = backends.iter().map(|b| b.url().to_string()).collect();
    let mut signals = Signals::take(&urls.join(" "))?;

    // The first reads: every lock must be ours, now.
    let mut firsts = Vec::with_capacity(locks.len());
    for ((lock, backend), url) in locks.iter().zip(&backends).zip(&urls) {
        let first = read_once(
            backend.as_ref(),
            &lock.nonce,
            lockwarden_core::CONNECT_TIMEOUT,
        )
        .await;
        let lease = ours_at_start(&first, url, lock.fence)?;
        firsts.push((first, lease));
    }
    // One grace for COMMAND: what the lock leaving the least allows.
    let (longest, lease) = firsts
        .iter()
        .zip(&backends)
        .map(|((_, lease), backend)| (longest_guard_grace(*lease, &backend.margins()), *lease))
        .min()
        .expect("at least one lock");
    let grace =
        grace_up_to(args.grace, longest, lease, "the guard's deadline").map_err(CliError::Usage)?;
    let (tx, reads) = mpsc::channel(4 * locks.len());
    let mut readers = Vec::with_capacity(locks.len());
    let mut watched = Vec::with_capacity(locks.len());
    for (i, (((lock, backend), url), (first, lease))) in
        locks.iter().zip(backends).zip(urls).zip(firsts).enumerate()
    {
        let poll = poll_interval(lease);
        let mut clock = GuardDeadline::new(backend.margins());
        clock.read(&first);
        readers.push(AbortOnDrop(tokio::spawn(read_every(
            i,
            backend,
            lock.nonce.clone(),
            poll,
            first.sent + poll,
            tx.clone(),
        ))));
        tracing::info!(%url, fence = %lock.fence, ?grace, ?poll, pid = std::process::id(), "waiting for a renewal");
        watched.push(Watched {
            url,
            clock,
            give_up: first.sent + lease,
            lease,
        });
    }
    let mut watch = Watch {
        grace,
        locks: watched,
        reads,
    };
    let deadline = match watch.first_renewal(&mut signals).await? {
        Started::Deadline(deadline) => deadline,
        Started::Signalled(code) => return Ok(code),
    };
    watch.command(&args, &locks, signals, deadline).await
}

/// The signals the guard handles itself, taken before anything else runs; orphans are
/// adopted too (PID 1 adopts them anyway; elsewhere the subreaper keeps them in the
/// tree).
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    chld: tokio::signal::unix::Signal,
}

impl Signals {
    fn take(url: &str) -> Result<Signals, CliError> {
        let taken = (|| -> std::io::Result<_> {
            let signals = Signals {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
                hup: signal(SignalKind::hangup())?,
                chld: signal(SignalKind::child())?,
            };
            tree::become_subreaper()?;
            Ok(signals)
        })();
        taken.map_err(|source| CliError::Io {
            context: format!("{url}: cannot handle signals or adopt orphans"),
            source,
        })
    }
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

/// One lock as the guard sees it.
struct Watched {
    url: String,
    clock: GuardDeadline,
    /// While the guard waits to start COMMAND: a holder that has not renewed this lock
    /// by then (its stored lease after the first read) has itself given up.
    give_up: Instant,
    lease: Duration,
}

/// The guard's view of its locks while it waits and while COMMAND runs.
struct Watch {
    grace: Duration,
    locks: Vec<Watched>,
    /// Every lock's reads, tagged with its index in `locks`.
    reads: mpsc::Receiver<(usize, Read)>,
}

impl Watch {
    /// The earliest of the locks' deadlines and the lock it is of, once every lock has
    /// one: the work must stop by the first of them.
    fn deadline(&self) -> Option<(Instant, usize)> {
        let mut earliest: Option<(Instant, usize)> = None;
        for (i, lock) in self.locks.iter().enumerate() {
            let deadline = lock.clock.deadline()?;
            if earliest.is_none_or(|(e, _)| deadline < e) {
                earliest = Some((deadline, i));
            }
        }
        earliest
    }

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
                _ = signals.term.recv() => return Ok(Started::Signalled(128 + sys::SIGTERM as u8)),
                _ = signals.int.recv() => return Ok(Started::Signalled(128 + libc::SIGINT as u8)),
            }
        };
        tracing::info!(
            url = %self.urls(),
            until_monotonic = sys::monotonic_seconds(deadline),
            "renewal seen; starting the command"
        );
        Ok(Started::Deadline(deadline))
    }

    fn urls(&self) -> String {
        let urls: Vec<&str> = self.locks.iter().map(|l| l.url.as_str()).collect();
        urls.join(" ")
    }

    /// Runs COMMAND as the guard's child until it ends on its own or a lock cannot be
    /// confirmed by the deadline (which every observed renewal moves), then stops it.
    async fn command(
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
        let me = std::process::id();
        let forward = |sig: i32| {
            if let Some(pid) = pid {
                let _ = sys::signal(pid, sig);
            }
        };

        let outcome = loop {
            // Every observed renewal moves the deadline, and the stop with it.
            let stop = StopTimes::before(deadline, grace);
            tokio::select! {
                status = child.wait() => break Ok(status),
                // The readers only end with the guard: a dead one confirms nothing.
                Some((i, read)) = self.reads.recv() => {
                    match self.locks[i].clock.read(&read) {
                        Step::Renewed { .. } => {
                            // Every lock has a deadline since COMMAND started; the work
                            // stops by the earliest.
                            if let Some((moved, _)) = self.deadline() {
                                tracing::debug!(deadline_monotonic = sys::monotonic_seconds(moved), "renewal seen");
                                deadline = moved;
                            }
                        }
                        Step::Lost { at, why } => {
                            break Err((Stop::Lost(i, why), StopTimes::now(at.max(Instant::now()), deadline, grace)));
                        }
                        Step::Unchanged => {
                            if let Seen::NoAnswer(cause) = &read.seen {
                                tracing::warn!(url = %self.locks[i].url, %cause, "the lock could not be read");
                            }
                        }
                    }
                }
                _ = sleep_until(stop.term) => {
                    let reason = format!(
                        "no renewal seen {} before the deadline",
                        humantime::format_duration(grace + KILL_MARGIN)
                    );
                    let (_, i) = self.deadline().unwrap_or((deadline, 0));
                    break Err((Stop::Unconfirmed(i, reason), stop));
                }
                _ = signals.term.recv() => forward(sys::SIGTERM),
                _ = signals.int.recv() => forward(libc::SIGINT),
                _ = signals.hup.recv() => forward(sys::SIGHUP),
                // PID 1's duty: orphans that ended are reaped (COMMAND is tokio's to reap).
                _ = signals.chld.recv() => { tree::reap_adopted(me, pid); }
            }
        };

        match outcome {
            Ok(waited) => {
                let status = waited.map_err(|source| CliError::Io {
                    context: format!("{url}: waiting for {shown:?}"),
                    source,
                })?;
                stop_leftovers(me, &shown, deadline, grace).await;
                Ok(exit_code(status))
            }
            Err((stop, times)) => {
                let action = terminate(&mut child, &shown, deadline, times).await;
                Err(match stop {
                    Stop::Lost(i, reason) => CliError::Lost {
                        url: self.locks[i].url.clone(),
                        reason,
                        action,
                    },
                    Stop::Unconfirmed(i, reason) => CliError::Unconfirmed {
                        url: self.locks[i].url.clone(),
                        reason,
                        action,
                    },
                })
            }
        }
    }
}

/// COMMAND ended on its own: what it left running is still work under the lock, so it
/// stops by the deadline too, as under `run` (rule 7).
async fn stop_leftovers(me: u32, shown: &str, deadline: Instant, grace: Duration) {
    let leftovers = tree::live_descendants(me);
    if leftovers.is_empty() {
        return;
    }
    let times = StopTimes::now(Instant::now(), deadline, grace);
    let stopped = stop_tree(None, times).await;
    print_warning(&format!(
        "{shown:?} exited and left {} process(es) running: sent SIGTERM to {}{}",
        leftovers.len(),
        stopped.termed,
        stopped.killing(times)
    ));
}

fn not_held(url: &str, why: &str) -> CliError {
    CliError::NotHeld {
        url: url.to_string(),
        detail: why.to_string(),
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One read, given up after `timeout` (a hung read must not hold the next one back).
async fn read_once(backend: &dyn LockBackend, nonce: &str, timeout: Duration) -> Read {
    let sent = Instant::now();
    let seen = match tokio::time::timeout(timeout, backend.inspect()).await {
        Ok(Ok(stored)) => Seen::of(stored.as_ref(), nonce),
        Ok(Err(e)) => Seen::NoAnswer(e.to_string()),
        Err(_) => Seen::NoAnswer(format!(
            "no answer within {}",
            humantime::format_duration(timeout)
        )),
    };
    Read {
        sent,
        replied: Instant::now(),
        seen,
    }
}

/// A read of lock `index` every `poll` from `start`, each given up after `poll`, so one
/// read at most is in flight and a hung one costs one poll.
async fn read_every(
    index: usize,
    backend: std::sync::Arc<dyn LockBackend>,
    nonce: String,
    poll: Duration,
    start: Instant,
    reads: mpsc::Sender<(usize, Read)>,
) {
    let mut next = start;
    loop {
        sleep_until(next).await;
        next = Instant::now() + poll;
        let read = read_once(backend.as_ref(), &nonce, poll).await;
        if reads.send((index, read)).await.is_err() {
            return;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn ours(revision: &str, lease_ms: u64) -> Seen {
        Seen::Ours {
            revision: revision.into(),
            lease: ms(lease_ms),
            fence: FenceToken(7),
        }
    }

    /// A read sent at `t0 + sent` ms, answered 20 ms later.
    fn read(t0: Instant, sent: u64, seen: Seen) -> Read {
        Read {
            sent: t0 + ms(sent),
            replied: t0 + ms(sent + 20),
            seen,
        }
    }

    #[test]
    fn rule9_no_deadline_before_one_renewal_is_seen() {
        let t0 = Instant::now();
        let mut clock = GuardDeadline::new(SafetyMargins::default());
        for at in [0, 150, 300, 450] {
            assert_eq!(clock.read(&read(t0, at, ours("r0", 3000))), Step::Unchanged);
        }
        assert_eq!(
            clock.deadline(),
            None,
            "the same revision proves no renewal"
        );
        assert_eq!(
            clock.read(&read(t0, 600, Seen::NoAnswer("timeout".into()))),
            Step::Unchanged
        );
        assert_eq!(clock.deadline(), None);
    }

    #[test]
    fn rule9_the_deadline_runs_from_the_send_of_the_last_read_showing_the_previous_revision() {
        let margins = SafetyMargins::default();
        let t0 = Instant::now();
        let mut clock = GuardDeadline::new(margins);
        clock.read(&read(t0, 0, ours("r0", 3000)));
        clock.read(&read(t0, 150, ours("r0", 3000)));
        // An unanswered read in between proves nothing either way.
        clock.read(&read(t0, 300, Seen::NoAnswer("timeout".into())));
        let expected = t0 + ms(150) + margins.holder_validity(ms(3000));
        assert_eq!(
            clock.read(&read(t0, 450, ours("r1", 3000))),
            Step::Renewed { deadline: expected }
        );
        // Seeing r1 again does not move it: when r1 was written is not known better.
        assert_eq!(
            clock.read(&read(t0, 600, ours("r1", 3000))),
            Step::Unchanged
        );
        assert_eq!(clock.deadline(), Some(expected));
        // The next renewal moves it from the last read that still showed r1, with the
        // lease stored in the new revision.
        let moved = t0 + ms(600) + margins.holder_validity(ms(6000));
        assert_eq!(
            clock.read(&read(t0, 750, ours("r2", 6000))),
            Step::Renewed { deadline: moved }
        );
        // A revision stored with a shorter lease never pulls the deadline back.
        assert_eq!(
            clock.read(&read(t0, 900, ours("r3", 100))),
            Step::Renewed { deadline: moved }
        );
    }

    #[test]
    fn rule9_a_record_that_is_not_ours_is_a_loss_as_of_the_reply() {
        let t0 = Instant::now();
        let mut clock = GuardDeadline::new(SafetyMargins::default());
        clock.read(&read(t0, 0, ours("r0", 3000)));
        let step = clock.read(&read(t0, 150, Seen::NotOurs("released".into())));
        assert_eq!(
            step,
            Step::Lost {
                at: t0 + ms(170),
                why: "released".into()
            }
        );
    }

    /// The safety argument with drift: the holder's write of r1 lands after the guard's
    /// last read showing r0 was sent; a contender whose clock runs δ faster starts
    /// observing r1 no earlier than the write and takes over after `lease + grace` of
    /// its own time, which is `(lease + grace) / (1 + δ)` of the guard's. The deadline
    /// comes first, and SIGKILL a kill margin before it.
    #[test]
    fn rule9_the_deadline_precedes_the_earliest_takeover_of_a_contender_whose_clock_runs_fast() {
        let margins = SafetyMargins::default();
        for lease in [ms(1000), ms(3000), ms(30_000), ms(3_600_000)] {
            let t0 = Instant::now();
            let mut clock = GuardDeadline::new(margins);
            let poll = poll_interval(lease);
            clock.read(&read(t0, 0, ours("r0", lease.as_millis() as u64)));
            let last_r0 = t0 + poll;
            clock.read(&Read {
                sent: last_r0,
                replied: last_r0 + ms(20),
                seen: ours("r0", lease.as_millis() as u64),
            });
            // The write of r1 lands the instant after the read showing r0 was served:
            // the earliest it can be, so the worst case for the guard.
            let written = last_r0 + ms(1);
            let Step::Renewed { deadline } = clock.read(&Read {
                sent: last_r0 + poll,
                replied: last_r0 + poll + ms(20),
                seen: ours("r1", lease.as_millis() as u64),
            }) else {
                panic!("a new revision is a renewal");
            };
            let fast = 1.0 + margins.drift;
            let takeover = written + margins.takeover_after(lease).div_f64(fast);
            assert!(
                deadline < takeover,
                "{lease:?}: deadline {deadline:?} not before takeover {takeover:?}"
            );
            let stop = StopTimes::before(deadline, longest_guard_grace(lease, &margins));
            assert!(stop.term <= stop.kill && stop.kill < deadline);
        }
    }

    #[test]
    fn rule9_the_longest_grace_leaves_a_renewal_on_schedule_and_two_polls_before_sigterm() {
        use lockwarden_core::RenewPolicy;
        let margins = SafetyMargins::default();
        for (lease, longest) in [(30_000, 8_150), (4_000, 436), (3_000, 140), (1_500, 0)] {
            let lease = ms(lease);
            assert_eq!(
                longest_guard_grace(lease, &margins),
                ms(longest),
                "{lease:?}"
            );
            // The holder's renewal r1 is written just after the guard's read s showing
            // r0; the next renewal goes one interval after r1's reply and takes its
            // whole request timeout; the guard reads every poll. It sees that renewal
            // by its second read after the write, before SIGTERM.
            let s = Instant::now();
            let policy = RenewPolicy::for_lease(lease);
            let poll = poll_interval(lease);
            let next_written = s + poll + policy.interval + policy.request_timeout;
            let seen = next_written + poll;
            let deadline = s + margins.holder_validity(lease);
            let stop = StopTimes::before(deadline, longest_guard_grace(lease, &margins));
            if longest > 0 {
                assert!(seen <= stop.term, "{lease:?}: {seen:?} > {:?}", stop.term);
            }
        }
    }

    #[test]
    fn rule9_only_our_own_entry_proves_a_renewal_on_a_key_with_permits() {
        use lockwarden_core::{HolderSet, LockRecord, Mode, SetEntry, Version};
        let entry = |nonce: &str, revision: &str| SetEntry {
            holder: "h".into(),
            nonce: nonce.into(),
            revision: revision.into(),
            fence: FenceToken(3),
            lease_ms: 4000,
            mode: Mode::Shared,
            data: None,
            acquired_at_ms: 0,
            renewed_at_ms: 0,
            weight: 1,
            priority: 0,
            ticket: 0,
            overtaken: 0,
            unknown: Default::default(),
        };
        let stored = |other_revision: &str| {
            let mut record = LockRecord::new_acquisition("h", FenceToken(3), ms(4000), None);
            record.nonce = "another".into();
            record.revision = random_revision(other_revision);
            record.set = Some(HolderSet {
                permits: 2,
                last_fence: FenceToken(3),
                holders: vec![entry("another", other_revision), entry("mine", "e1")],
                waiting_writer: None,
                queue: None,
                unknown: Default::default(),
            });
            Stored {
                record: Ok(record),
                version: Version(other_revision.into()),
            }
        };
        // Another holder renews: the record changes, our entry does not.
        let a = Seen::of(Some(&stored("x1")), "mine");
        let b = Seen::of(Some(&stored("x2")), "mine");
        assert_eq!(a, b);
        assert_eq!(
            a,
            Seen::Ours {
                revision: "e1".into(),
                lease: ms(4000),
                fence: FenceToken(3)
            }
        );
        assert!(matches!(
            Seen::of(Some(&stored("x1")), "gone"),
            Seen::NotOurs(_)
        ));
        assert!(matches!(Seen::of(None, "mine"), Seen::NotOurs(_)));
    }

    #[test]
    fn several_locks_come_in_the_order_of_the_fences_each_named_once() {
        let locks = several(
            "db=s3://locks/db  bucket=k8s://ns/bucket",
            "bucket=n2,db=n1",
            "db=3,bucket=7",
        )
        .unwrap();
        let seen: Vec<(Option<&str>, String, &str, u64)> = locks
            .iter()
            .map(|l| {
                (
                    l.name.as_deref(),
                    l.url.to_string(),
                    l.nonce.as_str(),
                    l.fence.0,
                )
            })
            .collect();
        assert_eq!(
            seen,
            vec![
                (Some("db"), "s3://locks/db".to_string(), "n1", 3),
                (Some("bucket"), "k8s://ns/bucket".to_string(), "n2", 7),
            ]
        );
        for (urls, nonces, fences, says) in [
            (
                "db=s3://locks/db",
                "db=n1",
                "db=3,bucket=7",
                "name 1, 1 and 2 locks",
            ),
            (
                "db=s3://locks/db bucket=s3://locks/x",
                "db=n1,other=n2",
                "db=3,bucket=7",
                "--nonces names no lock \"bucket\"",
            ),
            (
                "db=s3://locks/db db=s3://locks/x",
                "db=n1,bucket=n2",
                "db=3,bucket=7",
                "--urls names lock \"db\" more than once",
            ),
            (
                "db=s3://locks/db bucket=s3://locks/x",
                "db=n1,bucket=n2",
                "db=3,bucket=x",
                "--fences: bucket: \"x\" is not a fence",
            ),
            (
                "db=s3://locks/db bucket",
                "db=n1,bucket=n2",
                "db=3,bucket=7",
                "--urls: \"bucket\" is not NAME=VALUE",
            ),
            (
                "",
                "",
                "",
                "--urls (LOCKWARDEN_URLS) is missing or empty: is the Pod's lockwarden.io/urls annotation set?",
            ),
            ("db=nope://x", "db=n1", "db=1", "--urls: db: "),
        ] {
            let error = several(urls, nonces, fences).unwrap_err();
            assert!(
                error.contains(says),
                "{urls:?} {nonces:?} {fences:?}: {error}"
            );
        }
    }

    /// With several locks COMMAND starts once every lock has shown a renewal, and its
    /// deadline is the earliest of theirs.
    #[test]
    fn rule9_several_locks_stop_the_command_by_the_earliest_deadline() {
        let margins = SafetyMargins::default();
        let t0 = Instant::now();
        let (_tx, reads) = mpsc::channel(1);
        let watched = |url: &str| Watched {
            url: url.into(),
            clock: GuardDeadline::new(margins),
            give_up: t0 + ms(3000),
            lease: ms(3000),
        };
        let mut watch = Watch {
            grace: ms(100),
            locks: vec![watched("s3://b/a"), watched("s3://b/b")],
            reads,
        };
        for lock in &mut watch.locks {
            lock.clock.read(&read(t0, 0, ours("r0", 3000)));
        }
        watch.locks[0].clock.read(&read(t0, 150, ours("r1", 3000)));
        assert_eq!(watch.deadline(), None, "lock b has shown no renewal yet");
        watch.locks[1].clock.read(&read(t0, 300, ours("r1", 3000)));
        // Both renewals were written after the reads sent at 0: the same deadline.
        let both = t0 + margins.holder_validity(ms(3000));
        assert_eq!(watch.deadline(), Some((both, 0)));
        // a renews again: its deadline moves on, b's is now the earlier one.
        watch.locks[0].clock.read(&read(t0, 450, ours("r1", 3000)));
        watch.locks[0].clock.read(&read(t0, 600, ours("r2", 3000)));
        assert_eq!(
            watch.locks[0].clock.deadline(),
            Some(t0 + ms(450) + margins.holder_validity(ms(3000)))
        );
        assert_eq!(watch.deadline(), Some((both, 1)));
    }

    fn random_revision(seed: &str) -> String {
        format!("record-{seed}")
    }
}

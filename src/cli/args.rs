//! Command-line arguments shared by several commands, and the value parsers: each
//! error names the value and the expected form.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::lockfile::LockFile;
use super::sys;
use lockwarden_api::distributed_lock::MAX_LOCK_DELAY;
use lockwarden_core::duration::{DurationError, parse_duration as parse_go_duration};
use lockwarden_core::{AcquireRequest, FenceToken, Mode, Permits, Queueing};
use lockwarden_stores::{SharedWith, Target, TargetError};

/// Options every command that talks to a backend accepts: each store's flags,
/// declared with the store ([`lockwarden_stores::StoreFlags`]).
pub use lockwarden_stores::StoreFlags as BackendArgs;

/// `--permits`, `--shared` and `--exclusive`: how many may hold the key at once and
/// how this holder takes it (docs/design.md §6.2).
#[derive(Args, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[command(next_help_heading = "More than one holder")]
pub struct PermitArgs {
    /// How many may hold the key at once. Above 1 the key is a counting semaphore and
    /// each holder takes one permit (shared, unless --exclusive); every holder of a key
    /// must give the same number [default: 1]
    #[arg(long, value_name = "N")]
    pub permits: Option<u32>,

    /// Take one permit, next to other shared holders (a reader); needs --permits 2 or
    /// more, where it is the default
    #[arg(long, conflicts_with = "exclusive")]
    pub shared: bool,

    /// Hold the key alone, once every other holder has left (a writer next to --shared
    /// readers); the default with one permit
    #[arg(long)]
    pub exclusive: bool,
}

/// Waiting in the key's queue (docs/design.md §6.4).
#[derive(Args, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[command(next_help_heading = "Queue")]
pub struct QueueArgs {
    /// Wait in the key's queue: granted in arrival order (a ticket the store hands
    /// out), after higher priorities, across every host and cluster. On S3, DynamoDB
    /// and Leases the queue lives in the key's record; on ZooKeeper a key is always a
    /// queue
    #[arg(long)]
    pub queue: bool,

    /// With --queue: go before waiters of a lower priority (never preempting a holder)
    /// [default: 0]
    #[arg(
        long,
        value_name = "N",
        requires = "queue",
        allow_negative_numbers = true
    )]
    pub priority: Option<i32>,

    /// With --queue: take K of the key's --permits at once (shared holders)
    /// [default: 1]
    #[arg(long, value_name = "K", requires = "queue")]
    pub weight: Option<u32>,
}

impl QueueArgs {
    /// What the queue flags ask for on `url` with `permits` and the store flags
    /// `store`: `None` without --queue; an error naming the flags when they do not fit.
    pub fn queueing(
        &self,
        url: &Target,
        permits: Permits,
        store: &BackendArgs,
    ) -> Result<Option<Queueing>, ValueError> {
        if !self.queue {
            return Ok(None);
        }
        if store.s3.s3lock_compatible {
            return Err(ValueError(
                "--queue with --s3lock-compatible: a key deleted on release has no record \
                 while nobody holds it, so nothing could keep the queue; drop one of them"
                    .into(),
            ));
        }
        let queueing = Queueing {
            priority: self.priority.unwrap_or(0),
            weight: self.weight.unwrap_or(1),
        };
        if !url.supports_priorities() {
            for (flag, given) in [
                ("--priority", self.priority.is_some()),
                ("--weight", self.weight.is_some()),
            ] {
                if given {
                    return Err(ValueError(format!(
                        "{flag}: not supported on {url}: its queue is the order of the entries, \
                         which every client of the key obeys (lowest first); a priority or \
                         weight would let two clients hold it at once"
                    )));
                }
            }
            // The entries' order is the queue already.
            return Ok(None);
        }
        queueing
            .validate(permits)
            .map_err(|message| ValueError(format!("--weight: {message}")))?;
        Ok(Some(queueing))
    }
}

/// `--terraform-compatible` against the lock and how it is taken: a Terraform/OpenTofu
/// state lock (docs/design.md §6.8) is one of theirs, deleted on release, so it has one
/// holder and keeps no queue.
pub fn check_state_lock(
    url: &Target,
    store: &BackendArgs,
    permits: Permits,
    queue: bool,
) -> Result<(), ValueError> {
    if !store.aws.terraform_compatible {
        return Ok(());
    }
    let flag = |why: String| ValueError(format!("--terraform-compatible: {why}"));
    url.state_lock_path(&store.options(None))
        .map_err(|e| flag(e.to_string()))?;
    if store.s3.s3lock_compatible {
        return Err(flag(
            "with --s3lock-compatible: a key is one tool's lock (a state lock is no s3lock \
             lock); drop one of them"
                .into(),
        ));
    }
    if queue || !permits.is_mutex() {
        return Err(flag(format!(
            "with {}: the state lock is deleted on release (the tools lock only an absent \
             key), so nothing keeps a queue while nobody holds it, and they know one holder",
            if queue { "--queue" } else { "--permits" }
        )));
    }
    Ok(())
}

/// `--shared-with TOOL[=PERIOD]`: another tool's clients poll the key
/// (docs/design.md §6.4, "Sharing a key with a tool that polls").
#[derive(Args, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[command(next_help_heading = "Sharing the key")]
pub struct SharingArgs {
    /// Another tool's clients wait for this key by polling it: after a lockwarden
    /// release, leave the key free for one of their polls (the period and a quarter)
    /// before a lockwarden contender takes it, so they get turns too. TOOL: s3lock
    /// (needs --s3lock-compatible), dynamolock or client-go, with the period its
    /// clients poll at if not their default (1s, 1s, 2s): dynamolock=200ms. Costs a
    /// lockwarden-to-lockwarden hand-off that window; exclusive, unqueued locks only
    #[arg(long, value_name = "TOOL[=PERIOD]", value_parser = parse_shared_with)]
    pub shared_with: Option<SharedWith>,
}

impl SharingArgs {
    /// How long a request yields to the tool, once checked against the lock `url`, the
    /// store flags and how the key is taken.
    pub fn yield_to_pollers(
        &self,
        url: &Target,
        store: &BackendArgs,
        permits: Permits,
        queue: Option<Queueing>,
    ) -> Result<Option<Duration>, ValueError> {
        let Some(shared) = self.shared_with else {
            return Ok(None);
        };
        let tool = shared.tool.name;
        if url.kind() != shared.tool.store {
            return Err(ValueError(format!(
                "--shared-with {tool}: {tool} locks on {}, not on {url}",
                shared.tool.store
            )));
        }
        if tool == "s3lock" && !store.s3.s3lock_compatible {
            return Err(ValueError(
                "--shared-with s3lock needs --s3lock-compatible: s3lock reads any object at \
                 the key as held, so only a key deleted on release is ever free for it"
                    .into(),
            ));
        }
        if !permits.is_mutex() || queue.is_some() || url.is_session_bound() {
            return Err(ValueError(format!(
                "--shared-with {tool}: only an exclusive lock outside a queue yields to \
                 another tool's polls (a queue or a semaphore key is granted in its own \
                 order, which the other tool does not see)"
            )));
        }
        Ok(Some(shared.window()))
    }
}

impl PermitArgs {
    /// The permits asked for, checked: `--permits N` alone means shared when N > 1.
    pub fn permits(&self) -> Result<Permits, ValueError> {
        let total = self.permits.unwrap_or(1);
        let mode = if self.shared {
            Mode::Shared
        } else if self.exclusive || total == 1 {
            Mode::Exclusive
        } else {
            Mode::Shared
        };
        let permits = Permits { total, mode };
        permits.validate().map_err(|message| {
            let flag = if self.shared && total == 1 {
                "--shared"
            } else {
                "--permits"
            };
            ValueError(format!("{flag}: {message}"))
        })?;
        Ok(permits)
    }
}

/// Flags of the `lockwarden` command itself.
#[derive(Args, Clone, Debug, Default)]
pub struct GlobalArgs {
    /// Log more to stderr (-v: info, -vv: debug); LOCKWARDEN_LOG takes a tracing filter
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    /// Log line format: text, or json (one object per line, e.g. for the controller)
    #[arg(
        long,
        value_enum,
        env = "LOCKWARDEN_LOG_FORMAT",
        default_value_t,
        global = true
    )]
    pub log_format: LogFormat,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Lease of a lock taken by `lock`. Nothing renews it once the command has exited, so
/// it is long; `unlock` ends it earlier, `--lease` changes it.
pub const DEFAULT_LEASE: &str = "1h";

#[derive(Args, Debug)]
#[command(after_help = "\
The lock is not renewed once `lock` has exited: it stays held until `unlock` or until its \
lease runs out (default 1h, unlike s3lock's locks, which never expire), after which another \
`lock` may take it over. On ZooKeeper (zk://) a lock lives as long as a session, so `lock` \
leaves a background process holding the session until `unlock` or the end of the lease.

A key may have more than one holder. `lockwarden lock --permits 2 s3://locks/nightly` takes one \
of two permits (a semaphore: a third `lock` waits or fails as held); `status` lists every \
holder with its fence. With --shared (readers) and --exclusive (a writer, alone) on one \
--permits N key, readers share it and a writer excludes them all.")]
pub struct LockArgs {
    /// The lock: s3://BUCKET/KEY, dynamodb://TABLE/KEY, zk://HOST:PORT[,HOST:PORT...]/PATH or k8s://NAMESPACE/LEASE-NAME
    #[arg(value_name = "URL", value_parser = parse_target)]
    pub url: Target,

    /// Wait up to this long for the lock (seconds, or a duration such as 5m); 0 = do not wait
    #[arg(short, long, value_name = "SECS", value_parser = parse_wait)]
    pub wait: Option<Duration>,

    /// Lock file to write [default: <last path segment>.lock]
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Take the lock over from its holder (a write conditioned on the version just read,
    /// never a blind overwrite); with --wait, only once the wait has run out
    #[arg(short, long)]
    pub force: bool,

    /// How long the lock stays held without `unlock`
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_LEASE, value_parser = parse_lease)]
    pub lease: Duration,

    /// After an expiry (never after a release), contenders wait this much longer than
    /// the lease before taking over, so the holder's work has time to stop: stored as
    /// part of the record's lease, which other tools honour too (at most 10m; not on
    /// ZooKeeper) [default: 0]
    #[arg(long, value_name = "DURATION", env = "LOCKWARDEN_LOCK_DELAY", value_parser = parse_lock_delay)]
    pub lock_delay: Option<Duration>,

    /// Holder identity stored with the lock [default: user@host:pid]
    #[arg(long, value_name = "ID", value_parser = parse_holder)]
    pub holder: Option<String>,

    /// Take back at once a lock that this --holder still holds from an earlier run that
    /// never released it (a restart), instead of waiting out its lease: only if the
    /// stored holder is this one, by a write conditioned on the version read, with a new
    /// fence. Unsafe if two live processes share the holder name
    #[arg(long, requires = "holder", conflicts_with = "force")]
    pub reclaim: bool,

    /// Free text stored with the lock (shown by `status`)
    #[arg(long, value_name = "TEXT")]
    pub data: Option<String>,

    #[command(flatten)]
    pub permits: PermitArgs,

    #[command(flatten)]
    pub queue: QueueArgs,

    #[command(flatten)]
    pub sharing: SharingArgs,

    #[command(flatten)]
    pub backend: BackendArgs,

    /// Internal: be the process that keeps a ZooKeeper lock's session.
    #[arg(long, hide = true)]
    pub keeper: bool,
}

impl LockArgs {
    pub fn output_path(&self) -> PathBuf {
        self.output
            .clone()
            .unwrap_or_else(|| LockFile::default_path(&self.url))
    }

    /// What `lock` asks the store for; an error if the permit flags do not fit
    /// together.
    pub fn request(&self) -> Result<AcquireRequest, ValueError> {
        let permits = self.permits.permits()?;
        check_state_lock(&self.url, &self.backend, permits, self.queue.queue)?;
        let queue = self.queue.queueing(&self.url, permits, &self.backend)?;
        if self.force && queue.is_some() {
            return Err(ValueError(
                "--force with --queue: a forced takeover does not wait its turn; \
                 drop one of them"
                    .into(),
            ));
        }
        let yield_to_pollers =
            self.sharing
                .yield_to_pollers(&self.url, &self.backend, permits, queue)?;
        Ok(AcquireRequest {
            holder: self.holder.clone().unwrap_or_else(default_holder),
            lease: self.lease,
            data: self.data.clone(),
            force: self.force,
            reclaim: self.reclaim,
            permits,
            cluster: Some(sys::hostname()),
            lock_delay: lock_delay_for(&self.url, self.lock_delay)?,
            queue,
            yield_to_pollers,
        })
    }
}

/// `--lock-delay` for `url`: refused on a store that cannot carry one (ZooKeeper).
pub fn lock_delay_for(url: &Target, lock_delay: Option<Duration>) -> Result<Duration, ValueError> {
    let delay = lock_delay.unwrap_or_default();
    if !delay.is_zero() && !url.supports_lock_delay() {
        return Err(ValueError(format!(
            "--lock-delay {}: not supported on {url}: an expired session's entry is deleted by \
             the server and every waiter takes over at once, so no delay can be stored",
            humantime::format_duration(delay)
        )));
    }
    Ok(delay)
}

/// `user@host:pid`, the default holder identity.
pub fn default_holder() -> String {
    format!(
        "{}@{}:{}",
        sys::username(),
        sys::hostname(),
        std::process::id()
    )
}

/// A lock URL.
pub fn parse_target(s: &str) -> Result<Target, TargetError> {
    Target::parse(s)
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ValueError(String);

/// A fence as lockwarden hands it out (`LOCKWARDEN_FENCE`): ASCII digits only, no
/// sign, no spaces, at most u64's largest.
pub fn parse_fence(s: &str) -> Result<FenceToken, ValueError> {
    let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits
        .then(|| s.parse::<u64>().ok())
        .flatten()
        .map(FenceToken)
        .ok_or_else(|| {
            ValueError(format!(
                "{s:?} is not a fence: expected a plain decimal number from 0 to {} \
                 (as in LOCKWARDEN_FENCE)",
                u64::MAX
            ))
        })
}

/// The longest wait or lease: what the clock can add to now everywhere (68 years).
const LONGEST: Duration = Duration::from_secs(i32::MAX as u64);

/// A nonce as the store keeps it: not empty (an annotation the downward API did not
/// find comes as an empty value), printable.
pub fn parse_nonce(s: &str) -> Result<String, ValueError> {
    if s.trim().is_empty() {
        return Err(ValueError(
            "the nonce is empty: is the Pod's lockwarden.io/nonce annotation set?".into(),
        ));
    }
    if s.len() > 256 || s.chars().any(char::is_control) {
        return Err(ValueError(
            "a nonce is at most 256 printable characters".into(),
        ));
    }
    Ok(s.to_string())
}

/// A positive duration in Go's form, as everywhere else in lockwarden
/// ([`lockwarden_core::duration`]): `30s`, `5m`, `1h30m`, `1500ms`, `1.5h`.
pub fn parse_duration(s: &str) -> Result<Duration, ValueError> {
    lockwarden_core::duration::parse_flag_duration(s).map_err(|e| ValueError(e.to_string()))
}

/// A lease: a duration of at least one second (backends store whole seconds or
/// milliseconds, and renewals need time), at most 68 years.
pub fn parse_lease(s: &str) -> Result<Duration, ValueError> {
    const TOO_LONG: &str = "a lease must be at most 68 years";
    let d = match parse_go_duration(s.trim()) {
        Err(DurationError::Overflow) => {
            return Err(ValueError(format!(
                "{s:?} is not a duration lockwarden can use (out of range): {TOO_LONG}"
            )));
        }
        _ => parse_duration(s)?,
    };
    if d < Duration::from_secs(1) {
        return Err(ValueError(format!("{s:?}: a lease must be at least 1s")));
    }
    if d > LONGEST {
        return Err(ValueError(format!("{s:?}: {TOO_LONG}")));
    }
    Ok(d)
}

/// `--lock-delay`: zero, or a duration up to [`MAX_LOCK_DELAY`] (docs/design.md rule 8:
/// a delay blocks the key that long after every expiry, so a mistaken hour is refused).
pub fn parse_lock_delay(s: &str) -> Result<Duration, ValueError> {
    let d = match parse_go_duration(s.trim()) {
        Ok(d) if d.is_zero() => return Ok(d),
        Err(DurationError::Overflow) => Duration::MAX,
        _ => parse_duration(s)?,
    };
    if d > MAX_LOCK_DELAY {
        return Err(ValueError(format!(
            "{s:?} is above the maximum lock-delay of {}: it would block the key that long \
             after every expiry",
            humantime::format_duration(MAX_LOCK_DELAY)
        )));
    }
    Ok(d)
}

/// `--shared-with TOOL[=PERIOD]`: one of [`lockwarden_stores::POLLING_TOOLS`], at its
/// default period or at PERIOD (a duration from 10ms to 1m).
pub fn parse_shared_with(s: &str) -> Result<SharedWith, ValueError> {
    let (name, period) = match s.split_once('=') {
        Some((name, period)) => (name.trim(), Some(period.trim())),
        None => (s.trim(), None),
    };
    let mut shared = SharedWith::named(name).ok_or_else(|| {
        ValueError(format!(
            "{name:?} is not a tool lockwarden yields to: expected one of {}",
            SharedWith::names()
        ))
    })?;
    if let Some(period) = period {
        let d = parse_duration(period)?;
        if !(Duration::from_millis(10)..=Duration::from_secs(60)).contains(&d) {
            return Err(ValueError(format!(
                "{period:?}: a poll period must be from 10ms to 1m"
            )));
        }
        shared.period = d;
    }
    Ok(shared)
}

/// `--wait`: whole seconds (as s3lock's `--wait=UINT`) or a duration; 0 = do not wait.
/// At most 68 years, as a lease.
pub fn parse_wait(s: &str) -> Result<Duration, ValueError> {
    let t = s.trim();
    let d = match t.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => parse_go_duration(t).map_err(|_| {
            ValueError(format!(
                "{s:?} is not a number of seconds or a duration: expected e.g. 10, 90s or 5m"
            ))
        })?,
    };
    if d > LONGEST {
        return Err(ValueError(format!(
            "{s:?}: a wait must be at most 68 years"
        )));
    }
    Ok(d)
}

/// A holder identity: printable, non-empty, at most 256 characters.
/// A `--run-key`: printable, not empty, at most `MAX_RUN_KEY_LEN` bytes.
pub fn parse_run_key(s: &str) -> Result<lockwarden_core::RunKey, ValueError> {
    lockwarden_core::RunKey::new(s).map_err(|e| ValueError(format!("--run-key {s:?}: {e}")))
}

/// `--run-key` beside the other flags: one completion per run needs one holder at a
/// time, and the memory lives in an exclusive, unqueued key's record (§6.7).
pub fn check_run_key(
    run: Option<&lockwarden_core::RunKey>,
    permits: Permits,
    queue: Option<lockwarden_core::Queueing>,
) -> Result<(), ValueError> {
    let Some(run) = run else {
        return Ok(());
    };
    if !permits.is_mutex() {
        return Err(ValueError(format!(
            "--run-key {run}: a run is completed by one holder; not with --permits (a shared \
             or counted lock)"
        )));
    }
    if queue.is_some() {
        return Err(ValueError(format!(
            "--run-key {run}: not with --queue yet: a queued key's record keeps no memory of \
             completed runs"
        )));
    }
    Ok(())
}

pub fn parse_holder(s: &str) -> Result<String, ValueError> {
    if s.trim().is_empty() {
        return Err(ValueError("the holder must not be empty".into()));
    }
    if s.chars().any(char::is_control) || s.chars().count() > 256 {
        return Err(ValueError(format!(
            "{s:?}: the holder must be printable and at most 256 characters"
        )));
    }
    Ok(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_nonce_names_the_annotation() {
        let refused = parse_nonce("").unwrap_err().to_string();
        assert!(refused.contains("lockwarden.io/nonce"), "{refused}");
        assert!(parse_nonce("a\u{7}b").is_err());
        assert_eq!(parse_nonce("0123abcd").unwrap(), "0123abcd");
    }

    #[test]
    fn a_fence_is_plain_decimal_digits() {
        assert_eq!(parse_fence("7").unwrap(), FenceToken(7));
        assert_eq!(parse_fence("007").unwrap(), FenceToken(7));
        assert_eq!(
            parse_fence("18446744073709551615").unwrap(),
            FenceToken(u64::MAX)
        );
        for bad in [
            "",
            "-1",
            "+1",
            " 1",
            "1 ",
            "0x10",
            "1e3",
            "seven",
            "18446744073709551616",
        ] {
            let err = parse_fence(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("{bad:?} is not a fence")), "{err}");
        }
    }
    use clap::Parser;

    /// The permit flags as a command line gives them.
    #[derive(Parser)]
    struct PermitCommand {
        #[command(flatten)]
        permits: PermitArgs,
    }

    fn permits(args: &[&str]) -> Result<Permits, Box<dyn std::error::Error>> {
        let parsed =
            PermitCommand::try_parse_from(std::iter::once("t").chain(args.iter().copied()))?;
        Ok(parsed.permits.permits()?)
    }

    #[test]
    fn permit_flags() {
        let shared = |total| Permits {
            total,
            mode: Mode::Shared,
        };
        let exclusive = |total| Permits {
            total,
            mode: Mode::Exclusive,
        };
        // (flags, what they ask for, or a phrase of the error)
        let rows: [(&[&str], Result<Permits, &str>); 12] = [
            (&[], Ok(Permits::MUTEX)),
            (&["--permits", "1"], Ok(Permits::MUTEX)),
            (&["--exclusive"], Ok(Permits::MUTEX)),
            (&["--permits", "3"], Ok(shared(3))),
            (&["--permits", "3", "--shared"], Ok(shared(3))),
            (&["--permits", "3", "--exclusive"], Ok(exclusive(3))),
            (&["--permits", "256"], Ok(shared(256))),
            (
                &["--shared"],
                Err("--shared: shared mode needs permits of 2 or more"),
            ),
            (
                &["--permits", "1", "--shared"],
                Err("--shared: shared mode needs"),
            ),
            (
                &["--permits", "0"],
                Err("--permits: permits must be at least 1"),
            ),
            (
                &["--permits", "257"],
                Err("--permits: permits is 257, at most 256"),
            ),
            (
                &["--permits", "2", "--shared", "--exclusive"],
                Err("cannot be used with"),
            ),
        ];
        for (flags, want) in rows {
            match (permits(flags).map_err(|e| e.to_string()), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{flags:?}"),
                (Err(got), Err(phrase)) => assert!(got.contains(phrase), "{flags:?}: {got}"),
                (got, want) => panic!("{flags:?}: got {got:?}, want {want:?}"),
            }
        }
        assert!(permits(&["--permits", "-1"]).is_err());
        assert!(permits(&["--permits", "many"]).is_err());
    }

    #[test]
    fn wait_takes_seconds_or_durations() {
        assert_eq!(parse_wait("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_wait("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_wait("1m30s").unwrap(), Duration::from_secs(90));
        assert!(parse_wait("-5").is_err());
        assert!(parse_wait("soon").is_err());
        // Beyond what the clock can add to now (it panicked before).
        assert!(
            parse_wait("18446744073709551615")
                .unwrap_err()
                .to_string()
                .contains("at most 68 years")
        );
    }

    #[test]
    fn rule8_lock_delays_are_zero_up_to_the_maximum() {
        assert_eq!(parse_lock_delay("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_lock_delay("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_lock_delay("10m").unwrap(), MAX_LOCK_DELAY);
        let above = parse_lock_delay("2h").unwrap_err().to_string();
        assert!(above.contains("\"2h\"") && above.contains("10m"), "{above}");
        assert!(parse_lock_delay("1000000000h").is_err());
        assert!(parse_lock_delay("soon").is_err());
        let zk = Target::parse("zk://127.0.0.1:2181/locks/a").unwrap();
        let refused = lock_delay_for(&zk, Some(Duration::from_secs(3))).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("--lock-delay 3s: not supported on zk://")
        );
        assert_eq!(lock_delay_for(&zk, None).unwrap(), Duration::ZERO);
    }

    #[test]
    fn leases_are_at_least_a_second() {
        assert_eq!(parse_lease("1h").unwrap(), Duration::from_secs(3600));
        assert!(parse_lease("999ms").is_err());
        assert!(parse_lease("0s").is_err());
        assert!(parse_lease("100 years").is_err());
        assert!(
            parse_duration("10parsecs")
                .unwrap_err()
                .to_string()
                .contains("30s, 5m")
        );
    }

    #[test]
    fn durations_are_go_durations() {
        // Every form --help and the documentation show.
        for (text, want) in [
            ("30s", 30),
            ("5m", 300),
            ("1h30m", 5400),
            ("90s", 90),
            ("10s", 10),
            ("1h", 3600),
        ] {
            assert_eq!(
                parse_duration(text).unwrap(),
                Duration::from_secs(want),
                "{text}"
            );
        }
        assert_eq!(
            parse_duration("1500ms").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(parse_duration("1.5h").unwrap(), Duration::from_secs(5400));
        // humantime's prose forms are gone with it: one syntax everywhere.
        assert!(parse_duration("2days").is_err());
        assert!(parse_duration("1h 30m").is_err());
        let overflow = parse_lease("1000000000h").unwrap_err().to_string();
        assert!(overflow.contains("at most 68 years"), "{overflow}");
    }
}

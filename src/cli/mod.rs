//! The `lockwarden` command-line tool: s3lock's `lock` / `unlock` on every backend,
//! plus `run` (a command under a renewed lock) and `status`.
//!
//! - [`lock`]: acquire, write a lock file, exit. The lock is *not* renewed after
//!   that, so it carries a long lease (default [`lock::DEFAULT_LEASE`]); on ZooKeeper,
//!   where a lock lives as long as a session, a small background process keeps the
//!   session until `unlock` or the lease's end ([`keeper`]).
//! - [`unlock`]: release the lock a lock file describes, only if it is still that
//!   acquisition's (same nonce; the write is conditional on the file's version).
//! - [`run`]: hold the lock with heartbeats while a command runs; terminate it if the
//!   lock is lost.
//! - [`status`]: read the lock record without acquiring.
//!
//! Every command returns an exit code; see [`EXIT_CODES_HELP`].

pub mod completions;
mod keeper;
pub mod lock;
pub mod lockfile;
mod progress;
pub mod run;
pub mod status;
mod sys;
pub mod unlock;

use std::ffi::OsString;
use std::io::Write;
use std::time::Duration;

use clap::Args;

use crate::backend::target::{ConnectError, ConnectOptions, Target, TargetError};
use crate::lock::{
    AcquireRequest, HeldBy, Lease, LockBackend, LockError, Wait, acquire_with_progress,
};
use lockfile::LockFileError;

/// Exit codes of every command.
pub mod exit {
    /// Success (`run`: the command's own exit status instead).
    pub const OK: u8 = 0;
    /// The backend failed or refused, a lock file is missing or corrupt, the lock was
    /// already unlocked, an I/O error.
    pub const ERROR: u8 = 1;
    /// The command line is malformed: URL, flag, duration.
    pub const USAGE: u8 = 2;
    /// The lock is held by someone else (at once, or still when `--wait` ran out;
    /// `unlock`: lock mismatch, it was taken over).
    pub const HELD: u8 = 3;
    /// `run`: the lock was lost while the command ran; the command was terminated.
    pub const LOST: u8 = 4;
    /// `run`: the command could not be executed (permission denied).
    pub const CANNOT_EXECUTE: u8 = 126;
    /// `run`: the command was not found.
    pub const NOT_FOUND: u8 = 127;
}

/// The exit codes, as `lockwarden --help` shows them.
pub const EXIT_CODES_HELP: &str = "\
Exit status:
  0    success (run: the exit status of COMMAND, 128+N if a signal N killed it)
  1    error: backend unreachable or refusing, lock file missing or corrupt, already unlocked
  2    usage error: malformed URL, flag or duration
  3    the lock is held by someone else (also when --wait runs out; unlock: lock mismatch)
  4    run: the lock was lost while COMMAND ran; COMMAND got SIGTERM (SIGKILL after --grace)
  126  run: COMMAND could not be executed; 127: COMMAND not found

Lock URLs:
  s3://BUCKET/KEY                          S3 object (conditional writes)
  dynamodb://TABLE/KEY                     DynamoDB item (dynamolock-compatible attributes)
  zk://HOST:PORT[,HOST:PORT...]/PATH       ZooKeeper queue of ephemeral sequential znodes
  k8s://NAMESPACE/LEASE-NAME               Kubernetes coordination.k8s.io/v1 Lease

AWS settings come from the SDK's default chain (AWS_ENDPOINT_URL, AWS_REGION, AWS_PROFILE,
credentials); Kubernetes from KUBECONFIG, ~/.kube/config or the in-cluster service account.";

/// Options every command that talks to a backend accepts.
#[derive(Args, Clone, Debug, Default)]
#[command(next_help_heading = "Backend options")]
pub struct BackendArgs {
    /// AWS endpoint URL, e.g. an S3-compatible server [default: AWS_ENDPOINT_URL, else AWS]
    #[arg(long, value_name = "URL", value_parser = parse_endpoint)]
    pub endpoint: Option<String>,

    /// AWS region [default: AWS_REGION / the profile's]
    #[arg(long, value_name = "REGION", value_parser = parse_region)]
    pub region: Option<String>,

    /// S3 path-style addressing (on by default when a custom endpoint is set)
    #[arg(long)]
    pub path_style: bool,

    /// S3: delete the object on release, so winebarrel/s3lock clients can lock the key
    /// after us (the fencing token then restarts at 1 after each release)
    #[arg(long)]
    pub s3lock_compatible: bool,

    /// DynamoDB partition key attribute name [default: key]
    #[arg(long, value_name = "NAME", value_parser = parse_attribute_name)]
    pub partition_key: Option<String>,

    /// DynamoDB sort key: attribute name and the value lock items use
    #[arg(long, value_name = "NAME=VALUE", value_parser = parse_sort_key)]
    pub sort_key: Option<(String, String)>,

    /// Create the DynamoDB table (on-demand billing) if it does not exist
    #[arg(long)]
    pub create_table: bool,

    /// kubeconfig context [default: the current context]
    #[arg(long, value_name = "NAME")]
    pub kube_context: Option<String>,
}

impl BackendArgs {
    /// These flags, falling back to `saved` (what a lock file recorded) for anything
    /// not given.
    pub fn options(&self, saved: Option<&lockfile::SavedOptions>) -> ConnectOptions {
        let saved = saved.cloned().unwrap_or_default();
        ConnectOptions {
            endpoint: self.endpoint.clone().or(saved.endpoint),
            region: self.region.clone().or(saved.region),
            force_path_style: (self.path_style || saved.path_style).then_some(true),
            s3lock_compatible: self.s3lock_compatible || saved.s3lock_compatible,
            partition_key: self.partition_key.clone().or(saved.partition_key),
            sort_key: self.sort_key.clone().or(saved.sort_key.and_then(|s| {
                s.split_once('=')
                    .map(|(n, v)| (n.to_string(), v.to_string()))
            })),
            create_table: self.create_table,
            kube_context: self.kube_context.clone().or(saved.kube_context),
            ..ConnectOptions::default()
        }
    }

    /// What a lock file records so `unlock` reaches the same store.
    pub fn saved(&self) -> lockfile::SavedOptions {
        lockfile::SavedOptions {
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            path_style: self.path_style,
            s3lock_compatible: self.s3lock_compatible,
            partition_key: self.partition_key.clone(),
            sort_key: self.sort_key.as_ref().map(|(n, v)| format!("{n}={v}")),
            kube_context: self.kube_context.clone(),
        }
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

/// Sets up logging to stderr. Quiet by default: a command's own messages say what
/// happened, and stray log lines would break its one-line errors.
pub fn init_logging(global: &GlobalArgs) {
    let default = match global.verbose {
        0 => "off",
        1 => "lockwarden=info",
        2 => "lockwarden=debug",
        _ => "debug",
    };
    let filter = std::env::var("LOCKWARDEN_LOG")
        .ok()
        .and_then(|f| tracing_subscriber::EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let _ = match global.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Why a command failed. The message names the lock URL (or the lock file) and the
/// cause; [`CliError::exit_code`] says which exit status it maps to.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),

    #[error(transparent)]
    Target(#[from] TargetError),

    #[error(transparent)]
    Connect(#[from] ConnectError),

    #[error(transparent)]
    LockFile(#[from] LockFileError),

    #[error("{url}: lock already held by {}", held_by(by))]
    Held { url: String, by: HeldBy },

    #[error("{url}: lock already held{} (gave up after waiting {})", by.as_ref().map(|b| format!(" by {}", held_by(b))).unwrap_or_default(), humantime::format_duration(round(*waited)))]
    TimedOut {
        url: String,
        waited: Duration,
        by: Option<HeldBy>,
    },

    #[error(
        "{url}: lock already held: the stored record is not a lockwarden lock ({found}); --force takes it over"
    )]
    Foreign { url: String, found: String },

    #[error("{url}: already unlocked{}", detail.as_ref().map(|d| format!(" ({d})")).unwrap_or_default())]
    AlreadyUnlocked { url: String, detail: Option<String> },

    #[error("{url}: lock mismatch: {detail}")]
    Mismatch { url: String, detail: String },

    #[error("{url}: lock lost while the command ran: {reason}; {action}")]
    Lost {
        url: String,
        reason: String,
        action: String,
    },

    #[error("{url}: cannot run {command:?}: {source}")]
    Spawn {
        url: String,
        command: String,
        source: std::io::Error,
    },

    #[error("{0}")]
    Lock(LockError),

    /// A message already formatted elsewhere (the ZooKeeper session keeper's), with
    /// its exit code.
    #[error("{message}")]
    Reported { code: u8, message: String },

    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
}

fn round(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64 / 100 * 100)
}

/// `holder (fence N) since T`: keeps s3lock's "lock already held" and names the fence.
fn held_by(by: &HeldBy) -> String {
    let mut s = format!("{} (fence {})", by.holder, by.fence);
    if let Some(since) = by.since.filter(|t| *t > std::time::UNIX_EPOCH) {
        s.push_str(&format!(" since {}", crate::lock::rfc3339(since)));
    }
    s
}

impl From<LockError> for CliError {
    fn from(e: LockError) -> Self {
        match e {
            LockError::Held { url, by } => CliError::Held { url, by },
            LockError::Timeout { url, waited, by } => CliError::TimedOut { url, waited, by },
            LockError::Foreign { url, found } => CliError::Foreign {
                url,
                found: found.to_string(),
            },
            other => CliError::Lock(other),
        }
    }
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) | CliError::Target(_) => exit::USAGE,
            CliError::Held { .. }
            | CliError::TimedOut { .. }
            | CliError::Foreign { .. }
            | CliError::Mismatch { .. } => exit::HELD,
            CliError::Lost { .. } => exit::LOST,
            CliError::Spawn { source, .. } => match source.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            },
            CliError::Reported { code, .. } => *code,
            CliError::Connect(_)
            | CliError::LockFile(_)
            | CliError::AlreadyUnlocked { .. }
            | CliError::Lock(_)
            | CliError::Io { .. } => exit::ERROR,
        }
    }
}

/// Prints `lockwarden: error: …` on one line (a message with line breaks is joined).
pub fn print_error(message: &str) {
    let line = one_line(message);
    let _ = writeln!(std::io::stderr(), "lockwarden: error: {line}");
}

/// Prints `lockwarden: warning: …`.
pub fn print_warning(message: &str) {
    let _ = writeln!(
        std::io::stderr(),
        "lockwarden: warning: {}",
        one_line(message)
    );
}

fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Renders a command-line parsing error as one line and returns its exit code. Help
/// and version requests print as usual and succeed.
pub fn report_parse_error(err: clap::Error) -> u8 {
    use clap::error::ErrorKind;
    match err.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = err.print();
            if err.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                exit::USAGE
            } else {
                exit::OK
            }
        }
        _ => {
            // clap renders "error: MESSAGE\n  details…\n\nUsage: …\n\nFor more information…".
            let rendered = err.render().to_string();
            let mut message = Vec::new();
            let mut usage = None;
            for line in rendered.lines() {
                let line = line.trim();
                if let Some(u) = line.strip_prefix("Usage: ") {
                    usage = Some(u.to_string());
                } else if line.is_empty() || line.starts_with("For more information") {
                    continue;
                } else if usage.is_none() {
                    message.push(line.strip_prefix("error: ").unwrap_or(line).to_string());
                }
            }
            let mut line = message.join(" ").replace(" tip: ", "; tip: ");
            if let Some(usage) = usage {
                line.push_str(&format!(" (usage: {usage})"));
            }
            print_error(&line);
            exit::USAGE
        }
    }
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

/// Acquires the lock with progress on stderr. With `force` and a wait, waits first
/// and takes over only when the wait is over (as s3lock does).
pub async fn acquire(
    backend: &dyn LockBackend,
    req: &AcquireRequest,
    wait: Option<Duration>,
    mut on_busy: impl FnMut(&HeldBy, Option<u32>) + Send,
) -> Result<Lease, CliError> {
    let wait = match wait {
        Some(d) if !d.is_zero() => Wait::For(d),
        _ => Wait::No,
    };
    let polite = AcquireRequest {
        force: req.force && wait == Wait::No,
        ..req.clone()
    };
    let result = acquire_with_progress(backend, &polite, wait, |record, queue| {
        on_busy(&HeldBy::from_record(record), queue)
    })
    .await;
    match result {
        Err(LockError::Timeout { .. }) if req.force => {
            Ok(acquire_with_progress(backend, req, Wait::No, |_, _| {}).await?)
        }
        other => Ok(other?),
    }
}

// ----- value parsers: each error names the value and the expected form -----

/// A lock URL.
pub fn parse_target(s: &str) -> Result<Target, TargetError> {
    Target::parse(s)
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ValueError(String);

/// A positive duration: `30s`, `5m`, `1h30m`, `1500ms`.
pub fn parse_duration(s: &str) -> Result<Duration, ValueError> {
    let d = humantime::parse_duration(s.trim()).map_err(|e| {
        ValueError(format!(
            "{s:?} is not a duration ({e}): expected e.g. 30s, 5m, 1h30m"
        ))
    })?;
    if d.is_zero() {
        return Err(ValueError(format!(
            "{s:?}: the duration must be greater than zero"
        )));
    }
    Ok(d)
}

/// A lease: a duration of at least one second (backends store whole seconds or
/// milliseconds, and renewals need time).
pub fn parse_lease(s: &str) -> Result<Duration, ValueError> {
    let d = parse_duration(s)?;
    if d < Duration::from_secs(1) {
        return Err(ValueError(format!("{s:?}: a lease must be at least 1s")));
    }
    if d > Duration::from_secs(i32::MAX as u64) {
        return Err(ValueError(format!(
            "{s:?}: a lease must be at most 68 years"
        )));
    }
    Ok(d)
}

/// `--wait`: whole seconds (as s3lock's `--wait=UINT`) or a duration; 0 = do not wait.
/// At most 68 years, as a lease.
pub fn parse_wait(s: &str) -> Result<Duration, ValueError> {
    let t = s.trim();
    let d = match t.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => humantime::parse_duration(t).map_err(|_| {
            ValueError(format!(
                "{s:?} is not a number of seconds or a duration: expected e.g. 10, 90s or 5m"
            ))
        })?,
    };
    if d > Duration::from_secs(i32::MAX as u64) {
        return Err(ValueError(format!(
            "{s:?}: a wait must be at most 68 years"
        )));
    }
    Ok(d)
}

/// A holder identity: printable, non-empty, at most 256 characters.
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

fn parse_endpoint(s: &str) -> Result<String, ValueError> {
    let ok = (s.starts_with("http://") || s.starts_with("https://"))
        && s.split_once("://").is_some_and(|(_, h)| !h.is_empty());
    if !ok {
        return Err(ValueError(format!(
            "{s:?} is not an endpoint URL: expected http(s)://HOST[:PORT]"
        )));
    }
    Ok(s.to_string())
}

fn parse_region(s: &str) -> Result<String, ValueError> {
    if s.is_empty()
        || !s
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err(ValueError(format!(
            "{s:?} is not a region name: expected e.g. eu-west-1"
        )));
    }
    Ok(s.to_string())
}

fn parse_attribute_name(s: &str) -> Result<String, ValueError> {
    if s.is_empty() || s.len() > 255 {
        return Err(ValueError(format!(
            "{s:?}: an attribute name has 1-255 characters"
        )));
    }
    Ok(s.to_string())
}

fn parse_sort_key(s: &str) -> Result<(String, String), ValueError> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() && !value.is_empty() => {
            Ok((parse_attribute_name(name)?, value.to_string()))
        }
        _ => Err(ValueError(format!(
            "{s:?}: expected NAME=VALUE, e.g. sk=lock"
        ))),
    }
}

/// The command line of `run`'s child, for messages.
fn display_command(command: &[OsString]) -> String {
    const SHOWN: usize = 60;
    let full = command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    if full.chars().count() <= SHOWN {
        full
    } else {
        full.chars().take(SHOWN).chain(['…']).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn messages_become_one_line() {
        assert_eq!(one_line("a\n  b\n\nc"), "a b c");
    }

    #[test]
    fn exit_codes() {
        let by = HeldBy {
            holder: "h".into(),
            fence: crate::lock::FenceToken(4),
            since: None,
        };
        let held = CliError::from(LockError::Held {
            url: "s3://b/k".into(),
            by: by.clone(),
        });
        assert_eq!(held.exit_code(), exit::HELD);
        assert_eq!(
            held.to_string(),
            "s3://b/k: lock already held by h (fence 4)"
        );
        let timed_out = CliError::from(LockError::Timeout {
            url: "s3://b/k".into(),
            waited: Duration::from_millis(2049),
            by: Some(by),
        });
        assert_eq!(timed_out.exit_code(), exit::HELD);
        assert!(
            timed_out
                .to_string()
                .ends_with("(gave up after waiting 2s)")
        );
        let unavailable = CliError::from(LockError::Unavailable {
            url: "s3://b/k".into(),
            cause: "down".into(),
        });
        assert_eq!(unavailable.exit_code(), exit::ERROR);
    }
}

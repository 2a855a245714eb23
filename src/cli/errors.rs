//! Why a command failed ([`CliError`]) and the exit status each failure maps to.

use std::time::Duration;

use super::args::ValueError;
use super::guard::args::GuardArgsError;
use super::kubectl::object::ObjectError;
use super::lockfile::LockFileError;
use super::stop::GraceTooLong;
use lockwarden_core::fenced::FencedError;
use lockwarden_core::{HeldBy, LockError};
use lockwarden_stores::{BackendKind, ConnectError, TargetError};

/// Exit codes of every command: the names the code uses. What each means is said once,
/// in [`EXIT_CODES`].
pub mod exit {
    pub const OK: u8 = 0;
    pub const ERROR: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const HELD: u8 = 3;
    pub const LOST: u8 = 4;
    pub const STALE_FENCE: u8 = 5;
    pub const UNCONFIRMED: u8 = 6;
    pub const ALREADY_COMPLETED: u8 = 7;
    pub const CANNOT_EXECUTE: u8 = 126;
    pub const NOT_FOUND: u8 = 127;
}

/// One exit status and what it means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitStatus {
    pub code: u8,
    /// One line, plain text: `--help` shows it as it is, and the README and
    /// docs/architecture.md show it word for word (a test compares them).
    pub meaning: &'static str,
}

/// Every exit status of every command, in order: the one table `--help`, the README
/// and docs/architecture.md show. A new exit code is a row here (and then a row there).
pub const EXIT_CODES: &[ExitStatus] = &[
    ExitStatus {
        code: exit::OK,
        meaning: "success (run, guard: the exit status of COMMAND, 128+N if a signal N killed it)",
    },
    ExitStatus {
        code: exit::ERROR,
        meaning: "error: backend unreachable or refusing, lock file missing or corrupt, \
                  already unlocked, permits disagreeing with the holders'",
    },
    ExitStatus {
        code: exit::USAGE,
        meaning: "usage error: malformed URL, flag or duration (the message gives the expected form)",
    },
    ExitStatus {
        code: exit::HELD,
        meaning: "the lock is held by someone else, at once or still when --wait ran out, \
                  also by another tool's lock or a record lockwarden does not recognise \
                  (unlock: lock mismatch, it was taken over)",
    },
    ExitStatus {
        code: exit::LOST,
        meaning: "run: the lock was lost while COMMAND ran; every process COMMAND started got SIGTERM, then SIGKILL before the holder deadline \
                  (guard: the lock is not held with this nonce: COMMAND was stopped the same way, or never started)",
    },
    ExitStatus {
        code: exit::STALE_FENCE,
        meaning: "put, delete: refused, the object was written by a higher fence or by another lock, \
                  or the lock never issued the fence; check-fence: the fence is not a current holder's",
    },
    ExitStatus {
        code: exit::UNCONFIRMED,
        meaning: "guard: the lock could not be confirmed by the guard's deadline (no renewal seen, or the store not answering); \
                  every process of COMMAND got SIGTERM, then SIGKILL before that deadline (at start: no renewal within the \
                  stored lease, COMMAND never started)",
    },
    ExitStatus {
        code: exit::ALREADY_COMPLETED,
        meaning: "run --run-key: the key's memory says this run already completed (or is older than \
                  what it still remembers); COMMAND was not started and the lock was released",
    },
    ExitStatus {
        code: exit::CANNOT_EXECUTE,
        meaning: "run, guard: COMMAND could not be executed",
    },
    ExitStatus {
        code: exit::NOT_FOUND,
        meaning: "run, guard: COMMAND was not found",
    },
];

/// What `lockwarden --help` shows after the commands: [`EXIT_CODES`], then the lock
/// URLs (each store's form) and the permit flags.
pub fn after_help() -> String {
    let mut help = String::from("Exit status:\n");
    for status in EXIT_CODES {
        help.push_str(&exit_status_lines(status));
    }
    help.push_str("\nLock URLs:\n");
    help.push_str(&BackendKind::url_help());
    help.push_str(AFTER_LOCK_URLS);
    help
}

/// One row of the table as `--help` shows it: the code, then the meaning wrapped at
/// 88 columns under itself (narrow enough that clap does not wrap it again).
fn exit_status_lines(status: &ExitStatus) -> String {
    const INDENT: usize = 7;
    const WIDTH: usize = 88;
    let mut out = format!("  {:<4} ", status.code);
    let mut column = INDENT;
    for word in status.meaning.split(' ') {
        if column > INDENT && column + 1 + word.len() > WIDTH {
            out.push('\n');
            out.push_str(&" ".repeat(INDENT));
            column = INDENT;
        } else if column > INDENT {
            out.push(' ');
            column += 1;
        }
        out.push_str(word);
        column += word.len();
    }
    out.push('\n');
    out
}

const AFTER_LOCK_URLS: &str = "
More than one holder (lock, run and status take --permits N, --shared, --exclusive; every
holder of a key must give the same --permits):
  Semaphore: at most 3 loads at once across every machine, each with its own fence
    lockwarden run --permits 3 s3://locks/warehouse -- ./load.sh
  Shared and exclusive: readers coexist (up to the permits), a writer holds the key alone;
  a writer first in line keeps new readers out, so writers are not starved
    lockwarden run --permits 16 --shared s3://locks/dataset -- ./read.sh
    lockwarden run --permits 16 --exclusive s3://locks/dataset -- ./rewrite.sh

AWS settings come from the SDK's default chain (AWS_ENDPOINT_URL, AWS_REGION, AWS_PROFILE,
credentials); Kubernetes from KUBECONFIG, ~/.kube/config or the in-cluster service account.";

/// Why a command failed. The message names the lock URL (or the lock file) and the
/// cause; [`CliError::exit_code`] says which exit status it maps to.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),

    /// A flag's value that does not fit (the message names the flag).
    #[error(transparent)]
    Value(#[from] ValueError),

    /// `run`, `guard`: a `--grace` longer than the lease leaves.
    #[error(transparent)]
    Grace(#[from] GraceTooLong),

    /// `guard`: the flags name no lock it can guard.
    #[error(transparent)]
    GuardArgs(#[from] GuardArgsError),

    /// `kubectl lockwarden`: the words name no object the command reads.
    #[error(transparent)]
    Object(#[from] ObjectError),

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

    /// `guard`: the store shows the lock is not held with the guard's nonce at start.
    #[error("{url}: the lock is not held with this nonce ({detail}); the command was not started")]
    NotHeld { url: String, detail: String },

    /// `guard`: no renewal of the lock seen in time (rule 9).
    #[error("{url}: the lock could not be confirmed by the guard's deadline: {reason}; {action}")]
    Unconfirmed {
        url: String,
        reason: String,
        action: String,
    },

    /// `run --run-key`: the run is done already (docs/design.md §6.7); COMMAND was not
    /// started.
    #[error("{url}: {detail}; the command was not started")]
    AlreadyCompleted { url: String, detail: String },

    /// `guard`: the lock could not be read when the guard started (`cause` names the
    /// lock URL).
    #[error("{cause}; the command was not started")]
    Unreadable { cause: String },

    #[error("{url}: cannot run {command:?}: {source}")]
    Spawn {
        url: String,
        command: String,
        source: std::io::Error,
    },

    #[error("{0}")]
    Lock(LockError),

    /// A fenced write or read (`put`, `get`, `delete`) failed or was refused; `target`
    /// is the object's URL (the lock's, for a lock with several permits).
    #[error("{target}: {error}")]
    Fenced {
        target: String,
        error: Box<FencedError>,
    },

    /// A message already formatted elsewhere (the ZooKeeper session keeper's), with
    /// its exit code.
    #[error("{message}")]
    Reported { code: u8, message: String },

    #[error("{context}")]
    Io {
        context: String,
        source: std::io::Error,
    },

    /// `kubectl lockwarden`: the cluster could not be reached or refused a read.
    /// (The cause as text: kube's errors repeat their sources in their own message.)
    #[error("{context}: {cause}")]
    Kube { context: String, cause: String },

    /// `kubectl lockwarden`: the object asked about does not exist.
    #[error("{0}")]
    NotFound(String),
}

fn round(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64 / 100 * 100)
}

/// `holder (fence N) since T`: keeps s3lock's "lock already held" and names the fence.
fn held_by(by: &HeldBy) -> String {
    let mut s = format!("{} (fence {})", by.holder, by.fence);
    if let Some(since) = by.since.filter(|t| *t > std::time::UNIX_EPOCH) {
        s.push_str(&format!(" since {}", lockwarden_core::rfc3339(since)));
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
            CliError::Usage(_)
            | CliError::Value(_)
            | CliError::Grace(_)
            | CliError::GuardArgs(_)
            | CliError::Object(_)
            | CliError::Target(_) => exit::USAGE,
            CliError::Held { .. }
            | CliError::TimedOut { .. }
            | CliError::Foreign { .. }
            | CliError::Mismatch { .. } => exit::HELD,
            CliError::Lost { .. } | CliError::NotHeld { .. } => exit::LOST,
            CliError::Unconfirmed { .. } => exit::UNCONFIRMED,
            CliError::AlreadyCompleted { .. } => exit::ALREADY_COMPLETED,
            CliError::Spawn { source, .. } => match source.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            },
            CliError::Reported { code, .. } => *code,
            CliError::Fenced { error, .. } => match error.as_ref() {
                FencedError::Stale { .. }
                | FencedError::OtherLock { .. }
                | FencedError::NeverIssued { .. }
                | FencedError::Unissued { .. } => exit::STALE_FENCE,
                FencedError::InvalidData(_) | FencedError::Unsupported(_) => exit::USAGE,
                FencedError::LockRecord { .. }
                | FencedError::SeveralPermits { .. }
                | FencedError::Contended { .. }
                | FencedError::LockUnreadable { .. }
                | FencedError::Store { .. } => exit::ERROR,
            },
            CliError::Connect(_)
            | CliError::LockFile(_)
            | CliError::AlreadyUnlocked { .. }
            | CliError::Lock(_)
            | CliError::Unreadable { .. }
            | CliError::Io { .. }
            | CliError::Kube { .. }
            | CliError::NotFound(_) => exit::ERROR,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every exit code the code uses is a row of the table, once, in order.
    #[test]
    fn every_exit_code_is_one_row_of_the_table() {
        let used = [
            exit::OK,
            exit::ERROR,
            exit::USAGE,
            exit::HELD,
            exit::LOST,
            exit::STALE_FENCE,
            exit::UNCONFIRMED,
            exit::ALREADY_COMPLETED,
            exit::CANNOT_EXECUTE,
            exit::NOT_FOUND,
        ];
        let codes: Vec<u8> = EXIT_CODES.iter().map(|s| s.code).collect();
        assert_eq!(codes, used);
        let help = after_help();
        for status in EXIT_CODES {
            assert!(!status.meaning.contains('\n') && !status.meaning.contains("  "));
            let row = exit_status_lines(status);
            assert!(help.contains(&row), "{row:?} not in:\n{help}");
            assert!(row.lines().all(|l| l.len() <= 88), "{row}");
            let words: Vec<&str> = row.split_whitespace().collect();
            assert_eq!(
                words.join(" "),
                format!("{} {}", status.code, status.meaning)
            );
        }
    }

    #[test]
    fn exit_codes() {
        let by = HeldBy {
            holder: "h".into(),
            fence: lockwarden_core::FenceToken(4),
            since: None,
            nonce: String::new(),
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

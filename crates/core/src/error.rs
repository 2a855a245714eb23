//! Errors of the lock engine: each says which lock (its URL) and what happened.

use std::time::{Duration, SystemTime};

use super::record::{FenceToken, ForeignRecord, LockRecord};

/// Who holds a lock, for "held by" messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldBy {
    pub holder: String,
    pub fence: FenceToken,
    /// Informational wall-clock time of the holder's acquisition.
    pub since: Option<SystemTime>,
    /// The holder's nonce: names another tool's lock (`another-tool:…`), for what may
    /// be said about freeing it. Empty where unknown.
    pub nonce: String,
}

impl HeldBy {
    pub fn from_record(r: &LockRecord) -> Self {
        HeldBy {
            holder: r.holder.clone(),
            fence: r.fence,
            since: Some(r.acquired_at),
            nonce: r.nonce.clone(),
        }
    }
}

impl std::fmt::Display for HeldBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (fence {}", self.holder, self.fence)?;
        if let Some(since) = self.since {
            write!(f, ", since {}", super::record::rfc3339(since))?;
        }
        f.write_str(")")
    }
}

/// Why a held lock is no longer ours.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LostReason {
    #[error("taken over by {0}")]
    TakenOver(HeldBy),
    #[error("the lock record was deleted")]
    Deleted,
    #[error("the lock was released by someone else")]
    ReleasedElsewhere,
    #[error("the lock record was replaced by a foreign record: {0}")]
    Foreign(ForeignRecord),
    #[error("the ZooKeeper session expired")]
    SessionExpired,
    #[error("our queue entry disappeared")]
    EntryGone,
    #[error("the record no longer carries our nonce")]
    NotOurs,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("{url}: lock already held by {by}")]
    Held { url: String, by: HeldBy },

    #[error("{url}: gave up after waiting {waited:?} for the lock{}", by.as_ref().map(|b| format!(" (held by {b})")).unwrap_or_default())]
    Timeout {
        url: String,
        waited: Duration,
        by: Option<HeldBy>,
    },

    #[error("{url}: lock lost: {reason}")]
    Lost { url: String, reason: LostReason },

    #[error(
        "{url}: the stored record is not a lockwarden lock: {found} (use force to overwrite it)"
    )]
    Foreign { url: String, found: ForeignRecord },

    #[error("{url}: lock is not held (already unlocked)")]
    NotHeld { url: String },

    /// `cause` is the store's or client's own error where there is one (its text is
    /// part of this error's message, so conditions and logs read as before).
    #[error("{url}: backend unavailable: {cause}")]
    Unavailable {
        url: String,
        #[source]
        cause: Cause,
    },

    #[error("{url}: {message}")]
    Backend { url: String, message: String },

    /// Every lock on one key must name the same permits (docs/design.md §6.2).
    #[error(
        "{url}: the key is held with {stored} permit{} but this lock asks for {requested}: \
         every lock on one key must name the same permits",
        if *stored == 1 { "" } else { "s" }
    )]
    PermitsDisagree {
        url: String,
        stored: u32,
        requested: u32,
    },

    /// A fence was checked on a key whose record is another tool's lock or a value
    /// lockwarden does not recognise: it carries no lockwarden fence to compare with
    /// (`check-fence`, [`crate::check_fence`]).
    #[error(
        "{url}: cannot check fence {fence}: the key holds {found}, not a lockwarden lock \
         record, so no lockwarden fence is current on it"
    )]
    NotFenced {
        url: String,
        fence: FenceToken,
        found: String,
    },
}

/// Why a store was unavailable: any error, or words (`"…".into()`).
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// A cause with what was being done when it happened, shown as `{doing}: {source}`.
#[derive(Debug, thiserror::Error)]
#[error("{doing}: {source}")]
pub struct While {
    doing: String,
    #[source]
    source: Cause,
}

impl While {
    pub fn new(doing: impl Into<String>, source: impl Into<Cause>) -> While {
        While {
            doing: doing.into(),
            source: source.into(),
        }
    }
}

impl LockError {
    /// Whether retrying the same operation later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, LockError::Unavailable { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Conditions and logs show the same text as when the cause was a string, and the
    /// cause itself is still there for whoever walks the sources.
    #[test]
    fn an_unavailable_store_keeps_its_cause_as_the_source() {
        let inner = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let error = LockError::Unavailable {
            url: "zk://h:2181/l".into(),
            cause: While::new("cannot open a ZooKeeper session", inner).into(),
        };
        assert_eq!(
            error.to_string(),
            "zk://h:2181/l: backend unavailable: cannot open a ZooKeeper session: refused"
        );
        let cause = std::error::Error::source(&error).expect("the cause");
        assert_eq!(
            cause.to_string(),
            "cannot open a ZooKeeper session: refused"
        );
        let root = cause.source().expect("the client's own error");
        assert!(root.downcast_ref::<std::io::Error>().is_some(), "{root:?}");
        let words = LockError::Unavailable {
            url: "s3://b/k".into(),
            cause: "timed out".into(),
        };
        assert_eq!(
            words.to_string(),
            "s3://b/k: backend unavailable: timed out"
        );
    }
}

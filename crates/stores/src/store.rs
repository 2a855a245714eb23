//! What every store declares about its lock keys, and the errors they share. The stores
//! (`<store>/`) build on this file; the registry ([`super::registry`]) puts
//! them together. It names no store itself, so a store never depends on the list of
//! all stores.

use std::collections::BTreeMap;
use std::fmt;

use lockwarden_core::LockError;
use lockwarden_core::error::Cause;
use lockwarden_core::names::NameError;

/// One store's lock key, as its URL names it (`s3://BUCKET/KEY` is an S3 key).
///
/// A store implements this for its key type in `<store>/key.rs`; the registry's
/// [`Target`](super::Target) holds one of them and forwards to it.
pub trait StoreKey: Clone + fmt::Debug + fmt::Display + PartialEq + Eq + std::hash::Hash {
    /// `spec.backend`'s field for this store and `status.backend`: `s3`, `dynamodb`,
    /// `zookeeper`, `kubernetes`.
    const KIND: &'static str;
    /// The URL schemes a lock URL may use for this store, in lowercase; [`fmt::Display`]
    /// writes the first.
    const SCHEMES: &'static [&'static str];
    /// The URL's form, for messages and `--help` (`s3://BUCKET/KEY`).
    const FORM: &'static str;
    /// What such a lock is, for `--help`.
    const ABOUT: &'static str;

    /// Parses `rest`, what follows `scheme://` in `url` (which errors name), checking
    /// the store's name rules. Offline.
    fn parse(url: &str, rest: &str) -> Result<Self, TargetError>;

    /// The key, path or name whose last segment names the lock (`locks/db` of
    /// `s3://b/locks/db`).
    fn name(&self) -> &str;

    /// What names the lock in its store, without how the store is reached: the same
    /// for every client of one lock.
    fn order_key(&self) -> String {
        self.to_string()
    }

    /// Whether a lock lives only as long as its holder's session, rather than for its
    /// lease.
    fn is_session_bound(&self) -> bool {
        false
    }

    /// Whether a lock-delay (docs/design.md rule 8) can be stored in the lease every
    /// contender reads.
    fn supports_lock_delay(&self) -> bool {
        true
    }

    /// Whether a queued contender may ask for a priority or a weight (docs/design.md
    /// §6.4): the key's queue lives in its record and grants follow it.
    fn supports_priorities(&self) -> bool {
        true
    }

    /// Fields of `lockwarden lock`'s lock file that another tool reads for this key,
    /// written beside lockwarden's own (s3lock reads `Bucket`, `Key`, `Id`, `ETag`).
    fn lock_file_fields(&self, _nonce: &str, _version: &str) -> LockFileFields {
        LockFileFields::new()
    }

    /// Whether the fields of [`StoreKey::lock_file_fields`] read back from a lock file
    /// name this key; the error says what disagrees.
    fn check_lock_file_fields(&self, _fields: &LockFileFields) -> Result<(), LockFileMismatch> {
        Ok(())
    }
}

/// A lock file's fields beyond lockwarden's own, by name.
pub type LockFileFields = BTreeMap<String, serde_json::Value>;

/// A lock file's store fields that name another key than its URL.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{fields} do not match the url {url}")]
pub struct LockFileMismatch {
    /// The fields that disagree, as the other tool names them (`Bucket/Key`).
    pub fields: &'static str,
    pub url: String,
}

/// A malformed lock URL. Every message names the URL and the expected form.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("{url:?} is not a lock URL: expected {expected}")]
    NotAUrl { url: String, expected: String },

    #[error("{url:?}: unknown scheme {scheme:?}: expected {expected}")]
    UnknownScheme {
        url: String,
        scheme: String,
        expected: String,
    },

    #[error("{url:?}: {why}: expected {expected}")]
    Invalid {
        url: String,
        why: String,
        expected: &'static str,
    },
}

/// `url` is malformed: `why`; the store's form is `expected`.
pub fn invalid(url: &str, why: impl Into<String>, expected: &'static str) -> TargetError {
    TargetError::Invalid {
        url: url.to_string(),
        why: why.into(),
        expected,
    }
}

/// A name or key the store's rules refuse, in the URL's terms.
pub fn bad_name(url: &str, error: NameError, expected: &'static str) -> TargetError {
    invalid(url, error.to_string(), expected)
}

/// Splits `first/rest` at the first slash; both parts must be non-empty.
pub fn split_two<'a>(
    url: &str,
    rest: &'a str,
    first: &str,
    second: &str,
    expected: &'static str,
) -> Result<(&'a str, &'a str), TargetError> {
    match rest.split_once('/') {
        None if rest.is_empty() => Err(invalid(url, format!("no {first}"), expected)),
        None => Err(invalid(
            url,
            format!("no {second} after the {first}"),
            expected,
        )),
        Some(("", _)) => Err(invalid(url, format!("no {first}"), expected)),
        Some((_, "")) => Err(invalid(url, format!("empty {second}"), expected)),
        Some(parts) => Ok(parts),
    }
}

/// A backend that could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The store's Cargo feature was off when this was built (lockwarden-stores).
    #[error(
        "this lockwarden was built without its {store} store: enable lockwarden-stores' \"{store}\" feature"
    )]
    NotBuilt { store: &'static str },
    #[error(
        "{url}: no usable Kubernetes configuration (KUBECONFIG, ~/.kube/config or in-cluster service account): {cause}"
    )]
    Kubernetes {
        url: String,
        #[source]
        cause: Cause,
    },

    /// The store refused to be set up (a DynamoDB table that could not be created).
    #[error("{url}: {cause}")]
    Backend {
        url: String,
        #[source]
        cause: Cause,
    },

    #[error(transparent)]
    Lock(#[from] LockError),
}

/// One acquisition as a lock file records it: enough for a process that did not make
/// it to release it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedAcquisition {
    pub holder: String,
    pub nonce: String,
    /// The version the acquisition's last write produced.
    pub version: lockwarden_core::Version,
}

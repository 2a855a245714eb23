//! S3: one object per lock, every write a conditional PUT (docs/design.md §3 "S3").
//!
//! - create: `PUT If-None-Match: *`; takeover, renew, release: `PUT If-Match: <etag>`.
//! - The body is the JSON [`LockRecord`] with a fresh revision per write, so every
//!   write has a distinct ETag even on servers whose ETag is the body's MD5.
//! - A 409 `ConditionalRequestConflict`, a 5xx, a timeout or a dropped connection is
//!   an *indeterminate* outcome; the engine resolves it by re-reading (rule 4).
//! - Release writes a tombstone; deleting (optional) happens only after it, since
//!   several S3-compatible servers ignore `DELETE If-Match`.
//! - An object whose body is a bare UUID is a winebarrel/s3lock lock: it is read as
//!   held by s3lock, with no lease (s3lock locks never expire; only its unlock, which
//!   deletes the object, or a forced takeover ends them). s3lock in turn treats *any*
//!   object as held, a lockwarden tombstone included, so it can only acquire a key
//!   lockwarden released if lockwarden deletes on release
//!   ([`S3Options::s3lock_compatible`]).

//!
//! Modules: `key` (the URL `s3://BUCKET/KEY` and S3's name rules), `store`
//! ([`S3Store`]), `put` (its PUTs, signed without the SDK's orchestrator), `fenced`
//! (`FencedS3Object`, an object written only with fences), `connect` (the process's
//! clients); the last four with the `s3` feature, the
//! command line's `flags` with `cli`. Its part of a DistributedLock's spec is
//! lockwarden-api's.
//!
//! [`LockRecord`]: lockwarden_core::LockRecord

#[cfg(feature = "s3")]
mod connect;
#[cfg(feature = "s3")]
mod fenced;
#[cfg(feature = "cli")]
mod flags;
pub mod key;
#[cfg(feature = "s3")]
mod put;
#[cfg(feature = "s3")]
mod store;

#[cfg(feature = "s3")]
pub use connect::{
    IN_FLIGHT, client_config, client_request_gate, connect, connect_fenced, signed_puts,
};
#[cfg(feature = "s3")]
pub use fenced::{DELETED_METADATA, FENCE_METADATA, FencedS3Object, LOCK_METADATA};
#[cfg(feature = "cli")]
pub use flags::S3Flags;
pub use key::{BUCKET_MAX_LEN, BUCKET_MIN_LEN, KEY_MAX_BYTES, S3Key, bucket_name, object_key};
#[cfg(feature = "s3")]
pub use put::{PutTarget, SignedPuts};
#[cfg(feature = "s3")]
pub use store::{S3LOCK_LEASE, S3Store, parse_body, parse_state_lock_body};

/// How to reach S3 beyond the AWS options.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct S3Options {
    /// Path-style addressing. Default: on when a custom endpoint is configured
    /// (S3-compatible servers rarely have the wildcard DNS virtual-hosted addressing
    /// needs).
    pub force_path_style: Option<bool>,
    /// Delete the lock object after writing the release tombstone, so that
    /// winebarrel/s3lock clients (which treat any object as held) can acquire the key
    /// after lockwarden. The fence then restarts at 1 after every release.
    pub s3lock_compatible: bool,
    /// Hold a Terraform/OpenTofu state lock (`<state key>.tflock`) as those tools do
    /// (docs/design.md §6.8): the body a `LockInfo` they parse, the object deleted on
    /// release. Unfenced across releases (the fence restarts at 1) and unqueued.
    pub terraform_compatible: bool,
}

/// The tool whose clients poll this store's keys, for `--shared-with` (docs/design.md
/// §6.4, "Sharing a key with a tool that polls").
pub const POLLING_TOOL: crate::pollers::PollingTool = crate::pollers::PollingTool {
    name: "s3lock",
    store: <S3Key as crate::store::StoreKey>::KIND,
    default_period: std::time::Duration::from_secs(1),
    why: "s3lock's LockWaitInterval",
};

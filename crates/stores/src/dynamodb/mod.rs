//! DynamoDB: one item per lock, every write a conditional `UpdateItem`
//! (docs/design.md §3 "DynamoDB").
//!
//! Attribute names and formats are those of cirello.io/dynamolock (v2.0.3, read from
//! its source), so both exclude each other on a shared table: `key` (partition key,
//! name configurable), `ownerName`, `leaseDuration` (a Go duration string such as
//! `"30s"`), `recordVersionNumber` (changes on every write: it is the record's
//! version), `isReleased` and `data` (binary); plus lockwarden's `fence`, `nonce`,
//! `lockwardenRvn`, `acquiredAtMs`, `renewedAtMs`. `UpdateItem` (not `PutItem`) leaves
//! attributes other clients added — and those a newer lockwarden added, which this
//! build neither reads nor needs to carry (docs/design.md §3 "Stored formats that can
//! evolve"). A record's [`LockRecord::unknown`] fields (none when read from DynamoDB)
//! are written as attributes of their own.
//!
//! What dynamolock does that shapes this:
//! - It reads a lock as released when `isReleased` is *present*, whatever its value,
//!   and its acquire condition is `isReleased = "1"` (a string). So a held item has no
//!   `isReleased` at all, and a release writes `isReleased = "1"`.
//! - Its acquire is a `PutItem` that copies every attribute it does not know from the
//!   item it replaces, and its heartbeat only changes `leaseDuration` and
//!   `recordVersionNumber`. lockwarden's `nonce` and `fence` therefore survive a
//!   dynamolock acquisition: the fence stays monotonic across both clients (unless a
//!   dynamolock client deletes the item on release), but the nonce would wrongly
//!   still look like the last lockwarden holder's. `lockwardenRvn` is the
//!   `recordVersionNumber` of lockwarden's own last write: an item whose version
//!   differs from it was last written by another client, and is read as held (or
//!   released) by that client's `ownerName`, never as a lockwarden acquisition.

//!
//! Modules: `key` (the URL `dynamodb://TABLE/KEY` and DynamoDB's name rules), `store`
//! (`DynamoStore`), `update` (its writes, signed without the SDK's orchestrator),
//! `fenced` (`FencedDynamoItem`, an item written only with fences), `connect` (the
//! process's clients); the last four with the `dynamodb` feature, the
//! command line's `flags` with `cli`. Its part of a DistributedLock's spec is
//! lockwarden-api's.
//!
//! [`LockRecord::unknown`]: lockwarden_core::LockRecord::unknown

#[cfg(feature = "dynamodb")]
mod connect;
#[cfg(feature = "dynamodb")]
mod fenced;
#[cfg(feature = "cli")]
mod flags;
pub mod key;
#[cfg(feature = "dynamodb")]
mod store;
#[cfg(feature = "dynamodb")]
mod update;

#[cfg(feature = "dynamodb")]
pub use connect::{
    IN_FLIGHT, client_config, client_request_gate, connect, connect_fenced, signed_updates,
};
#[cfg(feature = "dynamodb")]
pub use fenced::{DELETED_ATTRIBUTE, FENCE_ATTRIBUTE, FencedDynamoItem, LOCK_ATTRIBUTE};
#[cfg(feature = "cli")]
pub use flags::DynamoDbFlags;
pub use key::{
    ATTRIBUTE_NAME_MAX_BYTES, DynamoDbKey, KEY_MAX_BYTES, SORT_KEY_MAX_BYTES, TABLE_MAX_LEN,
    TABLE_MIN_LEN, attribute_name, key_value, sort_key_value, table_name,
};
#[cfg(feature = "dynamodb")]
pub use store::{DynamoStore, TableLayout, parse_item};
#[cfg(feature = "dynamodb")]
pub use update::SignedUpdates;

/// The partition key attribute name lock items use unless configured otherwise (as
/// dynamolock).
pub const DEFAULT_PARTITION_KEY: &str = "key";

/// How lock items sit in their table, beyond the AWS options.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DynamoDbOptions {
    /// Partition key attribute name. Default `key` (as dynamolock).
    pub partition_key: Option<String>,
    /// Sort key attribute name and the value lock items use for it.
    pub sort_key: Option<(String, String)>,
    /// Create the table (on-demand billing) if it does not exist.
    pub create_table: bool,
    /// Hold an item of Terraform's/OpenTofu's DynamoDB lock table (partition key
    /// `LockID`) as those tools do (docs/design.md §6.8): its `Info` a `LockInfo` they
    /// parse, the item deleted on release. Unfenced across releases and unqueued.
    pub terraform_compatible: bool,
}

/// The tool whose clients poll this store's keys, for `--shared-with` (docs/design.md
/// §6.4, "Sharing a key with a tool that polls").
pub const POLLING_TOOL: crate::pollers::PollingTool = crate::pollers::PollingTool {
    name: "dynamolock",
    store: <DynamoDbKey as crate::store::StoreKey>::KIND,
    default_period: std::time::Duration::from_secs(1),
    why: "dynamolock's default refresh period for AcquireLock",
};

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
//! Modules: `key` (the URL `dynamodb://TABLE/KEY` and DynamoDB's name rules), `spec`
//! (`spec.backend.dynamodb` of a DistributedLock), `store` ([`DynamoStore`]), `fenced`
//! ([`FencedDynamoItem`], an item written only with fences).
//!
//! [`LockRecord::unknown`]: crate::lock::LockRecord::unknown

mod fenced;
mod key;
mod spec;
mod store;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use fenced::{DELETED_ATTRIBUTE, FENCE_ATTRIBUTE, FencedDynamoItem, LOCK_ATTRIBUTE};
pub use key::{
    ATTRIBUTE_NAME_MAX_BYTES, DynamoDbKey, KEY_MAX_BYTES, SORT_KEY_MAX_BYTES, TABLE_MAX_LEN,
    TABLE_MIN_LEN, attribute_name, key_value, sort_key_value, table_name,
};
pub use spec::{DynamoDbBackend, SortKey};
pub use store::{DEFAULT_PARTITION_KEY, DynamoStore, TableLayout, parse_item};

use crate::backend::aws::{
    AwsOptions, ClientCache, MAX_CACHED_CLIENTS, plain_http_client, sdk_config, service_endpoint,
};
use crate::backend::store::ConnectError;
use crate::fenced::FencedObject;
use crate::lock::{CasLock, LockBackend};

/// How lock items sit in their table, beyond the AWS options.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DynamoDbOptions {
    /// Partition key attribute name. Default `key` (as dynamolock).
    pub partition_key: Option<String>,
    /// Sort key attribute name and the value lock items use for it.
    pub sort_key: Option<(String, String)>,
    /// Create the table (on-demand billing) if it does not exist.
    pub create_table: bool,
}

/// The command line's DynamoDB flags; a lock file saves the key layout.
#[derive(clap::Args, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct DynamoDbFlags {
    /// DynamoDB partition key attribute name [default: key]
    #[arg(long, value_name = "NAME", value_parser = parse_attribute_name)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition_key: Option<String>,

    /// DynamoDB sort key: attribute name and the value lock items use
    #[arg(long, value_name = "NAME=VALUE", value_parser = parse_sort_key)]
    #[serde(skip_serializing_if = "Option::is_none", with = "name_equals_value")]
    pub sort_key: Option<(String, String)>,

    /// Create the DynamoDB table (on-demand billing) if it does not exist
    #[arg(long)]
    #[serde(skip)]
    pub create_table: bool,
}

impl DynamoDbFlags {
    /// These flags, falling back to `saved`'s key layout for anything not given.
    pub fn options(&self, saved: &DynamoDbFlags) -> DynamoDbOptions {
        DynamoDbOptions {
            partition_key: self
                .partition_key
                .clone()
                .or_else(|| saved.partition_key.clone()),
            sort_key: self.sort_key.clone().or_else(|| saved.sort_key.clone()),
            create_table: self.create_table,
        }
    }
}

fn parse_attribute_name(s: &str) -> Result<String, String> {
    attribute_name(s)
        .map_err(|e| format!("{s:?}: an attribute name has 1-255 characters ({e})"))?;
    Ok(s.to_string())
}

fn parse_sort_key(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() && !value.is_empty() => {
            sort_key_value(value).map_err(|e| format!("{s:?}: {e}"))?;
            Ok((parse_attribute_name(name)?, value.to_string()))
        }
        _ => Err(format!("{s:?}: expected NAME=VALUE, e.g. sk=lock")),
    }
}

/// A sort key as a lock file keeps it: `NAME=VALUE`.
mod name_equals_value {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        value: &Option<(String, String)>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some((name, value)) => serializer.serialize_str(&format!("{name}={value}")),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<(String, String)>, D::Error> {
        let text = Option::<String>::deserialize(deserializer)?;
        Ok(text.and_then(|s| {
            s.split_once('=')
                .map(|(n, v)| (n.to_string(), v.to_string()))
        }))
    }
}

/// The lock at `key`, on the process's DynamoDB client for `aws`; creates the table
/// first when asked to.
pub async fn connect(
    key: &DynamoDbKey,
    aws: &AwsOptions,
    options: &DynamoDbOptions,
) -> Result<Arc<dyn LockBackend>, ConnectError> {
    let client = client(aws).await;
    let layout = TableLayout {
        table: key.table.clone(),
        partition_key: options
            .partition_key
            .clone()
            .unwrap_or_else(|| DEFAULT_PARTITION_KEY.to_string()),
        sort_key: options.sort_key.clone(),
    };
    let store = DynamoStore::new(client, layout, key.key.clone());
    if options.create_table {
        store
            .ensure_table()
            .await
            .map_err(|e| ConnectError::Backend {
                url: key.to_string(),
                cause: e.to_string(),
            })?;
    }
    Ok(Arc::new(CasLock::new(store)))
}

/// The fenced item at `key` (`lockwarden put dynamodb://TABLE/KEY`): KEY is the
/// partition key value, `options.sort_key` the sort key's name and value where the
/// table has one (its key schema is read from DescribeTable on first use).
pub async fn connect_fenced(
    key: &DynamoDbKey,
    aws: &AwsOptions,
    options: &DynamoDbOptions,
) -> Box<dyn FencedObject> {
    let client = client(aws).await;
    Box::new(FencedDynamoItem::new(
        client,
        key.table.clone(),
        key.key.clone(),
        options.sort_key.clone(),
    ))
}

/// The process's DynamoDB clients, one per endpoint, region, credentials and timeout.
static CLIENTS: ClientCache<AwsOptions, aws_sdk_dynamodb::Client> =
    ClientCache::new(MAX_CACHED_CLIENTS);

async fn client(aws: &AwsOptions) -> aws_sdk_dynamodb::Client {
    CLIENTS
        .get_or_build(aws.clone(), || async {
            let sdk = sdk_config(aws).await;
            let endpoint = service_endpoint(&sdk, "AWS_ENDPOINT_URL_DYNAMODB");
            let mut config = aws_sdk_dynamodb::config::Builder::from(&sdk);
            if let Some(client) = plain_http_client(endpoint.as_deref()) {
                config = config.http_client(client);
            }
            aws_sdk_dynamodb::Client::from_conf(config.build())
        })
        .await
}

/// The tool whose clients poll this store's keys, for `--shared-with` (docs/design.md
/// §6.4, "Sharing a key with a tool that polls").
pub const POLLING_TOOL: crate::backend::pollers::PollingTool =
    crate::backend::pollers::PollingTool {
        name: "dynamolock",
        store: <DynamoDbKey as crate::backend::store::StoreKey>::KIND,
        default_period: std::time::Duration::from_secs(1),
        why: "dynamolock's default refresh period for AcquireLock",
    };

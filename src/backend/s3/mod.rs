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
//! Modules: `key` (the URL `s3://BUCKET/KEY` and S3's name rules), `spec`
//! (`spec.backend.s3` of a DistributedLock), `store` ([`S3Store`]), `fenced`
//! ([`FencedS3Object`], an object written only with fences).

mod fenced;
mod key;
mod spec;
mod store;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use fenced::{DELETED_METADATA, FENCE_METADATA, FencedS3Object, LOCK_METADATA};
pub use key::{BUCKET_MAX_LEN, BUCKET_MIN_LEN, KEY_MAX_BYTES, S3Key, bucket_name, object_key};
pub use spec::S3Backend;
pub use store::{S3LOCK_LEASE, S3Store, parse_body};

use crate::backend::aws::{
    AwsOptions, ClientCache, MAX_CACHED_CLIENTS, plain_http_client, sdk_config, service_endpoint,
};
use crate::backend::store::ConnectError;
use crate::fenced::FencedObject;
use crate::lock::{CasLock, LockBackend};

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
}

/// The command line's S3 flags; a lock file saves them.
#[derive(clap::Args, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct S3Flags {
    /// S3 path-style addressing (on by default when a custom endpoint is set)
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub path_style: bool,

    /// S3: delete the object on release, so winebarrel/s3lock clients can lock the key
    /// after us (the fencing token then restarts at 1 after each release)
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub s3lock_compatible: bool,
}

impl S3Flags {
    /// These flags, or `saved`'s where set.
    pub fn options(&self, saved: &S3Flags) -> S3Options {
        S3Options {
            force_path_style: (self.path_style || saved.path_style).then_some(true),
            s3lock_compatible: self.s3lock_compatible || saved.s3lock_compatible,
        }
    }
}

/// The lock at `key`, on the process's S3 client for `aws` and `s3`.
pub async fn connect(
    key: &S3Key,
    aws: &AwsOptions,
    s3: &S3Options,
) -> Result<Arc<dyn LockBackend>, ConnectError> {
    let client = client(aws, s3).await;
    Ok(Arc::new(
        CasLock::new(S3Store::new(client, key.bucket.clone(), key.key.clone()))
            .with_delete_on_release(s3.s3lock_compatible),
    ))
}

/// The fenced object at `key` (`lockwarden put s3://BUCKET/KEY`), on the process's S3
/// client for `aws` and `s3`.
pub async fn connect_fenced(
    key: &S3Key,
    aws: &AwsOptions,
    s3: &S3Options,
) -> Box<dyn FencedObject> {
    let client = client(aws, s3).await;
    Box::new(FencedS3Object::new(
        client,
        key.bucket.clone(),
        key.key.clone(),
    ))
}

/// The process's S3 clients, one per endpoint, region, credentials, timeout and
/// addressing style.
static CLIENTS: ClientCache<(AwsOptions, Option<bool>), aws_sdk_s3::Client> =
    ClientCache::new(MAX_CACHED_CLIENTS);

async fn client(aws: &AwsOptions, s3: &S3Options) -> aws_sdk_s3::Client {
    let key = (aws.clone(), s3.force_path_style);
    CLIENTS
        .get_or_build(key, || async {
            let sdk = sdk_config(aws).await;
            let endpoint = service_endpoint(&sdk, "AWS_ENDPOINT_URL_S3");
            let path_style = s3.force_path_style.unwrap_or(endpoint.is_some());
            let mut config = aws_sdk_s3::config::Builder::from(&sdk).force_path_style(path_style);
            if let Some(client) = plain_http_client(endpoint.as_deref()) {
                config = config.http_client(client);
            }
            aws_sdk_s3::Client::from_conf(config.build())
        })
        .await
}

/// The tool whose clients poll this store's keys, for `--shared-with` (docs/design.md
/// §6.4, "Sharing a key with a tool that polls").
pub const POLLING_TOOL: crate::backend::pollers::PollingTool =
    crate::backend::pollers::PollingTool {
        name: "s3lock",
        store: <S3Key as crate::backend::store::StoreKey>::KIND,
        default_period: std::time::Duration::from_secs(1),
        why: "s3lock's LockWaitInterval",
    };

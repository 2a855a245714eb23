//! Fenced writes (`lockwarden::fenced`, `lockwarden put/get/delete`) against real
//! servers on loopback: the store itself refuses a stale fence.
//!
//! - `race`: 8 writers with increasing fences race on one object, round after round
//!   (`LOCKWARDEN_FENCED_ROUNDS`, default 100), on S3 (moto-atomic with bucket
//!   versioning; not versitygw, see `race.rs`) and DynamoDB (moto-atomic, dynalite):
//!   the stored fence never
//!   decreases, every refused write was below the stored fence, and with versioning
//!   every acknowledged write is a version, in increasing fence order.
//! - `objects`: tombstones, other attributes kept, composite keys, lock records and
//!   another lock's fence refused.
//! - `command_line`: `put`, `get`, `delete` as a user runs them.

mod command_line;
mod objects;
mod race;
use lockwarden_testsupport as support;

use lockwarden::backend::{FencedDynamoItem, FencedS3Object};
use lockwarden::fenced::Fence;

/// The lock whose fences the library tests write with (nothing needs to hold it: a
/// `FencedObject` compares fences; the CLI tests take their locks, since `put` checks
/// that the lock issued the fence).
const LOCK: &str = "s3://locks/fenced-test";

fn fence(token: u64) -> Fence {
    Fence::new(token, LOCK)
}

async fn s3_object(endpoint: &str, bucket: &str, key: &str) -> FencedS3Object {
    FencedS3Object::new(support::moto::s3_client_for(endpoint).await, bucket, key)
}

async fn dynamo_item(
    endpoint: &str,
    table: &str,
    key: &str,
    sort_key: Option<(&str, &str)>,
) -> FencedDynamoItem {
    FencedDynamoItem::new(
        support::moto::dynamodb_client_for(endpoint).await,
        table,
        key,
        sort_key.map(|(n, v)| (n.to_string(), v.to_string())),
    )
}

//! One fenced object at a time on the shared servers: tombstones, other attributes,
//! composite keys, lock records and another lock's fence.

use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};
use aws_sdk_s3::primitives::ByteStream;
use lockwarden::fenced::{Content, Fence, FencedError, FencedObject, FencedRead};
use lockwarden::lock::{AcquireRequest, Wait, acquire};
use serde_json::{Value, json};

use super::support::keys::Key;
use super::support::moto::{
    Moto, dynamodb_client_for, new_table_at, put_item, put_object, s3_client_for,
};
use super::support::unique;
use super::{LOCK, dynamo_item, fence, s3_object};

fn data(read: Option<FencedRead>) -> (u64, Vec<u8>) {
    let read = read.expect("an object");
    let token = read.written_by.expect("a fence").token.0;
    match read.content {
        Content::Data(d) => (token, d),
        Content::Deleted => panic!("deleted by fence {token}"),
    }
}

fn deleted_by(read: Option<FencedRead>) -> u64 {
    let read = read.expect("an object");
    assert_eq!(read.content, Content::Deleted);
    read.written_by.expect("a fence").token.0
}

fn assert_stale(result: Result<impl std::fmt::Debug, FencedError>, stored: u64, yours: u64) {
    match result {
        Err(e @ FencedError::Stale { .. }) => {
            let expected =
                format!("stale fence: object written by fence {stored}, yours is {yours}");
            let expected_deleted =
                format!("stale fence: object deleted by fence {stored}, yours is {yours}");
            let shown = e.to_string();
            assert!(shown == expected || shown == expected_deleted, "{shown}");
        }
        other => panic!("expected a stale fence {yours} < {stored}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_a_tombstone_keeps_a_stale_holder_from_recreating_the_object() {
    let moto = Moto::shared();
    let bucket = moto.new_bucket("fenced").await;
    let key = unique("data/report");
    let object = s3_object(&moto.endpoint(), &bucket, &key).await;

    object.put(&fence(5), b"v5").await.unwrap();
    assert_eq!(data(object.get().await.unwrap()), (5, b"v5".to_vec()));
    object.put(&fence(5), b"v5 again").await.unwrap();
    assert_stale(object.put(&fence(4), b"v4").await, 5, 4);
    assert_stale(object.delete(&fence(4)).await, 5, 4);

    object.delete(&fence(6)).await.unwrap();
    assert_eq!(deleted_by(object.get().await.unwrap()), 6);
    let err = object.put(&fence(5), b"stale").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "stale fence: object deleted by fence 6, yours is 5"
    );
    // What a stale holder's own create would be: refused, the tombstone is there.
    let s3 = s3_client_for(&moto.endpoint()).await;
    let recreate = put_object(&s3, &bucket, &key, ByteStream::from_static(b"stale"))
        .if_none_match("*")
        .send()
        .await;
    assert!(
        recreate.is_err(),
        "If-None-Match: * over a tombstone: {recreate:?}"
    );
    assert_eq!(deleted_by(object.get().await.unwrap()), 6);

    // The current holder may bring it back.
    object.put(&fence(7), b"v7").await.unwrap();
    assert_eq!(data(object.get().await.unwrap()), (7, b"v7".to_vec()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_another_locks_fence_is_refused_and_an_unfenced_object_is_adopted() {
    let moto = Moto::shared();
    let bucket = moto.new_bucket("fenced").await;
    let key = unique("data/x");
    let s3 = s3_client_for(&moto.endpoint()).await;
    let unfenced = ByteStream::from_static(b"written before fencing");
    put_object(&s3, &bucket, &key, unfenced)
        .send()
        .await
        .unwrap();
    let object = s3_object(&moto.endpoint(), &bucket, &key).await;
    let read = object.get().await.unwrap().unwrap();
    assert_eq!(read.written_by, None);
    object.put(&fence(3), b"v3").await.unwrap();

    let other = Fence::new(9, "s3://locks/another-lock");
    let err = object.put(&other, b"other").await.unwrap_err();
    assert!(matches!(err, FencedError::OtherLock { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!("fenced by lock {LOCK}: a write fenced by lock s3://locks/another-lock is refused")
    );
    assert!(object.delete(&other).await.is_err());
    assert_eq!(data(object.get().await.unwrap()), (3, b"v3".to_vec()));
}

/// With `key`'s lock held, every operation of `object` (that lock's record, opened as
/// a fenced object; `data` to write over it) is refused as a lock record, and the
/// record is left as it was.
async fn assert_a_lock_record_is_refused(key: &Key, object: impl FencedObject, data: &[u8]) {
    let lock = key.handle().await;
    let holder = AcquireRequest::new("holder", Duration::from_secs(60));
    acquire(lock.as_ref(), &holder, Wait::No).await.unwrap();
    let before = lock.inspect().await.unwrap().unwrap().version;
    for result in [
        object.put(&fence(99), data).await.map(|_| ()),
        object.delete(&fence(99)).await.map(|_| ()),
        object.get().await.map(|_| ()),
    ] {
        let err = result.unwrap_err();
        assert!(matches!(err, FencedError::LockRecord { .. }), "{err:?}");
        assert!(err.to_string().contains("lock record"), "{err}");
    }
    assert_eq!(lock.inspect().await.unwrap().unwrap().version, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_a_lock_record_is_refused_and_left_alone() {
    let moto = Moto::shared();
    let key = Key::s3_on(moto).await;
    let Key::S3 {
        bucket, key: name, ..
    } = &key
    else {
        unreachable!()
    };
    let object = s3_object(&moto.endpoint(), bucket, name).await;
    assert_a_lock_record_is_refused(&key, object, b"over the lock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_a_write_sets_only_its_attributes_and_a_tombstone_blocks_a_stale_recreate() {
    let endpoint = Moto::shared().endpoint();
    let table = new_table_at(&endpoint, "fenced", "pk").await;
    let key = unique("item");
    let client = dynamodb_client_for(&endpoint).await;
    let item = [
        ("pk", AttributeValue::S(key.clone())),
        ("keep", AttributeValue::S("another writer's".into())),
    ];
    put_item(&client, &table, item).send().await.unwrap();
    let item = dynamo_item(&endpoint, &table, &key, None).await;

    item.put(&fence(1), br#"{"count":{"N":"3"},"state":{"S":"running"}}"#)
        .await
        .unwrap();
    item.put(&fence(2), br#"{"state":{"S":"done"}}"#)
        .await
        .unwrap();
    let (token, stored) = data(item.get().await.unwrap());
    assert_eq!(token, 2);
    let stored: Value = serde_json::from_slice(&stored).unwrap();
    assert_eq!(
        stored,
        json!({"count": {"N": "3"}, "state": {"S": "done"}, "keep": {"S": "another writer's"}})
    );
    assert_stale(
        item.put(&fence(1), br#"{"state":{"S":"stale"}}"#).await,
        2,
        1,
    );

    item.delete(&fence(3)).await.unwrap();
    assert_eq!(deleted_by(item.get().await.unwrap()), 3);
    let raw = client
        .get_item()
        .table_name(&table)
        .key("pk", AttributeValue::S(key.clone()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .unwrap();
    let mut names: Vec<&str> = raw.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(names, ["fence", "fenceDeleted", "fenceLock", "pk"]);
    assert_stale(
        item.put(&fence(2), br#"{"state":{"S":"stale"}}"#).await,
        3,
        2,
    );
    item.put(&fence(4), br#"{"state":{"S":"again"}}"#)
        .await
        .unwrap();
    let (token, stored) = data(item.get().await.unwrap());
    assert_eq!(
        (token, serde_json::from_slice::<Value>(&stored).unwrap()),
        (4, json!({"state": {"S": "again"}}))
    );

    let other = Fence::new(10, "dynamodb://locks/another");
    let err = item
        .put(&other, br#"{"state":{"S":"x"}}"#)
        .await
        .unwrap_err();
    assert!(matches!(err, FencedError::OtherLock { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_composite_keys_take_the_sort_key_value_from_the_flag() {
    let endpoint = Moto::shared().endpoint();
    let client = dynamodb_client_for(&endpoint).await;
    let table = unique("fenced-composite");
    let definition = |name: &str, kind| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(kind)
            .build()
            .unwrap()
    };
    let element = |name: &str, kind| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
            .unwrap()
    };
    client
        .create_table()
        .table_name(&table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(definition("tenant", ScalarAttributeType::S))
        .attribute_definitions(definition("version", ScalarAttributeType::N))
        .key_schema(element("tenant", KeyType::Hash))
        .key_schema(element("version", KeyType::Range))
        .send()
        .await
        .unwrap();

    let item = dynamo_item(&endpoint, &table, "acme", Some(("version", "7"))).await;
    item.put(&fence(1), br#"{"state":{"S":"v7"}}"#)
        .await
        .unwrap();
    let other = dynamo_item(&endpoint, &table, "acme", Some(("version", "8"))).await;
    other
        .put(&fence(1), br#"{"state":{"S":"v8"}}"#)
        .await
        .unwrap();
    let stored = client
        .get_item()
        .table_name(&table)
        .key("tenant", AttributeValue::S("acme".into()))
        .key("version", AttributeValue::N("7".into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .expect("the item at version 7");
    assert_eq!(stored["state"], AttributeValue::S("v7".into()));

    for (sort_key, expect) in [
        (None, "give its value with --sort-key version=VALUE"),
        (Some(("sk", "1")), "the table's sort key is \"version\""),
        (Some(("version", "seven")), "is a number"),
    ] {
        let wrong = dynamo_item(&endpoint, &table, "acme", sort_key).await;
        let err = wrong
            .put(&fence(2), br#"{"a":{"S":"b"}}"#)
            .await
            .unwrap_err();
        assert!(err.to_string().contains(expect), "{sort_key:?}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_a_lock_item_is_refused_and_left_alone() {
    let key = Key::dynamo_on(Moto::shared()).await;
    let Key::Dynamo {
        endpoint,
        table,
        key: name,
    } = &key
    else {
        unreachable!()
    };
    let object = dynamo_item(endpoint, table, name, None).await;
    assert_a_lock_record_is_refused(&key, object, br#"{"a":{"S":"b"}}"#).await;
}

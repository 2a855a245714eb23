//! 8 writers race on one object, round after round. In round `r` the writers carry
//! the fences `8r+1 ..= 8r+8`, all above every fence of the rounds before, so each
//! round is a real race (any of them may land first) whose outcome is checked:
//!
//! - a reader polling the object all along never sees its fence decrease, and always
//!   sees the data of the fence that is stored (data and fence are one write);
//! - every refused write was told of a stored fence above its own;
//! - the round's highest fence is always acknowledged and is what is stored after it;
//! - S3 with bucket versioning: the versions are exactly the acknowledged writes, in
//!   increasing fence order (no write ever landed below a fence already stored).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_s3::types::{BucketVersioningStatus, VersioningConfiguration};
use lockwarden::fenced::{Content, FencedError, FencedObject};
use tokio::sync::Barrier;

use super::support::dynalite::Dynalite;
use super::support::moto::{new_bucket_at, new_table_at, s3_client_for};
use super::support::stores::{Choice, race_rounds};
use super::support::unique;
use super::{dynamo_item, fence, s3_object};

const WRITERS: u64 = 8;

/// What the writes of every round came to.
#[derive(Default)]
struct Tally {
    /// Acknowledged writes: fence and the version the store gave.
    acked: Vec<(u64, Option<String>)>,
    refused: usize,
    reads: usize,
}

/// The fence a body says it was written with.
type Embedded = fn(&[u8]) -> u64;

async fn race(
    server: &str,
    writers: Vec<Arc<dyn FencedObject>>,
    reader: Arc<dyn FencedObject>,
    body: fn(u64, u64) -> Vec<u8>,
    embedded: Embedded,
) -> Tally {
    let started = Instant::now();
    let rounds: u64 = race_rounds("LOCKWARDEN_FENCED_ROUNDS");
    let done = Arc::new(AtomicBool::new(false));
    // The reader: the stored fence never goes down, and the data is that fence's.
    let polling = {
        let (reader, done) = (reader.clone(), done.clone());
        let server = server.to_string();
        tokio::spawn(async move {
            let (mut highest, mut reads) = (0, 0);
            while !done.load(Ordering::Relaxed) {
                if let Some(read) = reader.get().await.expect("read while racing") {
                    let stored = read.written_by.expect("a fenced object").token.0;
                    assert!(
                        stored >= highest,
                        "{server}: the stored fence went down from {highest} to {stored}"
                    );
                    let Content::Data(data) = read.content else {
                        panic!("{server}: a tombstone, nobody deleted")
                    };
                    assert_eq!(
                        embedded(&data),
                        stored,
                        "{server}: data of another fence than the stored one"
                    );
                    highest = stored;
                    reads += 1;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            reads
        })
    };
    let mut tally = Tally::default();
    for round in 0..rounds {
        let barrier = Arc::new(Barrier::new(WRITERS as usize));
        let tasks: Vec<_> = writers
            .iter()
            .enumerate()
            .map(|(writer, object)| {
                let (object, barrier) = (object.clone(), barrier.clone());
                let token = round * WRITERS + writer as u64 + 1;
                tokio::spawn(async move {
                    barrier.wait().await;
                    (token, object.put(&fence(token), &body(round, token)).await)
                })
            })
            .collect();
        for task in tasks {
            match task.await.expect("writer task") {
                (token, Ok(written)) => tally.acked.push((token, written.version)),
                (
                    token,
                    Err(FencedError::Stale {
                        stored,
                        yours,
                        deleted,
                    }),
                ) => {
                    assert_eq!(yours.0, token);
                    assert!(!deleted, "{server}: a tombstone, nobody deleted");
                    assert!(
                        stored > yours,
                        "{server}: round {round}: fence {token} refused as stale by {stored}"
                    );
                    tally.refused += 1;
                }
                (token, Err(e)) => panic!("{server}: round {round}: fence {token}: {e}"),
            }
        }
        let highest = (round + 1) * WRITERS;
        assert!(
            tally.acked.iter().any(|(f, _)| *f == highest),
            "{server}: round {round}: the highest fence {highest} was not acknowledged"
        );
        let stored = reader.get().await.unwrap().unwrap().written_by.unwrap();
        assert_eq!(stored.token.0, highest, "{server}: round {round}");
    }
    done.store(true, Ordering::Relaxed);
    tally.reads = polling.await.expect("the reader saw the fence go down");
    eprintln!(
        "{server}: {rounds} rounds of {WRITERS} writers in {:.1?}: {} acknowledged, {} refused \
         as stale, {} reads while racing",
        started.elapsed(),
        tally.acked.len(),
        tally.refused,
        tally.reads
    );
    assert_eq!(
        tally.acked.len() + tally.refused,
        (rounds * WRITERS) as usize
    );
    tally
}

fn s3_body(round: u64, token: u64) -> Vec<u8> {
    format!("fence={token} round={round}\n").into_bytes()
}

fn s3_embedded(data: &[u8]) -> u64 {
    let text = String::from_utf8_lossy(data);
    text.strip_prefix("fence=")
        .and_then(|t| t.split(' ').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("not a racing writer's body: {text:?}"))
}

/// Every writer has a client of its own (its own connections), as separate
/// processes would.
async fn s3_race(server: &str, endpoint: &str, versioning: bool) {
    let bucket = new_bucket_at(endpoint, "fenced-race").await;
    let key = unique("data/race");
    let client = s3_client_for(endpoint).await;
    if versioning {
        client
            .put_bucket_versioning()
            .bucket(&bucket)
            .versioning_configuration(
                VersioningConfiguration::builder()
                    .status(BucketVersioningStatus::Enabled)
                    .build(),
            )
            .send()
            .await
            .expect("enable bucket versioning");
    }
    let mut writers: Vec<Arc<dyn FencedObject>> = Vec::new();
    for _ in 0..WRITERS {
        writers.push(Arc::new(s3_object(endpoint, &bucket, &key).await));
    }
    let reader: Arc<dyn FencedObject> = Arc::new(s3_object(endpoint, &bucket, &key).await);
    let tally = race(server, writers, reader, s3_body, s3_embedded).await;
    if !versioning {
        return;
    }
    // The versions, newest first as S3 lists them.
    let mut versions = Vec::new();
    let (mut key_marker, mut version_marker) = (None, None);
    loop {
        let page = client
            .list_object_versions()
            .bucket(&bucket)
            .prefix(&key)
            .set_key_marker(key_marker.clone())
            .set_version_id_marker(version_marker.clone())
            .send()
            .await
            .expect("list object versions");
        versions.extend(page.versions().iter().cloned());
        if page.is_truncated() != Some(true) {
            break;
        }
        key_marker = page.next_key_marker().map(str::to_string);
        version_marker = page.next_version_id_marker().map(str::to_string);
    }
    assert_eq!(
        versions.first().and_then(|v| v.is_latest()),
        Some(true),
        "{server}: the newest version is not listed first"
    );
    let fence_of: HashMap<&str, u64> = tally
        .acked
        .iter()
        .map(|(f, etag)| (etag.as_deref().expect("an ETag"), *f))
        .collect();
    assert_eq!(fence_of.len(), tally.acked.len(), "{server}: ETags repeat");
    let fences: Vec<u64> = versions
        .iter()
        .rev()
        .map(|v| {
            let etag = v.e_tag().unwrap_or_default();
            *fence_of
                .get(etag)
                .unwrap_or_else(|| panic!("{server}: version {etag} was never acknowledged"))
        })
        .collect();
    assert_eq!(
        fences.len(),
        tally.acked.len(),
        "{server}: versions are not the acknowledged writes"
    );
    assert!(
        fences.windows(2).all(|w| w[0] <= w[1]),
        "{server}: versions out of fence order: {fences:?}"
    );
    eprintln!(
        "{server}: {} versions, every acknowledged write, in increasing fence order",
        fences.len()
    );
}

/// moto answers one request at a time (moto-atomic): a server of its own, so that the
/// race neither waits for the other tests nor slows them down.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_moto_racing_writers_never_lower_the_fence_and_every_write_is_a_version() {
    let own = Choice::Moto.start();
    s3_race("moto", &own.endpoint(), true).await;
}

// versitygw is not raced here. It passes the If-Match canary (`tests/canary.rs`), but
// this race, run with the whole binary on the loaded 2-core machine, failed in 1 of 4
// runs (100 rounds each): the polling reader saw the stored fence go down (221, then
// 220). A fenced write relies on a HEAD answering the ETag and the metadata of one and
// the same version; versitygw's posix backend keeps both in separate extended
// attributes, so the suspected cause is a HEAD that mixes a new ETag with the previous
// version's fence (not confirmed). Real S3 and moto-atomic give one version per answer.

fn dynamo_body(round: u64, token: u64) -> Vec<u8> {
    format!(r#"{{"writtenWith":{{"N":"{token}"}},"round":{{"N":"{round}"}}}}"#).into_bytes()
}

fn dynamo_embedded(data: &[u8]) -> u64 {
    let value: serde_json::Value = serde_json::from_slice(data).expect("DynamoDB JSON");
    value["writtenWith"]["N"]
        .as_str()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a racing writer's item: {value}"))
}

async fn dynamo_race(server: &str, endpoint: &str) {
    let table = new_table_at(endpoint, "fenced-race", "pk").await;
    let key = unique("race");
    let mut writers: Vec<Arc<dyn FencedObject>> = Vec::new();
    for _ in 0..WRITERS {
        writers.push(Arc::new(dynamo_item(endpoint, &table, &key, None).await));
    }
    let reader: Arc<dyn FencedObject> = Arc::new(dynamo_item(endpoint, &table, &key, None).await);
    race(server, writers, reader, dynamo_body, dynamo_embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamodb_moto_racing_writers_never_lower_the_fence() {
    let own = Choice::Moto.start();
    dynamo_race("moto", &own.endpoint()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamodb_dynalite_racing_writers_never_lower_the_fence() {
    dynamo_race("dynalite", &Dynalite::shared().endpoint()).await;
}

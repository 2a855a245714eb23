//! Emulator canary: is the test server's conditional write atomic?
//!
//! Every lock test trusts that when N clients race one conditional write, exactly
//! one wins. An emulator that checks the condition and then writes without holding a
//! lock in between would let two clients "acquire" the same lock, and lock tests
//! would then fail (or pass) for the emulator's reasons, not ours. So: 8 writers race
//! on one key, round after round, and any round without exactly one winner fails
//! with a message naming the operation the emulator does not make atomic.
//!
//! The same races run against every server a test or benchmark may use: moto (as
//! `scripts/moto-atomic` serializes it; `LOCKWARDEN_MOTO_UNSERIALIZED=1` shows plain
//! moto failing), versitygw (S3) and dynalite (DynamoDB) — one module per server.
//!
//! Rounds: `LOCKWARDEN_CANARY_ROUNDS` (default 100).

use lockwarden_testsupport as support;

use std::sync::Arc;
use std::time::Instant;

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_s3::primitives::ByteStream;
use tokio::sync::Barrier;

use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::operation::put_object::builders::PutObjectFluentBuilder;
use support::dynalite::Dynalite;
use support::moto::{Moto, put_item, put_object};
use support::stores::race_rounds;
use support::unique;
use support::versitygw::VersityGw;

const WRITERS: usize = 8;

/// How one racing write ended.
#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    /// The write was accepted; carries what the winner needs to check the stored state
    /// (S3: the new ETag).
    Won(String),
    /// The condition failed (S3 412, DynamoDB ConditionalCheckFailed).
    Lost,
    /// S3 409 ConditionalRequestConflict: the server refused because of a concurrent
    /// conditional write. Not a win; real S3 answers this too.
    Conflict,
}

#[derive(Default)]
struct Tally {
    lost: usize,
    conflicts: usize,
}

/// Runs `rounds` rounds of `WRITERS` concurrent writes. `write(round, writer)` does
/// one write; the writers of a round are released together by a barrier. `verify`
/// gets the round's winner and checks the stored state. Panics on any round without
/// exactly one winner.
async fn race<W, WF, V, VF>(server: &str, operation: &str, write: W, verify: V) -> Tally
where
    W: Fn(usize, usize) -> WF + Send + Sync + 'static,
    WF: std::future::Future<Output = Result<Outcome, String>> + Send,
    V: Fn(usize, usize, String) -> VF,
    VF: std::future::Future<Output = ()>,
{
    let write = Arc::new(write);
    let rounds: usize = race_rounds("LOCKWARDEN_CANARY_ROUNDS");
    let mut tally = Tally::default();
    let began = Instant::now();
    for round in 0..rounds {
        let barrier = Arc::new(Barrier::new(WRITERS));
        let tasks: Vec<_> = (0..WRITERS)
            .map(|writer| {
                let write = write.clone();
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    write(round, writer).await
                })
            })
            .collect();
        let mut outcomes = Vec::with_capacity(WRITERS);
        for task in tasks {
            let outcome = task
                .await
                .expect("writer task")
                .unwrap_or_else(|e| panic!("{operation}: round {round}: unexpected error: {e}"));
            outcomes.push(outcome);
        }
        let winners: Vec<(usize, String)> = outcomes
            .iter()
            .enumerate()
            .filter_map(|(w, o)| match o {
                Outcome::Won(tag) => Some((w, tag.clone())),
                _ => None,
            })
            .collect();
        assert!(
            winners.len() == 1,
            "{server} is not atomic for {operation}: round {round} of {rounds} had {} winners \
             among {WRITERS} concurrent conditional writes (outcomes: {outcomes:?}); lock tests \
             against it cannot be trusted",
            winners.len()
        );
        tally.lost += outcomes.iter().filter(|o| **o == Outcome::Lost).count();
        tally.conflicts += outcomes.iter().filter(|o| **o == Outcome::Conflict).count();
        let (writer, tag) = winners.into_iter().next().unwrap();
        verify(round, writer, tag).await;
    }
    eprintln!(
        "[canary] {server}: {operation}: {rounds} rounds x {WRITERS} writers in {:?}: exactly one winner \
         every round; {} lost (412/condition failed), {} conflicts (409)",
        began.elapsed(),
        tally.lost,
        tally.conflicts
    );
    tally
}

/// One racing PutObject of `writer`'s body for `round`, made conditional by `condition`.
async fn s3_racing_put(
    s3: &aws_sdk_s3::Client,
    (bucket, key): (&str, &str),
    (round, writer): (usize, usize),
    condition: impl FnOnce(PutObjectFluentBuilder) -> PutObjectFluentBuilder,
) -> Result<Outcome, String> {
    let put = put_object(s3, bucket, key, body(round, writer).into_bytes());
    match condition(put).send().await {
        Ok(out) => Ok(Outcome::Won(out.e_tag().unwrap_or_default().to_string())),
        Err(e) => s3_loss(e),
    }
}

/// Classifies an S3 PutObject error: 412 and 409 are expected losses, the rest are
/// test failures.
fn s3_loss(
    err: aws_sdk_s3::error::SdkError<aws_sdk_s3::operation::put_object::PutObjectError>,
) -> Result<Outcome, String> {
    match err.raw_response().map(|r| r.status().as_u16()) {
        Some(412) => Ok(Outcome::Lost),
        Some(409) => Ok(Outcome::Conflict),
        _ => Err(format!("{err:?}")),
    }
}

fn body(round: usize, writer: usize) -> String {
    format!("round {round} writer {writer}")
}

/// Separate clients (and so separate connection pools) per writer, so that the
/// writes reach the server on parallel connections.
/// `client()` builds one without retries: a retried write could turn one attempt's win
/// into a loss and hide (or fake) a double win.
async fn per_writer<C>(client: impl AsyncFn() -> C) -> Arc<Vec<C>> {
    let mut clients = Vec::new();
    for _ in 0..WRITERS {
        clients.push(client().await);
    }
    Arc::new(clients)
}

async fn s3_clients(endpoint: &str) -> Arc<Vec<aws_sdk_s3::Client>> {
    per_writer(async || {
        let config = support::moto::s3_config_for(endpoint).await;
        aws_sdk_s3::Client::from_conf(config.retry_config(RetryConfig::disabled()).build())
    })
    .await
}

async fn s3_body(s3: &aws_sdk_s3::Client, bucket: &str, key: &str) -> (String, String) {
    let got = s3
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .expect("GetObject");
    let etag = got.e_tag().unwrap_or_default().to_string();
    let bytes = got.body.collect().await.expect("object body").into_bytes();
    (String::from_utf8_lossy(&bytes).into_owned(), etag)
}

async fn s3_put_if_none_match_has_exactly_one_winner(server: &str, endpoint: &str) {
    let bucket = support::moto::new_bucket_at(endpoint, "canary").await;
    let clients = s3_clients(endpoint).await;
    let prefix = unique("create");

    let (b, p, c) = (bucket.clone(), prefix.clone(), clients.clone());
    let write = move |round: usize, writer: usize| {
        let (bucket, key, s3) = (b.clone(), format!("{p}/{round}"), c[writer].clone());
        async move {
            let create = |put: PutObjectFluentBuilder| put.if_none_match("*");
            s3_racing_put(&s3, (&bucket, &key), (round, writer), create).await
        }
    };
    let verify = |round: usize, writer: usize, _etag: String| {
        let (s3, bucket, key) = (
            clients[0].clone(),
            bucket.clone(),
            format!("{prefix}/{round}"),
        );
        async move {
            let (stored, _) = s3_body(&s3, &bucket, &key).await;
            assert_eq!(
                stored,
                body(round, writer),
                "{server} is not atomic for S3 PutObject If-None-Match: round {round}: the stored \
                 object is not the winner's"
            );
        }
    };
    race(server, "S3 PutObject If-None-Match: *", write, verify).await;
}

async fn s3_put_if_match_has_exactly_one_winner(server: &str, endpoint: &str) {
    let bucket = support::moto::new_bucket_at(endpoint, "canary").await;
    let clients = s3_clients(endpoint).await;
    let key = unique("swap");

    let first = put_object(
        &clients[0],
        &bucket,
        &key,
        ByteStream::from_static(b"initial"),
    )
    .send()
    .await
    .expect("create the object the writers race on");
    // The ETag every writer of the current round conditions on: the last winner's.
    let current = Arc::new(std::sync::Mutex::new(
        first.e_tag().expect("ETag").to_string(),
    ));

    let (b, k, c, cur) = (
        bucket.clone(),
        key.clone(),
        clients.clone(),
        current.clone(),
    );
    let write = move |round: usize, writer: usize| {
        let (bucket, key, s3) = (b.clone(), k.clone(), c[writer].clone());
        let etag = cur.lock().unwrap().clone();
        async move {
            // Bodies differ per writer, so every accepted write has a different ETag.
            let swap = |put: PutObjectFluentBuilder| put.if_match(etag);
            s3_racing_put(&s3, (&bucket, &key), (round, writer), swap).await
        }
    };
    let verify = |round: usize, writer: usize, etag: String| {
        let (s3, bucket, key, current) = (
            clients[0].clone(),
            bucket.clone(),
            key.clone(),
            current.clone(),
        );
        async move {
            let (stored, stored_etag) = s3_body(&s3, &bucket, &key).await;
            assert_eq!(
                (stored.as_str(), stored_etag.as_str()),
                (body(round, writer).as_str(), etag.as_str()),
                "{server} is not atomic for S3 PutObject If-Match: round {round}: the stored \
                 object is not the winner's"
            );
            *current.lock().unwrap() = etag;
        }
    };
    race(server, "S3 PutObject If-Match: <etag>", write, verify).await;
}

async fn dynamodb_conditional_update_has_exactly_one_winner(server: &str, endpoint: &str) {
    let table = support::moto::new_table_at(endpoint, "canary", "key").await;
    let clients = per_writer(async || {
        let config = support::moto::dynamodb_config_for(endpoint).await;
        aws_sdk_dynamodb::Client::from_conf(config.retry_config(RetryConfig::disabled()).build())
    })
    .await;
    let key = unique("cas");
    let item = [
        ("key", AttributeValue::S(key.clone())),
        ("version", AttributeValue::N("0".into())),
    ];
    put_item(&clients[0], &table, item)
        .send()
        .await
        .expect("create the item the writers race on");

    let (t, k, c) = (table.clone(), key.clone(), clients.clone());
    let write = move |round: usize, writer: usize| {
        let (table, key, ddb) = (t.clone(), k.clone(), c[writer].clone());
        async move {
            // Round r moves the version from r to r+1; only one writer may do it.
            let result = ddb
                .update_item()
                .table_name(table)
                .key("key", AttributeValue::S(key))
                .update_expression("SET version = :next, writer = :writer")
                .condition_expression("version = :current")
                .expression_attribute_values(":current", AttributeValue::N(round.to_string()))
                .expression_attribute_values(":next", AttributeValue::N((round + 1).to_string()))
                .expression_attribute_values(":writer", AttributeValue::S(body(round, writer)))
                .send()
                .await;
            match result {
                Ok(_) => Ok(Outcome::Won(String::new())),
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
                {
                    Ok(Outcome::Lost)
                }
                Err(e) => Err(format!("{e:?}")),
            }
        }
    };
    let verify = |round: usize, writer: usize, _: String| {
        let (ddb, table, key) = (clients[0].clone(), table.clone(), key.clone());
        async move {
            let item = ddb
                .get_item()
                .table_name(table)
                .key("key", AttributeValue::S(key))
                .consistent_read(true)
                .send()
                .await
                .expect("GetItem")
                .item
                .expect("item exists");
            assert_eq!(
                (item.get("version"), item.get("writer")),
                (
                    Some(&AttributeValue::N((round + 1).to_string())),
                    Some(&AttributeValue::S(body(round, writer)))
                ),
                "{server} is not atomic for DynamoDB conditional UpdateItem: round {round}: \
                 the stored item is not the winner's"
            );
        }
    };
    race(
        server,
        "DynamoDB UpdateItem ConditionExpression version = :current",
        write,
        verify,
    )
    .await;
}

/// One module per server; each test races the named server's shared instance.
macro_rules! canary_tests {
    ($server:ident, $shared:expr, [$($test:ident),+ $(,)?]) => {
        mod $server {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() {
                    let endpoint = $shared.endpoint();
                    super::$test(stringify!($server), &endpoint).await
                }
            )+
        }
    };
}

canary_tests!(
    moto,
    Moto::shared(),
    [
        s3_put_if_none_match_has_exactly_one_winner,
        s3_put_if_match_has_exactly_one_winner,
        dynamodb_conditional_update_has_exactly_one_winner,
    ]
);
canary_tests!(
    versitygw,
    VersityGw::shared(),
    [
        s3_put_if_none_match_has_exactly_one_winner,
        s3_put_if_match_has_exactly_one_winner,
    ]
);
canary_tests!(
    dynalite,
    Dynalite::shared(),
    [dynamodb_conditional_update_has_exactly_one_winner]
);

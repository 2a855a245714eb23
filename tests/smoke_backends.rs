//! Smoke tests: the test servers are real and do what the lock protocol relies on
//! (conditional writes, ephemeral znodes, replication), and the fault proxy injects
//! each fault it claims to.

use lockwarden_testsupport as support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_s3::primitives::ByteStream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use zookeeper_client::{Acls, CreateMode, CreateOptions};

use support::moto::{Moto, put_item, put_object};
use support::proxy::{Mode, Proxy};
use support::zookeeper::ZooKeeper;
use support::{eventually, unique};

/// Deadline for anything that should happen "promptly" on a loaded 2-core machine.
const PROMPTLY: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------- S3 / DynamoDB

/// The shared moto's S3 client, a new bucket and a fresh key in it.
async fn s3_key() -> (aws_sdk_s3::Client, String, String) {
    let moto = Moto::shared();
    let bucket = moto.new_bucket("smoke").await;
    (moto.s3_client().await, bucket, unique("lock"))
}

/// The HTTP status an AWS call failed with.
fn http_status<E>(err: &SdkError<E>) -> Option<u16> {
    err.raw_response().map(|r| r.status().as_u16())
}

/// A DynamoDB write that must fail (`why`), refused by its condition.
async fn assert_condition_fails<T: std::fmt::Debug, E: ProvideErrorMetadata + std::fmt::Debug>(
    write: impl Future<Output = Result<T, SdkError<E>>>,
    why: &str,
) {
    let err = write.await.expect_err(why);
    assert_eq!(
        err.code(),
        Some("ConditionalCheckFailedException"),
        "{why}: expected ConditionalCheckFailedException, got {err:?}"
    );
}

#[tokio::test]
async fn s3_put_if_none_match_succeeds_once_then_412() {
    let (s3, bucket, key) = s3_key().await;
    put_object(&s3, &bucket, &key, ByteStream::from_static(b"first"))
        .if_none_match("*")
        .send()
        .await
        .expect("first conditional create succeeds");
    let err = put_object(&s3, &bucket, &key, ByteStream::from_static(b"second"))
        .if_none_match("*")
        .send()
        .await
        .expect_err("second conditional create must fail: the key exists");
    assert_eq!(
        http_status(&err),
        Some(412),
        "expected 412 Precondition Failed, got {err:?}"
    );

    let got = s3.get_object().bucket(&bucket).key(&key).send().await;
    let body = got.unwrap().body.collect().await.unwrap().into_bytes();
    assert_eq!(
        &body[..],
        b"first",
        "the failed write must not have changed the object"
    );
}

#[tokio::test]
async fn s3_put_if_match_is_conditional_on_etag() {
    let (s3, bucket, key) = s3_key().await;
    let first = put_object(&s3, &bucket, &key, ByteStream::from_static(b"v1"))
        .send()
        .await
        .unwrap();
    let etag1 = first
        .e_tag()
        .expect("PutObject returns an ETag")
        .to_string();
    let second = put_object(&s3, &bucket, &key, ByteStream::from_static(b"v2"))
        .if_match(&etag1)
        .send()
        .await
        .expect("If-Match with the current ETag");
    let etag2 = second.e_tag().unwrap().to_string();
    assert_ne!(etag1, etag2, "different bodies must give different ETags");

    let stale = put_object(&s3, &bucket, &key, ByteStream::from_static(b"v3"))
        .if_match(&etag1)
        .send()
        .await;
    let err = stale.expect_err("If-Match with a stale ETag must fail");
    assert_eq!(http_status(&err), Some(412), "{err:?}");
}

#[tokio::test]
async fn dynamodb_conditional_writes_fail_with_conditional_check_failed() {
    let moto = Moto::shared();
    let table = moto.new_table("smoke", "key").await;
    let ddb = moto.dynamodb_client().await;
    let key = unique("lock");

    // Create-if-absent, twice: the second must fail the condition.
    let create = || {
        let item = [
            ("key", AttributeValue::S(key.clone())),
            ("version", AttributeValue::N("1".into())),
        ];
        put_item(&ddb, &table, item)
            .condition_expression("attribute_not_exists(#k)")
            .expression_attribute_names("#k", "key")
    };
    create()
        .send()
        .await
        .expect("first conditional PutItem succeeds");
    assert_condition_fails(create().send(), "second conditional PutItem must fail").await;

    // Compare-and-set on a version attribute.
    let bump = |from: &str, to: &str| {
        ddb.update_item()
            .table_name(&table)
            .key("key", AttributeValue::S(key.clone()))
            .update_expression("SET version = :to")
            .condition_expression("version = :from")
            .expression_attribute_values(":from", AttributeValue::N(from.into()))
            .expression_attribute_values(":to", AttributeValue::N(to.into()))
    };
    assert_condition_fails(
        bump("7", "8").send(),
        "UpdateItem on a wrong version must fail",
    )
    .await;
    bump("1", "2")
        .send()
        .await
        .expect("UpdateItem on the current version succeeds");

    let read = ddb.get_item().table_name(&table).consistent_read(true);
    let got = read.key("key", AttributeValue::S(key.clone())).send().await;
    let item = got.unwrap().item.expect("item exists");
    assert_eq!(item.get("version"), Some(&AttributeValue::N("2".into())));
}

/// A private moto restarts on the same endpoint with empty state (moto is in-memory),
/// and a client built before the restart works again afterwards.
#[tokio::test]
async fn moto_restart_keeps_the_endpoint_and_loses_state() {
    let moto = Moto::start();
    let bucket = moto.new_bucket("restart").await;
    let s3 = moto.s3_client().await;
    s3.head_bucket()
        .bucket(&bucket)
        .send()
        .await
        .expect("bucket exists");

    moto.restart();
    assert!(moto.is_running());
    let gone = s3.head_bucket().bucket(&bucket).send().await;
    let err = gone.expect_err("state is gone");
    assert_eq!(http_status(&err), Some(404), "{err:?}");
    moto.new_bucket("after").await;
}

// ---------------------------------------------------------------- ZooKeeper

/// Create options for a znode anyone may read and write.
fn open_to_anyone(mode: CreateMode) -> CreateOptions<'static> {
    mode.with_acls(Acls::anyone_all())
}

#[tokio::test]
async fn zookeeper_ephemeral_sequential_znode_vanishes_with_its_session() {
    let zk = ZooKeeper::shared();
    let owner = zk.connect().await;
    let observer = zk.connect().await;
    let dir = format!("/{}", unique("smoke"));
    let persistent = open_to_anyone(CreateMode::Persistent);
    owner.mkdir(&dir, &persistent).await.unwrap();

    let prefix = format!("{dir}/lock-");
    let ephemeral = open_to_anyone(CreateMode::EphemeralSequential);
    let created = owner.create(&prefix, b"holder", &ephemeral).await;
    let (_, sequence) = created.expect("create EPHEMERAL_SEQUENTIAL znode");
    let path = format!("{prefix}{sequence}");

    let stat = observer
        .check_stat(&path)
        .await
        .unwrap()
        .expect("znode visible to another session");
    assert_eq!(
        stat.ephemeral_owner,
        owner.session_id().0,
        "znode is owned by the creating session"
    );
    assert_eq!(
        observer.list_children(&dir).await.unwrap(),
        vec![format!("lock-{sequence}")]
    );

    // Dropping the last handle closes the session; the server then deletes its
    // ephemeral znodes.
    drop(owner);
    eventually(
        "the ephemeral znode to disappear after its session closed",
        PROMPTLY,
        || async {
            observer
                .check_stat(&path)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn zookeeper_ensemble_replicates_between_nodes() {
    let zk = ZooKeeper::ensemble_shared();
    assert!(zk.leader().is_some(), "the ensemble has a leader");
    // One session pinned to each of two different nodes.
    let writer =
        support::zookeeper::connect_to(&zk.node(0).address(), Duration::from_secs(10)).await;
    let reader =
        support::zookeeper::connect_to(&zk.node(2).address(), Duration::from_secs(10)).await;

    let path = format!("/{}", unique("replicated"));
    let persistent = open_to_anyone(CreateMode::Persistent);
    let (written, _) = writer
        .create(&path, b"across the quorum", &persistent)
        .await
        .unwrap();
    // `sync` makes the reader's node catch up with the leader before the read.
    reader.sync(&path).await.unwrap();
    let (data, stat) = reader
        .get_data(&path)
        .await
        .expect("znode replicated to the other node");
    assert_eq!(data, b"across the quorum");
    assert_eq!(stat.czxid, written.czxid, "same znode (same creation zxid)");
}

/// A private ensemble loses its leader, keeps serving on the remaining majority,
/// survives a frozen follower, and the old leader rejoins with the data it missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_ensemble_survives_node_loss_and_rejoin() {
    let zk = ZooKeeper::start_ensemble();
    let leader = (0..3)
        .find(|&i| zk.node(i).mode().as_deref() == Some("leader"))
        .unwrap();
    // Long enough for the session to outlive a re-election on a loaded machine.
    let client = zk
        .connect_with_session_timeout(Duration::from_secs(30))
        .await;
    // A write (`what`) retried until the quorum answers; a retry after a lost reply
    // finds the znode.
    let write = |what: &'static str, path: &str| {
        let (client, path) = (client.clone(), path.to_string());
        eventually(what, PROMPTLY, move || {
            let (client, path) = (client.clone(), path.clone());
            async move {
                let persistent = open_to_anyone(CreateMode::Persistent);
                match client.create(&path, b"written", &persistent).await {
                    Ok(_) | Err(zookeeper_client::Error::NodeExists) => Some(()),
                    Err(_) => None,
                }
            }
        })
    };

    zk.stop_node(leader);
    zk.wait_ready(); // the two survivors elect a new leader
    let new_leader = zk.leader().expect("a new leader").id();
    assert_ne!(new_leader as usize, leader + 1, "leadership moved");
    let missed = format!("/{}", unique("missed"));
    write("a write on the remaining majority", &missed).await;

    // Freeze a follower only once all three run again: with one node already down,
    // freezing another would lose the quorum.
    zk.start_node(leader);
    zk.wait_ready();
    let rejoined =
        support::zookeeper::connect_to(&zk.node(leader).address(), Duration::from_secs(10)).await;
    rejoined.sync(&missed).await.unwrap();
    assert_eq!(rejoined.get_data(&missed).await.unwrap().0, b"written");

    let follower = (0..3)
        .find(|&i| zk.node(i).mode().as_deref() == Some("follower"))
        .unwrap();
    zk.pause_node(follower);
    let during_pause = format!("/{}", unique("paused"));
    write("a write while a follower is frozen", &during_pause).await;
    zk.resume_node(follower);
    zk.wait_ready();
}

// ---------------------------------------------------------------- fault proxy

/// A TCP echo server on the test's runtime that also counts the bytes it received,
/// so a test can tell whether the proxy forwarded a request.
struct Echo {
    port: u16,
    received: Arc<AtomicUsize>,
}

impl Echo {
    async fn start() -> Echo {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(AtomicUsize::new(0));
        let counter = received.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let counter = counter.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = stream.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        counter.fetch_add(n, Ordering::SeqCst);
                        if stream.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Echo { port, received }
    }

    fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }
}

#[derive(Debug, PartialEq)]
enum ReadOutcome {
    Data(Vec<u8>),
    /// Closed by the peer (FIN) or reset (RST).
    Closed,
    /// Nothing arrived within the wait.
    Silent,
}

async fn read_outcome(stream: &mut TcpStream, wait: Duration) -> ReadOutcome {
    let mut buf = [0u8; 4096];
    match tokio::time::timeout(wait, stream.read(&mut buf)).await {
        Err(_) => ReadOutcome::Silent,
        Ok(Ok(0)) | Ok(Err(_)) => ReadOutcome::Closed,
        Ok(Ok(n)) => ReadOutcome::Data(buf[..n].to_vec()),
    }
}

/// Writes `msg` and reads until `msg.len()` bytes came back (or panics).
async fn round_trip(stream: &mut TcpStream, msg: &[u8]) {
    stream.write_all(msg).await.unwrap();
    let mut got = vec![0u8; msg.len()];
    tokio::time::timeout(PROMPTLY, stream.read_exact(&mut got))
        .await
        .expect("echo within the deadline")
        .expect("echo read");
    assert_eq!(got, msg);
}

async fn connect(proxy: &Proxy) -> TcpStream {
    TcpStream::connect(proxy.address())
        .await
        .expect("connect to proxy")
}

/// Waits until the proxy has no open connections other than `keep`.
async fn wait_active(proxy: &Proxy, keep: u64) {
    eventually("proxy connections to close", PROMPTLY, || async {
        (proxy.active() == keep).then_some(())
    })
    .await;
}

/// An echo server behind a fault proxy, and a connection through it that has carried
/// one round trip ("before").
async fn echo_behind_a_proxy() -> (Echo, Proxy, TcpStream) {
    let echo = Echo::start().await;
    let proxy = Proxy::start(echo.port);
    let mut open = connect(&proxy).await;
    round_trip(&mut open, b"before").await;
    (echo, proxy, open)
}

/// The stream was closed or reset (`why`) within [`PROMPTLY`].
async fn assert_closed(stream: &mut TcpStream, why: &str) {
    assert_eq!(
        read_outcome(stream, PROMPTLY).await,
        ReadOutcome::Closed,
        "{why}"
    );
}

/// Nothing arrives on the stream for [`SILENCE`].
async fn assert_silent(stream: &mut TcpStream) {
    assert_eq!(read_outcome(stream, SILENCE).await, ReadOutcome::Silent);
}

/// Healed: the proxy passes again, and a new connection carries `msg` both ways.
async fn assert_passes_again(proxy: &Proxy, msg: &[u8]) {
    proxy.set_mode(Mode::Pass);
    round_trip(&mut connect(proxy).await, msg).await;
}

/// The fault ends: `lost`, a connection whose bytes were lost, is reset, and new
/// connections pass.
async fn assert_heals_resetting(proxy: &Proxy, lost: &mut TcpStream) {
    proxy.set_mode(Mode::Pass);
    assert_closed(lost, "lost bytes: reset when the fault ends").await;
    round_trip(&mut connect(proxy).await, b"after").await;
}

/// How long a test watches for something that must *not* happen (an answer through
/// a blackhole). Nothing can prove a negative; this is long enough that a forwarding
/// proxy would have answered many times over.
const SILENCE: Duration = Duration::from_millis(750);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_pass_forwards_both_ways() {
    let echo = Echo::start().await;
    let proxy = Proxy::start(echo.port);
    let mut a = connect(&proxy).await;
    let mut b = connect(&proxy).await;
    round_trip(&mut a, b"hello").await;
    round_trip(&mut b, b"world").await;
    round_trip(&mut a, &vec![7u8; 200_000]).await;
    assert_eq!(echo.received(), 5 + 5 + 200_000);
    assert_eq!(proxy.accepted(), 2);
    drop(a);
    drop(b);
    wait_active(&proxy, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_delay_holds_each_direction() {
    let echo = Echo::start().await;
    let proxy = Proxy::start(echo.port);
    let mut open = connect(&proxy).await;
    round_trip(&mut open, b"warm").await;

    let delay = Duration::from_millis(400);
    proxy.set_mode(Mode::Delay(delay));
    // Applies to the already-open connection and to a new one.
    let mut fresh = connect(&proxy).await;
    for stream in [&mut open, &mut fresh] {
        let began = Instant::now();
        round_trip(stream, b"slow").await;
        let took = began.elapsed();
        assert!(
            took >= 2 * delay,
            "round trip took {took:?}, expected at least {:?}",
            2 * delay
        );
    }

    proxy.set_mode(Mode::Pass);
    round_trip(&mut open, b"normal again").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_blackhole_swallows_open_and_new_connections() {
    let (echo, proxy, mut open) = echo_behind_a_proxy().await;
    let mut idle = connect(&proxy).await; // carries nothing during the partition
    round_trip(&mut idle, b"idle").await;
    let received_before = echo.received();

    proxy.set_mode(Mode::Blackhole);
    open.write_all(b"into the void")
        .await
        .expect("writes are accepted");
    let mut fresh = connect(&proxy).await; // accepted even during the partition
    fresh.write_all(b"also lost").await.unwrap();
    assert_silent(&mut open).await;
    assert_silent(&mut fresh).await;
    assert_eq!(
        echo.received(),
        received_before,
        "nothing reached the upstream"
    );

    // Healing resets the connections whose bytes were lost; the idle one continues.
    assert_heals_resetting(&proxy, &mut open).await;
    assert_closed(&mut fresh, "lost bytes: reset when the fault ends").await;
    round_trip(&mut idle, b"still here").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_refuse_resets_open_and_new_connections() {
    let (echo, proxy, mut open) = echo_behind_a_proxy().await;

    proxy.set_mode(Mode::Refuse);
    assert_closed(&mut open, "open connection reset").await;
    // A new connection may complete the handshake (the kernel accepts it), but is
    // closed before anything is exchanged.
    if let Ok(mut fresh) = TcpStream::connect(proxy.address()).await {
        let _ = fresh.write_all(b"anyone?").await;
        assert_closed(&mut fresh, "a new connection is refused").await;
    }
    assert_eq!(
        echo.received(),
        6,
        "only the first message reached the upstream"
    );
    assert_passes_again(&proxy, b"back").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_drop_replies_forwards_request_then_drops_answer() {
    // `open` is like a pooled keep-alive connection.
    let (echo, proxy, mut open) = echo_behind_a_proxy().await;

    proxy.set_mode(Mode::DropReplies);
    // The reply to each request is dropped, and the connection closed.
    let request_gets_no_reply = async |stream: &mut TcpStream, request: &[u8]| {
        stream.write_all(request).await.unwrap();
        assert_closed(stream, "reply dropped, connection closed").await;
    };
    request_gets_no_reply(&mut open, b"request").await;
    request_gets_no_reply(&mut connect(&proxy).await, b"another").await;

    assert_eq!(
        echo.received(),
        6 + 7 + 7,
        "both requests reached the upstream"
    );
    assert_eq!(proxy.dropped_replies(), 2);
    assert_passes_again(&proxy, b"back").await;
}

/// One-way loss of requests: nothing reaches the upstream and nothing is reset while
/// it lasts; the connection that lost bytes is reset when the mode ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_lose_requests_drops_one_direction_silently() {
    let (echo, proxy, mut open) = echo_behind_a_proxy().await;

    proxy.set_mode(Mode::LoseRequests);
    open.write_all(b"lost").await.unwrap();
    assert_silent(&mut open).await;
    assert_eq!(echo.received(), 6, "the request never reached the upstream");
    assert_heals_resetting(&proxy, &mut open).await;
}

/// One-way loss of replies: the request reaches the upstream (it takes effect), the
/// answer never arrives and the connection is not reset while the mode lasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_lose_replies_forwards_requests_and_swallows_answers() {
    let (echo, proxy, mut open) = echo_behind_a_proxy().await;

    proxy.set_mode(Mode::LoseReplies);
    open.write_all(b"request").await.unwrap();
    eventually("the request to reach the upstream", PROMPTLY, || async {
        (echo.received() == 6 + 7).then_some(())
    })
    .await;
    assert_silent(&mut open).await;
    assert_heals_resetting(&proxy, &mut open).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_reset_connections_resets_only_existing_ones() {
    let (_echo, proxy, mut open) = echo_behind_a_proxy().await;
    proxy.reset_connections();
    assert_closed(&mut open, "an existing connection is reset").await;
    // Still in Pass mode: new connections are not reset.
    assert_passes_again(&proxy, b"after").await;
}

/// The faults as an S3 client sees them, through a pooled keep-alive connection:
/// a lost reply means the write landed although the client got an error; a
/// blackhole means it did not land and the client times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_faults_seen_by_an_s3_client() {
    let moto = Moto::shared();
    let bucket = moto.new_bucket("proxy").await;
    let direct = moto.s3_client().await;
    let proxy = Proxy::start(moto.port());
    let config = support::moto::s3_config_for(&proxy.endpoint())
        .await
        .retry_config(aws_sdk_s3::config::retry::RetryConfig::disabled())
        .timeout_config(
            aws_sdk_s3::config::timeout::TimeoutConfig::builder()
                .operation_timeout(Duration::from_secs(3))
                .build(),
        )
        .build();
    let s3 = aws_sdk_s3::Client::from_conf(config);
    let put = |key: &str| {
        put_object(&s3, &bucket, key, ByteStream::from_static(b"x"))
            .if_none_match("*")
            .send()
    };
    let exists = |key: String| {
        let direct = direct.clone();
        let bucket = bucket.clone();
        async move {
            direct
                .head_object()
                .bucket(bucket)
                .key(key)
                .send()
                .await
                .is_ok()
        }
    };

    put("warm").await.expect("through the proxy in Pass mode");

    proxy.set_mode(Mode::DropReplies);
    put("lost-reply").await.expect_err("the reply was dropped");
    assert!(
        exists("lost-reply".into()).await,
        "the write landed although the client saw an error"
    );

    proxy.set_mode(Mode::Blackhole);
    put("partitioned")
        .await
        .expect_err("no answer through a blackhole");
    assert!(
        !exists("partitioned".into()).await,
        "nothing reached the server"
    );

    proxy.set_mode(Mode::Pass);
    put("healed")
        .await
        .expect("works again after the partition heals");
}

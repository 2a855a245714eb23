//! moto server: S3 and DynamoDB emulation on one loopback port.
//!
//! `Moto::shared()` is one server per test binary (tests isolate themselves with
//! unique bucket / table names); `Moto::start()` is a private server for tests that
//! stop or restart it. moto keeps everything in memory, so a restart loses all
//! buckets, objects and tables — exactly what a "backend lost its state" test wants.
//!
//! moto is started with every request applied one at a time (`scripts/moto-atomic`, installed by `scripts/testenv` as `MOTO_SERVER`):
//! moto 5.2.5 checks S3 `If-None-Match`/`If-Match` and DynamoDB condition
//! expressions and then writes without a lock, on a threaded server, so concurrent
//! conditional writes can both succeed — `tests/canary.rs` catches that within a few
//! hundred rounds against plain `moto_server`. Real S3 and DynamoDB are atomic, and
//! lock tests must not fail (or pass) because the emulator is not.
//!
//! Clients are built per call (not cached) because an AWS SDK client's connection
//! pool belongs to the tokio runtime it was first used on, and every `#[tokio::test]`
//! has its own runtime.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::AtomicU32;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
};
use aws_sdk_s3::config::{Credentials, Region};

use super::{
    ServerProcess, claim_slot, free_port, http_answers, slot_is_running, slot_log_tail, tool,
    unique_suffix, wait_until, work_dir,
};

/// Region every test client uses (moto accepts any; this one needs no bucket
/// LocationConstraint).
pub const REGION: &str = "us-east-1";
/// Static credentials moto accepts (it does not check signatures by default).
pub const ACCESS_KEY_ID: &str = "lockwarden-test";
pub const SECRET_ACCESS_KEY: &str = "lockwarden-test-secret";

/// How long a (re)starting moto may take to answer HTTP: Python imports on a loaded
/// 2-core machine next to a cargo build can take tens of seconds.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(120);

/// One moto server process on a fixed port.
pub struct Moto {
    port: u16,
    dir: PathBuf,
    /// `None` while stopped. A mutex (not `&mut self`) so a `Moto` shared between
    /// tasks, or the `shared()` static, can still be inspected.
    process: Mutex<Option<ServerProcess>>,
    /// How many times the server was started; numbers each start's log file.
    starts: AtomicU32,
}

impl Moto {
    /// The moto server shared by every test in this binary, started on first use.
    pub fn shared() -> &'static Moto {
        static SHARED: OnceLock<Moto> = OnceLock::new();
        SHARED.get_or_init(|| Moto::start_named("moto-shared"))
    }

    /// A private moto server, killed when the returned value is dropped.
    pub fn start() -> Moto {
        Moto::start_named(&format!("moto-{}", unique_suffix()))
    }

    fn start_named(name: &str) -> Moto {
        let moto = Moto {
            port: free_port(),
            dir: work_dir(name),
            process: Mutex::new(None),
            starts: AtomicU32::new(0),
        };
        moto.start_process();
        moto
    }

    /// Starts the process on `self.port` and waits until it answers HTTP.
    fn start_process(&self) {
        let (mut slot, n) = claim_slot(
            &self.process,
            &self.starts,
            &format!("moto on port {}", self.port),
        );
        // LOCKWARDEN_MOTO_UNSERIALIZED=1 runs plain `moto_server`, e.g. to see whether
        // a newer moto passes the canary on its own.
        let mut cmd = if std::env::var_os("LOCKWARDEN_MOTO_UNSERIALIZED").is_some() {
            Command::new(tool("MOTO_SERVER").with_file_name("moto_server"))
        } else {
            Command::new(tool("MOTO_SERVER"))
        };
        cmd.args(["-H", "127.0.0.1", "-p", &self.port.to_string()]);
        let began = Instant::now();
        let mut server = ServerProcess::start(&format!("moto-{n}"), cmd, &self.dir);
        let port = self.port;
        // A bare TCP connect is not enough: werkzeug binds before moto's backends are
        // importable.
        wait_until(&mut server, STARTUP_TIMEOUT, "moto to answer HTTP", || {
            http_answers(port, "/moto-api/")
        });
        eprintln!(
            "[support] moto ready on port {port} after {:?}",
            began.elapsed()
        );
        *slot = Some(server);
    }

    /// Kills the server (SIGKILL: no chance to flush anything, like a crash). The port
    /// then refuses connections until `start_again` or `restart`.
    pub fn stop(&self) {
        if let Some(mut server) = self.process.lock().unwrap().take() {
            server.kill();
        }
    }

    /// Starts a stopped server again on the same port (all state is gone).
    pub fn start_again(&self) {
        self.start_process();
    }

    /// Kill, then start again on the same port. moto is in-memory: every bucket,
    /// object and table is gone afterwards.
    pub fn restart(&self) {
        self.stop();
        self.start_process();
    }

    /// Sends `sig` to the server's process group, e.g. `libc::SIGSTOP` to freeze it
    /// (connections stay open, nothing answers) and `libc::SIGCONT` to resume.
    pub fn signal(&self, sig: i32) {
        if let Some(server) = self.process.lock().unwrap().as_ref() {
            server.signal(sig);
        }
    }

    /// Freezes the server (SIGSTOP).
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Resumes a frozen server (SIGCONT).
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    pub fn is_running(&self) -> bool {
        slot_is_running(&self.process)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.lock().unwrap().as_ref().map(|s| s.pid())
    }

    /// `http://127.0.0.1:PORT`, for `endpoint_url` / a backend spec's `endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The server's current log file (for failure messages).
    pub fn log_tail(&self, lines: usize) -> String {
        slot_log_tail(&self.process, lines)
    }

    /// Shared AWS config pointing at this server (see [`sdk_config_for`]).
    pub async fn sdk_config(&self) -> SdkConfig {
        sdk_config_for(&self.endpoint()).await
    }

    /// The keys of every object in `bucket`.
    pub async fn object_keys(&self, bucket: &str) -> Vec<String> {
        let listed = self
            .s3_client()
            .await
            .list_objects_v2()
            .bucket(bucket)
            .send()
            .await
            .unwrap_or_else(|e| panic!("list bucket {bucket}: {e}"));
        listed
            .contents()
            .iter()
            .filter_map(|o| o.key().map(String::from))
            .collect()
    }

    /// An S3 client for this server (path-style, us-east-1, static test credentials).
    pub async fn s3_client(&self) -> aws_sdk_s3::Client {
        s3_client_for(&self.endpoint()).await
    }

    /// A DynamoDB client for this server.
    pub async fn dynamodb_client(&self) -> aws_sdk_dynamodb::Client {
        dynamodb_client_for(&self.endpoint()).await
    }

    /// Creates a bucket with a unique name starting with `prefix` and returns its name.
    pub async fn new_bucket(&self, prefix: &str) -> String {
        new_bucket_at(&self.endpoint(), prefix).await
    }

    /// Creates an on-demand table with a unique name starting with `prefix`, whose
    /// partition key is the string attribute `partition_key` (no sort key), and
    /// returns its name.
    pub async fn new_table(&self, prefix: &str, partition_key: &str) -> String {
        new_table_at(&self.endpoint(), prefix, partition_key).await
    }
}

/// Creates a bucket with a unique name starting with `prefix` on the S3 server at
/// `endpoint` and returns its name.
pub async fn new_bucket_at(endpoint: &str, prefix: &str) -> String {
    let name = format!("{prefix}-{}", unique_suffix()).to_lowercase();
    s3_client_for(endpoint)
        .await
        .create_bucket()
        .bucket(&name)
        .send()
        .await
        .unwrap_or_else(|e| panic!("create bucket {name} at {endpoint}: {e:?}"));
    name
}

/// Creates an on-demand table with a unique name starting with `prefix` on the
/// DynamoDB server at `endpoint`, whose partition key is the string attribute
/// `partition_key` (no sort key), and returns its name once it is ACTIVE (moto creates
/// tables ACTIVE at once; dynalite after a moment).
pub async fn new_table_at(endpoint: &str, prefix: &str, partition_key: &str) -> String {
    let name = format!("{prefix}-{}", unique_suffix());
    let client = dynamodb_client_for(endpoint).await;
    client
        .create_table()
        .table_name(&name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(partition_key)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .expect("attribute definition"),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(partition_key)
                .key_type(KeyType::Hash)
                .build()
                .expect("key schema"),
        )
        .send()
        .await
        .unwrap_or_else(|e| panic!("create table {name} at {endpoint}: {e:?}"));
    let what = format!("table {name} at {endpoint} to be ACTIVE");
    super::eventually(&what, Duration::from_secs(60), || async {
        let described = client
            .describe_table()
            .table_name(&name)
            .send()
            .await
            .unwrap_or_else(|e| panic!("describe table {name} at {endpoint}: {e:?}"));
        let status = described.table().and_then(|t| t.table_status());
        (status == Some(&TableStatus::Active)).then_some(())
    })
    .await;
    name
}

/// AWS config for any endpoint (moto itself, or a fault proxy in front of it):
/// region [`REGION`], static test credentials, and timeouts so a hung server fails a
/// test instead of hanging it. Nothing is read from the environment or
/// `~/.aws` that could change these.
pub async fn sdk_config_for(endpoint: &str) -> SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new(REGION))
        .credentials_provider(Credentials::new(
            ACCESS_KEY_ID,
            SECRET_ACCESS_KEY,
            None,
            None,
            "lockwarden-tests",
        ))
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(10))
                .operation_timeout(Duration::from_secs(60))
                .build(),
        )
        .load()
        .await
}

/// S3 config builder for `endpoint` with path-style addressing (moto has no
/// virtual-host DNS), for tests that tweak retries or timeouts before building.
pub async fn s3_config_for(endpoint: &str) -> aws_sdk_s3::config::Builder {
    aws_sdk_s3::config::Builder::from(&sdk_config_for(endpoint).await).force_path_style(true)
}

/// DynamoDB config builder for `endpoint`.
pub async fn dynamodb_config_for(endpoint: &str) -> aws_sdk_dynamodb::config::Builder {
    aws_sdk_dynamodb::config::Builder::from(&sdk_config_for(endpoint).await)
}

/// A PutObject of `body` to `bucket/key`: to make conditional (`if_match`, …) and send.
pub fn put_object(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    body: impl Into<aws_sdk_s3::primitives::ByteStream>,
) -> aws_sdk_s3::operation::put_object::builders::PutObjectFluentBuilder {
    s3.put_object().bucket(bucket).key(key).body(body.into())
}

/// A PutItem of `attributes` to `table`: to make conditional and send.
pub fn put_item<const N: usize>(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
    attributes: [(&str, aws_sdk_dynamodb::types::AttributeValue); N],
) -> aws_sdk_dynamodb::operation::put_item::builders::PutItemFluentBuilder {
    let put = ddb.put_item().table_name(table);
    attributes
        .into_iter()
        .fold(put, |put, (name, value)| put.item(name, value))
}

/// How lockwarden reaches the test server at `endpoint` (`backend::AwsOptions`): the
/// test credentials and region, as `sdk_config_for` has them.
pub fn aws_options_for(endpoint: &str) -> lockwarden::backend::AwsOptions {
    lockwarden::backend::AwsOptions {
        endpoint: Some(endpoint.to_string()),
        region: Some(REGION.to_string()),
        credentials: Some(lockwarden::backend::Credentials::new(
            ACCESS_KEY_ID,
            SECRET_ACCESS_KEY,
            None,
        )),
        request_timeout: None,
    }
}

pub async fn s3_client_for(endpoint: &str) -> aws_sdk_s3::Client {
    aws_sdk_s3::Client::from_conf(s3_config_for(endpoint).await.build())
}

pub async fn dynamodb_client_for(endpoint: &str) -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::from_conf(dynamodb_config_for(endpoint).await.build())
}

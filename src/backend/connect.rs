//! The connection factory: the one place that turns a [`Target`] and
//! [`ConnectOptions`] into a [`LockBackend`], building each store's client from the
//! standard sources:
//!
//! - S3 and DynamoDB: the AWS SDK default chain (`AWS_ENDPOINT_URL`, `AWS_REGION`,
//!   `AWS_PROFILE`, environment credentials, `~/.aws`, SSO, IRSA / Pod Identity, IMDS),
//!   overridden by [`ConnectOptions`]. With a custom endpoint, S3 uses path-style
//!   addressing unless told otherwise (S3-compatible servers rarely have the
//!   wildcard DNS virtual-hosted addressing needs).
//! - Kubernetes: `KUBECONFIG` / `~/.kube/config` / in-cluster service account
//!   (`kube::Client::try_default`), or a given context or client.
//! - ZooKeeper: the process-wide session of the ensemble with the requested timeout
//!   ([`ZkSessions::global`]).
//!
//! Nothing here knows about the command-line tool or the operator; both use it.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{Credentials, Region};

use super::dynamodb::{DEFAULT_PARTITION_KEY, DynamoStore, TableLayout};
use super::kubernetes::LeaseStore;
use super::s3::S3Store;
use super::url::Target;
use super::zookeeper::{ZkLock, ZkSessions};
use crate::lock::{CasLock, LockBackend, LockError, Version};

/// Builds the backend for the lock `target` names. Network access happens only where
/// a store needs it to start (creating a DynamoDB table when asked, reading a
/// kubeconfig's exec credentials); the lock itself is not touched.
pub async fn connect(
    target: &Target,
    options: &ConnectOptions,
) -> Result<Arc<dyn LockBackend>, ConnectError> {
    match target {
        Target::S3 { bucket, key } => {
            let client = AwsClients::global().s3(options).await;
            Ok(Arc::new(
                CasLock::new(S3Store::new(client, bucket.clone(), key.clone()))
                    .with_delete_on_release(options.s3lock_compatible),
            ))
        }
        Target::DynamoDb { table, key } => {
            let client = AwsClients::global().dynamodb(options).await;
            let layout = TableLayout {
                table: table.clone(),
                partition_key: options
                    .partition_key
                    .clone()
                    .unwrap_or_else(|| DEFAULT_PARTITION_KEY.to_string()),
                sort_key: options.sort_key.clone(),
            };
            let store = DynamoStore::new(client, layout, key.clone());
            if options.create_table {
                store
                    .ensure_table()
                    .await
                    .map_err(|e| ConnectError::Backend {
                        url: target.url(),
                        cause: e.to_string(),
                    })?;
            }
            Ok(Arc::new(CasLock::new(store)))
        }
        Target::ZooKeeper { .. } => Ok(Arc::new(zookeeper_lock(target, options)?)),
        Target::Kubernetes { namespace, name } => {
            let client = match &options.kube_client {
                Some(client) => client.clone(),
                None => kube_client(options.kube_context.as_deref())
                    .await
                    .map_err(|cause| ConnectError::Kubernetes {
                        url: target.url(),
                        cause,
                    })?,
            };
            Ok(Arc::new(CasLock::new(LeaseStore::new(
                client, namespace, name,
            ))))
        }
    }
}

impl Target {
    /// [`connect`] for this lock.
    pub async fn connect(
        &self,
        options: &ConnectOptions,
    ) -> Result<Arc<dyn LockBackend>, ConnectError> {
        connect(self, options).await
    }
}

/// A ZooKeeper contender on the process-wide session of the ensemble that asks for
/// `options.session_timeout`.
fn zookeeper_lock(target: &Target, options: &ConnectOptions) -> Result<ZkLock, LockError> {
    let Target::ZooKeeper {
        servers,
        chroot,
        path,
    } = target
    else {
        unreachable!("called for zk:// targets only");
    };
    let connect = format!("{}{}", servers.join(","), chroot.as_deref().unwrap_or(""));
    ZkSessions::global().lock_with_timeout(&connect, path, options.session_timeout)
}

/// One acquisition as a lock file records it: enough for a process that did not make
/// it to release it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedAcquisition {
    pub holder: String,
    pub nonce: String,
    /// The version the acquisition's last write produced.
    pub version: Version,
}

/// Releases `recorded` from a process that did not acquire it (`lockwarden unlock`),
/// only if the lock still belongs to that acquisition:
///
/// - stores with one record (S3, DynamoDB, Kubernetes Lease): re-attach by nonce, then
///   release with a write conditioned on the recorded version (should the record have
///   moved on within the same acquisition, the engine re-reads and follows it);
/// - ZooKeeper: the lock is a queue entry of another process's session (the keeper's);
///   delete it, conditioned on the recorded version ([`ZkLock::release_entry`]).
///
/// A lock no longer this acquisition's is `Lock(LockError::Lost { reason })` (released,
/// expired or taken over) or `Lock(LockError::NotHeld)` (released elsewhere).
pub async fn release_recorded(
    target: &Target,
    options: &ConnectOptions,
    recorded: &RecordedAcquisition,
) -> Result<(), ConnectError> {
    if let Target::ZooKeeper { .. } = target {
        let lock = zookeeper_lock(target, options)?;
        return Ok(lock
            .release_entry(&recorded.version, &recorded.nonce)
            .await?);
    }
    let backend = connect(target, options).await?;
    let mut lease = backend.resume(&recorded.holder, &recorded.nonce).await?;
    lease.version = recorded.version.clone();
    Ok(backend.release(&lease).await?)
}

/// How to reach the store, beyond what the URL says. Everything is optional: the
/// defaults come from the environment (see the module documentation).
#[derive(Clone, Default)]
pub struct ConnectOptions {
    /// AWS endpoint (S3-compatible server, DynamoDB endpoint, a local emulator).
    /// Default: `AWS_ENDPOINT_URL` / `AWS_ENDPOINT_URL_S3` / the profile, else AWS.
    pub endpoint: Option<String>,
    /// AWS region. Default: `AWS_REGION` / the profile.
    pub region: Option<String>,
    /// S3 path-style addressing. Default: on when a custom endpoint is configured.
    pub force_path_style: Option<bool>,
    /// Static AWS credentials (e.g. from a Kubernetes Secret). Default: the SDK chain.
    pub credentials: Option<Credentials>,
    /// Timeout of one AWS request attempt. Default 20 s.
    pub request_timeout: Option<Duration>,
    /// S3: delete the lock object after writing the release tombstone, so that
    /// winebarrel/s3lock clients (which treat any object as held) can acquire the key
    /// after lockwarden. The fence then restarts at 1 after every release.
    pub s3lock_compatible: bool,
    /// DynamoDB partition key attribute name. Default `key` (as dynamolock).
    pub partition_key: Option<String>,
    /// DynamoDB sort key attribute name and the value lock items use for it.
    pub sort_key: Option<(String, String)>,
    /// Create the DynamoDB table (on-demand billing) if it does not exist.
    pub create_table: bool,
    /// kubeconfig context to use instead of the current one.
    pub kube_context: Option<String>,
    /// A ready Kubernetes client (the operator's own); wins over `kube_context`.
    pub kube_client: Option<kube::Client>,
    /// ZooKeeper: the session timeout to ask the servers for (they clamp it to their
    /// `minSessionTimeout ..= maxSessionTimeout`). Default
    /// [`DEFAULT_SESSION_TIMEOUT`](super::zookeeper::DEFAULT_SESSION_TIMEOUT). Locks
    /// asking for different timeouts get different sessions.
    pub session_timeout: Option<Duration>,
}

impl fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("force_path_style", &self.force_path_style)
            .field("s3lock_compatible", &self.s3lock_compatible)
            .field("credentials", &self.credentials.as_ref().map(|_| "<set>"))
            .field("request_timeout", &self.request_timeout)
            .field("partition_key", &self.partition_key)
            .field("sort_key", &self.sort_key)
            .field("create_table", &self.create_table)
            .field("kube_context", &self.kube_context)
            .field("kube_client", &self.kube_client.as_ref().map(|_| "<set>"))
            .field("session_timeout", &self.session_timeout)
            .finish()
    }
}

/// A backend that could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(
        "{url}: no usable Kubernetes configuration (KUBECONFIG, ~/.kube/config or in-cluster service account): {cause}"
    )]
    Kubernetes { url: String, cause: String },

    #[error("{url}: {cause}")]
    Backend { url: String, cause: String },

    #[error(transparent)]
    Lock(#[from] LockError),
}

/// Connect and per-attempt timeouts: a dead endpoint fails an attempt instead of
/// hanging it; the SDK's standard retries (3 attempts) still apply.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

async fn sdk_config(options: &ConnectOptions) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(BehaviorVersion::latest()).timeout_config(
        TimeoutConfig::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .operation_attempt_timeout(options.request_timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT))
            .build(),
    );
    if let Some(endpoint) = &options.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    if let Some(region) = &options.region {
        loader = loader.region(Region::new(region.clone()));
    }
    if let Some(credentials) = &options.credentials {
        loader = loader.credentials_provider(credentials.clone());
    } else if env_credentials_present() {
        // The default chain would use them first anyway; naming that provider skips
        // building the rest of the chain, whose web-identity step sets up an STS
        // client (and with it TLS and the system's root certificates) on every start:
        // most of a short command's CPU time (issue 18).
        loader = loader.credentials_provider(
            aws_config::environment::EnvironmentVariableCredentialsProvider::new(),
        );
    }
    loader.load().await
}

/// Whether `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` are both set: the first
/// source of the SDK's default credential chain.
fn env_credentials_present() -> bool {
    ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
        .iter()
        .all(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()))
}

/// The endpoint a service's requests go to, when one is configured: the service's own
/// variable (`AWS_ENDPOINT_URL_S3`, …) first, as the SDK resolves it, then the general one.
fn service_endpoint(sdk: &aws_config::SdkConfig, variable: &str) -> Option<String> {
    std::env::var(variable)
        .ok()
        .filter(|v| !v.is_empty())
        .or_else(|| sdk.endpoint_url().map(str::to_string))
}

/// For a service reached over plain HTTP (a local or on-premises server), an HTTP client
/// without TLS. The SDK's default client reads and parses the system's root certificates
/// when it starts, which was the largest part of a short `lockwarden lock`'s CPU time
/// (issue 18), for an endpoint that never uses them. Only the service client gets it:
/// credential providers (SSO, STS, IMDS) keep the default client.
fn plain_http_client(
    endpoint: Option<&str>,
) -> Option<aws_smithy_runtime_api::client::http::SharedHttpClient> {
    endpoint
        .filter(|e| e.starts_with("http://"))
        .map(|_| aws_smithy_http_client::Builder::new().build_http())
}

/// The process's AWS service clients, one per distinct way of reaching a service.
///
/// An SDK client is meant to be shared: it holds its connection pool, credential cache
/// and configuration. The operator connects once per `DistributedLock`, so building a
/// client per lock gave 10,000 S3 locks 10,000 connection pools — 10,000 TCP
/// connections to the store and a configuration load each — where one client per
/// endpoint, region and credentials serves them all (issue 18).
pub struct AwsClients {
    s3: ClientCache<AwsClientKey, aws_sdk_s3::Client>,
    dynamodb: ClientCache<AwsClientKey, aws_sdk_dynamodb::Client>,
}

impl AwsClients {
    /// The process-wide clients.
    pub fn global() -> &'static AwsClients {
        static CLIENTS: OnceLock<AwsClients> = OnceLock::new();
        CLIENTS.get_or_init(|| AwsClients {
            s3: ClientCache::new(MAX_CACHED_CLIENTS),
            dynamodb: ClientCache::new(MAX_CACHED_CLIENTS),
        })
    }

    async fn s3(&self, options: &ConnectOptions) -> aws_sdk_s3::Client {
        self.s3
            .get_or_build(AwsClientKey::of(options), || s3_client(options))
            .await
    }

    async fn dynamodb(&self, options: &ConnectOptions) -> aws_sdk_dynamodb::Client {
        self.dynamodb
            .get_or_build(AwsClientKey::of(options), || dynamodb_client(options))
            .await
    }
}

/// Distinct client configurations kept at once. Each Secret (and each rotation of one)
/// is a configuration; past this many the cache starts afresh, which costs only new
/// clients for the locks that connect next: clients in use stay with their locks.
const MAX_CACHED_CLIENTS: usize = 64;

/// Everything in [`ConnectOptions`] that goes into an AWS service client.
#[derive(Clone, PartialEq, Eq, Hash)]
struct AwsClientKey {
    endpoint: Option<String>,
    region: Option<String>,
    force_path_style: Option<bool>,
    /// Access key id, secret key and session token of static credentials.
    credentials: Option<(String, String, Option<String>)>,
    request_timeout: Option<Duration>,
}

impl AwsClientKey {
    fn of(options: &ConnectOptions) -> AwsClientKey {
        AwsClientKey {
            endpoint: options.endpoint.clone(),
            region: options.region.clone(),
            force_path_style: options.force_path_style,
            credentials: options.credentials.as_ref().map(|c| {
                (
                    c.access_key_id().to_string(),
                    c.secret_access_key().to_string(),
                    c.session_token().map(str::to_string),
                )
            }),
            request_timeout: options.request_timeout,
        }
    }
}

/// Clients by configuration, bounded: see [`MAX_CACHED_CLIENTS`].
struct ClientCache<K, C> {
    clients: Mutex<HashMap<K, C>>,
    capacity: usize,
}

impl<K: Eq + Hash, C: Clone> ClientCache<K, C> {
    fn new(capacity: usize) -> Self {
        ClientCache {
            clients: Mutex::new(HashMap::new()),
            capacity,
        }
    }

    /// The client for `key`, built by `build` the first time. Two first callers may
    /// both build; the first to finish is kept and the other's is used once.
    async fn get_or_build<F, Fut>(&self, key: K, build: F) -> C
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = C>,
    {
        if let Some(client) = self.lock().get(&key) {
            return client.clone();
        }
        let built = build().await;
        let mut clients = self.lock();
        if clients.len() >= self.capacity && !clients.contains_key(&key) {
            clients.clear();
        }
        clients.entry(key).or_insert(built).clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, C>> {
        // A panic while holding the lock leaves a map that is still consistent.
        self.clients.lock().unwrap_or_else(|e| e.into_inner())
    }
}

async fn s3_client(options: &ConnectOptions) -> aws_sdk_s3::Client {
    let sdk = sdk_config(options).await;
    let endpoint = service_endpoint(&sdk, "AWS_ENDPOINT_URL_S3");
    let path_style = options.force_path_style.unwrap_or(endpoint.is_some());
    let mut config = aws_sdk_s3::config::Builder::from(&sdk).force_path_style(path_style);
    if let Some(client) = plain_http_client(endpoint.as_deref()) {
        config = config.http_client(client);
    }
    aws_sdk_s3::Client::from_conf(config.build())
}

async fn dynamodb_client(options: &ConnectOptions) -> aws_sdk_dynamodb::Client {
    let sdk = sdk_config(options).await;
    let endpoint = service_endpoint(&sdk, "AWS_ENDPOINT_URL_DYNAMODB");
    let mut config = aws_sdk_dynamodb::config::Builder::from(&sdk);
    if let Some(client) = plain_http_client(endpoint.as_deref()) {
        config = config.http_client(client);
    }
    aws_sdk_dynamodb::Client::from_conf(config.build())
}

async fn kube_client(context: Option<&str>) -> Result<kube::Client, String> {
    let config = match context {
        None => kube::Config::infer().await.map_err(|e| e.to_string())?,
        Some(context) => {
            let options = kube::config::KubeConfigOptions {
                context: Some(context.to_string()),
                ..Default::default()
            };
            kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|e| format!("context {context:?}: {e}"))?
        }
    };
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn options(access_key: &str) -> ConnectOptions {
        ConnectOptions {
            endpoint: Some("http://127.0.0.1:9000".into()),
            region: Some("us-east-1".into()),
            credentials: Some(Credentials::new(access_key, "secret", None, None, "test")),
            ..ConnectOptions::default()
        }
    }

    #[tokio::test]
    async fn locks_reaching_a_store_the_same_way_share_one_client() {
        let cache = ClientCache::new(8);
        let counter = AtomicUsize::new(0);
        let built = &counter;
        let build = move || async move { built.fetch_add(1, Ordering::SeqCst) };
        let first = cache
            .get_or_build(AwsClientKey::of(&options("a")), build)
            .await;
        let again = cache
            .get_or_build(AwsClientKey::of(&options("a")), build)
            .await;
        let other = cache
            .get_or_build(AwsClientKey::of(&options("b")), build)
            .await;
        assert_eq!((first, again, other), (0, 0, 1));
        assert_eq!(
            built.load(Ordering::SeqCst),
            2,
            "one client per configuration"
        );
    }

    #[tokio::test]
    async fn a_full_client_cache_starts_afresh_instead_of_growing() {
        let cache = ClientCache::new(2);
        for (i, key) in ["a", "b", "c"].into_iter().enumerate() {
            let got = cache
                .get_or_build(AwsClientKey::of(&options(key)), || async move { i })
                .await;
            assert_eq!(got, i);
        }
        assert_eq!(
            cache.lock().len(),
            1,
            "cleared when full, then the new one kept"
        );
        let rebuilt = cache
            .get_or_build(AwsClientKey::of(&options("a")), || async { 9 })
            .await;
        assert_eq!(rebuilt, 9, "an evicted configuration gets a new client");
    }
}

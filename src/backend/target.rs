//! Lock URLs and the backends they name: the one place that turns
//! `s3://bucket/key`, `dynamodb://table/key`, `zk://host:port[,host:port…]/path` or
//! `k8s://namespace/lease` into a [`LockBackend`].
//!
//! [`Target::parse`] checks a URL without touching the network (every mistake is a
//! [`TargetError`] naming the expected form); [`Target::connect`] builds the store's
//! client from the standard sources:
//!
//! - S3 and DynamoDB: the AWS SDK default chain (`AWS_ENDPOINT_URL`, `AWS_REGION`,
//!   `AWS_PROFILE`, environment credentials, `~/.aws`, SSO, IRSA / Pod Identity, IMDS),
//!   overridden by [`ConnectOptions`]. With a custom endpoint, S3 uses path-style
//!   addressing unless told otherwise (S3-compatible servers rarely have the
//!   wildcard DNS virtual-hosted addressing needs).
//! - Kubernetes: `KUBECONFIG` / `~/.kube/config` / in-cluster service account
//!   (`kube::Client::try_default`), or a given context or client.
//! - ZooKeeper: the process-wide session of the ensemble ([`ZkSessions::global`]).
//!
//! Nothing here knows about the command-line tool or the operator; both use it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{Credentials, Region};

use super::dynamodb::{DEFAULT_PARTITION_KEY, DynamoStore, TableLayout};
use super::kubernetes::LeaseStore;
use super::s3::S3Store;
use super::zookeeper::ZkSessions;
use crate::lock::{CasLock, LockBackend, LockError};

/// The forms a lock URL may take, for error messages.
pub const URL_FORMS: &str = "s3://BUCKET/KEY, dynamodb://TABLE/KEY, \
     zk://HOST:PORT[,HOST:PORT…]/PATH or k8s://NAMESPACE/LEASE-NAME";

const S3_FORM: &str = "s3://BUCKET/KEY";
const DYNAMODB_FORM: &str = "dynamodb://TABLE/KEY";
const ZK_FORM: &str = "zk://HOST:PORT[,HOST:PORT…][/CHROOT]/PATH";
const K8S_FORM: &str = "k8s://NAMESPACE/LEASE-NAME";

/// The ZooKeeper client port used when a server is given without one.
pub const DEFAULT_ZK_PORT: u16 = 2181;

/// One lock key in one store.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// An object in an S3 bucket.
    S3 { bucket: String, key: String },
    /// An item in a DynamoDB table (partition key value `key`).
    DynamoDb { table: String, key: String },
    /// A queue of ephemeral sequential znodes under `chroot` + `path`.
    ///
    /// In a URL the chroot cannot be told apart from the path
    /// (`zk://h:2181/a/b` is chroot `/a`, path `/b` as much as path `/a/b`), and both
    /// name the same znodes, so [`Target::parse`] puts everything in `path`; the
    /// operator may still set a chroot explicitly.
    ZooKeeper {
        /// `host:port` of each server.
        servers: Vec<String>,
        /// `/a/b`, without a trailing slash.
        chroot: Option<String>,
        /// Absolute path of the lock (below the chroot, if any).
        path: String,
    },
    /// A `coordination.k8s.io/v1` Lease.
    Kubernetes { namespace: String, name: String },
}

/// A malformed lock URL. Every message names the URL and the expected form.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("{url:?} is not a lock URL: expected {URL_FORMS}")]
    NotAUrl { url: String },

    #[error("{url:?}: unknown scheme {scheme:?}: expected {URL_FORMS}")]
    UnknownScheme { url: String, scheme: String },

    #[error("{url:?}: {why}: expected {expected}")]
    Invalid {
        url: String,
        why: String,
        expected: &'static str,
    },
}

impl Target {
    /// Parses a lock URL, checking names against each store's rules, offline.
    pub fn parse(url: &str) -> Result<Target, TargetError> {
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(TargetError::NotAUrl {
                url: url.to_string(),
            });
        };
        match scheme.to_ascii_lowercase().as_str() {
            "s3" => parse_s3(url, rest),
            "dynamodb" | "ddb" => parse_dynamodb(url, rest),
            "zk" | "zookeeper" => parse_zk(url, rest),
            "k8s" | "kubernetes" | "lease" => parse_k8s(url, rest),
            _ => Err(TargetError::UnknownScheme {
                url: url.to_string(),
                scheme: scheme.to_string(),
            }),
        }
    }

    /// The backend kind: `s3`, `dynamodb`, `zookeeper` or `kubernetes`.
    pub fn kind(&self) -> &'static str {
        match self {
            Target::S3 { .. } => "s3",
            Target::DynamoDb { .. } => "dynamodb",
            Target::ZooKeeper { .. } => "zookeeper",
            Target::Kubernetes { .. } => "kubernetes",
        }
    }

    /// The canonical URL, as the backend's [`LockBackend::url`] reports it.
    pub fn url(&self) -> String {
        self.to_string()
    }

    /// The last segment of the key, path or name (`db` for `s3://b/locks/db`), e.g.
    /// for a default file name.
    pub fn basename(&self) -> &str {
        let full = match self {
            Target::S3 { key, .. } | Target::DynamoDb { key, .. } => key.as_str(),
            Target::ZooKeeper { path, .. } => path.as_str(),
            Target::Kubernetes { name, .. } => name.as_str(),
        };
        full.trim_end_matches('/')
            .rsplit('/')
            .next()
            .filter(|s| !s.is_empty())
            .unwrap_or(full)
    }

    /// Whether a lock on this store lives only as long as the process holding it
    /// (a ZooKeeper session), rather than for its lease.
    pub fn is_session_bound(&self) -> bool {
        matches!(self, Target::ZooKeeper { .. })
    }

    /// Builds the backend for this lock. Network access happens only where a store
    /// needs it to start (creating a DynamoDB table when asked, reading a kubeconfig's
    /// exec credentials); the lock itself is not touched.
    pub async fn connect(
        &self,
        options: &ConnectOptions,
    ) -> Result<Arc<dyn LockBackend>, ConnectError> {
        match self {
            Target::S3 { bucket, key } => {
                let client = s3_client(options).await;
                Ok(Arc::new(
                    CasLock::new(S3Store::new(client, bucket.clone(), key.clone()))
                        .with_delete_on_release(options.s3lock_compatible),
                ))
            }
            Target::DynamoDb { table, key } => {
                let client = dynamodb_client(options).await;
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
                            url: self.url(),
                            cause: e.to_string(),
                        })?;
                }
                Ok(Arc::new(CasLock::new(store)))
            }
            Target::ZooKeeper {
                servers,
                chroot,
                path,
            } => {
                let connect = format!("{}{}", servers.join(","), chroot.as_deref().unwrap_or(""));
                Ok(Arc::new(ZkSessions::global().lock(&connect, path)?))
            }
            Target::Kubernetes { namespace, name } => {
                let client = match &options.kube_client {
                    Some(client) => client.clone(),
                    None => {
                        kube_client(options.kube_context.as_deref())
                            .await
                            .map_err(|cause| ConnectError::Kubernetes {
                                url: self.url(),
                                cause,
                            })?
                    }
                };
                Ok(Arc::new(CasLock::new(LeaseStore::new(
                    client, namespace, name,
                ))))
            }
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::S3 { bucket, key } => write!(f, "s3://{bucket}/{key}"),
            Target::DynamoDb { table, key } => write!(f, "dynamodb://{table}/{key}"),
            Target::ZooKeeper {
                servers,
                chroot,
                path,
            } => write!(
                f,
                "zk://{}{}{path}",
                servers.join(","),
                chroot.as_deref().unwrap_or("")
            ),
            Target::Kubernetes { namespace, name } => write!(f, "k8s://{namespace}/{name}"),
        }
    }
}

impl std::str::FromStr for Target {
    type Err = TargetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Target::parse(s)
    }
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
    }
    loader.load().await
}

async fn s3_client(options: &ConnectOptions) -> aws_sdk_s3::Client {
    let sdk = sdk_config(options).await;
    let custom_endpoint = sdk.endpoint_url().is_some()
        || std::env::var_os("AWS_ENDPOINT_URL_S3").is_some_and(|v| !v.is_empty());
    let path_style = options.force_path_style.unwrap_or(custom_endpoint);
    let config = aws_sdk_s3::config::Builder::from(&sdk)
        .force_path_style(path_style)
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

async fn dynamodb_client(options: &ConnectOptions) -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::new(&sdk_config(options).await)
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

fn invalid(url: &str, why: impl Into<String>, expected: &'static str) -> TargetError {
    TargetError::Invalid {
        url: url.to_string(),
        why: why.into(),
        expected,
    }
}

/// Splits `first/rest` at the first slash; both parts must be non-empty.
fn split_two<'a>(
    url: &str,
    rest: &'a str,
    first: &str,
    second: &str,
    expected: &'static str,
) -> Result<(&'a str, &'a str), TargetError> {
    match rest.split_once('/') {
        None if rest.is_empty() => Err(invalid(url, format!("no {first}"), expected)),
        None => Err(invalid(
            url,
            format!("no {second} after the {first}"),
            expected,
        )),
        Some(("", _)) => Err(invalid(url, format!("no {first}"), expected)),
        Some((_, "")) => Err(invalid(url, format!("empty {second}"), expected)),
        Some(parts) => Ok(parts),
    }
}

fn no_control_chars(
    url: &str,
    what: &str,
    s: &str,
    expected: &'static str,
) -> Result<(), TargetError> {
    if s.chars().any(char::is_control) {
        return Err(invalid(
            url,
            format!("the {what} contains control characters"),
            expected,
        ));
    }
    Ok(())
}

fn parse_s3(url: &str, rest: &str) -> Result<Target, TargetError> {
    let (bucket, key) = split_two(url, rest, "bucket", "key", S3_FORM)?;
    // https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html
    let ok_chars = bucket
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-');
    let ok_ends = bucket.starts_with(|c: char| c.is_ascii_alphanumeric())
        && bucket.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !(3..=63).contains(&bucket.len()) || !ok_chars || !ok_ends || bucket.contains("..") {
        return Err(invalid(
            url,
            format!(
                "invalid bucket name {bucket:?} (3-63 lowercase letters, digits, dots and hyphens, starting and ending with a letter or digit)"
            ),
            S3_FORM,
        ));
    }
    if key.len() > 1024 {
        return Err(invalid(url, "the key is longer than 1024 bytes", S3_FORM));
    }
    no_control_chars(url, "key", key, S3_FORM)?;
    Ok(Target::S3 {
        bucket: bucket.to_string(),
        key: key.to_string(),
    })
}

fn parse_dynamodb(url: &str, rest: &str) -> Result<Target, TargetError> {
    let (table, key) = split_two(url, rest, "table", "key", DYNAMODB_FORM)?;
    let ok_chars = table
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !(3..=255).contains(&table.len()) || !ok_chars {
        return Err(invalid(
            url,
            format!(
                "invalid table name {table:?} (3-255 letters, digits, underscores, hyphens and dots)"
            ),
            DYNAMODB_FORM,
        ));
    }
    if key.len() > 2048 {
        return Err(invalid(
            url,
            "the key is longer than 2048 bytes",
            DYNAMODB_FORM,
        ));
    }
    no_control_chars(url, "key", key, DYNAMODB_FORM)?;
    Ok(Target::DynamoDb {
        table: table.to_string(),
        key: key.to_string(),
    })
}

fn parse_zk(url: &str, rest: &str) -> Result<Target, TargetError> {
    let (hosts, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if hosts.is_empty() {
        return Err(invalid(url, "no ZooKeeper server", ZK_FORM));
    }
    let mut servers = Vec::new();
    for server in hosts.split(',') {
        servers.push(parse_zk_server(url, server)?);
    }
    if path.is_empty() || path == "/" {
        return Err(invalid(url, "no lock path after the servers", ZK_FORM));
    }
    if path.ends_with('/') {
        return Err(invalid(url, "the path must not end with /", ZK_FORM));
    }
    if path
        .split('/')
        .skip(1)
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return Err(invalid(
            url,
            "the path has an empty, \".\" or \"..\" segment",
            ZK_FORM,
        ));
    }
    no_control_chars(url, "path", path, ZK_FORM)?;
    Ok(Target::ZooKeeper {
        servers,
        chroot: None,
        path: path.to_string(),
    })
}

fn parse_zk_server(url: &str, server: &str) -> Result<String, TargetError> {
    let server = server.trim();
    if server.is_empty() {
        return Err(invalid(
            url,
            "empty server address in the server list",
            ZK_FORM,
        ));
    }
    // `[v6::addr]:port`, `host:port` or `host`.
    let (host, port) = if let Some(inner) = server.strip_prefix('[') {
        match inner.split_once(']') {
            Some((addr, "")) => (format!("[{addr}]"), None),
            Some((addr, port)) if port.starts_with(':') => (format!("[{addr}]"), Some(&port[1..])),
            _ => {
                return Err(invalid(
                    url,
                    format!("invalid server address {server:?}"),
                    ZK_FORM,
                ));
            }
        }
    } else {
        match server.rsplit_once(':') {
            Some((host, port)) => (host.to_string(), Some(port)),
            None => (server.to_string(), None),
        }
    };
    let host_ok = !host.is_empty()
        && (host.starts_with('[')
            || host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')));
    if !host_ok {
        return Err(invalid(
            url,
            format!("invalid server host {host:?}"),
            ZK_FORM,
        ));
    }
    let port = match port {
        None => DEFAULT_ZK_PORT,
        Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
            invalid(
                url,
                format!("invalid port {p:?} for server {host} (1-65535)"),
                ZK_FORM,
            )
        })?,
    };
    Ok(format!("{host}:{port}"))
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

fn parse_k8s(url: &str, rest: &str) -> Result<Target, TargetError> {
    let (namespace, name) = split_two(url, rest, "namespace", "Lease name", K8S_FORM)?;
    if !is_dns_label(namespace) {
        return Err(invalid(
            url,
            format!(
                "invalid namespace {namespace:?} (a DNS label: at most 63 lowercase letters, digits and hyphens)"
            ),
            K8S_FORM,
        ));
    }
    if !is_dns_subdomain(name) {
        return Err(invalid(
            url,
            format!(
                "invalid Lease name {name:?} (a DNS subdomain: lowercase letters, digits, hyphens and dots)"
            ),
            K8S_FORM,
        ));
    }
    Ok(Target::Kubernetes {
        namespace: namespace.to_string(),
        name: name.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(url: &str) -> Target {
        Target::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    fn err(url: &str) -> String {
        match Target::parse(url) {
            Ok(t) => panic!("{url} parsed as {t:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn parses_every_backend() {
        assert_eq!(
            ok("s3://my-bucket/locks/db"),
            Target::S3 {
                bucket: "my-bucket".into(),
                key: "locks/db".into()
            }
        );
        assert_eq!(
            ok("dynamodb://Locks_1/db"),
            Target::DynamoDb {
                table: "Locks_1".into(),
                key: "db".into()
            }
        );
        assert_eq!(
            ok("zk://a:2181,b:2182,c/chroot/locks/db"),
            Target::ZooKeeper {
                servers: vec!["a:2181".into(), "b:2182".into(), "c:2181".into()],
                chroot: None,
                path: "/chroot/locks/db".into()
            }
        );
        assert_eq!(
            ok("k8s://payments/db-migration"),
            Target::Kubernetes {
                namespace: "payments".into(),
                name: "db-migration".into()
            }
        );
        assert_eq!(
            ok("zk://[::1]:2181/l").to_string(),
            "zk://[::1]:2181/l".to_string()
        );
    }

    #[test]
    fn display_round_trips() {
        for url in [
            "s3://b12/a/b/c",
            "dynamodb://table/x/y",
            "zk://127.0.0.1:2181,127.0.0.1:2182/locks/x",
            "k8s://ns/lease.name",
        ] {
            assert_eq!(ok(url).to_string(), url);
            assert_eq!(ok(&ok(url).to_string()), ok(url));
        }
    }

    #[test]
    fn basename_is_the_last_segment() {
        assert_eq!(ok("s3://bucket/a/b/lock-object").basename(), "lock-object");
        assert_eq!(ok("s3://bucket/lock-object").basename(), "lock-object");
        assert_eq!(ok("zk://h:1/locks/db").basename(), "db");
        assert_eq!(ok("k8s://ns/name").basename(), "name");
        assert_eq!(ok("dynamodb://tab/key/").basename(), "key");
    }

    #[test]
    fn malformed_urls_name_the_expected_form() {
        for (url, expect) in [
            ("bucket/key", "expected s3://BUCKET/KEY, dynamodb://"),
            ("ftp://a/b", "unknown scheme \"ftp\""),
            ("s3://", "no bucket: expected s3://BUCKET/KEY"),
            ("s3://bucket", "no key after the bucket"),
            ("s3://bucket/", "empty key"),
            ("s3:///key", "no bucket"),
            ("s3://Bad_Bucket/key", "invalid bucket name \"Bad_Bucket\""),
            ("s3://ab/key", "invalid bucket name"),
            ("dynamodb://t/key", "invalid table name \"t\""),
            ("dynamodb://table", "no key after the table"),
            ("zk:///locks", "no ZooKeeper server"),
            ("zk://h:2181", "no lock path"),
            ("zk://h:2181/", "no lock path"),
            ("zk://h:port/x", "invalid port \"port\""),
            ("zk://h:0/x", "invalid port \"0\""),
            ("zk://a:1,,b:2/x", "empty server address"),
            ("zk://h:1/a//b", "empty"),
            ("zk://h:1/a/../b", "\"..\""),
            ("zk://h:1/a/", "must not end with /"),
            ("k8s://ns", "no Lease name"),
            ("k8s://Bad_NS/x", "invalid namespace \"Bad_NS\""),
            ("k8s://ns/Bad_Name", "invalid Lease name"),
            ("k8s://ns/a/b", "invalid Lease name \"a/b\""),
        ] {
            let msg = err(url);
            assert!(msg.contains(expect), "{url}: {msg:?} lacks {expect:?}");
            assert!(msg.contains(url), "{url}: {msg:?} does not name the URL");
            assert!(!msg.contains('\n'), "{url}: {msg:?}");
        }
    }
}

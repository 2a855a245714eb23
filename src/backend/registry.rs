//! Lock URLs, the pure grammar: `s3://bucket/key`, `dynamodb://table/key`,
//! `zk://host:port[,host:port…]/path` and `k8s://namespace/lease` as a [`Target`], and
//! back ([`fmt::Display`]).
//!
//! [`Target::parse`] checks a URL without touching the network: every mistake is a
//! [`TargetError`] naming the URL and the expected form, and names and sizes are
//! checked by [`crate::lock::names`], the rules the CRD applies too. Turning a
//! [`Target`] into a backend is [`connect`](crate::backend::connect())'s job.

use std::fmt;

use crate::lock::names::{self, NameError};

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

    /// The canonical URL, as the backend's [`LockBackend::url`](crate::lock::LockBackend::url)
    /// reports it.
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
}

impl Target {
    /// What names the lock in its store, without how the store is reached (a ZooKeeper
    /// URL's server list differs between clients of one ensemble): the same for every
    /// client of one lock. Workloads that take several locks take them in this order.
    pub fn order_key(&self) -> String {
        match self {
            Target::ZooKeeper { chroot, path, .. } => {
                format!("zk://{}{path}", chroot.as_deref().unwrap_or(""))
            }
            other => other.to_string(),
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

/// A name or key the store's rules refuse, in the URL's terms.
fn bad_name(url: &str, error: NameError, expected: &'static str) -> TargetError {
    invalid(url, error.to_string(), expected)
}

fn parse_s3(url: &str, rest: &str) -> Result<Target, TargetError> {
    let (bucket, key) = split_two(url, rest, "bucket", "key", S3_FORM)?;
    names::s3_bucket(bucket).map_err(|e| bad_name(url, e.named("bucket name"), S3_FORM))?;
    names::s3_key(key).map_err(|e| bad_name(url, e, S3_FORM))?;
    Ok(Target::S3 {
        bucket: bucket.to_string(),
        key: key.to_string(),
    })
}

fn parse_dynamodb(url: &str, rest: &str) -> Result<Target, TargetError> {
    let (table, key) = split_two(url, rest, "table", "key", DYNAMODB_FORM)?;
    names::dynamodb_table(table)
        .map_err(|e| bad_name(url, e.named("table name"), DYNAMODB_FORM))?;
    names::dynamodb_key(key).map_err(|e| bad_name(url, e, DYNAMODB_FORM))?;
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
    names::zookeeper_path(path).map_err(|e| bad_name(url, e, ZK_FORM))?;
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

fn parse_k8s(url: &str, rest: &str) -> Result<Target, TargetError> {
    let (namespace, name) = split_two(url, rest, "namespace", "Lease name", K8S_FORM)?;
    names::kubernetes_namespace(namespace).map_err(|e| bad_name(url, e, K8S_FORM))?;
    names::kubernetes_name(name).map_err(|e| bad_name(url, e.named("Lease name"), K8S_FORM))?;
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
    fn order_key_is_the_same_for_every_client_of_one_lock() {
        let a = Target::parse("zk://h1:2181,h2:2181/locks/x").unwrap();
        let b = Target::parse("zk://10.0.0.9:2181/locks/x").unwrap();
        assert_eq!(a.order_key(), b.order_key());
        assert_eq!(a.order_key(), "zk:///locks/x");
        let s3 = Target::parse("s3://bucket/a/b").unwrap();
        assert_eq!(s3.order_key(), "s3://bucket/a/b");
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

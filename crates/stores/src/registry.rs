//! The one list of stores. A store lives in `<store>/`: its lock key and URL grammar
//! (`key.rs`), its connection options and its
//! [`RecordStore`](lockwarden_core::RecordStore), behind its own feature. It joins
//! lockwarden here: a variant of [`BackendKind`] and [`Target`], a field of
//! [`ConnectOptions`] and a line in each `match` of this file. Apart from
//! lockwarden-api, which composes the stores' specs into `spec.backend`, nothing else
//! names a store (`tests/layout.rs` checks it).
//!
//! Without a store's feature its URLs still parse and its options exist (lockwarden-api
//! needs them), but [`connect`] refuses it with [`ConnectError::NotBuilt`].
//!
//! [`Target::parse`] checks a lock URL without touching the network: every mistake is a
//! [`TargetError`] naming the URL and the expected form. [`connect`] turns a
//! [`Target`] and [`ConnectOptions`] into a [`LockBackend`].

use std::fmt;
use std::sync::Arc;

#[cfg(feature = "cli")]
use serde::{Deserialize, Serialize};

use lockwarden_core::LockBackend;
use lockwarden_core::fenced::{FencedError, FencedObject};

use crate::aws::{self, AwsOptions};
use crate::dynamodb::{self, DynamoDbKey, DynamoDbOptions};
use crate::kubernetes::{self, KubernetesOptions, LeaseKey};
use crate::pollers::{PollingTool, SharedWith};
use crate::s3::{self, S3Key, S3Options};
use crate::store::{ConnectError, RecordedAcquisition, StoreKey, TargetError};
#[cfg(feature = "zookeeper")]
use crate::zookeeper;
use crate::zookeeper::{ZkKey, ZooKeeperOptions};
#[cfg(feature = "cli")]
use crate::{aws::AwsFlags, dynamodb::DynamoDbFlags, kubernetes::KubernetesFlags};
#[cfg(feature = "cli")]
use crate::{s3::S3Flags, zookeeper::ZooKeeperFlags};

/// Which kind of store a lock lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    S3,
    DynamoDb,
    ZooKeeper,
    Kubernetes,
}

impl BackendKind {
    /// Every kind, in the order of `spec.backend`'s fields.
    pub const ALL: [BackendKind; 4] = [
        BackendKind::S3,
        BackendKind::DynamoDb,
        BackendKind::ZooKeeper,
        BackendKind::Kubernetes,
    ];

    /// The field name in `spec.backend` and the `Backend` printer column value:
    /// `s3`, `dynamodb`, `zookeeper`, `kubernetes`.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::S3 => S3Key::KIND,
            BackendKind::DynamoDb => DynamoDbKey::KIND,
            BackendKind::ZooKeeper => ZkKey::KIND,
            BackendKind::Kubernetes => LeaseKey::KIND,
        }
    }

    /// The URL schemes of lock keys of this kind; the first is canonical (`s3`,
    /// `dynamodb`, `zk`, `k8s`).
    pub fn schemes(self) -> &'static [&'static str] {
        match self {
            BackendKind::S3 => S3Key::SCHEMES,
            BackendKind::DynamoDb => DynamoDbKey::SCHEMES,
            BackendKind::ZooKeeper => ZkKey::SCHEMES,
            BackendKind::Kubernetes => LeaseKey::SCHEMES,
        }
    }

    /// The canonical URL scheme of lock keys of this kind.
    pub fn scheme(self) -> &'static str {
        self.schemes()[0]
    }

    /// The URL form of lock keys of this kind (`s3://BUCKET/KEY`).
    pub fn form(self) -> &'static str {
        match self {
            BackendKind::S3 => S3Key::FORM,
            BackendKind::DynamoDb => DynamoDbKey::FORM,
            BackendKind::ZooKeeper => ZkKey::FORM,
            BackendKind::Kubernetes => LeaseKey::FORM,
        }
    }

    /// What a lock of this kind is, for `--help`.
    pub fn about(self) -> &'static str {
        match self {
            BackendKind::S3 => S3Key::ABOUT,
            BackendKind::DynamoDb => DynamoDbKey::ABOUT,
            BackendKind::ZooKeeper => ZkKey::ABOUT,
            BackendKind::Kubernetes => LeaseKey::ABOUT,
        }
    }

    /// Every kind's name with `prefix` before it, as a list ending in `last`:
    /// `listed("", "or")` is `s3, dynamodb, zookeeper or kubernetes`.
    pub fn listed(prefix: &str, last: &str) -> String {
        let names: Vec<String> = BackendKind::ALL
            .iter()
            .map(|k| format!("{prefix}{k}"))
            .collect();
        join_list(&names, last)
    }

    /// Every form a lock URL may take, for messages.
    pub fn url_forms() -> String {
        let forms: Vec<String> = BackendKind::ALL
            .iter()
            .map(|k| k.form().to_string())
            .collect();
        join_list(&forms, "or")
    }

    /// The lock URL forms, one line each with what they name, for `--help`.
    pub fn url_help() -> String {
        BackendKind::ALL
            .iter()
            .map(|k| format!("  {:<44} {}\n", k.form(), k.about()))
            .collect()
    }
}

/// `a, b, c <last> d`.
fn join_list(items: &[String], last: &str) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., end] => format!("{} {last} {end}", init.join(", ")),
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One lock key in one store.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// An object in an S3 bucket.
    S3(S3Key),
    /// An item in a DynamoDB table.
    DynamoDb(DynamoDbKey),
    /// A queue of ephemeral sequential znodes.
    ZooKeeper(ZkKey),
    /// A `coordination.k8s.io/v1` Lease.
    Kubernetes(LeaseKey),
}

/// `$body` with `$key` bound to the store's key, whichever store `$target` is in.
macro_rules! on_key {
    ($target:expr, $key:ident => $body:expr) => {
        match $target {
            Target::S3($key) => $body,
            Target::DynamoDb($key) => $body,
            Target::ZooKeeper($key) => $body,
            Target::Kubernetes($key) => $body,
        }
    };
}

impl Target {
    /// Parses a lock URL, checking names against each store's rules, offline.
    pub fn parse(url: &str) -> Result<Target, TargetError> {
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(TargetError::NotAUrl {
                url: url.to_string(),
                expected: BackendKind::url_forms(),
            });
        };
        let lowercase = scheme.to_ascii_lowercase();
        let kind = BackendKind::ALL
            .into_iter()
            .find(|k| k.schemes().contains(&lowercase.as_str()));
        Ok(match kind {
            Some(BackendKind::S3) => Target::S3(S3Key::parse(url, rest)?),
            Some(BackendKind::DynamoDb) => Target::DynamoDb(DynamoDbKey::parse(url, rest)?),
            Some(BackendKind::ZooKeeper) => Target::ZooKeeper(ZkKey::parse(url, rest)?),
            Some(BackendKind::Kubernetes) => Target::Kubernetes(LeaseKey::parse(url, rest)?),
            None => {
                return Err(TargetError::UnknownScheme {
                    url: url.to_string(),
                    scheme: scheme.to_string(),
                    expected: BackendKind::url_forms(),
                });
            }
        })
    }

    /// The store the key is in.
    pub fn backend_kind(&self) -> BackendKind {
        match self {
            Target::S3(_) => BackendKind::S3,
            Target::DynamoDb(_) => BackendKind::DynamoDb,
            Target::ZooKeeper(_) => BackendKind::ZooKeeper,
            Target::Kubernetes(_) => BackendKind::Kubernetes,
        }
    }

    /// The backend kind: `s3`, `dynamodb`, `zookeeper` or `kubernetes`.
    pub fn kind(&self) -> &'static str {
        self.backend_kind().as_str()
    }

    /// The canonical URL, as the backend's [`LockBackend::url`] reports it.
    pub fn url(&self) -> String {
        self.to_string()
    }

    /// The last segment of the key, path or name (`db` for `s3://b/locks/db`), e.g.
    /// for a default file name.
    pub fn basename(&self) -> &str {
        let full = on_key!(self, key => key.name());
        full.trim_end_matches('/')
            .rsplit('/')
            .next()
            .filter(|s| !s.is_empty())
            .unwrap_or(full)
    }

    /// Whether a lock on this store lives only as long as the process holding it
    /// (a ZooKeeper session), rather than for its lease.
    pub fn is_session_bound(&self) -> bool {
        on_key!(self, key => key.is_session_bound())
    }

    /// Whether a lock-delay (docs/design.md rule 8) can be stored for this key.
    pub fn supports_lock_delay(&self) -> bool {
        on_key!(self, key => key.supports_lock_delay())
    }

    /// Whether a queued contender may ask for a priority or a weight here.
    pub fn supports_priorities(&self) -> bool {
        on_key!(self, key => key.supports_priorities())
    }

    /// What names the lock in its store, without how the store is reached (a ZooKeeper
    /// URL's server list differs between clients of one ensemble): the same for every
    /// client of one lock. Workloads that take several locks take them in this order.
    pub fn order_key(&self) -> String {
        on_key!(self, key => key.order_key())
    }

    /// The store's fields of a lock file for an acquisition of this key
    /// ([`StoreKey::lock_file_fields`]).
    pub fn lock_file_fields(&self, nonce: &str, version: &str) -> crate::LockFileFields {
        on_key!(self, key => key.lock_file_fields(nonce, version))
    }

    /// Whether a lock file's store fields name this key
    /// ([`StoreKey::check_lock_file_fields`]).
    pub fn check_lock_file_fields(
        &self,
        fields: &crate::LockFileFields,
    ) -> Result<(), crate::LockFileMismatch> {
        on_key!(self, key => key.check_lock_file_fields(fields))
    }

    /// Whether reaching this lock with `options` verifies a TLS certificate against the
    /// system's root certificates (S3 and DynamoDB over `https://`, AWS itself by
    /// default). A Lease is reached with the kubeconfig's or service account's own CA,
    /// and ZooKeeper without TLS.
    pub fn needs_system_roots(&self, options: &ConnectOptions) -> bool {
        match self {
            Target::S3(_) => aws::reached_over_tls(&options.aws, "AWS_ENDPOINT_URL_S3"),
            Target::DynamoDb(_) => aws::reached_over_tls(&options.aws, "AWS_ENDPOINT_URL_DYNAMODB"),
            Target::ZooKeeper(_) | Target::Kubernetes(_) => false,
        }
    }

    /// [`connect`] for this lock.
    pub async fn connect(
        &self,
        options: &ConnectOptions,
    ) -> Result<Arc<dyn LockBackend>, ConnectError> {
        connect(self, options).await
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        on_key!(self, key => key.fmt(f))
    }
}

impl std::str::FromStr for Target {
    type Err = TargetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Target::parse(s)
    }
}

/// Why a lock cannot be held as Terraform and OpenTofu hold their state lock
/// (`--terraform-compatible`; docs/design.md §6.8).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotAStateLock {
    #[error(
        "Terraform and OpenTofu lock their state on S3 (a .tflock object) or DynamoDB (their \
         lock table), not on {url}"
    )]
    Store { url: String },
    #[error(
        "{url} is no state lock: an S3 state lock's key is the state's key followed by \
         {suffix}",
        suffix = crate::terraform::S3_LOCK_SUFFIX
    )]
    S3Key { url: String },
    #[error(
        "{url}: the tools' DynamoDB lock table has the partition key {key} (--partition-key \
         {key})",
        key = crate::terraform::DYNAMODB_LOCK_KEY
    )]
    PartitionKey { url: String },
}

impl Target {
    /// The state this lock protects when held as a Terraform/OpenTofu state lock
    /// (`<bucket>/<state key>`), with `options` naming how its store is laid out.
    pub fn state_lock_path(&self, options: &ConnectOptions) -> Result<String, NotAStateLock> {
        let url = self.url();
        match self {
            Target::S3(key) => crate::terraform::s3_state_path(&key.bucket, &key.key)
                .ok_or(NotAStateLock::S3Key { url }),
            Target::DynamoDb(key) => {
                let partition_key = options.dynamodb.partition_key.as_deref();
                if partition_key == Some(crate::terraform::DYNAMODB_LOCK_KEY) {
                    Ok(key.key.clone())
                } else {
                    Err(NotAStateLock::PartitionKey { url })
                }
            }
            Target::ZooKeeper(_) | Target::Kubernetes(_) => Err(NotAStateLock::Store { url }),
        }
    }
}

/// How to reach a store, beyond what the lock URL says: each store's own options.
/// Everything is optional; the defaults come from the environment (each store's
/// module says which).
#[derive(Clone, Debug, Default)]
pub struct ConnectOptions {
    /// S3 and DynamoDB: endpoint, region, credentials, request timeout.
    pub aws: AwsOptions,
    pub s3: S3Options,
    pub dynamodb: DynamoDbOptions,
    pub zookeeper: ZooKeeperOptions,
    pub kubernetes: KubernetesOptions,
}

/// Every store's command-line flags (feature `cli`) (`lockwarden lock --endpoint … --kube-context …`),
/// each declared with its store; a lock file saves them (those a store marks so), so
/// `unlock` reaches the same store without repeating them.
#[cfg(feature = "cli")]
#[derive(clap::Args, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[command(next_help_heading = "Backend options")]
#[serde(default)]
pub struct StoreFlags {
    #[command(flatten)]
    #[serde(flatten)]
    pub aws: AwsFlags,
    #[command(flatten)]
    #[serde(flatten)]
    pub s3: S3Flags,
    #[command(flatten)]
    #[serde(flatten)]
    pub dynamodb: DynamoDbFlags,
    #[command(flatten)]
    #[serde(flatten)]
    pub kubernetes: KubernetesFlags,
    #[command(flatten)]
    #[serde(flatten)]
    pub zookeeper: ZooKeeperFlags,
}

#[cfg(feature = "cli")]
impl StoreFlags {
    /// These flags, falling back to `saved` (what a lock file recorded) for anything
    /// not given.
    pub fn options(&self, saved: Option<&StoreFlags>) -> ConnectOptions {
        let saved = saved.cloned().unwrap_or_default();
        // One flag for both stores that carry the tools' state locks.
        let terraform = self.aws.terraform_compatible || saved.aws.terraform_compatible;
        ConnectOptions {
            aws: self.aws.options(&saved.aws),
            s3: S3Options {
                terraform_compatible: terraform,
                ..self.s3.options(&saved.s3)
            },
            dynamodb: DynamoDbOptions {
                terraform_compatible: terraform,
                ..self.dynamodb.options(&saved.dynamodb)
            },
            zookeeper: self.zookeeper.options(),
            kubernetes: self.kubernetes.options(&saved.kubernetes),
        }
    }

    /// What a lock file records: the flags a store saves.
    pub fn saved(&self) -> StoreFlags {
        let json = serde_json::to_value(self).expect("flags serialise");
        serde_json::from_value(json).expect("saved flags read back")
    }

    /// Whether nothing would be saved.
    pub fn is_empty(&self) -> bool {
        self.saved() == StoreFlags::default()
    }
}

/// `$built` where the store's `$feature` is on, else `Err($not_built)`; `$unused` are
/// what only `$built` uses.
macro_rules! built {
    ($feature:tt, ($($unused:expr),*), $built:expr, else $not_built:expr) => {{
        #[cfg(feature = $feature)]
        let outcome = $built;
        #[cfg(not(feature = $feature))]
        let outcome = {
            let _ = ($($unused),*);
            Err($not_built)
        };
        outcome
    }};
}

/// Bounds the requests one store client keeps in flight (default
/// [`aws::DEFAULT_REQUESTS_IN_FLIGHT`]), for the clients built from now
/// on (the controller's `--store-requests-in-flight`). S3 and DynamoDB clients wait
/// beyond it (`aws/in_flight.rs`); a ZooKeeper session is one connection whatever is in
/// flight, and Lease requests go through the Kubernetes client, so neither needs it.
pub fn set_requests_in_flight(limit: usize) {
    #[cfg(feature = "aws")]
    aws::set_requests_in_flight(limit);
    #[cfg(not(feature = "aws"))]
    let _ = limit;
}

/// The request counters of each kind of store that bounds its requests in flight
/// ([`set_requests_in_flight`]), for the controller's metrics.
#[cfg(feature = "aws")]
pub fn requests_in_flight_stats() -> Vec<(BackendKind, &'static aws::InFlightStats)> {
    [
        #[cfg(feature = "s3")]
        (BackendKind::S3, &s3::IN_FLIGHT),
        #[cfg(feature = "dynamodb")]
        (BackendKind::DynamoDb, &dynamodb::IN_FLIGHT),
    ]
    .into_iter()
    .collect()
}

/// Builds the backend for the lock `target` names. Network access happens only where
/// a store needs it to start (creating a DynamoDB table when asked, reading a
/// kubeconfig's exec credentials); the lock itself is not touched.
pub async fn connect(
    target: &Target,
    options: &ConnectOptions,
) -> Result<Arc<dyn LockBackend>, ConnectError> {
    match target {
        Target::S3(key) => built!(
            "s3",
            (key, options),
            s3::connect(key, &options.aws, &options.s3).await,
            else ConnectError::NotBuilt { store: S3Key::KIND }
        ),
        Target::DynamoDb(key) => built!(
            "dynamodb",
            (key, options),
            dynamodb::connect(key, &options.aws, &options.dynamodb).await,
            else ConnectError::NotBuilt { store: DynamoDbKey::KIND }
        ),
        Target::ZooKeeper(key) => built!(
            "zookeeper",
            (key, options),
            zookeeper::connect(key, &options.zookeeper)
                .map(|lock| Arc::new(lock) as Arc<dyn LockBackend>)
                .map_err(ConnectError::from),
            else ConnectError::NotBuilt { store: ZkKey::KIND }
        ),
        Target::Kubernetes(key) => built!(
            "kubernetes",
            (key, options),
            kubernetes::connect(key, &options.kubernetes).await,
            else ConnectError::NotBuilt { store: LeaseKey::KIND }
        ),
    }
}

/// What a fenced write goes to (`lockwarden put TARGET`): an S3 object or a DynamoDB
/// item, named like a lock of that store, or a Kubernetes object,
/// `k8s://NAMESPACE/RESOURCE/NAME` (three segments, where a Lease lock has two).
#[derive(Clone, Debug, PartialEq)]
pub enum FencedTarget {
    Store(Target),
    KubernetesObject(kubernetes::ObjectTarget),
}

impl FencedTarget {
    /// Checks a target URL without touching the network.
    pub fn parse(url: &str) -> Result<FencedTarget, TargetError> {
        if let Some((scheme, rest)) = url.split_once("://")
            && BackendKind::Kubernetes
                .schemes()
                .contains(&scheme.to_ascii_lowercase().as_str())
            && kubernetes::ObjectTarget::is_object_path(rest)
        {
            return kubernetes::ObjectTarget::parse(url, rest).map(FencedTarget::KubernetesObject);
        }
        Target::parse(url).map(FencedTarget::Store)
    }

    pub fn url(&self) -> String {
        match self {
            FencedTarget::Store(target) => target.url(),
            FencedTarget::KubernetesObject(object) => object.url(),
        }
    }
}

impl fmt::Display for FencedTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.url())
    }
}

/// The object a fenced write goes to, reached as a lock of that store would be. No
/// request is made yet, except that a Kubernetes client reads its kubeconfig. A
/// ZooKeeper node or a Lease is no fenced object: refused, naming the targets that are.
pub async fn connect_fenced(
    target: &FencedTarget,
    options: &ConnectOptions,
) -> Result<Box<dyn FencedObject>, FencedError> {
    #[cfg(not(all(feature = "s3", feature = "dynamodb", feature = "kubernetes")))]
    let not_built = |store| FencedError::Unsupported(ConnectError::NotBuilt { store }.to_string());
    match target {
        FencedTarget::Store(Target::S3(key)) => built!(
            "s3",
            (key, options),
            Ok(s3::connect_fenced(key, &options.aws, &options.s3).await),
            else not_built(S3Key::KIND)
        ),
        FencedTarget::Store(Target::DynamoDb(key)) => built!(
            "dynamodb",
            (key, options),
            Ok(dynamodb::connect_fenced(key, &options.aws, &options.dynamodb).await),
            else not_built(DynamoDbKey::KIND)
        ),
        FencedTarget::KubernetesObject(object) => built!(
            "kubernetes",
            (object, options),
            kubernetes::fenced::connect_fenced(object, &options.kubernetes).await,
            else not_built(LeaseKey::KIND)
        ),
        FencedTarget::Store(other) => Err(FencedError::Unsupported(format!(
            "fenced writes to {} locks are not supported: the target must be {}, {} or {}",
            other.kind(),
            BackendKind::S3.form(),
            BackendKind::DynamoDb.form(),
            kubernetes::object::OBJECT_FORM
        ))),
    }
}

/// Releases `recorded` from a process that did not acquire it (`lockwarden unlock`),
/// only if the lock still belongs to that acquisition:
///
/// - stores with one record (S3, DynamoDB, Kubernetes Lease): re-attach by nonce, then
///   release with a write conditioned on the recorded version (should the record have
///   moved on within the same acquisition, the engine re-reads and follows it);
/// - ZooKeeper: the lock is a queue entry of another process's session; see
///   [`zookeeper::release_recorded`].
///
/// A lock no longer this acquisition's is `Lock(LockError::Lost { reason })` (released,
/// expired or taken over) or `Lock(LockError::NotHeld)` (released elsewhere).
pub async fn release_recorded(
    target: &Target,
    options: &ConnectOptions,
    recorded: &RecordedAcquisition,
) -> Result<(), ConnectError> {
    if let Target::ZooKeeper(key) = target {
        return built!(
            "zookeeper",
            (key, options, recorded),
            zookeeper::release_recorded(key, &options.zookeeper, recorded).await,
            else ConnectError::NotBuilt { store: ZkKey::KIND }
        );
    }
    let backend = connect(target, options).await?;
    let mut lease = backend.resume(&recorded.holder, &recorded.nonce).await?;
    lease.version = recorded.version.clone();
    Ok(backend.release(&lease).await?)
}

/// Every tool lockwarden can yield to (`--shared-with`), one per store that has one.
pub const POLLING_TOOLS: [PollingTool; 3] = [
    s3::POLLING_TOOL,
    dynamodb::POLLING_TOOL,
    kubernetes::POLLING_TOOL,
];

impl SharedWith {
    /// The tool named `name` (one of [`POLLING_TOOLS`]) at its default period.
    pub fn named(name: &str) -> Option<SharedWith> {
        POLLING_TOOLS
            .iter()
            .find(|t| t.name == name)
            .map(|&tool| SharedWith {
                tool,
                period: tool.default_period,
            })
    }

    /// The names, for messages.
    pub fn names() -> String {
        POLLING_TOOLS
            .iter()
            .map(|t| format!("{} ({})", t.name, t.store))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_parses_from_each_of_its_schemes_and_lists_its_form() {
        for kind in BackendKind::ALL {
            assert!(BackendKind::url_forms().contains(kind.form()), "{kind}");
            assert!(BackendKind::url_help().contains(kind.about()), "{kind}");
        }
        assert_eq!(
            BackendKind::listed("backend.", "or"),
            "backend.s3, backend.dynamodb, backend.zookeeper or backend.kubernetes"
        );
        for (url, kind) in [
            ("S3://b12/k", BackendKind::S3),
            ("ddb://table/k", BackendKind::DynamoDb),
            ("zookeeper://h:1/l", BackendKind::ZooKeeper),
            ("lease://ns/l", BackendKind::Kubernetes),
        ] {
            assert_eq!(Target::parse(url).unwrap().backend_kind(), kind, "{url}");
        }
    }

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
            Target::S3(S3Key {
                bucket: "my-bucket".into(),
                key: "locks/db".into()
            })
        );
        assert_eq!(
            ok("dynamodb://Locks_1/db"),
            Target::DynamoDb(DynamoDbKey {
                table: "Locks_1".into(),
                key: "db".into()
            })
        );
        assert_eq!(
            ok("zk://a:2181,b:2182,c/chroot/locks/db"),
            Target::ZooKeeper(ZkKey {
                servers: vec!["a:2181".into(), "b:2182".into(), "c:2181".into()],
                chroot: None,
                path: "/chroot/locks/db".into()
            })
        );
        assert_eq!(
            ok("k8s://payments/db-migration"),
            Target::Kubernetes(LeaseKey {
                namespace: "payments".into(),
                name: "db-migration".into()
            })
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

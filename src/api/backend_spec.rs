//! `spec.backend`: where the lock lives. Exactly one of the four kinds is set.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

pub use super::kind::BackendKind;

use super::SpecError;
use super::validation::*;
use crate::backend::{ConnectOptions, Target};
use crate::lock::names::{self, NameError};

/// Where the lock is stored: exactly one of `s3`, `dynamodb`, `zookeeper` or
/// `kubernetes`. The kind and the fields naming the lock cannot change after creation.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::api::strip_nullable)]
#[x_kube(validation = exactly_one_backend(), validation = backend_kind_immutable())]
pub struct BackendSpec {
    /// A lock object in an S3 bucket (conditional writes on its ETag).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Backend>,
    /// A lock item in a DynamoDB table (conditional writes on a revision attribute).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamodb: Option<DynamoDbBackend>,
    /// A lock queue under a ZooKeeper path (ephemeral sequential nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zookeeper: Option<ZooKeeperBackend>,
    /// A coordination.k8s.io Lease in this (or another) cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesBackend>,
}

/// A lock object in S3 (or an S3-compatible store).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::api::strip_nullable)]
pub struct S3Backend {
    /// Bucket name.
    #[schemars(length(max = 63))]
    #[x_kube(validation = s3_bucket(), validation = immutable("bucket"))]
    pub bucket: String,
    /// Object key of the lock record (at most 1,024 bytes of UTF-8).
    #[schemars(length(max = names::S3_KEY_MAX_BYTES))]
    #[x_kube(
        validation = non_empty("key"),
        validation = max_bytes("key", names::S3_KEY_MAX_BYTES),
        validation = no_control_characters("key"),
        validation = immutable("key")
    )]
    pub key: String,
    /// AWS region; the usual AWS configuration chain when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub region: Option<String>,
    /// Endpoint URL of an S3-compatible store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub endpoint: Option<String>,
    /// Path-style addressing (`endpoint/bucket/key`), needed by most S3-compatible stores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force_path_style: Option<bool>,
    /// A Secret in the lock's namespace with AWS credentials
    /// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, optional `AWS_SESSION_TOKEN`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<SecretRef>,
    /// Delete the object on release (after writing the release record), so
    /// winebarrel/s3lock clients, which lock with `PUT If-None-Match: *`, can lock the
    /// key after lockwarden. The fencing token then restarts at 1 after each release
    /// (the object holding the counter is gone). Needs `s3:DeleteObject`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3lock_compatible: Option<bool>,
}

/// A lock item in DynamoDB.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::api::strip_nullable)]
#[x_kube(validation = optional_immutable("sortKey"))]
pub struct DynamoDbBackend {
    /// Table name.
    #[schemars(length(max = 255))]
    #[x_kube(validation = dynamodb_table(), validation = immutable("table"))]
    pub table: String,
    /// Partition key value of the lock item (at most 2,048 bytes of UTF-8).
    #[schemars(length(max = names::DYNAMODB_KEY_MAX_BYTES))]
    #[x_kube(
        validation = non_empty("key"),
        validation = max_bytes("key", names::DYNAMODB_KEY_MAX_BYTES),
        validation = no_control_characters("key"),
        validation = immutable("key")
    )]
    pub key: String,
    /// AWS region; the usual AWS configuration chain when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub region: Option<String>,
    /// Endpoint URL of a DynamoDB-compatible service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub endpoint: Option<String>,
    /// Name of the table's partition key attribute (a string attribute).
    #[serde(default = "default_partition_key_name")]
    #[schemars(length(max = names::DYNAMODB_ATTRIBUTE_NAME_MAX_BYTES))]
    #[x_kube(
        validation = non_empty("partitionKeyName"),
        validation = max_bytes("partitionKeyName", names::DYNAMODB_ATTRIBUTE_NAME_MAX_BYTES),
        validation = no_control_characters("partitionKeyName"),
        validation = immutable("partitionKeyName")
    )]
    pub partition_key_name: String,
    /// For tables with a sort key: its attribute name and the value for this lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sort_key: Option<SortKey>,
    /// Create the table (on-demand capacity) if it does not exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_table: Option<bool>,
    /// A Secret in the lock's namespace with AWS credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<SecretRef>,
}

impl Default for DynamoDbBackend {
    fn default() -> Self {
        DynamoDbBackend {
            table: String::new(),
            key: String::new(),
            region: None,
            endpoint: None,
            partition_key_name: default_partition_key_name(),
            sort_key: None,
            create_table: None,
            credentials_secret_ref: None,
        }
    }
}

fn default_partition_key_name() -> String {
    "key".to_string()
}

/// A DynamoDB sort key attribute (string) and its value.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SortKey {
    /// Attribute name.
    #[schemars(length(max = names::DYNAMODB_ATTRIBUTE_NAME_MAX_BYTES))]
    #[x_kube(
        validation = non_empty("name"),
        validation = max_bytes("name", names::DYNAMODB_ATTRIBUTE_NAME_MAX_BYTES),
        validation = no_control_characters("name")
    )]
    pub name: String,
    /// Attribute value for this lock (at most 1,024 bytes of UTF-8).
    #[schemars(length(max = names::DYNAMODB_SORT_KEY_MAX_BYTES))]
    #[x_kube(
        validation = non_empty("value"),
        validation = max_bytes("value", names::DYNAMODB_SORT_KEY_MAX_BYTES),
        validation = no_control_characters("value")
    )]
    pub value: String,
}

/// A lock queue in ZooKeeper.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::api::strip_nullable)]
#[x_kube(validation = optional_immutable("chroot"), validation = zk_full_path_size())]
pub struct ZooKeeperBackend {
    /// The ensemble, as `host:port` entries.
    #[schemars(length(min = 1, max = 16), inner(length(max = 261)))]
    #[x_kube(validation = zk_servers())]
    pub servers: Vec<String>,
    /// Absolute path of the lock (its queue lives under it), relative to `chroot`;
    /// chroot and path together at most 1,024 bytes of UTF-8.
    #[schemars(length(max = names::ZOOKEEPER_PATH_MAX_BYTES))]
    #[x_kube(
        validation = zk_path("path"),
        validation = no_control_characters("path"),
        validation = zk_path_characters("path"),
        validation = immutable("path")
    )]
    pub path: String,
    /// Absolute path every other path is relative to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = names::ZOOKEEPER_PATH_MAX_BYTES))]
    #[x_kube(
        validation = zk_path("chroot"),
        validation = no_control_characters("chroot"),
        validation = zk_path_characters("chroot")
    )]
    pub chroot: Option<String>,
    /// Requested session timeout (Go duration such as `10s`); the server may adjust it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_DURATION_LEN))]
    #[x_kube(validation = positive_duration("sessionTimeout"))]
    pub session_timeout: Option<String>,
}

/// A coordination.k8s.io/v1 Lease.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::api::strip_nullable)]
#[x_kube(validation = optional_immutable("namespace"))]
pub struct KubernetesBackend {
    /// Name of the Lease.
    #[schemars(length(max = names::KUBERNETES_NAME_MAX_LEN))]
    #[x_kube(validation = dns_subdomain("leaseName"), validation = immutable("leaseName"))]
    pub lease_name: String,
    /// Namespace of the Lease; the DistributedLock's own namespace when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = names::KUBERNETES_NAMESPACE_MAX_LEN))]
    #[x_kube(validation = dns_label("namespace"))]
    pub namespace: Option<String>,
}

/// A Secret in the DistributedLock's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// Name of the Secret.
    #[schemars(length(max = names::KUBERNETES_NAME_MAX_LEN))]
    #[x_kube(validation = dns_subdomain("name"))]
    pub name: String,
}

/// The one backend a spec selects, borrowed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SelectedBackend<'a> {
    S3(&'a S3Backend),
    DynamoDb(&'a DynamoDbBackend),
    ZooKeeper(&'a ZooKeeperBackend),
    Kubernetes(&'a KubernetesBackend),
}

impl SelectedBackend<'_> {
    pub fn kind(&self) -> BackendKind {
        match self {
            SelectedBackend::S3(_) => BackendKind::S3,
            SelectedBackend::DynamoDb(_) => BackendKind::DynamoDb,
            SelectedBackend::ZooKeeper(_) => BackendKind::ZooKeeper,
            SelectedBackend::Kubernetes(_) => BackendKind::Kubernetes,
        }
    }
}

impl BackendSpec {
    /// The kinds that are set, in field order.
    fn set_kinds(&self) -> Vec<BackendKind> {
        [
            (self.s3.is_some(), BackendKind::S3),
            (self.dynamodb.is_some(), BackendKind::DynamoDb),
            (self.zookeeper.is_some(), BackendKind::ZooKeeper),
            (self.kubernetes.is_some(), BackendKind::Kubernetes),
        ]
        .into_iter()
        .filter_map(|(set, kind)| set.then_some(kind))
        .collect()
    }

    /// The backend this spec selects; an error unless exactly one is set.
    pub fn selected(&self) -> Result<SelectedBackend<'_>, SpecError> {
        match (&self.s3, &self.dynamodb, &self.zookeeper, &self.kubernetes) {
            (Some(b), None, None, None) => Ok(SelectedBackend::S3(b)),
            (None, Some(b), None, None) => Ok(SelectedBackend::DynamoDb(b)),
            (None, None, Some(b), None) => Ok(SelectedBackend::ZooKeeper(b)),
            (None, None, None, Some(b)) => Ok(SelectedBackend::Kubernetes(b)),
            _ => Err(SpecError::Backend {
                found: self.set_kinds(),
            }),
        }
    }

    /// The kind of the selected backend.
    pub fn kind(&self) -> Result<BackendKind, SpecError> {
        self.selected().map(|b| b.kind())
    }

    /// The lock's key as a [`Target`], the same value the CLI's URL parser produces
    /// (no URL string in between). `lock_namespace` is the DistributedLock's namespace,
    /// the Lease's when `kubernetes.namespace` is unset. The spec is validated first
    /// ([`BackendSpec::validate`]): a target is never built from names a store refuses.
    pub fn target(&self, lock_namespace: &str) -> Result<Target, SpecError> {
        self.validate()?;
        self.key(lock_namespace)
    }

    /// The lock's key, whether or not the names in it are valid (for `status.key`).
    fn key(&self, lock_namespace: &str) -> Result<Target, SpecError> {
        Ok(match self.selected()? {
            SelectedBackend::S3(b) => Target::S3 {
                bucket: b.bucket.clone(),
                key: b.key.clone(),
            },
            SelectedBackend::DynamoDb(b) => Target::DynamoDb {
                table: b.table.clone(),
                key: b.key.clone(),
            },
            SelectedBackend::ZooKeeper(b) => Target::ZooKeeper {
                servers: b.servers.clone(),
                chroot: b.chroot.clone(),
                path: b.path.clone(),
            },
            SelectedBackend::Kubernetes(b) => Target::Kubernetes {
                namespace: b
                    .namespace
                    .clone()
                    .unwrap_or_else(|| lock_namespace.to_string()),
                name: b.lease_name.clone(),
            },
        })
    }

    /// The lock's key as a URL, in the same forms as the CLI: `s3://bucket/key`,
    /// `dynamodb://table/key`, `zk://host:port[,host:port…][/chroot]/path`,
    /// `k8s://namespace/lease` (the [`Target`]'s display). Only one backend must be
    /// set: an invalid spec still has a key to show and index by.
    pub fn lock_url(&self, lock_namespace: &str) -> Result<String, SpecError> {
        Ok(self.key(lock_namespace)?.to_string())
    }

    /// How to reach the store, from the spec: endpoint, region, path-style
    /// addressing, S3 delete-on-release (s3lock compatibility), the DynamoDB table layout and table creation, the ZooKeeper session
    /// timeout. Everything but credentials (see [`BackendSpec::credentials_secret`]) and
    /// the Kubernetes client, which the caller has.
    pub fn connect_options(&self) -> ConnectOptions {
        let mut options = ConnectOptions::default();
        if let Some(s) = &self.s3 {
            options.endpoint = s.endpoint.clone().filter(|e| !e.is_empty());
            options.region = s.region.clone();
            options.force_path_style = s.force_path_style;
            options.s3lock_compatible = s.s3lock_compatible.unwrap_or(false);
        }
        if let Some(d) = &self.dynamodb {
            options.endpoint = d.endpoint.clone().filter(|e| !e.is_empty());
            options.region = d.region.clone();
            options.partition_key = Some(d.partition_key_name.clone());
            options.sort_key = d
                .sort_key
                .as_ref()
                .map(|s| (s.name.clone(), s.value.clone()));
            options.create_table = d.create_table.unwrap_or(false);
        }
        if let Some(z) = &self.zookeeper {
            // Malformed values are refused by `validate`; none reaches here from it.
            options.session_timeout = z
                .session_timeout
                .as_deref()
                .and_then(|t| parse_field("spec.backend.zookeeper.sessionTimeout", t).ok());
        }
        options
    }

    /// The Secret with AWS credentials the selected backend names, if any.
    pub fn credentials_secret(&self) -> Option<&SecretRef> {
        match self.selected().ok()? {
            SelectedBackend::S3(b) => b.credentials_secret_ref.as_ref(),
            SelectedBackend::DynamoDb(b) => b.credentials_secret_ref.as_ref(),
            SelectedBackend::ZooKeeper(_) | SelectedBackend::Kubernetes(_) => None,
        }
    }

    /// The checks of the CRD's CEL rules for `spec.backend` at creation.
    pub fn validate(&self) -> Result<(), SpecError> {
        match self.selected()? {
            SelectedBackend::S3(b) => {
                check("s3.bucket", names::s3_bucket(&b.bucket))?;
                check("s3.key", names::s3_key(&b.key))?;
                check_secret("s3", &b.credentials_secret_ref)
            }
            SelectedBackend::DynamoDb(b) => {
                check("dynamodb.table", names::dynamodb_table(&b.table))?;
                check("dynamodb.key", names::dynamodb_key(&b.key))?;
                check(
                    "dynamodb.partitionKeyName",
                    names::dynamodb_attribute_name(&b.partition_key_name),
                )?;
                if let Some(s) = &b.sort_key {
                    check(
                        "dynamodb.sortKey.name",
                        names::dynamodb_attribute_name(&s.name),
                    )?;
                    check(
                        "dynamodb.sortKey.value",
                        names::dynamodb_sort_key_value(&s.value),
                    )?;
                }
                check_secret("dynamodb", &b.credentials_secret_ref)
            }
            SelectedBackend::ZooKeeper(b) => {
                if b.servers.is_empty() || b.servers.len() > 16 {
                    return Err(invalid(
                        "zookeeper.servers",
                        "must list 1-16 host:port entries",
                    ));
                }
                if let Some(bad) = b.servers.iter().find(|s| !check_host_port(s)) {
                    return Err(invalid(
                        "zookeeper.servers",
                        &format!("{bad:?} is not a host:port entry"),
                    ));
                }
                check("zookeeper.path", names::zookeeper_path(&b.path))?;
                if let Some(chroot) = &b.chroot {
                    check("zookeeper.chroot", names::zookeeper_path(chroot))?;
                }
                let full = format!("{}{}", b.chroot.as_deref().unwrap_or(""), b.path);
                check("zookeeper.path", names::zookeeper_path(&full))?;
                if let Some(t) = &b.session_timeout {
                    parse_field("spec.backend.zookeeper.sessionTimeout", t)?;
                }
                Ok(())
            }
            SelectedBackend::Kubernetes(b) => {
                check(
                    "kubernetes.leaseName",
                    names::kubernetes_name(&b.lease_name),
                )?;
                if let Some(ns) = &b.namespace {
                    check("kubernetes.namespace", names::kubernetes_namespace(ns))?;
                }
                Ok(())
            }
        }
    }

    /// The CEL transition rules: the kind and the fields naming the lock are unchanged
    /// from `old`.
    pub fn validate_update(&self, old: &BackendSpec) -> Result<(), SpecError> {
        let immutable = |field: &str| {
            Err(SpecError::Immutable {
                field: format!("spec.backend.{field}"),
            })
        };
        if self.set_kinds() != old.set_kinds() {
            return immutable("kind");
        }
        if let (Some(new), Some(old)) = (&self.s3, &old.s3) {
            if new.bucket != old.bucket {
                return immutable("s3.bucket");
            }
            if new.key != old.key {
                return immutable("s3.key");
            }
        }
        if let (Some(new), Some(old)) = (&self.dynamodb, &old.dynamodb) {
            if new.table != old.table {
                return immutable("dynamodb.table");
            }
            if new.key != old.key {
                return immutable("dynamodb.key");
            }
            if new.partition_key_name != old.partition_key_name {
                return immutable("dynamodb.partitionKeyName");
            }
            if new.sort_key != old.sort_key {
                return immutable("dynamodb.sortKey");
            }
        }
        if let (Some(new), Some(old)) = (&self.zookeeper, &old.zookeeper) {
            if new.path != old.path {
                return immutable("zookeeper.path");
            }
            if new.chroot != old.chroot {
                return immutable("zookeeper.chroot");
            }
        }
        if let (Some(new), Some(old)) = (&self.kubernetes, &old.kubernetes) {
            if new.lease_name != old.lease_name {
                return immutable("kubernetes.leaseName");
            }
            if new.namespace != old.namespace {
                return immutable("kubernetes.namespace");
            }
        }
        Ok(())
    }
}

/// `spec.backend.<field>` is invalid: `message`.
fn invalid(field: &str, message: &str) -> SpecError {
    SpecError::Invalid {
        field: format!("spec.backend.{field}"),
        message: message.to_string(),
    }
}

/// A name rule's verdict on `spec.backend.<field>`.
fn check(field: &str, verdict: Result<(), NameError>) -> Result<(), SpecError> {
    verdict.map_err(|e| invalid(field, &e.to_string()))
}

/// `<backend>.credentialsSecretRef.name` is a Kubernetes object name.
fn check_secret(backend: &str, secret: &Option<SecretRef>) -> Result<(), SpecError> {
    match secret {
        Some(r) => check(
            &format!("{backend}.credentialsSecretRef.name"),
            names::kubernetes_name(&r.name),
        ),
        None => Ok(()),
    }
}

//! `spec.backend`: where the lock lives. Exactly one of the stores' parts is set; each
//! is declared in `stores/<store>.rs` and composed here.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

pub use crate::store_spec::SecretRef;
use crate::store_spec::{SpecFieldError, StoreSpec};
pub use crate::stores::dynamodb::{DynamoDbBackend, SortKey};
pub use crate::stores::kubernetes::KubernetesBackend;
pub use crate::stores::s3::S3Backend;
pub use crate::stores::zookeeper::ZooKeeperBackend;
pub use lockwarden_stores::BackendKind;

use super::SpecError;
use super::validation::*;
use lockwarden_stores::{ConnectOptions, Target};

/// Where the lock is stored: exactly one of `s3`, `dynamodb`, `zookeeper` or
/// `kubernetes`. The kind and the fields naming the lock cannot change after creation.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::strip_nullable)]
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

impl BackendSpec {
    /// The stores' parts that are set, in field order: with the fields above, the one
    /// place lockwarden-api lists the stores.
    fn set(&self) -> Vec<SelectedSpec<'_>> {
        [
            self.s3.as_ref().map(SelectedSpec::S3),
            self.dynamodb.as_ref().map(SelectedSpec::DynamoDb),
            self.zookeeper.as_ref().map(SelectedSpec::ZooKeeper),
            self.kubernetes.as_ref().map(SelectedSpec::Kubernetes),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// The backend this spec selects; an error unless exactly one is set.
    pub fn selected(&self) -> Result<SelectedSpec<'_>, SpecError> {
        match self.set().as_slice() {
            [one] => Ok(*one),
            set => Err(SpecError::Backend {
                found: set.iter().map(SelectedSpec::kind).collect(),
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
        Ok(self.selected()?.target(lock_namespace))
    }

    /// The lock's key as a URL, in the same forms as the CLI: `s3://bucket/key`,
    /// `dynamodb://table/key`, `zk://host:port[,host:port…][/chroot]/path`,
    /// `k8s://namespace/lease` (the [`Target`]'s display). Only one backend must be
    /// set: an invalid spec still has a key to show and index by.
    pub fn lock_url(&self, lock_namespace: &str) -> Result<String, SpecError> {
        Ok(self.selected()?.target(lock_namespace).to_string())
    }

    /// How to reach the store, from the spec: everything but credentials (see
    /// [`BackendSpec::credentials_secret`]) and the Kubernetes client, which the caller
    /// has. The defaults when no backend (or several) is set.
    pub fn connect_options(&self) -> ConnectOptions {
        self.selected()
            .map(|b| b.connect_options())
            .unwrap_or_default()
    }

    /// The Secret with the store's credentials the selected backend names, if any.
    pub fn credentials_secret(&self) -> Option<&SecretRef> {
        self.selected().ok()?.credentials_secret()
    }

    /// Whether the selected store can carry a lock-delay (docs/design.md rule 8):
    /// `spec.lockDelay` is refused where it cannot. No store selected: nothing to
    /// refuse yet (that error is `validate`'s).
    pub fn supports_lock_delay(&self) -> bool {
        match self.selected() {
            Ok(selected) => selected.supports_lock_delay(),
            Err(_) => true,
        }
    }

    /// Whether the selected store takes queue priorities and weights (not ZooKeeper).
    pub fn supports_priorities(&self) -> bool {
        match self.selected() {
            Ok(selected) => selected.supports_priorities(),
            Err(_) => true,
        }
    }

    /// Whether the selected store holds the lock as another tool's
    /// (`terraformCompatible`).
    pub fn holds_a_tools_lock(&self) -> bool {
        self.selected()
            .is_ok_and(|selected| selected.holds_a_tools_lock())
    }

    /// The checks of the CRD's CEL rules for `spec.backend` at creation.
    pub fn validate(&self) -> Result<(), SpecError> {
        Ok(self.selected()?.validate()?)
    }

    /// The CEL transition rules: the kind and the fields naming the lock are unchanged
    /// from `old`.
    pub fn validate_update(&self, old: &BackendSpec) -> Result<(), SpecError> {
        let (new, old) = (self.set(), old.set());
        let kinds =
            |set: &[SelectedSpec<'_>]| set.iter().map(SelectedSpec::kind).collect::<Vec<_>>();
        if kinds(&new) != kinds(&old) {
            return Err(SpecError::Immutable {
                field: "spec.backend.kind".into(),
            });
        }
        for (new, old) in new.iter().zip(&old) {
            new.validate_update(old)?;
        }
        Ok(())
    }
}

/// The one store part of a `spec.backend` that is set, borrowed
/// (`api::BackendSpec::selected`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SelectedSpec<'a> {
    S3(&'a S3Backend),
    DynamoDb(&'a DynamoDbBackend),
    ZooKeeper(&'a ZooKeeperBackend),
    Kubernetes(&'a KubernetesBackend),
}

/// `$body` with `$spec` bound to the store's spec, whichever store `$selected` is.
macro_rules! on_spec {
    ($selected:expr, $spec:ident => $body:expr) => {
        match $selected {
            SelectedSpec::S3($spec) => $body,
            SelectedSpec::DynamoDb($spec) => $body,
            SelectedSpec::ZooKeeper($spec) => $body,
            SelectedSpec::Kubernetes($spec) => $body,
        }
    };
}

impl<'a> SelectedSpec<'a> {
    pub fn kind(&self) -> BackendKind {
        match self {
            SelectedSpec::S3(_) => BackendKind::S3,
            SelectedSpec::DynamoDb(_) => BackendKind::DynamoDb,
            SelectedSpec::ZooKeeper(_) => BackendKind::ZooKeeper,
            SelectedSpec::Kubernetes(_) => BackendKind::Kubernetes,
        }
    }

    /// The lock's key, whether or not the names in it are valid. `lock_namespace` is
    /// the DistributedLock's namespace (the Lease's when none is named).
    pub fn target(&self, lock_namespace: &str) -> Target {
        match self {
            SelectedSpec::S3(spec) => Target::S3(spec.key(lock_namespace)),
            SelectedSpec::DynamoDb(spec) => Target::DynamoDb(spec.key(lock_namespace)),
            SelectedSpec::ZooKeeper(spec) => Target::ZooKeeper(spec.key(lock_namespace)),
            SelectedSpec::Kubernetes(spec) => Target::Kubernetes(spec.key(lock_namespace)),
        }
    }

    /// The checks of the store's CEL rules at creation.
    pub fn validate(&self) -> Result<(), SpecFieldError> {
        on_spec!(self, spec => spec.validate())
    }

    /// The store's CEL transition rules against `old`, a spec of the same store.
    pub fn validate_update(&self, old: &SelectedSpec<'_>) -> Result<(), SpecFieldError> {
        match (self, old) {
            (SelectedSpec::S3(new), SelectedSpec::S3(old)) => new.validate_update(old),
            (SelectedSpec::DynamoDb(new), SelectedSpec::DynamoDb(old)) => new.validate_update(old),
            (SelectedSpec::ZooKeeper(new), SelectedSpec::ZooKeeper(old)) => {
                new.validate_update(old)
            }
            (SelectedSpec::Kubernetes(new), SelectedSpec::Kubernetes(old)) => {
                new.validate_update(old)
            }
            _ => Err(SpecFieldError::Immutable {
                field: "spec.backend.kind".into(),
            }),
        }
    }

    /// How to reach the store, from the spec: everything but credentials (see
    /// [`SelectedSpec::credentials_secret`]) and the Kubernetes client, which the
    /// caller has.
    pub fn connect_options(&self) -> ConnectOptions {
        let mut options = ConnectOptions::default();
        match self {
            SelectedSpec::S3(spec) => (options.aws, options.s3) = spec.options(),
            SelectedSpec::DynamoDb(spec) => (options.aws, options.dynamodb) = spec.options(),
            SelectedSpec::ZooKeeper(spec) => options.zookeeper = spec.options(),
            SelectedSpec::Kubernetes(_) => {}
        }
        options
    }

    /// The Secret with the store's credentials the spec names, if any.
    pub fn credentials_secret(&self) -> Option<&'a SecretRef> {
        on_spec!(*self, spec => spec.credentials_secret())
    }

    /// Whether the store can carry a lock-delay (docs/design.md rule 8).
    pub fn supports_lock_delay(&self) -> bool {
        on_spec!(*self, spec => spec.supports_lock_delay())
    }

    /// Whether a queued lock may ask for a priority or a weight here.
    pub fn supports_priorities(&self) -> bool {
        on_spec!(*self, spec => spec.supports_priorities())
    }

    /// Whether the lock is held as another tool's lock (`terraformCompatible`).
    pub fn holds_a_tools_lock(&self) -> bool {
        on_spec!(*self, spec => spec.holds_a_tools_lock())
    }
}

/// On the spec: a Terraform/OpenTofu state lock is a mutex without a queue (docs/design.md
/// §6.8). Here, where the stores' parts are composed: it names the two that carry one.
pub(crate) fn a_tools_lock_is_a_mutex_without_a_queue() -> kube::core::Rule {
    let held_as_terraform = |store: &str| {
        format!(
            "(has(self.backend.{store}) && has(self.backend.{store}.terraformCompatible) && \
             self.backend.{store}.terraformCompatible)"
        )
    };
    kube::core::Rule::new(format!(
        "!({} || {}) || ((!has(self.queue) || !self.queue) && \
         (!has(self.permits) || self.permits == 1))",
        held_as_terraform("s3"),
        held_as_terraform("dynamodb")
    ))
    .msg(super::validation::A_TOOLS_LOCK_IS_A_MUTEX)
}

//! What every store's part of the `DistributedLock` spec (`spec.backend.<store>`,
//! declared in `stores/<store>.rs`) shares: the trait
//! [`SelectedSpec`](crate::SelectedSpec) drives it through, the error it reports, and
//! the Secret reference of the stores that take credentials. Spec data only: serde and
//! schemars types, no SDK or client.

use std::time::Duration;

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use lockwarden_stores::StoreKey;

use crate::schema::{MAX_DURATION_LEN, dns_subdomain};
use lockwarden_core::duration::{DurationError, parse_positive_duration};
use lockwarden_core::names::{self, NameError};

/// One store's part of `spec.backend`.
pub trait StoreSpec {
    /// The store's lock key.
    type Key: StoreKey;

    /// The lock's key, whether or not the names in it are valid (for `status.key`).
    /// `lock_namespace` is the DistributedLock's namespace, for stores whose key
    /// defaults to it.
    fn key(&self, lock_namespace: &str) -> Self::Key;

    /// The checks of this store's CEL rules at creation.
    fn validate(&self) -> Result<(), SpecFieldError>;

    /// The CEL transition rules: the fields naming the lock are unchanged from `old`.
    fn validate_update(&self, old: &Self) -> Result<(), SpecFieldError>;

    /// The Secret (in the lock's namespace) with the store's credentials, if any.
    fn credentials_secret(&self) -> Option<&SecretRef> {
        None
    }

    /// Whether the store can carry a lock-delay (docs/design.md rule 8) in the lease
    /// every contender reads.
    fn supports_lock_delay(&self) -> bool {
        true
    }

    /// Whether a queued lock may ask for a priority or a weight (docs/design.md §6.4).
    fn supports_priorities(&self) -> bool {
        true
    }

    /// Whether the lock is held as another tool's lock at the tool's own name (a
    /// Terraform/OpenTofu state lock, `terraformCompatible`; docs/design.md §6.8): deleted
    /// on release, so it keeps no queue and takes one holder.
    fn holds_a_tools_lock(&self) -> bool {
        false
    }
}

/// Why a field of `spec.backend` cannot be used. `field` is its whole path
/// (`spec.backend.s3.bucket`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecFieldError {
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error("{field} is immutable")]
    Immutable { field: String },
    #[error("{field}: {value:?} is not a valid duration: {reason}")]
    Duration {
        field: &'static str,
        value: String,
        reason: DurationError,
    },
}

/// `field` (below `spec.backend`) is invalid: `message`.
pub fn invalid(field: &str, message: &str) -> SpecFieldError {
    SpecFieldError::Invalid {
        field: format!("spec.backend.{field}"),
        message: message.to_string(),
    }
}

/// A name rule's verdict on `field` (below `spec.backend`).
pub fn check(field: &str, verdict: Result<(), NameError>) -> Result<(), SpecFieldError> {
    verdict.map_err(|e| invalid(field, &e.to_string()))
}

/// `field` (below `spec.backend`) differs from the old spec's: refused.
pub fn unchanged<T: PartialEq>(field: &str, new: &T, old: &T) -> Result<(), SpecFieldError> {
    if new == old {
        Ok(())
    } else {
        Err(SpecFieldError::Immutable {
            field: format!("spec.backend.{field}"),
        })
    }
}

/// A positive duration field of the spec (named by its whole path), with the CRD's
/// length limit.
pub fn parse_spec_duration(field: &'static str, value: &str) -> Result<Duration, SpecFieldError> {
    if value.len() > MAX_DURATION_LEN as usize {
        return Err(SpecFieldError::Invalid {
            field: field.to_string(),
            message: format!("must be at most {MAX_DURATION_LEN} characters"),
        });
    }
    // Go accepts a leading '+'; the CRD's rule (and so this) does not.
    let parsed = if value.starts_with('+') {
        Err(DurationError::Malformed)
    } else {
        parse_positive_duration(value)
    };
    parsed.map_err(|reason| SpecFieldError::Duration {
        field,
        value: value.to_string(),
        reason,
    })
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

/// `<store>.credentialsSecretRef.name` is a Kubernetes object name.
pub fn check_secret(store: &str, secret: &Option<SecretRef>) -> Result<(), SpecFieldError> {
    match secret {
        Some(r) => check(
            &format!("{store}.credentialsSecretRef.name"),
            names::kubernetes_name(&r.name),
        ),
        None => Ok(()),
    }
}

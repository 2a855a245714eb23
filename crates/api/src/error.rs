//! Why a `DistributedLock` spec cannot be used. Each error names the field.

use super::duration::DurationError;
use crate::store_spec::SpecFieldError;
use lockwarden_core::{PermitsError, WeightError};
use lockwarden_stores::BackendKind;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error(
        "spec.backend: exactly one of {} must be set, found {}",
        BackendKind::listed("", "or"),
        kinds(found)
    )]
    Backend { found: Vec<BackendKind> },
    #[error("{field}: {value:?} is not a valid duration: {reason}")]
    Duration {
        field: &'static str,
        value: String,
        reason: DurationError,
    },
    #[error(
        "spec.renewInterval ({renew_interval}) must be less than half of spec.leaseDuration ({lease_duration})"
    )]
    RenewTooLong {
        renew_interval: String,
        lease_duration: String,
    },
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// `spec.permits` (or `spec.mode`, for shared with one permit) that no key can have.
    #[error("{field}: {source}")]
    Permits {
        field: &'static str,
        #[source]
        source: PermitsError,
    },
    #[error("spec.weight: {source}")]
    Weight {
        #[source]
        source: WeightError,
    },
    #[error("{field} is immutable")]
    Immutable { field: String },
}

/// A store's part of the spec names the field itself.
impl From<SpecFieldError> for SpecError {
    fn from(e: SpecFieldError) -> SpecError {
        match e {
            SpecFieldError::Invalid { field, message } => SpecError::Invalid { field, message },
            SpecFieldError::Immutable { field } => SpecError::Immutable { field },
            SpecFieldError::Duration {
                field,
                value,
                reason,
            } => SpecError::Duration {
                field,
                value,
                reason,
            },
        }
    }
}

fn kinds(found: &[BackendKind]) -> String {
    if found.is_empty() {
        "none".to_string()
    } else {
        found
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

//! Why a reconcile failed ([`ReconcileError`]), what kind of failure that is
//! ([`ErrorCategory`]), and how long the lock waits before it is reconciled again
//! ([`error_policy`]).

use std::sync::Arc;
use std::time::Duration;

use crate::queue::Action;
use kube::runtime::reflector::ObjectRef;

use super::context::Context;
use super::jitter;
use crate::connect::ConnectFailure;
use lockwarden_api::{DistributedLock, SpecError};
use lockwarden_core::LockError;

/// Why a reconcile failed. [`error_policy`] backs off by its [`category`](Self::category).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The status could not be written.
    #[error("cannot write the status: {0}")]
    Status(#[source] kube::Error),
    /// Adding or removing the finalizer failed, or the phase run inside it did.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<ReconcileError>>),
    /// The lock's store did not answer, or refused; the status says so too.
    #[error("{0}")]
    Store(#[source] LockError),
    /// The lock's backend could not be set up (its Secret, its store's client); the
    /// status says so too.
    #[error("{0}")]
    Connect(#[source] ConnectFailure),
    /// The spec is invalid; the status is `Failed` / `InvalidSpec` until it changes.
    #[error("invalid spec: {0}")]
    InvalidSpec(#[source] SpecError),
}

/// What kind of failure a [`ReconcileError`] is, for its backoff and for
/// `lockwarden_reconcile_errors_total{category}` (docs/architecture.md, "Errors and
/// backoff").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCategory {
    /// The store (or the way to it) did not serve the request.
    StoreUnavailable,
    /// Someone else changed what this reconcile wrote on (HTTP 409).
    Conflict,
    /// Retrying the same thing cannot help: an invalid spec, a request the API server
    /// rejects as malformed (400, 422).
    Invalid,
    /// Any other failure of the Kubernetes API: unreachable, 5xx, 429, forbidden.
    KubernetesApi,
}

impl ErrorCategory {
    /// The `category` label.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCategory::StoreUnavailable => "store_unavailable",
            ErrorCategory::Conflict => "conflict",
            ErrorCategory::Invalid => "invalid",
            ErrorCategory::KubernetesApi => "kubernetes_api",
        }
    }

    /// How long to wait before reconciling again (jittered by ±20%); `None`: not
    /// until the object changes.
    pub fn backoff(self) -> Option<Duration> {
        match self {
            // As long as a lock that cannot reach its store waits between attempts.
            ErrorCategory::StoreUnavailable => Some(Duration::from_secs(5)),
            // The watch brings the newer object at once; a short pause is enough.
            ErrorCategory::Conflict => Some(Duration::from_secs(1)),
            ErrorCategory::Invalid => None,
            // Leaves an overloaded or restarting API server room to recover.
            ErrorCategory::KubernetesApi => Some(Duration::from_secs(10)),
        }
    }

    fn of_kube(error: &kube::Error) -> ErrorCategory {
        match error {
            kube::Error::Api(status) if status.code == 409 => ErrorCategory::Conflict,
            kube::Error::Api(status) if status.code == 400 || status.code == 422 => {
                ErrorCategory::Invalid
            }
            _ => ErrorCategory::KubernetesApi,
        }
    }

    fn of_lock(error: &LockError) -> ErrorCategory {
        match error {
            LockError::Unavailable { .. } | LockError::Backend { .. } => {
                ErrorCategory::StoreUnavailable
            }
            LockError::Foreign { .. }
            | LockError::PermitsDisagree { .. }
            | LockError::NotFenced { .. } => ErrorCategory::Invalid,
            LockError::Held { .. }
            | LockError::Timeout { .. }
            | LockError::Lost { .. }
            | LockError::NotHeld { .. } => ErrorCategory::Conflict,
        }
    }
}

impl ReconcileError {
    pub fn category(&self) -> ErrorCategory {
        use kube::runtime::finalizer::Error as F;
        match self {
            ReconcileError::Status(e) => ErrorCategory::of_kube(e),
            ReconcileError::Finalizer(e) => match &**e {
                F::ApplyFailed(e) | F::CleanupFailed(e) => e.category(),
                F::AddFinalizer(e) | F::RemoveFinalizer(e) => ErrorCategory::of_kube(e),
                F::UnnamedObject | F::InvalidFinalizer => ErrorCategory::Invalid,
            },
            ReconcileError::Store(e) => ErrorCategory::of_lock(e),
            ReconcileError::Connect(ConnectFailure::SecretUnreadable { source, .. }) => {
                ErrorCategory::of_kube(source)
            }
            ReconcileError::Connect(_) => ErrorCategory::StoreUnavailable,
            ReconcileError::InvalidSpec(_) => ErrorCategory::Invalid,
        }
    }
}

/// Counts a failed reconcile by its category and backs off as the category says.
pub fn error_policy(lock: Arc<DistributedLock>, err: &ReconcileError, ctx: Arc<Context>) -> Action {
    let category = err.category();
    ctx.telemetry.count_reconcile_error(category.as_str());
    let obj = ObjectRef::from_obj(&*lock);
    match category.backoff() {
        Some(backoff) => {
            let retry_in = jitter(backoff);
            tracing::warn!(lock = %obj, category = category.as_str(), error = %err, ?retry_in, "reconcile failed; retrying");
            Action::requeue(retry_in)
        }
        None => {
            tracing::warn!(lock = %obj, category = category.as_str(), error = %err, "reconcile failed; waiting for a change");
            Action::await_change()
        }
    }
}

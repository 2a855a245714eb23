//! What a reconcile writes to the DistributedLock's status, with the metrics and Events
//! that follow each write: the status of a phase, `Failed`, `Lost`, and a store that
//! could not be reached.

use std::time::{Duration, SystemTime};

use crate::queue::Action;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;

use super::context::Context;
use super::{ReconcileError, Reconciling, jitter};
use crate::status::{self, Desired};
use crate::telemetry::{LockView, LossReason};
use crate::validated::lock_namespace;
use lockwarden_api::conditions::reason;
use lockwarden_api::{DistributedLock, LockPhase};
use lockwarden_core::{CONNECT_TIMEOUT, LostReason};

/// Writes `desired` if the stored status does not already say it, and counts the
/// object in its phase.
pub(super) async fn write(
    api: &Api<DistributedLock>,
    ctx: &Context,
    lock: &DistributedLock,
    desired: Desired,
) -> Result<(), ReconcileError> {
    let uid = lock.uid().unwrap_or_default();
    let phase = desired.phase;
    let backend = desired.backend.clone();
    let view = LockView {
        namespace: lock_namespace(lock),
        backend: backend.as_deref().unwrap_or_default(),
        phase,
        waiting_since: desired
            .waiting_since
            .as_ref()
            .map(|t| SystemTime::from(t.0)),
        expiring: phase == Some(LockPhase::Held) && desired.acquired.1 == reason::LEASE_EXPIRING,
        queue_position: desired.queue_position.and_then(|p| u32::try_from(p).ok()),
    };
    if let Some(next) = status::next_status(lock, desired) {
        status::write(api, &lock.name_any(), &next)
            .await
            .map_err(ReconcileError::Status)?;
    }
    // A status without a backend (an invalid spec) has no labels: its phase only.
    if view.backend.is_empty() {
        ctx.telemetry.set_phase(&uid, phase);
    } else {
        ctx.telemetry.observe_status(&uid, view);
    }
    Ok(())
}

/// Writes a `Failed` status (final for this generation); a Warning Event when the lock
/// was not already `Failed`.
pub(super) async fn write_failed(
    api: &Api<DistributedLock>,
    ctx: &Context,
    lock: &DistributedLock,
    failed: Desired,
) -> Result<Action, ReconcileError> {
    let was_failed = lock.status.as_ref().and_then(|s| s.phase) == Some(LockPhase::Failed);
    let message = failed.acquired.2.clone();
    write(api, ctx, lock, failed).await?;
    if !was_failed {
        ctx.event(lock, EventType::Warning, "Failed", message).await;
    }
    Ok(Action::await_change())
}

/// What `lockwarden_lock_losses_total{reason}` says about a loss the store reported
/// (docs/metrics.md, "Loss reasons"): renewals failing before it (`expiring`) make it
/// `store_unavailable` whatever the store said once it answered again.
pub fn loss_reason(why: &LostReason, expiring: bool) -> LossReason {
    if expiring {
        return LossReason::StoreUnavailable;
    }
    match why {
        LostReason::TakenOver(_) => LossReason::TakenOver,
        LostReason::Deleted | LostReason::ReleasedElsewhere | LostReason::Foreign(_) => {
            LossReason::ReleasedByHand
        }
        LostReason::SessionExpired | LostReason::EntryGone | LostReason::NotOurs => {
            LossReason::Expired
        }
    }
}

impl Reconciling<'_> {
    /// A status naming this lock's backend and key, to be completed.
    pub(super) fn status(&self) -> Desired {
        Desired::for_key(self.kind(), self.key())
            .held_as_a_tools_lock(self.spec.address.as_a_tools_lock)
    }

    pub(super) async fn write(&self, desired: Desired) -> Result<(), ReconcileError> {
        write(self.api, self.ctx, self.lock, desired).await
    }

    pub(super) async fn event(&self, type_: EventType, reason: &str, note: String) {
        self.ctx.event(self.lock, type_, reason, note).await
    }

    /// `Failed` for `why`: final for this generation.
    pub(super) async fn fail(
        &self,
        why: &'static str,
        message: String,
    ) -> Result<Action, ReconcileError> {
        let failed = self.status().failed(why, message);
        write_failed(self.api, self.ctx, self.lock, failed).await
    }

    /// Counts a loss, before the `Lost` status is written (which ends `LeaseExpiring`).
    pub(super) fn count_loss(&self, why: &LostReason) {
        let expiring = self.ctx.telemetry.was_expiring(&self.uid);
        let reason = loss_reason(why, expiring);
        self.ctx
            .telemetry
            .count_loss(self.namespace(), self.kind(), reason);
    }

    /// Lost is final for this generation: status says why, and a Warning Event records it.
    pub(super) async fn report_lost(&self, message: String) -> Result<Action, ReconcileError> {
        let lost = self
            .status()
            .not_held(LockPhase::Lost, reason::LOST, message.clone());
        self.write(lost).await?;
        self.event(EventType::Warning, "Lost", message).await;
        Ok(Action::await_change())
    }

    /// Whether this lock is new (created less than [`CONNECT_TIMEOUT`] ago) and has
    /// not reached its store yet: a store that is still starting is retried for that
    /// long before the status says "backend unavailable", as the CLI does.
    fn still_connecting(&self) -> bool {
        let unreached = self.lock.status.as_ref().and_then(|s| s.phase).is_none()
            || self.lock.status.as_ref().is_some_and(|s| {
                s.phase == Some(LockPhase::Pending)
                    && s.conditions
                        .iter()
                        .all(|c| c.reason != reason::BACKEND_ERROR)
            });
        let age = self
            .lock
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(|t| SystemTime::now().duration_since(SystemTime::from(t.0)).ok());
        unreached && age.is_some_and(|age| age < CONNECT_TIMEOUT)
    }

    /// The backend could not be reached or refused: not acquired, and `error` goes to
    /// [`error_policy`](super::error_policy) once the status says it. A lock that was
    /// waiting stays `Waiting`, and keeps the start of its wait.
    pub(super) async fn backend_error(
        &self,
        error: ReconcileError,
    ) -> Result<Action, ReconcileError> {
        if self.still_connecting() {
            tracing::debug!(lock = %self.obj, %error, "store not reachable yet; retrying");
            return Ok(Action::requeue(jitter(Duration::from_millis(500))));
        }
        let current = self.lock.status.as_ref();
        let (phase, since) = match current.and_then(|s| s.phase) {
            Some(LockPhase::Waiting) => (
                LockPhase::Waiting,
                current.and_then(|s| s.waiting_since.clone()),
            ),
            _ => (LockPhase::Pending, None),
        };
        let desired = Desired {
            waiting_since: since,
            ..self
                .status()
                .not_held(phase, reason::BACKEND_ERROR, error.to_string())
        };
        self.write(desired).await?;
        Err(error)
    }
}

//! Holding: a held lock's holder task renews on its own; a reconcile reports the task's
//! state, and after a controller restart takes the acquisition back by its nonce.

use std::sync::Arc;

use crate::queue::Action;

use super::{HELD_RESYNC, ReconcileError, Reconciling};
use crate::holders::{Acquisition, HolderTask, Owner};
use crate::telemetry::LossReason;
use lockwarden_api::LockPhase;
use lockwarden_api::conditions::reason;
use lockwarden_core::{HolderState, Lease, LockBackend, LockError};

impl Reconciling<'_> {
    /// Phase: holding. Reports the holder task's state.
    pub(super) async fn hold(
        &self,
        state: HolderState,
        acquisition: &Acquisition,
    ) -> Result<Action, ReconcileError> {
        match state {
            HolderState::Held { .. } => {
                self.write(self.status().held(acquisition, None)).await?;
                Ok(Action::requeue(HELD_RESYNC))
            }
            HolderState::Expiring { last_error, .. } => {
                let desired = self.status().held(acquisition, Some(last_error.as_str()));
                self.write(desired).await?;
                Ok(Action::requeue(HELD_RESYNC))
            }
            HolderState::Lost(why) => {
                self.ctx.holders.remove(&self.obj);
                self.hold_ended(acquisition);
                self.count_loss(&why);
                self.report_lost(format!("lock lost: {why}")).await
            }
            HolderState::Released => {
                self.ctx.holders.remove(&self.obj);
                self.hold_ended(acquisition);
                let released = "released".to_string();
                let desired =
                    self.status()
                        .not_held(LockPhase::Released, reason::RELEASED, released);
                self.write(desired).await?;
                Ok(Action::await_change())
            }
        }
    }

    /// Phase: `Held` in status but no holder task (the controller restarted): take the
    /// acquisition back by its nonce.
    pub(super) async fn resume(&self, nonce: &str) -> Result<Action, ReconcileError> {
        let backend = match self.connect().await {
            Ok(backend) => backend,
            Err(e) => return self.backend_error(ReconcileError::Connect(e)).await,
        };
        match backend.resume(&self.spec.holder, nonce).await {
            Ok(resumed) => {
                // The stored lease does not say how much of it is the lock-delay (rule 8):
                // the spec does. Set before the first renewal, which every resumed lease
                // needs (its deadline starts expired), so the deadline runs on the
                // holder's own lease from the start.
                let resumed = resumed.with_lock_delay(self.spec.lock_delay);
                let task = self.start_holder(backend, resumed);
                let policy = self.policy();
                task.settled(policy.request_timeout + policy.retry).await;
                tracing::info!(lock = %self.obj, fence = task.acquisition.fence, "resumed held lock");
                self.ctx.holders.insert(self.obj.clone(), task);
                Ok(Action::requeue(HELD_RESYNC))
            }
            Err(e) if e.is_transient() => self.backend_error(ReconcileError::Store(e)).await,
            Err(e) => {
                // Held before the restart, not ours any more: a loss like any other.
                match &e {
                    LockError::Lost { reason, .. } => self.count_loss(reason),
                    _ => self.ctx.telemetry.count_loss(
                        self.namespace(),
                        self.kind(),
                        LossReason::Expired,
                    ),
                }
                let message = format!("could not resume after restart: {e}");
                self.report_lost(message).await
            }
        }
    }

    /// Starts renewing `lease` on its own timer, reporting transitions to this lock.
    pub(super) fn start_holder(&self, backend: Arc<dyn LockBackend>, lease: Lease) -> HolderTask {
        let owner = Owner {
            obj: self.obj.clone(),
            uid: self.uid.clone(),
            key: self.key().to_string(),
            backend: self.spec.address.kind,
            wake: self.ctx.wake.clone(),
            renewals: self.ctx.telemetry.renewals(),
            renew_failures: self.ctx.telemetry.renew_failures(),
        };
        HolderTask::start(backend, lease, self.policy(), owner)
    }

    /// The end of this lock's hold, for `lockwarden_hold_duration_seconds`.
    pub(super) fn hold_ended(&self, acquisition: &Acquisition) {
        self.ctx
            .telemetry
            .observe_hold(self.namespace(), self.kind(), acquisition.acquired_at);
    }
}

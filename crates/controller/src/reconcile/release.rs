//! Every way a lock is let go: `spec.release` (held, or only waiting), an invalid spec,
//! and the object's deletion (the finalizer's cleanup, by the holder task or, after a
//! restart, by the nonce in status). Each release wakes the locks of this cluster
//! waiting on the same key.

use std::sync::Arc;

use crate::queue::Action;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;

use super::context::Context;
use super::writes::write_failed;
use super::{ReconcileError, Reconciling};
use crate::holders::{Acquisition, HolderTask};
use crate::status::Desired;
use crate::validated::{LockAddress, lock_namespace};
use lockwarden_api::conditions::reason;
use lockwarden_api::{DistributedLock, LockPhase, SpecError};
use lockwarden_core::{CompletedRun, LockError, RunKey};

impl Reconciling<'_> {
    /// Phase: `spec.release` while held. Releases, then wakes the locks waiting on the
    /// key the task held.
    pub(super) async fn release(
        &self,
        acquisition: &Acquisition,
        held_key: &str,
    ) -> Result<Action, ReconcileError> {
        let releasing =
            self.status()
                .not_held(LockPhase::Releasing, reason::RELEASING, "releasing".into());
        self.write(releasing).await?;
        let run = succeeded_run(self.lock);
        let cluster = self.ctx.config.cluster_name.as_str();
        let completed = run.as_ref().map(|(run, keep)| (run, cluster, *keep));
        let result = match self.ctx.holders.remove(&self.obj) {
            Some(task) => {
                let release = task.release_recording(completed);
                self.ctx.timed(self.kind(), "release", release).await
            }
            None => Ok(None),
        };
        self.hold_ended(acquisition);
        let released = result.as_ref().ok().cloned().flatten();
        self.ctx.hand_off(held_key, &self.obj, released).await;
        if let Err(e) = &result {
            self.ctx.release_failed(&self.obj, held_key, e);
        }
        let message = match (&result, &run) {
            (Ok(_), Some((run, _))) => format!(
                "released {} (fence {}), recording run {run} as completed",
                self.key(),
                acquisition.fence
            ),
            (Ok(_), None) => format!("released {} (fence {})", self.key(), acquisition.fence),
            (Err(e), _) => format!("released; the store said: {e}"),
        };
        let released =
            self.status()
                .not_held(LockPhase::Released, reason::RELEASED, message.clone());
        self.write(released).await?;
        self.event(EventType::Normal, "Released", message).await;
        Ok(Action::await_change())
    }

    /// Phase: `spec.release` without holding (never acquired, or stop waiting).
    pub(super) async fn release_unheld(&self) -> Result<Action, ReconcileError> {
        if let Some(backend) = self.ctx.waiters.stop_waiting(&self.obj) {
            backend.abandon().await;
        }
        let released = self.status().not_held(
            LockPhase::Released,
            reason::RELEASED,
            "spec.release is set".into(),
        );
        self.write(released).await?;
        Ok(Action::await_change())
    }
}

/// An invalid spec: stop waiting, let go of the lock if it is held, and fail (an
/// [`ErrorCategory::Invalid`](super::ErrorCategory::Invalid) error: no retry until the
/// spec changes).
pub(super) async fn reject(
    api: &Api<DistributedLock>,
    ctx: &Context,
    lock: &DistributedLock,
    obj: &ObjectRef<DistributedLock>,
    error: SpecError,
) -> Result<Action, ReconcileError> {
    ctx.waiters.stop_waiting(obj);
    if let Some(task) = ctx.holders.remove(obj) {
        let key = task.key.clone();
        ctx.telemetry.observe_hold(
            lock_namespace(lock),
            task.backend.as_str(),
            task.acquisition.acquired_at,
        );
        if let Err(e) = task.release().await {
            ctx.release_failed(obj, &key, &e);
        }
    }
    let failed = Desired::default().failed(reason::INVALID_SPEC, error.to_string());
    write_failed(api, ctx, lock, failed).await?;
    Err(ReconcileError::InvalidSpec(error))
}

/// Finalizer cleanup: release (or stop waiting) before the object goes away.
///
/// Not a [`Reconciling`] method: it must work for a spec that is no longer valid (made
/// invalid while the lock was held), so it needs only [`LockAddress`].
pub(super) async fn cleanup(
    lock: Arc<DistributedLock>,
    ctx: &Context,
) -> Result<Action, ReconcileError> {
    let obj = ObjectRef::from_obj(&*lock);
    if let Some(backend) = ctx.waiters.stop_waiting(&obj) {
        backend.abandon().await;
    }
    if let Some(task) = ctx.holders.remove(&obj) {
        release_before_deletion(ctx, &lock, &obj, task).await;
    } else if let Some(status) = &lock.status
        && status.phase == Some(LockPhase::Held)
        && let (Some(nonce), Ok(address)) = (status.nonce.as_deref(), LockAddress::of(&lock))
    {
        release_by_nonce(ctx, &lock, &obj, nonce, &address).await;
    }
    ctx.telemetry.forget(&lock.uid().unwrap_or_default());
    Ok(Action::await_change())
}

/// A lock held before a restart and never resumed, being deleted: release it by its
/// nonce, and wake its waiters.
async fn release_by_nonce(
    ctx: &Context,
    lock: &DistributedLock,
    obj: &ObjectRef<DistributedLock>,
    nonce: &str,
    address: &LockAddress,
) {
    let key = &address.key;
    let namespace = lock_namespace(lock);
    let backend = match ctx.connector.backend(&ctx.client, namespace, address).await {
        Ok(backend) => backend,
        Err(e) => return ctx.release_failed(obj, key, &e),
    };
    let holder = lock.holder_identity(&ctx.config.cluster_name);
    let lease = match backend.resume(&holder, nonce).await {
        Ok(lease) => lease,
        Err(e @ (LockError::Unavailable { .. } | LockError::Backend { .. })) => {
            return ctx.release_failed(obj, key, &e);
        }
        Err(e) => {
            tracing::info!(lock = %obj, %key, error = %e, "deleting; nothing to release: the store no longer holds this lock for us");
            return;
        }
    };
    ctx.telemetry
        .observe_hold(namespace, address.kind.as_str(), lease.acquired_at());
    let released = match succeeded_run(lock) {
        Some((run, keep)) => {
            let cluster = Some(ctx.config.cluster_name.as_str());
            let done = CompletedRun::now(&run, lease.fence(), lease.holder(), cluster);
            backend.release_completed(&lease, done, keep).await
        }
        None => backend.release(&lease).await,
    };
    if let Err(e) = released {
        ctx.release_failed(obj, key, &e);
    }
    ctx.hand_off(key, obj, backend.last_release().await).await;
}

/// The run to record with this lock's release (docs/design.md §6.7): its `spec.runKey`
/// once `spec.runSucceeded` says the run succeeded under it; nothing otherwise (a
/// failed, lost or abandoned run is not recorded, so the next holder runs it).
fn succeeded_run(lock: &DistributedLock) -> Option<(RunKey, usize)> {
    if !lock.spec.run_succeeded {
        return None;
    }
    lock.spec.run().ok().flatten()
}

/// Releases a held lock whose object is being deleted, and wakes its waiters.
async fn release_before_deletion(
    ctx: &Context,
    lock: &DistributedLock,
    obj: &ObjectRef<DistributedLock>,
    task: HolderTask,
) {
    let key = task.key.clone();
    let fence = task.acquisition.fence;
    let kind = task.backend.as_str();
    ctx.telemetry
        .observe_hold(lock_namespace(lock), kind, task.acquisition.acquired_at);
    let run = succeeded_run(lock);
    let completed = run
        .as_ref()
        .map(|(run, keep)| (run, ctx.config.cluster_name.as_str(), *keep));
    let result = ctx
        .timed(kind, "release", task.release_recording(completed))
        .await;
    tracing::debug!(lock = %obj, %key, run = ?run.as_ref().map(|(r, _)| r.to_string()), "released before deletion; waking waiters");
    let released = result.as_ref().ok().cloned().flatten();
    ctx.hand_off(&key, obj, released).await;
    if let Err(e) = &result {
        ctx.release_failed(obj, &key, e);
    }
    let note = match (result, &run) {
        (Ok(_), Some((run, _))) => format!(
            "released {key} (fence {fence}) before deletion, recording run {run} as completed"
        ),
        (Ok(_), None) => format!("released {key} (fence {fence}) before deletion"),
        (Err(e), _) => format!("deleting; release of {key} reported: {e}"),
    };
    ctx.event(lock, EventType::Normal, "Released", note).await;
}

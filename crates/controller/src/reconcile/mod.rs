//! Reconcile, phase by phase, each phase a method of [`Reconciling`] in a file of its
//! own:
//!
//! 1. finalizer (`lockwarden.io/release`): [`release::cleanup`] releases the lock (or
//!    stops waiting) and wakes the waiters on the same key;
//! 2. invalid spec → `Failed` / `InvalidSpec` ([`release::reject`]); the spec is
//!    checked once per reconcile, by [`ValidatedSpec::of`], and everything after it
//!    works with the parsed values it holds;
//! 3. a holder task exists → [`hold`](Reconciling::hold): report its state (`Held`,
//!    `LeaseExpiring`, `Lost`), or [`release`](Reconciling::release) it when
//!    `spec.release` is set (`Releasing` → `Released`);
//! 4. `Held` in status but no task (a restart) → [`resume`](Reconciling::resume) from
//!    `status.nonce`;
//! 5. otherwise [`acquire`](Reconciling::acquire), one attempt: `Held`, or `Waiting`
//!    until woken — by a same-cluster release, by the store's watch where it has one
//!    (ZooKeeper), else by a jittered poll — or `Failed` after `acquireTimeout`, counted
//!    from `status.waitingSince` so that a controller restart does not extend it.
//!
//! `Lost` and `Failed` are final for the object's generation: changing the spec (or
//! deleting and recreating the object) tries again.
//!
//! A reconcile that fails returns a [`ReconcileError`] (after writing what the status
//! can say about it); [`error_policy`] counts it and backs off by its
//! [`ErrorCategory`]. Releases that the store does not confirm never fail a reconcile
//! (the lease then runs out on its own), but each is logged with its lock and counted.
//!
//! Files: this one (the entry, the claimant check, the dispatch to a phase),
//! [`context`] (what reconciles share), [`error`] (the error taxonomy and its policy),
//! [`acquire`], [`hold`] (hold and resume), [`release`] (every way a lock is let go:
//! `spec.release`, an invalid spec, deletion) and [`writes`] (status writes and the
//! metrics and Events that go with them).

mod acquire;
mod context;
mod error;
mod hold;
mod release;
mod writes;

pub use context::Context;
pub use error::{ErrorCategory, ReconcileError, error_policy};
pub use writes::loss_reason;

use std::sync::Arc;
use std::time::Duration;

use crate::queue::Action;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use rand::Rng;

use crate::config::FINALIZER;
use crate::connect::ConnectFailure;
use crate::gating::CLAIM_ANNOTATION;
use crate::validated::{ValidatedSpec, lock_namespace};
use lockwarden_api::conditions::{self, reason};
use lockwarden_api::{DistributedLock, LockPhase};
use lockwarden_core::{LockBackend, RenewPolicy};

/// How long a held lock waits between reconciles when nothing happens (transitions
/// arrive through the wake channel; this is only a safety net).
const HELD_RESYNC: Duration = Duration::from_secs(300);

/// How long a waiter on a store with watches (ZooKeeper) waits on its watch before it
/// looks again anyway: only a safety net for a watch lost with a connection.
const WATCH_RECHECK: Duration = Duration::from_secs(30);

/// How often a lock being deleted under a workload whose processes may still run looks
/// again (their end changes the workload, not the lock).
const CLAIMANT_RECHECK: Duration = Duration::from_secs(2);

pub async fn reconcile(
    lock: Arc<DistributedLock>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let obj = ObjectRef::from_obj(&*lock);
    let result = reconcile_phase(lock, &ctx).await;
    ctx.reconciled(&obj);
    result
}

/// One reconcile: the claimant check, the finalizer, then the phase.
async fn reconcile_phase(
    lock: Arc<DistributedLock>,
    ctx: &Context,
) -> Result<Action, ReconcileError> {
    let ns = lock_namespace(&lock).to_string();
    if claimant_still_runs(&lock, ctx).await {
        // Its holder task (if any) keeps renewing meanwhile.
        return Ok(Action::requeue(CLAIMANT_RECHECK));
    }
    let api = Api::<DistributedLock>::namespaced(ctx.client.clone(), &ns);
    // kube's finalizer helper answers in kube-runtime's `Action`, whose requeue cannot
    // be read back for the queue; the phase's own answer is kept beside it. When the
    // helper only adds or drops the finalizer, that write's watch event is the next
    // request.
    let mut next = Action::await_change();
    finalizer(&api, FINALIZER, lock, |event| async {
        next = match event {
            Finalizer::Apply(lock) => {
                tracing::debug!(lock = %lock.name_any(), namespace = %ns, "reconcile");
                apply(&api, lock, ctx).await?
            }
            Finalizer::Cleanup(lock) => {
                tracing::debug!(lock = %lock.name_any(), namespace = %ns, "cleanup");
                release::cleanup(lock, ctx).await?
            }
        };
        Ok(kube::runtime::controller::Action::await_change())
    })
    .await
    .map_err(|e| ReconcileError::Finalizer(Box::new(e)))?;
    Ok(next)
}

/// Being deleted while the workload that claims it may still run processes: not
/// released yet (docs/design.md §6.3) — a clean release would let the next holder start
/// at once beside them. It stays held and renewed until they are observed ended (the
/// gating machine stops the workload, whose lock is no longer usable); a lock already
/// lost writes nothing either way. When the claimant cannot be asked, it waits too.
async fn claimant_still_runs(lock: &DistributedLock, ctx: &Context) -> bool {
    if lock.metadata.deletion_timestamp.is_none()
        || !lock.finalizers().iter().any(|f| f == FINALIZER)
    {
        return false;
    }
    let Some(claim) = lock.annotations().get(CLAIM_ANNOTATION) else {
        return false;
    };
    let kinds = crate::kinds::gated_kinds();
    let Some(claimant) = kinds.claimant(claim) else {
        return false;
    };
    match kinds
        .processes_ended(ctx.client.clone(), lock_namespace(lock), &claimant)
        .await
    {
        Ok(ended) => !ended,
        Err(error) => {
            tracing::warn!(lock = %lock.name_any(), %error, "cannot tell whether the claimant's processes ended; not releasing yet");
            true
        }
    }
}

/// The spec validated, once: then the phase the holder task and the status say the
/// lock is in.
async fn apply(
    api: &Api<DistributedLock>,
    lock: Arc<DistributedLock>,
    ctx: &Context,
) -> Result<Action, ReconcileError> {
    let obj = ObjectRef::from_obj(&*lock);
    let uid = lock.uid().unwrap_or_default();
    // Count the object by its stored phase (after a restart, before any write).
    ctx.telemetry
        .set_phase(&uid, lock.status.as_ref().and_then(|s| s.phase));

    let spec = match ValidatedSpec::of(&lock, &ctx.config.cluster_name) {
        Ok(spec) => spec,
        Err(error) => return release::reject(api, ctx, &lock, &obj, error).await,
    };
    let this = Reconciling {
        api,
        ctx,
        lock: &lock,
        spec,
        obj,
        uid,
    };
    if let Some((state, acquisition, held_key)) = ctx.holders.get(&this.obj, &this.uid) {
        return if lock.spec.release {
            this.release(&acquisition, &held_key).await
        } else {
            this.hold(state, &acquisition).await
        };
    }
    if lock.spec.release {
        return this.release_unheld().await;
    }
    let current = lock.status.clone().unwrap_or_default();
    let same_generation = current.observed_generation == lock.metadata.generation;
    if same_generation && matches!(current.phase, Some(LockPhase::Lost | LockPhase::Failed)) {
        return Ok(Action::await_change());
    }
    // Its run is done elsewhere (§6.7): never acquired again for it.
    let acquired = conditions::find_condition(&current.conditions, conditions::ACQUIRED);
    if same_generation && acquired.is_some_and(|c| c.reason == reason::RUN_COMPLETED) {
        return Ok(Action::await_change());
    }
    match (current.phase, current.nonce) {
        (Some(LockPhase::Held), Some(nonce)) => this.resume(&nonce).await,
        _ => this.acquire().await,
    }
}

/// One reconcile of a lock whose spec is valid: the phases are its methods, spread over
/// this module's files.
struct Reconciling<'a> {
    api: &'a Api<DistributedLock>,
    ctx: &'a Context,
    lock: &'a DistributedLock,
    /// The spec as this reconcile validated it: the only values the phases use.
    spec: ValidatedSpec,
    obj: ObjectRef<DistributedLock>,
    uid: String,
}

impl Reconciling<'_> {
    fn key(&self) -> &str {
        &self.spec.address.key
    }

    fn kind(&self) -> &'static str {
        self.spec.address.kind.as_str()
    }

    fn namespace(&self) -> &str {
        lock_namespace(self.lock)
    }

    fn policy(&self) -> RenewPolicy {
        RenewPolicy {
            interval: self.spec.renew_interval,
            ..RenewPolicy::for_lease(self.spec.lease)
        }
    }

    async fn connect(&self) -> Result<Arc<dyn LockBackend>, ConnectFailure> {
        self.ctx
            .connector
            .backend(&self.ctx.client, self.namespace(), &self.spec.address)
            .await
    }
}

/// `d` ± 20%, so that locks failing or waiting together do not retry together.
fn jitter(d: Duration) -> Duration {
    d.mul_f64(rand::rng().random_range(0.8..1.2))
}

#[cfg(test)]
mod tests;

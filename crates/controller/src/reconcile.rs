//! Reconcile, phase by phase, each phase a method of [`Reconciling`]:
//!
//! 1. finalizer (`lockwarden.io/release`): [`cleanup`] releases the lock (or stops
//!    waiting) and wakes the waiters on the same key;
//! 2. invalid spec → `Failed` / `InvalidSpec` ([`ValidatedSpec::of`] is the only check;
//!    everything after it works with parsed values);
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

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use rand::Rng;
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;

use super::config::{ControllerConfig, FINALIZER};
use super::connect::{ConnectFailure, Connector, FromSecrets};
use super::events::Events;
use super::gating::CLAIM_ANNOTATION;
use super::holders::{Acquisition, HolderTask, Holders, Owner};
use super::status::{self, Desired, Occupancy};
use super::validated::{LockAddress, ValidatedSpec};
use super::waiters::{WaitStart, WaiterIndex};
use crate::telemetry::{LockView, LossReason, Telemetry};
use lockwarden_api::conditions::reason;
use lockwarden_api::{DistributedLock, LockPhase, SpecError};
use lockwarden_core::{
    AcquireRequest, Attempt, CONNECT_TIMEOUT, HolderState, Lease, LockBackend, LockError,
    LockRecord, LostReason, QueueView, RenewPolicy, Stored,
};

/// How long a held lock waits between reconciles when nothing happens (transitions
/// arrive through the wake channel; this is only a safety net).
const HELD_RESYNC: Duration = Duration::from_secs(300);

/// How long a waiter on a store with watches (ZooKeeper) waits on its watch before it
/// looks again anyway: only a safety net for a watch lost with a connection.
const WATCH_RECHECK: Duration = Duration::from_secs(30);

/// How often a lock being deleted under a workload whose processes may still run looks
/// again (their end changes the workload, not the lock).
const CLAIMANT_RECHECK: Duration = Duration::from_secs(2);

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

/// Everything reconciles share.
pub struct Context {
    pub client: kube::Client,
    pub config: ControllerConfig,
    events: Events,
    holders: Holders,
    /// Locks waiting for their key, each with the backend it keeps between attempts.
    waiters: WaiterIndex<Arc<dyn LockBackend>>,
    wake: UnboundedSender<ObjectRef<DistributedLock>>,
    pub telemetry: Arc<Telemetry>,
    /// Where backends come from ([`FromSecrets`] unless [`Context::with_connector`]).
    connector: Arc<dyn Connector>,
}

impl Context {
    pub fn new(
        client: kube::Client,
        config: ControllerConfig,
        wake: UnboundedSender<ObjectRef<DistributedLock>>,
        telemetry: Arc<Telemetry>,
    ) -> Self {
        Context {
            events: Events::new(client.clone(), &config),
            client,
            config,
            holders: Holders::default(),
            waiters: WaiterIndex::default(),
            wake,
            telemetry,
            connector: Arc::new(FromSecrets),
        }
    }

    /// This context getting its backends from `connector`.
    pub fn with_connector(self, connector: Arc<dyn Connector>) -> Self {
        Context { connector, ..self }
    }

    /// A release the store did not confirm: the lease runs out on its own. Logged with
    /// the lock and counted, never a reason to fail the reconcile.
    fn release_failed(
        &self,
        obj: &ObjectRef<DistributedLock>,
        key: &str,
        error: &dyn std::error::Error,
    ) {
        tracing::warn!(lock = %obj, %key, %error, "release not confirmed by the store; its lease runs out on its own");
        self.telemetry.count_release_error();
    }

    /// Requeues every lock waiting on `key` (a same-cluster hand-off), after handing
    /// each the `released` record (if the backend gave one), so that its next attempt
    /// writes on it instead of reading the key first: one store round trip less
    /// between a release and the next holder.
    async fn hand_off(
        &self,
        key: &str,
        except: &ObjectRef<DistributedLock>,
        released: Option<Stored>,
    ) {
        for (obj, backend) in self.waiters.backends_waiting_on(key, except) {
            if let Some(released) = &released {
                backend.learn(released.clone()).await;
            }
            let _ = self.wake.send(obj);
        }
    }

    async fn event(&self, lock: &DistributedLock, type_: EventType, reason: &str, note: String) {
        self.events
            .publish(&lock.object_ref(&()), type_, reason, note)
            .await;
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

fn jitter(d: Duration) -> Duration {
    d.mul_f64(rand::rng().random_range(0.8..1.2))
}

pub async fn reconcile(
    lock: Arc<DistributedLock>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let ns = lock_namespace(&lock);
    if claimant_still_runs(&lock, &ctx).await {
        // Its holder task (if any) keeps renewing meanwhile.
        return Ok(Action::requeue(CLAIMANT_RECHECK));
    }
    let api = Api::<DistributedLock>::namespaced(ctx.client.clone(), &ns);
    finalizer(&api, FINALIZER, lock, |event| async {
        match event {
            Finalizer::Apply(lock) => {
                tracing::debug!(lock = %lock.name_any(), namespace = %ns, "reconcile");
                apply(&api, lock, &ctx).await
            }
            Finalizer::Cleanup(lock) => {
                tracing::debug!(lock = %lock.name_any(), namespace = %ns, "cleanup");
                cleanup(lock, &ctx).await
            }
        }
    })
    .await
    .map_err(|e| ReconcileError::Finalizer(Box::new(e)))
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
    let kinds = super::gated_kinds();
    let Some(claimant) = kinds.claimant(claim) else {
        return false;
    };
    let ns = lock_namespace(lock);
    match kinds
        .processes_ended(ctx.client.clone(), &ns, &claimant)
        .await
    {
        Ok(ended) => !ended,
        Err(error) => {
            tracing::warn!(lock = %lock.name_any(), %error, "cannot tell whether the claimant's processes ended; not releasing yet");
            true
        }
    }
}

fn lock_namespace(lock: &DistributedLock) -> String {
    lock.namespace().unwrap_or_else(|| "default".into())
}

/// Writes `desired` if the stored status does not already say it, and counts the
/// object in its phase.
async fn write(
    api: &Api<DistributedLock>,
    ctx: &Context,
    lock: &DistributedLock,
    desired: Desired,
) -> Result<(), ReconcileError> {
    let uid = lock.uid().unwrap_or_default();
    let phase = desired.phase;
    let namespace = lock_namespace(lock);
    let backend = desired.backend.clone();
    let view = LockView {
        namespace: &namespace,
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

/// Writes a `Failed` status (final for this generation); a Warning Event when the lock
/// was not already `Failed`.
async fn write_failed(
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

/// Times one backend request for `lockwarden_backend_request_duration_seconds`.
async fn timed<T>(
    ctx: &Context,
    kind: &str,
    operation: &str,
    request: impl std::future::Future<Output = T>,
) -> T {
    let start = Instant::now();
    let out = request.await;
    ctx.telemetry
        .observe_request(kind, operation, start.elapsed());
    out
}

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
        Err(error) => return reject(api, ctx, &lock, &obj, error).await,
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
    match (current.phase, current.nonce) {
        (Some(LockPhase::Held), Some(nonce)) => this.resume(&nonce).await,
        _ => this.acquire().await,
    }
}

/// An invalid spec: stop waiting, let go of the lock if it is held, and fail (an
/// [`ErrorCategory::Invalid`] error: no retry until the spec changes).
async fn reject(
    api: &Api<DistributedLock>,
    ctx: &Context,
    lock: &DistributedLock,
    obj: &ObjectRef<DistributedLock>,
    error: SpecError,
) -> Result<Action, ReconcileError> {
    ctx.waiters.stop_waiting(obj);
    if let Some(task) = ctx.holders.remove(obj) {
        let key = task.key.clone();
        if let Ok(kind) = lock.backend_kind() {
            let namespace = lock_namespace(lock);
            ctx.telemetry
                .observe_hold(&namespace, kind.as_str(), task.acquisition.acquired_at);
        }
        if let Err(e) = task.release().await {
            ctx.release_failed(obj, &key, &e);
        }
    }
    let failed = Desired::default().failed(reason::INVALID_SPEC, error.to_string());
    write_failed(api, ctx, lock, failed).await?;
    Err(ReconcileError::InvalidSpec(error))
}

/// What an attempt that found the lock held reported.
struct Busy<'a> {
    holder: &'a LockRecord,
    retry_in: Option<Duration>,
    queue_position: Option<u32>,
}

/// One reconcile of a lock whose spec is valid.
struct Reconciling<'a> {
    api: &'a Api<DistributedLock>,
    ctx: &'a Context,
    lock: &'a DistributedLock,
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

    fn namespace(&self) -> String {
        lock_namespace(self.lock)
    }

    /// The end of this lock's hold, for `lockwarden_hold_duration_seconds`.
    fn hold_ended(&self, acquisition: &Acquisition) {
        self.ctx
            .telemetry
            .observe_hold(&self.namespace(), self.kind(), acquisition.acquired_at);
    }

    /// Counts a loss, before the `Lost` status is written (which ends `LeaseExpiring`).
    fn count_loss(&self, why: &LostReason) {
        let expiring = self.ctx.telemetry.was_expiring(&self.uid);
        let reason = loss_reason(why, expiring);
        self.ctx
            .telemetry
            .count_loss(&self.namespace(), self.kind(), reason);
    }

    /// A status naming this lock's backend and key, to be completed.
    fn status(&self) -> Desired {
        Desired::for_key(self.kind(), self.key())
    }

    async fn write(&self, desired: Desired) -> Result<(), ReconcileError> {
        write(self.api, self.ctx, self.lock, desired).await
    }

    async fn event(&self, type_: EventType, reason: &str, note: String) {
        self.ctx.event(self.lock, type_, reason, note).await
    }

    fn policy(&self) -> RenewPolicy {
        RenewPolicy {
            interval: self.spec.renew_interval,
            ..RenewPolicy::for_lease(self.spec.lease)
        }
    }

    async fn connect(&self) -> Result<Arc<dyn LockBackend>, ConnectFailure> {
        let namespace = lock_namespace(self.lock);
        let address = &self.spec.address;
        self.ctx
            .connector
            .backend(&self.ctx.client, &namespace, address)
            .await
    }

    fn start_holder(&self, backend: Arc<dyn LockBackend>, lease: Lease) -> HolderTask {
        let owner = Owner {
            obj: self.obj.clone(),
            uid: self.uid.clone(),
            key: self.key().to_string(),
            wake: self.ctx.wake.clone(),
            renewals: self.ctx.telemetry.renewals(),
            renew_failures: self.ctx.telemetry.renew_failures(),
        };
        HolderTask::start(backend, lease, self.policy(), owner)
    }

    /// Phase: holding. Reports the holder task's state.
    async fn hold(
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

    /// Phase: `spec.release` while held. Releases, then wakes the locks waiting on the
    /// key the task held.
    async fn release(
        &self,
        acquisition: &Acquisition,
        held_key: &str,
    ) -> Result<Action, ReconcileError> {
        let releasing =
            self.status()
                .not_held(LockPhase::Releasing, reason::RELEASING, "releasing".into());
        self.write(releasing).await?;
        let result = match self.ctx.holders.remove(&self.obj) {
            Some(task) => timed(self.ctx, self.kind(), "release", task.release()).await,
            None => Ok(None),
        };
        self.hold_ended(acquisition);
        let released = result.as_ref().ok().cloned().flatten();
        self.ctx.hand_off(held_key, &self.obj, released).await;
        if let Err(e) = &result {
            self.ctx.release_failed(&self.obj, held_key, e);
        }
        let message = match &result {
            Ok(_) => format!("released {} (fence {})", self.key(), acquisition.fence),
            Err(e) => format!("released; the store said: {e}"),
        };
        let released =
            self.status()
                .not_held(LockPhase::Released, reason::RELEASED, message.clone());
        self.write(released).await?;
        self.event(EventType::Normal, "Released", message).await;
        Ok(Action::await_change())
    }

    /// Phase: `spec.release` without holding (never acquired, or stop waiting).
    async fn release_unheld(&self) -> Result<Action, ReconcileError> {
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

    /// Phase: `Held` in status but no holder task (the controller restarted): take the
    /// acquisition back by its nonce.
    async fn resume(&self, nonce: &str) -> Result<Action, ReconcileError> {
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
                        &self.namespace(),
                        self.kind(),
                        LossReason::Expired,
                    ),
                }
                let message = format!("could not resume after restart: {e}");
                self.report_lost(message).await
            }
        }
    }

    /// When this lock began waiting for its key: `status.waitingSince` if the status
    /// says it is waiting for this key (written before a restart), else now.
    fn wait_start(&self) -> WaitStart {
        let kept = self.lock.status.as_ref().filter(|s| {
            matches!(s.phase, Some(LockPhase::Waiting | LockPhase::Pending))
                && s.key.as_deref() == Some(self.key())
        });
        match kept.and_then(|s| s.waiting_since.as_ref()) {
            Some(since) => WaitStart::resumed(SystemTime::from(since.0)),
            None => WaitStart::now(),
        }
    }

    /// Phase: acquire, one attempt. A waiting lock keeps its backend between attempts.
    async fn acquire(&self) -> Result<Action, ReconcileError> {
        let waiters = &self.ctx.waiters;
        let (backend, since) = match waiters.current(&self.obj, &self.uid, self.key()) {
            Some(waiting) => waiting,
            None => {
                waiters.stop_waiting(&self.obj);
                let backend = match self.connect().await {
                    Ok(backend) => backend,
                    Err(e) => return self.backend_error(ReconcileError::Connect(e)).await,
                };
                let since = self.wait_start();
                waiters.insert(&self.obj, &self.uid, self.key(), backend.clone(), since);
                (backend, since)
            }
        };
        let request = AcquireRequest {
            holder: self.spec.holder.clone(),
            lease: self.spec.lease,
            data: self.lock.spec.data.clone(),
            force: self.lock.spec.force,
            reclaim: false,
            permits: self.spec.permits,
            cluster: Some(self.ctx.config.cluster_name.clone()),
            lock_delay: self.spec.lock_delay,
            queue: self.spec.queue,
            // Not a DistributedLock field yet (docs/design.md §6.4).
            yield_to_pollers: None,
        };
        match timed(
            self.ctx,
            self.kind(),
            "acquire",
            backend.try_acquire(&request),
        )
        .await
        {
            Ok(Attempt::Acquired(lease)) => self.acquired(backend, lease, since).await,
            Ok(Attempt::Busy {
                holder,
                retry_in,
                queue_position,
            }) => {
                let busy = Busy {
                    holder: &holder,
                    retry_in,
                    queue_position,
                };
                self.busy(&backend, busy, since).await
            }
            Err(LockError::Foreign { found, .. }) => {
                waiters.stop_waiting(&self.obj);
                let message = format!(
                    "{} holds a record lockwarden does not own: {found} (set spec.force to overwrite)",
                    self.key()
                );
                self.fail(reason::FOREIGN, message).await
            }
            Err(e @ LockError::PermitsDisagree { .. }) => {
                // Permanent until the other locks on the key (or this spec) change.
                if let Some(backend) = waiters.stop_waiting(&self.obj) {
                    backend.abandon().await;
                }
                self.fail(reason::PERMITS_DISAGREE, e.to_string()).await
            }
            Err(e) => self.backend_error(ReconcileError::Store(e)).await,
        }
    }

    /// The attempt acquired: start holding, report, and tell what happened.
    async fn acquired(
        &self,
        backend: Arc<dyn LockBackend>,
        lease: Lease,
        since: WaitStart,
    ) -> Result<Action, ReconcileError> {
        self.ctx.waiters.stop_waiting(&self.obj);
        self.ctx.telemetry.observe_acquire(since.elapsed());
        let task = self.start_holder(backend, lease);
        let acq = task.acquisition.clone();
        self.ctx.telemetry.count_acquired(
            &self.uid,
            &self.namespace(),
            self.kind(),
            since.elapsed(),
            acq.forced_from.is_some(),
        );
        tracing::debug!(lock = %self.obj, key = %self.key(), fence = acq.fence, "acquired");
        self.ctx.holders.insert(self.obj.clone(), task);
        self.write(self.status().held(&acq, None)).await?;
        let key = self.key();
        if let Some(from) = &acq.forced_from {
            let note = format!("took {key} over by force from {from}; fence {}", acq.fence);
            self.event(EventType::Warning, "Forced", note).await;
        }
        let mut note = format!("acquired {key} as {} with fence {}", acq.holder, acq.fence);
        if let Some(occupancy) = &acq.occupancy {
            note.push_str(&format!(" ({occupancy})"));
        }
        self.event(EventType::Normal, "Acquired", note).await;
        Ok(Action::requeue(HELD_RESYNC))
    }

    /// The attempt found the lock held: wait — on the store's watch where it has one,
    /// else polling — or give up after `acquireTimeout`.
    async fn busy(
        &self,
        backend: &Arc<dyn LockBackend>,
        busy: Busy<'_>,
        since: WaitStart,
    ) -> Result<Action, ReconcileError> {
        let Busy {
            holder,
            retry_in,
            queue_position,
        } = busy;
        tracing::debug!(lock = %self.obj, holder = %holder.holder, ?retry_in, "busy");
        let timeout = self.spec.acquire_timeout;
        let waited = since.elapsed();
        if let Some(limit) = timeout
            && waited >= limit
        {
            if let Some(backend) = self.ctx.waiters.stop_waiting(&self.obj) {
                backend.abandon().await;
            }
            let message = format!(
                "gave up after {}s waiting for {}, held by {} (fence {})",
                waited.as_secs(),
                self.key(),
                holder.holder,
                holder.fence
            );
            return self.fail(reason::ACQUIRE_TIMEOUT, message).await;
        }
        let waiting = match Occupancy::of(holder) {
            Some(occupancy) => self.status().waiting_for_permit(
                &holder.holder,
                holder.fence,
                queue_position,
                occupancy,
            ),
            None => self
                .status()
                .waiting(&holder.holder, holder.fence, queue_position),
        }
        .with_history_of(holder)
        .in_queue(
            holder
                .set
                .as_ref()
                .and_then(|set| QueueView::of_holder(set, &self.spec.holder, SystemTime::now())),
        )
        .since(Some(since.wall));
        // A write that would only move this waiter's place waits its turn (n waiters
        // must not mean n² writes per drain); the status keeps the place it shows.
        let waiting = match self.lock.status.as_ref() {
            Some(current)
                if status::only_the_place_moved(self.lock, &waiting)
                    && !self
                        .ctx
                        .waiters
                        .may_show_place(&self.obj, waiting.queue_position == Some(0)) =>
            {
                waiting.keeping_place_of(current)
            }
            _ => waiting,
        };
        self.write(waiting).await?;
        let mut pause = if backend.watches_changes() {
            self.watch_for_change(backend);
            WATCH_RECHECK
        } else {
            let poll = self.ctx.waiters.next_poll(&self.obj);
            jitter(retry_in.map_or(poll, |r| r.min(poll).max(Duration::from_millis(5))))
        };
        if let Some(limit) = timeout {
            pause = pause.min(limit.saturating_sub(waited).max(Duration::from_millis(5)));
        }
        Ok(Action::requeue(pause))
    }

    /// Wakes this lock when the store reports a change to what it waits on (its
    /// predecessor in a ZooKeeper queue), once per change: no poll while the holder
    /// stays. A same-cluster release also wakes it directly.
    fn watch_for_change(&self, backend: &Arc<dyn LockBackend>) {
        let (backend, obj, wake) = (backend.clone(), self.obj.clone(), self.ctx.wake.clone());
        self.ctx.waiters.watch(&self.obj, move || {
            tokio::spawn(async move {
                backend.changed(WATCH_RECHECK).await;
                let _ = wake.send(obj);
            })
            .abort_handle()
        });
    }

    /// `Failed` for `why`: final for this generation.
    async fn fail(&self, why: &'static str, message: String) -> Result<Action, ReconcileError> {
        let failed = self.status().failed(why, message);
        write_failed(self.api, self.ctx, self.lock, failed).await
    }

    /// Lost is final for this generation: status says why, and a Warning Event records it.
    async fn report_lost(&self, message: String) -> Result<Action, ReconcileError> {
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
    /// [`error_policy`] once the status says it. A lock that was waiting stays
    /// `Waiting`, and keeps the start of its wait.
    async fn backend_error(&self, error: ReconcileError) -> Result<Action, ReconcileError> {
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

/// Finalizer cleanup: release (or stop waiting) before the object goes away.
///
/// Not a [`Reconciling`] method: it must work for a spec that is no longer valid (made
/// invalid while the lock was held), so it needs only [`LockAddress`].
async fn cleanup(lock: Arc<DistributedLock>, ctx: &Context) -> Result<Action, ReconcileError> {
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
    let backend = match ctx
        .connector
        .backend(&ctx.client, &namespace, address)
        .await
    {
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
        .observe_hold(&namespace, address.kind.as_str(), lease.acquired_at());
    if let Err(e) = backend.release(&lease).await {
        ctx.release_failed(obj, key, &e);
    }
    ctx.hand_off(key, obj, backend.last_release().await).await;
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
    let kind = lock.backend_kind().map(|k| k.as_str()).unwrap_or_default();
    if !kind.is_empty() {
        ctx.telemetry
            .observe_hold(&lock_namespace(lock), kind, task.acquisition.acquired_at);
    }
    let result = timed(ctx, kind, "release", task.release()).await;
    tracing::debug!(lock = %obj, %key, "released before deletion; waking waiters");
    let released = result.as_ref().ok().cloned().flatten();
    ctx.hand_off(&key, obj, released).await;
    if let Err(e) = &result {
        ctx.release_failed(obj, &key, e);
    }
    let note = match result {
        Ok(_) => format!("released {key} (fence {fence}) before deletion"),
        Err(e) => format!("deleting; release of {key} reported: {e}"),
    };
    ctx.event(lock, EventType::Normal, "Released", note).await;
}

#[cfg(test)]
mod tests;

//! Reconcile, phase by phase:
//!
//! 1. finalizer (`lockwarden.io/release`): cleanup releases the lock (or stops waiting)
//!    and wakes the waiters on the same key;
//! 2. invalid spec → `Failed` / `InvalidSpec`;
//! 3. a holder task exists → report its state (`Held`, `LeaseExpiring`, `Lost`), or
//!    release it when `spec.release` is set (`Releasing` → `Released`);
//! 4. `Held` in status but no task (a restart) → resume from `status.nonce`;
//! 5. otherwise one acquisition attempt: `Held`, or `Waiting` with a jittered requeue
//!    (woken early by a same-cluster release), or `Failed` after `acquireTimeout`.
//!
//! `Lost` and `Failed` are final for the object's generation: changing the spec (or
//! deleting and recreating the object) tries again.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use rand::Rng;
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;

use super::holders::{Acquisition, HolderTask, Holders};
use super::status::{self, Desired};
use super::{ControllerConfig, FINALIZER};
use crate::api::conditions::reason;
use crate::api::{DistributedLock, LockPhase, SelectedBackend, SpecError};
use crate::backend::{ConnectOptions, Target};
use crate::lock::{AcquireRequest, Attempt, HolderState, LockBackend, LockError, RenewPolicy};
use crate::telemetry::Telemetry;

/// How long a held lock waits between reconciles when nothing happens (transitions
/// arrive through the wake channel; this is only a safety net).
const HELD_RESYNC: Duration = Duration::from_secs(300);
/// Bounds of the waiting poll (cross-cluster holders are only seen by polling).
const POLL_MIN: Duration = Duration::from_millis(100);
const POLL_MAX: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<ReconcileError>>),
    #[error("{0}")]
    Lock(#[from] LockError),
}

/// A lock waiting for its key: its backend (kept so that rule-1 observation of the
/// holder's lease survives across attempts), when it started waiting, its poll.
struct Waiter {
    uid: String,
    key: String,
    backend: Arc<dyn LockBackend>,
    since: Instant,
    poll: Duration,
}

/// Everything reconciles share.
pub struct Context {
    pub client: kube::Client,
    pub config: ControllerConfig,
    recorder: Recorder,
    holders: Holders,
    waiters: Mutex<HashMap<ObjectRef<DistributedLock>, Waiter>>,
    /// backend key → locks waiting on it, woken when a holder here lets go.
    by_key: Mutex<HashMap<String, HashSet<ObjectRef<DistributedLock>>>>,
    wake: UnboundedSender<ObjectRef<DistributedLock>>,
    pub telemetry: Arc<Telemetry>,
}

impl Context {
    pub fn new(
        client: kube::Client,
        config: ControllerConfig,
        wake: UnboundedSender<ObjectRef<DistributedLock>>,
        telemetry: Arc<Telemetry>,
    ) -> Self {
        let reporter = Reporter {
            controller: config.reporter.clone(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            config,
            holders: Holders::default(),
            waiters: Mutex::default(),
            by_key: Mutex::default(),
            wake,
            telemetry,
        }
    }

    /// Requeues every lock waiting on `key` (a same-cluster handoff).
    fn wake_waiters(&self, key: &str, except: &ObjectRef<DistributedLock>) {
        let waiting: Vec<_> = self
            .by_key
            .lock()
            .expect("by_key")
            .get(key)
            .map(|s| s.iter().filter(|o| *o != except).cloned().collect())
            .unwrap_or_default();
        for obj in waiting {
            let _ = self.wake.send(obj);
        }
    }

    fn stop_waiting(&self, obj: &ObjectRef<DistributedLock>) -> Option<Arc<dyn LockBackend>> {
        let waiter = self.waiters.lock().expect("waiters").remove(obj)?;
        let mut by_key = self.by_key.lock().expect("by_key");
        if let Some(set) = by_key.get_mut(&waiter.key) {
            set.remove(obj);
            if set.is_empty() {
                by_key.remove(&waiter.key);
            }
        }
        Some(waiter.backend)
    }

    async fn event(&self, lock: &DistributedLock, type_: EventType, reason: &str, note: String) {
        let ev = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: reason.to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &lock.object_ref(&())).await {
            tracing::debug!(error = %e, "cannot publish event");
        }
    }
}

pub fn error_policy(
    _lock: Arc<DistributedLock>,
    err: &ReconcileError,
    _ctx: Arc<Context>,
) -> Action {
    tracing::warn!(error = %err, "reconcile failed; retrying");
    Action::requeue(jitter(Duration::from_secs(2)))
}

fn jitter(d: Duration) -> Duration {
    d.mul_f64(rand::rng().random_range(0.8..1.2))
}

pub async fn reconcile(
    lock: Arc<DistributedLock>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let ns = lock.namespace().unwrap_or_else(|| "default".into());
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

/// Connects the backend a spec names. Credentials come only from a Secret in the
/// lock's own namespace.
async fn backend_for(
    lock: &DistributedLock,
    key: &str,
    ctx: &Context,
) -> Result<Arc<dyn LockBackend>, String> {
    let target = Target::parse(key).map_err(|e| e.to_string())?;
    let mut options = ConnectOptions {
        kube_client: Some(ctx.client.clone()),
        ..Default::default()
    };
    let secret = match lock.spec.backend.selected().map_err(|e| e.to_string())? {
        SelectedBackend::S3(s) => {
            options.endpoint = s.endpoint.clone().filter(|e| !e.is_empty());
            options.region = s.region.clone();
            options.force_path_style = s.force_path_style;
            s.credentials_secret_ref.clone()
        }
        SelectedBackend::DynamoDb(d) => {
            options.endpoint = d.endpoint.clone().filter(|e| !e.is_empty());
            options.region = d.region.clone();
            options.partition_key = Some(d.partition_key_name.clone());
            options.sort_key = d
                .sort_key
                .as_ref()
                .map(|s| (s.name.clone(), s.value.clone()));
            options.create_table = d.create_table.unwrap_or(false);
            d.credentials_secret_ref.clone()
        }
        SelectedBackend::ZooKeeper(_) | SelectedBackend::Kubernetes(_) => None,
    };
    if let Some(secret) = secret {
        let ns = lock.namespace().unwrap_or_else(|| "default".into());
        let api = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(ctx.client.clone(), &ns);
        let s = api
            .get(&secret.name)
            .await
            .map_err(|e| format!("credentials Secret {ns}/{}: {e}", secret.name))?;
        let data = s.data.unwrap_or_default();
        let field = |k: &str| {
            data.get(k)
                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        };
        let (Some(id), Some(secret_key)) =
            (field("AWS_ACCESS_KEY_ID"), field("AWS_SECRET_ACCESS_KEY"))
        else {
            return Err(format!(
                "credentials Secret {ns}/{} lacks AWS_ACCESS_KEY_ID or AWS_SECRET_ACCESS_KEY",
                secret.name
            ));
        };
        options.credentials = Some(aws_sdk_s3::config::Credentials::new(
            id,
            secret_key,
            field("AWS_SESSION_TOKEN"),
            None,
            "lockwarden-secret",
        ));
    }
    target.connect(&options).await.map_err(|e| e.to_string())
}

/// What every status of this lock carries.
fn base(kind: &str, key: &str) -> Desired {
    Desired {
        backend: Some(kind.to_string()),
        key: Some(key.to_string()),
        ..Default::default()
    }
}

fn held_status(kind: &str, key: &str, a: &Acquisition, state: &HolderState) -> Desired {
    let acquired = match state {
        HolderState::Expiring { last_error, .. } => (
            false,
            reason::LEASE_EXPIRING,
            format!("renewals failing, not claiming the lock: {last_error}"),
        ),
        _ if a.forced_from.is_some() => (
            true,
            reason::FORCED,
            format!(
                "taken over by force from {}",
                a.forced_from.as_ref().expect("checked")
            ),
        ),
        _ => (
            true,
            reason::LEASE_HELD,
            format!("held with fence {}", a.fence),
        ),
    };
    Desired {
        phase: Some(LockPhase::Held),
        holder: Some(a.holder.clone()),
        etag: Some(a.version.clone()),
        fence: Some(a.fence as i64),
        nonce: Some(a.nonce.clone()),
        acquired_at: status::time(a.acquired_at),
        acquired,
        ..base(kind, key)
    }
}

async fn write(
    api: &Api<DistributedLock>,
    ctx: &Context,
    lock: &DistributedLock,
    desired: Desired,
) -> Result<(), ReconcileError> {
    let uid = lock.uid().unwrap_or_default();
    let phase = desired.phase;
    if let Some(next) = status::next_status(lock, desired) {
        status::write(api, &lock.name_any(), &next).await?;
    }
    ctx.telemetry.set_phase(&uid, phase);
    Ok(())
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

async fn fail(
    api: &Api<DistributedLock>,
    lock: &DistributedLock,
    ctx: &Context,
    desired: Desired,
    why: &'static str,
    message: String,
) -> Result<Action, ReconcileError> {
    let was_failed = lock.status.as_ref().and_then(|s| s.phase) == Some(LockPhase::Failed);
    write(
        api,
        ctx,
        lock,
        Desired {
            phase: Some(LockPhase::Failed),
            acquired: (false, why, message.clone()),
            ..desired
        },
    )
    .await?;
    if !was_failed {
        ctx.event(lock, EventType::Warning, "Failed", message).await;
    }
    Ok(Action::await_change())
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

    // Phase: spec validation.
    let checked: Result<(String, String), SpecError> = lock
        .spec
        .validate()
        .and_then(|()| Ok((lock.backend_kind()?.to_string(), lock.lock_key()?)));
    let (kind, key) = match checked {
        Ok(k) => k,
        Err(e) => {
            ctx.stop_waiting(&obj);
            if let Some(task) = ctx.holders.remove(&obj) {
                let _ = task.release().await;
            }
            return fail(
                api,
                &lock,
                ctx,
                Desired::default(),
                reason::INVALID_SPEC,
                e.to_string(),
            )
            .await;
        }
    };

    // Phase: holding.
    if let Some((state, acq, held_key)) = ctx.holders.get(&obj, &uid) {
        if lock.spec.release {
            write(
                api,
                ctx,
                &lock,
                Desired {
                    phase: Some(LockPhase::Releasing),
                    acquired: (false, reason::RELEASING, "releasing".into()),
                    ..base(&kind, &key)
                },
            )
            .await?;
            let result = match ctx.holders.remove(&obj) {
                Some(task) => timed(ctx, &kind, "release", task.release()).await,
                None => Ok(()),
            };
            ctx.wake_waiters(&held_key, &obj);
            let message = match &result {
                Ok(()) => format!("released {key} (fence {})", acq.fence),
                Err(e) => format!("released; the store said: {e}"),
            };
            write(
                api,
                ctx,
                &lock,
                Desired {
                    phase: Some(LockPhase::Released),
                    acquired: (false, reason::RELEASED, message.clone()),
                    ..base(&kind, &key)
                },
            )
            .await?;
            ctx.event(&lock, EventType::Normal, "Released", message)
                .await;
            return Ok(Action::await_change());
        }
        return match state {
            HolderState::Held { .. } | HolderState::Expiring { .. } => {
                write(api, ctx, &lock, held_status(&kind, &key, &acq, &state)).await?;
                Ok(Action::requeue(HELD_RESYNC))
            }
            HolderState::Lost(why) => {
                ctx.holders.remove(&obj);
                let message = format!("lock lost: {why}");
                report_lost(api, ctx, &lock, &kind, &key, message).await
            }
            HolderState::Released => {
                ctx.holders.remove(&obj);
                write(
                    api,
                    ctx,
                    &lock,
                    Desired {
                        phase: Some(LockPhase::Released),
                        acquired: (false, reason::RELEASED, "released".into()),
                        ..base(&kind, &key)
                    },
                )
                .await?;
                Ok(Action::await_change())
            }
        };
    }

    let current = lock.status.clone().unwrap_or_default();
    let same_generation = current.observed_generation == lock.metadata.generation;

    // Phase: released without holding (never acquired, or stopped waiting).
    if lock.spec.release {
        if let Some(backend) = ctx.stop_waiting(&obj) {
            backend.abandon().await;
        }
        write(
            api,
            ctx,
            &lock,
            Desired {
                phase: Some(LockPhase::Released),
                acquired: (false, reason::RELEASED, "spec.release is set".into()),
                ..base(&kind, &key)
            },
        )
        .await?;
        return Ok(Action::await_change());
    }

    // Lost and Failed are final for this generation.
    if same_generation && matches!(current.phase, Some(LockPhase::Lost | LockPhase::Failed)) {
        return Ok(Action::await_change());
    }

    let holder = lock.holder_identity(&ctx.config.cluster_name);
    let lease = lock.spec.lease_duration().expect("validated");
    let renew = lock.spec.renew_interval().expect("validated");
    let policy = RenewPolicy {
        interval: renew,
        ..RenewPolicy::for_lease(lease)
    };

    // Phase: resume after a restart.
    if current.phase == Some(LockPhase::Held)
        && let Some(nonce) = current.nonce.clone()
    {
        let backend = match backend_for(&lock, &key, ctx).await {
            Ok(b) => b,
            Err(e) => return backend_error(api, ctx, &lock, &kind, &key, e).await,
        };
        return match backend.resume(&holder, &nonce).await {
            Ok(resumed) => {
                let task = HolderTask::start(
                    backend,
                    resumed,
                    policy,
                    uid,
                    key.clone(),
                    obj.clone(),
                    ctx.wake.clone(),
                    ctx.telemetry.renew_failures(),
                );
                task.settled(policy.request_timeout + policy.retry).await;
                tracing::info!(lock = %obj, fence = task.acquisition.fence, "resumed held lock");
                ctx.holders.insert(obj, task);
                Ok(Action::requeue(HELD_RESYNC))
            }
            Err(e) if e.is_transient() => {
                backend_error(api, ctx, &lock, &kind, &key, e.to_string()).await
            }
            Err(e) => {
                let message = format!("could not resume after restart: {e}");
                report_lost(api, ctx, &lock, &kind, &key, message).await
            }
        };
    }

    // Phase: acquire (one attempt).
    let existing = {
        let waiters = ctx.waiters.lock().expect("waiters");
        waiters
            .get(&obj)
            .filter(|w| w.uid == uid && w.key == key)
            .map(|w| (w.backend.clone(), w.since))
    };
    let (backend, since) = match existing {
        Some(b) => b,
        None => {
            ctx.stop_waiting(&obj);
            let backend = match backend_for(&lock, &key, ctx).await {
                Ok(b) => b,
                Err(e) => return backend_error(api, ctx, &lock, &kind, &key, e).await,
            };
            let since = Instant::now();
            ctx.waiters.lock().expect("waiters").insert(
                obj.clone(),
                Waiter {
                    uid: uid.clone(),
                    key: key.clone(),
                    backend: backend.clone(),
                    since,
                    poll: POLL_MIN,
                },
            );
            ctx.by_key
                .lock()
                .expect("by_key")
                .entry(key.clone())
                .or_default()
                .insert(obj.clone());
            (backend, since)
        }
    };
    let req = AcquireRequest {
        holder,
        lease,
        data: lock.spec.data.clone(),
        force: lock.spec.force,
    };
    match timed(ctx, &kind, "acquire", backend.try_acquire(&req)).await {
        Ok(Attempt::Acquired(acquired)) => {
            ctx.stop_waiting(&obj);
            ctx.telemetry.observe_acquire(since.elapsed());
            let task = HolderTask::start(
                backend,
                acquired,
                policy,
                uid,
                key.clone(),
                obj.clone(),
                ctx.wake.clone(),
                ctx.telemetry.renew_failures(),
            );
            let acq = task.acquisition.clone();
            tracing::debug!(lock = %obj, %key, fence = acq.fence, "acquired");
            ctx.holders.insert(obj, task);
            write(
                api,
                ctx,
                &lock,
                held_status(&kind, &key, &acq, &HolderState::Released),
            )
            .await?;
            if let Some(from) = &acq.forced_from {
                ctx.event(
                    &lock,
                    EventType::Warning,
                    "Forced",
                    format!("took {key} over by force from {from}; fence {}", acq.fence),
                )
                .await;
            }
            ctx.event(
                &lock,
                EventType::Normal,
                "Acquired",
                format!("acquired {key} as {} with fence {}", acq.holder, acq.fence),
            )
            .await;
            Ok(Action::requeue(HELD_RESYNC))
        }
        Ok(Attempt::Busy {
            holder,
            retry_in,
            queue_position,
        }) => {
            tracing::debug!(lock = %obj, holder = %holder.holder, ?retry_in, "busy");
            let timeout = lock.spec.acquire_timeout().expect("validated");
            let waited = since.elapsed();
            if let Some(limit) = timeout
                && waited >= limit
            {
                if let Some(b) = ctx.stop_waiting(&obj) {
                    b.abandon().await;
                }
                return fail(
                    api,
                    &lock,
                    ctx,
                    base(&kind, &key),
                    reason::ACQUIRE_TIMEOUT,
                    format!(
                        "gave up after {}s waiting for {key}, held by {} (fence {})",
                        waited.as_secs(),
                        holder.holder,
                        holder.fence
                    ),
                )
                .await;
            }
            write(
                api,
                ctx,
                &lock,
                Desired {
                    phase: Some(LockPhase::Waiting),
                    holder: Some(holder.holder.clone()),
                    queue_position: queue_position.map(|p| p as i32),
                    acquired: (
                        false,
                        reason::WAITING,
                        format!("held by {} (fence {})", holder.holder, holder.fence),
                    ),
                    ..base(&kind, &key)
                },
            )
            .await?;
            let poll = {
                let mut waiters = ctx.waiters.lock().expect("waiters");
                match waiters.get_mut(&obj) {
                    Some(w) => {
                        let p = w.poll;
                        w.poll = w.poll.mul_f64(1.5).min(POLL_MAX);
                        p
                    }
                    None => POLL_MIN,
                }
            };
            let mut pause = retry_in.map_or(poll, |r| r.min(poll).max(Duration::from_millis(5)));
            if let Some(limit) = timeout {
                pause = pause.min(limit.saturating_sub(waited).max(Duration::from_millis(5)));
            }
            Ok(Action::requeue(jitter(pause)))
        }
        Err(LockError::Foreign { found, .. }) => {
            ctx.stop_waiting(&obj);
            fail(
                api,
                &lock,
                ctx,
                base(&kind, &key),
                reason::FOREIGN,
                format!("{key} holds a record lockwarden does not own: {found} (set spec.force to overwrite)"),
            )
            .await
        }
        Err(e) => backend_error(api, ctx, &lock, &kind, &key, e.to_string()).await,
    }
}

/// The backend could not be reached or refused: not acquired, retried.
/// Lost is final for this generation: status says why, and a Warning Event records it.
async fn report_lost(
    api: &Api<DistributedLock>,
    ctx: &Context,
    lock: &DistributedLock,
    kind: &str,
    key: &str,
    message: String,
) -> Result<Action, ReconcileError> {
    write(
        api,
        ctx,
        lock,
        Desired {
            phase: Some(LockPhase::Lost),
            acquired: (false, reason::LOST, message.clone()),
            ..base(kind, key)
        },
    )
    .await?;
    ctx.event(lock, EventType::Warning, "Lost", message).await;
    Ok(Action::await_change())
}

async fn backend_error(
    api: &Api<DistributedLock>,
    ctx: &Context,
    lock: &DistributedLock,
    kind: &str,
    key: &str,
    message: String,
) -> Result<Action, ReconcileError> {
    let phase = match lock.status.as_ref().and_then(|s| s.phase) {
        Some(LockPhase::Waiting) => LockPhase::Waiting,
        _ => LockPhase::Pending,
    };
    write(
        api,
        ctx,
        lock,
        Desired {
            phase: Some(phase),
            acquired: (false, reason::BACKEND_ERROR, message),
            ..base(kind, key)
        },
    )
    .await?;
    Ok(Action::requeue(jitter(Duration::from_secs(5))))
}

/// Finalizer cleanup: release (or stop waiting) before the object goes away.
async fn cleanup(lock: Arc<DistributedLock>, ctx: &Context) -> Result<Action, ReconcileError> {
    let obj = ObjectRef::from_obj(&*lock);
    if let Some(backend) = ctx.stop_waiting(&obj) {
        backend.abandon().await;
    }
    if let Some(task) = ctx.holders.remove(&obj) {
        let key = task.key.clone();
        let fence = task.acquisition.fence;
        let kind = lock
            .backend_kind()
            .map(|k| k.to_string())
            .unwrap_or_default();
        let result = timed(ctx, &kind, "release", task.release()).await;
        tracing::debug!(lock = %obj, %key, "released before deletion; waking waiters");
        ctx.wake_waiters(&key, &obj);
        let note = match result {
            Ok(()) => format!("released {key} (fence {fence}) before deletion"),
            Err(e) => format!("deleting; release of {key} reported: {e}"),
        };
        ctx.event(&lock, EventType::Normal, "Released", note).await;
    } else if let Some(status) = &lock.status
        && status.phase == Some(LockPhase::Held)
        && let (Some(nonce), Ok(key)) = (status.nonce.clone(), lock.lock_key())
    {
        // Held before a restart and never resumed: release by nonce.
        let holder = lock.holder_identity(&ctx.config.cluster_name);
        if let Ok(backend) = backend_for(&lock, &key, ctx).await
            && let Ok(lease) = backend.resume(&holder, &nonce).await
        {
            let _ = backend.release(&lease).await;
            ctx.wake_waiters(&key, &obj);
        }
    }
    ctx.telemetry
        .set_phase(&lock.uid().unwrap_or_default(), None);
    Ok(Action::await_change())
}

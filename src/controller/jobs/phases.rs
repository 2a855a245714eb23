//! One function per phase of a gated Job (see the module docs of [`super`]), on one
//! reconcile context, [`Run`].

use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;

use super::gate::{
    self, Gate, LockStanding, OnLockLost, RunningAction, Settings, has_finalizer, held,
    not_held_reason, per_job_lock_name, template_fence,
};
use super::writes::clear_start_time;
use super::{
    FENCE_ANNOTATION, HOLDER_ANNOTATION, JobContext, JobError, LOCK_ANNOTATION,
    LOST_FENCE_ANNOTATION, STATUS_ANNOTATION, STOPPED_ANNOTATION, WAITING_RESYNC,
};
use crate::api::DistributedLock;
use crate::controller::gating::locks::{self, Claim, claim, own_lock};
use crate::controller::gating::writes::{add_finalizer, remove_finalizer, report, set_status};

/// Lets the Job's lock go (the shared way); a named lock the Job ran with even when
/// its claim was removed by hand.
async fn let_go(
    locks: &Api<DistributedLock>,
    job: &Job,
    gate: &Gate,
) -> Result<Option<String>, JobError> {
    Ok(locks::let_go(locks, &gate::workload(job), gate, gate::running(job)).await?)
}

/// How the status of a running Job whose lock is no longer held begins (`ignore`).
const NOT_HELD_PREFIX: &str = "running with fence";

/// One reconcile of one Job.
pub(super) struct Run<'a> {
    ctx: &'a JobContext,
    job: &'a Job,
    jobs: Api<Job>,
    locks: Api<DistributedLock>,
}

impl<'a> Run<'a> {
    pub fn new(ctx: &'a JobContext, job: &'a Job) -> Self {
        let ns = job.namespace().unwrap_or_else(|| "default".into());
        Run {
            ctx,
            job,
            jobs: Api::namespaced(ctx.client.clone(), &ns),
            locks: Api::namespaced(ctx.client.clone(), &ns),
        }
    }

    fn lock_name(&self, gate: &Gate) -> String {
        match gate {
            Gate::Named(name) => name.clone(),
            Gate::Template(_) => per_job_lock_name(self.job),
        }
    }

    async fn report(
        &self,
        type_: EventType,
        reason: &str,
        message: String,
    ) -> Result<(), JobError> {
        Ok(report(
            &self.jobs,
            &self.ctx.events,
            self.job,
            type_,
            reason,
            message,
        )
        .await?)
    }

    /// Deleted: let the lock go, then drop the finalizer.
    pub async fn on_deleted(self, gate: Option<Gate>) -> Result<Action, JobError> {
        self.ctx
            .forget_not_held(&self.job.uid().unwrap_or_default());
        if !has_finalizer(self.job) {
            return Ok(Action::await_change());
        }
        if let Some(gate) = gate
            && let Some(note) = let_go(&self.locks, self.job, &gate).await?
        {
            let message = format!("{note}: Job deleted");
            self.ctx
                .event(self.job, EventType::Normal, "Released", message)
                .await;
        }
        remove_finalizer(&self.jobs, self.job).await?;
        Ok(Action::await_change())
    }

    /// The lock annotations were removed: nothing to gate any more.
    pub async fn on_ungated(self) -> Result<Action, JobError> {
        if has_finalizer(self.job) {
            remove_finalizer(&self.jobs, self.job).await?;
        }
        Ok(Action::await_change())
    }

    /// Annotations that cannot be acted on: a Warning, and the Job stays as it is.
    pub async fn on_invalid(self, message: String) -> Result<Action, JobError> {
        self.report(EventType::Warning, "InvalidLockAnnotation", message)
            .await?;
        Ok(Action::await_change())
    }

    /// `Complete` or `Failed`: let the lock go, drop the finalizer.
    pub async fn on_finished(self, gate: &Gate) -> Result<Action, JobError> {
        self.ctx
            .forget_not_held(&self.job.uid().unwrap_or_default());
        if !has_finalizer(self.job) {
            return Ok(Action::await_change());
        }
        let how = gate::finished(self.job)
            .unwrap_or("finished")
            .to_lowercase();
        let lock_name = self.lock_name(gate);
        let message = match let_go(&self.locks, self.job, gate).await? {
            Some(note) => format!("{note}: Job {how}"),
            None => format!("Job {how}; lock {lock_name} was already let go"),
        };
        // The finalizer goes first: its patch is conditioned on the resourceVersion
        // this reconcile read, which the status write would change.
        remove_finalizer(&self.jobs, self.job).await?;
        let patched = set_status(&self.jobs, self.job, &message).await?;
        self.ctx
            .event(
                patched.as_ref().unwrap_or(self.job),
                EventType::Normal,
                "Released",
                message,
            )
            .await;
        Ok(Action::await_change())
    }

    /// Stopped for good (`on-lock-lost: fail`): the lock is let go once, the finalizer
    /// dropped; the Job is never started again.
    pub async fn on_stopped(self, settings: &Settings) -> Result<Action, JobError> {
        if has_finalizer(self.job) {
            let_go(&self.locks, self.job, &settings.gate).await?;
            remove_finalizer(&self.jobs, self.job).await?;
        }
        Ok(Action::await_change())
    }

    /// Not started and not suspended: it runs without the lock, which we cannot stop.
    pub async fn on_not_suspended(self, settings: &Settings) -> Result<Action, JobError> {
        let lock_name = self.lock_name(&settings.gate);
        let message = format!(
            "the Job names lock {lock_name} but is not suspended, so it runs without \
             waiting for the lock; create it with spec.suspend: true and lockwarden \
             starts it once the lock is held"
        );
        self.report(EventType::Warning, "NotSuspended", message)
            .await?;
        Ok(Action::await_change())
    }

    /// Started by us: watch the lock, and act on `on-lock-lost` once it is not held.
    pub async fn on_running(self, settings: &Settings) -> Result<Action, JobError> {
        let uid = self.job.uid().unwrap_or_default();
        let lock_name = self.lock_name(&settings.gate);
        let lock = self.locks.get_opt(&lock_name).await?;
        let fence = template_fence(self.job);
        let standing = gate::standing(lock.as_ref(), &lock_name, fence);
        let not_held_for = match standing {
            LockStanding::Held => {
                self.ctx.forget_not_held(&uid);
                Default::default()
            }
            LockStanding::NotHeld { .. } => self.ctx.not_held_for(&uid),
        };
        let fence_text = fence.map(|f| f.to_string()).unwrap_or_default();
        match (
            gate::running_action(&standing, settings, not_held_for),
            standing,
        ) {
            (RunningAction::Continue, _) => {
                let warned = self
                    .job
                    .annotations()
                    .get(STATUS_ANNOTATION)
                    .is_some_and(|s| s.starts_with(NOT_HELD_PREFIX));
                if warned {
                    // The lock came back (e.g. renewals recovered): say so instead of
                    // leaving the warning in place.
                    let message = format!("holds lock {lock_name} again (fence {fence_text})");
                    self.report(EventType::Normal, "LockHeld", message).await?;
                }
                Ok(Action::await_change())
            }
            (RunningAction::WaitGrace(left), _) => Ok(Action::requeue(left)),
            (RunningAction::Warn, LockStanding::NotHeld { why, .. }) => {
                let message =
                    format!("{NOT_HELD_PREFIX} {fence_text} but no longer holds the lock: {why}");
                self.report(EventType::Warning, "LockNotHeld", message)
                    .await?;
                Ok(Action::await_change())
            }
            (RunningAction::Stop, LockStanding::NotHeld { reason, why, .. }) => {
                self.stop(settings, reason, &why, fence).await
            }
            // `running_action` answers Warn and Stop only for a lock not held.
            (RunningAction::Warn | RunningAction::Stop, LockStanding::Held) => {
                Ok(Action::await_change())
            }
        }
    }

    /// Suspends a running Job whose lock is no longer held — one patch, conditioned on
    /// the resourceVersion this reconcile read, so a Job changed meanwhile is looked at
    /// again first — then lets its lock go so it can be acquired anew.
    async fn stop(
        self,
        settings: &Settings,
        reason: &str,
        why: &str,
        fence: Option<i64>,
    ) -> Result<Action, JobError> {
        let lock_name = self.lock_name(&settings.gate);
        let fence_text = fence.map(|f| f.to_string()).unwrap_or_else(|| "?".into());
        let fail = settings.on_lock_lost == OnLockLost::Fail;
        let (message, event_reason) = if fail {
            (
                format!(
                    "stopped for good (on-lock-lost: fail): it ran with fence {fence_text} \
                     and no longer holds lock {lock_name} ({reason}: {why}); suspended, the \
                     lock released, never started again"
                ),
                "Stopped",
            )
        } else {
            (
                format!(
                    "suspended: it ran with fence {fence_text} and no longer holds lock \
                     {lock_name} ({reason}: {why}); it starts again once it holds the lock, \
                     with a new fence"
                ),
                "Suspended",
            )
        };
        let mut annotations = json!({
            STATUS_ANNOTATION: message,
            LOST_FENCE_ANNOTATION: fence_text,
        });
        if fail {
            annotations[STOPPED_ANNOTATION] = json!(format!("{reason}: {why}"));
        }
        let patch = json!({
            "metadata": {
                "resourceVersion": self.job.resource_version(),
                "annotations": annotations,
            },
            "spec": { "suspend": true },
        });
        let patched = self
            .jobs
            .patch(
                &self.job.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        self.ctx.telemetry.count_job_stopped(reason);
        self.ctx
            .forget_not_held(&self.job.uid().unwrap_or_default());
        tracing::warn!(
            job = %self.job.name_any(), lock = %lock_name, fence = %fence_text, reason,
            "suspended a gated Job whose lock is no longer held"
        );
        self.ctx
            .event(&patched, EventType::Warning, event_reason, message)
            .await;
        // Let the lock go now (the stopped or re-gated Job picks up from here if this
        // fails): a per-Job lock is deleted and made anew, a named one released.
        let_go(&self.locks, &patched, &settings.gate).await?;
        if fail {
            remove_finalizer(&self.jobs, &patched).await?;
        }
        Ok(Action::await_change())
    }

    /// Suspended and not running: claim or create the lock, and start the Job once the
    /// lock is held for it, or say why not.
    pub async fn start_or_explain(self, settings: &Settings) -> Result<Action, JobError> {
        if !has_finalizer(self.job) {
            add_finalizer(&self.jobs, self.job).await?;
            // The patched Job comes back through the watch.
            return Ok(Action::await_change());
        }
        let lock_name = self.lock_name(&settings.gate);
        let Some(lock) = self.lock_for(&settings.gate).await? else {
            return Ok(Action::requeue(WAITING_RESYNC));
        };
        let lost_fence = gate::lost_fence(self.job);
        if let Some(lost) = lost_fence
            && gate::is_old_acquisition(&lock, lost)
        {
            // Still the acquisition the Job lost: let it go, so the next is a new one.
            let_go(&self.locks, self.job, &settings.gate).await?;
            let message = format!(
                "waiting for lock {lock_name}: letting go of the acquisition lost with fence {lost}"
            );
            self.report(EventType::Normal, "Waiting", message).await?;
            return Ok(Action::requeue(WAITING_RESYNC));
        }
        let Some((fence, holder)) = held(&lock) else {
            let (message, problem) = not_held_reason(&lock);
            let (type_, reason) = if problem {
                (EventType::Warning, "LockFailed")
            } else {
                (EventType::Normal, "Waiting")
            };
            self.report(type_, reason, message).await?;
            return Ok(Action::requeue(WAITING_RESYNC));
        };
        if lost_fence.is_some() && !gate::pods_gone(self.job) {
            // The Job controller is still deleting the Pods of the run that lost the
            // lock; their end comes through the Job watch.
            let message =
                format!("holds lock {lock_name}; waiting for the Pods of the previous run to go");
            self.report(EventType::Normal, "Waiting", message).await?;
            return Ok(Action::await_change());
        }
        if self
            .job
            .status
            .as_ref()
            .is_some_and(|s| s.start_time.is_some())
        {
            // Before Kubernetes 1.36 a Job that ran keeps its pod template immutable
            // while status.startTime is set (1.36's Job controller clears it on
            // suspension); clearing it, as Kueue does, lets the new fence in.
            clear_start_time(&self.jobs, self.job).await?;
            return Ok(Action::await_change());
        }
        self.start(&lock_name, fence, holder).await
    }

    /// The named lock claimed for this Job, or its own lock (created from the template
    /// on first use); `None` after reporting why there is none to use yet.
    async fn lock_for(&self, gate: &Gate) -> Result<Option<DistributedLock>, JobError> {
        let workload = gate::workload(self.job);
        let claimed = match gate {
            Gate::Named(name) => claim(&self.locks, &workload, name, self.in_use_by(name)).await?,
            Gate::Template(template) => {
                own_lock(
                    &self.locks,
                    &self.ctx.config.cluster_name,
                    &workload,
                    template,
                )
                .await?
            }
        };
        match claimed {
            Claim::Ours(lock) => Ok(Some(*lock)),
            Claim::Waiting(type_, reason, message) => {
                self.report(type_, reason, message).await?;
                Ok(None)
            }
        }
    }

    /// Another unfinished Job of the namespace that was started with the named lock
    /// `name` (from the cache): a claim removed by hand must not let this one start.
    fn in_use_by(&self, name: &str) -> Option<String> {
        let ns = self.job.namespace();
        self.ctx
            .jobs
            .state()
            .iter()
            .find(|j| {
                j.namespace() == ns
                    && j.uid() != self.job.uid()
                    && j.annotations().get(LOCK_ANNOTATION).map(String::as_str) == Some(name)
                    && gate::running(j)
                    && gate::finished(j).is_none()
            })
            .map(|j| format!("Job {}", j.name_any()))
    }

    /// One write sets the fence, holder and lock on the pod template and unsuspends the
    /// Job, conditioned on the resourceVersion this reconcile read.
    async fn start(self, lock_name: &str, fence: i64, holder: String) -> Result<Action, JobError> {
        let message = format!("started holding lock {lock_name} (fence {fence}, holder {holder})");
        let patch = json!({
            "metadata": {
                "resourceVersion": self.job.resource_version(),
                "annotations": { STATUS_ANNOTATION: message, LOST_FENCE_ANNOTATION: null },
            },
            "spec": {
                "suspend": false,
                "template": { "metadata": { "annotations": {
                    FENCE_ANNOTATION: fence.to_string(),
                    HOLDER_ANNOTATION: holder,
                    LOCK_ANNOTATION: lock_name,
                }}},
            },
        });
        self.jobs
            .patch(
                &self.job.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        tracing::info!(job = %self.job.name_any(), fence, "unsuspended gated Job");
        self.ctx
            .event(self.job, EventType::Normal, "Started", message)
            .await;
        Ok(Action::await_change())
    }
}

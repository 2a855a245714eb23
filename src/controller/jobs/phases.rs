//! One function per phase of a gated Job (see the module docs of [`super`]), on one
//! reconcile context, [`Run`].

use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;

use super::gate::{self, LockSet, OnLockLost, Settings, has_finalizer};
use super::writes::clear_start_time;
use super::{
    JobContext, JobError, LOCK_ANNOTATION, LOST_FENCE_ANNOTATION, STATUS_ANNOTATION,
    STOPPED_ANNOTATION, WAITING_RESYNC,
};
use crate::api::DistributedLock;
use crate::controller::gating::lockset::{self, RanWith, Taker, Taking, WorkloadLock, describe};
use crate::controller::gating::running::{Running, Step};
use crate::controller::gating::writes::{add_finalizer, remove_finalizer, report, set_status};
use crate::controller::gating::{self, Kind};

/// Lets every lock of the Job go (the shared way); a named lock the Job ran with even
/// when its claim was removed by hand. What was done, `None` if nothing.
async fn let_go(
    api: &Api<DistributedLock>,
    job: &Job,
    set: &LockSet,
) -> Result<Option<String>, JobError> {
    let workload = gate::workload(job);
    let locks = lockset::named(set, &workload);
    let notes = lockset::let_go_all(api, &workload, &locks, gate::running(job)).await?;
    Ok((!notes.is_empty()).then(|| notes.join("; ")))
}

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

    fn locks(&self, set: &LockSet) -> Vec<WorkloadLock> {
        lockset::named(set, &gate::workload(self.job))
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
    pub async fn on_deleted(self, set: Option<LockSet>) -> Result<Action, JobError> {
        self.ctx
            .forget_not_held(&self.job.uid().unwrap_or_default());
        if !has_finalizer(self.job) {
            return Ok(Action::await_change());
        }
        if let Some(set) = set
            && let Some(note) = let_go(&self.locks, self.job, &set).await?
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
    pub async fn on_finished(self, set: &LockSet) -> Result<Action, JobError> {
        self.ctx
            .forget_not_held(&self.job.uid().unwrap_or_default());
        if !has_finalizer(self.job) {
            return Ok(Action::await_change());
        }
        let how = gate::finished(self.job)
            .unwrap_or("finished")
            .to_lowercase();
        let what = describe(&self.locks(set));
        let message = match let_go(&self.locks, self.job, set).await? {
            Some(note) => format!("{note}: Job {how}"),
            None => format!("Job {how}; {what} was already let go"),
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
            let_go(&self.locks, self.job, &settings.locks).await?;
            remove_finalizer(&self.jobs, self.job).await?;
        }
        Ok(Action::await_change())
    }

    /// Not started and not suspended: it runs without the lock, which we cannot stop.
    pub async fn on_not_suspended(self, settings: &Settings) -> Result<Action, JobError> {
        let what = describe(&self.locks(&settings.locks));
        let message = format!(
            "the Job names {what} but is not suspended, so it runs without \
             waiting for the lock; create it with spec.suspend: true and lockwarden \
             starts it once the lock is held"
        );
        self.report(EventType::Warning, "NotSuspended", message)
            .await?;
        Ok(Action::await_change())
    }

    /// Started by us: watch the locks, and act on `on-lock-lost` once one is not held.
    pub async fn on_running(self, settings: &Settings) -> Result<Action, JobError> {
        let uid = self.job.uid().unwrap_or_default();
        let locks = self.locks(&settings.locks);
        let fences = gate::template_fences(self.job, &locks);
        let running = Running {
            api: &self.locks,
            locks: &locks,
            fences: &fences,
            annotations: self.job.annotations(),
            uid: &uid,
            policy: settings.loss_policy(),
        };
        match running.step(&self.ctx.not_held_since).await? {
            Step::Continue(None) => Ok(Action::await_change()),
            Step::Continue(Some(message)) => {
                self.report(EventType::Normal, "LockHeld", message).await?;
                Ok(Action::await_change())
            }
            Step::WaitGrace(left) => Ok(Action::requeue(left)),
            Step::Warn(message) => {
                self.report(EventType::Warning, "LockNotHeld", message)
                    .await?;
                Ok(Action::await_change())
            }
            Step::Stop {
                reason,
                why,
                locks,
                fences,
            } => self.stop(settings, reason, &why, &locks, &fences).await,
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
        lock_name: &str,
        fence_text: &str,
    ) -> Result<Action, JobError> {
        let fail = settings.on_lock_lost == OnLockLost::Fail;
        let (message, event_reason) = if fail {
            (
                format!(
                    "stopped for good (on-lock-lost: fail): it ran with fence {fence_text} \
                     and no longer holds {lock_name} ({reason}: {why}); suspended, the \
                     lock released, never started again"
                ),
                "Stopped",
            )
        } else {
            (
                format!(
                    "suspended: it ran with fence {fence_text} and no longer holds \
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
        let_go(&self.locks, &patched, &settings.locks).await?;
        if fail {
            remove_finalizer(&self.jobs, &patched).await?;
        }
        Ok(Action::await_change())
    }

    /// Suspended and not running: take the locks (claim or create each, one at a time
    /// in the global order), and start the Job once all are held for it, or say why not.
    pub async fn start_or_explain(self, settings: &Settings) -> Result<Action, JobError> {
        if !has_finalizer(self.job) {
            add_finalizer(&self.jobs, self.job).await?;
            // The patched Job comes back through the watch.
            return Ok(Action::await_change());
        }
        let workload = gate::workload(self.job);
        let ordered = match lockset::in_take_order(&self.locks, &settings.locks, &workload).await? {
            Ok(ordered) => ordered,
            Err((type_, reason, message)) => {
                self.report(type_, reason, message).await?;
                return Ok(Action::requeue(WAITING_RESYNC));
            }
        };
        let lost = gate::lost_fences(self.job, &ordered);
        let in_use_by = |name: &str| self.in_use_by(name);
        let taker = Taker {
            api: &self.locks,
            workload: &workload,
            cluster: &self.ctx.config.cluster_name,
            in_use_by: &in_use_by,
            lost: &lost,
        };
        let ran = match taker.take(&ordered).await? {
            Taking::Held(ran) => ran,
            Taking::Waiting((type_, reason, message)) => {
                self.report(type_, reason, message).await?;
                return Ok(Action::requeue(WAITING_RESYNC));
            }
        };
        if !lost.is_empty() && !gate::pods_gone(self.job) {
            // The Job controller is still deleting the Pods of the run that lost the
            // lock; their end comes through the Job watch.
            let message = format!(
                "holds {}; waiting for the Pods of the previous run to go",
                describe(&ordered)
            );
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
        self.start(&ordered, ran).await
    }

    /// Another unfinished Job started with the named lock `name` (from the cache): a
    /// claim removed by hand must not let this one start.
    fn in_use_by(&self, name: &str) -> Option<String> {
        let started = |j: &Job| gate::running(j) && gate::finished(j).is_none();
        gating::in_use_by(Kind::Job, &self.ctx.jobs.state(), self.job, name, started)
    }

    /// One write sets the fence(s) on the pod template (with the holder and the lock's
    /// name for one lock) and unsuspends the Job, conditioned on the resourceVersion
    /// this reconcile read.
    async fn start(self, locks: &[WorkloadLock], ran: RanWith) -> Result<Action, JobError> {
        let message = format!("started holding {}", ran.describe());
        let mut template = ran.annotations();
        if let [only] = locks {
            template.insert(LOCK_ANNOTATION.into(), only.name.clone().into());
        }
        let patch = json!({
            "metadata": {
                "resourceVersion": self.job.resource_version(),
                "annotations": { STATUS_ANNOTATION: message, LOST_FENCE_ANNOTATION: null },
            },
            "spec": {
                "suspend": false,
                "template": { "metadata": { "annotations": template } },
            },
        });
        self.jobs
            .patch(
                &self.job.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        tracing::info!(job = %self.job.name_any(), fences = ?ran.0, "unsuspended gated Job");
        self.ctx
            .event(self.job, EventType::Normal, "Started", message)
            .await;
        Ok(Action::await_change())
    }
}

//! Job gating (docs/design.md §6, §6.1): a second controller, over `batch/v1` Jobs that
//! carry `lockwarden.io/lock: NAME` (claim the existing DistributedLock NAME) or
//! `lockwarden.io/lock-template: NAME` (a per-Job DistributedLock copied from NAME) —
//! or, for several locks, the lists `lockwarden.io/locks: A,B` and
//! `lockwarden.io/lock-templates: T,U`, taken one at a time in one global order
//! ([`crate::controller::gating::lockset`]).
//!
//! It never talks to a backend: it only creates, claims, releases and deletes
//! `DistributedLock` objects and reads their status, which the lock controller
//! ([`super::reconcile`]) maintains. So it has no backend-kind branches at all.
//!
//! Reconcile dispatches on [`gate::phase`] to one phase function ([`phases`]):
//!
//! - deleted (our finalizer is set) → let the lock go, drop the finalizer;
//! - bad annotations → Warning Event, the Job stays as it is (never started);
//! - finished (`Complete` or `Failed`) → let the lock go, drop the finalizer;
//! - running (started by us: the pod template carries `lockwarden.io/fence` or
//!   `/fences`) → watch the locks; once one is no longer held, act on `lockwarden.io/on-lock-lost`:
//!   `suspend` (default) suspends the Job — one patch conditioned on its
//!   resourceVersion — so the Job controller deletes its Pods, lets the lock go and
//!   gates the Job again; `fail` does the same and marks it stopped for good;
//!   `ignore` only warns;
//! - not suspended → Warning Event: it cannot be gated;
//! - gated → add the finalizer; claim each named lock or create each per-Job lock, the
//!   next only once the previous is held; once all are `Acquired=True` for this Job at
//!   their current generation with a fence (higher than the one a stopped Job ran
//!   with), one write sets the pod-template annotations (`lockwarden.io/fence`,
//!   `/holder`, `/lock`; for several locks `lockwarden.io/fences: A=3,B=7`) *and*
//!   `spec.suspend=false`,
//!   conditioned on the Job's resourceVersion; otherwise the Job stays suspended and
//!   `lockwarden.io/status` (plus an Event when it changes) says why.
//!
//! "Let the lock go": a per-Job lock is deleted (its finalizer releases it in the
//! store); a named lock gets `spec.release: true` and loses its claim in one write, so
//! the next Job naming it re-acquires it (a new acquisition, a higher fence). A Job
//! stopped after a loss is "the next Job" of its own lock: that is how it re-acquires
//! although `Lost` is final for a lock's generation.
//!
//! Wake-ups: the Job watch, plus a watch on DistributedLocks mapped to the Jobs that
//! own, claim or name each lock, so a lock's status change reconciles its Jobs.

mod gate;
mod phases;
mod writes;

pub use super::gating::{
    CLAIM_ANNOTATION, FENCE_ANNOTATION, FENCES_ANNOTATION, HOLDER_ANNOTATION, LOCK_ANNOTATION,
    LOCKS_ANNOTATION, LOST_GRACE_ANNOTATION, ON_LOCK_LOST_ANNOTATION, STATUS_ANNOTATION,
    TEMPLATE_ANNOTATION, TEMPLATES_ANNOTATION,
};
pub use gate::{
    Gate, JobPhase, OnLockLost, Settings, finished, max_lost_grace, per_job_lock_name, settings,
    template_annotation,
};

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::events::Events;
use super::gating::{self, Kind, NotHeldSince};
use super::{ControllerConfig, FINALIZER};
use crate::api::DistributedLock;
use crate::telemetry::Telemetry;

/// Job annotation, written by lockwarden: the fence a Job ran with when it was
/// suspended after losing its lock; the Job waits for the lock again.
pub const LOST_FENCE_ANNOTATION: &str = "lockwarden.io/lost-fence";
/// Job annotation, written by lockwarden: why it stopped the Job for good
/// (`on-lock-lost: fail`); such a Job is never unsuspended again.
pub const STOPPED_ANNOTATION: &str = "lockwarden.io/stopped";
/// Safety net for a waiting Job: lock changes arrive through the watch.
const WAITING_RESYNC: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// What the Job controller's reconciles share.
pub struct JobContext {
    pub client: kube::Client,
    pub config: ControllerConfig,
    events: Events,
    /// The Controller's cache of Jobs.
    jobs: Store<Job>,
    pub telemetry: Arc<Telemetry>,
    /// For `lockwarden.io/lost-grace`.
    not_held_since: NotHeldSince,
}

impl JobContext {
    pub fn new(
        client: kube::Client,
        config: ControllerConfig,
        jobs: Store<Job>,
        telemetry: Arc<Telemetry>,
    ) -> Self {
        JobContext {
            events: Events::new(client.clone(), &config),
            client,
            config,
            jobs,
            telemetry,
            not_held_since: NotHeldSince::default(),
        }
    }

    async fn event(&self, job: &Job, type_: EventType, reason: &str, note: String) {
        gating::event(&self.events, job, type_, reason, note).await;
    }

    fn forget_not_held(&self, uid: &str) {
        self.not_held_since.forget(uid);
    }
}

pub fn error_policy(_job: Arc<Job>, err: &JobError, _ctx: Arc<JobContext>) -> Action {
    tracing::debug!(error = %err, "job reconcile failed; retrying");
    // Mostly a lost race on a resourceVersion precondition: retry soon.
    Action::requeue(Duration::from_secs(1))
}

/// Runs the Job controller until its watch stream ends (it does not on its own).
pub async fn run(client: kube::Client, config: ControllerConfig, telemetry: Arc<Telemetry>) {
    let (jobs, locks): (Api<Job>, Api<DistributedLock>) = match &config.namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let controller = Controller::new(jobs, watcher::Config::default());
    let store = controller.store();
    let ctx = Arc::new(JobContext::new(client, config, store.clone(), telemetry));
    controller
        .watches(locks, watcher::Config::default(), move |lock| {
            jobs_of_lock(&lock, &store.state())
        })
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((job, _)) => tracing::trace!(%job, "job reconciled"),
                Err(e) => tracing::debug!(error = %e, "job reconcile failed"),
            }
        })
        .await;
}

/// The Jobs a lock change concerns (see [`gating::workloads_of_lock`]).
pub fn jobs_of_lock(lock: &DistributedLock, jobs: &[Arc<Job>]) -> Vec<ObjectRef<Job>> {
    gating::workloads_of_lock(Kind::Job, lock, jobs)
}

/// One reconcile of a Job: read its settings and phase, run that phase's function.
pub async fn reconcile(job: Arc<Job>, ctx: Arc<JobContext>) -> Result<Action, JobError> {
    let run = phases::Run::new(&ctx, &job);
    let phase = gate::phase(&job);
    // Letting go needs only the lock's name: a bad policy annotation must not keep a
    // deleted or finished Job's lock.
    match (phase, gate::locks(job.annotations())) {
        (JobPhase::Deleted, locks) => return run.on_deleted(locks.ok().flatten()).await,
        (JobPhase::Finished, Ok(Some(locks))) => return run.on_finished(&locks).await,
        _ => {}
    }
    let settings = match settings(&job) {
        Ok(Some(settings)) => settings,
        Ok(None) => return run.on_ungated().await,
        Err(message) => return run.on_invalid(message).await,
    };
    match phase {
        JobPhase::Stopped => run.on_stopped(&settings).await,
        JobPhase::Running => run.on_running(&settings).await,
        JobPhase::NotSuspended => run.on_not_suspended(&settings).await,
        JobPhase::Gated => run.start_or_explain(&settings).await,
        // Handled above (a finished Job always has a valid gate by now).
        JobPhase::Deleted | JobPhase::Finished => Ok(Action::await_change()),
    }
}

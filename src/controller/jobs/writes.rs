//! Writes to the Job itself: its status annotation (with an Event), our finalizer,
//! and `status.startTime` before a restart.

use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use serde_json::json;

use super::{FINALIZER, JobContext, JobError, STATUS_ANNOTATION};

/// Writes `message` to the Job's status annotation and records an Event, both only when
/// the message changed (a waiting Job is reconciled on every change of its lock).
pub(super) async fn report(
    jobs: &Api<Job>,
    ctx: &JobContext,
    job: &Job,
    type_: EventType,
    reason: &str,
    message: String,
) -> Result<(), JobError> {
    if job.annotations().get(STATUS_ANNOTATION) == Some(&message) {
        return Ok(());
    }
    // The Event refers to the Job as patched, resourceVersion included: kube's Recorder
    // folds Events with the same reason about an equal object reference into one
    // series that keeps the first note, so referring to the new version makes each
    // change of text an Event of its own.
    let patched = set_status(jobs, job, &message).await?;
    ctx.event(patched.as_ref().unwrap_or(job), type_, reason, message)
        .await;
    Ok(())
}

/// Writes the status annotation; the patched Job, or `None` when it already said that.
pub(super) async fn set_status(
    jobs: &Api<Job>,
    job: &Job,
    message: &str,
) -> Result<Option<Job>, JobError> {
    if job.annotations().get(STATUS_ANNOTATION).map(String::as_str) == Some(message) {
        return Ok(None);
    }
    let patch = json!({ "metadata": { "annotations": { STATUS_ANNOTATION: message } } });
    let patched = jobs
        .patch(
            &job.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(Some(patched))
}

/// The finalizer keeps a deleted Job around until its lock is let go (no garbage
/// collector is needed for that, and a named lock has no owner to collect it by).
pub(super) async fn add_finalizer(jobs: &Api<Job>, job: &Job) -> Result<(), JobError> {
    let mut finalizers = job.finalizers().to_vec();
    finalizers.push(FINALIZER.to_string());
    patch_finalizers(jobs, job, finalizers).await
}

/// Dropped as soon as the lock is let go, so a finished Job never needs the controller
/// to be deleted.
pub(super) async fn remove_finalizer(jobs: &Api<Job>, job: &Job) -> Result<(), JobError> {
    let finalizers: Vec<String> = job
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    patch_finalizers(jobs, job, finalizers).await
}

async fn patch_finalizers(
    jobs: &Api<Job>,
    job: &Job,
    finalizers: Vec<String>,
) -> Result<(), JobError> {
    // The list is replaced whole, so the resourceVersion guards other controllers'
    // finalizers against a lost update.
    let patch = json!({
        "metadata": { "resourceVersion": job.resource_version(), "finalizers": finalizers },
    });
    match jobs
        .patch(
            &job.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        // Already gone: nothing left to finalize.
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Clears `status.startTime` of a suspended Job that ran before, conditioned on the
/// resourceVersion read, as Kueue does: before Kubernetes 1.36 (feature gate
/// `MutableSchedulingDirectivesForSuspendedJobs`, with which the Job controller clears
/// it itself on suspension) the API server keeps the pod template of a Job with a
/// `startTime` immutable, and the restart must put the new fence there. The Job
/// controller sets it again when the Job resumes.
pub(super) async fn clear_start_time(jobs: &Api<Job>, job: &Job) -> Result<(), JobError> {
    let patch = json!({
        "metadata": { "resourceVersion": job.resource_version() },
        "status": { "startTime": null },
    });
    jobs.patch_status(
        &job.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

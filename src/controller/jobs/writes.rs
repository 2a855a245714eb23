//! The write only a Job needs: `status.startTime` cleared before a restart (the status
//! annotation and finalizer writes are shared with Pods: `gating::writes`).

use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::JobError;

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

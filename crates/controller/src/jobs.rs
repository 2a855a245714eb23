//! Job gating (docs/design.md §6, §6.1): `batch/v1` Jobs that carry
//! `lockwarden.io/lock: NAME` (claim the existing DistributedLock NAME) or
//! `lockwarden.io/lock-template: NAME` (a per-Job DistributedLock copied from NAME) —
//! or, for several locks, the lists `lockwarden.io/locks: A,B` and
//! `lockwarden.io/lock-templates: T,U` — driven by the gating machine
//! ([`super::gating::machine`]). What is the Job's own:
//!
//! - held back means `spec.suspend: true`; one write sets the pod-template annotations
//!   (`lockwarden.io/fence`, `/holder`, `/lock`; for several locks
//!   `lockwarden.io/fences: A=3,B=7`) *and* `spec.suspend=false`, conditioned on the
//!   Job's resourceVersion;
//! - finished means `Complete` or `Failed`;
//! - stopping after a loss suspends it (one patch conditioned on its resourceVersion),
//!   the machine deletes its Pods with their grace period, and its locks are let go
//!   once the Pods have ended (docs/design.md §6.3), so it waits for them anew: `on-lock-lost: suspend` (default); `fail` does the same and marks it
//!   stopped for good (`lockwarden.io/stopped`); `ignore` only warns;
//! - a Job stopped after a loss is "the next Job" of its own lock (a new acquisition, a
//!   higher fence): it restarts only once the Pods of the run that lost it are gone,
//!   and after `status.startTime` is cleared (see [`clear_start_time`]).

use std::collections::BTreeMap;

use async_trait::async_trait;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ObjectReference, Pod, PodSpec};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use serde_json::json;

use super::config::ControllerConfig;
use super::gating::kind;
use super::gating::lockset::{self, RanWith, WorkloadLock};
use super::gating::once::{OnceError, ScheduledRun};
use super::gating::stop;
use super::gating::{GatedWorkload, Kind, OnLockLost, Readiness, Stopped, Stopping, machine};
use crate::telemetry::Telemetry;
use lockwarden_api::conditions;

pub use super::gating::{
    CLAIM_ANNOTATION, FENCE_ANNOTATION, FENCES_ANNOTATION, HOLDER_ANNOTATION, LOCK_ANNOTATION,
    LOCKS_ANNOTATION, LOST_GRACE_ANNOTATION, ON_LOCK_LOST_ANNOTATION, PRIORITY_ANNOTATION,
    STATUS_ANNOTATION, TEMPLATE_ANNOTATION, TEMPLATES_ANNOTATION,
};

/// Job annotation, written by the CronJob controller (Kubernetes 1.32+) on every Job it
/// creates: the scheduled time, in the CronJob's `spec.timeZone` (compared as an
/// instant).
pub const SCHEDULED_TIMESTAMP_ANNOTATION: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";

/// Job annotation, written by lockwarden: the fence a Job ran with when it was
/// suspended after losing its lock; the Job waits for the lock again.
pub const LOST_FENCE_ANNOTATION: &str = "lockwarden.io/lost-fence";
/// Job annotation, written by lockwarden: why it stopped the Job for good
/// (`on-lock-lost: fail`); such a Job is never unsuspended again.
pub const STOPPED_ANNOTATION: &str = "lockwarden.io/stopped";

/// Jobs claim a lock as `<job>/<uid>`, the format since Job gating began.
pub static JOB: Kind = Kind {
    name: "Job",
    api_version: "batch/v1",
    claim_prefix: None,
    block_owner_deletion: true,
    templates_elsewhere: false,
    on_lock_lost: &[
        ("suspend", OnLockLost::Stop),
        ("fail", OnLockLost::Fail),
        ("ignore", OnLockLost::Ignore),
    ],
};

#[async_trait]
impl GatedWorkload for Job {
    const KIND: &'static Kind = &JOB;

    fn finished(&self) -> Option<&str> {
        finished(self)
    }

    fn running(&self) -> bool {
        running(self)
    }

    /// Created by a CronJob: its owner and `batch.kubernetes.io/cronjob-scheduled-timestamp`
    /// (set on every Job a CronJob creates since Kubernetes 1.32).
    fn scheduled_run(&self) -> Option<Result<ScheduledRun, OnceError>> {
        let owner = self
            .owner_references()
            .iter()
            .find(|o| o.kind == "CronJob" && o.controller == Some(true))?;
        let scheduled = self.annotations().get(SCHEDULED_TIMESTAMP_ANNOTATION)?;
        let namespace = self.namespace().unwrap_or_default();
        let owner = ObjectReference {
            api_version: Some(owner.api_version.clone()),
            kind: Some(owner.kind.clone()),
            name: Some(owner.name.clone()),
            namespace: Some(namespace.clone()),
            uid: Some(owner.uid.clone()),
            ..Default::default()
        };
        Some(ScheduledRun::parse(&namespace, owner, scheduled))
    }

    /// Deleted (its Pods with it, in the background), conditioned on its uid: its
    /// CronJob then records it as `MissingJob` and does not create it again, and a
    /// `Forbid` CronJob's next run is not blocked by it.
    async fn end_unrun(&self, api: &Api<Job>) -> Result<bool, kube::Error> {
        let background = Some(kube::api::PropagationPolicy::Background);
        kind::delete_this(api, self, background).await?;
        Ok(true)
    }

    fn held_back(&self) -> bool {
        self.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false)
    }

    fn stopped_for_good(&self) -> bool {
        self.annotations().contains_key(STOPPED_ANNOTATION)
    }

    fn fences(&self, locks: &[WorkloadLock]) -> Vec<(String, Option<i64>)> {
        let annotations = self
            .spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.annotations.clone())
            .unwrap_or_default();
        lockset::fences_of(&annotations, locks)
    }

    /// `lockwarden.io/lost-fence`: a fence for one lock, `NAME=FENCE,…` for several.
    fn lost_fences(&self, locks: &[WorkloadLock]) -> BTreeMap<String, i64> {
        let Some(value) = self.annotations().get(LOST_FENCE_ANNOTATION) else {
            return BTreeMap::new();
        };
        match (value.parse::<i64>(), locks) {
            (Ok(fence), [only]) => BTreeMap::from([(only.name.clone(), fence)]),
            _ => lockset::parse_fences(value)
                .into_iter()
                .map(|(n, f)| (n.to_string(), f))
                .collect(),
        }
    }

    fn not_held_back(&self, what: &str) -> (&'static str, String) {
        (
            "NotSuspended",
            format!(
                "the Job names {what} but is not suspended, so it runs without \
                 waiting for the lock; create it with spec.suspend: true and lockwarden \
                 starts it once the lock is held"
            ),
        )
    }

    fn pod_spec(&self) -> Option<&PodSpec> {
        self.spec.as_ref()?.template.spec.as_ref()
    }

    /// Its status counts no Pod active or terminating (`ready` Pods are among the
    /// active; a `Complete` condition alone is not proof), and every Pod of it the API
    /// server still has has ended ([`stop::pod_processes_ended`]): the Job controller
    /// may not count the Pods of a Job being deleted.
    async fn processes_ended(&self, client: &kube::Client) -> Result<bool, kube::Error> {
        if !pods_gone(self) {
            return Ok(false);
        }
        Ok(job_pods(self, client)
            .await?
            .iter()
            .all(stop::pod_processes_ended))
    }

    /// Not suspended, and every Pod of it, none being deleted, reports every container
    /// exited 0 ([`stop::pod_ended_in_success`]) and they are at least its
    /// `completions`: the Job controller then creates no
    /// more (it counts them active until they are `Succeeded`, and needs none once
    /// that many have succeeded) and marks it `Complete`. Only for a Job whose Pods end
    /// when their containers exit, and counted completions (an `Indexed` Job would
    /// need each index's Pod: it waits for `Complete`).
    async fn ended_in_success(
        &self,
        client: &kube::Client,
        reports: stop::ExitReports,
    ) -> Result<bool, kube::Error> {
        let Some(spec) = self.spec.as_ref() else {
            return Ok(false);
        };
        let ends = spec
            .template
            .spec
            .as_ref()
            .is_some_and(stop::ends_when_its_containers_exit);
        // Suspended (by its owner), its Pods are deleted and not counted, even those
        // that exit 0: it is not done, and runs again when resumed.
        let suspended = spec.suspend == Some(true);
        if !ends || suspended || spec.completion_mode.as_deref() == Some("Indexed") {
            return Ok(false);
        }
        let completions = usize::try_from(spec.completions.unwrap_or(1).max(1)).unwrap_or(1);
        let pods = job_pods(self, client).await?;
        // A Pod being deleted may not be counted as it ended: leave it to `Complete`.
        let counted = |p: &Pod| p.metadata.deletion_timestamp.is_none();
        Ok(pods.len() >= completions
            && pods
                .iter()
                .all(|p| counted(p) && stop::pod_ended_in_success(p, reports)))
    }

    /// The Pods the Job controller labels with their Job's uid; each wakes its Job.
    fn pods_watch() -> Option<watcher::Config> {
        Some(watcher::Config::default().labels(CONTROLLER_UID_LABEL))
    }

    /// Deletes each of its Pods not already being deleted, with the Pod's own grace
    /// period, conditioned on its uid — untracked first, as the Job controller does
    /// when it deletes the Pods of a Job it suspends ([`untrack`]).
    async fn delete_pods(&self, client: &kube::Client) -> Result<(), kube::Error> {
        let pods = Api::<Pod>::namespaced(client.clone(), &self.namespace().unwrap_or_default());
        for pod in job_pods(self, client).await? {
            if pod.metadata.deletion_timestamp.is_some() || stop::pod_processes_ended(&pod) {
                // Already on its way out, or ended.
                continue;
            }
            if untrack(&pods, &pod).await? {
                kind::delete_this(&pods, &pod, None).await?;
            }
        }
        Ok(())
    }

    /// Kueue-managed (see [`super::kueue`]), or `spec.managedBy` another controller.
    async fn managed_elsewhere(
        &self,
        client: &kube::Client,
        config: &ControllerConfig,
    ) -> Result<Option<String>, kube::Error> {
        super::kueue::job_managed_elsewhere(self, client, config).await
    }

    fn priority(&self) -> Option<i32> {
        self.spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.priority)
    }

    async fn ready_to_start(
        &self,
        api: &Api<Job>,
        lost: bool,
        what: &str,
    ) -> Result<Readiness, kube::Error> {
        if lost && !pods_gone(self) {
            // The Job controller is still deleting the Pods of the run that lost the
            // lock; their end comes through the Job watch.
            return Ok(Readiness::Wait(format!(
                "holds {what}; waiting for the Pods of the previous run to go"
            )));
        }
        if self.status.as_ref().is_some_and(|s| s.start_time.is_some()) {
            clear_start_time(api, self).await?;
            return Ok(Readiness::Wrote);
        }
        Ok(Readiness::Ready)
    }

    fn start_patch(&self, ran: &RanWith, locks: &[WorkloadLock]) -> serde_json::Value {
        let mut template = ran.annotations();
        if let [only] = locks {
            template.insert(LOCK_ANNOTATION.into(), only.name.clone().into());
        }
        json!({
            "metadata": { "annotations": { LOST_FENCE_ANNOTATION: null } },
            "spec": {
                "suspend": false,
                "template": { "metadata": { "annotations": template } },
            },
        })
    }

    /// Suspends it and records the fence it ran with, so it waits for a new acquisition;
    /// `fail` also marks it stopped for good. The machine then deletes its Pods (they
    /// get SIGTERM and their grace period) and lets its locks go once they have ended.
    async fn stop(&self, api: &Api<Job>, stop: &Stopping<'_>) -> Result<Stopped<Job>, kube::Error> {
        let what = stop.what_happened();
        let (message, event_reason) = if stop.for_good {
            (
                format!(
                    "stopped for good (on-lock-lost: fail): {what}; suspended, the lock \
                     let go once its Pods have ended, never started again"
                ),
                "Stopped",
            )
        } else {
            (
                format!(
                    "suspended: {what}; it starts again once it holds the lock, with a new \
                     fence"
                ),
                "Suspended",
            )
        };
        let mut annotations = json!({
            STATUS_ANNOTATION: message,
            LOST_FENCE_ANNOTATION: stop.fences,
        });
        if stop.for_good {
            annotations[STOPPED_ANNOTATION] = json!(format!("{}: {}", stop.reason, stop.why));
        }
        let patch =
            json!({ "metadata": { "annotations": annotations }, "spec": { "suspend": true } });
        let patched = kind::patch_as_read(api, self, patch).await?;
        Ok(Stopped {
            object: Some(patched),
            event_reason,
            message,
            let_go_now: true,
        })
    }

    fn count_stopped(telemetry: &Telemetry, reason: &str) {
        telemetry.count_job_stopped(reason);
    }
}

/// `Complete` or `Failed`: the Job's pods are done. (`SuccessCriteriaMet` and
/// `FailureTarget` come first and do not count: since Kubernetes 1.31 the terminal
/// condition is added only after every pod has terminated, and a lock released
/// earlier could let the next holder overlap a pod still shutting down.)
pub fn finished(job: &Job) -> Option<&'static str> {
    let conditions = job.status.as_ref()?.conditions.as_ref()?;
    ["Complete", "Failed"].into_iter().find(|t| {
        conditions
            .iter()
            .any(|c| c.type_ == *t && c.status == conditions::TRUE)
    })
}

/// Started by lockwarden and not stopped since: its pod template carries the fence (or
/// fences) it was started with, and no loss has been recorded against it.
pub fn running(job: &Job) -> bool {
    (template_annotation(job, FENCE_ANNOTATION).is_some()
        || template_annotation(job, FENCES_ANNOTATION).is_some())
        && !job.annotations().contains_key(LOST_FENCE_ANNOTATION)
        && !job.annotations().contains_key(STOPPED_ANNOTATION)
}

/// An annotation of the Job's pod template (where the fence goes).
pub fn template_annotation<'a>(job: &'a Job, key: &str) -> Option<&'a String> {
    job.spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(key)
}

/// Whether the Job controller is done with the Pods of a suspended Job: none active or
/// terminating, so a restart cannot overlap them.
pub fn pods_gone(job: &Job) -> bool {
    let Some(status) = &job.status else {
        return true;
    };
    status.active.unwrap_or(0) == 0 && status.terminating.unwrap_or(0) == 0
}

/// The Job controller's finalizer on every Pod of a Job, kept until it has counted
/// the Pod as succeeded or failed.
pub const JOB_TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";

/// Takes the Job controller's tracking finalizer off `pod` before lockwarden deletes it,
/// as the Job controller does before deleting the Pods of a Job it suspends: it counts a
/// Pod deleted with the finalizer on, not yet succeeded, as *failed*, and with
/// `backoffLimit: 0` one stopped Pod would fail the Job for good (its lock then deleted,
/// never taken again) instead of leaving it suspended to run again. The patch is
/// conditioned on the Pod's resourceVersion, so a Pod that succeeded meanwhile keeps its
/// finalizer and is counted. Whether to go on and delete it: not when it changed or is
/// gone (the Job controller deletes the Pods of a suspended Job itself).
async fn untrack(pods: &Api<Pod>, pod: &Pod) -> Result<bool, kube::Error> {
    let finalizers = pod.finalizers();
    if !finalizers.iter().any(|f| f == JOB_TRACKING_FINALIZER) {
        return Ok(true);
    }
    let kept: Vec<&String> = finalizers
        .iter()
        .filter(|f| *f != JOB_TRACKING_FINALIZER)
        .collect();
    let patch = json!({ "metadata": {
        "resourceVersion": pod.resource_version(),
        "finalizers": kept,
    }});
    match pods
        .patch(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// The label the Job controller puts on each Pod of a Job: the Job's uid.
const CONTROLLER_UID_LABEL: &str = "batch.kubernetes.io/controller-uid";

/// The Pods of a Job, by the label the Job controller puts on them.
async fn job_pods(job: &Job, client: &kube::Client) -> Result<Vec<Pod>, kube::Error> {
    let (Some(ns), Some(uid)) = (job.namespace(), job.uid()) else {
        return Ok(Vec::new());
    };
    let selector = format!("{CONTROLLER_UID_LABEL}={uid}");
    Ok(Api::<Pod>::namespaced(client.clone(), &ns)
        .list(&ListParams::default().labels(&selector))
        .await?
        .items)
}

/// The name of a Job's own lock: the Job's name and the start of its uid, so a Job
/// recreated under the same name never finds its predecessor's lock.
pub fn per_job_lock_name(job: &Job) -> String {
    machine::workload(job).own_lock_name()
}

/// Clears `status.startTime` of a suspended Job that ran before, conditioned on the
/// resourceVersion read, as Kueue does: before Kubernetes 1.36 (feature gate
/// `MutableSchedulingDirectivesForSuspendedJobs`, with which the Job controller clears
/// it itself on suspension) the API server keeps the pod template of a Job with a
/// `startTime` immutable, and the restart must put the new fence there. The Job
/// controller sets it again when the Job resumes.
async fn clear_start_time(jobs: &Api<Job>, job: &Job) -> Result<(), kube::Error> {
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

#[cfg(test)]
mod tests;

//! Kueue (docs/design.md §6.6): lockwarden as a Kueue AdmissionCheck controller
//! ([`check`]: the checks' `Active` condition; [`workload`]: the Workload kind of the
//! gating machine, whose check is `Ready` once its locks are held), over the parts of
//! Kueue's API in [`types`]; and which Jobs Kueue admits, so that lockwarden's own Job
//! gating leaves them alone. Kueue holds a Job back with the same `spec.suspend`
//! lockwarden's gate uses; two controllers writing it would fight, one unsuspending
//! what the other suspended. A Kueue user gates such a Job on a lock through a
//! lockwarden AdmissionCheck on its ClusterQueue instead.
//!
//! A Job is Kueue-managed when any of these holds:
//! - it carries the `kueue.x-k8s.io/queue-name` label (or the annotation of that name,
//!   which older Kueue releases read);
//! - a Kueue Workload names it as its Job (Kueue labels the Workloads it makes for a
//!   Job with `kueue.x-k8s.io/job-uid`): how a Job Kueue took on without a queue name
//!   shows (`manageJobsWithoutQueueName`), once Kueue has made its Workload;
//! - the controller runs with `--kueue-manages-jobs-without-queue-name`, for a cluster
//!   whose Kueue manages every Job: then Kueue may not have made the Workload yet when
//!   lockwarden first sees the Job, and only the flag closes that gap;
//! - its `spec.managedBy` names a controller other than the Job controller (Kueue's
//!   MultiKueue sets `kueue.x-k8s.io/multikueue`; any other such controller owns the
//!   Job's status and suspension too).

pub mod check;
pub mod types;
pub mod workload;

pub use types::{AdmissionCheck, ClusterQueue, Workload};

use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::config::ControllerConfig;

/// Label (and, on older Kueue releases, annotation) naming a Job's LocalQueue.
pub const QUEUE_NAME_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// Label Kueue puts on the Workload it makes for a Job: the Job's uid.
pub const JOB_UID_LABEL: &str = "kueue.x-k8s.io/job-uid";
/// `spec.managedBy` of a Job the built-in Job controller runs (the default when unset).
pub const JOB_CONTROLLER: &str = "kubernetes.io/job-controller";

/// Why `job` is admitted by another controller than lockwarden's gate (see the module
/// doc), `None` when lockwarden's gate is its only one. Lists Workloads only when the
/// Job's own fields do not tell; a cluster without Kueue's CRDs answers 404 (none), and
/// an identity that may not list them 403 (none, with a warning in the log).
pub async fn job_managed_elsewhere(
    job: &Job,
    client: &kube::Client,
    config: &ControllerConfig,
) -> Result<Option<String>, kube::Error> {
    if let Some(why) = managed_elsewhere_by_its_fields(job, config) {
        return Ok(Some(why));
    }
    let (Some(ns), Some(uid)) = (job.namespace(), job.uid()) else {
        return Ok(None);
    };
    let workloads = Api::<Workload>::namespaced(client.clone(), &ns);
    let params = ListParams::default()
        .labels(&format!("{JOB_UID_LABEL}={uid}"))
        .limit(1);
    match workloads.list_metadata(&params).await {
        Ok(list) => Ok(list.items.first().map(|w| {
            format!(
                "Kueue admits it (its Workload {} names it with {JOB_UID_LABEL})",
                w.name_any()
            )
        })),
        // No Kueue in this cluster.
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        // RBAC written before this check (the chart grants it): Job gating keeps
        // working, and the queue-name label and the flag still tell Kueue's Jobs.
        Err(kube::Error::Api(e)) if e.code == 403 => {
            tracing::warn!(namespace = %ns, error = %e.message,
                "cannot list Kueue Workloads: a Job Kueue took on without a queue name is \
                 not recognised (grant list on workloads.kueue.x-k8s.io, or pass \
                 --kueue-manages-jobs-without-queue-name)");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// What the Job's own fields (and the controller's flag) say; see the module doc.
pub fn managed_elsewhere_by_its_fields(job: &Job, config: &ControllerConfig) -> Option<String> {
    let queue = job
        .labels()
        .get(QUEUE_NAME_LABEL)
        .or_else(|| job.annotations().get(QUEUE_NAME_LABEL));
    if let Some(queue) = queue {
        return Some(format!(
            "Kueue admits it (it names the LocalQueue {queue:?} with {QUEUE_NAME_LABEL})"
        ));
    }
    if let Some(manager) = job.spec.as_ref().and_then(|s| s.managed_by.as_deref())
        && manager != JOB_CONTROLLER
    {
        return Some(format!("its spec.managedBy is {manager:?}"));
    }
    if config.kueue_manages_jobs_without_queue_name {
        return Some(
            "Kueue admits every Job here (--kueue-manages-jobs-without-queue-name)".to_string(),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(value: serde_json::Value) -> Job {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_job_with_a_queue_name_label_or_annotation_is_kueue_managed() {
        let config = ControllerConfig::default();
        let labelled = job(json!({"metadata": {"labels": {QUEUE_NAME_LABEL: "lq"}}}));
        let why = managed_elsewhere_by_its_fields(&labelled, &config).unwrap();
        assert!(why.contains("Kueue") && why.contains("\"lq\""), "{why}");
        let annotated = job(json!({"metadata": {"annotations": {QUEUE_NAME_LABEL: "lq"}}}));
        assert!(managed_elsewhere_by_its_fields(&annotated, &config).is_some());
    }

    #[test]
    fn a_job_managed_by_another_controller_is_not_gated_and_the_job_controllers_is() {
        let config = ControllerConfig::default();
        let multikueue = job(json!({"spec": {"managedBy": "kueue.x-k8s.io/multikueue",
            "template": {}}}));
        let why = managed_elsewhere_by_its_fields(&multikueue, &config).unwrap();
        assert!(why.contains("kueue.x-k8s.io/multikueue"), "{why}");
        let builtin = job(json!({"spec": {"managedBy": JOB_CONTROLLER, "template": {}}}));
        assert_eq!(managed_elsewhere_by_its_fields(&builtin, &config), None);
        assert_eq!(
            managed_elsewhere_by_its_fields(&job(json!({})), &config),
            None
        );
    }

    #[test]
    fn the_flag_makes_every_job_kueue_managed() {
        let config = ControllerConfig {
            kueue_manages_jobs_without_queue_name: true,
            ..Default::default()
        };
        let why = managed_elsewhere_by_its_fields(&job(json!({})), &config).unwrap();
        assert!(
            why.contains("--kueue-manages-jobs-without-queue-name"),
            "{why}"
        );
    }
}

//! Jobs as the CronJob controller builds them, for the once-per-run tests (tests/once.rs
//! without a kubelet, tests/node on the real node; docs/design.md §6.7): a CronJob
//! whose Jobs are gated once per run, and the Job it creates for one scheduled time.

use std::time::SystemTime;

use k8s_openapi::api::batch::v1::{CronJob, Job};
use kube::ResourceExt;
use lockwarden::controller::gating::once::ONCE_ANNOTATION;
use lockwarden::controller::jobs::{SCHEDULED_TIMESTAMP_ANNOTATION, TEMPLATE_ANNOTATION};
use serde_json::{Value, json};

/// CronJob `name` on `schedule`, `Forbid`, whose Jobs (suspended, never retried) are
/// gated on lock template `template` once per run and run `pod_spec`; `suspend` stops
/// it from creating Jobs itself.
pub fn cronjob(
    name: &str,
    schedule: &str,
    suspend: bool,
    template: &str,
    pod_spec: Value,
) -> CronJob {
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "schedule": schedule,
            "concurrencyPolicy": "Forbid",
            "suspend": suspend,
            "jobTemplate": {
                "metadata": { "annotations": {
                    TEMPLATE_ANNOTATION: template,
                    ONCE_ANNOTATION: "true",
                }},
                "spec": {
                    "suspend": true,
                    "backoffLimit": 0,
                    "template": { "spec": pod_spec },
                },
            },
        },
    }))
    .expect("a CronJob")
}

/// The Job the CronJob controller creates from `cron` (created, so it has a uid) for
/// `scheduled`: named `<cronjob>-<minutes since the epoch>`, owned by it, with the
/// scheduled time.
pub fn scheduled_job(cron: &CronJob, scheduled: SystemTime) -> Job {
    let minutes = scheduled
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 60;
    let template = cron.spec.job_template.clone();
    let mut annotations = template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    annotations.insert(
        SCHEDULED_TIMESTAMP_ANNOTATION.into(),
        lockwarden::lock::rfc3339(scheduled),
    );
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("{}-{minutes}", cron.name_any()),
            "annotations": annotations,
            "ownerReferences": [{
                "apiVersion": "batch/v1", "kind": "CronJob", "name": cron.name_any(),
                "uid": cron.uid().expect("a created CronJob"),
                "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": template.spec,
    }))
    .expect("a Job")
}

//! The DistributedLock side of Job gating: claiming a named lock, creating a Job's own
//! lock from its template, and letting either go.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::EventType;
use serde_json::json;

use super::gate::{Gate, claim_of, finished, per_job_lock_name, running};
use super::{CLAIM_ANNOTATION, JobContext, JobError, LOCK_ANNOTATION};
use crate::api::{DistributedLock, LockPhase};

pub(super) enum Claim {
    Ours(Box<DistributedLock>),
    /// Not claimed for this Job (yet): the Event type and reason, and why.
    Waiting(EventType, &'static str, String),
}

/// Claims the named lock for `job`: at most one Job holds the claim, written on the
/// lock with its resourceVersion as the precondition so two Jobs cannot both win.
pub(super) async fn claim(
    locks: &Api<DistributedLock>,
    jobs: &Api<Job>,
    ctx: &JobContext,
    job: &Job,
    name: &str,
) -> Result<Claim, JobError> {
    let Some(lock) = locks.get_opt(name).await? else {
        return Ok(Claim::Waiting(
            EventType::Warning,
            "LockNotFound",
            format!("DistributedLock {name} does not exist in this namespace; create it"),
        ));
    };
    let ours = claim_of(job);
    match lock.annotations().get(CLAIM_ANNOTATION) {
        Some(c) if *c == ours => return Ok(Claim::Ours(Box::new(lock))),
        Some(other) => return claimed_by_other(locks, jobs, &lock, other).await,
        None => {}
    }
    // Defence in depth: a claim removed by hand must not let a second Job run next to
    // one that was started with this lock and has not finished.
    let ns = job.namespace();
    if let Some(running) = ctx.jobs.state().iter().find(|j| {
        j.namespace() == ns
            && j.uid() != job.uid()
            && j.annotations().get(LOCK_ANNOTATION).map(String::as_str) == Some(name)
            && running(j)
            && finished(j).is_none()
    }) {
        return Ok(Claim::Waiting(
            EventType::Warning,
            "LockInUse",
            format!(
                "waiting for lock {name}: Job {} runs with it (its claim was removed)",
                running.name_any()
            ),
        ));
    }
    let status = lock.status.clone().unwrap_or_default();
    if lock.spec.release
        && !(status.phase == Some(LockPhase::Released)
            && status.observed_generation == lock.metadata.generation)
    {
        // Let go by the previous Job and not finished releasing: claiming now could
        // hand this Job the previous Job's acquisition.
        return Ok(Claim::Waiting(
            EventType::Normal,
            "Waiting",
            format!("waiting for lock {name}: still releasing"),
        ));
    }
    let mut patch = json!({
        "metadata": {
            "resourceVersion": lock.resource_version(),
            "annotations": { CLAIM_ANNOTATION: ours },
        },
    });
    if lock.spec.release {
        patch["spec"] = json!({ "release": false });
    }
    let lock = locks
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(Claim::Ours(Box::new(lock)))
}

/// The lock is claimed by another Job: wait while that Job lives and has not finished;
/// otherwise (it is gone, or finished without letting go because its finalizer was
/// removed by hand) release and unclaim the lock, to be claimed on a later pass.
async fn claimed_by_other(
    locks: &Api<DistributedLock>,
    jobs: &Api<Job>,
    lock: &DistributedLock,
    other: &str,
) -> Result<Claim, JobError> {
    let name = lock.name_any();
    let (other_name, other_uid) = other.split_once('/').unwrap_or((other, ""));
    // Asked of the API server, not the cache: a Job missing from a cache that
    // is still filling must not lose its claim.
    let alive = jobs
        .get_opt(other_name)
        .await?
        .is_some_and(|j| j.uid().as_deref() == Some(other_uid) && finished(&j).is_none());
    if alive {
        return Ok(Claim::Waiting(
            EventType::Normal,
            "Waiting",
            format!("waiting for lock {name}: claimed by Job {other_name}"),
        ));
    }
    // The claimant is gone or finished without letting go (its finalizer was
    // removed by hand): release and unclaim, then claim on a later pass.
    release_and_unclaim(locks, lock).await?;
    Ok(Claim::Waiting(
        EventType::Normal,
        "Waiting",
        format!("waiting for lock {name}: released the stale claim of Job {other_name}"),
    ))
}

/// The Job's own lock, created from the template on first use; or why it cannot be.
pub(super) async fn own_lock(
    locks: &Api<DistributedLock>,
    ctx: &JobContext,
    job: &Job,
    template: &str,
    name: &str,
) -> Result<Claim, JobError> {
    let uid = job.uid().unwrap_or_default();
    if let Some(lock) = locks.get_opt(name).await? {
        let owned = lock
            .owner_references()
            .iter()
            .any(|o| o.uid == uid && o.controller == Some(true));
        return Ok(if !owned {
            Claim::Waiting(
                EventType::Warning,
                "LockNameTaken",
                format!("DistributedLock {name} exists and is not owned by this Job"),
            )
        } else if lock.metadata.deletion_timestamp.is_some() {
            // Let go after a loss: a new one is made once this one is gone.
            Claim::Waiting(
                EventType::Normal,
                "Waiting",
                format!("waiting for lock {name}: the previous acquisition is being released"),
            )
        } else {
            Claim::Ours(Box::new(lock))
        });
    }
    let Some(template_lock) = locks.get_opt(template).await? else {
        return Ok(Claim::Waiting(
            EventType::Warning,
            "TemplateNotFound",
            format!(
                "lock template {template} (a DistributedLock in this namespace) does not exist"
            ),
        ));
    };
    if !template_lock.spec.release {
        return Ok(Claim::Waiting(
            EventType::Warning,
            "TemplateNotReleased",
            format!(
                "lock template {template} has spec.release: false, so it would hold the key \
                 itself and every Job would wait for it forever; set release: true on a template"
            ),
        ));
    }
    let ns = job.namespace().unwrap_or_default();
    let mut spec = template_lock.spec.clone();
    spec.release = false;
    // A template's force would make every Job take the key over from the previous one.
    spec.force = false;
    spec.holder_identity = Some(format!(
        "{}/{ns}/job/{}/{uid}",
        ctx.config.cluster_name,
        job.name_any()
    ));
    let mut lock = DistributedLock::new(name, spec);
    lock.metadata.namespace = Some(ns);
    lock.metadata.annotations = Some([(CLAIM_ANNOTATION.to_string(), claim_of(job))].into());
    lock.metadata.labels =
        Some([("lockwarden.io/template".to_string(), template.to_string())].into());
    lock.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "batch/v1".into(),
        kind: "Job".into(),
        name: job.name_any(),
        uid,
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    let lock = locks.create(&PostParams::default(), &lock).await?;
    Ok(Claim::Ours(Box::new(lock)))
}

/// Lets the Job's lock go: deletes a per-Job lock, releases and unclaims a named one.
/// Returns what was done, `None` if there was nothing of this Job's to let go.
pub(super) async fn let_go(
    locks: &Api<DistributedLock>,
    job: &Job,
    gate: &Gate,
) -> Result<Option<String>, JobError> {
    let uid = job.uid().unwrap_or_default();
    match gate {
        Gate::Template(_) => {
            let name = per_job_lock_name(job);
            let Some(lock) = locks.get_opt(&name).await? else {
                return Ok(None);
            };
            if !lock.owner_references().iter().any(|o| o.uid == uid) {
                return Ok(None);
            }
            let fence = lock.status.as_ref().and_then(|s| s.fence);
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: lock.uid(),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match locks.delete(&name, &params).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => return Ok(None),
                Err(e) => return Err(e.into()),
            }
            Ok(Some(match fence {
                Some(f) => format!("deleted lock {name} (fence {f}), which releases it"),
                None => format!("deleted lock {name}"),
            }))
        }
        Gate::Named(name) => {
            let Some(lock) = locks.get_opt(name).await? else {
                return Ok(None);
            };
            // Ours, or unclaimed while this Job ran with it (the claim removed by hand):
            // either way the next Job must get an acquisition of its own.
            let ours = match lock.annotations().get(CLAIM_ANNOTATION) {
                Some(claim) => *claim == claim_of(job),
                None => running(job) && !lock.spec.release,
            };
            if !ours {
                return Ok(None);
            }
            let fence = lock.status.as_ref().and_then(|s| s.fence);
            release_and_unclaim(locks, &lock).await?;
            Ok(Some(match fence {
                Some(f) => format!("released lock {name} (fence {f})"),
                None => format!("released lock {name}"),
            }))
        }
    }
}

/// Lets a named lock go and drops its claim, in one write conditioned on the version
/// read (a lost race is retried by the next reconcile).
async fn release_and_unclaim(
    locks: &Api<DistributedLock>,
    lock: &DistributedLock,
) -> Result<(), kube::Error> {
    let patch = json!({
        "metadata": {
            "resourceVersion": lock.resource_version(),
            "annotations": { CLAIM_ANNOTATION: null },
        },
        "spec": { "release": true },
    });
    locks
        .patch(
            &lock.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(())
}

//! Job gating (DESIGN.md §6): a second controller, over `batch/v1` Jobs that carry
//! `lockwarden.io/lock: NAME` (claim the existing DistributedLock NAME) or
//! `lockwarden.io/lock-template: NAME` (a per-Job DistributedLock copied from NAME).
//!
//! It never talks to a backend: it only creates, claims, releases and deletes
//! `DistributedLock` objects and reads their status, which the lock controller
//! ([`super::reconcile`]) maintains. So it has no backend-kind branches at all.
//!
//! Reconcile, phase by phase:
//!
//! 1. deleted (our finalizer is set) → let the lock go, drop the finalizer;
//! 2. bad annotations → Warning Event, the Job stays as it is;
//! 3. finished (`Complete` or `Failed`) → let the lock go, drop the finalizer;
//! 4. started by us (the pod template carries `lockwarden.io/fence`) → nothing to do
//!    but report if the lock stops being held while the Job runs;
//! 5. not suspended → Warning Event: it cannot be gated;
//! 6. add the finalizer; claim the named lock or create the per-Job lock;
//! 7. the lock is `Acquired=True` for this Job at its current generation with a fence →
//!    one write sets the pod-template annotations (`lockwarden.io/fence`, `/holder`,
//!    `/lock`) *and* `spec.suspend=false`, conditioned on the Job's resourceVersion;
//!    otherwise the Job stays suspended and `lockwarden.io/status` (plus an Event when
//!    it changes) says why.
//!
//! "Let the lock go": a per-Job lock is deleted (its finalizer releases it in the
//! store); a named lock gets `spec.release: true` and loses its claim in one write, so
//! the next Job naming it re-acquires it (a new acquisition, a higher fence).
//!
//! Wake-ups: the Job watch, plus a watch on DistributedLocks mapped to the Jobs that
//! own, claim or name each lock, so a lock's status change reconciles its Jobs.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::{ControllerConfig, FINALIZER};
use crate::api::conditions::{self, ACQUIRED};
use crate::api::{DistributedLock, LockPhase};

/// Job annotation: the Job claims the DistributedLock of this name (same namespace).
pub const LOCK_ANNOTATION: &str = "lockwarden.io/lock";
/// Job annotation: the Job gets its own DistributedLock, spec copied from this one.
pub const TEMPLATE_ANNOTATION: &str = "lockwarden.io/lock-template";
/// Pod-template annotation: the fencing token the Job was started with.
pub const FENCE_ANNOTATION: &str = "lockwarden.io/fence";
/// Pod-template annotation: the holder identity written in the lock store.
pub const HOLDER_ANNOTATION: &str = "lockwarden.io/holder";
/// Job annotation: why the Job is (still) suspended, or what the controller did.
pub const STATUS_ANNOTATION: &str = "lockwarden.io/status";
/// DistributedLock annotation: `<job name>/<job uid>` of the Job that claims it.
pub const CLAIM_ANNOTATION: &str = "lockwarden.io/claimed-by";

/// How the status of a running Job whose lock is no longer held begins.
const NOT_HELD_PREFIX: &str = "running with fence";
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
    recorder: Recorder,
    /// The Controller's cache of Jobs.
    jobs: Store<Job>,
}

impl JobContext {
    pub fn new(client: kube::Client, config: ControllerConfig, jobs: Store<Job>) -> Self {
        let reporter = Reporter {
            controller: config.reporter.clone(),
            instance: std::env::var("POD_NAME").ok(),
        };
        JobContext {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            config,
            jobs,
        }
    }

    async fn event(&self, job: &Job, type_: EventType, reason: &str, note: String) {
        let ev = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: reason.to_string(),
            secondary: None,
        };
        // With the resourceVersion: see `report`.
        let mut regarding = job.object_ref(&());
        regarding.resource_version = job.resource_version();
        if let Err(e) = self.recorder.publish(&ev, &regarding).await {
            tracing::debug!(error = %e, "cannot publish event");
        }
    }
}

/// The lock a Job asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// `lockwarden.io/lock`: an existing DistributedLock, claimed while the Job runs.
    Named(String),
    /// `lockwarden.io/lock-template`: a DistributedLock of its own, copied from this.
    Template(String),
}

/// The Job's gate, `None` for a Job that names no lock, or why its annotations
/// cannot be acted on.
pub fn gate(job: &Job) -> Result<Option<Gate>, String> {
    let annotations = job.annotations();
    let (name, gate): (&String, fn(String) -> Gate) = match (
        annotations.get(LOCK_ANNOTATION),
        annotations.get(TEMPLATE_ANNOTATION),
    ) {
        (None, None) => return Ok(None),
        (Some(_), Some(_)) => {
            return Err(format!(
                "both {LOCK_ANNOTATION} and {TEMPLATE_ANNOTATION} are set; a Job names one lock"
            ));
        }
        (Some(n), None) => (n, Gate::Named),
        (None, Some(n)) => (n, Gate::Template),
    };
    let which = if annotations.contains_key(LOCK_ANNOTATION) {
        LOCK_ANNOTATION
    } else {
        TEMPLATE_ANNOTATION
    };
    if name.contains('/') {
        return Err(format!(
            "{which}: {name:?} names a lock in another namespace; a Job can only use a \
             DistributedLock in its own namespace (give the name alone)"
        ));
    }
    let valid = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !valid {
        return Err(format!(
            "{which}: {name:?} is not a DistributedLock name (lowercase letters, digits, '-', '.')"
        ));
    }
    Ok(Some(gate(name.clone())))
}

/// The name of a Job's own lock: the Job's name and the start of its uid, so a Job
/// recreated under the same name never finds its predecessor's lock.
pub fn per_job_lock_name(job: &Job) -> String {
    let uid = job.uid().unwrap_or_default();
    format!("{}-{}", job.name_any(), &uid[..uid.len().min(8)])
}

/// `<job name>/<job uid>`, written in [`CLAIM_ANNOTATION`].
fn claim_of(job: &Job) -> String {
    format!("{}/{}", job.name_any(), job.uid().unwrap_or_default())
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

fn started(job: &Job) -> bool {
    template_annotation(job, FENCE_ANNOTATION).is_some()
}

fn template_annotation<'a>(job: &'a Job, key: &str) -> Option<&'a String> {
    job.spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(key)
}

fn suspended(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false)
}

fn has_finalizer(job: &Job) -> bool {
    job.finalizers().iter().any(|f| f == FINALIZER)
}

/// Acquired for its current spec, with a fence: what a Job may be started with.
fn held(lock: &DistributedLock) -> Option<(i64, String)> {
    let status = lock.status.as_ref()?;
    let generation = lock.metadata.generation;
    let condition = conditions::find_condition(&status.conditions, ACQUIRED)?;
    (condition.status == conditions::TRUE
        && condition.observed_generation == generation
        && status.observed_generation == generation)
        .then_some(())?;
    Some((status.fence?, status.holder.clone()?))
}

/// Why a lock is not (yet) held, and whether that is a problem (Warning) rather than
/// ordinary waiting.
fn not_held_reason(lock: &DistributedLock) -> (String, bool) {
    let name = lock.name_any();
    let Some(status) = &lock.status else {
        return (format!("waiting for lock {name}: not acquired yet"), false);
    };
    let message = conditions::find_condition(&status.conditions, ACQUIRED)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    match status.phase {
        Some(LockPhase::Waiting) => {
            let holder = status.holder.as_deref().unwrap_or("another holder");
            let position = status
                .queue_position
                .map(|p| format!(", queue position {p}"))
                .unwrap_or_default();
            (
                format!("waiting for lock {name}: held by {holder}{position}"),
                false,
            )
        }
        Some(phase @ (LockPhase::Failed | LockPhase::Lost)) => (
            format!("lock {name} is {}: {message}", phase.as_str()),
            true,
        ),
        _ if message.is_empty() => (format!("waiting for lock {name}: not acquired yet"), false),
        _ => (format!("waiting for lock {name}: {message}"), false),
    }
}

pub fn error_policy(_job: Arc<Job>, err: &JobError, _ctx: Arc<JobContext>) -> Action {
    tracing::debug!(error = %err, "job reconcile failed; retrying");
    // Mostly a lost race on a resourceVersion precondition: retry soon.
    Action::requeue(Duration::from_secs(1))
}

/// Runs the Job controller until its watch stream ends (it does not on its own).
pub async fn run(client: kube::Client, config: ControllerConfig) {
    let (jobs, locks): (Api<Job>, Api<DistributedLock>) = match &config.namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let controller = Controller::new(jobs, watcher::Config::default());
    let store = controller.store();
    let ctx = Arc::new(JobContext::new(client, config, store.clone()));
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

/// The Jobs a lock change concerns: its owner (a per-Job lock), its claimant, and every
/// Job that names it, as its lock (waiting for the claim to go) or as its template
/// (waiting for it to exist).
pub fn jobs_of_lock(lock: &DistributedLock, jobs: &[Arc<Job>]) -> Vec<ObjectRef<Job>> {
    let ns = lock.namespace().unwrap_or_default();
    let name = lock.name_any();
    let mut refs: Vec<ObjectRef<Job>> = lock
        .owner_references()
        .iter()
        .filter(|o| o.kind == "Job" && o.api_version == "batch/v1")
        .map(|o| ObjectRef::new(&o.name).within(&ns))
        .collect();
    if let Some((job, _uid)) = lock
        .annotations()
        .get(CLAIM_ANNOTATION)
        .and_then(|c| c.split_once('/'))
    {
        refs.push(ObjectRef::new(job).within(&ns));
    }
    refs.extend(
        jobs.iter()
            .filter(|j| {
                let a = j.annotations();
                j.namespace().as_deref() == Some(ns.as_str())
                    && (a.get(LOCK_ANNOTATION) == Some(&name)
                        || a.get(TEMPLATE_ANNOTATION) == Some(&name))
            })
            .map(|j| ObjectRef::from_obj(&**j)),
    );
    refs.sort_by(|a, b| a.name.cmp(&b.name));
    refs.dedup();
    refs
}

pub async fn reconcile(job: Arc<Job>, ctx: Arc<JobContext>) -> Result<Action, JobError> {
    let ns = job.namespace().unwrap_or_else(|| "default".into());
    let jobs = Api::<Job>::namespaced(ctx.client.clone(), &ns);
    let locks = Api::<DistributedLock>::namespaced(ctx.client.clone(), &ns);

    let gate = gate(&job);

    // Phase: deleted.
    if job.metadata.deletion_timestamp.is_some() {
        if has_finalizer(&job) {
            if let Ok(Some(gate)) = &gate {
                let note = let_go(&locks, &job, gate).await?;
                if let Some(note) = note {
                    ctx.event(
                        &job,
                        EventType::Normal,
                        "Released",
                        format!("{note}: Job deleted"),
                    )
                    .await;
                }
            }
            remove_finalizer(&jobs, &job).await?;
        }
        return Ok(Action::await_change());
    }

    // Phase: bad input.
    let gate = match gate {
        Ok(Some(gate)) => gate,
        Ok(None) => {
            // The annotations were removed: nothing to gate any more.
            if has_finalizer(&job) {
                remove_finalizer(&jobs, &job).await?;
            }
            return Ok(Action::await_change());
        }
        Err(message) => {
            report(
                &jobs,
                &ctx,
                &job,
                EventType::Warning,
                "InvalidLockAnnotation",
                message,
            )
            .await?;
            return Ok(Action::await_change());
        }
    };
    let lock_name = match &gate {
        Gate::Named(name) => name.clone(),
        Gate::Template(_) => per_job_lock_name(&job),
    };

    // Phase: finished.
    if let Some(how) = finished(&job) {
        if has_finalizer(&job) {
            let note = let_go(&locks, &job, &gate).await?;
            let message = match note {
                Some(note) => format!("{note}: Job {}", how.to_lowercase()),
                None => format!(
                    "Job {}; lock {lock_name} was already let go",
                    how.to_lowercase()
                ),
            };
            // The finalizer goes first: its patch is conditioned on the resourceVersion
            // this reconcile read, which the status write would change.
            remove_finalizer(&jobs, &job).await?;
            let patched = set_status(&jobs, &job, &message).await?;
            ctx.event(
                patched.as_ref().unwrap_or(&job),
                EventType::Normal,
                "Released",
                message,
            )
            .await;
        }
        return Ok(Action::await_change());
    }

    // Phase: running (started by us).
    if started(&job) {
        let lock = locks.get_opt(&lock_name).await?;
        let fence = template_annotation(&job, FENCE_ANNOTATION).cloned();
        let still_held = lock
            .as_ref()
            .and_then(held)
            .is_some_and(|(f, _)| Some(f.to_string()) == fence);
        let warned = job
            .annotations()
            .get(STATUS_ANNOTATION)
            .is_some_and(|s| s.starts_with(NOT_HELD_PREFIX));
        if still_held && warned {
            // The lock came back (e.g. renewals recovered): say so instead of leaving
            // the warning in place.
            let message = format!(
                "holds lock {lock_name} again (fence {})",
                fence.unwrap_or_default()
            );
            report(&jobs, &ctx, &job, EventType::Normal, "LockHeld", message).await?;
        } else if !still_held {
            let why = lock
                .as_ref()
                .map(|l| not_held_reason(l).0)
                .unwrap_or_else(|| format!("lock {lock_name} was deleted"));
            report(
                &jobs,
                &ctx,
                &job,
                EventType::Warning,
                "LockNotHeld",
                format!(
                    "{NOT_HELD_PREFIX} {} but no longer holds the lock: {why}",
                    fence.unwrap_or_default()
                ),
            )
            .await?;
        }
        return Ok(Action::await_change());
    }

    // Phase: not suspended, so it cannot be gated.
    if !suspended(&job) {
        report(
            &jobs,
            &ctx,
            &job,
            EventType::Warning,
            "NotSuspended",
            format!(
                "the Job names lock {lock_name} but is not suspended, so it runs without \
                 waiting for the lock; create it with spec.suspend: true and lockwarden \
                 starts it once the lock is held"
            ),
        )
        .await?;
        return Ok(Action::await_change());
    }

    // Phase: claim the lock (or create the Job's own).
    if !has_finalizer(&job) {
        add_finalizer(&jobs, &job).await?;
        // The patched Job comes back through the watch.
        return Ok(Action::await_change());
    }
    let lock = match &gate {
        Gate::Named(name) => match claim(&locks, &jobs, &ctx, &job, name).await? {
            Claim::Ours(lock) => *lock,
            Claim::Waiting(type_, reason, message) => {
                report(&jobs, &ctx, &job, type_, reason, message).await?;
                return Ok(Action::requeue(WAITING_RESYNC));
            }
        },
        Gate::Template(template) => {
            match own_lock(&locks, &ctx, &job, template, &lock_name).await? {
                Ok(lock) => lock,
                Err((reason, message)) => {
                    report(&jobs, &ctx, &job, EventType::Warning, reason, message).await?;
                    return Ok(Action::requeue(WAITING_RESYNC));
                }
            }
        }
    };

    // Phase: start, or say why not.
    let Some((fence, holder)) = held(&lock) else {
        let (message, problem) = not_held_reason(&lock);
        let (type_, reason) = if problem {
            (EventType::Warning, "LockFailed")
        } else {
            (EventType::Normal, "Waiting")
        };
        report(&jobs, &ctx, &job, type_, reason, message).await?;
        return Ok(Action::requeue(WAITING_RESYNC));
    };
    let message = format!("started holding lock {lock_name} (fence {fence}, holder {holder})");
    let patch = json!({
        "metadata": {
            "resourceVersion": job.resource_version(),
            "annotations": { STATUS_ANNOTATION: message },
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
    jobs.patch(
        &job.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    tracing::info!(job = %job.name_any(), namespace = %ns, fence, "unsuspended gated Job");
    ctx.event(&job, EventType::Normal, "Started", message).await;
    Ok(Action::await_change())
}

enum Claim {
    Ours(Box<DistributedLock>),
    /// Not claimed for this Job (yet): the Event type and reason, and why.
    Waiting(EventType, &'static str, String),
}

/// Claims the named lock for `job`: at most one Job holds the claim, written on the
/// lock with its resourceVersion as the precondition so two Jobs cannot both win.
async fn claim(
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
        Some(other) => {
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
            let patch = json!({
                "metadata": {
                    "resourceVersion": lock.resource_version(),
                    "annotations": { CLAIM_ANNOTATION: null },
                },
                "spec": { "release": true },
            });
            locks
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            return Ok(Claim::Waiting(
                EventType::Normal,
                "Waiting",
                format!("waiting for lock {name}: released the stale claim of Job {other_name}"),
            ));
        }
        None => {}
    }
    // Defence in depth: a claim removed by hand must not let a second Job run next to
    // one that was started with this lock and has not finished.
    let ns = job.namespace();
    if let Some(running) = ctx.jobs.state().iter().find(|j| {
        j.namespace() == ns
            && j.uid() != job.uid()
            && j.annotations().get(LOCK_ANNOTATION).map(String::as_str) == Some(name)
            && started(j)
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

/// The Job's own lock, created from the template on first use; or why it cannot be.
async fn own_lock(
    locks: &Api<DistributedLock>,
    ctx: &JobContext,
    job: &Job,
    template: &str,
    name: &str,
) -> Result<Result<DistributedLock, (&'static str, String)>, JobError> {
    let uid = job.uid().unwrap_or_default();
    if let Some(lock) = locks.get_opt(name).await? {
        let owned = lock
            .owner_references()
            .iter()
            .any(|o| o.uid == uid && o.controller == Some(true));
        return Ok(if owned {
            Ok(lock)
        } else {
            Err((
                "LockNameTaken",
                format!("DistributedLock {name} exists and is not owned by this Job"),
            ))
        });
    }
    let Some(template_lock) = locks.get_opt(template).await? else {
        return Ok(Err((
            "TemplateNotFound",
            format!(
                "lock template {template} (a DistributedLock in this namespace) does not exist"
            ),
        )));
    };
    if !template_lock.spec.release {
        return Ok(Err((
            "TemplateNotReleased",
            format!(
                "lock template {template} has spec.release: false, so it would hold the key \
                 itself and every Job would wait for it forever; set release: true on a template"
            ),
        )));
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
    Ok(Ok(locks.create(&PostParams::default(), &lock).await?))
}

/// Lets the Job's lock go: deletes a per-Job lock, releases and unclaims a named one.
/// Returns what was done, `None` if there was nothing of this Job's to let go.
async fn let_go(
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
                None => started(job) && !lock.spec.release,
            };
            if !ours {
                return Ok(None);
            }
            let fence = lock.status.as_ref().and_then(|s| s.fence);
            let patch = json!({
                "metadata": {
                    "resourceVersion": lock.resource_version(),
                    "annotations": { CLAIM_ANNOTATION: null },
                },
                "spec": { "release": true },
            });
            locks
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            Ok(Some(match fence {
                Some(f) => format!("released lock {name} (fence {f})"),
                None => format!("released lock {name}"),
            }))
        }
    }
}

/// Writes `message` to the Job's status annotation and records an Event, both only when
/// the message changed (a waiting Job is reconciled on every change of its lock).
async fn report(
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
async fn set_status(jobs: &Api<Job>, job: &Job, message: &str) -> Result<Option<Job>, JobError> {
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
async fn add_finalizer(jobs: &Api<Job>, job: &Job) -> Result<(), JobError> {
    let mut finalizers = job.finalizers().to_vec();
    finalizers.push(FINALIZER.to_string());
    patch_finalizers(jobs, job, finalizers).await
}

/// Dropped as soon as the lock is let go, so a finished Job never needs the controller
/// to be deleted.
async fn remove_finalizer(jobs: &Api<Job>, job: &Job) -> Result<(), JobError> {
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

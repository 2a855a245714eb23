//! The DistributedLock side of gating, for any workload: claiming a named lock,
//! creating a workload's own lock from its template, and letting either go.

use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::EventType;
use serde_json::json;

use std::time::Duration;

use super::decide::Gate;
use super::machine::Ended;
use super::{CLAIM_ANNOTATION, Kinds, Workload};
use lockwarden_api::{DistributedLock, DistributedLockSpec, LockPhase};

pub enum Claim {
    Ours(Box<DistributedLock>),
    /// Not claimed for this workload (yet): the Event type and reason, and why.
    Waiting(EventType, &'static str, String),
    /// Never possible for this workload (it asks for more permits than the key has):
    /// why.
    Impossible(String),
}

/// The reason of a claim refused because another workload is still seen running with
/// the lock.
pub const LOCK_IN_USE: &str = "LockInUse";

/// Claims the named lock for `workload`: at most one workload holds the claim, written
/// on the lock with its resourceVersion as the precondition so two cannot both win.
/// `in_use_by` names another unfinished workload (e.g. "Job x") that was started with
/// this lock — the caller looks in its cache — as a defence against a claim removed by
/// hand.
pub async fn claim(
    locks: &Api<DistributedLock>,
    kinds: &Kinds,
    workload: &Workload,
    name: &str,
    in_use_by: Option<String>,
) -> Result<Claim, kube::Error> {
    let Some(lock) = locks.get_opt(name).await? else {
        return Ok(Claim::Waiting(
            EventType::Warning,
            "LockNotFound",
            format!("DistributedLock {name} does not exist in this namespace; create it"),
        ));
    };
    let ours = workload.claim();
    match lock.annotations().get(CLAIM_ANNOTATION) {
        Some(c) if *c == ours => return Ok(Claim::Ours(Box::new(lock))),
        Some(other) => return claimed_by_other(locks, kinds, &lock, other).await,
        None => {}
    }
    // Defence in depth: a claim removed by hand must not let a second workload run
    // next to one that was started with this lock and has not finished.
    if let Some(running) = in_use_by {
        return Ok(Claim::Waiting(
            EventType::Warning,
            LOCK_IN_USE,
            format!("waiting for lock {name}: {running} runs with it (its claim was removed)"),
        ));
    }
    let status = lock.status.clone().unwrap_or_default();
    if lock.spec.release
        && !(status.phase == Some(LockPhase::Released)
            && status.observed_generation == lock.metadata.generation)
    {
        // Let go by the previous workload and not finished releasing: claiming now
        // could hand this one the previous one's acquisition.
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

/// The lock is claimed by another workload: wait while that one lives and has not
/// finished; otherwise (it is gone, or finished without letting go because its
/// finalizer was removed by hand) release and unclaim the lock, to be claimed on a
/// later pass.
async fn claimed_by_other(
    locks: &Api<DistributedLock>,
    kinds: &Kinds,
    lock: &DistributedLock,
    other: &str,
) -> Result<Claim, kube::Error> {
    let name = lock.name_any();
    let ns = lock.namespace().unwrap_or_default();
    let Some(claimant) = kinds.claimant(other) else {
        // A kind this controller does not gate (a newer lockwarden's): never stale here.
        return Ok(Claim::Waiting(
            EventType::Normal,
            "Waiting",
            format!("waiting for lock {name}: claimed by {other}"),
        ));
    };
    let kind = claimant.kind.as_str();
    let other_name = &claimant.name;
    if kinds
        .alive(locks.clone().into_client(), &ns, &claimant)
        .await?
    {
        return Ok(Claim::Waiting(
            EventType::Normal,
            "Waiting",
            format!("waiting for lock {name}: claimed by {kind} {other_name}"),
        ));
    }
    release_and_unclaim(locks, lock).await?;
    Ok(Claim::Waiting(
        EventType::Normal,
        "Waiting",
        format!("waiting for lock {name}: released the stale claim of {kind} {other_name}"),
    ))
}

/// How the workload that lets a lock go ended.
#[derive(Clone, Copy, Debug)]
pub struct Done {
    /// It was started with the lock.
    pub ran: bool,
    /// It finished with success: a run key on its own lock is recorded as completed.
    pub succeeded: bool,
}

/// What a workload's own lock takes besides its template's spec.
#[derive(Clone, Debug)]
pub struct OwnLockTerms {
    /// The delay its Pods need (§6.3), for a template without `lockDelay`.
    pub needed_delay: Duration,
    /// Its queue priority, for a queued template (`None`: the template's).
    pub priority: Option<i32>,
    /// Its weight, for a queued template (`None`: the template's).
    pub weight: Option<u32>,
    /// Its run key, for once per run (§6.7): `spec.runKey` of its own lock.
    pub run_key: Option<String>,
}

/// The workload's own lock `name`, created from the template on first use; or why it
/// cannot be. Its holder identity is the workload's ([`Workload::holder`]) in `cluster`.
/// A template without `lockDelay` on a store that can carry one gets `needed_delay`,
/// the delay the workload's Pods need (docs/design.md §6.3); a queued template, the
/// workload's `priority` when it has one (§6.4).
pub async fn own_lock(
    locks: &Api<DistributedLock>,
    cluster: &str,
    workload: &Workload,
    template: &str,
    name: &str,
    terms: &OwnLockTerms,
) -> Result<Claim, kube::Error> {
    if let Some(lock) = locks.get_opt(name).await? {
        return Ok(existing_own_lock(lock, workload, name));
    }
    let template_lock = match usable_template(locks, workload, template).await? {
        Ok(template_lock) => template_lock,
        Err(not_usable) => return Ok(not_usable),
    };
    let spec = match own_spec(template_lock.spec, workload, cluster, template, terms) {
        Ok(spec) => spec,
        Err(refused) => return Ok(refused),
    };
    if let Err(e) = lockwarden_core::names::kubernetes_name(name) {
        let kind = workload.kind.as_str();
        return Ok(Claim::Waiting(
            EventType::Warning,
            "LockNameInvalid",
            format!(
                "the {kind}'s own lock from template {template} would be named {name:?}, \
                 which is not a valid DistributedLock name ({}); use shorter names",
                e.named("name")
            ),
        ));
    }
    let lock = own_lock_object(workload, template, name, spec);
    let lock = locks.create(&PostParams::default(), &lock).await?;
    Ok(Claim::Ours(Box::new(lock)))
}

/// The workload's own lock `name` exists already: ours, unless another object owns it
/// or it is being deleted.
fn existing_own_lock(lock: DistributedLock, workload: &Workload, name: &str) -> Claim {
    let owned = lock
        .owner_references()
        .iter()
        .any(|o| o.uid == workload.uid && o.controller == Some(true));
    if !owned {
        let kind = workload.kind.as_str();
        Claim::Waiting(
            EventType::Warning,
            "LockNameTaken",
            format!("DistributedLock {name} exists and is not owned by this {kind}"),
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
    }
}

/// The lock template `template` names, if it exists and is released (a template that
/// holds its key would keep every workload waiting); else why the workload waits.
async fn usable_template(
    locks: &Api<DistributedLock>,
    workload: &Workload,
    template: &str,
) -> Result<Result<DistributedLock, Claim>, kube::Error> {
    let gate = Gate::Template(template.to_string());
    let Some(template_lock) = super::lockset::lock_or_template(locks, &gate).await? else {
        let where_ = match super::decide::template_ref(template) {
            (Some(namespace), _) => format!("in namespace {namespace}"),
            (None, _) => "in this namespace".to_string(),
        };
        return Ok(Err(Claim::Waiting(
            EventType::Warning,
            "TemplateNotFound",
            format!("lock template {template} (a DistributedLock {where_}) does not exist"),
        )));
    };
    if !template_lock.spec.release {
        let kind = workload.kind.as_str();
        return Ok(Err(Claim::Waiting(
            EventType::Warning,
            "TemplateNotReleased",
            format!(
                "lock template {template} has spec.release: false, so it would hold the key \
                 itself and every {kind} would wait for it forever; set release: true on a template"
            ),
        )));
    }
    Ok(Ok(template_lock))
}

/// The spec of the workload's own lock: the template's, acquiring (not released, never
/// forced) as the workload, with the lock-delay, priority and weight the workload
/// needs; or why it cannot take the weight it asks for.
fn own_spec(
    mut spec: DistributedLockSpec,
    workload: &Workload,
    cluster: &str,
    template: &str,
    terms: &OwnLockTerms,
) -> Result<DistributedLockSpec, Claim> {
    let OwnLockTerms {
        needed_delay,
        priority,
        weight,
        ref run_key,
    } = *terms;
    let kind = workload.kind.as_str();
    spec.release = false;
    // Once per run (§6.7): the workload's run, never a template's (which would make
    // every workload of the template the same run), and not yet succeeded.
    if run_key.is_some() && (spec.queue || spec.permits != 1) {
        return Err(Claim::Impossible(format!(
            "it asks to run once per run key, and lock template {template} is queued or has \
             more than one permit: {}",
            lockwarden_api::A_RUN_HAS_ONE_HOLDER
        )));
    }
    spec.run_key = run_key.clone();
    spec.run_succeeded = false;
    // A template's force would make every workload take the key over from the previous.
    spec.force = false;
    spec.holder_identity = Some(workload.holder(cluster));
    if spec.lock_delay.is_none() && spec.backend.supports_lock_delay() && !needed_delay.is_zero() {
        spec.lock_delay = Some(format!("{}s", needed_delay.as_secs()));
    }
    // The workload's priority (its annotation or PriorityClass) in a queued template's
    // lock (docs/design.md §6.4); ZooKeeper takes none.
    if spec.queue && spec.backend.supports_priorities() {
        spec.priority = priority.or(spec.priority);
    }
    // The workload's weight (`lockwarden.io/weight`, a Kueue Workload's Pod count):
    // only a queued template's lock may take more than one permit (§6.4).
    if let Some(weight) = weight.filter(|w| Some(*w) != spec.weight) {
        if !spec.queue {
            return Err(Claim::Waiting(
                EventType::Warning,
                "WeightNeedsQueue",
                format!(
                    "the {kind} asks for {weight} permits of lock template {template}, which \
                     is not queued: set queue: true on the template to take weighted permits"
                ),
            ));
        }
        if weight > spec.permits {
            return Err(Claim::Impossible(format!(
                "it asks for {weight} permits of lock template {template}, which has {}: it \
                 could never hold its lock",
                spec.permits
            )));
        }
        spec.weight = Some(weight);
    }
    Ok(spec)
}

/// The workload's own lock as created: claimed by and owned by the workload, labelled
/// with the template it comes from.
fn own_lock_object(
    workload: &Workload,
    template: &str,
    name: &str,
    spec: DistributedLockSpec,
) -> DistributedLock {
    let mut lock = DistributedLock::new(name, spec);
    lock.metadata.namespace = Some(workload.namespace.clone());
    lock.metadata.annotations = Some([(CLAIM_ANNOTATION.to_string(), workload.claim())].into());
    // A label value has no `/`: the template's name (its namespace is in the holder's
    // AdmissionCheck parameters, for a template that lives elsewhere).
    let (_, template_name) = super::decide::template_ref(template);
    lock.metadata.labels = Some(
        [(
            "lockwarden.io/template".to_string(),
            template_name.to_string(),
        )]
        .into(),
    );
    lock.metadata.owner_references = Some(vec![workload.owner_reference()]);
    lock
}

/// Lets the workload's lock `name` go: deletes its own lock, releases and unclaims a
/// named one. Only with [`Ended`], the observation that the workload's processes have
/// ended (docs/design.md §6.3): a clean release lets the next holder start at once. `ran` says whether the workload was started with the lock (a named lock
/// it ran with is let go even when its claim was removed by hand). Returns what was
/// done, `None` if there was nothing of this workload's to let go.
pub async fn let_go(
    _ended: &Ended,
    locks: &Api<DistributedLock>,
    workload: &Workload,
    gate: &Gate,
    name: &str,
    done: Done,
) -> Result<Option<String>, kube::Error> {
    let Done { ran, succeeded } = done;
    match gate {
        Gate::Template(_) => {
            let Some(lock) = locks.get_opt(name).await? else {
                return Ok(None);
            };
            if !lock
                .owner_references()
                .iter()
                .any(|o| o.uid == workload.uid)
            {
                return Ok(None);
            }
            if succeeded && lock.spec.run_key.is_some() && !lock.spec.run_succeeded {
                // Once per run (§6.7): the release its deletion makes records the run,
                // as the lock's spec says from now on.
                tracing::debug!(lock = name, run = ?lock.spec.run_key, "the run succeeded: its release records it");
                let patch = json!({ "spec": { "runSucceeded": true } });
                locks
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
            let fence = lock.status.as_ref().and_then(|s| s.fence);
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: lock.uid(),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match locks.delete(name, &params).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => return Ok(None),
                Err(e) => return Err(e),
            }
            Ok(Some(match fence {
                Some(f) => format!("deleted lock {name} (fence {f}), which releases it"),
                None => format!("deleted lock {name}"),
            }))
        }
        Gate::Named(_) => {
            let Some(lock) = locks.get_opt(name).await? else {
                return Ok(None);
            };
            // Ours, or unclaimed while this workload ran with it (the claim removed by
            // hand): either way the next one must get an acquisition of its own.
            let ours = match lock.annotations().get(CLAIM_ANNOTATION) {
                Some(claim) => *claim == workload.claim(),
                None => ran && !lock.spec.release,
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

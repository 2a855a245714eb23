//! `kubectl lockwarden why job/NAME|pod/NAME`: which locks a gated workload waits for,
//! who holds each, its position, and what would unblock it — read the way the
//! controller reads them (the same annotations, lock names and claims), never written.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use serde::Serialize;

use super::view::{self, EventView, LockView};
use super::{Cluster, ObjectKind, Output, api_error, render};
use crate::cli::CliError;
use lockwarden_api::{DistributedLock, LockPhase};
use lockwarden_controller::gating::decide::{self, Gate};
use lockwarden_controller::gating::machine::{self, Phase};
use lockwarden_controller::gating::{CLAIM_ANNOTATION, GatedWorkload, STATUS_ANNOTATION, lockset};
use lockwarden_controller::pods::GATED_LABEL;

/// What `why` found; also the JSON / YAML document.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WhyView {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// `waiting`, `running`, `finished`, `stopped`, `deleting`, `misconfigured` or
    /// `not-gated`.
    pub state: String,
    /// One sentence: where it stands.
    pub summary: String,
    /// Each lock it names, in the order its annotations name them.
    pub locks: Vec<LockWait>,
    /// The controller's own words (`lockwarden.io/status`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller_status: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<EventView>,
}

/// One lock of the workload and where it stands for it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LockWait {
    /// The DistributedLock the workload holds or waits for (a template's copy for a
    /// template).
    pub lock: String,
    /// The annotation's word for it: `lock db`, `template db-template`.
    pub named_as: String,
    /// `held`, `waiting`, `claimed-by-another`, `not-claimed-yet`, `not-created-yet`,
    /// `not-found`, `failed`, `lost`, `pending`, `releasing`.
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Who holds the key (or, for a claim, the claim).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// 0 = next, when the store keeps a queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<i32>,
    pub position_note: String,
    /// What would unblock the workload on this lock.
    pub unblocks: String,
}

impl LockWait {
    fn new(lock: &str, named_as: String, state: &str, unblocks: String) -> LockWait {
        LockWait {
            lock: lock.to_string(),
            named_as,
            state: state.into(),
            key: None,
            phase: None,
            holder: None,
            fence: None,
            since: None,
            position: None,
            position_note: "not waiting in the store".into(),
            unblocks,
        }
    }
}

pub async fn why(
    cluster: &Cluster,
    kind: ObjectKind,
    name: &str,
    output: Option<Output>,
) -> Result<String, CliError> {
    let view =
        match kind {
            ObjectKind::Pod => {
                let pod: Pod = get(cluster, name).await?;
                let unseen = pod.labels().get(GATED_LABEL).map(String::as_str) != Some("true");
                explain(cluster, &pod, unseen.then(|| {
                format!(
                    "the Pod has no label {GATED_LABEL}=true, so the controller never sees it \
                     (it watches only labelled Pods): add the label and it takes the Pod's \
                     locks and lifts its scheduling gate"
                )
            }))
            .await?
            }
            ObjectKind::Job => {
                let job: Job = get(cluster, name).await?;
                explain(cluster, &job, None).await?
            }
            ObjectKind::Lock => unreachable!("why takes a Job or a Pod (parse_resource checks)"),
        };
    Ok(match output {
        Some(o) => render(&view, o),
        None => text(&view),
    })
}

async fn get<W: GatedWorkload>(cluster: &Cluster, name: &str) -> Result<W, CliError> {
    let kind = W::KIND.as_str();
    Api::<W>::namespaced(cluster.client.clone(), &cluster.namespace)
        .get_opt(name)
        .await
        .map_err(api_error(format!("cannot read {kind} {name}")))?
        .ok_or_else(|| {
            CliError::NotFound(format!(
                "{kind} {name} not found in namespace {}",
                cluster.namespace
            ))
        })
}

/// Where `w` stands and, lock by lock, why. `unseen`: why the controller does not see
/// it at all (a Pod without the label).
async fn explain<W: GatedWorkload>(
    cluster: &Cluster,
    w: &W,
    unseen: Option<String>,
) -> Result<WhyView, CliError> {
    let kind = W::KIND.as_str();
    let workload = machine::workload(w);
    let mut view = WhyView {
        kind: kind.into(),
        namespace: workload.namespace.clone(),
        name: workload.name.clone(),
        state: String::new(),
        summary: String::new(),
        locks: Vec::new(),
        controller_status: w.annotations().get(STATUS_ANNOTATION).cloned(),
        events: view::events(&cluster.client, &workload.namespace, &workload.uid).await?,
    };
    let set = match decide::locks(w.annotations(), W::KIND) {
        Err(e) => {
            view.state = "misconfigured".into();
            view.summary = format!("its lock annotations are not valid: {e}");
            return Ok(view);
        }
        Ok(None) => {
            (view.state, view.summary) = without_lock(w);
            return Ok(view);
        }
        Ok(Some(set)) => set,
    };
    let named = lockset::named(&set, &workload);
    let what = lockset::describe(&named);
    let phase = Phase::of(w);
    let locks = Api::<DistributedLock>::namespaced(cluster.client.clone(), &workload.namespace);
    let ours = workload.claim();
    for lock in &named {
        view.locks
            .push(lock_wait(cluster, &locks, lock, &ours, phase).await?);
    }
    let fences = lockset::fence_text(&w.fences(&named));
    (view.state, view.summary) = match (phase, unseen) {
        (_, Some(unseen)) => ("misconfigured".into(), unseen),
        (Phase::Deleted, _) => (
            "deleting".into(),
            format!("the {kind} is being deleted; its locks are let go once it has finished"),
        ),
        (Phase::Finished, _) => (
            "finished".into(),
            format!("the {kind} has finished; its locks were let go"),
        ),
        (Phase::StoppedForGood, _) => (
            "stopped".into(),
            format!(
                "lockwarden stopped the {kind} for good after it lost {what} (on-lock-lost: \
                 fail); it is never started again"
            ),
        ),
        (Phase::Running, _) => (
            "running".into(),
            format!(
                "the {kind} runs with {what} (fence {fences}): nothing blocks it, it holds \
                 what it waited for"
            ),
        ),
        (Phase::NotHeldBack, _) => ("misconfigured".into(), w.not_held_back(&what).1),
        (Phase::HeldBack, None) => ("waiting".into(), waiting_for(kind, &what, &view.locks)),
    };
    Ok(view)
}

/// The state and summary of a workload that names no lock: gated by mistake, or not
/// gated at all.
fn without_lock<W: GatedWorkload>(w: &W) -> (String, String) {
    match w.gate_without_lock() {
        Some(message) => ("misconfigured".into(), message),
        None => (
            "not-gated".into(),
            format!(
                "the {} names no lock: lockwarden does not gate it",
                W::KIND.as_str()
            ),
        ),
    }
}

/// The summary of a workload held back for its locks (`what`): the first lock it does
/// not hold yet, by whom that is held, and its position.
fn waiting_for(kind: &str, what: &str, locks: &[LockWait]) -> String {
    let blocking: Vec<&LockWait> = locks.iter().filter(|l| l.state != "held").collect();
    match blocking.first() {
        None => format!(
            "every lock is held for it ({what}); the controller starts the {kind} \
             next"
        ),
        Some(first) => {
            let holder = first
                .holder
                .as_ref()
                .map(|h| {
                    let fence = first
                        .fence
                        .map(|f| format!(" (fence {f})"))
                        .unwrap_or_default();
                    let by = if first.state == "claimed-by-another" {
                        "claimed"
                    } else {
                        "held"
                    };
                    format!(", {by} by {h}{fence}")
                })
                .unwrap_or_default();
            let position = match first.position {
                Some(p) => format!("position {p}"),
                None => "position not known".into(),
            };
            format!(
                "the {kind} waits for lock {}{holder}; {position}",
                first.lock
            )
        }
    }
}

/// Where one of the workload's locks stands for it.
async fn lock_wait(
    cluster: &Cluster,
    locks: &Api<DistributedLock>,
    lock: &lockset::WorkloadLock,
    ours: &str,
    phase: Phase,
) -> Result<LockWait, CliError> {
    let named_as = match &lock.gate {
        Gate::Named(n) => format!("lock {n}"),
        Gate::Template(t) => format!("template {t}"),
    };
    let Some(found) = read_lock(locks, &lock.name).await? else {
        return not_found(locks, lock, named_as).await;
    };
    let view = view::lock_view_with_peers(cluster, &found).await?;
    let mut wait = LockWait::new(&lock.name, named_as, "", String::new());
    wait.key = view.key.clone();
    wait.phase = view.phase.clone();
    // A named lock: the workload's only once its claim is on it.
    if let Gate::Named(_) = lock.gate {
        match found.annotations().get(CLAIM_ANNOTATION) {
            Some(claim) if claim != ours => {
                return Ok(claimed_by_another(claim, &view, wait));
            }
            None if phase == Phase::HeldBack => {
                wait.state = "not-claimed-yet".into();
                wait.unblocks = "the controller claiming it: it does so when the workload \
                                 reaches this lock (several locks are taken one at a time, \
                                 in key order)"
                    .into();
                return Ok(wait);
            }
            _ => {}
        }
    }
    explain_lock(&found, view, wait)
}

/// The DistributedLock `name`, if it exists.
async fn read_lock(
    locks: &Api<DistributedLock>,
    name: &str,
) -> Result<Option<DistributedLock>, CliError> {
    locks
        .get_opt(name)
        .await
        .map_err(api_error(format!("cannot read DistributedLock {name}")))
}

/// The workload's lock does not exist: what would create it.
async fn not_found(
    locks: &Api<DistributedLock>,
    lock: &lockset::WorkloadLock,
    named_as: String,
) -> Result<LockWait, CliError> {
    Ok(match &lock.gate {
        Gate::Named(n) => LockWait::new(
            n,
            named_as,
            "not-found",
            format!("creating DistributedLock {n} in this namespace: it does not exist"),
        ),
        Gate::Template(t) => {
            if read_lock(locks, t).await?.is_none() {
                LockWait::new(
                    &lock.name,
                    named_as,
                    "not-found",
                    format!(
                        "creating the lock template {t} (a DistributedLock) in this \
                         namespace: it does not exist"
                    ),
                )
            } else {
                LockWait::new(
                    &lock.name,
                    named_as,
                    "not-created-yet",
                    format!(
                        "the controller creating {} from template {t}: it does so when \
                         the workload reaches this lock (several locks are taken one at \
                         a time, in key order)",
                        lock.name
                    ),
                )
            }
        }
    })
}

/// A named lock another workload claims (`claim`): it is that workload's until it
/// finishes.
fn claimed_by_another(claim: &str, view: &LockView, mut wait: LockWait) -> LockWait {
    let by = view.used_by.clone().unwrap_or_else(|| claim.to_string());
    wait.state = "claimed-by-another".into();
    wait.holder = Some(by.clone());
    wait.fence = view.fence.filter(|_| view.phase.as_deref() == Some("Held"));
    wait.position_note = "not known: claims are not queued; once the lock is \
                          let go, the next workload the controller reconciles \
                          claims it"
        .into();
    // What the claimant itself waits for, if it does.
    let behind = match (view.phase.as_deref(), &view.holder) {
        (Some("Waiting"), Some(holder)) => {
            format!(" (it waits itself: the key is held by {holder})")
        }
        _ => String::new(),
    };
    wait.unblocks = format!(
        "{by} finishing{behind}: the controller then lets the lock go and removes \
         its claim"
    );
    wait
}

/// The lock is the workload's: where its acquisition stands.
fn explain_lock(
    lock: &DistributedLock,
    view: LockView,
    mut wait: LockWait,
) -> Result<LockWait, CliError> {
    let status = lock.status.clone().unwrap_or_default();
    if let Some((fence, holder)) = decide::held(lock) {
        wait.state = "held".into();
        wait.holder = Some(holder);
        wait.fence = Some(fence);
        wait.since = view.holder_since.clone();
        wait.unblocks = "nothing: it holds this lock".into();
        return Ok(wait);
    }
    wait.holder = view.holder.clone();
    wait.fence = view.fence;
    wait.since = view.holder_since.clone();
    wait.position = view.queue.position;
    wait.position_note = view.queue.note.clone();
    let (reason, _) = decide::not_held_reason(lock);
    match status.phase {
        Some(LockPhase::Waiting) => {
            wait.state = "waiting".into();
            wait.unblocks = unblocks_the_key(&view);
        }
        Some(LockPhase::Held) => {
            // Held, but not for this spec generation yet (the controller has not caught
            // up with an edit).
            wait.state = "pending".into();
            wait.unblocks = "the controller reporting on the lock's current spec".into();
        }
        Some(LockPhase::Failed) => {
            wait.state = "failed".into();
            wait.unblocks = format!(
                "fixing the lock ({reason}); a Failed lock is not tried again until its spec \
                 changes"
            );
        }
        Some(LockPhase::Lost) => {
            wait.state = "lost".into();
            wait.unblocks = format!("the controller acquiring it anew ({reason})");
        }
        Some(LockPhase::Releasing | LockPhase::Released) if lock.spec.release => {
            wait.state = "releasing".into();
            wait.unblocks = "the lock being let go (spec.release) and claimed anew".into();
        }
        _ => {
            wait.state = "pending".into();
            wait.unblocks = format!(
                "the controller trying it ({reason}); if nothing changes, check that the \
                 lockwarden controller runs and watches this namespace"
            );
        }
    }
    Ok(wait)
}

/// What unblocks a lock of the workload waiting for its key: its holder letting go,
/// then the queue or lockwarden itself.
fn unblocks_the_key(view: &LockView) -> String {
    let holder = view.holder.clone().unwrap_or_else(|| "its holder".into());
    // A holder in this cluster: name the lock and the workload behind it.
    let here = view
        .holders_here
        .iter()
        .map(|p| {
            let used = p
                .used_by
                .as_ref()
                .map(|u| format!(", used by {u}"))
                .unwrap_or_default();
            format!("DistributedLock {}{used}", p.lock)
        })
        .collect::<Vec<_>>();
    let who = if here.is_empty() {
        holder.clone()
    } else {
        format!("{holder} ({})", here.join("; "))
    };
    let others = view.waiting_here.len();
    let queue = if others > 0 && view.queue.position.is_none() {
        format!(
            "; {others} other lock{} of this cluster wait{} for the key too",
            if others == 1 { "" } else { "s" },
            if others == 1 { "s" } else { "" }
        )
    } else {
        String::new()
    };
    let then = match view.queue.position {
        Some(0) => "then it is next".to_string(),
        Some(p) => format!(
            "then the queue moves ({p} waiter{} ahead of it)",
            if p == 1 { "" } else { "s" }
        ),
        None => "lockwarden then takes the key by itself".into(),
    };
    format!(
        "{who} letting go of the key (its workload finishing, spec.release, or its \
         unlock), or its lease running out without renewal; {then}{queue}"
    )
}

fn text(v: &WhyView) -> String {
    let mut out = format!("{} {}/{}: {}\n", v.kind, v.namespace, v.name, v.state);
    out.push_str(&format!("{}\n", v.summary));
    for l in &v.locks {
        out.push_str(&format!("Lock {} ({}): {}\n", l.lock, l.named_as, l.state));
        let mut line = |label: &str, value: String| {
            out.push_str(&format!("  {label:<11}{value}\n"));
        };
        if let Some(key) = &l.key {
            line("Key:", key.clone());
        }
        if let Some(phase) = &l.phase {
            line("Phase:", phase.clone());
        }
        if let Some(holder) = &l.holder {
            let fence = l
                .fence
                .map_or(", fence not known".into(), |f| format!(", fence {f}"));
            let since = l
                .since
                .as_ref()
                .map(|t| format!(", since {t} ({})", view::ago(t)))
                .unwrap_or_default();
            line("Holder:", format!("{holder}{fence}{since}"));
        }
        let position = match l.position {
            Some(p) => format!("{p} ({})", l.position_note),
            None => l.position_note.clone(),
        };
        line("Position:", position);
        line("Unblocks:", l.unblocks.clone());
    }
    if let Some(status) = &v.controller_status {
        out.push_str(&format!("Controller: {status}\n"));
    }
    out.push_str(&view::events_text(&v.events));
    out
}

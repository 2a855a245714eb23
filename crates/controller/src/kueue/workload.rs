//! The Kueue Workload kind of the gating machine (docs/design.md §6.6): a Workload whose
//! ClusterQueue asks lockwarden's AdmissionCheck (`controllerName: lockwarden.io/lock`)
//! is held back by that check, and its locks come from the templates the check's
//! `LockAdmissionConfig` names. What is the Workload's own:
//!
//! - held back: its check is not `Ready`; lockwarden starts taking its locks once Kueue
//!   has reserved quota for it (checks run after that), and keeps its place in the
//!   locks' queues from then on, also while Kueue has given the quota back;
//! - started: one write records the fences on the Workload (`lockwarden.io/fence`, …),
//!   then one status write sets the check `Ready` with `podSetUpdates` putting them on
//!   every Pod set; Kueue admits it and unsuspends its Job only then, so no Pod of it
//!   runs without its fences;
//! - running: its check is `Ready` and the fences are recorded;
//! - stopped after a loss: the check says `Retry`; Kueue evicts it and suspends its Job;
//! - evicted for any reason (Kueue resets every check to `Pending` and drops its
//!   `podSetUpdates`): the recorded fences belong to a run that is over, so the machine
//!   lets that acquisition go once the Job's Pods have ended and takes a new one — a
//!   re-admission carries a higher fence, never the old one while old Pods may run;
//! - waiting: the check's message says for what (holder, queue position), `Pending`
//!   for at most the parameters' `pendingTimeout` while it holds quota, then `Retry`
//!   with `requeueAfterSeconds`: the quota goes back to the ClusterQueue and the
//!   Workload keeps its place in the locks' queues;
//! - rejected by lockwarden (a Pod set already carries `lockwarden.io/fence`, which
//!   Kueue's additive `podSetUpdates` could not set): stopped for good;
//! - finished: Kueue's `Finished` condition; its locks are let go once its Job's Pods
//!   have ended, asked of the API server ([`GatedWorkload::processes_ended`]).

use std::collections::BTreeMap;

use async_trait::async_trait;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use super::types::{AdmissionCheck, CONTROLLER_NAME, OurCheck, Workload, condition, state};
use crate::config::{FIELD_MANAGER, FINALIZER};
use crate::gating::kind::{self, patch_as_read};
use crate::gating::lockset::{self, RanWith, WorkloadLock};
use crate::gating::{
    FENCE_ANNOTATION, FENCES_ANNOTATION, GatedWorkload, HOLDER_ANNOTATION, Kind, NONCE_ANNOTATION,
    NONCES_ANNOTATION, ON_LOCK_LOST_ANNOTATION, OnLockLost, PRIORITY_ANNOTATION, Readiness,
    STATUS_ANNOTATION, Stopped, Stopping, TEMPLATE_ANNOTATION, TEMPLATES_ANNOTATION,
    URL_ANNOTATION, URLS_ANNOTATION, WEIGHT_ANNOTATION, stop,
};
use crate::telemetry::Telemetry;
use lockwarden_api::{LockAdmissionConfig, LockAdmissionConfigSpec};

/// Workloads claim a lock as `workload/<name>/<uid>`.
pub static WORKLOAD: Kind = Kind {
    name: "Workload",
    api_version: "kueue.x-k8s.io/v1beta2",
    claim_prefix: Some("workload"),
    // Our finalizer keeps the Workload until its locks are let go; blocking its
    // deletion would need `update` on workloads/finalizers.
    block_owner_deletion: false,
    templates_elsewhere: true,
    on_lock_lost: &[("retry", OnLockLost::Stop)],
};

/// Workload annotation, written by lockwarden when it starts one: the templates its
/// locks came from (`NAMESPACE/NAME,…`), so they can be let go even if the check's
/// parameters change or go away meanwhile.
pub const RECORDED_TEMPLATES_ANNOTATION: &str = "lockwarden.io/kueue-templates";

/// The Pod annotations lockwarden's `podSetUpdates` set (see `RanWith::annotations`).
const POD_ANNOTATIONS: [&str; 7] = [
    FENCE_ANNOTATION,
    FENCES_ANNOTATION,
    HOLDER_ANNOTATION,
    NONCE_ANNOTATION,
    NONCES_ANNOTATION,
    URL_ANNOTATION,
    URLS_ANNOTATION,
];

/// Why an AdmissionCheck of lockwarden's cannot use its `parameters`: the message of its
/// `Active=False` condition.
#[derive(Debug, thiserror::Error)]
pub enum UnusableParameters {
    #[error(
        "spec.parameters is not set: name a LockAdmissionConfig (apiGroup lockwarden.io, \
         kind LockAdmissionConfig)"
    )]
    NotSet,
    #[error(
        "spec.parameters names {api_group}/{kind} {name:?}: lockwarden's checks take a \
         LockAdmissionConfig (apiGroup lockwarden.io)"
    )]
    NotALockAdmissionConfig {
        api_group: String,
        kind: String,
        name: String,
    },
    #[error("LockAdmissionConfig {0:?} does not exist")]
    Missing(String),
    /// The LockAdmissionConfig refuses itself (no template, a template named twice, a
    /// bad duration): its own validation's error.
    #[error("{0}")]
    Invalid(#[source] lockwarden_api::AdmissionConfigError),
}

/// The `LockAdmissionConfig` an AdmissionCheck of lockwarden's names, or why it cannot
/// be used.
pub async fn parameters_of(
    client: &kube::Client,
    check: &AdmissionCheck,
) -> Result<Result<LockAdmissionConfigSpec, UnusableParameters>, kube::Error> {
    let Some(reference) = &check.spec.parameters else {
        return Ok(Err(UnusableParameters::NotSet));
    };
    if reference.api_group != "lockwarden.io" || reference.kind != "LockAdmissionConfig" {
        return Ok(Err(UnusableParameters::NotALockAdmissionConfig {
            api_group: reference.api_group.clone(),
            kind: reference.kind.clone(),
            name: reference.name.clone(),
        }));
    }
    let configs = Api::<LockAdmissionConfig>::all(client.clone());
    let Some(config) = configs.get_opt(&reference.name).await? else {
        return Ok(Err(UnusableParameters::Missing(reference.name.clone())));
    };
    Ok(config
        .spec
        .validate()
        .map(|()| config.spec)
        .map_err(UnusableParameters::Invalid))
}

/// Looks up which of `workload`'s checks is lockwarden's (an AdmissionCheck with our
/// `controllerName`): the first such one, by the order Kueue lists them.
async fn our_check(client: &kube::Client, workload: &Workload) -> Result<OurCheck, kube::Error> {
    let checks = Api::<AdmissionCheck>::all(client.clone());
    let names: Vec<String> = workload
        .status
        .iter()
        .flat_map(|s| s.admission_checks.iter().map(|c| c.name.clone()))
        .collect();
    for name in names {
        let Some(check) = checks.get_opt(&name).await? else {
            continue;
        };
        if check.spec.controller_name != CONTROLLER_NAME {
            continue;
        }
        return Ok(match parameters_of(client, &check).await? {
            Ok(spec) => OurCheck::Ours { name, spec },
            Err(_) => OurCheck::Unusable { name },
        });
    }
    Ok(OurCheck::None)
}

impl Workload {
    /// Its check's state as resolved by [`GatedWorkload::gate_annotations`] this
    /// reconcile.
    fn our(&self) -> OurCheck {
        self.check.get()
    }

    /// The name of its check that is lockwarden's.
    fn our_name(&self) -> Option<String> {
        self.our().name().map(str::to_string)
    }

    fn our_state(&self) -> Option<&super::types::AdmissionCheckState> {
        self.check_state(&self.our_name()?)
    }

    fn our_state_is(&self, wanted: &str) -> bool {
        self.our_state().is_some_and(|s| s.state == wanted)
    }

    /// The fences lockwarden recorded when it last started it.
    fn recorded(&self) -> bool {
        let a = self.annotations();
        a.contains_key(FENCE_ANNOTATION) || a.contains_key(FENCES_ANNOTATION)
    }

    fn annotations_for(&self, templates: &[String], weighted: bool) -> BTreeMap<String, String> {
        let mut gate = BTreeMap::new();
        match templates {
            [only] => gate.insert(TEMPLATE_ANNOTATION.to_string(), only.clone()),
            _ => gate.insert(TEMPLATES_ANNOTATION.to_string(), templates.join(",")),
        };
        gate.insert(ON_LOCK_LOST_ANNOTATION.to_string(), "retry".to_string());
        if let Some(p) = self.spec.priority {
            gate.insert(PRIORITY_ANNOTATION.to_string(), p.to_string());
        }
        if weighted {
            let pods: i64 = self.spec.pod_sets.iter().map(|s| i64::from(s.count)).sum();
            gate.insert(WEIGHT_ANNOTATION.to_string(), pods.max(1).to_string());
        }
        gate
    }

    /// The Job it admits (Kueue's batch/job integration), by its owner reference.
    fn job_owner(&self) -> Option<(String, String)> {
        self.owner_references()
            .iter()
            .find(|o| o.kind == "Job" && o.api_version == "batch/v1")
            .map(|o| (o.name.clone(), o.uid.clone()))
    }

    /// One server-side apply of lockwarden's check entry, conditioned on the
    /// resourceVersion this reconcile read: a Workload changed meanwhile is looked at
    /// again first.
    async fn apply_check(
        &self,
        api: &Api<Workload>,
        entry: serde_json::Value,
    ) -> Result<Workload, kube::Error> {
        let patch = json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {
                "name": self.name_any(),
                "namespace": self.namespace(),
                "resourceVersion": self.resource_version(),
            },
            "status": { "admissionChecks": [entry] },
        });
        api.patch_status(
            &self.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
    }

    /// The check's entry in `state` with `message`; its transition time kept while the
    /// state stays.
    fn entry(&self, name: &str, new_state: &str, message: &str) -> serde_json::Value {
        let since = match self.check_state(name) {
            Some(s) if s.state == new_state => s.last_transition_time.clone(),
            _ => None,
        }
        .unwrap_or_else(|| Time(k8s_openapi::jiff::Timestamp::now()));
        json!({
            "name": name,
            "state": new_state,
            // Kueue keeps messages to 32 KiB.
            "message": truncate(message, 32 * 1024),
            "lastTransitionTime": since,
        })
    }

    /// How long it has waited for its locks while holding quota: since the later of
    /// its quota reservation and the check's last transition.
    fn waited_with_quota(&self) -> Option<std::time::Duration> {
        if !self.condition_true(condition::QUOTA_RESERVED) {
            return None;
        }
        let reserved = self
            .condition(condition::QUOTA_RESERVED)?
            .last_transition_time
            .0;
        let pending = self
            .our_state()?
            .last_transition_time
            .as_ref()
            .map(|t| t.0)
            .unwrap_or(reserved);
        let since = reserved.max(pending);
        let waited = k8s_openapi::jiff::Timestamp::now().duration_since(since);
        std::time::Duration::try_from(waited).ok()
    }

    /// An annotation a Pod set's template already has that the fences would set too:
    /// Kueue's `podSetUpdates` only add, so admission would fail.
    fn fence_clash(&self) -> Option<String> {
        self.spec.pod_sets.iter().find_map(|set| {
            let own = set.template.metadata.as_ref()?.annotations.as_ref()?;
            let key = POD_ANNOTATIONS.iter().find(|k| own.contains_key(**k))?;
            Some(format!(
                "Pod set {:?} already sets {key}, which lockwarden sets to the fence: Kueue's \
                 podSetUpdates can only add, so it could never be admitted; remove the \
                 annotation from the Job's pod template",
                set.name
            ))
        })
    }
}

fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[async_trait]
impl GatedWorkload for Workload {
    const KIND: &'static Kind = &WORKLOAD;

    fn enabled(config: &crate::config::ControllerConfig) -> bool {
        config.kueue_admission_check
    }

    /// Its check's templates once Kueue has reserved quota for it (or lockwarden began
    /// taking its locks), as annotations; the recorded templates when the check's
    /// parameters are gone or unusable but it still has locks of ours.
    async fn gate_annotations(
        &self,
        client: &kube::Client,
    ) -> Result<BTreeMap<String, String>, kube::Error> {
        self.check.set(our_check(client, self).await?);
        let started = self.finalizers().iter().any(|f| f == FINALIZER);
        let recorded = self.annotations().get(RECORDED_TEMPLATES_ANNOTATION);
        match self.our() {
            OurCheck::Ours { spec, .. }
                if started || self.condition_true(condition::QUOTA_RESERVED) =>
            {
                let templates: Vec<String> = spec.templates.iter().map(|t| t.reference()).collect();
                Ok(self.annotations_for(&templates, spec.weight_from_pod_count))
            }
            _ if started => match recorded {
                Some(list) => {
                    let templates: Vec<String> = list.split(',').map(str::to_string).collect();
                    Ok(self.annotations_for(&templates, false))
                }
                None => Ok(BTreeMap::new()),
            },
            _ => Ok(BTreeMap::new()),
        }
    }

    fn finished(&self) -> Option<&str> {
        self.condition_true(condition::FINISHED)
            .then_some("Finished")
    }

    fn running(&self) -> bool {
        self.our_state_is(state::READY) && self.recorded()
    }

    fn held_back(&self) -> bool {
        self.our_state()
            .is_some_and(|s| s.state == state::PENDING || s.state == state::RETRY)
    }

    fn stopped_for_good(&self) -> bool {
        self.our_state_is(state::REJECTED)
    }

    fn fences(&self, locks: &[WorkloadLock]) -> Vec<(String, Option<i64>)> {
        lockset::fences_of(self.annotations(), locks)
    }

    /// The recorded fences while its check is not `Ready`: Kueue evicted it (or the
    /// check's `Ready` was never written), so the run they were for is over.
    fn lost_fences(&self, locks: &[WorkloadLock]) -> BTreeMap<String, i64> {
        if self.our_state_is(state::READY) {
            return BTreeMap::new();
        }
        lockset::fences_of(self.annotations(), locks)
            .into_iter()
            .filter_map(|(name, fence)| Some((name, fence?)))
            .collect()
    }

    fn not_held_back(&self, what: &str) -> (&'static str, String) {
        (
            "ReadyWithoutLock",
            format!(
                "its lockwarden admission check is Ready, but lockwarden did not set it: it \
                 was admitted without {what}"
            ),
        )
    }

    fn pod_spec(&self) -> Option<&PodSpec> {
        self.spec.pod_sets.first()?.template.spec.as_ref()
    }

    /// Asked of the API server, not the cache: the Workload is not admitted and its
    /// check not `Ready` (else Kueue may be starting its Pods), its Job is suspended,
    /// finished or gone, and every Pod of that Job has ended. A Workload of another
    /// integration than batch/job is never taken to have ended before it finished.
    async fn processes_ended(&self, client: &kube::Client) -> Result<bool, kube::Error> {
        let ns = self.namespace().unwrap_or_default();
        let fresh = match Api::<Workload>::namespaced(client.clone(), &ns)
            .get_opt(&self.name_any())
            .await?
        {
            Some(w) if w.uid() == self.uid() => Some(w),
            _ => None,
        };
        let finished = fresh.as_ref().is_none_or(|w| w.finished().is_some());
        if let Some(w) = &fresh {
            let ready = self
                .our()
                .name()
                .and_then(|n| w.check_state(n))
                .is_some_and(|s| s.state == state::READY);
            if !finished && (ready || w.condition_true(condition::ADMITTED)) {
                return Ok(false);
            }
        }
        let Some((job_name, job_uid)) = self.job_owner() else {
            return Ok(finished);
        };
        let jobs = Api::<Job>::namespaced(client.clone(), &ns);
        if let Some(job) = jobs.get_opt(&job_name).await?
            && job.uid().as_deref() == Some(job_uid.as_str())
        {
            let suspended = job.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false);
            if !suspended && crate::jobs::finished(&job).is_none() {
                return Ok(false);
            }
            if !crate::jobs::pods_gone(&job) {
                return Ok(false);
            }
        }
        let pods = Api::<Pod>::namespaced(client.clone(), &ns)
            .list(
                &ListParams::default()
                    .labels(&format!("batch.kubernetes.io/controller-uid={job_uid}")),
            )
            .await?;
        Ok(pods.items.iter().all(stop::pod_processes_ended))
    }

    fn priority(&self) -> Option<i32> {
        self.spec.priority
    }

    /// A Pod set that already sets one of the annotations the fences go in is refused
    /// with `Rejected` (Kueue then deactivates the Workload): `podSetUpdates` only add,
    /// so it could never be admitted.
    async fn ready_to_start(
        &self,
        api: &Api<Workload>,
        _lost: bool,
        _what: &str,
    ) -> Result<Readiness, kube::Error> {
        let (Some(name), Some(clash)) = (self.our_name(), self.fence_clash()) else {
            return Ok(Readiness::Ready);
        };
        let entry = self.entry(&name, state::REJECTED, &clash);
        self.apply_check(api, entry).await?;
        Ok(Readiness::Wrote)
    }

    fn start_patch(&self, ran: &RanWith, locks: &[WorkloadLock]) -> serde_json::Value {
        let templates: Vec<&str> = locks
            .iter()
            .filter_map(|l| match &l.gate {
                crate::gating::decide::Gate::Template(t) => Some(t.as_str()),
                crate::gating::decide::Gate::Named(_) => None,
            })
            .collect();
        let mut annotations = ran.annotations();
        // A single lock's fence replaces a previous run's list, and the other way round.
        for key in [FENCE_ANNOTATION, FENCES_ANNOTATION] {
            annotations.entry(key).or_insert(serde_json::Value::Null);
        }
        annotations.insert(
            RECORDED_TEMPLATES_ANNOTATION.into(),
            templates.join(",").into(),
        );
        json!({ "metadata": { "annotations": annotations } })
    }

    /// Records the fences on the Workload, then sets the check `Ready` with
    /// `podSetUpdates` carrying them to every Pod set, each write conditioned on what
    /// was read before it. A Pod set that already sets one of those annotations is
    /// refused with `Rejected` instead.
    async fn start(
        &self,
        api: &Api<Workload>,
        ran: &RanWith,
        locks: &[WorkloadLock],
        message: &str,
    ) -> Result<Workload, kube::Error> {
        let Some(name) = self.our_name() else {
            return Ok(self.clone());
        };
        let pod_annotations = ran.annotations();
        let mut patch = self.start_patch(ran, locks);
        kind::merge(
            &mut patch,
            json!({ "metadata": { "annotations": { STATUS_ANNOTATION: message } } }),
        );
        let recorded = patch_as_read(api, self, patch).await?;
        let updates: Vec<serde_json::Value> = self
            .spec
            .pod_sets
            .iter()
            .map(|set| json!({ "name": set.name, "annotations": pod_annotations }))
            .collect();
        let mut entry = self.entry(&name, state::READY, message);
        entry["podSetUpdates"] = json!(updates);
        let mut recorded = recorded;
        recorded.check = self.check.clone();
        recorded.apply_check(api, entry).await
    }

    /// Sets the check `Rejected` (Kueue deactivates the Workload until a person
    /// reactivates it): only for what this Workload can never pass.
    async fn refuse(&self, api: &Api<Workload>, why: &str) -> Result<(), kube::Error> {
        if let Some(name) = self.our_name() {
            let entry = self.entry(&name, state::REJECTED, why);
            self.apply_check(api, entry).await?;
        }
        Ok(())
    }

    /// Sets the check `Retry`: Kueue evicts the Workload and suspends its Job; its
    /// locks are let go once the Job's Pods have ended, and it is admitted again only
    /// with a new acquisition.
    async fn stop(
        &self,
        api: &Api<Workload>,
        stop: &Stopping<'_>,
    ) -> Result<Stopped<Workload>, kube::Error> {
        let message = format!(
            "sent back: {}; Kueue evicts it and admits it again once it holds its locks \
             anew, with a new fence",
            stop.what_happened()
        );
        let object = match self.our_name() {
            Some(name) => {
                let entry = self.entry(&name, state::RETRY, &message);
                Some(self.apply_check(api, entry).await?)
            }
            None => None,
        };
        Ok(Stopped {
            object,
            event_reason: "Retry",
            message,
            let_go_now: true,
        })
    }

    /// `Pending` with why it waits; after the parameters' `pendingTimeout` with quota
    /// reserved, `Retry` with their `retryAfter`, so the quota goes back to the
    /// ClusterQueue while the Workload keeps its place in the locks' queues.
    async fn show_waiting(
        &self,
        api: &Api<Workload>,
        message: &str,
        _warning: bool,
    ) -> Result<(), kube::Error> {
        let OurCheck::Ours { name, spec } = self.our() else {
            return Ok(());
        };
        let Some(current) = self.our_state() else {
            return Ok(());
        };
        if current.state != state::PENDING {
            // `Retry` stands until Kueue resets it to `Pending` on requeue.
            return Ok(());
        }
        let timeout = spec
            .pending_timeout()
            .unwrap_or(std::time::Duration::from_secs(300));
        let entry = match self.waited_with_quota() {
            Some(waited) if waited > timeout => {
                let retry = spec
                    .retry_after()
                    .unwrap_or(std::time::Duration::from_secs(60));
                let text = format!(
                    "{message}; waited {}s with quota reserved (pendingTimeout {}s): the \
                     quota goes back to the ClusterQueue and Kueue requeues it after {}s, \
                     keeping its place in the lock's queue",
                    waited.as_secs(),
                    timeout.as_secs(),
                    retry.as_secs()
                );
                let mut entry = self.entry(&name, state::RETRY, &text);
                entry["requeueAfterSeconds"] =
                    json!(i32::try_from(retry.as_secs()).unwrap_or(i32::MAX));
                entry
            }
            _ if current.message == message => return Ok(()),
            _ => self.entry(&name, state::PENDING, message),
        };
        self.apply_check(api, entry).await?;
        Ok(())
    }

    /// A Workload's stop is its Job's: counted as one.
    fn count_stopped(telemetry: &Telemetry, reason: &str) {
        telemetry.count_job_stopped(reason);
    }
}

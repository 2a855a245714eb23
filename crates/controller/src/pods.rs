//! Pod gating (docs/design.md §6.1 "Any Pod"): Pods created with the scheduling gate
//! `lockwarden.io/lock`, the label `lockwarden.io/gated: "true"` and an annotation
//! naming their lock, driven by the gating machine ([`super::gating::machine`]). What
//! is the Pod's own:
//!
//! - only Pods with that label are watched (a server-side label selector), so the
//!   controller never caches the other Pods of the cluster; a Pod gated without the
//!   label is never seen here (the chart's admission rules refuse it at creation:
//!   `super::admission`) and would stay gated;
//! - held back means our scheduling gate; ONE patch, conditioned on the Pod's
//!   resourceVersion, adds `lockwarden.io/fence` and `lockwarden.io/holder` and removes
//!   the gate (other gates stay), so no version of the Pod is schedulable without its
//!   fence;
//! - finished means `Succeeded` or `Failed`; a deleted Pod bound to a node lets its
//!   locks go only once the kubelet reports one of them (its containers get their grace
//!   period);
//! - stopping after a loss deletes it with its grace period (`on-lock-lost: delete`,
//!   the default; its owner, if any, makes a new, gated Pod); `ignore` only warns.

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, PodSchedulingGate, PodSpec};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::watcher;
use serde_json::json;

use super::gating::lockset::{self, RanWith, WorkloadLock};
use super::gating::stop;
use super::gating::{
    FENCE_ANNOTATION, FENCES_ANNOTATION, GatedWorkload, Kind, LOCK_ANNOTATION, OnLockLost, Stopped,
    Stopping, TEMPLATE_ANNOTATION,
};
use crate::telemetry::Telemetry;

pub use super::gating::ON_LOCK_LOST_ANNOTATION;

/// The scheduling gate lockwarden removes once the Pod's lock is held.
pub const SCHEDULING_GATE: &str = "lockwarden.io/lock";
/// The label that makes a Pod visible to lockwarden (the watch's label selector).
pub const GATED_LABEL: &str = "lockwarden.io/gated";
/// The server-side label selector of the Pod watch.
pub const GATED_SELECTOR: &str = "lockwarden.io/gated=true";

/// Pods claim a lock as `pod/<pod>/<uid>`. No `blockOwnerDeletion`: a Pod's own
/// finalizer already keeps it until its lock is let go.
pub static POD: Kind = Kind {
    name: "Pod",
    api_version: "v1",
    claim_prefix: Some("pod"),
    block_owner_deletion: false,
    templates_elsewhere: false,
    on_lock_lost: &[("delete", OnLockLost::Stop), ("ignore", OnLockLost::Ignore)],
};

#[async_trait]
impl GatedWorkload for Pod {
    const KIND: &'static Kind = &POD;

    /// Server-side selector: the API server sends only labelled Pods, so neither the
    /// cache nor the watch ever holds the cluster's other Pods.
    fn watch_config() -> watcher::Config {
        watcher::Config::default().labels(GATED_SELECTOR)
    }

    fn finished(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .filter(|phase| matches!(*phase, "Succeeded" | "Failed"))
    }

    /// Deleted, conditioned on its uid: a gated Pod never ran a container, so nothing
    /// of it runs (docs/design.md §6.7).
    async fn end_unrun(&self, api: &Api<Pod>) -> Result<bool, kube::Error> {
        super::gating::kind::delete_this(api, self, None).await?;
        Ok(true)
    }

    fn running(&self) -> bool {
        running(self)
    }

    fn held_back(&self) -> bool {
        has_gate(self)
    }

    fn fences(&self, locks: &[WorkloadLock]) -> Vec<(String, Option<i64>)> {
        lockset::fences_of(self.annotations(), locks)
    }

    /// Every container of it reported exited 0 while its phase is not yet `Succeeded`
    /// (the kubelet reports that a relist later).
    async fn ended_in_success(
        &self,
        _client: &kube::Client,
        reports: stop::ExitReports,
    ) -> Result<bool, kube::Error> {
        Ok(stop::pod_ended_in_success(self, reports))
    }

    /// Terminal, or never bound to a node (it ran nothing): the kubelet (since
    /// Kubernetes 1.27) reports a terminal phase of a deleted Pod once its containers
    /// have stopped, so until then they may run their grace period.
    async fn processes_ended(&self, _client: &kube::Client) -> Result<bool, kube::Error> {
        Ok(processes_ended(self))
    }

    fn gate_without_lock(&self) -> Option<String> {
        has_gate(self).then(|| {
            format!(
                "the Pod has the scheduling gate {SCHEDULING_GATE} but names no lock: annotate \
                 it with {LOCK_ANNOTATION} (an existing DistributedLock) or {TEMPLATE_ANNOTATION} \
                 (a template); until then it stays gated"
            )
        })
    }

    fn not_held_back(&self, what: &str) -> (&'static str, String) {
        (
            "NotGated",
            format!(
                "the Pod names {what} but has no scheduling gate {SCHEDULING_GATE}, so \
                 it was scheduled without waiting for the lock; create it with \
                 spec.schedulingGates: [{{name: {SCHEDULING_GATE}}}] and lockwarden removes the \
                 gate once the lock is held"
            ),
        )
    }

    fn pod_spec(&self) -> Option<&PodSpec> {
        self.spec.as_ref()
    }

    fn priority(&self) -> Option<i32> {
        self.spec.as_ref().and_then(|s| s.priority)
    }

    fn start_patch(&self, ran: &RanWith, _locks: &[WorkloadLock]) -> serde_json::Value {
        let others = other_gates(self);
        json!({
            "metadata": { "annotations": ran.annotations() },
            "spec": {
                "schedulingGates": if others.is_empty() { json!(null) } else { json!(others) },
            },
        })
    }

    /// Deletes it with its grace period, conditioned on the uid and resourceVersion
    /// this reconcile read. Its locks are let go through the finalizer once it can no
    /// longer run.
    async fn stop(&self, api: &Api<Pod>, stop: &Stopping<'_>) -> Result<Stopped<Pod>, kube::Error> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: self.uid(),
                resource_version: self.resource_version(),
            }),
            ..Default::default()
        };
        let object = match api.delete(&self.name_any(), &params).await {
            Ok(_) => Some(self.clone()),
            Err(kube::Error::Api(e)) if e.code == 404 => None,
            Err(e) => return Err(e),
        };
        Ok(Stopped {
            object,
            event_reason: "Deleted",
            message: format!(
                "deleted: {}; its owner, if any, makes a new, gated Pod",
                stop.what_happened()
            ),
            let_go_now: false,
        })
    }

    fn count_stopped(telemetry: &Telemetry, reason: &str) {
        telemetry.count_pod_deleted(reason);
    }
}

/// `Succeeded` or `Failed`: its containers have all ended for good.
pub fn finished(pod: &Pod) -> bool {
    pod.finished().is_some()
}

/// Terminal, or never bound to a node: none of its containers can run.
pub fn processes_ended(pod: &Pod) -> bool {
    stop::pod_processes_ended(pod)
}

/// Whether the Pod still carries lockwarden's scheduling gate.
pub fn has_gate(pod: &Pod) -> bool {
    gates(pod).iter().any(|g| g.name == SCHEDULING_GATE)
}

/// The Pod's scheduling gates other than lockwarden's (kept when ours goes).
fn other_gates(pod: &Pod) -> Vec<PodSchedulingGate> {
    gates(pod)
        .iter()
        .filter(|g| g.name != SCHEDULING_GATE)
        .cloned()
        .collect()
}

fn gates(pod: &Pod) -> &[PodSchedulingGate] {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_deref())
        .unwrap_or_default()
}

/// Ungated by lockwarden: the fence (or fences) annotation is there and the gate is
/// gone (the one write that removes the gate adds the fence).
pub fn running(pod: &Pod) -> bool {
    let a = pod.annotations();
    (a.contains_key(FENCE_ANNOTATION) || a.contains_key(FENCES_ANNOTATION)) && !has_gate(pod)
}

#[cfg(test)]
mod tests;

//! The pure part of Pod gating: what a Pod's annotations ask for, and which phase a
//! gated Pod is in. No API calls here; the decisions shared with Jobs are in
//! [`crate::controller::gating::decide`].

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodSchedulingGate};
use kube::ResourceExt;

use super::{ON_LOCK_LOST_ANNOTATION, SCHEDULING_GATE};
use crate::controller::gating::decide::{self, LockSet, LossPolicy};
use crate::controller::gating::lockset::{self, WorkloadLock};
use crate::controller::gating::{FENCE_ANNOTATION, FENCES_ANNOTATION, Kind, Workload};

/// What happens to an ungated Pod whose lock is no longer held
/// (`lockwarden.io/on-lock-lost`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnLockLost {
    /// Delete it, with its grace period; its owner (if any) makes a new, gated Pod.
    /// The default.
    Delete,
    /// Keep it running; a Warning Event says the lock is no longer held.
    Ignore,
}

impl OnLockLost {
    pub const ALLOWED: &'static str = "delete, ignore";

    pub fn parse(value: &str) -> Option<OnLockLost> {
        match value {
            "delete" => Some(OnLockLost::Delete),
            "ignore" => Some(OnLockLost::Ignore),
            _ => None,
        }
    }
}

/// Everything a gated Pod's annotations ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub locks: LockSet,
    pub on_lock_lost: OnLockLost,
    /// How long a lock past its holder deadline may stay so before the Pod is deleted.
    pub lost_grace: Duration,
}

impl Settings {
    /// What the Pod's annotations say about losing its lock.
    pub fn loss_policy(&self) -> LossPolicy {
        LossPolicy {
            ignores: self.on_lock_lost == OnLockLost::Ignore,
            lost_grace: self.lost_grace,
        }
    }
}

/// The Pod's settings, `None` for a Pod that names no lock, or why its annotations
/// cannot be acted on.
pub fn settings(pod: &Pod) -> Result<Option<Settings>, String> {
    let annotations = pod.annotations();
    let Some(locks) = decide::locks(annotations, Kind::Pod)? else {
        return Ok(None);
    };
    let on_lock_lost = match annotations.get(ON_LOCK_LOST_ANNOTATION) {
        None => OnLockLost::Delete,
        Some(value) => OnLockLost::parse(value).ok_or_else(|| {
            format!(
                "{ON_LOCK_LOST_ANNOTATION}: {value:?} is not one of {} (for a Pod)",
                OnLockLost::ALLOWED
            )
        })?,
    };
    let lost_grace = decide::lost_grace(annotations, Kind::Pod)?;
    Ok(Some(Settings {
        locks,
        on_lock_lost,
        lost_grace,
    }))
}

/// Where a labelled Pod stands; decides which phase function reconciles it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodPhase {
    /// Being deleted.
    Deleted,
    /// `Succeeded` or `Failed`.
    Finished,
    /// Ungated by lockwarden: it carries the fence and no longer our gate.
    Running,
    /// Still carries our scheduling gate.
    Gated,
    /// Neither: created without the gate, so it was never held back.
    NotGated,
}

pub fn phase(pod: &Pod) -> PodPhase {
    if pod.metadata.deletion_timestamp.is_some() {
        PodPhase::Deleted
    } else if finished(pod) {
        PodPhase::Finished
    } else if has_gate(pod) {
        PodPhase::Gated
    } else if running(pod) {
        PodPhase::Running
    } else {
        PodPhase::NotGated
    }
}

/// `Succeeded` or `Failed`: its containers have all ended for good.
pub fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Whether the Pod still carries lockwarden's scheduling gate.
pub fn has_gate(pod: &Pod) -> bool {
    gates(pod).iter().any(|g| g.name == SCHEDULING_GATE)
}

/// The Pod's scheduling gates other than lockwarden's (kept when ours goes).
pub fn other_gates(pod: &Pod) -> Vec<PodSchedulingGate> {
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

/// The fence the Pod was ungated with, per lock.
pub fn fences(pod: &Pod, locks: &[WorkloadLock]) -> Vec<(String, Option<i64>)> {
    lockset::fences_of(pod.annotations(), locks)
}

/// Bound to a node: its containers may run until the kubelet reports a terminal phase.
pub fn bound(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|s| s.node_name.is_some())
}

/// A deleted Pod whose containers may still be running: its lock is let go only once
/// the kubelet reports it `Succeeded` or `Failed` (a Pod never bound to a node ran
/// nothing).
pub fn may_still_run(pod: &Pod) -> bool {
    running(pod) && bound(pod) && !finished(pod)
}

/// The Pod as the shared gating layer sees it.
pub fn workload(pod: &Pod) -> Workload {
    Workload::of(Kind::Pod, pod)
}

#[cfg(test)]
mod tests;

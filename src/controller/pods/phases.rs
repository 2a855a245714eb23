//! One function per phase of a labelled Pod (see the module docs of [`super`]), on one
//! reconcile context, [`Run`].

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;

use super::gate::{self, Settings};
use super::{PodContext, PodError, SCHEDULING_GATE, WAITING_RESYNC};
use crate::api::DistributedLock;
use crate::controller::gating::decide::{
    self, Gate, LockStanding, RunningAction, held, not_held_reason,
};
use crate::controller::gating::locks::{self, Claim, claim, own_lock};
use crate::controller::gating::writes::{
    add_finalizer, has_finalizer, remove_finalizer, report, set_status,
};
use crate::controller::gating::{
    self, FENCE_ANNOTATION, HOLDER_ANNOTATION, LOCK_ANNOTATION, STATUS_ANNOTATION,
};

/// How the status of an ungated Pod whose lock is no longer held begins (`ignore`).
const NOT_HELD_PREFIX: &str = "running with fence";

/// One reconcile of one Pod.
pub(super) struct Run<'a> {
    ctx: &'a PodContext,
    pod: &'a Pod,
    pods: Api<Pod>,
    locks: Api<DistributedLock>,
}

impl<'a> Run<'a> {
    pub fn new(ctx: &'a PodContext, pod: &'a Pod) -> Self {
        let ns = pod.namespace().unwrap_or_else(|| "default".into());
        Run {
            ctx,
            pod,
            pods: Api::namespaced(ctx.client.clone(), &ns),
            locks: Api::namespaced(ctx.client.clone(), &ns),
        }
    }

    fn uid(&self) -> String {
        self.pod.uid().unwrap_or_default()
    }

    fn lock_name(&self, gate: &Gate) -> String {
        match gate {
            Gate::Named(name) => name.clone(),
            Gate::Template(_) => gate::workload(self.pod).own_lock_name(),
        }
    }

    async fn report(
        &self,
        type_: EventType,
        reason: &str,
        message: String,
    ) -> Result<(), PodError> {
        Ok(report(
            &self.pods,
            &self.ctx.events,
            self.pod,
            type_,
            reason,
            message,
        )
        .await?)
    }

    async fn event(&self, pod: &Pod, type_: EventType, reason: &str, message: String) {
        gating::event(&self.ctx.events, pod, type_, reason, message).await;
    }

    async fn let_go(&self, gate: &Gate) -> Result<Option<String>, PodError> {
        let workload = gate::workload(self.pod);
        Ok(locks::let_go(&self.locks, &workload, gate, gate::running(self.pod)).await?)
    }

    /// Deleted: once nothing of the Pod can run any more, let the lock go and drop the
    /// finalizer.
    pub async fn on_deleted(self, gate: Option<Gate>) -> Result<Action, PodError> {
        if !has_finalizer(self.pod) {
            self.ctx.not_held_since.forget(&self.uid());
            return Ok(Action::await_change());
        }
        if gate::may_still_run(self.pod) {
            // Bound to a node and not terminal: its containers get their grace period,
            // and the kubelet (since Kubernetes 1.27) reports a terminal phase once
            // they have stopped, which comes through the watch.
            if let Some(gate) = &gate {
                let message = format!(
                    "deleted; lock {} is let go once its containers have stopped (the \
                     kubelet reports the Pod Succeeded or Failed)",
                    self.lock_name(gate)
                );
                self.report(EventType::Normal, "Terminating", message)
                    .await?;
            }
            return Ok(Action::await_change());
        }
        self.ctx.not_held_since.forget(&self.uid());
        if let Some(gate) = gate
            && let Some(note) = self.let_go(&gate).await?
        {
            let message = format!("{note}: Pod deleted");
            self.event(self.pod, EventType::Normal, "Released", message)
                .await;
        }
        remove_finalizer(&self.pods, self.pod).await?;
        Ok(Action::await_change())
    }

    /// `Succeeded` or `Failed`: let the lock go, drop the finalizer.
    pub async fn on_finished(self, gate: &Gate) -> Result<Action, PodError> {
        self.ctx.not_held_since.forget(&self.uid());
        if !has_finalizer(self.pod) {
            return Ok(Action::await_change());
        }
        let how = self
            .pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("finished")
            .to_lowercase();
        let lock_name = self.lock_name(gate);
        let message = match self.let_go(gate).await? {
            Some(note) => format!("{note}: Pod {how}"),
            None => format!("Pod {how}; lock {lock_name} was already let go"),
        };
        // The finalizer goes first: its patch is conditioned on the resourceVersion
        // this reconcile read, which the status write would change.
        remove_finalizer(&self.pods, self.pod).await?;
        let patched = set_status(&self.pods, self.pod, &message).await?;
        self.event(
            patched.as_ref().unwrap_or(self.pod),
            EventType::Normal,
            "Released",
            message,
        )
        .await;
        Ok(Action::await_change())
    }

    /// Labelled but naming no lock and not gated: nothing to do (our finalizer, if the
    /// annotations were removed, goes).
    pub async fn on_ungated(self) -> Result<Action, PodError> {
        if has_finalizer(self.pod) {
            remove_finalizer(&self.pods, self.pod).await?;
        }
        Ok(Action::await_change())
    }

    /// Annotations that cannot be acted on: a Warning, and the Pod keeps its gate.
    pub async fn on_invalid(self, message: String) -> Result<Action, PodError> {
        self.report(EventType::Warning, "InvalidLockAnnotation", message)
            .await?;
        Ok(Action::await_change())
    }

    /// Our gate, but no lock named: it would wait forever; say so.
    pub async fn on_gate_without_lock(self) -> Result<Action, PodError> {
        let message = format!(
            "the Pod has the scheduling gate {SCHEDULING_GATE} but names no lock: annotate it \
             with {LOCK_ANNOTATION} (an existing DistributedLock) or {} (a template); until \
             then it stays gated",
            gating::TEMPLATE_ANNOTATION
        );
        self.on_invalid(message).await
    }

    /// A lock named but no gate, and never ungated by us: it was scheduled without
    /// waiting for the lock, which we cannot undo.
    pub async fn on_not_gated(self, settings: &Settings) -> Result<Action, PodError> {
        let lock_name = self.lock_name(&settings.gate);
        let message = format!(
            "the Pod names lock {lock_name} but has no scheduling gate {SCHEDULING_GATE}, so \
             it was scheduled without waiting for the lock; create it with \
             spec.schedulingGates: [{{name: {SCHEDULING_GATE}}}] and lockwarden removes the \
             gate once the lock is held"
        );
        self.report(EventType::Warning, "NotGated", message).await?;
        Ok(Action::await_change())
    }

    /// Ungated by us: watch the lock, and act on `on-lock-lost` once it is not held.
    pub async fn on_running(self, settings: &Settings) -> Result<Action, PodError> {
        let uid = self.uid();
        let lock_name = self.lock_name(&settings.gate);
        let lock = self.locks.get_opt(&lock_name).await?;
        let fence = gate::fence(self.pod);
        let standing = decide::standing(lock.as_ref(), &lock_name, fence);
        let not_held_for = match standing {
            LockStanding::Held => {
                self.ctx.not_held_since.forget(&uid);
                Default::default()
            }
            LockStanding::NotHeld { .. } => self.ctx.not_held_since.not_held_for(&uid),
        };
        let fence_text = fence.map(|f| f.to_string()).unwrap_or_default();
        match (
            gate::running_action(&standing, settings, not_held_for),
            standing,
        ) {
            (RunningAction::Continue, _) => {
                let warned = self
                    .pod
                    .annotations()
                    .get(STATUS_ANNOTATION)
                    .is_some_and(|s| s.starts_with(NOT_HELD_PREFIX));
                if warned {
                    let message = format!("holds lock {lock_name} again (fence {fence_text})");
                    self.report(EventType::Normal, "LockHeld", message).await?;
                }
                Ok(Action::await_change())
            }
            (RunningAction::WaitGrace(left), _) => Ok(Action::requeue(left)),
            (RunningAction::Warn, LockStanding::NotHeld { why, .. }) => {
                let message =
                    format!("{NOT_HELD_PREFIX} {fence_text} but no longer holds the lock: {why}");
                self.report(EventType::Warning, "LockNotHeld", message)
                    .await?;
                Ok(Action::await_change())
            }
            (RunningAction::Stop, LockStanding::NotHeld { reason, why, .. }) => {
                self.delete(&lock_name, reason, &why, &fence_text).await
            }
            // `running_action` answers Warn and Stop only for a lock not held.
            (RunningAction::Warn | RunningAction::Stop, LockStanding::Held) => {
                Ok(Action::await_change())
            }
        }
    }

    /// `on-lock-lost: delete`: deletes the Pod with its grace period, conditioned on
    /// the uid and resourceVersion this reconcile read (a Pod changed meanwhile is
    /// looked at again first). Its lock is let go through the finalizer once it can no
    /// longer run; its owner, if any, makes a new, gated Pod.
    async fn delete(
        self,
        lock_name: &str,
        reason: &str,
        why: &str,
        fence: &str,
    ) -> Result<Action, PodError> {
        let message = format!(
            "deleted: it ran with fence {fence} and no longer holds lock {lock_name} \
             ({reason}: {why}); its owner, if any, makes a new, gated Pod"
        );
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: self.pod.uid(),
                resource_version: self.pod.resource_version(),
            }),
            ..Default::default()
        };
        match self.pods.delete(&self.pod.name_any(), &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(Action::await_change()),
            Err(e) => return Err(e.into()),
        }
        self.ctx.telemetry.count_pod_deleted(reason);
        tracing::warn!(
            pod = %self.pod.name_any(), lock = %lock_name, fence, reason,
            "deleted a gated Pod whose lock is no longer held"
        );
        self.event(self.pod, EventType::Warning, "Deleted", message)
            .await;
        Ok(Action::await_change())
    }

    /// Gated: claim or create the lock, and remove the gate once the lock is held for
    /// this Pod, or say why not.
    pub async fn start_or_explain(self, settings: &Settings) -> Result<Action, PodError> {
        if !has_finalizer(self.pod) {
            add_finalizer(&self.pods, self.pod).await?;
            // The patched Pod comes back through the watch.
            return Ok(Action::await_change());
        }
        let lock_name = self.lock_name(&settings.gate);
        let Some(lock) = self.lock_for(&settings.gate).await? else {
            return Ok(Action::requeue(WAITING_RESYNC));
        };
        let Some((fence, holder)) = held(&lock) else {
            let (message, problem) = not_held_reason(&lock);
            let (type_, reason) = if problem {
                (EventType::Warning, "LockFailed")
            } else {
                (EventType::Normal, "Waiting")
            };
            self.report(type_, reason, message).await?;
            return Ok(Action::requeue(WAITING_RESYNC));
        };
        self.start(&lock_name, fence, holder).await
    }

    /// The named lock claimed for this Pod, or its own lock (created from the template
    /// on first use); `None` after reporting why there is none to use yet.
    async fn lock_for(&self, gate: &Gate) -> Result<Option<DistributedLock>, PodError> {
        let workload = gate::workload(self.pod);
        let claimed = match gate {
            Gate::Named(name) => claim(&self.locks, &workload, name, self.in_use_by(name)).await?,
            Gate::Template(template) => {
                own_lock(
                    &self.locks,
                    &self.ctx.config.cluster_name,
                    &workload,
                    template,
                )
                .await?
            }
        };
        match claimed {
            Claim::Ours(lock) => Ok(Some(*lock)),
            Claim::Waiting(type_, reason, message) => {
                self.report(type_, reason, message).await?;
                Ok(None)
            }
        }
    }

    /// Another unfinished gated Pod of the namespace ungated with the named lock `name`
    /// (from the cache): a claim removed by hand must not let this one start.
    fn in_use_by(&self, name: &str) -> Option<String> {
        let ns = self.pod.namespace();
        self.ctx
            .pods
            .state()
            .iter()
            .find(|p| {
                p.namespace() == ns
                    && p.uid() != self.pod.uid()
                    && p.annotations().get(LOCK_ANNOTATION).map(String::as_str) == Some(name)
                    && gate::running(p)
                    && !gate::finished(p)
            })
            .map(|p| format!("Pod {}", p.name_any()))
    }

    /// One write adds the fence and holder and removes the gate (other gates stay),
    /// conditioned on the resourceVersion this reconcile read: no version of the Pod
    /// is schedulable without its fence.
    async fn start(self, lock_name: &str, fence: i64, holder: String) -> Result<Action, PodError> {
        let message = format!("started holding lock {lock_name} (fence {fence}, holder {holder})");
        let others = gate::other_gates(self.pod);
        let patch = json!({
            "metadata": {
                "resourceVersion": self.pod.resource_version(),
                "annotations": {
                    STATUS_ANNOTATION: message,
                    FENCE_ANNOTATION: fence.to_string(),
                    HOLDER_ANNOTATION: holder,
                },
            },
            "spec": {
                "schedulingGates": if others.is_empty() { json!(null) } else { json!(others) },
            },
        });
        let patched = self
            .pods
            .patch(
                &self.pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        tracing::info!(pod = %self.pod.name_any(), fence, "removed the scheduling gate of a gated Pod");
        self.event(&patched, EventType::Normal, "Started", message)
            .await;
        Ok(Action::await_change())
    }
}

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
use crate::controller::gating::decide::LockSet;
use crate::controller::gating::lockset::{self, RanWith, Taker, Taking, WorkloadLock, describe};
use crate::controller::gating::running::{Running, Step};
use crate::controller::gating::writes::{
    add_finalizer, has_finalizer, remove_finalizer, report, set_status,
};
use crate::controller::gating::{self, Kind, LOCK_ANNOTATION, STATUS_ANNOTATION};

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

    fn locks(&self, set: &LockSet) -> Vec<WorkloadLock> {
        lockset::named(set, &gate::workload(self.pod))
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

    /// Lets every lock of the Pod go; what was done, `None` if nothing.
    async fn let_go(&self, set: &LockSet) -> Result<Option<String>, PodError> {
        let workload = gate::workload(self.pod);
        let locks = lockset::named(set, &workload);
        let notes =
            lockset::let_go_all(&self.locks, &workload, &locks, gate::running(self.pod)).await?;
        Ok((!notes.is_empty()).then(|| notes.join("; ")))
    }

    /// Deleted: once nothing of the Pod can run any more, let the lock go and drop the
    /// finalizer.
    pub async fn on_deleted(self, set: Option<LockSet>) -> Result<Action, PodError> {
        if !has_finalizer(self.pod) {
            self.ctx.not_held_since.forget(&self.uid());
            return Ok(Action::await_change());
        }
        if gate::may_still_run(self.pod) {
            // Bound to a node and not terminal: its containers get their grace period,
            // and the kubelet (since Kubernetes 1.27) reports a terminal phase once
            // they have stopped, which comes through the watch.
            if let Some(set) = &set {
                let message = format!(
                    "deleted; {} is let go once its containers have stopped (the \
                     kubelet reports the Pod Succeeded or Failed)",
                    describe(&self.locks(set))
                );
                self.report(EventType::Normal, "Terminating", message)
                    .await?;
            }
            return Ok(Action::await_change());
        }
        self.ctx.not_held_since.forget(&self.uid());
        if let Some(set) = set
            && let Some(note) = self.let_go(&set).await?
        {
            let message = format!("{note}: Pod deleted");
            self.event(self.pod, EventType::Normal, "Released", message)
                .await;
        }
        remove_finalizer(&self.pods, self.pod).await?;
        Ok(Action::await_change())
    }

    /// `Succeeded` or `Failed`: let the lock go, drop the finalizer.
    pub async fn on_finished(self, set: &LockSet) -> Result<Action, PodError> {
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
        let what = describe(&self.locks(set));
        let message = match self.let_go(set).await? {
            Some(note) => format!("{note}: Pod {how}"),
            None => format!("Pod {how}; {what} was already let go"),
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
        let lock_name = describe(&self.locks(&settings.locks));
        let message = format!(
            "the Pod names {lock_name} but has no scheduling gate {SCHEDULING_GATE}, so \
             it was scheduled without waiting for the lock; create it with \
             spec.schedulingGates: [{{name: {SCHEDULING_GATE}}}] and lockwarden removes the \
             gate once the lock is held"
        );
        self.report(EventType::Warning, "NotGated", message).await?;
        Ok(Action::await_change())
    }

    /// Ungated by us: watch the locks, and act on `on-lock-lost` once one is not held.
    pub async fn on_running(self, settings: &Settings) -> Result<Action, PodError> {
        let uid = self.uid();
        let locks = self.locks(&settings.locks);
        let fences = gate::fences(self.pod, &locks);
        let running = Running {
            api: &self.locks,
            locks: &locks,
            fences: &fences,
            annotations: self.pod.annotations(),
            uid: &uid,
            policy: settings.loss_policy(),
        };
        match running.step(&self.ctx.not_held_since).await? {
            Step::Continue(None) => Ok(Action::await_change()),
            Step::Continue(Some(message)) => {
                self.report(EventType::Normal, "LockHeld", message).await?;
                Ok(Action::await_change())
            }
            Step::WaitGrace(left) => Ok(Action::requeue(left)),
            Step::Warn(message) => {
                self.report(EventType::Warning, "LockNotHeld", message)
                    .await?;
                Ok(Action::await_change())
            }
            Step::Stop {
                reason,
                why,
                locks,
                fences,
            } => self.delete(&locks, reason, &why, &fences).await,
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
            "deleted: it ran with fence {fence} and no longer holds {lock_name} \
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

    /// Gated: take the locks (claim or create each, one at a time in the global order),
    /// and remove the gate once all are held for this Pod, or say why not.
    pub async fn start_or_explain(self, settings: &Settings) -> Result<Action, PodError> {
        if !has_finalizer(self.pod) {
            add_finalizer(&self.pods, self.pod).await?;
            // The patched Pod comes back through the watch.
            return Ok(Action::await_change());
        }
        let workload = gate::workload(self.pod);
        let ordered = match lockset::in_take_order(&self.locks, &settings.locks, &workload).await? {
            Ok(ordered) => ordered,
            Err((type_, reason, message)) => {
                self.report(type_, reason, message).await?;
                return Ok(Action::requeue(WAITING_RESYNC));
            }
        };
        // A Pod is never gated again after a loss (it is deleted): nothing lost to skip.
        let lost = Default::default();
        let in_use_by = |name: &str| self.in_use_by(name);
        let taker = Taker {
            api: &self.locks,
            workload: &workload,
            cluster: &self.ctx.config.cluster_name,
            in_use_by: &in_use_by,
            lost: &lost,
        };
        match taker.take(&ordered).await? {
            Taking::Held(ran) => self.start(ran).await,
            Taking::Waiting((type_, reason, message)) => {
                self.report(type_, reason, message).await?;
                Ok(Action::requeue(WAITING_RESYNC))
            }
        }
    }

    /// Another unfinished gated Pod ungated with the named lock `name` (from the
    /// cache): a claim removed by hand must not let this one start.
    fn in_use_by(&self, name: &str) -> Option<String> {
        let started = |p: &Pod| gate::running(p) && !gate::finished(p);
        gating::in_use_by(Kind::Pod, &self.ctx.pods.state(), self.pod, name, started)
    }

    /// One write adds the fence(s) (and the holder, for one lock) and removes the gate
    /// (other gates stay), conditioned on the resourceVersion this reconcile read: no
    /// version of the Pod is schedulable without its fence.
    async fn start(self, ran: RanWith) -> Result<Action, PodError> {
        let message = format!("started holding {}", ran.describe());
        let mut annotations = ran.annotations();
        annotations.insert(STATUS_ANNOTATION.into(), message.clone().into());
        let others = gate::other_gates(self.pod);
        let patch = json!({
            "metadata": {
                "resourceVersion": self.pod.resource_version(),
                "annotations": annotations,
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
        tracing::info!(pod = %self.pod.name_any(), fences = ?ran.0, "removed the scheduling gate of a gated Pod");
        self.event(&patched, EventType::Normal, "Started", message)
            .await;
        Ok(Action::await_change())
    }
}

//! Pod gating (docs/design.md §6.1 "Any Pod"): a third controller, over Pods created
//! with the scheduling gate `lockwarden.io/lock`, the label `lockwarden.io/gated:
//! "true"` and an annotation naming their lock — `lockwarden.io/lock: NAME` (claim the
//! existing DistributedLock NAME) or `lockwarden.io/lock-template: NAME` (a per-Pod
//! DistributedLock copied from NAME, owned by the Pod).
//!
//! Only Pods with that label are watched (a server-side label selector), so the
//! controller never caches the other Pods of the cluster; a Pod gated without the
//! label is never seen and stays gated.
//!
//! Reconcile dispatches on [`gate::phase`] to one phase function ([`phases`]):
//!
//! - deleted (our finalizer is set) → let the lock go once nothing can run any more
//!   (never bound to a node, or `Succeeded`/`Failed`), drop the finalizer;
//! - finished (`Succeeded` or `Failed`) → let the lock go, drop the finalizer;
//! - bad annotations, or our gate without an annotation → Warning Event, the Pod keeps
//!   its gate;
//! - running (ungated by us: it carries `lockwarden.io/fence`, our gate gone) → watch
//!   the lock; once it is no longer held, act on `lockwarden.io/on-lock-lost`: `delete`
//!   (default: delete the Pod with its grace period; its owner makes a new, gated Pod)
//!   or `ignore` (Warning Event);
//! - not gated (an annotation but no gate) → Warning Event: it was never held back;
//! - gated → add the finalizer; claim the named lock or create the per-Pod lock; once
//!   it is `Acquired=True` at its current generation with a fence, ONE patch,
//!   conditioned on the Pod's resourceVersion, adds `lockwarden.io/fence` and
//!   `lockwarden.io/holder` and removes the gate, so no version of the Pod is
//!   schedulable without its fence.
//!
//! Claiming, creating and letting go of locks, and the status/finalizer writes, are
//! the Job gate's, shared through [`super::gating`].

mod gate;
mod phases;

pub use gate::{OnLockLost, PodPhase, Settings, finished, has_gate, phase, settings};

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::ControllerConfig;
use super::events::Events;
use super::gating::{Kind, NotHeldSince};
use crate::api::DistributedLock;
use crate::telemetry::Telemetry;

pub use super::gating::ON_LOCK_LOST_ANNOTATION;

/// The scheduling gate lockwarden removes once the Pod's lock is held.
pub const SCHEDULING_GATE: &str = "lockwarden.io/lock";
/// The label that makes a Pod visible to lockwarden (the watch's label selector).
pub const GATED_LABEL: &str = "lockwarden.io/gated";
/// The server-side label selector of the Pod watch.
pub const GATED_SELECTOR: &str = "lockwarden.io/gated=true";

/// Safety net for a waiting Pod: lock changes arrive through the watch.
const WAITING_RESYNC: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum PodError {
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// What the Pod controller's reconciles share.
pub struct PodContext {
    pub client: kube::Client,
    pub config: ControllerConfig,
    events: Events,
    /// The Controller's cache of gated (labelled) Pods.
    pods: Store<Pod>,
    pub telemetry: Arc<Telemetry>,
    /// For `lockwarden.io/lost-grace`.
    not_held_since: NotHeldSince,
}

pub fn error_policy(_pod: Arc<Pod>, err: &PodError, _ctx: Arc<PodContext>) -> Action {
    tracing::debug!(error = %err, "pod reconcile failed; retrying");
    // Mostly a lost race on a resourceVersion precondition: retry soon.
    Action::requeue(Duration::from_secs(1))
}

/// Runs the Pod controller until its watch stream ends (it does not on its own).
pub async fn run(client: kube::Client, config: ControllerConfig, telemetry: Arc<Telemetry>) {
    let (pods, locks): (Api<Pod>, Api<DistributedLock>) = match &config.namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    // Server-side selector: the API server sends only labelled Pods, so neither the
    // cache nor the watch ever holds the cluster's other Pods.
    let controller = Controller::new(pods, watcher::Config::default().labels(GATED_SELECTOR));
    let store = controller.store();
    let ctx = Arc::new(PodContext {
        events: Events::new(client.clone(), &config),
        client,
        config,
        pods: store.clone(),
        telemetry,
        not_held_since: NotHeldSince::default(),
    });
    controller
        .watches(locks, watcher::Config::default(), move |lock| {
            pods_of_lock(&lock, &store.state())
        })
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((pod, _)) => tracing::trace!(%pod, "pod reconciled"),
                Err(e) => tracing::debug!(error = %e, "pod reconcile failed"),
            }
        })
        .await;
}

/// The Pods a lock change concerns (see [`super::gating::workloads_of_lock`]).
pub fn pods_of_lock(lock: &DistributedLock, pods: &[Arc<Pod>]) -> Vec<ObjectRef<Pod>> {
    super::gating::workloads_of_lock(Kind::Pod, lock, pods)
}

/// One reconcile of a labelled Pod: read its settings and phase, run that phase's
/// function.
pub async fn reconcile(pod: Arc<Pod>, ctx: Arc<PodContext>) -> Result<Action, PodError> {
    let run = phases::Run::new(&ctx, &pod);
    let phase = gate::phase(&pod);
    // Letting go needs only the lock's name: a bad policy annotation must not keep a
    // deleted or finished Pod's lock.
    let named = super::gating::decide::locks(pod.annotations(), Kind::Pod);
    match (phase, named) {
        (PodPhase::Deleted, locks) => return run.on_deleted(locks.ok().flatten()).await,
        (PodPhase::Finished, Ok(Some(locks))) => return run.on_finished(&locks).await,
        (PodPhase::Finished, _) => return run.on_ungated().await,
        _ => {}
    }
    let settings = match settings(&pod) {
        Ok(Some(settings)) => settings,
        Ok(None) if phase == PodPhase::Gated => return run.on_gate_without_lock().await,
        Ok(None) => return run.on_ungated().await,
        Err(message) => return run.on_invalid(message).await,
    };
    match phase {
        PodPhase::Running => run.on_running(&settings).await,
        PodPhase::NotGated => run.on_not_gated(&settings).await,
        PodPhase::Gated => run.start_or_explain(&settings).await,
        // Handled above.
        PodPhase::Deleted | PodPhase::Finished => Ok(Action::await_change()),
    }
}

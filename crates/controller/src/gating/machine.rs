//! The gating machine: one controller per registered kind of workload, every phase of a
//! gated workload written once (docs/design.md §6, §6.1).
//!
//! Reconcile dispatches on [`Phase`] to one method of [`Run`]:
//!
//! - deleted (our finalizer is set) → let the locks go once nothing of the workload can
//!   run any more, drop the finalizer;
//! - finished → let the locks go, drop the finalizer;
//! - bad annotations (or our gate without a lock named) → Warning Event, the workload
//!   stays as it is (never started);
//! - stopped for good (`on-lock-lost: fail`) → let the locks go once, drop the finalizer;
//! - running (started by us with fences) → watch the locks; once one is no longer held,
//!   act on `lockwarden.io/on-lock-lost`: stop it the kind's way, or only warn;
//! - held back by our gate → add the finalizer; claim each named lock or create each
//!   own lock, the next only once the previous is held; once all are `Acquired=True`
//!   for this workload with a fence, one write (the kind's) sets the fences and lifts
//!   the gate, conditioned on the resourceVersion; otherwise `lockwarden.io/status`
//!   (plus an Event when it changes) says why it waits;
//! - neither → Warning Event: it runs without waiting for its locks.
//!
//! The machine never talks to a lock store: it creates, claims, releases and deletes
//! `DistributedLock` objects and reads their status, which the lock controller
//! maintains. Wake-ups: the workload watch, plus a watch on DistributedLocks mapped to
//! the workloads that own, claim or name each lock.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::decide::{self, AnnotationError, LockSet, LossPolicy};
use super::error::GatingError;
use super::kind::{GatedWorkload, Kinds, OnLockLost, Readiness, Stopping};
use super::locks::{LOCK_IN_USE, OwnLockTerms};
use super::lockset::{self, RanWith, Taker, Taking, WorkloadLock, describe};
use super::once;
use super::running::{Running, Step};
use super::stop;
use super::writes::{add_finalizer, has_finalizer, remove_finalizer, report, set_status};
use super::{NotHeldSince, Workload};
use crate::config::ControllerConfig;
use crate::events::Events;
use crate::telemetry::Telemetry;
use lockwarden_api::DistributedLock;
use lockwarden_core::SafetyMargins;

/// Safety net for a waiting workload: lock changes arrive through the watch.
const WAITING_RESYNC: Duration = Duration::from_secs(60);
/// How often a workload whose locks wait for its processes to end looks again: the end
/// of a Pod does not always change the workload itself (a Job being deleted).
const PROCESSES_RECHECK: Duration = Duration::from_secs(2);
/// How often a workload waiting for a named lock that another workload of its kind is
/// still seen using (`LockInUse`) looks again. What it waits for is a change of that
/// other workload (its finalizer gone, finished, deleted), which wakes only that one;
/// and the lock's own changes can come first: a workload lets its lock go before it
/// drops its finalizer, so the last of them may find it still in this controller's
/// cache, and the wait would otherwise last until `WAITING_RESYNC` (a node hand-off
/// once took 60 s so).
pub(crate) const IN_USE_RECHECK: Duration = Duration::from_secs(2);

/// The observation that a workload's processes have all ended (docs/design.md §6.3):
/// the only way to let its locks go cleanly, made only by [`Run::observe_ended`].
pub struct Ended(());

/// What [`Run::let_go_when_ended`] came to.
enum LetGo {
    /// Its processes may still run: nothing was let go (a held lock keeps being
    /// renewed, a lost one expires with its delay).
    Running,
    /// Ended: its locks were let go; what was done, `None` if nothing.
    Ended(Option<String>),
}

/// Everything a gated workload's annotations ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub locks: LockSet,
    pub on_lock_lost: OnLockLost,
    /// How long a lock that stopped being claimable (`LeaseExpiring`) may stay so
    /// before the workload is stopped; zero by default.
    pub lost_grace: Duration,
}

impl Settings {
    /// The settings of a workload of `W`'s kind, `None` if it names no lock, or why its
    /// annotations cannot be acted on.
    pub fn of<W: GatedWorkload>(workload: &W) -> Result<Option<Settings>, AnnotationError> {
        Settings::from_annotations(workload.annotations(), W::KIND)
    }

    /// The settings these annotations (see [`GatedWorkload::gate_annotations`]) ask for
    /// a workload of `kind`.
    pub fn from_annotations(
        annotations: &BTreeMap<String, String>,
        kind: &'static super::Kind,
    ) -> Result<Option<Settings>, AnnotationError> {
        let Some((locks, on_lock_lost)) = decide::locks_and_on_lock_lost(annotations, kind)? else {
            return Ok(None);
        };
        let lost_grace = decide::lost_grace(annotations, kind)?;
        Ok(Some(Settings {
            locks,
            on_lock_lost,
            lost_grace,
        }))
    }

    /// What the annotations say about losing its lock.
    pub fn loss_policy(&self) -> LossPolicy {
        LossPolicy {
            ignores: self.on_lock_lost == OnLockLost::Ignore,
            lost_grace: self.lost_grace,
        }
    }
}

/// Where a gated workload stands; decides which phase method reconciles it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Being deleted.
    Deleted,
    /// Finished (its kind says how).
    Finished,
    /// Stopped by lockwarden for good (`on-lock-lost: fail`).
    StoppedForGood,
    /// Started by lockwarden with fences, not stopped since.
    Running,
    /// Held back by lockwarden's gate: it can be started.
    HeldBack,
    /// None of these: it runs without waiting for its locks.
    NotHeldBack,
}

impl Phase {
    pub fn of<W: GatedWorkload>(workload: &W) -> Phase {
        if workload.meta().deletion_timestamp.is_some() {
            Phase::Deleted
        } else if workload.finished().is_some() {
            Phase::Finished
        } else if workload.stopped_for_good() {
            Phase::StoppedForGood
        } else if workload.running() {
            Phase::Running
        } else if workload.held_back() {
            Phase::HeldBack
        } else {
            Phase::NotHeldBack
        }
    }
}

/// The workload as the shared layer sees it.
pub fn workload<W: GatedWorkload>(obj: &W) -> Workload {
    Workload::of(W::KIND, obj)
}

/// What the reconciles of one kind share.
pub struct Gating<W: GatedWorkload> {
    pub client: kube::Client,
    pub config: ControllerConfig,
    events: Events,
    /// The controller's cache of this kind.
    cache: Store<W>,
    telemetry: Arc<Telemetry>,
    /// Every kind a claim may name.
    kinds: Kinds,
    /// For `lockwarden.io/lost-grace`.
    not_held_since: NotHeldSince,
}

impl<W: GatedWorkload> Gating<W> {
    pub fn new(
        client: kube::Client,
        config: ControllerConfig,
        cache: Store<W>,
        telemetry: Arc<Telemetry>,
        kinds: Kinds,
    ) -> Self {
        Gating {
            events: Events::new(client.clone(), &config),
            client,
            config,
            cache,
            telemetry,
            kinds,
            not_held_since: NotHeldSince::default(),
        }
    }
}

#[cfg(test)]
impl<W: GatedWorkload> Gating<W> {
    /// For the unit tests: the default config, an empty cache, telemetry of its own,
    /// and `W` the only kind registered.
    pub fn alone(client: kube::Client) -> Arc<Self> {
        Self::with_cached(client, Vec::new())
    }

    /// [`Gating::alone`] with `config`.
    pub fn configured(client: kube::Client, config: ControllerConfig) -> Arc<Self> {
        Self::built(client, config, Vec::new())
    }

    /// [`Gating::alone`] with `cached` in its cache of the kind, as the watch would
    /// have them.
    pub fn with_cached(client: kube::Client, cached: Vec<W>) -> Arc<Self> {
        Self::built(client, ControllerConfig::default(), cached)
    }

    fn built(client: kube::Client, config: ControllerConfig, cached: Vec<W>) -> Arc<Self> {
        let (cache, mut writer) = kube::runtime::reflector::store();
        for obj in cached {
            writer.apply_watcher_event(&watcher::Event::Apply(obj));
        }
        let kinds = Kinds::default().with::<W>();
        let telemetry = Arc::new(Telemetry::new());
        Arc::new(Gating::new(client, config, cache, telemetry, kinds))
    }
}

fn error_policy<W: GatedWorkload>(_obj: Arc<W>, err: &GatingError, _ctx: Arc<Gating<W>>) -> Action {
    tracing::debug!(kind = W::KIND.name, error = %err, "gating reconcile failed; retrying");
    // Mostly a lost race on a resourceVersion precondition: retry soon.
    Action::requeue(Duration::from_secs(1))
}

/// Runs the controller of kind `W` until its watch stream ends (it does not on its own).
pub async fn run<W: GatedWorkload>(
    client: kube::Client,
    config: ControllerConfig,
    telemetry: Arc<Telemetry>,
    kinds: Kinds,
) {
    let (workloads, locks): (Api<W>, Api<DistributedLock>) = match &config.namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let controller = Controller::new(workloads, W::watch_config());
    let store = controller.store();
    let mapper_kinds = kinds.clone();
    let pods: Api<Pod> = match &config.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let ctx = Arc::new(Gating::new(client, config, store.clone(), telemetry, kinds));
    let mut controller = controller.watches(locks, watcher::Config::default(), move |lock| {
        super::workloads_of_lock(W::KIND, &mapper_kinds, &lock, &store.state())
    });
    if let Some(pods_watch) = W::pods_watch() {
        controller = controller.watches(pods, pods_watch, owner_of::<W>);
    }
    controller
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => tracing::trace!(kind = W::KIND.name, %obj, "reconciled"),
                Err(e) => tracing::debug!(kind = W::KIND.name, error = %e, "reconcile failed"),
            }
        })
        .await;
}

/// The workload of kind `W` that controls `pod`, if one does (a Job's Pod: its Job).
fn owner_of<W: GatedWorkload>(pod: Pod) -> Option<ObjectRef<W>> {
    let owner = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == W::KIND.name)?;
    let namespace = pod.namespace()?;
    Some(ObjectRef::new(&owner.name).within(&namespace))
}

/// The workloads of kind `W` a lock change concerns (see [`super::workloads_of_lock`]).
pub fn of_lock<W: GatedWorkload>(
    kinds: &Kinds,
    lock: &DistributedLock,
    cached: &[Arc<W>],
) -> Vec<ObjectRef<W>> {
    super::workloads_of_lock(W::KIND, kinds, lock, cached)
}

/// One reconcile of a gated workload: read its settings and phase, run that phase.
pub async fn reconcile<W: GatedWorkload>(
    obj: Arc<W>,
    ctx: Arc<Gating<W>>,
) -> Result<Action, GatingError> {
    let gate = obj
        .gate_annotations(&ctx.client)
        .await
        .map_err(|e| GatingError::Gate(workload(&*obj).to_string(), e))?;
    let run = Run::new(&ctx, &obj, &gate);
    let phase = Phase::of(&*obj);
    // Letting go needs only the locks' names: a bad policy annotation must not keep a
    // deleted or finished workload's locks.
    let named = decide::locks(&gate, W::KIND);
    match (phase, named) {
        (Phase::Deleted, locks) => return run.on_deleted(locks.ok().flatten()).await,
        (Phase::Finished, Ok(Some(locks))) => return run.on_finished(&locks).await,
        (Phase::Finished, _) => return run.on_ungated().await,
        _ => {}
    }
    let settings = match Settings::from_annotations(&gate, W::KIND) {
        Ok(Some(settings)) => settings,
        Ok(None) => match obj.gate_without_lock() {
            Some(message) if phase == Phase::HeldBack => return run.on_invalid(message).await,
            _ => return run.on_ungated().await,
        },
        Err(invalid) => return run.on_invalid(invalid.to_string()).await,
    };
    // Not asked of a workload lockwarden started: that one's locks stay watched.
    if matches!(phase, Phase::HeldBack | Phase::NotHeldBack)
        && let Some(why) = obj
            .managed_elsewhere(&ctx.client, &ctx.config)
            .await
            .map_err(run.failed(GatingError::ManagedElsewhere))?
    {
        return run.on_managed_elsewhere(why, &settings).await;
    }
    match phase {
        Phase::StoppedForGood => run.on_stopped_for_good(&settings).await,
        Phase::Running => run.on_running(&settings).await,
        Phase::NotHeldBack => run.on_not_held_back(&settings).await,
        Phase::HeldBack => run.start_or_explain(&settings).await,
        // Handled above.
        Phase::Deleted | Phase::Finished => Ok(Action::await_change()),
    }
}

/// One reconcile of one workload.
struct Run<'a, W: GatedWorkload> {
    ctx: &'a Gating<W>,
    obj: &'a W,
    /// Its [`GatedWorkload::gate_annotations`].
    gate: &'a BTreeMap<String, String>,
    workload: Workload,
    api: Api<W>,
    locks: Api<DistributedLock>,
}

impl<'a, W: GatedWorkload> Run<'a, W> {
    fn new(ctx: &'a Gating<W>, obj: &'a W, gate: &'a BTreeMap<String, String>) -> Self {
        let ns = obj.namespace().unwrap_or_else(|| "default".into());
        Run {
            ctx,
            obj,
            gate,
            workload: workload(obj),
            api: Api::namespaced(ctx.client.clone(), &ns),
            locks: Api::namespaced(ctx.client.clone(), &ns),
        }
    }

    fn named(&self, set: &LockSet) -> Vec<WorkloadLock> {
        lockset::named(set, &self.workload)
    }

    /// The failure of `step` for this workload.
    fn failed<E: 'static>(
        &self,
        step: fn(String, E) -> GatingError,
    ) -> impl FnOnce(E) -> GatingError + '_ {
        move |source| step(self.workload.to_string(), source)
    }

    async fn remove_finalizer(&self, obj: &W) -> Result<(), GatingError> {
        remove_finalizer(&self.api, obj)
            .await
            .map_err(self.failed(GatingError::Finalizer))
    }

    async fn report(
        &self,
        type_: EventType,
        reason: &str,
        message: String,
    ) -> Result<(), GatingError> {
        report(
            &self.api,
            &self.ctx.events,
            self.obj,
            type_,
            reason,
            message,
        )
        .await
        .map_err(self.failed(GatingError::Report))
    }

    /// Why it is not started (yet): [`report`](Self::report), and the same message
    /// where its kind shows a waiting workload's status
    /// ([`GatedWorkload::show_waiting`]).
    async fn wait(
        &self,
        type_: EventType,
        reason: &str,
        message: String,
    ) -> Result<(), GatingError> {
        self.obj
            .show_waiting(&self.api, &message, type_ == EventType::Warning)
            .await
            .map_err(self.failed(GatingError::Report))?;
        self.report(type_, reason, message).await
    }

    async fn event(&self, obj: &W, type_: EventType, reason: &str, message: String) {
        super::event(&self.ctx.events, obj, type_, reason, message).await;
    }

    fn forget_not_held(&self) {
        self.ctx.not_held_since.forget(&self.workload.uid);
    }

    /// Whether `obj`'s processes are observed ended.
    async fn observe_ended(&self, obj: &W) -> Result<Option<Ended>, GatingError> {
        Ok(obj
            .processes_ended(&self.ctx.client)
            .await
            .map_err(self.failed(GatingError::ProcessesEnded))?
            .then_some(Ended(())))
    }

    /// The kind's proof, from its kubelet's report (or its guards' where trusted), that
    /// every process of `obj` has ended and it succeeded, before the kind says it
    /// finished (§6.3, "Early hand-off").
    async fn observe_ended_in_success(&self, obj: &W) -> Result<Option<Ended>, GatingError> {
        let reports = if self.ctx.config.trust_guard_reports {
            stop::ExitReports::KubeletAndGuard
        } else {
            stop::ExitReports::Kubelet
        };
        Ok(obj
            .ended_in_success(&self.ctx.client, reports)
            .await
            .map_err(self.failed(GatingError::ProcessesEnded))?
            .then_some(Ended(())))
    }

    /// Its processes ended in success before its kind says it finished: every lock is
    /// let go now, a run it was recorded as completed, as when it finishes; the
    /// finalizer goes, which later reconciles, until it finishes, read as "let go".
    async fn let_go_in_success(
        self,
        ended: &Ended,
        settings: &Settings,
    ) -> Result<Action, GatingError> {
        self.forget_not_held();
        let locks = self.named(&settings.locks);
        let notes = lockset::let_go_all(ended, &self.locks, &self.workload, &locks, true, true)
            .await
            .map_err(self.failed(GatingError::LetGo))?;
        let kind = W::KIND.name;
        let how = match self.ctx.config.trust_guard_reports {
            true => {
                "its processes ended in success (every container exited 0, as its kubelet or its guard reports)"
            }
            false => {
                "its processes ended in success (every container exited 0, as its kubelet reports)"
            }
        };
        let message = match notes.is_empty() {
            true => format!("{kind}: {how}; {} was already let go", describe(&locks)),
            false => format!("{}: {kind}: {how}", notes.join("; ")),
        };
        self.let_go_done(message).await
    }

    /// The one rule every release path goes through (docs/design.md §6.3): lets every
    /// lock of `obj` go (a named lock it ran with even when its claim was removed by
    /// hand) only once its processes are observed ended; until then nothing is written.
    async fn let_go_when_ended(&self, obj: &W, set: &LockSet) -> Result<LetGo, GatingError> {
        let Some(ended) = self.observe_ended(obj).await? else {
            return Ok(LetGo::Running);
        };
        let locks = self.named(set);
        let (ran, succeeded) = (obj.running(), obj.succeeded());
        let notes =
            lockset::let_go_all(&ended, &self.locks, &self.workload, &locks, ran, succeeded)
                .await
                .map_err(self.failed(GatingError::LetGo))?;
        Ok(LetGo::Ended((!notes.is_empty()).then(|| notes.join("; "))))
    }

    /// Deleted: once nothing of it can run any more, let the locks go and drop the
    /// finalizer.
    async fn on_deleted(self, set: Option<LockSet>) -> Result<Action, GatingError> {
        if !has_finalizer(self.obj) {
            self.forget_not_held();
            return Ok(Action::await_change());
        }
        if let Some(set) = set {
            match self.let_go_when_ended(self.obj, &set).await? {
                LetGo::Running => {
                    // Its Pods get their grace period, starting now (a Job's Pods are
                    // otherwise deleted only once the Job is gone).
                    self.obj
                        .delete_pods(&self.ctx.client)
                        .await
                        .map_err(self.failed(GatingError::DeletePods))?;
                    let message = format!(
                        "deleted; {} is let go once its processes have ended",
                        describe(&self.named(&set))
                    );
                    self.report(EventType::Normal, "Terminating", message)
                        .await?;
                    return Ok(Action::requeue(PROCESSES_RECHECK));
                }
                LetGo::Ended(Some(note)) => {
                    let message = format!("{note}: {} deleted", W::KIND.name);
                    self.event(self.obj, EventType::Normal, "Released", message)
                        .await;
                }
                LetGo::Ended(None) => {}
            }
        }
        self.forget_not_held();
        self.remove_finalizer(self.obj).await?;
        Ok(Action::await_change())
    }

    /// Finished: let the locks go, drop the finalizer.
    async fn on_finished(self, set: &LockSet) -> Result<Action, GatingError> {
        self.forget_not_held();
        if !has_finalizer(self.obj) {
            return Ok(Action::await_change());
        }
        let how = self.obj.finished().unwrap_or("finished").to_lowercase();
        let kind = W::KIND.name;
        let what = describe(&self.named(set));
        let message = match self.let_go_when_ended(self.obj, set).await? {
            LetGo::Ended(Some(note)) => format!("{note}: {kind} {how}"),
            LetGo::Ended(None) => format!("{kind} {how}; {what} was already let go"),
            LetGo::Running => {
                let message =
                    format!("{kind} {how}; {what} is let go once its processes have ended");
                self.report(EventType::Normal, "Terminating", message)
                    .await?;
                return Ok(Action::requeue(PROCESSES_RECHECK));
            }
        };
        self.let_go_done(message).await
    }

    /// Its locks let go: the finalizer goes, then `lockwarden.io/status` and a
    /// `Released` Event say `message`. The finalizer goes first: its patch is
    /// conditioned on the resourceVersion this reconcile read, which the status write
    /// would change.
    async fn let_go_done(self, message: String) -> Result<Action, GatingError> {
        self.remove_finalizer(self.obj).await?;
        let patched = set_status(&self.api, self.obj, &message)
            .await
            .map_err(self.failed(GatingError::Report))?;
        self.event(
            patched.as_ref().unwrap_or(self.obj),
            EventType::Normal,
            "Released",
            message,
        )
        .await;
        Ok(Action::await_change())
    }

    /// Naming no lock (the annotations were removed): our finalizer, if any, goes.
    async fn on_ungated(self) -> Result<Action, GatingError> {
        if has_finalizer(self.obj) {
            self.remove_finalizer(self.obj).await?;
        }
        Ok(Action::await_change())
    }

    /// Annotations that cannot be acted on: a Warning, and it stays as it is.
    async fn on_invalid(self, message: String) -> Result<Action, GatingError> {
        self.wait(EventType::Warning, "InvalidLockAnnotation", message)
            .await?;
        Ok(Action::await_change())
    }

    /// Stopped for good: the locks are let go once, the finalizer dropped; it is never
    /// started again.
    async fn on_stopped_for_good(self, settings: &Settings) -> Result<Action, GatingError> {
        if has_finalizer(self.obj) {
            if let LetGo::Running = self.let_go_when_ended(self.obj, &settings.locks).await? {
                return Ok(Action::requeue(PROCESSES_RECHECK));
            }
            self.remove_finalizer(self.obj).await?;
        }
        Ok(Action::await_change())
    }

    /// Another controller admits it: a Warning, and nothing written to it (its gate is
    /// that controller's). Locks taken for it while it was held back, before that
    /// controller showed up, are let go once its processes have ended.
    async fn on_managed_elsewhere(
        self,
        why: String,
        settings: &Settings,
    ) -> Result<Action, GatingError> {
        let what = describe(&self.named(&settings.locks));
        let message = format!(
            "not gated by lockwarden: {why}; its {what} is not taken for it (use a \
             lockwarden AdmissionCheck on its ClusterQueue to hold it back on a lock)"
        );
        self.event(self.obj, EventType::Warning, "ManagedElsewhere", message)
            .await;
        if has_finalizer(self.obj) {
            if let LetGo::Running = self.let_go_when_ended(self.obj, &settings.locks).await? {
                return Ok(Action::requeue(PROCESSES_RECHECK));
            }
            self.remove_finalizer(self.obj).await?;
        }
        Ok(Action::await_change())
    }

    /// Names locks but was never held back: it runs without them, which we cannot stop.
    async fn on_not_held_back(self, settings: &Settings) -> Result<Action, GatingError> {
        let what = describe(&self.named(&settings.locks));
        let (reason, message) = self.obj.not_held_back(&what);
        self.report(EventType::Warning, reason, message).await?;
        Ok(Action::await_change())
    }

    /// Started by us: watch the locks, and act on `on-lock-lost` once one is not held —
    /// unless its processes are proven ended in success before its kind says it
    /// finished, which lets its locks go at once (§6.3, "Early hand-off").
    async fn on_running(self, settings: &Settings) -> Result<Action, GatingError> {
        if !has_finalizer(self.obj) {
            // Its locks were let go when its processes ended in success (below; or the
            // finalizer was removed by hand): nothing of it is left to guard.
            return Ok(Action::await_change());
        }
        if let Some(ended) = self.observe_ended_in_success(self.obj).await? {
            return self.let_go_in_success(&ended, settings).await;
        }
        let locks = self.named(&settings.locks);
        let fences = self.obj.fences(&locks);
        let running = Running {
            api: &self.locks,
            locks: &locks,
            fences: &fences,
            annotations: self.obj.annotations(),
            uid: &self.workload.uid,
            policy: settings.loss_policy(),
        };
        let step = running
            .step(&self.ctx.not_held_since)
            .await
            .map_err(self.failed(GatingError::Standing))?;
        match step {
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
            } => {
                let stopping = Stopping {
                    for_good: settings.on_lock_lost == OnLockLost::Fail,
                    reason,
                    why: &why,
                    locks: &locks,
                    fences: &fences,
                };
                self.stop(settings, &stopping).await
            }
        }
    }

    /// Stops a running workload whose lock is no longer held, the kind's way, and deletes
    /// its Pods at once with their own grace period; then lets its locks go once its
    /// processes have ended: here if they already have and the kind says so (a Job waits
    /// for its lock anew), else in the phase it is now in (held back, stopped for good,
    /// or deleted).
    async fn stop(
        self,
        settings: &Settings,
        stopping: &Stopping<'_>,
    ) -> Result<Action, GatingError> {
        let stopped = self
            .obj
            .stop(&self.api, stopping)
            .await
            .map_err(self.failed(GatingError::Stop))?;
        let Some(object) = stopped.object else {
            return Ok(Action::await_change());
        };
        W::count_stopped(&self.ctx.telemetry, stopping.reason);
        self.forget_not_held();
        tracing::warn!(
            kind = W::KIND.name, name = %self.obj.name_any(), locks = %stopping.locks,
            fences = %stopping.fences, reason = stopping.reason,
            "stopped a gated workload whose lock is no longer held"
        );
        self.event(
            &object,
            EventType::Warning,
            stopped.event_reason,
            stopped.message,
        )
        .await;
        // Their grace periods start now, not once another controller gets to them (§6.3:
        // W). If this fails, the Job controller still deletes them.
        if let Err(e) = object.delete_pods(&self.ctx.client).await {
            tracing::warn!(kind = W::KIND.name, name = %self.obj.name_any(), error = %e,
                "could not delete the Pods of a stopped workload; its own controller will");
        }
        if stopped.let_go_now {
            // If this fails, the stopped (or re-gated) workload picks up from here.
            let let_go = self.let_go_when_ended(&object, &settings.locks).await?;
            if matches!(let_go, LetGo::Ended(_)) && stopping.for_good {
                self.remove_finalizer(&object).await?;
            }
        }
        Ok(Action::await_change())
    }

    /// The value of a queue priority: a PriorityClass's is read from the API (a
    /// cluster-wide install may get PriorityClasses); one that cannot be read leaves the
    /// template's priority, with the reason in the log.
    async fn priority_value(&self, asked: decide::QueuePriority) -> Option<i32> {
        use k8s_openapi::api::scheduling::v1::PriorityClass;
        match asked {
            decide::QueuePriority::Template => None,
            decide::QueuePriority::Value(p) => Some(p),
            decide::QueuePriority::Class(name) => {
                let classes: Api<PriorityClass> = Api::all(self.locks.clone().into_client());
                match classes.get_opt(&name).await {
                    Ok(class) => class.and_then(|c| c.value),
                    Err(e) => {
                        tracing::info!(workload = %self.workload.name, class = %name, error = %e,
                            "cannot read the PriorityClass: the lock template's priority applies");
                        None
                    }
                }
            }
        }
    }

    /// Held back: take the locks (claim or create each, one at a time in the global
    /// order), and start it once all are held for it, or say why not.
    async fn start_or_explain(self, settings: &Settings) -> Result<Action, GatingError> {
        if !has_finalizer(self.obj) {
            add_finalizer(&self.api, self.obj)
                .await
                .map_err(self.failed(GatingError::Finalizer))?;
            // The patched object comes back through the watch.
            return Ok(Action::await_change());
        }
        // Its containers cannot change any more: only its owner can add the guard, by
        // creating it anew. Checked before any lock is taken for it.
        if let Some(message) = decide::guard_missing(self.gate, self.obj.pod_spec()) {
            self.wait(EventType::Warning, "GuardMissing", message)
                .await?;
            return Ok(Action::await_change());
        }
        // Once per run (§6.7): which run it is, before any lock is taken for it.
        let scheduled = self.obj.scheduled_run();
        let run = match once::run_of(self.gate, scheduled, &settings.locks, W::KIND.name) {
            Ok(run) => run,
            Err(invalid) => {
                self.wait(
                    EventType::Warning,
                    "InvalidLockAnnotation",
                    invalid.to_string(),
                )
                .await?;
                return Ok(Action::await_change());
            }
        };
        let (run_key, run_owner) = match run {
            Some((key, owner)) => (Some(key.to_string()), owner),
            None => (None, None),
        };
        let terms = match self.own_lock_terms(run_key).await? {
            ControlFlow::Continue(terms) => terms,
            ControlFlow::Break(action) => return Ok(action),
        };
        let ordered = lockset::in_take_order(&self.locks, &settings.locks, &self.workload)
            .await
            .map_err(self.failed(GatingError::Order))?;
        let ordered = match ordered {
            Ok(ordered) => ordered,
            Err((type_, reason, message)) => {
                self.wait(type_, reason, message).await?;
                return Ok(Action::requeue(WAITING_RESYNC));
            }
        };
        let lost = self.obj.lost_fences(&ordered);
        let needed_delay = terms.needed_delay;
        let ran = match self
            .take(&ordered, &lost, terms, run_owner.as_ref())
            .await?
        {
            ControlFlow::Continue(ran) => ran,
            ControlFlow::Break(action) => return Ok(action),
        };
        let readiness = self
            .obj
            .ready_to_start(&self.api, !lost.is_empty(), &describe(&ordered))
            .await
            .map_err(self.failed(GatingError::ReadyToStart))?;
        match readiness {
            Readiness::Ready => self.start(&ordered, ran, needed_delay).await,
            Readiness::Wait(message) => {
                self.wait(EventType::Normal, "Waiting", message).await?;
                Ok(Action::await_change())
            }
            Readiness::Wrote => Ok(Action::await_change()),
        }
    }

    /// What its own locks take besides their template's spec: the lock-delay its Pods
    /// need (§6.3), its queue priority and weight (§6.4). Or, once the Warning says why
    /// it cannot start, the action to return.
    async fn own_lock_terms(
        &self,
        run_key: Option<String>,
    ) -> Result<ControlFlow<Action, OwnLockTerms>, GatingError> {
        let needed_delay =
            match stop::needed_lock_delay(self.obj.pod_spec(), &SafetyMargins::default()) {
                Ok(needed) => needed,
                Err(too_long) => {
                    let message = format!(
                        "not started: its Pods' {too_long}, so a contender could start while \
                     they still run"
                    );
                    self.wait(EventType::Warning, "LockDelayTooLong", message)
                        .await?;
                    return Ok(ControlFlow::Break(Action::await_change()));
                }
            };
        let priority = match decide::queue_priority(self.gate, self.obj.pod_spec()) {
            Ok(asked) => self.priority_value(asked).await,
            Err(invalid) => {
                self.wait(EventType::Warning, "InvalidPriority", invalid.to_string())
                    .await?;
                return Ok(ControlFlow::Break(Action::await_change()));
            }
        };
        let weight = match decide::queue_weight(self.gate) {
            Ok(weight) => weight,
            Err(invalid) => {
                self.wait(EventType::Warning, "InvalidWeight", invalid.to_string())
                    .await?;
                return Ok(ControlFlow::Break(Action::await_change()));
            }
        };
        Ok(ControlFlow::Continue(OwnLockTerms {
            needed_delay,
            priority,
            weight,
            run_key,
        }))
    }

    /// Takes `ordered`, one at a time (a lock it `lost` is let go and taken anew, once
    /// the processes of the run that lost it have ended): what it runs with once all
    /// are held, or, once the status says why not, the action to return.
    async fn take(
        &self,
        ordered: &[WorkloadLock],
        lost: &BTreeMap<String, i64>,
        terms: OwnLockTerms,
        run_owner: Option<&ObjectReference>,
    ) -> Result<ControlFlow<Action, RanWith>, GatingError> {
        let ended = if lost.is_empty() {
            None
        } else {
            self.observe_ended(self.obj).await?
        };
        let in_use_by = |name: &str| self.in_use_by(name);
        let taker = Taker {
            api: &self.locks,
            kinds: &self.ctx.kinds,
            workload: &self.workload,
            cluster: &self.ctx.config.cluster_name,
            in_use_by: &in_use_by,
            lost,
            ended: ended.as_ref(),
            terms,
        };
        let taking = taker
            .take(ordered)
            .await
            .map_err(self.failed(GatingError::Take))?;
        match taking {
            Taking::Held(ran) => Ok(ControlFlow::Continue(ran)),
            Taking::Waiting((type_, reason, message)) => {
                let recheck = match reason {
                    LOCK_IN_USE => IN_USE_RECHECK,
                    _ => WAITING_RESYNC,
                };
                self.wait(type_, reason, message).await?;
                Ok(ControlFlow::Break(Action::requeue(recheck)))
            }
            Taking::RunDone(why) => self.end_unrun(why, run_owner).await,
            Taking::Impossible(why) => {
                self.obj
                    .refuse(&self.api, &why)
                    .await
                    .map_err(self.failed(GatingError::Refuse))?;
                self.report(
                    EventType::Warning,
                    "Impossible",
                    format!("not started: {why}"),
                )
                .await?;
                Ok(ControlFlow::Break(Action::await_change()))
            }
        }
    }

    /// Its run is already completed (once per run, §6.7): ended without running, the
    /// kind's way, with an Event on it and on its owner (a CronJob) saying by whom.
    async fn end_unrun(
        &self,
        why: String,
        run_owner: Option<&ObjectReference>,
    ) -> Result<ControlFlow<Action, RanWith>, GatingError> {
        let kind = W::KIND.name;
        let ended = self
            .obj
            .end_unrun(&self.api)
            .await
            .map_err(self.failed(GatingError::Refuse))?;
        if !ended {
            let message = format!("not started: {why}; a {kind} cannot be ended unrun");
            self.wait(EventType::Warning, "RunCompleted", message)
                .await?;
            return Ok(ControlFlow::Break(Action::await_change()));
        }
        let message = format!("not run, {kind} deleted: {why}");
        tracing::info!(kind, name = %self.obj.name_any(), %why, "run already completed; ended unrun");
        self.event(self.obj, EventType::Normal, "RunCompleted", message.clone())
            .await;
        if let Some(owner) = run_owner {
            let note = format!("{kind} {} not run: {why}", self.obj.name_any());
            // Named as related: each skipped Job's Event keeps its own note.
            let job = self.obj.object_ref(&());
            self.ctx
                .events
                .publish_related(owner, Some(&job), EventType::Normal, "RunCompleted", note)
                .await;
        }
        Ok(ControlFlow::Break(Action::await_change()))
    }

    /// Another unfinished workload of this kind (from the cache) started with the named
    /// lock `name`: a claim removed by hand must not let this one start next to it. One
    /// whose locks were let go as its processes ended in success has no finalizer left
    /// (`let_go_in_success`): its kind may not say it finished yet, but nothing of it
    /// runs, and the next one must not wait for that.
    fn in_use_by(&self, name: &str) -> Option<String> {
        let started = |w: &W| w.running() && w.finished().is_none() && has_finalizer(w);
        super::in_use_by(W::KIND, &self.ctx.cache.state(), self.obj, name, started)
    }

    /// The kind's one write that sets the fences and lifts its gate.
    /// A lock whose delay is shorter than `needed` is warned about once, as it starts
    /// (the fence and the guard remain).
    async fn start(
        self,
        locks: &[WorkloadLock],
        ran: RanWith,
        needed: Duration,
    ) -> Result<Action, GatingError> {
        let message = format!("started holding {}", ran.describe());
        let started = self
            .obj
            .start(&self.api, &ran, locks, &message)
            .await
            .map_err(self.failed(GatingError::Start))?;
        tracing::info!(
            kind = W::KIND.name, name = %self.obj.name_any(), fences = ?ran.0,
            "started a gated workload"
        );
        self.event(&started, EventType::Normal, "Started", message)
            .await;
        for short in stop::too_short(&ran, needed) {
            self.event(&started, EventType::Warning, "LockDelayTooShort", short)
                .await;
        }
        Ok(Action::await_change())
    }
}

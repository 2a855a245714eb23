//! What a kind of gated workload is to the gating machine ([`GatedWorkload`]), and the
//! registry of the kinds one controller gates ([`Kinds`]).
//!
//! The machine ([`super::machine`]) knows every phase a gated workload goes through —
//! claim, take its locks in order, start with fences, watch for loss, stop per
//! `on-lock-lost`, let go — and asks the kind only what differs between kinds: where it
//! is held back (a Job's `suspend`, a Pod's scheduling gate, a Kueue Workload's
//! admission check), how it is started and stopped, where its fences go and when it
//! has finished. A kind is one file (`controller/jobs.rs`, `controller/pods.rs`,
//! `controller/kueue/workload.rs`) plus one line in the registry
//! (`controller::gated_kinds`); nothing here names one.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::PodSpec;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::STATUS_ANNOTATION;
use super::lockset::{RanWith, WorkloadLock};
use crate::config::ControllerConfig;
use crate::telemetry::Telemetry;

/// A kind of workload by name: what its claims, holder identities, owner references and
/// messages call it. Compared by value; one `static` per kind.
#[derive(Debug, PartialEq, Eq)]
pub struct Kind {
    /// `Job`, `Pod`, `Workload`: as in owner references and messages.
    pub name: &'static str,
    /// `batch/v1`, `v1`, `kueue.x-k8s.io/v1beta2`.
    pub api_version: &'static str,
    /// How a claim of this kind begins (see [`super::Workload::claim`]): `None` for
    /// `<name>/<uid>` — Jobs, the format since Job gating began; at most one kind —,
    /// `Some("pod")` for `pod/<name>/<uid>` (`workload` for Kueue Workloads). Names
    /// never contain `/`, so the forms cannot be confused.
    pub claim_prefix: Option<&'static str>,
    /// `blockOwnerDeletion` on the owner reference of the workload's own lock: where
    /// OwnerReferencesPermissionEnforcement runs it needs `update` on the owner's
    /// finalizers, and a workload that keeps our finalizer needs none.
    pub block_owner_deletion: bool,
    /// Whether its templates may live in another namespace (`NAMESPACE/NAME`): only for
    /// a kind whose templates a cluster administrator names (a Kueue Workload's, from
    /// its AdmissionCheck's cluster-scoped parameters), never from a workload's own
    /// annotations.
    pub templates_elsewhere: bool,
    /// The values of `lockwarden.io/on-lock-lost` this kind takes and what each means;
    /// the first is the default.
    pub on_lock_lost: &'static [(&'static str, OnLockLost)],
}

impl Kind {
    pub fn as_str(&self) -> &'static str {
        self.name
    }

    /// The `on-lock-lost` values this kind takes, for messages ("suspend, fail, ignore").
    pub fn on_lock_lost_allowed(&self) -> String {
        self.on_lock_lost
            .iter()
            .map(|(name, _)| *name)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// What `value` of `lockwarden.io/on-lock-lost` means for this kind.
    pub fn parse_on_lock_lost(&self, value: &str) -> Option<OnLockLost> {
        self.on_lock_lost
            .iter()
            .find(|(name, _)| *name == value)
            .map(|(_, policy)| *policy)
    }

    /// The default `on-lock-lost` (the first value listed).
    pub fn default_on_lock_lost(&self) -> OnLockLost {
        self.on_lock_lost[0].1
    }
}

/// What happens to a running workload whose lock is no longer held; each kind names
/// the values it takes (a Job's `suspend`, a Pod's `delete` and a Kueue Workload's
/// `retry` are all [`Stop`]).
///
/// [`Stop`]: OnLockLost::Stop
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnLockLost {
    /// Stop it the kind's way (a Job is suspended, a Pod deleted, a Kueue Workload sent
    /// back by its check); it waits for the lock again (a Job, a Workload) or its owner
    /// makes a new, gated one (a Pod).
    Stop,
    /// Stop it, mark it stopped by lockwarden and let its locks go; never started again.
    Fail,
    /// Keep it running; a Warning Event says the lock is no longer held.
    Ignore,
}

/// Whether a workload whose locks are all held may start now.
#[derive(Debug, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    /// Not yet: say this (Event `Waiting`) and wait for the workload to change.
    Wait(String),
    /// The kind wrote to the workload to get it ready; wait for it to come back.
    Wrote,
}

/// Why and with what a running workload is being stopped.
pub struct Stopping<'a> {
    /// `on-lock-lost: fail`: stopped for good.
    pub for_good: bool,
    /// Labels the metric and the Event: `Lost`, `LeaseExpiring`, `LockDeleted`, …
    pub reason: &'static str,
    pub why: &'a str,
    /// The locks, described ("lock db").
    pub locks: &'a str,
    /// The fences it ran with, as text ("3", or "db=3,bucket=7").
    pub fences: &'a str,
}

impl Stopping<'_> {
    /// "it ran with fence 3 and no longer holds lock db (Lost: …)": what every kind's
    /// stop message says happened.
    pub fn what_happened(&self) -> String {
        format!(
            "it ran with fence {} and no longer holds {} ({}: {})",
            self.fences, self.locks, self.reason, self.why
        )
    }
}

/// What the kind's stop did.
pub struct Stopped<W> {
    /// The workload as written, `None` if it was already gone.
    pub object: Option<W>,
    /// The Event reason: `Suspended`, `Stopped`, `Deleted`.
    pub event_reason: &'static str,
    pub message: String,
    /// Let the locks go now (the workload's processes are being stopped and it waits
    /// for its lock anew), rather than once the deleted workload has finished.
    pub let_go_now: bool,
}

/// A kind of workload lockwarden gates: how it is held back, started and stopped, where
/// its fences go, and when it has finished. Everything else — which locks, claiming,
/// the take order, loss, letting go, status and Events — is the machine's.
#[async_trait]
pub trait GatedWorkload:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Serialize
    + Debug
    + Send
    + Sync
    + 'static
{
    /// The kind by name.
    const KIND: &'static Kind;

    /// Whether this controller gates this kind (a kind that needs another project's
    /// API, like Kueue's Workloads, only when asked to). Claims of a kind not run are
    /// still recognised.
    fn enabled(_config: &ControllerConfig) -> bool {
        true
    }

    /// The watch over this kind (a label selector, e.g., keeps other objects out of
    /// the cache).
    fn watch_config() -> watcher::Config {
        watcher::Config::default()
    }

    /// How it ended (`Complete`, `Failed`, `Succeeded`), `None` while it may still run.
    /// A finished workload's locks are let go, so this must hold only once none of its
    /// processes can run any more.
    fn finished(&self) -> Option<&str>;

    /// Finished with success (`Complete`, `Succeeded`): the run it was is completed
    /// (docs/design.md §6.7). A failed workload's run is not.
    fn succeeded(&self) -> bool {
        matches!(self.finished(), Some("Complete" | "Succeeded"))
    }

    /// The run its owner scheduled, for once per run (§6.7): a Job's CronJob and
    /// scheduled time. `None` for kinds and workloads nobody scheduled.
    fn scheduled_run(&self) -> Option<Result<super::once::ScheduledRun, super::once::OnceError>> {
        None
    }

    /// Ends it without running it, because its run is already completed (§6.7): the
    /// kind's way (a Job is deleted: a suspended Job stays in its CronJob's active
    /// list and would block a `Forbid` CronJob). `Ok(false)`: the kind cannot, and it
    /// stays held back.
    async fn end_unrun(&self, _api: &Api<Self>) -> Result<bool, kube::Error> {
        Ok(false)
    }

    /// Started by lockwarden with fences and not stopped since.
    fn running(&self) -> bool;

    /// Held back by lockwarden's gate, so it can be started (a suspended Job, a Pod
    /// with the scheduling gate).
    fn held_back(&self) -> bool;

    /// Stopped for good by lockwarden (`on-lock-lost: fail`): never started again.
    fn stopped_for_good(&self) -> bool {
        false
    }

    /// The fences it was started with, per lock (`lockset::fences_of` on wherever the
    /// kind keeps them).
    fn fences(&self, locks: &[WorkloadLock]) -> Vec<(String, Option<i64>)>;

    /// Per lock, the fence of a run that lost it, for a kind that restarts the same
    /// object after a loss: that acquisition is let go and a new one taken.
    fn lost_fences(&self, _locks: &[WorkloadLock]) -> BTreeMap<String, i64> {
        BTreeMap::new()
    }

    /// Held back by lockwarden's gate without naming a lock: it would wait forever.
    /// What to tell its owner, `None` if this kind has no such state.
    fn gate_without_lock(&self) -> Option<String> {
        None
    }

    /// It names `what` (its locks, described) but was never held back, so it runs
    /// without them: the Warning's reason and message.
    fn not_held_back(&self, what: &str) -> (&'static str, String);

    /// The spec of its Pods (a Job's pod template, a Pod's own): their grace period and
    /// preStop hooks are what a lock-delay must cover (docs/design.md §6.3).
    fn pod_spec(&self) -> Option<&PodSpec>;

    /// Whether every process of it is observed ended, so that nothing of it can act any
    /// more and its locks may be released cleanly (docs/design.md §6.3). Asked of what
    /// the API server reports (the object, and its Pods where the kind has several).
    async fn processes_ended(&self, client: &kube::Client) -> Result<bool, kube::Error>;

    /// Whether every process of it is proven ended *and* it succeeded, by its kubelet's
    /// report of each container's exit, before its kind says it finished (a Job's
    /// `Complete` follows its Pods' `Succeeded`, which follows their containers' exits
    /// by a relist): its locks may then be let go at once, the run it was recorded as
    /// completed (docs/design.md §6.3, "Early hand-off"). `false` when that is not
    /// proven: it finishes as usual. `reports`: whether a guard's report on its Pod
    /// stands for its container's exit (§6.3, "Early hand-off: the guard's report").
    async fn ended_in_success(
        &self,
        _client: &kube::Client,
        _reports: super::stop::ExitReports,
    ) -> Result<bool, kube::Error> {
        Ok(false)
    }

    /// For a kind whose Pods are objects of their own (a Job's): the watch over Pods that
    /// wakes their owner's reconcile for [`GatedWorkload::ended_in_success`]. Each
    /// Pod maps to its controller, when that is of this kind.
    fn pods_watch() -> Option<watcher::Config> {
        None
    }

    /// Deletes its processes' Pods with their own grace period (never 0) when stopping
    /// it or once it is deleted, so their grace starts without waiting for another
    /// controller (a Job's Pods; a Pod's stop already deletes it).
    async fn delete_pods(&self, _client: &kube::Client) -> Result<(), kube::Error> {
        Ok(())
    }

    /// The annotations that name its locks and say how it reacts to losing them
    /// (`lockwarden.io/lock-template`, `on-lock-lost`, `priority`, `guard`, …): its own
    /// (Jobs, Pods), or what another object says for it (a Kueue Workload: its
    /// AdmissionCheck's parameters). Empty: it names no lock.
    async fn gate_annotations(
        &self,
        _client: &kube::Client,
    ) -> Result<BTreeMap<String, String>, kube::Error> {
        Ok(self.annotations().clone())
    }

    /// Shows why it still waits for its locks where its owner looks, besides the status
    /// annotation and Event the machine writes (a Kueue Workload: its admission
    /// check's message). `warning` says whether it waits on something a person must
    /// fix (a template that does not exist).
    async fn show_waiting(
        &self,
        _api: &Api<Self>,
        _message: &str,
        _warning: bool,
    ) -> Result<(), kube::Error> {
        Ok(())
    }

    /// It can never be started (`why`: it asks for more permits than its lock's key
    /// has): tells its owner where the kind shows that (a Kueue Workload: its check
    /// `Rejected`). The machine also reports it (status annotation, Warning).
    async fn refuse(&self, _api: &Api<Self>, _why: &str) -> Result<(), kube::Error> {
        Ok(())
    }

    /// Another controller admits it (Kueue, or a Job's `spec.managedBy`): what to say
    /// and why, `None` when lockwarden's gate is its only one. Such a workload is never
    /// held back, started or stopped by lockwarden: two controllers writing its gate
    /// would fight (docs/design.md §6.6). Asked only of a workload lockwarden has not
    /// started.
    async fn managed_elsewhere(
        &self,
        _client: &kube::Client,
        _config: &ControllerConfig,
    ) -> Result<Option<String>, kube::Error> {
        Ok(None)
    }

    /// The priority its owner gave it (`lockwarden.io/priority`, else its Pods'
    /// priority), for a lock's queue; `None` when it has none.
    fn priority(&self) -> Option<i32> {
        None
    }

    /// What must happen, once its locks are held, before it may start (a Job's Pods of
    /// a run that lost its lock must be gone first). `lost` says whether it ran before
    /// and lost a lock; `what` describes its locks.
    async fn ready_to_start(
        &self,
        _api: &Api<Self>,
        _lost: bool,
        _what: &str,
    ) -> Result<Readiness, kube::Error> {
        Ok(Readiness::Ready)
    }

    /// What the one write that starts it sets besides the status message: the fences
    /// where the kind keeps them and its gate lifted. [`start`](Self::start) adds the
    /// status annotation and the resourceVersion precondition, so no version of the
    /// workload runs without its fences.
    fn start_patch(&self, ran: &RanWith, locks: &[WorkloadLock]) -> serde_json::Value;

    /// Starts it: one merge patch of [`start_patch`](Self::start_patch), the status
    /// `message`, conditioned on the resourceVersion this reconcile read.
    async fn start(
        &self,
        api: &Api<Self>,
        ran: &RanWith,
        locks: &[WorkloadLock],
        message: &str,
    ) -> Result<Self, kube::Error> {
        let mut patch = self.start_patch(ran, locks);
        merge(
            &mut patch,
            json!({ "metadata": { "annotations": { STATUS_ANNOTATION: message } } }),
        );
        patch_as_read(api, self, patch).await
    }

    /// Stops it after a loss of its lock, conditioned on what this reconcile read (a
    /// workload changed meanwhile is looked at again first).
    async fn stop(
        &self,
        api: &Api<Self>,
        stop: &Stopping<'_>,
    ) -> Result<Stopped<Self>, kube::Error>;

    /// Counts a stop in this kind's metric (`lockwarden_jobs_stopped_total`, …).
    fn count_stopped(telemetry: &Telemetry, reason: &str);
}

/// Applies merge `patch` to `obj` conditioned on the resourceVersion this reconcile
/// read: a workload changed meanwhile is refused (409) and looked at again first.
pub async fn patch_as_read<W: GatedWorkload>(
    api: &Api<W>,
    obj: &W,
    mut patch: serde_json::Value,
) -> Result<W, kube::Error> {
    merge(
        &mut patch,
        json!({ "metadata": { "resourceVersion": obj.resource_version() } }),
    );
    api.patch(
        &obj.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
}

/// Merges `from` into `into` as a JSON merge patch would (RFC 7386, objects only).
pub fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
    match (into, from) {
        (serde_json::Value::Object(into), serde_json::Value::Object(from)) => {
            for (key, value) in from {
                merge(into.entry(key).or_insert(serde_json::Value::Null), value);
            }
        }
        (into, from) => *into = from,
    }
}

/// Who a claim annotation names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claimant {
    pub kind: &'static Kind,
    pub name: String,
    pub uid: String,
}

/// One registered kind, as the shared layer uses it without knowing its type.
#[async_trait]
trait Registered: Send + Sync {
    fn kind(&self) -> &'static Kind;

    /// Whether the workload `name` with `uid` exists and has not finished.
    async fn alive(
        &self,
        client: kube::Client,
        ns: &str,
        name: &str,
        uid: &str,
    ) -> Result<bool, kube::Error>;

    /// Whether the processes of workload `name` with `uid` are observed ended (it is
    /// gone, or another object now has its name: nothing of it is left to ask about).
    async fn processes_ended(
        &self,
        client: kube::Client,
        ns: &str,
        name: &str,
        uid: &str,
    ) -> Result<bool, kube::Error>;

    /// Whether this controller gates this kind.
    fn enabled(&self, config: &ControllerConfig) -> bool;

    /// Runs this kind's controller until its watch ends.
    fn run(
        &self,
        client: kube::Client,
        config: ControllerConfig,
        telemetry: Arc<Telemetry>,
        kinds: Kinds,
    ) -> BoxFuture<'static, ()>;
}

struct Of<W>(PhantomData<fn() -> W>);

impl<W: GatedWorkload> Of<W> {
    /// The workload `name` of `ns`, if it is still the one with `uid` (not gone, nor
    /// replaced by another object of the same name).
    async fn current(
        client: kube::Client,
        ns: &str,
        name: &str,
        uid: &str,
    ) -> Result<Option<W>, kube::Error> {
        Ok(Api::<W>::namespaced(client, ns)
            .get_opt(name)
            .await?
            .filter(|w| w.uid().as_deref() == Some(uid)))
    }
}

#[async_trait]
impl<W: GatedWorkload> Registered for Of<W> {
    fn kind(&self) -> &'static Kind {
        W::KIND
    }

    async fn alive(
        &self,
        client: kube::Client,
        ns: &str,
        name: &str,
        uid: &str,
    ) -> Result<bool, kube::Error> {
        Ok(Self::current(client, ns, name, uid)
            .await?
            .is_some_and(|w| w.finished().is_none()))
    }

    async fn processes_ended(
        &self,
        client: kube::Client,
        ns: &str,
        name: &str,
        uid: &str,
    ) -> Result<bool, kube::Error> {
        match Self::current(client.clone(), ns, name, uid).await? {
            Some(w) => w.processes_ended(&client).await,
            None => Ok(true),
        }
    }

    fn enabled(&self, config: &ControllerConfig) -> bool {
        W::enabled(config)
    }

    fn run(
        &self,
        client: kube::Client,
        config: ControllerConfig,
        telemetry: Arc<Telemetry>,
        kinds: Kinds,
    ) -> BoxFuture<'static, ()> {
        Box::pin(super::machine::run::<W>(client, config, telemetry, kinds))
    }
}

/// The kinds one controller gates: claims on a lock may name any of them.
#[derive(Clone, Default)]
pub struct Kinds(Vec<Arc<dyn Registered>>);

impl Kinds {
    /// Registers kind `W`.
    pub fn with<W: GatedWorkload>(mut self) -> Kinds {
        debug_assert!(
            W::KIND.claim_prefix.is_some()
                || self.0.iter().all(|k| k.kind().claim_prefix.is_some()),
            "at most one kind claims without a prefix"
        );
        self.0.push(Arc::new(Of::<W>(PhantomData)));
        self
    }

    /// The registration of `kind`, `None` if this build does not gate it.
    fn registered(&self, kind: &Kind) -> Option<&Arc<dyn Registered>> {
        self.0.iter().find(|k| k.kind() == kind)
    }

    /// Who `claim` names, `None` for a claim of a kind not registered here (a newer
    /// lockwarden's): such a claim is never taken to be stale.
    pub fn claimant(&self, claim: &str) -> Option<Claimant> {
        let prefixed = self.0.iter().map(|k| k.kind()).find_map(|kind| {
            let rest = claim.strip_prefix(kind.claim_prefix?)?.strip_prefix('/')?;
            // `pod/<uid>` is the claim of a Job named "pod": a prefixed claim has two
            // slashes.
            rest.contains('/').then_some((kind, rest))
        });
        let (kind, rest) = match prefixed {
            Some(found) => found,
            None => (
                self.0
                    .iter()
                    .map(|k| k.kind())
                    .find(|k| k.claim_prefix.is_none())?,
                claim,
            ),
        };
        let (name, uid) = rest.split_once('/').unwrap_or((rest, ""));
        Some(Claimant {
            kind,
            name: name.to_string(),
            uid: uid.to_string(),
        })
    }

    /// Whether the claimant exists (same uid) and has not finished. Asked of the API
    /// server, not a cache: a workload missing from a cache that is still filling must
    /// not lose its claim.
    pub async fn alive(
        &self,
        client: kube::Client,
        ns: &str,
        claimant: &Claimant,
    ) -> Result<bool, kube::Error> {
        match self.registered(claimant.kind) {
            Some(kind) => kind.alive(client, ns, &claimant.name, &claimant.uid).await,
            // Not a kind of ours: assume it lives rather than steal its claim.
            None => Ok(true),
        }
    }

    /// Whether the claimant's processes are observed ended (docs/design.md §6.3). A kind
    /// not registered here (a newer lockwarden's): assumed running, as in [`alive`].
    ///
    /// [`alive`]: Kinds::alive
    pub async fn processes_ended(
        &self,
        client: kube::Client,
        ns: &str,
        claimant: &Claimant,
    ) -> Result<bool, kube::Error> {
        match self.registered(claimant.kind) {
            Some(kind) => {
                kind.processes_ended(client, ns, &claimant.name, &claimant.uid)
                    .await
            }
            None => Ok(false),
        }
    }

    /// Runs the controller of every registered kind, side by side, until their watches
    /// end (they do not on their own).
    pub async fn run_all(
        &self,
        client: kube::Client,
        config: ControllerConfig,
        telemetry: Arc<Telemetry>,
    ) {
        let runs = self.0.iter().filter(|k| k.enabled(&config)).map(|k| {
            k.run(
                client.clone(),
                config.clone(),
                telemetry.clone(),
                self.clone(),
            )
        });
        futures::future::join_all(runs).await;
    }
}

/// Deletes `obj` through `api`, conditioned on its uid (never a newer object of the same
/// name), with `propagation` (`None`: the server's default). Already gone, or replaced
/// by a newer one (409), counts as deleted.
pub async fn delete_this<K: GatedWorkload>(
    api: &Api<K>,
    obj: &K,
    propagation: Option<kube::api::PropagationPolicy>,
) -> Result<(), kube::Error> {
    let params = kube::api::DeleteParams {
        propagation_policy: propagation,
        preconditions: Some(kube::api::Preconditions {
            uid: obj.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&obj.name_any(), &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

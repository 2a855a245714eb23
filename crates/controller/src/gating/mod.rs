//! The gating machine: what gating a workload on DistributedLocks takes, whatever the
//! kind of workload (docs/design.md §6, §6.1). The kinds registered in
//! `controller::gated_kinds` are Jobs (`controller/jobs.rs`), gated Pods
//! (`controller/pods.rs`) and Kueue Workloads (`controller/kueue/`, §6.6); nothing in
//! this folder names one.
//!
//! - this file: the annotations a workload names its locks with and lockwarden writes
//!   on it, [`Workload`] (a gated object as this layer sees it: kind, name, uid,
//!   namespace), the lock watch's mapping to workloads, and the Events;
//! - [`kind`]: what a kind is to the machine ([`GatedWorkload`]) and the registry of
//!   kinds a claim is parsed and judged stale by ([`Kinds`]);
//! - [`machine`]: one controller per kind, one method per phase;
//! - [`decide`]: the pure decisions (which locks the annotations name, a lock's
//!   standing, what follows a loss);
//! - [`locks`] and [`lockset`]: claiming, creating and letting go of DistributedLocks,
//!   several in one global order; [`running`]: a running workload's locks;
//!   [`stop`]: the lock-delay a workload's Pods need (§6.3); [`writes`]: the status
//!   annotation with an Event, and the release finalizer;
//! - `error.rs`: [`GatingError`], the step that failed.
//!
//! The kind decides only what differs between kinds: how a workload is held back,
//! started, stopped and judged finished, where its fences go, and what its claims,
//! holder identities and owner references call it.

pub mod decide;
mod error;
pub mod kind;
pub mod locks;
pub mod lockset;
pub mod machine;
pub mod once;
pub mod running;
pub mod stop;
pub mod writes;

pub use error::{GatingError, LockRequestFailed};
pub use kind::{Claimant, GatedWorkload, Kind, Kinds, OnLockLost, Readiness, Stopped, Stopping};
pub use machine::{Phase, Settings};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tokio::time::Instant;

use super::events::Events;
use lockwarden_api::DistributedLock;

/// Annotation: the workload claims the DistributedLock of this name (same namespace).
pub const LOCK_ANNOTATION: &str = "lockwarden.io/lock";
/// Annotation: the workload gets its own DistributedLock, spec copied from this one.
pub const TEMPLATE_ANNOTATION: &str = "lockwarden.io/lock-template";
/// Annotation: the workload claims each of these DistributedLocks (comma-separated).
pub const LOCKS_ANNOTATION: &str = "lockwarden.io/locks";
/// Annotation: the workload gets its own DistributedLock from each of these templates
/// (comma-separated).
pub const TEMPLATES_ANNOTATION: &str = "lockwarden.io/lock-templates";
/// Annotation: what to do once a running workload's lock is no longer held.
pub const ON_LOCK_LOST_ANNOTATION: &str = "lockwarden.io/on-lock-lost";
/// Annotation: `"true"` asks for the node-side guard in every container (`lockwarden
/// guard`, docs/design.md §6.3): the chart's admission policy adds it at creation, and
/// the controller does not start a workload whose containers lack it
/// ([`decide::guard_missing`]).
pub const GUARD_ANNOTATION: &str = "lockwarden.io/guard";
/// Annotation, beside [`GUARD_ANNOTATION`]: the guard is already in the workload's image
/// at this absolute path, which ends in `/lockwarden` so that the controller knows it
/// (`decide::runs_guard`). The chart's admission policy then wraps each command with it
/// and adds no init container: the kubelet starts the Pod's container without waiting
/// for an init container's exit at its next relist (docs/design.md §6.3).
pub const GUARD_PATH_ANNOTATION: &str = "lockwarden.io/guard-path";
/// Pod annotation prefix, the container's name after it: written by that container's
/// guard on its own Pod, once COMMAND exited 0 and no other process of the container
/// is left (docs/design.md §6.3, "Early hand-off: the guard's report"). Trusted only
/// with `--trust-guard-reports`, where the chart's policy confines who writes it.
pub const GUARD_REPORT_PREFIX: &str = "guard-ended.lockwarden.io/";
/// The value of the guard's report: the only one it writes.
pub const GUARD_REPORT_SUCCEEDED: &str = "succeeded";
/// Pod annotation prefix, the container's name after it: that container's guard waits
/// for a renewal before it starts COMMAND, and asks for one. The value: the revisions
/// its first reads showed, comma-separated; the controller renews at once each lock it
/// holds at one of them (`crate::guard_requests`, docs/design.md §6.3, "A renewal on
/// the guard's request"). Looked at only with `--trust-guard-reports`.
pub const GUARD_WAITING_PREFIX: &str = "guard-waiting.lockwarden.io/";
/// Annotation: how long a lock past its holder deadline may stay so before the
/// workload is stopped (a duration, less than [`decide::max_lost_grace`]; zero by
/// default).
pub const LOST_GRACE_ANNOTATION: &str = "lockwarden.io/lost-grace";
/// Annotation written by lockwarden (a Job's pod template, a Pod): the fencing token
/// the workload was started with.
pub const FENCE_ANNOTATION: &str = "lockwarden.io/fence";
/// Annotation written by lockwarden for a workload with several locks, instead of
/// [`FENCE_ANNOTATION`]: `NAME=FENCE` per lock, comma-separated, in the order they were
/// taken (e.g. `db=3,bucket=7`).
pub const FENCES_ANNOTATION: &str = "lockwarden.io/fences";
/// Annotation written by lockwarden next to the fence: the holder identity written in
/// the lock store.
pub const HOLDER_ANNOTATION: &str = "lockwarden.io/holder";
/// Annotation written by lockwarden next to the fence: the nonce of the acquisition the
/// workload was started with, which the node-side guard (`lockwarden guard`) finds in
/// the lock's record while the lock is held for it.
pub const NONCE_ANNOTATION: &str = "lockwarden.io/nonce";
/// Annotation written by lockwarden for several locks, instead of [`NONCE_ANNOTATION`]:
/// `NAME=NONCE` per lock, in the order of [`FENCES_ANNOTATION`].
pub const NONCES_ANNOTATION: &str = "lockwarden.io/nonces";
/// Annotation written by lockwarden next to the fence: the store URL of the lock
/// (`s3://bucket/key`, …), where the node-side guard reads the record.
pub const URL_ANNOTATION: &str = "lockwarden.io/url";
/// Annotation written by lockwarden for several locks, instead of [`URL_ANNOTATION`]:
/// `NAME=URL` per lock, space-separated (a ZooKeeper URL's server list has commas), in
/// the order of [`FENCES_ANNOTATION`].
pub const URLS_ANNOTATION: &str = "lockwarden.io/urls";
/// Workload annotation: the priority of its own locks made from a queued template
/// (docs/design.md §6.4); without it, its Pods' PriorityClass value.
pub const PRIORITY_ANNOTATION: &str = "lockwarden.io/priority";
/// Workload annotation: how many permits each of its own locks made from a queued
/// template takes (docs/design.md §6.4, `spec.weight`); without it, the template's.
/// lockwarden gives a Kueue Workload its Pod count when its check's parameters ask for
/// it (`weightFromPodCount`, §6.6).
pub const WEIGHT_ANNOTATION: &str = "lockwarden.io/weight";
/// Annotation written by lockwarden: why the workload is (still) gated, or what the
/// controller did.
pub const STATUS_ANNOTATION: &str = "lockwarden.io/status";
/// DistributedLock annotation: the workload that claims it ([`Workload::claim`]).
pub const CLAIM_ANNOTATION: &str = "lockwarden.io/claimed-by";

/// A gated object as the shared layer sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    pub kind: &'static Kind,
    pub name: String,
    pub uid: String,
    pub namespace: String,
}

/// `Job ns/name`: how logs and errors name it.
impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind.name, self.namespace, self.name)
    }
}

impl Workload {
    pub fn of<K: Resource>(kind: &'static Kind, obj: &K) -> Workload {
        let meta = obj.meta();
        Workload {
            kind,
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
        }
    }

    /// What the lock's claim annotation says: `<job>/<uid>` for a Job (the format
    /// since Job gating began), `<prefix>/<name>/<uid>` for other kinds (`pod/…`,
    /// `workload/…`; see
    /// [`Kind::claim_prefix`]). Names never contain `/`, so the forms cannot be
    /// confused.
    pub fn claim(&self) -> String {
        match self.kind.claim_prefix {
            None => format!("{}/{}", self.name, self.uid),
            Some(prefix) => format!("{prefix}/{}/{}", self.name, self.uid),
        }
    }

    /// The name of the workload's own lock: its name and the start of its uid, so a
    /// workload recreated under the same name never finds its predecessor's lock.
    pub fn own_lock_name(&self) -> String {
        format!("{}-{}", self.name, &self.uid[..self.uid.len().min(8)])
    }

    /// The name of DistributedLock `gate` is for this workload: a named lock's own
    /// name; for a template, the workload's own lock — suffixed with the template's
    /// name when the workload has several locks, so each template gets its own.
    pub fn lock_name(&self, gate: &decide::Gate, several: bool) -> String {
        match gate {
            decide::Gate::Named(name) => name.clone(),
            decide::Gate::Template(_) if !several => self.own_lock_name(),
            decide::Gate::Template(template) => {
                let (_, name) = decide::template_ref(template);
                format!("{}-{name}", self.own_lock_name())
            }
        }
    }

    /// The holder identity of the workload's own lock.
    pub fn holder(&self, cluster: &str) -> String {
        let kind = self.kind.as_str().to_lowercase();
        format!(
            "{cluster}/{}/{kind}/{}/{}",
            self.namespace, self.name, self.uid
        )
    }

    /// The workload as the controlling owner of its own lock (`blockOwnerDeletion` as
    /// its kind says: see [`Kind::block_owner_deletion`]).
    pub fn owner_reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: self.kind.api_version.into(),
            kind: self.kind.name.into(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(self.kind.block_owner_deletion),
        }
    }
}

/// The workloads of `kind` a change of `lock` concerns: its owner (a workload's own
/// lock), its claimant, and every cached workload of the lock's namespace that names it
/// as a lock (waiting for the claim to go) or a template (waiting for it to exist).
pub fn workloads_of_lock<K>(
    kind: &'static Kind,
    kinds: &Kinds,
    lock: &DistributedLock,
    cached: &[Arc<K>],
) -> Vec<ObjectRef<K>>
where
    K: Resource<DynamicType = ()>,
{
    let ns = lock.namespace().unwrap_or_default();
    let name = lock.name_any();
    let mut refs: Vec<ObjectRef<K>> = lock
        .owner_references()
        .iter()
        .filter(|o| o.kind == kind.name && o.api_version == kind.api_version)
        .map(|o| ObjectRef::new(&o.name).within(&ns))
        .collect();
    if let Some(claimant) = lock
        .annotations()
        .get(CLAIM_ANNOTATION)
        .and_then(|c| kinds.claimant(c))
        && claimant.kind == kind
    {
        refs.push(ObjectRef::new(&claimant.name).within(&ns));
    }
    refs.extend(
        cached
            .iter()
            .filter(|w| {
                w.namespace().as_deref() == Some(ns.as_str())
                    && decide::names_lock(w.annotations(), &name)
            })
            .map(|w| ObjectRef::from_obj(&**w)),
    );
    refs.sort_by(|a, b| a.name.cmp(&b.name));
    refs.dedup();
    refs
}

/// Another workload of `kind` in `this` one's namespace (from the cache) that was
/// started with the named lock `name` and has not finished (`started_and_running`): a
/// claim removed by hand must not let `this` start next to it. "Job x", "Pod x", …
pub fn in_use_by<K: Resource<DynamicType = ()>>(
    kind: &'static Kind,
    cached: &[Arc<K>],
    this: &K,
    name: &str,
    started_and_running: impl Fn(&K) -> bool,
) -> Option<String> {
    cached
        .iter()
        .find(|w| {
            w.namespace() == this.namespace()
                && w.uid() != this.uid()
                && decide::names_lock(w.annotations(), name)
                && started_and_running(w)
        })
        .map(|w| format!("{} {}", kind.as_str(), w.name_any()))
}

/// An Event about `obj`, referring to it with its resourceVersion: kube's Recorder
/// folds Events with the same reason about an equal object reference into one series
/// that keeps the first note, so referring to each new version makes each change of
/// text an Event of its own.
pub async fn event<K: Resource<DynamicType = ()>>(
    events: &Events,
    obj: &K,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let mut regarding = obj.object_ref(&());
    regarding.resource_version = obj.meta().resource_version.clone();
    events.publish(&regarding, type_, reason, note).await;
}

/// Workload uid → when this controller first saw its lock not held while it ran (for
/// `lockwarden.io/lost-grace`). In memory, so a controller restarted while a lock is
/// `LeaseExpiring` starts the grace afresh (a known limit: the restart itself usually
/// takes longer than the takeover gap, and the resumed lock then reports `Held` or
/// `Lost`).
#[derive(Default)]
pub struct NotHeldSince(Mutex<HashMap<String, Instant>>);

impl NotHeldSince {
    /// How long the lock of workload `uid` has been seen not held (zero the first time).
    pub fn not_held_for(&self, uid: &str) -> Duration {
        let mut since = self.0.lock().expect("not_held_since");
        since
            .entry(uid.to_string())
            .or_insert_with(Instant::now)
            .elapsed()
    }

    pub fn forget(&self, uid: &str) {
        self.0.lock().expect("not_held_since").remove(uid);
    }
}

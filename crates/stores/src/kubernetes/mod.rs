//! Kubernetes: a `coordination.k8s.io/v1` Lease per lock (docs/design.md §3 "Kubernetes
//! Lease"), compatible with client-go leader election.
//!
//! - `holderIdentity`, `leaseDurationSeconds`, `acquireTime`, `renewTime` are the
//!   fields client-go reads, so a lock held here holds off a leader-elected component
//!   and vice versa. A release empties `holderIdentity`, as client-go's does.
//! - `leaseTransitions` is the fence: every acquisition increments it.
//! - `metadata.resourceVersion` is the version every write is conditioned on.
//! - lockwarden's own fields (nonce, revision, exact lease, data, state) are
//!   annotations. A Lease without them (written by client-go) is read as held by its
//!   `holderIdentity`, with a nonce that can never be ours.
//! - Every update is a PUT of the Lease as read, with lockwarden's fields rewritten and
//!   everything else carried over: annotations, labels and spec fields of other
//!   writers — a newer lockwarden's `lockwarden.io/*` annotations included — stay as
//!   they are (docs/design.md §3 "Stored formats that can evolve"). A PUT (not a
//!   patch) so the `update` verb stays the only write a CLI Role needs.
//!   `lockwarden.io/*` annotations this build does not know are read into
//!   [`LockRecord::unknown`] and written back with the record.

//!
//! Modules: `key` (the URL `k8s://NAMESPACE/LEASE-NAME`), `object` (the URL of a
//! fenced write's object, `k8s://NAMESPACE/RESOURCE/NAME`); with the `kubernetes`
//! feature `store` (`LeaseStore`), `fenced` (fenced writes to other objects, checked by
//! the admission policy) and `connect`; the command line's `flags` with `cli`. Its part
//! of a DistributedLock's spec is lockwarden-api's.
//!
//! [`LockRecord::unknown`]: lockwarden_core::LockRecord::unknown

#[cfg(feature = "kubernetes")]
mod connect;
#[cfg(feature = "kubernetes")]
pub mod fenced;
#[cfg(feature = "cli")]
mod flags;
pub mod key;
pub mod object;
#[cfg(feature = "kubernetes")]
mod store;

use std::fmt;

#[cfg(feature = "kubernetes")]
pub use connect::connect;
#[cfg(feature = "cli")]
pub use flags::KubernetesFlags;
pub use key::LeaseKey;
pub use object::ObjectTarget;
#[cfg(feature = "kubernetes")]
pub use store::{LeaseStore, parse_lease};

/// How to reach the cluster of the Lease.
#[derive(Clone, Default)]
pub struct KubernetesOptions {
    /// kubeconfig context to use instead of the current one.
    pub context: Option<String>,
    /// A ready client (the operator's own); wins over `context`.
    #[cfg(feature = "kubernetes")]
    pub client: Option<kube::Client>,
}

impl fmt::Debug for KubernetesOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut f = f.debug_struct("KubernetesOptions");
        f.field("context", &self.context);
        #[cfg(feature = "kubernetes")]
        f.field("client", &self.client.as_ref().map(|_| "<set>"));
        f.finish()
    }
}

/// The tool whose clients poll this store's keys, for `--shared-with` (docs/design.md
/// §6.4, "Sharing a key with a tool that polls").
pub const POLLING_TOOL: crate::pollers::PollingTool = crate::pollers::PollingTool {
    name: "client-go",
    store: <LeaseKey as crate::store::StoreKey>::KIND,
    default_period: std::time::Duration::from_secs(2),
    why: "the retry period client-go's leader election examples use",
};

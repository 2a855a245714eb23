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
//! Modules: `key` (the URL `k8s://NAMESPACE/LEASE-NAME`), `spec`
//! (`spec.backend.kubernetes` of a DistributedLock), `store` ([`LeaseStore`]), `fenced`
//! (fenced writes to other objects, checked by the admission policy).
//!
//! [`LockRecord::unknown`]: crate::lock::LockRecord::unknown

pub mod fenced;
mod key;
mod spec;
mod store;

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use key::LeaseKey;
pub use spec::KubernetesBackend;
pub use store::{LeaseStore, parse_lease};

use crate::backend::store::ConnectError;
use crate::lock::{CasLock, LockBackend};

/// How to reach the cluster of the Lease.
#[derive(Clone, Default)]
pub struct KubernetesOptions {
    /// kubeconfig context to use instead of the current one.
    pub context: Option<String>,
    /// A ready client (the operator's own); wins over `context`.
    pub client: Option<kube::Client>,
}

impl fmt::Debug for KubernetesOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubernetesOptions")
            .field("context", &self.context)
            .field("client", &self.client.as_ref().map(|_| "<set>"))
            .finish()
    }
}

/// The command line's Kubernetes flag; a lock file saves it.
#[derive(clap::Args, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct KubernetesFlags {
    /// kubeconfig context [default: the current context]
    #[arg(long, value_name = "NAME")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kube_context: Option<String>,
}

impl KubernetesFlags {
    /// This flag, or `saved`'s.
    pub fn options(&self, saved: &KubernetesFlags) -> KubernetesOptions {
        KubernetesOptions {
            context: self
                .kube_context
                .clone()
                .or_else(|| saved.kube_context.clone()),
            client: None,
        }
    }
}

/// The lock at `key`: with the given client, else from `KUBECONFIG` /
/// `~/.kube/config` (the given context) / the in-cluster service account.
pub async fn connect(
    key: &LeaseKey,
    options: &KubernetesOptions,
) -> Result<Arc<dyn LockBackend>, ConnectError> {
    let client =
        match &options.client {
            Some(client) => client.clone(),
            None => client(options.context.as_deref()).await.map_err(|cause| {
                ConnectError::Kubernetes {
                    url: key.to_string(),
                    cause,
                }
            })?,
        };
    Ok(Arc::new(CasLock::new(LeaseStore::new(
        client,
        &key.namespace,
        &key.name,
    ))))
}

async fn client(context: Option<&str>) -> Result<kube::Client, String> {
    let config = match context {
        None => kube::Config::infer().await.map_err(|e| e.to_string())?,
        Some(context) => {
            let options = kube::config::KubeConfigOptions {
                context: Some(context.to_string()),
                ..Default::default()
            };
            kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|e| format!("context {context:?}: {e}"))?
        }
    };
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

/// The tool whose clients poll this store's keys, for `--shared-with` (docs/design.md
/// §6.4, "Sharing a key with a tool that polls").
pub const POLLING_TOOL: crate::backend::pollers::PollingTool =
    crate::backend::pollers::PollingTool {
        name: "client-go",
        store: <LeaseKey as crate::backend::store::StoreKey>::KIND,
        default_period: std::time::Duration::from_secs(2),
        why: "the retry period client-go's leader election examples use",
    };

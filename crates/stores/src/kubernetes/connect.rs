//! The Lease backend on a given client, or one from the kubeconfig (feature
//! `kubernetes`).

use std::sync::Arc;

use lockwarden_core::{CasLock, LockBackend};

use super::{KubernetesOptions, LeaseKey, LeaseStore};
use crate::store::ConnectError;

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

pub(super) async fn client(context: Option<&str>) -> Result<kube::Client, String> {
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

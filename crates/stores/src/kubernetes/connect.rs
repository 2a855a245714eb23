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
                    cause: cause.into(),
                }
            })?,
        };
    Ok(Arc::new(CasLock::new(LeaseStore::new(
        client,
        &key.namespace,
        &key.name,
    ))))
}

/// Why no Kubernetes client could be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Neither a kubeconfig nor the in-cluster service account.
    #[error(transparent)]
    Infer(#[from] kube::config::InferConfigError),
    /// The kubeconfig context asked for.
    #[error("context {context:?}: {source}")]
    Context {
        context: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// A configuration no client can be built from (its TLS settings, proxy, …).
    #[error(transparent)]
    Client(#[from] kube::Error),
}

/// A client from `KUBECONFIG` / `~/.kube/config` (the given context) / the
/// in-cluster service account.
pub(super) async fn client(context: Option<&str>) -> Result<kube::Client, ClientError> {
    let config = match context {
        None => kube::Config::infer().await?,
        Some(context) => {
            let options = kube::config::KubeConfigOptions {
                context: Some(context.to_string()),
                ..Default::default()
            };
            kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|source| ClientError::Context {
                    context: context.to_string(),
                    source,
                })?
        }
    };
    Ok(kube::Client::try_from(config)?)
}

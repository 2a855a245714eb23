//! The command line's Kubernetes flag (feature `cli`).

use serde::{Deserialize, Serialize};

use super::KubernetesOptions;

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
            #[cfg(feature = "kubernetes")]
            client: None,
        }
    }
}

//! `spec.backend.kubernetes` of a `DistributedLock`: a Lease, its admission rules (CEL,
//! and the same checks in Rust) and how it becomes a key.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::schema::{dns_label, dns_subdomain, immutable, optional_immutable};
use crate::store_spec::{SpecFieldError, StoreSpec, check, unchanged};
use lockwarden_core::names;
use lockwarden_stores::kubernetes::key::LeaseKey;

/// A coordination.k8s.io/v1 Lease.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::strip_nullable)]
#[x_kube(validation = optional_immutable("namespace"))]
pub struct KubernetesBackend {
    /// Name of the Lease.
    #[schemars(length(max = names::KUBERNETES_NAME_MAX_LEN))]
    #[x_kube(validation = dns_subdomain("leaseName"), validation = immutable("leaseName"))]
    pub lease_name: String,
    /// Namespace of the Lease; the DistributedLock's own namespace when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = names::KUBERNETES_NAMESPACE_MAX_LEN))]
    #[x_kube(validation = dns_label("namespace"))]
    pub namespace: Option<String>,
}

impl StoreSpec for KubernetesBackend {
    type Key = LeaseKey;

    fn key(&self, lock_namespace: &str) -> LeaseKey {
        LeaseKey {
            namespace: self
                .namespace
                .clone()
                .unwrap_or_else(|| lock_namespace.to_string()),
            name: self.lease_name.clone(),
        }
    }

    fn validate(&self) -> Result<(), SpecFieldError> {
        check(
            "kubernetes.leaseName",
            names::kubernetes_name(&self.lease_name),
        )?;
        if let Some(ns) = &self.namespace {
            check("kubernetes.namespace", names::kubernetes_namespace(ns))?;
        }
        Ok(())
    }

    fn validate_update(&self, old: &KubernetesBackend) -> Result<(), SpecFieldError> {
        unchanged("kubernetes.leaseName", &self.lease_name, &old.lease_name)?;
        unchanged("kubernetes.namespace", &self.namespace, &old.namespace)
    }
}

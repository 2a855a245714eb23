//! A Lease lock key, `k8s://NAMESPACE/LEASE-NAME`; its names follow Kubernetes' own
//! rules ([`lockwarden_core::names`]).

use std::fmt;

use crate::store::{StoreKey, TargetError, bad_name, split_two};
use lockwarden_core::names;

/// A `coordination.k8s.io/v1` Lease.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LeaseKey {
    pub namespace: String,
    pub name: String,
}

impl StoreKey for LeaseKey {
    const KIND: &'static str = "kubernetes";
    const SCHEMES: &'static [&'static str] = &["k8s", "kubernetes", "lease"];
    const FORM: &'static str = "k8s://NAMESPACE/LEASE-NAME";
    const ABOUT: &'static str = "Kubernetes coordination.k8s.io/v1 Lease";

    fn parse(url: &str, rest: &str) -> Result<LeaseKey, TargetError> {
        let (namespace, name) = split_two(url, rest, "namespace", "Lease name", Self::FORM)?;
        names::kubernetes_namespace(namespace).map_err(|e| bad_name(url, e, Self::FORM))?;
        names::kubernetes_name(name)
            .map_err(|e| bad_name(url, e.named("Lease name"), Self::FORM))?;
        Ok(LeaseKey {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    }

    fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "k8s://{}/{}", self.namespace, self.name)
    }
}

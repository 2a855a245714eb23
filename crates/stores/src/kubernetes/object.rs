//! The URL of a fenced write's Kubernetes object, `k8s://NAMESPACE/RESOURCE/NAME`
//! (plain data: parsed with or without the `kubernetes` feature; the write itself is
//! `fenced.rs`'s).

use crate::store::{TargetError, invalid};

/// The form of an object target, for messages.
pub const OBJECT_FORM: &str = "k8s://NAMESPACE/RESOURCE/NAME";

/// A namespaced object a fenced write targets: `k8s://NAMESPACE/RESOURCE/NAME`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectTarget {
    pub namespace: String,
    /// The plural, e.g. `configmaps`.
    pub resource: String,
    /// The API group, empty for the core group.
    pub group: String,
    pub name: String,
}

impl ObjectTarget {
    /// Whether `rest` (the URL after `SCHEME://`) names an object — three segments —
    /// rather than a Lease lock (`NAMESPACE/LEASE-NAME`).
    pub fn is_object_path(rest: &str) -> bool {
        rest.split('/').count() == 3
    }

    /// Parses `NAMESPACE/RESOURCE[.GROUP]/NAME`, the part of `url` after its scheme.
    pub fn parse(url: &str, rest: &str) -> Result<ObjectTarget, TargetError> {
        let parts: Vec<&str> = rest.split('/').collect();
        let [namespace, resource, name] = parts[..] else {
            return Err(invalid(url, "not NAMESPACE/RESOURCE/NAME", OBJECT_FORM));
        };
        for (part, what) in [
            (namespace, "namespace"),
            (resource, "resource"),
            (name, "name"),
        ] {
            if part.is_empty() {
                return Err(invalid(url, format!("the {what} is empty"), OBJECT_FORM));
            }
        }
        let (resource, group) = resource.split_once('.').unwrap_or((resource, ""));
        Ok(ObjectTarget {
            namespace: namespace.to_string(),
            resource: resource.to_ascii_lowercase(),
            group: group.to_string(),
            name: name.to_string(),
        })
    }

    pub fn url(&self) -> String {
        format!(
            "k8s://{}/{}/{}",
            self.namespace,
            self.resource_name(),
            self.name
        )
    }

    /// The resource as kubectl names it: `configmaps`, `deployments.apps`.
    pub(crate) fn resource_name(&self) -> String {
        if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_targets_name_namespace_resource_and_name() {
        let t = ObjectTarget::parse(
            "k8s://prod/deployments.apps/web",
            "prod/deployments.apps/web",
        )
        .unwrap();
        assert_eq!(
            (
                t.namespace.as_str(),
                t.resource.as_str(),
                t.group.as_str(),
                t.name.as_str()
            ),
            ("prod", "deployments", "apps", "web")
        );
        assert_eq!(t.url(), "k8s://prod/deployments.apps/web");
        let cm =
            ObjectTarget::parse("k8s://prod/configmaps/ledger", "prod/configmaps/ledger").unwrap();
        assert_eq!(cm.group, "");
        for bad in ["prod//x", "a/b/c/d", "/configmaps/x"] {
            let e = ObjectTarget::parse(bad, bad).unwrap_err();
            assert!(e.to_string().contains(OBJECT_FORM), "{e}");
        }
        assert!(ObjectTarget::is_object_path("prod/configmaps/ledger"));
        assert!(!ObjectTarget::is_object_path("prod/ledger"));
    }
}

//! Fenced writes to Kubernetes objects (README "Making the fence count").
//!
//! The API server checks the fence, not us: the chart's ValidatingAdmissionPolicy
//! (`fencing.admissionPolicy.enabled`, or manifests/fencing-admission-policy.yaml)
//! refuses an update of an object labelled `lockwarden.io/fenced: "true"` whose
//! `lockwarden.io/fence` is lower than the stored one or whose
//! `lockwarden.io/fence-lock` names another lock. The annotation is self-asserted: a
//! write that does not set it inherits the stored fence and would pass. This module
//! is the helper that always sets it, in the write itself, from the holder's own fence
//! (never one read back from the object).
//!
//! A write is a full replace conditioned on the `resourceVersion` just read (or a
//! create when the object does not exist), so two `put`s racing without the policy
//! still cannot both win; with the policy, a writer that bypasses `put` is checked too.
//!
//! Deletes are out of scope: admission sees no new object on a DELETE, so nothing can
//! compare its fence (docs/safety.md "What is not guaranteed").
//!
//! The target URL names the object the way kubectl does:
//! `k8s://NAMESPACE/RESOURCE/NAME`, RESOURCE a plural with its group when it has one
//! (`configmaps`, `secrets`, `deployments.apps`). A Lease lock's URL has two segments;
//! an object target always has three.

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;
use kube::discovery::{self, Scope};
use serde_json::Value;

/// The annotation carrying the fence that last wrote the object.
pub const FENCE_ANNOTATION: &str = "lockwarden.io/fence";
/// The annotation naming the lock whose fences the object compares.
pub const FENCE_LOCK_ANNOTATION: &str = "lockwarden.io/fence-lock";
/// The label the admission policy selects fenced objects by.
pub const FENCED_LABEL: &str = "lockwarden.io/fenced";

/// Races lost to another writer (409 Conflict on the replace, AlreadyExists on the
/// create) before `put` gives up; each retry re-reads the object. Holders of one lock
/// write one after another, so a lost race is rare; a write loses one only to a
/// write that succeeded in between.
const ATTEMPTS: u32 = 10;

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

/// The stored object, with the fence and lock that wrote it (if a fenced write did).
#[derive(Clone, Debug)]
pub struct StoredObject {
    pub object: DynamicObject,
    pub fence: Option<u64>,
    pub lock: Option<String>,
}

/// Why a fenced write to a Kubernetes object failed.
#[derive(Debug, thiserror::Error)]
pub enum FencedObjectError {
    #[error(
        "{0}: not a Kubernetes object target: expected k8s://NAMESPACE/RESOURCE/NAME, e.g. \
         k8s://prod/configmaps/ledger or k8s://prod/deployments.apps/web"
    )]
    Target(String),
    #[error("{target}: the API server serves no namespaced resource {resource}")]
    UnknownResource { target: String, resource: String },
    #[error("{target}: the manifest {problem}")]
    Manifest { target: String, problem: String },
    #[error("{target}: stale fence: object written by fence {stored}, yours is {yours}")]
    Stale {
        target: String,
        stored: u64,
        yours: u64,
    },
    #[error(
        "{target}: fenced by lock {stored}: a write fenced by lock {yours} is refused (fences of \
         different locks do not compare)"
    )]
    OtherLock {
        target: String,
        stored: String,
        yours: String,
    },
    #[error("{target}: stored {FENCE_ANNOTATION} is not a fence: {value:?}")]
    StoredFence { target: String, value: String },
    #[error("{target}: refused by the API server: {message}")]
    Refused { target: String, message: String },
    #[error("{target}: still losing races to other writers after {ATTEMPTS} attempts")]
    Contended { target: String },
    #[error("{target}: {source}")]
    Api {
        target: String,
        #[source]
        source: kube::Error,
    },
}

impl ObjectTarget {
    /// Parses `k8s://NAMESPACE/RESOURCE[.GROUP]/NAME`.
    pub fn parse(url: &str) -> Result<ObjectTarget, FencedObjectError> {
        let bad = || FencedObjectError::Target(url.to_string());
        let rest = url.strip_prefix("k8s://").ok_or_else(bad)?;
        let parts: Vec<&str> = rest.split('/').collect();
        let [namespace, resource, name] = parts[..] else {
            return Err(bad());
        };
        if [namespace, resource, name].iter().any(|s| s.is_empty()) {
            return Err(bad());
        }
        let (resource, group) = match resource.split_once('.') {
            Some((plural, group)) => (plural, group),
            None => (resource, ""),
        };
        Ok(ObjectTarget {
            namespace: namespace.to_string(),
            resource: resource.to_string(),
            group: group.to_string(),
            name: name.to_string(),
        })
    }

    /// Whether `url` has an object target's shape (three path segments), as opposed
    /// to a Lease lock's `k8s://NAMESPACE/NAME`.
    pub fn is_object_url(url: &str) -> bool {
        url.strip_prefix("k8s://")
            .is_some_and(|rest| rest.split('/').count() == 3)
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
    fn resource_name(&self) -> String {
        if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }

    fn api_error(&self, source: kube::Error) -> FencedObjectError {
        FencedObjectError::Api {
            target: self.url(),
            source,
        }
    }

    /// The API of the object's resource, found by discovery (its preferred version).
    async fn api(
        &self,
        client: &kube::Client,
    ) -> Result<(Api<DynamicObject>, ApiResource), FencedObjectError> {
        let unknown = || FencedObjectError::UnknownResource {
            target: self.url(),
            resource: self.resource_name(),
        };
        let group = match discovery::group(client, &self.group).await {
            Ok(group) => group,
            Err(kube::Error::Discovery(_)) => return Err(unknown()),
            Err(e) => return Err(self.api_error(e)),
        };
        let (resource, caps) = group
            .recommended_resources()
            .into_iter()
            .find(|(r, _)| r.plural == self.resource)
            .ok_or_else(unknown)?;
        if caps.scope != Scope::Namespaced {
            return Err(unknown());
        }
        let api = Api::namespaced_with(client.clone(), &self.namespace, &resource);
        Ok((api, resource))
    }
}

/// Reads the object and the fence that last wrote it; `None` if it does not exist.
pub async fn get(
    client: &kube::Client,
    target: &ObjectTarget,
) -> Result<Option<StoredObject>, FencedObjectError> {
    let (api, _) = target.api(client).await?;
    let Some(object) = api
        .get_opt(&target.name)
        .await
        .map_err(|e| target.api_error(e))?
    else {
        return Ok(None);
    };
    stored(target, object).map(Some)
}

/// Writes `manifest` (the whole object, YAML or JSON already parsed) as fence `fence`
/// of lock `lock`: sets the fence annotations and the fenced label in the write, then
/// creates the object or replaces it conditioned on the version just read. A stored
/// fence above `fence`, or another lock's, refuses the write before it is sent; the
/// admission policy refuses it again on the server if a newer write slipped in.
pub async fn put(
    client: &kube::Client,
    target: &ObjectTarget,
    manifest: Value,
    fence: u64,
    lock: &str,
) -> Result<DynamicObject, FencedObjectError> {
    let (api, resource) = target.api(client).await?;
    let mut object = manifest_object(target, &resource, manifest)?;
    let annotations = object.metadata.annotations.get_or_insert_default();
    annotations.insert(FENCE_ANNOTATION.into(), fence.to_string());
    annotations.insert(FENCE_LOCK_ANNOTATION.into(), lock.to_string());
    object
        .metadata
        .labels
        .get_or_insert_default()
        .insert(FENCED_LABEL.into(), "true".into());

    for _ in 0..ATTEMPTS {
        let current = api
            .get_opt(&target.name)
            .await
            .map_err(|e| target.api_error(e))?;
        let result = match current {
            None => {
                object.metadata.resource_version = None;
                api.create(&PostParams::default(), &object).await
            }
            Some(current) => {
                let stored = stored(target, current)?;
                check(target, &stored, fence, lock)?;
                object.metadata.resource_version = stored.object.metadata.resource_version;
                api.replace(&target.name, &PostParams::default(), &object)
                    .await
            }
        };
        match result {
            Ok(written) => return Ok(written),
            // Another writer got in between the read and the write: read again.
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(kube::Error::Api(status)) if status.code == 403 || status.code == 422 => {
                return Err(refusal(target, &status.message, fence, lock));
            }
            Err(e) => return Err(target.api_error(e)),
        }
    }
    Err(FencedObjectError::Contended {
        target: target.url(),
    })
}

/// The manifest as the object `target` names; a manifest naming another object is
/// refused rather than silently retargeted.
fn manifest_object(
    target: &ObjectTarget,
    resource: &ApiResource,
    manifest: Value,
) -> Result<DynamicObject, FencedObjectError> {
    let problem = |problem: String| FencedObjectError::Manifest {
        target: target.url(),
        problem,
    };
    let mut object: DynamicObject = serde_json::from_value(manifest)
        .map_err(|e| problem(format!("is not a Kubernetes object: {e}")))?;
    match object.metadata.name.as_deref() {
        None => object.metadata.name = Some(target.name.clone()),
        Some(name) if name == target.name => {}
        Some(name) => return Err(problem(format!("names object {name}, not {}", target.name))),
    }
    match object.metadata.namespace.as_deref() {
        None => object.metadata.namespace = Some(target.namespace.clone()),
        Some(ns) if ns == target.namespace => {}
        Some(ns) => {
            return Err(problem(format!(
                "is in namespace {ns}, not {}",
                target.namespace
            )));
        }
    }
    let Some(types) = &object.types else {
        return Err(problem("has no apiVersion and kind".into()));
    };
    if types.api_version != resource.api_version || types.kind != resource.kind {
        return Err(problem(format!(
            "is a {} {}, not one of {} ({} {})",
            types.api_version,
            types.kind,
            target.resource_name(),
            resource.api_version,
            resource.kind
        )));
    }
    Ok(object)
}

fn stored(target: &ObjectTarget, object: DynamicObject) -> Result<StoredObject, FencedObjectError> {
    let annotations = object.metadata.annotations.as_ref();
    let fence = match annotations.and_then(|a| a.get(FENCE_ANNOTATION)) {
        None => None,
        Some(value) => Some(
            value
                .parse::<u64>()
                .map_err(|_| FencedObjectError::StoredFence {
                    target: target.url(),
                    value: value.clone(),
                })?,
        ),
    };
    let lock = annotations
        .and_then(|a| a.get(FENCE_LOCK_ANNOTATION))
        .cloned();
    Ok(StoredObject {
        object,
        fence,
        lock,
    })
}

/// The same comparison the admission policy makes, before the write is sent, so the
/// refusal names both fences even where the policy is not installed.
fn check(
    target: &ObjectTarget,
    stored: &StoredObject,
    fence: u64,
    lock: &str,
) -> Result<(), FencedObjectError> {
    if let Some(stored_lock) = &stored.lock
        && stored_lock != lock
    {
        return Err(FencedObjectError::OtherLock {
            target: target.url(),
            stored: stored_lock.clone(),
            yours: lock.to_string(),
        });
    }
    match stored.fence {
        Some(stored) if stored > fence => Err(FencedObjectError::Stale {
            target: target.url(),
            stored,
            yours: fence,
        }),
        _ => Ok(()),
    }
}

/// The policy's refusal, read back into the error a stale holder expects; any other
/// refusal (RBAC, another policy) keeps the server's message.
fn refusal(target: &ObjectTarget, message: &str, fence: u64, lock: &str) -> FencedObjectError {
    let stale = message
        .split("stale fence: object written by fence ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.trim().parse::<u64>().ok());
    if let Some(stored) = stale {
        return FencedObjectError::Stale {
            target: target.url(),
            stored,
            yours: fence,
        };
    }
    if let Some((_, rest)) = message.split_once("fenced by lock ")
        && let Some((stored, _)) = rest.split_once(": a write fenced by")
    {
        return FencedObjectError::OtherLock {
            target: target.url(),
            stored: stored.to_string(),
            yours: lock.to_string(),
        };
    }
    FencedObjectError::Refused {
        target: target.url(),
        message: message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_targets_name_namespace_resource_and_name() {
        let t = ObjectTarget::parse("k8s://prod/deployments.apps/web").unwrap();
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
        let cm = ObjectTarget::parse("k8s://prod/configmaps/ledger").unwrap();
        assert_eq!(cm.group, "");
        for bad in [
            "k8s://prod/ledger",
            "s3://b/k",
            "k8s://prod//x",
            "k8s://a/b/c/d",
        ] {
            let e = ObjectTarget::parse(bad).unwrap_err();
            assert!(
                e.to_string().contains("k8s://NAMESPACE/RESOURCE/NAME"),
                "{e}"
            );
        }
        assert!(ObjectTarget::is_object_url("k8s://prod/configmaps/ledger"));
        assert!(!ObjectTarget::is_object_url("k8s://prod/ledger"));
    }

    #[test]
    fn the_policys_refusals_read_back_as_stale_or_other_lock() {
        let t = ObjectTarget::parse("k8s://prod/configmaps/ledger").unwrap();
        let stale = refusal(
            &t,
            "admission webhook denied ...: stale fence: object written by fence 6, yours is 5",
            5,
            "k8s://prod/ledger",
        );
        assert_eq!(
            stale.to_string(),
            "k8s://prod/configmaps/ledger: stale fence: object written by fence 6, yours is 5"
        );
        let other = refusal(
            &t,
            "...: fenced by lock s3://b/a: a write fenced by lock s3://b/c is refused",
            5,
            "s3://b/c",
        );
        assert!(
            matches!(other, FencedObjectError::OtherLock { ref stored, .. } if stored == "s3://b/a"),
            "{other}"
        );
        let rbac = refusal(&t, "configmaps is forbidden: User cannot update", 5, "x");
        assert!(matches!(rbac, FencedObjectError::Refused { .. }));
    }
}

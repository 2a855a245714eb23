//! Fenced writes to Kubernetes objects (docs/guide/fencing.md "Kubernetes objects").
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
//! an object target always has three. The data written is the whole object, as YAML or
//! JSON (what `kubectl get -o yaml` prints); `get` prints it back as YAML.

use async_trait::async_trait;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;
use kube::discovery::{self, Scope};
use serde_json::Value;

use super::{KubernetesOptions, ObjectTarget};
use lockwarden_core::FenceToken;
use lockwarden_core::fenced::{
    Content, Fence, FencedError, FencedObject, FencedRead, MAX_ATTEMPTS, Written,
};

/// The annotation carrying the fence that last wrote the object.
pub const FENCE_ANNOTATION: &str = "lockwarden.io/fence";
/// The annotation naming the lock whose fences the object compares.
pub const FENCE_LOCK_ANNOTATION: &str = "lockwarden.io/fence-lock";
/// The label the admission policy selects fenced objects by.
pub const FENCED_LABEL: &str = "lockwarden.io/fenced";

/// One Kubernetes object written only with fences ([`FencedObject`]).
pub struct FencedKubernetesObject {
    client: kube::Client,
    target: ObjectTarget,
    url: String,
}

/// The object `target` names, reached with `options`' client (or a new one from the
/// kubeconfig context it names).
pub async fn connect_fenced(
    target: &ObjectTarget,
    options: &KubernetesOptions,
) -> Result<Box<dyn FencedObject>, FencedError> {
    let client = match &options.client {
        Some(client) => client.clone(),
        None => super::connect::client(options.context.as_deref())
            .await
            .map_err(|cause| FencedError::Store {
                op: "connect".into(),
                detail: cause.to_string(),
                source: Some(Box::new(cause)),
            })?,
    };
    Ok(Box::new(FencedKubernetesObject::new(
        client,
        target.clone(),
    )))
}

impl FencedKubernetesObject {
    pub fn new(client: kube::Client, target: ObjectTarget) -> FencedKubernetesObject {
        let url = target.url();
        FencedKubernetesObject {
            client,
            target,
            url,
        }
    }

    /// The API of the object's resource, found by discovery (its preferred version).
    async fn api(&self) -> Result<(Api<DynamicObject>, ApiResource), FencedError> {
        let unknown = || {
            FencedError::Unsupported(format!(
                "the API server serves no namespaced resource {}",
                self.target.resource_name()
            ))
        };
        let group = match discovery::group(&self.client, &self.target.group).await {
            Ok(group) => group,
            Err(kube::Error::Discovery(_)) => return Err(unknown()),
            Err(e) => return Err(api_error("discover the resource", e)),
        };
        let (resource, caps) = group
            .recommended_resources()
            .into_iter()
            .find(|(r, _)| r.plural == self.target.resource)
            .ok_or_else(unknown)?;
        if caps.scope != Scope::Namespaced {
            return Err(unknown());
        }
        let api = Api::namespaced_with(self.client.clone(), &self.target.namespace, &resource);
        Ok((api, resource))
    }

    /// The manifest as the object the target names; a manifest naming another object
    /// or kind is refused rather than silently retargeted.
    fn object(
        &self,
        resource: &ApiResource,
        manifest: Value,
    ) -> Result<DynamicObject, FencedError> {
        let problem = |p: String| FencedError::InvalidData(format!("the manifest {p}"));
        let mut object: DynamicObject = serde_json::from_value(manifest)
            .map_err(|e| problem(format!("is not a Kubernetes object: {e}")))?;
        let target = &self.target;
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
}

#[async_trait]
impl FencedObject for FencedKubernetesObject {
    fn url(&self) -> &str {
        &self.url
    }

    /// Sets the fence annotations and the fenced label in the write, then creates the
    /// object or replaces it conditioned on the version just read. A stored fence above
    /// ours, or another lock's, refuses the write before it is sent; the admission
    /// policy refuses it again on the server if a newer write slipped in between.
    fn check_data(&self, data: &[u8]) -> Result<(), FencedError> {
        manifest_of(data).map(|_| ())
    }

    async fn put(&self, fence: &Fence, data: &[u8]) -> Result<Written, FencedError> {
        let manifest = manifest_of(data)?;
        let (api, resource) = self.api().await?;
        let mut object = self.object(&resource, manifest)?;
        let annotations = object.metadata.annotations.get_or_insert_default();
        annotations.insert(FENCE_ANNOTATION.into(), fence.token.to_string());
        annotations.insert(FENCE_LOCK_ANNOTATION.into(), fence.lock.clone());
        object
            .metadata
            .labels
            .get_or_insert_default()
            .insert(FENCED_LABEL.into(), "true".into());

        let mut last = String::new();
        for _ in 0..MAX_ATTEMPTS {
            let current = api
                .get_opt(&self.target.name)
                .await
                .map_err(|e| api_error("read", e))?;
            let result = match current {
                None => {
                    object.metadata.resource_version = None;
                    api.create(&PostParams::default(), &object).await
                }
                Some(current) => {
                    let stored = StoredFence::of(&current)?;
                    stored.check(fence)?;
                    object.metadata.resource_version = current.metadata.resource_version;
                    api.replace(&self.target.name, &PostParams::default(), &object)
                        .await
                }
            };
            match result {
                Ok(written) => {
                    return Ok(Written {
                        version: written.metadata.resource_version,
                    });
                }
                // Another writer got in between the read and the write: read again.
                Err(kube::Error::Api(status)) if status.code == 409 => last = status.message,
                Err(kube::Error::Api(status)) if status.code == 403 || status.code == 422 => {
                    return Err(refusal(&status.message, fence));
                }
                Err(e) => return Err(api_error("write", e)),
            }
        }
        Err(FencedError::Contended {
            attempts: MAX_ATTEMPTS,
            last,
        })
    }

    async fn get(&self) -> Result<Option<FencedRead>, FencedError> {
        let (api, _) = self.api().await?;
        let Some(object) = api
            .get_opt(&self.target.name)
            .await
            .map_err(|e| api_error("read", e))?
        else {
            return Ok(None);
        };
        let stored = StoredFence::of(&object)?;
        let yaml = serde_yaml_ng::to_string(&object).map_err(|e| FencedError::Store {
            op: "read".into(),
            detail: format!("cannot print the object: {e}"),
            source: Some(Box::new(e)),
        })?;
        Ok(Some(FencedRead {
            written_by: stored.fence.map(|token| Fence {
                token,
                lock: stored.lock.unwrap_or_default(),
            }),
            content: Content::Data(yaml.into_bytes()),
        }))
    }

    /// Deletes are out of scope: admission sees no new object on a DELETE, so nothing
    /// on the server could compare its fence, and a stale holder's delete would go
    /// through. Write a fenced update that marks the object done instead.
    async fn delete(&self, _fence: &Fence) -> Result<Written, FencedError> {
        Err(FencedError::Unsupported(
            "deletes of Kubernetes objects are not fenced (admission sees no new object on a \
             DELETE, so no fence can be compared): write a fenced update that marks the object \
             deleted, and remove it once no holder can write it"
                .into(),
        ))
    }
}

/// The fence and lock a stored object carries.
struct StoredFence {
    fence: Option<FenceToken>,
    lock: Option<String>,
}

impl StoredFence {
    fn of(object: &DynamicObject) -> Result<StoredFence, FencedError> {
        let annotations = object.metadata.annotations.as_ref();
        let fence = match annotations.and_then(|a| a.get(FENCE_ANNOTATION)) {
            None => None,
            Some(value) => Some(value.parse::<u64>().map(FenceToken).map_err(|_| {
                FencedError::store(
                    "read",
                    format!("the stored {FENCE_ANNOTATION} is not a fence: {value:?}"),
                )
            })?),
        };
        let lock = annotations
            .and_then(|a| a.get(FENCE_LOCK_ANNOTATION))
            .cloned();
        Ok(StoredFence { fence, lock })
    }

    /// The comparison the admission policy makes, before the write is sent, so the
    /// refusal names both fences even where the policy is not installed. An object
    /// that names no lock (fenced by `kubectl annotate` alone) compares fences only, as
    /// the policy does.
    fn check(&self, fence: &Fence) -> Result<(), FencedError> {
        if let Some(stored) = &self.lock
            && *stored != fence.lock
        {
            return Err(FencedError::OtherLock {
                stored: stored.clone(),
                yours: fence.lock.clone(),
            });
        }
        match self.fence {
            Some(stored) if stored > fence.token => Err(FencedError::Stale {
                stored,
                yours: fence.token,
                deleted: false,
            }),
            _ => Ok(()),
        }
    }
}

fn api_error(op: &str, e: kube::Error) -> FencedError {
    FencedError::Store {
        op: op.to_string(),
        detail: e.to_string(),
        source: Some(Box::new(e)),
    }
}

/// The policy's refusal, read back into the error a stale holder expects; any other
/// refusal (RBAC, another policy) keeps the server's message.
fn refusal(message: &str, fence: &Fence) -> FencedError {
    let stale = message
        .split_once("stale fence: object written by fence ")
        .and_then(|(_, rest)| rest.split(',').next())
        .and_then(|n| n.trim().parse::<u64>().ok());
    if let Some(stored) = stale {
        return FencedError::Stale {
            stored: FenceToken(stored),
            yours: fence.token,
            deleted: false,
        };
    }
    if let Some((_, rest)) = message.split_once("fenced by lock ")
        && let Some((stored, _)) = rest.split_once(": a write fenced by")
    {
        return FencedError::OtherLock {
            stored: stored.to_string(),
            yours: fence.lock.clone(),
        };
    }
    FencedError::store("write", format!("refused by the API server: {message}"))
}

/// The data of a put, as a manifest.
fn manifest_of(data: &[u8]) -> Result<Value, FencedError> {
    serde_yaml_ng::from_slice(data)
        .map_err(|e| FencedError::InvalidData(format!("the manifest is not YAML or JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policys_refusals_read_back_as_stale_or_other_lock() {
        let fence = Fence::new(5, "k8s://prod/ledger");
        let stale = refusal(
            "admission webhook denied ...: stale fence: object written by fence 6, yours is 5",
            &fence,
        );
        assert_eq!(
            stale.to_string(),
            "stale fence: object written by fence 6, yours is 5"
        );
        let other = refusal(
            "...: fenced by lock s3://b/a: a write fenced by lock s3://b/c is refused",
            &fence,
        );
        assert!(
            matches!(other, FencedError::OtherLock { ref stored, .. } if stored == "s3://b/a"),
            "{other}"
        );
        let rbac = refusal("configmaps is forbidden: User cannot update", &fence);
        assert!(matches!(rbac, FencedError::Store { .. }), "{rbac}");
    }

    #[test]
    fn a_stored_fence_refuses_lower_fences_and_other_locks() {
        let stored = StoredFence {
            fence: Some(FenceToken(6)),
            lock: Some("k8s://a/l".into()),
        };
        assert!(stored.check(&Fence::new(6, "k8s://a/l")).is_ok());
        assert!(stored.check(&Fence::new(7, "k8s://a/l")).is_ok());
        assert!(matches!(
            stored.check(&Fence::new(5, "k8s://a/l")),
            Err(FencedError::Stale { .. })
        ));
        assert!(matches!(
            stored.check(&Fence::new(9, "k8s://b/l")),
            Err(FencedError::OtherLock { .. })
        ));
        // Fenced by annotation alone (no lock named): fences compare, any lock.
        let bare = StoredFence {
            fence: Some(FenceToken(6)),
            lock: None,
        };
        assert!(bare.check(&Fence::new(6, "k8s://b/l")).is_ok());
    }
}

//! Writes to a gated object itself, whatever its kind: its status annotation (with an
//! Event) and our finalizer.

use std::fmt::Debug;

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::STATUS_ANNOTATION;
use crate::config::FINALIZER;
use crate::events::Events;

/// What the writes here need of a kind.
pub trait Gated: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug {}
impl<K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug> Gated for K {}

/// Writes `message` to the object's status annotation and records an Event, both only
/// when the message changed (a waiting workload is reconciled on every change of its
/// lock).
pub async fn report<K: Gated>(
    api: &Api<K>,
    events: &Events,
    obj: &K,
    type_: EventType,
    reason: &str,
    message: String,
) -> Result<(), kube::Error> {
    if obj.annotations().get(STATUS_ANNOTATION) == Some(&message) {
        return Ok(());
    }
    // The Event refers to the object as patched: see `super::event`.
    let patched = set_status(api, obj, &message).await?;
    super::event(
        events,
        patched.as_ref().unwrap_or(obj),
        type_,
        reason,
        message,
    )
    .await;
    Ok(())
}

/// Writes the status annotation; the patched object, or `None` when it already said
/// that.
pub async fn set_status<K: Gated>(
    api: &Api<K>,
    obj: &K,
    message: &str,
) -> Result<Option<K>, kube::Error> {
    if obj.annotations().get(STATUS_ANNOTATION).map(String::as_str) == Some(message) {
        return Ok(None);
    }
    let patch = json!({ "metadata": { "annotations": { STATUS_ANNOTATION: message } } });
    let patched = api
        .patch(
            &obj.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(Some(patched))
}

pub fn has_finalizer<K: Resource>(obj: &K) -> bool {
    obj.finalizers().iter().any(|f| f == FINALIZER)
}

/// The finalizer keeps a deleted workload around until its lock is let go (no garbage
/// collector is needed for that, and a named lock has no owner to collect it by).
pub async fn add_finalizer<K: Gated>(api: &Api<K>, obj: &K) -> Result<(), kube::Error> {
    let mut finalizers = obj.finalizers().to_vec();
    finalizers.push(FINALIZER.to_string());
    patch_finalizers(api, obj, finalizers).await
}

/// Dropped as soon as the lock is let go, so a finished workload never needs the
/// controller to be deleted.
pub async fn remove_finalizer<K: Gated>(api: &Api<K>, obj: &K) -> Result<(), kube::Error> {
    let finalizers: Vec<String> = obj
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    patch_finalizers(api, obj, finalizers).await
}

async fn patch_finalizers<K: Gated>(
    api: &Api<K>,
    obj: &K,
    finalizers: Vec<String>,
) -> Result<(), kube::Error> {
    // The list is replaced whole, so the resourceVersion guards other controllers'
    // finalizers against a lost update.
    let patch = json!({
        "metadata": { "resourceVersion": obj.resource_version(), "finalizers": finalizers },
    });
    match api
        .patch(
            &obj.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        // Already gone: nothing left to finalize.
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

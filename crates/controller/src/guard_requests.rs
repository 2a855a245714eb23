//! The guards' requests for a renewal (docs/design.md §6.3, "A renewal on the guard's
//! request"). A guard starts its COMMAND only once it has seen the lock's record change
//! after its first read (rule 9); on the schedule that is up to a renewal interval away.
//! So it annotates its own Pod with the revisions it read
//! (`guard-waiting.lockwarden.io/<container>`), and this watch of the Pods' metadata
//! asks the holder task of each lock held at one of them to renew at once.
//!
//! A request is an ordinary renewal ahead of its time, and only of a lock whose last
//! write is one the request names: once renewed, the same request (every later event of
//! its Pod) finds no lock at that revision and asks nothing. So a stray or forged
//! request costs a renewal at most. Run with `--trust-guard-reports`, where the chart's
//! policy lets a guard's role write on its own Pod and nowhere else.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};

use crate::gating::GUARD_WAITING_PREFIX;
use crate::holders::Holders;

/// Watches the metadata of the Pods in `namespace` (every namespace: `None`) until the
/// watch ends (it does not on its own), passing each guard's request to `holders`.
pub async fn run(client: kube::Client, namespace: Option<&str>, holders: &Holders) {
    // Metadata only: the annotations are all it reads.
    let pods: Api<PartialObjectMeta<Pod>> = match namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    watcher(pods, watcher::Config::default())
        .default_backoff()
        .touched_objects()
        .for_each(|pod| async move {
            match pod {
                Ok(pod) => forward(&pod, holders),
                Err(error) => tracing::debug!(%error, "watching Pods for guards' requests"),
            }
        })
        .await;
}

/// Passes `pod`'s requests, if it carries any, to `holders`.
fn forward(pod: &PartialObjectMeta<Pod>, holders: &Holders) {
    let revisions = requested_revisions(pod);
    if revisions.is_empty() {
        return;
    }
    let asked = holders.renew_where_seen(&revisions);
    if !asked.is_empty() {
        tracing::debug!(
            pod = %pod.name_any(),
            namespace = pod.meta().namespace.as_deref().unwrap_or_default(),
            locks = ?asked.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "renewing on the guard's request"
        );
    }
}

/// The revisions every guard of `pod` asks about (each container's annotation, its
/// value comma-separated).
fn requested_revisions(pod: &PartialObjectMeta<Pod>) -> Vec<&str> {
    pod.annotations()
        .iter()
        .filter(|(key, _)| key.starts_with(GUARD_WAITING_PREFIX))
        .flat_map(|(_, value)| value.split(','))
        .map(str::trim)
        .filter(|revision| !revision.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn pod(annotations: &[(&str, &str)]) -> PartialObjectMeta<Pod> {
        let metadata = ObjectMeta {
            name: Some("p".into()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        };
        PartialObjectMeta {
            types: None,
            metadata,
            _phantom: Default::default(),
        }
    }

    #[test]
    fn a_request_names_the_revisions_of_each_guard_of_the_pod_and_nothing_else_does() {
        let guarded = pod(&[
            ("guard-waiting.lockwarden.io/main", "r1, r2"),
            ("guard-waiting.lockwarden.io/side", "r3,"),
            ("guard-ended.lockwarden.io/main", "succeeded"),
            ("lockwarden.io/nonce", "n1"),
        ]);
        let mut revisions = requested_revisions(&guarded);
        revisions.sort_unstable();
        assert_eq!(revisions, ["r1", "r2", "r3"]);
        assert!(requested_revisions(&pod(&[("lockwarden.io/fence", "3")])).is_empty());
    }
}

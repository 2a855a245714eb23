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

use std::collections::HashSet;

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
    let mut events = std::pin::pin!(
        watcher(pods, watcher::Config::default())
            .default_backoff()
            .touched_objects()
    );
    let mut passed = Passed::default();
    while let Some(pod) = events.next().await {
        match pod {
            Ok(pod) => forward(&pod, &mut passed, holders),
            Err(error) => tracing::debug!(%error, "watching Pods for guards' requests"),
        }
    }
}

/// The revisions already passed to the holders. A request stays on its Pod, and every
/// later event of the Pod (each status update) carries it again: passed once, it is not
/// looked up among every held lock again.
#[derive(Default)]
struct Passed(HashSet<String>);

impl Passed {
    /// At most this many remembered; past it the memory starts afresh, which costs only
    /// a lookup that finds no lock at an old revision.
    const BOUND: usize = 4096;

    /// Those of `revisions` not passed before, remembered from now on.
    fn new_of<'a>(&mut self, revisions: Vec<&'a str>) -> Vec<&'a str> {
        if self.0.len() >= Self::BOUND {
            self.0.clear();
        }
        revisions
            .into_iter()
            .filter(|r| self.0.insert((*r).to_string()))
            .collect()
    }
}

/// Passes `pod`'s requests not passed before, if it carries any, to `holders`.
fn forward(pod: &PartialObjectMeta<Pod>, passed: &mut Passed, holders: &Holders) {
    let revisions = passed.new_of(requested_revisions(pod));
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

    #[test]
    fn a_request_is_passed_to_the_holders_once_whatever_events_carry_it_again() {
        let mut passed = Passed::default();
        assert_eq!(passed.new_of(vec!["r1", "r2"]), ["r1", "r2"]);
        assert!(
            passed.new_of(vec!["r1", "r2"]).is_empty(),
            "a status update"
        );
        assert_eq!(passed.new_of(vec!["r2", "r3"]), ["r3"], "a new request");
    }
}

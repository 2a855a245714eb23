//! Kueue (tests/support/kueue.rs) on a real node (tests/support/node.rs): the proof that
//! the environment a later test makes lockwarden an AdmissionCheck controller in works.
//! Kueue v0.17's manager runs against the node's API server with its CRDs (conversion
//! webhooks included) and webhook configurations pointed at 127.0.0.1; env.rs checks
//! that its Job webhook suspends a queued Job and makes its Workload, and that a queued
//! Job is admitted against a ClusterQueue's quota and runs to completion on the node.
//! admission.rs: lockwarden as Kueue's AdmissionCheck controller (docs/design.md §6.6);
//! examples.rs: every examples/kueue-*.yaml driven to the state it promises; loss.rs:
//! a Kueue Job's processes stop before the next holder after a loss.
//!
//! Run with `--test-threads=6` (the suite runner passes the same): every test has its
//! own namespace, ClusterQueue (namespace-scoped where it matters), controller identity
//! and keys, so nothing of one is another's business; the durations of the ones that
//! wait out real time come from `support::timescale`.

mod admission;
mod env;
mod examples;
mod loss;
use lockwarden_testsupport as support;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use support::kueue::{GROUP, Kueue, QUEUE_LABEL, resource};
use support::node::Node;
use support::{eventually, unique};

/// Generous: a loaded 2-core machine, and a Pod's start includes its image's unpacking.
pub const TIMEOUT: Duration = Duration::from_secs(240);

/// The node, Kueue on its control plane, an admin client and a fresh namespace.
pub async fn setup(prefix: &str) -> (&'static Node, Client, String) {
    let node = Node::shared();
    Kueue::shared();
    let client = node.client().await;
    let ns = node.namespace(&client, prefix).await;
    (node, client, ns)
}

/// Creates the Kueue object `kind` (`plural`), cluster-scoped unless `ns` is given.
pub async fn create(client: &Client, kind: &str, plural: &str, ns: Option<&str>, object: Value) {
    let resource = resource(kind, plural);
    let api = match ns {
        Some(ns) => Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resource),
        None => Api::<DynamicObject>::all_with(client.clone(), &resource),
    };
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{GROUP}/{}", resource.version),
        "kind": kind,
    }))
    .map(|o: DynamicObject| merge(o, object))
    .expect("a Kueue object");
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("create {kind} {:?}: {e}", object.name_any()));
}

/// `object` (with `metadata` and the rest) as a DynamicObject with `base`'s types.
fn merge(mut base: DynamicObject, mut object: Value) -> DynamicObject {
    base.metadata = serde_json::from_value(object["metadata"].take()).expect("metadata");
    object
        .as_object_mut()
        .expect("an object")
        .remove("metadata");
    base.data = object;
    base
}

/// A Job of one hostNetwork Pod running `script` in the node's busybox image, labelled
/// for LocalQueue `queue`, created unsuspended (Kueue's webhook suspends it).
pub fn queued_job(node: &Node, name: &str, queue: &str, script: &str) -> Job {
    serde_json::from_value(json!({
        "metadata": { "name": name, "labels": { QUEUE_LABEL: queue } },
        "spec": {
            "suspend": false,
            "backoffLimit": 0,
            "template": { "spec": {
                "hostNetwork": true,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "work",
                    "image": node.images().workload,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", script],
                    "resources": { "requests": { "cpu": "10m", "memory": "16Mi" } },
                }],
            }},
        },
    }))
    .expect("a Job")
}

/// The Workloads in `ns` owned by Job `job` (by UID).
pub async fn workloads_of(client: &Client, ns: &str, job: &Job) -> Vec<DynamicObject> {
    let uid = job.uid().expect("a stored Job has a UID");
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resource("Workload", "workloads"))
        .list(&ListParams::default())
        .await
        .map(|list| {
            list.items
                .into_iter()
                .filter(|w| {
                    w.owner_references()
                        .iter()
                        .any(|o| o.uid == uid && o.kind == "Job")
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `workload` has condition `type_` with status True.
pub fn condition(workload: &DynamicObject, type_: &str) -> bool {
    workload.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == type_ && c["status"] == "True")
}

/// A ClusterQueue (with a ResourceFlavor of its own) and a LocalQueue on it in `ns`.
pub struct Queues<'a> {
    /// Only `ns`'s Workloads (else every namespace's).
    pub namespace_only: bool,
    /// The AdmissionChecks it asks.
    pub checks: &'a [&'a str],
    /// Its nominal quota.
    pub cpu: &'a str,
    pub memory: &'a str,
    /// Its `spec.preemption`, if any.
    pub preemption: Option<Value>,
}

impl Queues<'_> {
    /// Creates them; the ClusterQueue's and the LocalQueue's names.
    pub async fn create(self, client: &Client, ns: &str) -> (String, String) {
        let (flavor, cluster_queue, queue) = (unique("rf"), unique("cq"), unique("lq"));
        create(
            client,
            "ResourceFlavor",
            "resourceflavors",
            None,
            json!({ "metadata": { "name": flavor }, "spec": {} }),
        )
        .await;
        let mut spec = json!({
            "namespaceSelector": {},
            "resourceGroups": [{
                "coveredResources": ["cpu", "memory"],
                "flavors": [{
                    "name": flavor,
                    "resources": [
                        { "name": "cpu", "nominalQuota": self.cpu },
                        { "name": "memory", "nominalQuota": self.memory },
                    ],
                }],
            }],
        });
        if self.namespace_only {
            spec["namespaceSelector"] =
                json!({ "matchLabels": { "kubernetes.io/metadata.name": ns } });
        }
        if !self.checks.is_empty() {
            let checks: Vec<Value> = self.checks.iter().map(|c| json!({ "name": c })).collect();
            spec["admissionChecksStrategy"] = json!({ "admissionChecks": checks });
        }
        if let Some(preemption) = self.preemption {
            spec["preemption"] = preemption;
        }
        create(
            client,
            "ClusterQueue",
            "clusterqueues",
            None,
            json!({ "metadata": { "name": cluster_queue }, "spec": spec }),
        )
        .await;
        create(
            client,
            "LocalQueue",
            "localqueues",
            Some(ns),
            json!({ "metadata": { "name": queue }, "spec": { "clusterQueue": cluster_queue } }),
        )
        .await;
        (cluster_queue, queue)
    }
}

/// Gives `job`'s container `FENCE`: the `lockwarden.io/fence` annotation Kueue's
/// podSetUpdates put on its Pods, through the downward API.
pub fn with_fence_env(mut job: Job) -> Job {
    let pod = job.spec.as_mut().unwrap().template.spec.as_mut().unwrap();
    pod.containers[0].env = Some(vec![
        serde_json::from_value(json!({
            "name": "FENCE",
            "valueFrom": { "fieldRef": {
                "fieldPath": "metadata.annotations['lockwarden.io/fence']",
            } },
        }))
        .unwrap(),
    ]);
    job
}

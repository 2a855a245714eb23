//! The Kueue environment's own proof: its webhooks are live on the real API server and
//! a queued Job goes through admission and runs on the node.

use crate::support::kueue::{GROUP, Kueue, QUEUE_LABEL, resource};
use crate::support::node::Node;
use crate::support::{eventually, unique};

use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use std::time::Duration;

/// Generous: a loaded 2-core machine, and a Pod's start includes its image's unpacking.
const TIMEOUT: Duration = Duration::from_secs(240);

/// The node, Kueue on its control plane, an admin client and a fresh namespace.
async fn setup(prefix: &str) -> (&'static Node, Client, String) {
    let node = Node::shared();
    Kueue::shared();
    let client = node.client().await;
    let ns = node.namespace(&client, prefix).await;
    (node, client, ns)
}

/// Creates the Kueue object `kind` (`plural`), cluster-scoped unless `ns` is given.
async fn create(client: &Client, kind: &str, plural: &str, ns: Option<&str>, object: Value) {
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
fn queued_job(node: &Node, name: &str, queue: &str, script: &str) -> Job {
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
async fn workloads_of(client: &Client, ns: &str, job: &Job) -> Vec<DynamicObject> {
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
fn condition(workload: &DynamicObject, type_: &str) -> bool {
    workload.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == type_ && c["status"] == "True")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueues_job_webhook_suspends_a_job_with_a_queue_name() {
    let (node, client, ns) = setup("kueue-webhook").await;
    // A LocalQueue whose ClusterQueue does not exist: the Job is Kueue's, never admitted.
    let queue = unique("lq");
    create(
        &client,
        "LocalQueue",
        "localqueues",
        Some(&ns),
        json!({
            "metadata": { "name": queue },
            "spec": { "clusterQueue": unique("no-such-cq") },
        }),
    )
    .await;
    let jobs = Api::<Job>::namespaced(client.clone(), &ns);
    let job = queued_job(node, "queued", &queue, "true");
    let stored = jobs
        .create(&PostParams::default(), &job)
        .await
        .expect("create the queued Job");
    assert_eq!(
        stored.spec.as_ref().and_then(|s| s.suspend),
        Some(true),
        "Kueue's Job webhook did not suspend the Job created with suspend: false"
    );
    // Still suspended as stored (not only in the create's answer).
    let read = jobs.get("queued").await.expect("read the Job");
    assert_eq!(read.spec.as_ref().and_then(|s| s.suspend), Some(true));

    let workload = eventually("a Workload owned by the Job", TIMEOUT, || async {
        workloads_of(&client, &ns, &stored).await.into_iter().next()
    })
    .await;
    assert_eq!(
        workload.data["spec"]["queueName"], queue,
        "the Workload's queueName: {:?}",
        workload.data["spec"]
    );
    assert!(
        !condition(&workload, "Admitted"),
        "a Workload of a LocalQueue without a ClusterQueue was admitted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kueue_managed_job_is_admitted_and_runs_to_completion_on_the_node() {
    let (node, client, ns) = setup("kueue-run").await;
    let (flavor, cluster_queue, queue) = (unique("rf"), unique("cq"), unique("lq"));
    create(
        &client,
        "ResourceFlavor",
        "resourceflavors",
        None,
        json!({ "metadata": { "name": flavor }, "spec": {} }),
    )
    .await;
    create(
        &client,
        "ClusterQueue",
        "clusterqueues",
        None,
        json!({
            "metadata": { "name": cluster_queue },
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [{
                    "coveredResources": ["cpu", "memory"],
                    "flavors": [{
                        "name": flavor,
                        "resources": [
                            { "name": "cpu", "nominalQuota": "1" },
                            { "name": "memory", "nominalQuota": "1Gi" },
                        ],
                    }],
                }],
            },
        }),
    )
    .await;
    create(
        &client,
        "LocalQueue",
        "localqueues",
        Some(&ns),
        json!({ "metadata": { "name": queue }, "spec": { "clusterQueue": cluster_queue } }),
    )
    .await;

    let jobs = Api::<Job>::namespaced(client.clone(), &ns);
    let job = jobs
        .create(
            &PostParams::default(),
            &queued_job(node, "work", &queue, "echo admitted-and-ran"),
        )
        .await
        .expect("create the queued Job");
    assert_eq!(job.spec.as_ref().and_then(|s| s.suspend), Some(true));

    let workload = eventually("the Job's Workload to be Admitted", TIMEOUT, || async {
        workloads_of(&client, &ns, &job)
            .await
            .into_iter()
            .find(|w| condition(w, "Admitted"))
    })
    .await;
    assert_eq!(
        workload.data["status"]["admission"]["clusterQueue"], cluster_queue,
        "admitted by another ClusterQueue: {:?}",
        workload.data["status"]
    );

    eventually("the Job to complete on the node", TIMEOUT, || async {
        let job = jobs.get("work").await.ok()?;
        let status = job.status?;
        if let Some(failed) = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Failed" && c.status == "True")
        {
            panic!(
                "the Job failed: {failed:?}; kubelet log:\n{}",
                node.kubelet_log_tail(40)
            );
        }
        status
            .conditions?
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True")
            .then_some(())
    })
    .await;
    let finished = eventually("the Workload to be Finished", TIMEOUT, || async {
        workloads_of(&client, &ns, &job)
            .await
            .into_iter()
            .find(|w| condition(w, "Finished"))
    })
    .await;
    assert!(
        condition(&finished, "Admitted"),
        "the finished Workload lost its Admitted condition: {:?}",
        finished.data["status"]["conditions"]
    );
}

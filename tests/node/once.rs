//! Once per run with one cluster on the real node and one without (docs/design.md
//! §6.7; tests/once.rs covers the rest without a kubelet). The node's cluster is the
//! release's controller in a Pod; the other is the binary's shared control plane with an
//! in-process controller, whose Jobs' Pods the test finishes as a kubelet would. Both
//! clusters' CronJobs gate one S3 key once per run.
//!
//! - a time the node runs: its container writes to a loopback register with its fence;
//!   the other cluster's Job for the same time is deleted unrun, with an Event naming
//!   the node's cluster and fence;
//! - a time the other cluster runs: the node's Job for it is deleted before any Pod of
//!   it starts, so its container never writes.
//!
//! `scripts/chaos --once N` runs N times (`LOCKWARDEN_ONCE_TIMES`), every third one a
//! run that fails on the node and is taken up by the other cluster (docs/testing.md).

use std::time::{Duration, SystemTime};

use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use lockwarden::api::DistributedLock;
use lockwarden::controller::gating::once::RUN_KEY_ANNOTATION;
use lockwarden::controller::jobs::{FENCE_ANNOTATION, template_annotation};
use serde_json::{Value, json};

use super::stop::ensure_aws_secret;
use super::{CLUSTER_NAME, ONCE_NAMESPACE, TIMEOUT, with_controller};
use crate::support::kube::{ControlPlane, finish_pods, namespace_with_controller};
use crate::support::locks::{aws_secret, s3_lock, timed};
use crate::support::moto::Moto;
use crate::support::once::{cronjob, scheduled_job};
use crate::support::trials::{Register, direct_s3_backend};
use crate::support::{eventually, unique};

/// How many lines the node's container writes, 100 ms apart.
const WRITES: usize = 10;

/// One cluster's side of the test: where its Jobs and Events are.
struct Side {
    name: &'static str,
    client: Client,
    ns: String,
    cron: CronJob,
}

impl Side {
    fn jobs(&self) -> Api<Job> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// The Job the CronJob controller would create for `slot`, with the slot as its run
    /// key (the two clusters' namespaces differ), created.
    async fn job_for(&self, slot: SystemTime, fails: bool) -> Job {
        let mut job = scheduled_job(&self.cron, slot);
        job.annotations_mut()
            .insert(RUN_KEY_ANNOTATION.into(), lockwarden::lock::rfc3339(slot));
        if fails {
            let pod = job.spec.as_mut().and_then(|s| s.template.spec.as_mut());
            let container = &mut pod.expect("a pod spec").containers[0];
            container
                .env
                .get_or_insert_with(Vec::new)
                .push(serde_json::from_value(json!({ "name": "FAIL", "value": "1" })).unwrap());
        }
        self.jobs()
            .create(&PostParams::default(), &job)
            .await
            .unwrap_or_else(|e| panic!("create a Job in {}: {e}", self.name))
    }

    /// Waits until lockwarden started Job `name`; its fence.
    async fn started(&self, name: &str) -> i64 {
        eventually(
            &format!("{} started {name}", self.name),
            TIMEOUT,
            || async {
                let job = self.jobs().get(name).await.ok()?;
                template_annotation(&job, FENCE_ANNOTATION)?.parse().ok()
            },
        )
        .await
    }

    /// Waits until Job `name` is gone (deleted unrun).
    async fn gone(&self, name: &str) {
        eventually(
            &format!("{}'s Job {name} deleted", self.name),
            TIMEOUT,
            || async { matches!(self.jobs().get_opt(name).await, Ok(None)).then_some(()) },
        )
        .await
    }

    /// The Pods Job `name` has (the Job controller's label).
    async fn pods_of(&self, name: &str) -> Vec<Pod> {
        Api::<Pod>::namespaced(self.client.clone(), &self.ns)
            .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={name}")))
            .await
            .map(|l| l.items)
            .unwrap_or_default()
    }

    /// Waits for a `RunCompleted` Event on this side's CronJob naming `cluster` (`in
    /// cluster NAME`) and `fence`.
    async fn says_who_ran(&self, cluster: &str, fence: i64) {
        let what = format!(
            "{}'s CronJob saying the time ran {cluster} with fence {fence}",
            self.name
        );
        eventually(&what, TIMEOUT, || async {
            let notes = self.skips_on_the_cronjob().await;
            notes
                .iter()
                .any(|n| n.contains(cluster) && n.contains(&format!("fence {fence}")))
                .then_some(())
        })
        .await
    }

    /// The notes of the `RunCompleted` Events on this side's CronJob.
    async fn skips_on_the_cronjob(&self) -> Vec<String> {
        let events = Api::<Event>::namespaced(self.client.clone(), &self.ns)
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        events
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("RunCompleted"))
            .filter(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(&self.cron.name_any())
            })
            .filter_map(|e| e.note)
            .collect()
    }
}

/// The node's Pod: on the host network, it writes `WRITES` lines `WRITER FENCE N` to the
/// register on the host's loopback through busybox's nc, its fence from its annotation;
/// it then fails if its environment has `FAIL=1`.
fn node_pod(image: &str, register: u16) -> Value {
    let script = format!(
        "i=0; while [ $i -lt {WRITES} ]; do i=$((i+1)); echo \"$WRITER $LOCKWARDEN_FENCE $i\"; \
         sleep 0.1; done | nc 127.0.0.1 {register}; [ \"${{FAIL:-}}\" != 1 ]"
    );
    json!({
        "hostNetwork": true,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [{
            "name": "run", "image": image, "imagePullPolicy": "Never",
            "command": ["sh", "-c", script],
            "env": [
                { "name": "WRITER", "valueFrom": { "fieldRef": {
                    "fieldPath": "metadata.labels['batch.kubernetes.io/job-name']" } } },
                { "name": "LOCKWARDEN_FENCE", "valueFrom": { "fieldRef": {
                    "fieldPath": "metadata.annotations['lockwarden.io/fence']" } } },
            ],
        }],
    })
}

/// The other cluster's Pod: never started by a kubelet (the test finishes it).
fn elsewhere_pod() -> Value {
    json!({
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [{ "name": "run", "image": "busybox", "command": ["true"] }],
    })
}

/// Acceptance (issue 43, on the real node): one cluster with the node, one without,
/// CronJobs gating one S3 key once per run. A time the node runs is written to the
/// register by its container, once, with its fence, and the other cluster's Job for it
/// is deleted unrun with an Event naming the node's cluster; a time the other cluster
/// runs has the node's Job deleted before any Pod of it wrote. The key's memory holds
/// both times, each with the fence of the cluster that ran it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_a_run_on_the_node_runs_once_across_two_clusters_and_the_skipped_job_never_starts() {
    let (node, client, _shared) = with_controller().await;
    ensure_aws_secret(&client, ONCE_NAMESPACE).await;
    // The other cluster: the binary's shared control plane, a controller in-process.
    ControlPlane::shared();
    let (client_b, ns_b) = namespace_with_controller("once-b", "cluster-b").await;
    let secret_b = aws_secret(&client_b, &ns_b).await;

    let moto = Moto::shared();
    let bucket = moto.new_bucket("once-node").await;
    let key = unique("once");
    let template = unique("nightly");
    let (port, register) = Register::serve().await;
    let mut sides = Vec::new();
    for (name, client, ns, secret, pod) in [
        (
            CLUSTER_NAME,
            client.clone(),
            ONCE_NAMESPACE.to_string(),
            "aws",
            node_pod(&node.images().workload, port),
        ),
        (
            "cluster-b",
            client_b,
            ns_b,
            secret_b.name.as_str(),
            elsewhere_pod(),
        ),
    ] {
        let mut lock = timed(
            s3_lock(&template, &bucket, &key, moto.endpoint(), secret),
            "10s",
            "3s",
        );
        lock.spec.release = true;
        Api::<DistributedLock>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &lock)
            .await
            .unwrap_or_else(|e| panic!("create the template in {name}: {e}"));
        let cron = Api::<CronJob>::namespaced(client.clone(), &ns)
            .create(
                &PostParams::default(),
                &cronjob(&template, "0 2 * * *", true, &template, pod),
            )
            .await
            .unwrap_or_else(|e| panic!("create the CronJob in {name}: {e}"));
        sides.push(Side {
            name,
            client,
            ns,
            cron,
        });
    }
    let (on_node, elsewhere) = (&sides[0], &sides[1]);
    let count = times();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let first = now / 60 * 60 - 60 * (count as u64 + 1);
    let mut expected = Vec::new();
    for i in 0..count {
        let time = SystemTime::UNIX_EPOCH + Duration::from_secs(first + 60 * i as u64);
        let how = [Time::NodeRuns, Time::ElsewhereRuns, Time::NodeFails][i % 3];
        let (fence, cluster) = how.run(time, on_node, elsewhere, &register).await;
        println!(
            "once on the node: {} {how:?}: ran once, in {cluster} with fence {fence}",
            lockwarden::lock::rfc3339(time)
        );
        expected.push((
            lockwarden::lock::rfc3339(time),
            fence,
            Some(cluster.to_string()),
        ));
    }

    // The key's memory: each time once, with the fence of the cluster that ran it.
    let stored = direct_s3_backend(&bucket, &key)
        .await
        .inspect()
        .await
        .expect("read the record")
        .expect("a record");
    let record = stored.record.expect("lockwarden's record");
    let runs: Vec<(String, u64, Option<String>)> = record
        .runs
        .runs
        .iter()
        .map(|r| (r.run.clone(), r.fence.0, r.cluster.clone()))
        .collect();
    assert_eq!(runs, expected, "the memory of the key");
}

/// `LOCKWARDEN_ONCE_TIMES`: how many scheduled times the test runs (2 in the suite: the
/// node runs one, the other cluster the next; `scripts/chaos --once N` runs more, every
/// third one failing on the node).
fn times() -> usize {
    std::env::var("LOCKWARDEN_ONCE_TIMES")
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("LOCKWARDEN_ONCE_TIMES: not a number: {v:?}"))
        })
        .unwrap_or(2)
}

/// Who gets to run one scheduled time, and how it ends.
#[derive(Clone, Copy, Debug)]
enum Time {
    /// The node's Job first: its container writes and succeeds; the other cluster's Job
    /// waits on the key, then is deleted unrun.
    NodeRuns,
    /// The other cluster's Job first: the node's Job waits on the key, then is deleted
    /// before a Pod of it starts.
    ElsewhereRuns,
    /// The node's Job first, and its container exits 1 after its writes: nothing is
    /// recorded, and the other cluster's waiting Job runs the time.
    NodeFails,
}

impl Time {
    /// Drives one time through both clusters and checks it ran once; the fence and the
    /// cluster of the run that completed it.
    async fn run(
        self,
        time: SystemTime,
        on_node: &Side,
        elsewhere: &Side,
        register: &Register,
    ) -> (u64, &'static str) {
        match self {
            Time::NodeRuns | Time::NodeFails => {
                let fails = matches!(self, Time::NodeFails);
                let node_job = on_node.job_for(time, fails).await.name_any();
                let node_fence = on_node.started(&node_job).await;
                let other = elsewhere.job_for(time, false).await.name_any();
                let lines =
                    eventually("the node's container wrote every line", TIMEOUT, || async {
                        let lines = register.lines_of(&node_job);
                        (lines.len() >= WRITES).then_some(lines)
                    })
                    .await;
                assert!(
                    lines
                        .iter()
                        .all(|l| l.split(' ').nth(1) == Some(&node_fence.to_string())),
                    "the node's container wrote with its fence {node_fence}: {lines:?}"
                );
                if !fails {
                    elsewhere.gone(&other).await;
                    assert_eq!(lines.len(), WRITES, "the time ran once: {lines:?}");
                    assert!(
                        elsewhere.pods_of(&other).await.is_empty(),
                        "the skipped Job had Pods"
                    );
                    elsewhere
                        .says_who_ran(&format!("in cluster {CLUSTER_NAME}"), node_fence)
                        .await;
                    return (node_fence as u64, CLUSTER_NAME);
                }
                // The failed run is not recorded: the other cluster's Job runs the time.
                let fence = elsewhere.started(&other).await;
                assert!(fence > node_fence, "fences {node_fence} then {fence}");
                finish_pods(&elsewhere.client, &elsewhere.ns, &other, true).await;
                (fence as u64, "cluster-b")
            }
            Time::ElsewhereRuns => {
                let ran = elsewhere.job_for(time, false).await.name_any();
                let fence = elsewhere.started(&ran).await;
                let node_skipped = on_node.job_for(time, false).await.name_any();
                // The node's Job is held back while the other cluster's run holds the key.
                eventually("the node's Job waiting on the key", TIMEOUT, || async {
                    let job = on_node.jobs().get(&node_skipped).await.ok()?;
                    let waiting = job.annotations().contains_key("lockwarden.io/status");
                    (waiting && job.spec?.suspend == Some(true)).then_some(())
                })
                .await;
                finish_pods(&elsewhere.client, &elsewhere.ns, &ran, true).await;
                on_node.gone(&node_skipped).await;
                assert!(
                    register.lines_of(&node_skipped).is_empty(),
                    "the node's skipped Job wrote: {:?}",
                    register.lines_of(&node_skipped)
                );
                on_node.says_who_ran("in cluster cluster-b", fence).await;
                (fence as u64, "cluster-b")
            }
        }
    }
}

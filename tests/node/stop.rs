//! The work stops before the next holder (docs/design.md §6.3), on the real node: a
//! gated Job whose container ignores SIGTERM (a shell as PID 1 with `trap '' TERM`,
//! `terminationGracePeriodSeconds: 30`) holds an S3 lock (moto on loopback) that only
//! the controller reaches through a fault proxy; the proxy is cut, so the lock's holder
//! deadline comes and the controller stops the Job, while a contender on the host (the
//! engine in-process, straight to moto) waits for the key and writes to the same
//! loopback register the moment it acquires. Every write is stamped on arrival on
//! CLOCK_MONOTONIC by the register: the Job's last write must arrive before the
//! contender's first.
//!
//! `LOCKWARDEN_NODE_TRIALS` (default 1) repeats the trial; every margin is printed with
//! the min and median, and each must be positive.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, PostParams, PropagationPolicy};
use kube::{Client, ResourceExt};
use lockwarden::api::DistributedLock;
use serde_json::json;

use super::{FAILOVER_NAMESPACE, TIMEOUT, with_controller};
use crate::support::eventually;
use crate::support::locks::{s3_lock, timed};
use crate::support::moto::{self, Moto};
use crate::support::node::Node;
use crate::support::proxy::{Mode, Proxy};
use crate::support::trials::{
    RecordSampler, Register, contend, direct_s3_backend as direct_backend, last_and_first,
    monotonic_now, report_margins, trial_count,
};
use crate::support::unique;

/// The Job's lease and renew interval: short, so a trial takes about a minute.
const LEASE: &str = "6s";
const RENEW: &str = "2s";
/// How long the contender sees the record before the cut: its observation (rule 1)
/// runs from the first read of the version the holder last wrote.
const CONTENDER_HEAD_START: Duration = Duration::from_secs(3);

/// The Secret with moto's credentials in the namespace the release may read Secrets
/// of (created once; the failover test makes the same one).
async fn ensure_aws_secret(client: &Client, ns: &str) {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "aws" },
        "stringData": {
            "AWS_ACCESS_KEY_ID": moto::ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": moto::SECRET_ACCESS_KEY,
        },
    }))
    .unwrap();
    match Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create {ns}/aws: {e}"),
    }
}

/// A gated Job with a lock template whose container ignores SIGTERM and writes
/// `job N` to the register every 100 ms through busybox's nc (host network: the
/// register is on the host's loopback).
fn ignoring_job(
    name: &str,
    template: &str,
    on_lock_lost: Option<&str>,
    image: &str,
    register_port: u16,
) -> Job {
    let script = format!(
        "trap '' TERM; i=0; while true; do i=$((i+1)); echo \"job $i\"; sleep 0.1; done \
         | nc 127.0.0.1 {register_port}"
    );
    let mut annotations = json!({ "lockwarden.io/lock-template": template });
    if let Some(policy) = on_lock_lost {
        annotations["lockwarden.io/on-lock-lost"] = json!(policy);
    }
    serde_json::from_value(json!({
        "metadata": { "name": name, "annotations": annotations },
        "spec": {
            "suspend": true,
            "backoffLimit": 0,
            "template": { "spec": {
                "hostNetwork": true,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 30,
                "containers": [{
                    "name": "writer", "image": image, "imagePullPolicy": "Never",
                    "command": ["sh", "-c", script],
                }],
            }},
        },
    }))
    .expect("a Job")
}

/// What one trial measured, in seconds on CLOCK_MONOTONIC.
struct Trial {
    /// The contender's first arrival minus the Job's last: positive is safe.
    margin: f64,
    cut_to_job_last: f64,
    cut_to_contender_first: f64,
    lock_delay: Option<String>,
}

/// How a trial's store outage goes.
#[derive(Clone, Copy)]
enum Outage {
    /// The store stays cut from the controller (`on-lock-lost` as the Job's default).
    Cut,
    /// The Job is `on-lock-lost: fail`, and the store is reachable again as soon as the
    /// controller has stopped it (while its Pod still runs its 30 s grace): a release the
    /// controller wrote then would let the contender in beside the Pod.
    HealOnceFailed,
}

async fn one_trial(
    node: &Node,
    client: &Client,
    ns: &str,
    bucket: &str,
    n: usize,
    outage: Outage,
) -> Trial {
    let key = unique("stop");
    let proxy = Proxy::start(Moto::shared().port());
    let (port, register) = Register::serve().await;
    let locks = Api::<DistributedLock>::namespaced(client.clone(), ns);
    let jobs = Api::<Job>::namespaced(client.clone(), ns);
    let template_name = format!("stop-tpl-{n}-{}", &key[key.len() - 6..]);
    let job_name = format!("stop-job-{n}-{}", &key[key.len() - 6..]);
    let mut template = timed(
        s3_lock(&template_name, bucket, &key, proxy.endpoint(), "aws"),
        LEASE,
        RENEW,
    );
    template.spec.release = true;
    locks
        .create(&PostParams::default(), &template)
        .await
        .expect("create the template");
    jobs.create(
        &PostParams::default(),
        &ignoring_job(
            &job_name,
            &template_name,
            matches!(outage, Outage::HealOnceFailed).then_some("fail"),
            &node.images().workload,
            port,
        ),
    )
    .await
    .expect("create the Job");
    eventually("the Job's first write", TIMEOUT, || async {
        (!register.of("job").is_empty()).then_some(())
    })
    .await;
    // The Job's own lock, as the controller made it from the template.
    let own_lock = eventually("the Job's own lock", TIMEOUT, || async {
        let list = locks.list(&Default::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|l| l.name_any().starts_with(&format!("{job_name}-")))
    })
    .await;
    let lock_delay = own_lock.spec.lock_delay.clone();

    // The contender: waits for the key straight through moto, and writes to the
    // register the moment it acquires.
    let sampler = RecordSampler::start(direct_backend(bucket, &key).await);
    let backend = direct_backend(bucket, &key).await;
    let contender = contend(backend, port, Duration::from_secs(6)).await;
    tokio::time::sleep(CONTENDER_HEAD_START).await;

    let cut = monotonic_now();
    proxy.set_mode(Mode::Blackhole);
    if let Outage::HealOnceFailed = outage {
        eventually("the Job stopped for good", TIMEOUT, || async {
            let job = jobs.get(&job_name).await.ok()?;
            let failed = job.annotations().contains_key("lockwarden.io/stopped");
            (job.spec.as_ref()?.suspend == Some(true) && failed).then_some(())
        })
        .await;
        proxy.set_mode(Mode::Pass);
        println!(
            "stop: the Job stopped for good {:.3} s after the cut; the store is reachable again",
            monotonic_now() - cut
        );
    }
    let (contender_backend, contender_lease) =
        tokio::time::timeout(Duration::from_secs(300), contender)
            .await
            .expect("the contender acquires within 300 s of the cut")
            .expect("the contender task");
    // The Job's writes end at the latest when its Pod is gone (grace period over).
    eventually("the Job's Pods gone", Duration::from_secs(180), || async {
        crate::support::kube::job_pods_ended(client, ns, &job_name)
            .await
            .then_some(())
    })
    .await;
    let (job_last, contender_first) = last_and_first(&register, sampler, "the Job's").await;
    let _ = contender_backend.release(&contender_lease).await;
    let _ = jobs
        .delete(
            &job_name,
            &DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                ..Default::default()
            },
        )
        .await;
    let _ = locks.delete(&template_name, &DeleteParams::default()).await;
    drop(proxy);
    Trial {
        margin: contender_first - job_last,
        cut_to_job_last: job_last - cut,
        cut_to_contender_first: contender_first - cut,
        lock_delay,
    }
}

/// Runs `trial_count(in_suite)` trials under `outage` on one bucket, printing each
/// margin under `label`, and asserts every one is positive.
async fn trials(label: &str, outage: Outage, in_suite: usize) {
    let (node, client, _shared) = with_controller().await;
    let ns = FAILOVER_NAMESPACE;
    ensure_aws_secret(&client, ns).await;
    let bucket = Moto::shared().new_bucket("node-stop").await;
    let mut margins = Vec::new();
    for n in 0..trial_count(in_suite) {
        let trial = one_trial(node, &client, ns, &bucket, n, outage).await;
        println!(
            "{label}: trial {n}: margin {:+.3} s (cut → Job's last write {:.3} s, cut → \
             contender's first write {:.3} s; the Job's lock's lockDelay {:?})",
            trial.margin, trial.cut_to_job_last, trial.cut_to_contender_first, trial.lock_delay
        );
        margins.push(trial.margin);
    }
    report_margins(label, &margins);
}

/// The Job's last write arrives before the contender's first, after the store is cut
/// off from the controller (docs/design.md §6.3); the store never shows the key free
/// while the Job writes. Two trials in the suite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_before_next_a_job_ignoring_sigterm_stops_before_the_contender_when_the_store_is_cut_on_s3()
 {
    trials("stop", Outage::Cut, 2).await;
}

/// `on-lock-lost: fail` takes the same release path (docs/design.md §6.3, "every release
/// path waits for the processes"): the store back while the stopped Job's Pod still
/// runs, the controller writes no release until the Pod has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_before_next_on_lock_lost_fail_releases_nothing_until_the_jobs_processes_ended_on_s3()
{
    trials("stop-fail", Outage::HealOnceFailed, 1).await;
}

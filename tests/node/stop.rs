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
//! Scales (`support::timescale`): the store-cut test runs one trial at full scale
//! (Kubernetes' default 30 s grace, the 37 s lock-delay it needs: the suite's full-scale
//! instance of §6.3's lock-delay) and one at suite scale (3 s, 9 s) side by side, the
//! `on-lock-lost: fail` test one at full scale; `LOCKWARDEN_NODE_TRIALS=N` runs N
//! full-scale trials of each, one after another. Every margin is printed with the min
//! and median, and each must be positive.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, PostParams, PropagationPolicy};
use kube::{Client, ResourceExt};
use lockwarden::api::DistributedLock;
use serde_json::json;

use super::{STOP_NAMESPACE, TIMEOUT, with_controller};
use crate::support::eventually;
use crate::support::locks::{s3_lock, timed};
use crate::support::moto::{self, Moto};
use crate::support::node::Node;
use crate::support::proxy::{Mode, Proxy};
use crate::support::timescale::{
    CONTENDER_HEAD_START, CONTENDER_LEASE, CONTENDER_TIMEOUT, Scale, WORKLOAD_LEASE,
    WORKLOAD_RENEW, trials as scales,
};
use crate::support::trials::{
    RecordSampler, Register, assert_lock_delay, contend, direct_s3_backend as direct_backend,
    last_and_first, monotonic_now, report_margins, run_trials,
};
use crate::support::unique;

/// The Secret with moto's credentials in the namespace the release may read Secrets
/// of (created once).
pub(super) async fn ensure_aws_secret(client: &Client, ns: &str) {
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

/// A gated Job with a lock template whose container ignores SIGTERM for its grace of
/// `scale` and writes `job N` to the register every 100 ms through busybox's nc (host
/// network: the register is on the host's loopback).
fn ignoring_job(
    name: &str,
    template: &str,
    on_lock_lost: Option<&str>,
    (image, scale): (&str, Scale),
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
                "terminationGracePeriodSeconds": scale.grace_seconds(),
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
    /// controller has stopped it (while its Pod still runs its grace): a release the
    /// controller wrote then would let the contender in beside the Pod.
    HealOnceFailed,
}

async fn one_trial(
    node: &Node,
    client: &Client,
    ns: &str,
    bucket: &str,
    (n, scale): (usize, Scale),
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
        WORKLOAD_LEASE,
        WORKLOAD_RENEW,
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
            (&node.images().workload, scale),
            port,
        ),
    )
    .await
    .expect("create the Job");
    let first_write = tokio::time::timeout(TIMEOUT, async {
        while register.of("job").is_empty() {
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
    .await;
    if first_write.is_err() {
        // Once seen in a suite run (the rerun passed): show what the Job's Pods did.
        let pods = Api::<Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default().labels(&format!("job-name={job_name}")))
            .await
            .map(|list| list.items.iter().map(super::describe).collect::<Vec<_>>());
        panic!("timed out after {TIMEOUT:?} waiting for the Job's first write; its Pods: {pods:?}");
    }
    // The Job's own lock, as the controller made it from the template.
    let own_lock = eventually("the Job's own lock", TIMEOUT, || async {
        let list = locks.list(&Default::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|l| l.name_any().starts_with(&format!("{job_name}-")))
    })
    .await;
    let lock_delay = own_lock.spec.lock_delay.clone();
    assert_lock_delay(&own_lock, scale);

    // The contender: waits for the key straight through moto, and writes to the
    // register the moment it acquires.
    let sampler = RecordSampler::start(direct_backend(bucket, &key).await);
    let backend = direct_backend(bucket, &key).await;
    let contender = contend(backend, port, CONTENDER_LEASE).await;
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
    let (contender_backend, contender_lease) = tokio::time::timeout(CONTENDER_TIMEOUT, contender)
        .await
        .expect("the contender acquires within CONTENDER_TIMEOUT of the cut")
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

/// Runs the trials of `suite`'s scales (`timescale::trials`) under `outage` on one
/// bucket, side by side (each on its own key, proxy, register and Job), printing each
/// margin under `label`, and asserts every one is positive.
async fn trials(label: &str, outage: Outage, suite: &[Scale]) {
    let (node, client, _shared) = with_controller().await;
    let ns = STOP_NAMESPACE;
    ensure_aws_secret(&client, ns).await;
    let bucket = Moto::shared().new_bucket("node-stop").await;
    let (client, bucket) = (&client, &bucket);
    let done = run_trials(scales(suite), |n, scale| async move {
        println!("{label}: trial {n}: {}", scale.describe());
        let trial = one_trial(node, client, ns, bucket, (n, scale), outage).await;
        println!(
            "{label}: trial {n} ({}): margin {:+.3} s (cut → Job's last write {:.3} s, cut → \
             contender's first write {:.3} s; the Job's lock's lockDelay {:?})",
            scale.name(),
            trial.margin,
            trial.cut_to_job_last,
            trial.cut_to_contender_first,
            trial.lock_delay
        );
        (scale, trial.margin)
    })
    .await;
    for scale in [Scale::Full, Scale::Suite] {
        let margins: Vec<f64> = done
            .iter()
            .filter(|(s, _)| *s == scale)
            .map(|(_, m)| *m)
            .collect();
        if !margins.is_empty() {
            report_margins(&format!("{label} ({})", scale.name()), &margins);
        }
    }
}

/// The Job's last write arrives before the contender's first, after the store is cut
/// off from the controller (docs/design.md §6.3); the store never shows the key free
/// while the Job writes. Two trials in the suite: one at full scale, one at suite scale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_before_next_a_job_ignoring_sigterm_stops_before_the_contender_when_the_store_is_cut_on_s3()
 {
    trials("stop", Outage::Cut, &[Scale::Full, Scale::Suite]).await;
}

/// `on-lock-lost: fail` takes the same release path (docs/design.md §6.3, "every release
/// path waits for the processes"): the store back while the stopped Job's Pod still
/// runs, the controller writes no release until the Pod has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_before_next_on_lock_lost_fail_releases_nothing_until_the_jobs_processes_ended_on_s3()
{
    trials("stop-fail", Outage::HealOnceFailed, &[Scale::Full]).await;
}

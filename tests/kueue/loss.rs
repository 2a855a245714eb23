//! The work of a Kueue Workload stops before the next holder (docs/design.md §6.3,
//! §6.6), measured on processes: a Kueue Job admitted through lockwarden's check, whose
//! container ignores SIGTERM (for its grace, `support::timescale::Scale`) and writes
//! `job N` to a loopback register every 100 ms, holds an S3 lock (moto) that only the
//! controller reaches, through a fault proxy. The proxy is cut: the controller loses the
//! lock, sets the check `Retry`, Kueue evicts the Workload and suspends the Job, and its
//! Pod is killed at the end of its grace. The contender is a plain DistributedLock on
//! the same key under *another* controller (cluster `kueue-other`, its own namespace,
//! straight to moto), waiting before the cut; the test writes the contender's first
//! write to the same register the moment that lock's status says it is held (before
//! any work its controller could gate would start, so the margin is, if anything,
//! understated). The Job's last write must arrive before the contender's first, and the
//! store must show the Workload's acquisition until then. After the heal the Workload
//! is admitted again, with a higher fence.
//!
//! One trial at suite scale (a 3 s grace, the 9 s lock-delay it needs): the margin does
//! not depend on the scale (the delay grows with the grace, `timescale::Scale::Suite`),
//! and the lock-delay under a 30 s grace is tried at full scale on the same node by
//! tests/node stop.rs. `LOCKWARDEN_NODE_TRIALS=N` runs N full-scale trials. Every margin
//! is printed with the min and median, and each must be positive.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PropagationPolicy};
use lockwarden::api::{DistributedLock, LockPhase};
use lockwarden::controller::ControllerConfig;
use tokio::io::AsyncWriteExt;
use tokio::task::JoinHandle;

use super::admission::{install_crds, lockwarden_check, start_controller};
use super::*;
use crate::support::kube::job_pods_ended;
use crate::support::locks::{acquired, aws_secret, phase, s3_lock, timed};
use crate::support::moto::Moto;
use crate::support::proxy::{Mode, Proxy};
use crate::support::timescale::{
    CONTENDER_HEAD_START, CONTENDER_TIMEOUT, Scale, WORKLOAD_LEASE as LEASE,
    WORKLOAD_RENEW as RENEW, trials as scales,
};
use crate::support::trials::{
    RecordSampler, Register, assert_lock_delay, direct_s3_backend, last_and_first, monotonic_now,
    report_margins,
};
/// The template the check's parameters name; each trial makes it anew on a new key.
const TEMPLATE: &str = "stop-tpl";
/// The other cluster, whose controller holds the contender's lock.
const OTHER_CLUSTER: &str = "kueue-other";

/// A Kueue Job whose container ignores SIGTERM for its grace of `scale` and writes
/// `job N` to the register on `port` every 100 ms (host network: the register is on the
/// host's loopback).
fn ignoring_job(node: &Node, name: &str, (queue, scale): (&str, Scale), port: u16) -> Job {
    let script = format!(
        "trap '' TERM; i=0; while true; do i=$((i+1)); echo \"job $i\"; sleep 0.1; done \
         | nc 127.0.0.1 {port}"
    );
    let mut job = queued_job(node, name, queue, &script);
    let pod = job.spec.as_mut().unwrap().template.spec.as_mut().unwrap();
    pod.termination_grace_period_seconds = Some(scale.grace_seconds());
    job
}

/// The fence of the running Pod of Job `name`, once one runs with one above `above`.
async fn running_fence(client: &Client, ns: &str, name: &str, above: i64) -> i64 {
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    eventually(
        &format!("a Pod of {name} running with a fence above {above}"),
        TIMEOUT,
        || async {
            pods.list(&ListParams::default().labels(&format!("job-name={name}")))
                .await
                .ok()?
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .filter_map(|p| {
                    p.annotations()
                        .get("lockwarden.io/fence")?
                        .parse::<i64>()
                        .ok()
                })
                .find(|f| *f > above)
        },
    )
    .await
}

/// The other cluster's controller, in `ns` only, straight to the stores.
fn start_other_controller(client: &Client, ns: &str) -> JoinHandle<()> {
    let config = ControllerConfig {
        cluster_name: OTHER_CLUSTER.into(),
        namespace: Some(ns.to_string()),
        ..Default::default()
    };
    let client = client.clone();
    tokio::spawn(async move {
        if let Err(e) = lockwarden::controller::run(client, config).await {
            panic!("the other cluster's controller failed: {e}");
        }
    })
}

/// Writes `contender 1` to the register on `port` the moment the DistributedLock `name`
/// (under the other controller) is held; ends with its fence.
async fn first_write_when_held(
    locks: Api<DistributedLock>,
    name: String,
    port: u16,
) -> JoinHandle<i64> {
    let mut line = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to the register");
    tokio::spawn(async move {
        loop {
            if let Ok(lock) = locks.get(&name).await
                && acquired(&lock)
            {
                line.write_all(b"contender 1\n").await.unwrap();
                line.flush().await.unwrap();
                return lock.status.and_then(|s| s.fence).unwrap_or_default();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

/// What one trial measured, in seconds on CLOCK_MONOTONIC.
struct Trial {
    margin: f64,
    cut_to_job_last: f64,
    cut_to_contender_first: f64,
    /// The Workload's fence, the contender's, and the Workload's after the heal.
    fences: (i64, i64, i64),
}

/// Where the trials run: this cluster's namespace and queue, the other cluster's
/// namespace, and the bucket.
struct Stage<'a> {
    node: &'a Node,
    client: &'a Client,
    ns: &'a str,
    queue: &'a str,
    other_ns: &'a str,
    bucket: &'a str,
}

async fn one_trial(stage: &Stage<'_>, n: usize, scale: Scale) -> Trial {
    let Stage {
        node,
        client,
        ns,
        queue,
        other_ns,
        bucket,
    } = *stage;
    let key = unique("kueue-stop");
    let proxy = Proxy::start(Moto::shared().port());
    let (port, register) = Register::serve().await;
    let locks = Api::<DistributedLock>::namespaced(client.clone(), ns);
    let jobs = Api::<Job>::namespaced(client.clone(), ns);
    let mut template = timed(
        s3_lock(TEMPLATE, bucket, &key, proxy.endpoint(), "aws"),
        LEASE,
        RENEW,
    );
    template.spec.release = true;
    locks
        .create(&PostParams::default(), &template)
        .await
        .expect("create the template");
    let job_name = format!("stop-{n}");
    jobs.create(
        &PostParams::default(),
        &ignoring_job(node, &job_name, (queue, scale), port),
    )
    .await
    .expect("create the Job");
    let first_fence = running_fence(client, ns, &job_name, 0).await;
    eventually("the Job's first write", TIMEOUT, || async {
        (!register.of("job").is_empty()).then_some(())
    })
    .await;
    // The Workload's own lock, made from the template on the trial's key: the lock-delay
    // the trial's timing rests on.
    let own = eventually("the Workload's own lock", TIMEOUT, || async {
        locks
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|l| {
                l.name_any() != TEMPLATE && l.spec.backend.s3.as_ref().is_some_and(|b| b.key == key)
            })
    })
    .await;
    assert_lock_delay(&own, scale);

    let sampler = RecordSampler::start(direct_s3_backend(bucket, &key).await);
    // The contender: waiting under the other controller before the cut.
    let others = Api::<DistributedLock>::namespaced(client.clone(), other_ns);
    let contender_name = format!("contender-{n}");
    others
        .create(
            &PostParams::default(),
            &timed(
                s3_lock(
                    &contender_name,
                    bucket,
                    &key,
                    Moto::shared().endpoint(),
                    "aws",
                ),
                LEASE,
                RENEW,
            ),
        )
        .await
        .expect("create the contender's lock");
    eventually("the contender waiting", TIMEOUT, || async {
        let lock = others.get(&contender_name).await.ok()?;
        (phase(&lock) == Some(LockPhase::Waiting)).then_some(())
    })
    .await;
    let contender = first_write_when_held(others.clone(), contender_name.clone(), port).await;
    tokio::time::sleep(CONTENDER_HEAD_START).await;
    let cut = monotonic_now();
    proxy.set_mode(Mode::Blackhole);
    let contender_fence = tokio::time::timeout(CONTENDER_TIMEOUT, contender)
        .await
        .expect("the contender is held within CONTENDER_TIMEOUT of the cut")
        .expect("the contender task");
    // Kueue evicted the Workload and suspended the Job; its Pod is gone at the latest
    // at the end of its grace period.
    eventually(
        "the Job suspended by Kueue and its Pods ended",
        Duration::from_secs(180),
        || async {
            let job = jobs.get(&job_name).await.ok()?;
            (job.spec.as_ref()?.suspend == Some(true)
                && job_pods_ended(client, ns, &job_name).await)
                .then_some(())
        },
    )
    .await;
    let (job_last, contender_first) = last_and_first(&register, sampler, "the Kueue Job's").await;

    // The heal: the store reachable again and the contender gone; the Workload is
    // admitted again, with a new acquisition.
    proxy.set_mode(Mode::Pass);
    others
        .delete(&contender_name, &DeleteParams::default())
        .await
        .expect("delete the contender's lock");
    let again = running_fence(client, ns, &job_name, contender_fence).await;
    let _ = jobs
        .delete(
            &job_name,
            &DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                ..Default::default()
            },
        )
        .await;
    eventually("the Job gone", Duration::from_secs(180), || async {
        jobs.get_opt(&job_name).await.ok()?.is_none().then_some(())
    })
    .await;
    let _ = locks.delete(TEMPLATE, &DeleteParams::default()).await;
    eventually("the template gone", TIMEOUT, || async {
        locks.get_opt(TEMPLATE).await.ok()?.is_none().then_some(())
    })
    .await;
    eventually("the contender's lock gone", TIMEOUT, || async {
        others
            .get_opt(&contender_name)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    drop(proxy);
    Trial {
        margin: contender_first - job_last,
        cut_to_job_last: job_last - cut,
        cut_to_contender_first: contender_first - cut,
        fences: (first_fence, contender_fence, again),
    }
}

/// The Kueue Job's last write arrives before the contender's first after the store is
/// cut off from the controller; after the heal it is admitted again with a higher
/// fence. One trial in the suite, at suite scale; `LOCKWARDEN_NODE_TRIALS=10` for the
/// long run (full scale).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_before_next_a_kueue_job_sent_back_on_loss_stops_before_the_contender_on_s3() {
    let (node, client, ns) = setup("kueue-stop").await;
    let other_ns = node.namespace(&client, OTHER_CLUSTER).await;
    install_crds(&client).await;
    for namespace in [&ns, &other_ns] {
        aws_secret(&client, namespace).await;
    }
    let bucket = Moto::shared().new_bucket("kueue-stop").await;
    let check = lockwarden_check(&client, json!({ "templates": [{ "name": TEMPLATE }] })).await;
    let (_, queue) = super::admission::create_queues(&client, &ns, &[&check]).await;
    let controller = start_controller(node, &ns).await;
    let other = start_other_controller(&client, &other_ns);
    let stage = Stage {
        node,
        client: &client,
        ns: &ns,
        queue: &queue,
        other_ns: &other_ns,
        bucket: &bucket,
    };
    let mut margins = Vec::new();
    // One at a time: the check's parameters name one template, made anew per trial.
    for (n, scale) in scales(&[Scale::Suite]).into_iter().enumerate() {
        println!("kueue-stop: trial {n}: {}", scale.describe());
        let trial = one_trial(&stage, n, scale).await;
        let (workload, contender, again) = trial.fences;
        println!(
            "kueue-stop: trial {n}: margin {:+.3} s (cut → Job's last write {:.3} s, cut → \
             contender's first write {:.3} s); fences: Workload {workload}, contender \
             {contender}, Workload after the heal {again}",
            trial.margin, trial.cut_to_job_last, trial.cut_to_contender_first,
        );
        assert!(
            workload < contender && contender < again,
            "fences must rise across the hand-offs: {:?}",
            trial.fences
        );
        margins.push(trial.margin);
    }
    report_margins("kueue-stop", &margins);
    controller.abort();
    other.abort();
}

//! Once per run across clusters (docs/design.md §6.7), against real API servers with
//! their own kube-controller-manager (the CronJob and Job controllers), the controller
//! in-process per cluster, and real stores. No kubelet runs: a started Job's Pods are
//! finished by the test, as a kubelet would ([`support::kube::finish_pods`]).
//!
//! - two clusters (two API servers), a real `*/1` CronJob in each on one S3 key: each
//!   scheduled time runs once across both, the other cluster's Job is deleted with the
//!   reason, and the next time fires after a skip (`Forbid` is not blocked);
//! - per store (DynamoDB, ZooKeeper, a Lease shared by two controllers of one API
//!   server): Jobs
//!   built as the CronJob controller builds them, no minute waits; a failed run is not
//!   recorded and runs in the other cluster;
//! - take-up: a controller SIGKILLed while its Job runs; a run lost to a store cut;
//! - bad input: what once per run needs, refused with a clear status.

use lockwarden_testsupport as support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use lockwarden::api::{BackendSpec, DistributedLock, LockPhase};
use lockwarden::controller::gating::once::{ONCE_ANNOTATION, RUN_KEY_ANNOTATION};
use lockwarden::controller::jobs::{
    FENCE_ANNOTATION, SCHEDULED_TIMESTAMP_ANNOTATION, STATUS_ANNOTATION, TEMPLATE_ANNOTATION,
    template_annotation,
};
use serde_json::json;
use support::kube::{ControlPlane, finish_pods};
use support::locks::{aws_secret, dynamodb_backend, s3_lock, zookeeper_backend};
use support::moto::Moto;
use support::once::scheduled_job;

/// Generous: two clusters' controllers and a CronJob controller on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(180);

/// One cluster as a test sees it: a client, the namespace its controller serves.
#[derive(Clone)]
struct Cluster {
    name: &'static str,
    client: Client,
    ns: String,
}

impl Cluster {
    fn jobs(&self) -> Api<Job> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn locks(&self) -> Api<DistributedLock> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// The `reason` Events of this cluster's namespace: their notes.
    async fn events(&self, reason: &str) -> Vec<String> {
        self.events_about(reason, None).await
    }

    /// The `reason` Events of this cluster's namespace about an object of `kind` (any
    /// when `None`): their notes.
    async fn events_about(&self, reason: &str, kind: Option<&str>) -> Vec<String> {
        Api::<Event>::namespaced(self.client.clone(), &self.ns)
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter(|e| {
                kind.is_none_or(|k| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some(k))
            })
            .filter_map(|e| e.note)
            .collect()
    }
}

/// The template a cluster's Jobs take their own locks from: `release: true`, so it
/// holds nothing itself; a short lease so a test never waits long for an expiry.
fn template(backend: BackendSpec) -> DistributedLock {
    let mut lock = DistributedLock::new(
        "nightly",
        lockwarden::api::DistributedLockSpec {
            backend,
            lease_duration: "10s".into(),
            renew_interval: "3s".into(),
            release: true,
            ..Default::default()
        },
    );
    lock.metadata.labels = Some(BTreeMap::from([("test".into(), "once".into())]));
    lock
}

/// A CronJob `schedule`, `Forbid`, whose Jobs are gated on the `nightly` template once
/// per run; `suspend` stops it from creating Jobs itself.
fn cronjob(schedule: &str, suspend: bool) -> CronJob {
    let pod = json!({
        // A short grace: the own lock's lock-delay (§6.3) follows it.
        "terminationGracePeriodSeconds": 1,
        "restartPolicy": "Never",
        "containers": [{ "name": "run", "image": "busybox", "command": ["true"] }],
    });
    support::once::cronjob("nightly", schedule, suspend, "nightly", pod)
}

/// In each cluster, a suspended CronJob and the Job it would create for `slot`, with the
/// slot as its run key (so that clusters serving namespaces of other names share it);
/// the Jobs are not created.
async fn jobs_for_one_run(clusters: &[&Cluster], slot: SystemTime) -> Vec<Job> {
    let mut jobs = Vec::new();
    for c in clusters {
        let cron = Api::<CronJob>::namespaced(c.client.clone(), &c.ns)
            .create(&PostParams::default(), &cronjob("0 2 * * *", true))
            .await
            .expect("create the CronJob");
        let mut job = scheduled_job(&cron, slot);
        job.annotations_mut()
            .insert(RUN_KEY_ANNOTATION.into(), lockwarden::lock::rfc3339(slot));
        jobs.push(job);
    }
    jobs
}

/// Whether lockwarden started `job` (its pod template carries the fence).
fn started(job: &Job) -> bool {
    template_annotation(job, FENCE_ANNOTATION).is_some()
}

fn scheduled_of(job: &Job) -> Option<String> {
    job.annotations()
        .get(SCHEDULED_TIMESTAMP_ANNOTATION)
        .cloned()
}

/// What the clusters did with their Jobs, as the test drives them.
#[derive(Default)]
struct Runs {
    /// (slot, cluster) of every Job started, in order.
    started: Vec<(String, &'static str)>,
    /// Jobs seen, by (cluster, name), with their slot.
    seen: BTreeMap<(&'static str, String), String>,
}

impl Runs {
    /// One look at every cluster: each Job started and not yet finished by us is
    /// finished (`succeed`) as a kubelet would; every Job is remembered.
    async fn drive(&mut self, clusters: &[Cluster], succeed: impl Fn(&str, &str) -> bool) {
        for cluster in clusters {
            let jobs = cluster.jobs().list(&ListParams::default()).await;
            for job in jobs.map(|l| l.items).unwrap_or_default() {
                let Some(slot) = scheduled_of(&job) else {
                    continue;
                };
                self.seen
                    .insert((cluster.name, job.name_any()), slot.clone());
                let done = job.status.as_ref().and_then(|s| s.conditions.as_ref());
                let finished = done.is_some_and(|c| {
                    c.iter()
                        .any(|c| ["Complete", "Failed"].contains(&c.type_.as_str()))
                });
                if started(&job) && !finished && !self.finished_here(&slot, cluster.name) {
                    let ok = succeed(&slot, cluster.name);
                    finish_pods(&cluster.client, &cluster.ns, &job.name_any(), ok).await;
                    self.started.push((slot, cluster.name));
                }
            }
        }
    }

    fn finished_here(&self, slot: &str, cluster: &str) -> bool {
        self.started.iter().any(|(s, c)| s == slot && *c == cluster)
    }

    /// The slots some cluster ran, with how many runs each.
    fn runs_per_slot(&self) -> BTreeMap<String, usize> {
        let mut runs = BTreeMap::new();
        for (slot, _) in &self.started {
            *runs.entry(slot.clone()).or_default() += 1;
        }
        runs
    }

    /// Every Job of `slot` that did not run is gone (deleted unrun).
    async fn others_gone(&self, clusters: &[Cluster], slot: &str) -> bool {
        for ((cluster, name), s) in &self.seen {
            if s != slot || self.finished_here(slot, cluster) {
                continue;
            }
            let c = clusters.iter().find(|c| c.name == *cluster).unwrap();
            if c.jobs().get_opt(name).await.ok().flatten().is_some() {
                return false;
            }
        }
        true
    }
}

/// A cluster on `plane`: the CRD, a namespace, a controller named `name` serving it,
/// the AWS Secret, the template on `backend` (made from the Secret's name).
async fn cluster_on(
    plane: &ControlPlane,
    name: &'static str,
    backend: impl Fn(&str) -> BackendSpec,
) -> Cluster {
    cluster_in(plane, name, None, backend).await
}

/// [`cluster_on`] in namespace `ns` (a fresh one when `None`).
async fn cluster_in(
    plane: &ControlPlane,
    name: &'static str,
    ns: Option<&str>,
    backend: impl Fn(&str) -> BackendSpec,
) -> Cluster {
    support::kube::test_logs();
    let client = plane.client().await;
    support::kube::install_lockwarden_crd(&client).await;
    let ns = match ns {
        Some(ns) => {
            let namespace: k8s_openapi::api::core::v1::Namespace =
                serde_json::from_value(json!({ "metadata": { "name": ns } })).unwrap();
            Api::all(client.clone())
                .create(&PostParams::default(), &namespace)
                .await
                .expect("create the namespace");
            ns.to_string()
        }
        None => plane.namespace(&client, "once").await,
    };
    support::kube::spawn_controller(
        client.clone(),
        lockwarden::controller::ControllerConfig {
            cluster_name: name.into(),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
    );
    let secret = aws_secret(&client, &ns).await;
    let cluster = Cluster { name, client, ns };
    cluster
        .locks()
        .create(&PostParams::default(), &template(backend(&secret.name)))
        .await
        .expect("create the template");
    cluster
}

/// Acceptance: two clusters (two API servers, each with the CronJob controller), a
/// real `*/1` CronJob with `Forbid` in each, one S3 key. Over two scheduled times each
/// ran exactly once across both clusters; the other cluster's Job of each time was
/// deleted with an Event saying which cluster completed it with which fence, on the
/// Job's CronJob; the second time fired after a skip.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn once_a_cronjob_in_two_clusters_runs_each_scheduled_time_once() {
    let bucket = Moto::shared().new_bucket("once").await;
    let endpoint = Moto::shared().endpoint();
    let s3 = |secret: &str| {
        s3_lock("x", &bucket, "nightly/lock", endpoint.clone(), secret)
            .spec
            .backend
    };
    let plane_b = tokio::task::spawn_blocking(ControlPlane::start)
        .await
        .expect("a second control plane");
    // One namespace name in both clusters, as an active-active pair deploys it: the
    // run key of a CronJob's Job is `<namespace>/<cronjob>@<scheduled time>`.
    let a = cluster_on(ControlPlane::shared(), "cluster-a", &s3).await;
    let b = cluster_in(&plane_b, "cluster-b", Some(&a.ns), &s3).await;
    let clusters = [a.clone(), b.clone()];
    for c in &clusters {
        Api::<CronJob>::namespaced(c.client.clone(), &c.ns)
            .create(&PostParams::default(), &cronjob("*/1 * * * *", false))
            .await
            .expect("create the CronJob");
    }
    let mut runs = Runs::default();
    let deadline = tokio::time::Instant::now() + PATIENCE + Duration::from_secs(60);
    loop {
        runs.drive(&clusters, |_, _| true).await;
        let done: Vec<String> = runs.runs_per_slot().into_keys().collect();
        let mut settled = done.len() >= 2;
        for slot in done.iter().take(2) {
            settled &= runs.others_gone(&clusters, slot).await;
        }
        if settled {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "two scheduled times did not each run once in time: started {:?}, seen {:?}",
            runs.started,
            runs.seen
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for (slot, n) in runs.runs_per_slot().iter().take(2) {
        assert_eq!(*n, 1, "slot {slot} ran {n} times: {:?}", runs.started);
    }
    // Each slot's Job in the other cluster existed and was deleted unrun: the CronJob
    // says why.
    let slots: BTreeSet<&String> = runs.seen.values().collect();
    assert!(slots.len() >= 2, "{:?}", runs.seen);
    let notes = [
        a.events("RunCompleted").await,
        b.events("RunCompleted").await,
    ]
    .concat();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("already completed in cluster cluster-") && n.contains("fence")),
        "an Event names who completed the run: {notes:?}"
    );
    // Each time's skip is on the skipping cluster's CronJob, with its own note: two
    // skips of one CronJob are two Events, not one whose note is the first's.
    let on_cronjobs = [
        a.events_about("RunCompleted", Some("CronJob")).await,
        b.events_about("RunCompleted", Some("CronJob")).await,
    ]
    .concat();
    for time in runs.runs_per_slot().keys().take(2) {
        // The run key names the instant in UTC, whatever the CronJob's time zone.
        let instant = time
            .parse::<jiff::Timestamp>()
            .map_or_else(|_| time.clone(), |t| t.to_string());
        assert!(
            on_cronjobs.iter().any(|n| n.contains(&instant)),
            "no CronJob Event for the skip of {time}: {on_cronjobs:?}"
        );
    }
}

/// Two clusters sharing one key through one API server (two controllers), Jobs built
/// as the CronJob controller builds them for one scheduled time: one runs, the other
/// is deleted unrun; for the next time, a failed run is not recorded and the other
/// cluster runs it.
async fn each_time_once_on(backend: impl Fn(&str, &str) -> BackendSpec) {
    let plane = ControlPlane::shared();
    let keys = plane.namespace(&plane.client().await, "once-keys").await;
    let a = cluster_on(plane, "cluster-a", |s| backend(s, &keys)).await;
    let b = cluster_on(plane, "cluster-b", |s| backend(s, &keys)).await;
    let clusters = [a.clone(), b.clone()];
    let mut crons = Vec::new();
    for c in &clusters {
        let cron = Api::<CronJob>::namespaced(c.client.clone(), &c.ns)
            .create(&PostParams::default(), &cronjob("0 2 * * *", true))
            .await
            .expect("create the CronJob");
        crons.push(cron);
    }
    let first = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_263_200);
    let second = first + Duration::from_secs(86_400);
    let mut runs = Runs::default();
    for slot in [first, second] {
        for (c, cron) in clusters.iter().zip(&crons) {
            // The two "clusters" serve namespaces of different names on one API server:
            // the run key that agrees with the scheduled time names the run for both.
            let mut job = scheduled_job(cron, slot);
            job.annotations_mut()
                .insert(RUN_KEY_ANNOTATION.into(), lockwarden::lock::rfc3339(slot));
            c.jobs()
                .create(&PostParams::default(), &job)
                .await
                .expect("create the scheduled Job");
        }
    }
    let first_text = lockwarden::lock::rfc3339(first);
    let second_text = lockwarden::lock::rfc3339(second);
    // The first run of the second time fails; every other run succeeds.
    let fail_once = std::sync::Mutex::new(true);
    let succeed = |slot: &str, _: &str| {
        slot != second_text || !std::mem::replace(&mut *fail_once.lock().unwrap(), false)
    };
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        runs.drive(&clusters, succeed).await;
        let per_slot = runs.runs_per_slot();
        if per_slot.get(&first_text) == Some(&1)
            && per_slot.get(&second_text) == Some(&2)
            && runs.others_gone(&clusters, &first_text).await
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "each time not run as planned: started {:?}, seen {:?}",
            runs.started,
            runs.seen
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The first time ran once and its other Job was deleted; the second ran in both
    // clusters, the first attempt having failed.
    let second_runs: BTreeSet<&str> = runs
        .started
        .iter()
        .filter(|(s, _)| *s == second_text)
        .map(|(_, c)| *c)
        .collect();
    assert_eq!(second_runs.len(), 2, "{:?}", runs.started);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn once_on_dynamodb_each_scheduled_time_runs_once_and_a_failure_runs_again() {
    let table = Moto::shared().new_table("once", "key").await;
    let endpoint = Moto::shared().endpoint();
    each_time_once_on(|secret, _| {
        let secret = lockwarden::api::SecretRef {
            name: secret.into(),
        };
        dynamodb_backend(&table, "nightly", endpoint.clone(), secret)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn once_on_zookeeper_each_scheduled_time_runs_once_and_a_failure_runs_again() {
    let zookeeper = tokio::task::spawn_blocking(support::zookeeper::ZooKeeper::shared)
        .await
        .unwrap();
    let path = format!("/{}", support::unique("once"));
    each_time_once_on(|_, _| zookeeper_backend(&zookeeper.connect_string(), &path)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn once_on_a_lease_each_scheduled_time_runs_once_and_a_failure_runs_again() {
    each_time_once_on(|_, keys| {
        let mut lock = support::locks::lease_lock("x", "nightly");
        if let Some(k) = lock.spec.backend.kubernetes.as_mut() {
            k.namespace = Some(keys.into());
        }
        lock.spec.backend
    })
    .await;
}

/// Bad input: `once` without a run key (a Job no CronJob made), with a run key that
/// disagrees with its CronJob's time, on a named lock; a template on a key deleted on
/// release (s3lockCompatible). Each is
/// refused with a status that names what is wrong, and nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_once_without_what_it_needs_is_refused_with_a_clear_status() {
    let bucket = Moto::shared().new_bucket("once-bad").await;
    let endpoint = Moto::shared().endpoint();
    let c = cluster_on(ControlPlane::shared(), "cluster-a", |secret| {
        s3_lock("x", &bucket, "k", endpoint.clone(), secret)
            .spec
            .backend
    })
    .await;
    let cron = Api::<CronJob>::namespaced(c.client.clone(), &c.ns)
        .create(&PostParams::default(), &cronjob("0 2 * * *", true))
        .await
        .expect("create the CronJob");
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_263_200);
    let job = |name: &str, annotations: serde_json::Value| -> Job {
        let mut job = scheduled_job(&cron, at);
        job.metadata.name = Some(name.into());
        job.metadata.owner_references = None;
        job.metadata.annotations = serde_json::from_value(annotations).ok();
        job
    };
    let cases: Vec<(Job, &str)> = vec![
        (
            job(
                "no-key",
                json!({TEMPLATE_ANNOTATION: "nightly", ONCE_ANNOTATION: "true"}),
            ),
            "needs a run key",
        ),
        (
            {
                let mut j = scheduled_job(&cron, at);
                j.metadata.name = Some("disagrees".into());
                j.annotations_mut()
                    .insert(RUN_KEY_ANNOTATION.into(), "2027-01-01T00:00:00Z".into());
                j
            },
            "disagrees with the run its CronJob scheduled",
        ),
        (
            job(
                "named",
                json!({"lockwarden.io/lock": "nightly", ONCE_ANNOTATION: "true", RUN_KEY_ANNOTATION: "r"}),
            ),
            "needs exactly one lock made from a template",
        ),
        (
            job(
                "yes",
                json!({TEMPLATE_ANNOTATION: "nightly", ONCE_ANNOTATION: "yes"}),
            ),
            "is neither",
        ),
    ];
    for (job, _) in &cases {
        c.jobs()
            .create(&PostParams::default(), job)
            .await
            .expect("create a Job");
    }
    for (job, needle) in &cases {
        let name = job.name_any();
        let status = support::eventually(&format!("Job {name} refused"), PATIENCE, || async {
            let job = c.jobs().get(&name).await.ok()?;
            let status = job.annotations().get(STATUS_ANNOTATION)?.clone();
            status.contains(needle).then_some(status)
        })
        .await;
        let job = c.jobs().get(&name).await.unwrap();
        assert!(!started(&job), "{name} not started: {status}");
    }

    // A template on a key that cannot remember: the Job's own lock fails, naming why.
    let mut compatible = template(
        s3_lock("x", &bucket, "compat", endpoint.clone(), "aws")
            .spec
            .backend,
    );
    compatible.metadata.name = Some("s3lock-compatible".into());
    if let Some(s3) = compatible.spec.backend.s3.as_mut() {
        s3.s3lock_compatible = Some(true);
    }
    for (template, needle) in [(compatible, "deleted on release")] {
        let name = template.name_any();
        c.locks()
            .create(&PostParams::default(), &template)
            .await
            .expect("create a template");
        let mut job = scheduled_job(&cron, at);
        job.metadata.name = Some(format!("job-{name}"));
        job.annotations_mut()
            .insert(TEMPLATE_ANNOTATION.into(), name.clone());
        c.jobs()
            .create(&PostParams::default(), &job)
            .await
            .expect("create a Job");
        let message = support::eventually(
            &format!("the lock from {name} failed"),
            PATIENCE,
            || async {
                let locks = c.locks().list(&ListParams::default()).await.ok()?;
                locks.items.into_iter().find_map(|l| {
                    let status = l.status?;
                    let ours = l
                        .metadata
                        .name
                        .as_deref()?
                        .starts_with(&format!("job-{name}"));
                    let acquired = status
                        .conditions
                        .iter()
                        .find(|c| c.type_ == "Acquired")?
                        .message
                        .clone();
                    (ours && status.phase == Some(LockPhase::Failed)).then_some(acquired)
                })
            },
        )
        .await;
        assert!(message.contains(needle), "{name}: {message}");
    }
}

/// Take-up: cluster-a's Job holds the run when its controller is SIGKILLed; the Job
/// then completes, but with its controller dead nothing records it (the completion
/// and the release are one step of a controller that is gone). Cluster-b's Job for
/// the same run is granted once the lease runs out, runs it — the repeat docs/design.md
/// §6.7 allows — with a Warning Event saying so, and its completion is recorded once,
/// with its own fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn once_a_run_whose_controller_died_is_taken_up_and_recorded_once_with_the_new_fence() {
    let plane = ControlPlane::shared();
    let admin = plane.client().await;
    support::kube::install_lockwarden_crd(&admin).await;
    let keys = plane.namespace(&admin, "once-keys").await;
    let lease_on_keys = |_: &str| {
        let mut lock = support::locks::lease_lock("x", "nightly");
        if let Some(k) = lock.spec.backend.kubernetes.as_mut() {
            k.namespace = Some(keys.clone());
        }
        lock.spec.backend
    };
    // Cluster a: its controller a process of its own, to be killed.
    let ns_a = plane.namespace(&admin, "once-a").await;
    let mut controller_a =
        support::kube::ControllerProcess::start(plane.kubeconfig_path(), "cluster-a", &ns_a, &[]);
    let a = Cluster {
        name: "cluster-a",
        client: admin.clone(),
        ns: ns_a,
    };
    a.locks()
        .create(&PostParams::default(), &template(lease_on_keys("")))
        .await
        .expect("create the template");
    let b = cluster_on(plane, "cluster-b", &lease_on_keys).await;
    let slot = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_263_200);
    let jobs = jobs_for_one_run(&[&a, &b], slot).await;
    let fence_of =
        |job: &Job| -> Option<i64> { template_annotation(job, FENCE_ANNOTATION)?.parse().ok() };
    let started_job = |c: Cluster, name: String| async move {
        support::eventually(&format!("{} started {name}", c.name), PATIENCE, || async {
            c.jobs().get(&name).await.ok().filter(started)
        })
        .await
    };
    let job_a = a
        .jobs()
        .create(&PostParams::default(), &jobs[0])
        .await
        .unwrap();
    let first = started_job(a.clone(), job_a.name_any()).await;
    let job_b = b
        .jobs()
        .create(&PostParams::default(), &jobs[1])
        .await
        .unwrap();
    // Cluster a's controller dies while its Job runs; the Job then completes.
    controller_a.kill();
    finish_pods(&a.client, &a.ns, &job_a.name_any(), true).await;
    let second = started_job(b.clone(), job_b.name_any()).await;
    let (f1, f2) = (fence_of(&first).unwrap(), fence_of(&second).unwrap());
    assert!(f2 > f1, "the take-up has a higher fence: {f1} then {f2}");
    let warnings = b.events("RunMayRepeat").await;
    assert!(
        warnings
            .iter()
            .any(|n| n.contains("let its lease run out") && n.contains("cluster-a")),
        "the repeat is explained: {warnings:?}"
    );
    finish_pods(&b.client, &b.ns, &job_b.name_any(), true).await;
    let leases = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(admin, &keys);
    let runs = support::eventually("the run recorded", PATIENCE, || async {
        let lease = leases.get("nightly").await.ok()?;
        let text = lease.annotations().get("lockwarden.io/runs")?.clone();
        serde_json::from_str::<serde_json::Value>(&text).ok()
    })
    .await;
    let recorded: Vec<&serde_json::Value> = runs["runs"].as_array().unwrap().iter().collect();
    assert_eq!(recorded.len(), 1, "recorded once: {runs}");
    assert_eq!(
        recorded[0]["fence"], f2,
        "with the second run's fence: {runs}"
    );
    assert!(
        recorded[0]["holder"]
            .as_str()
            .unwrap()
            .starts_with("cluster-b/"),
        "{runs}"
    );
}

/// A run lost to a store cut is not recorded: cluster-a's store is cut off (a
/// blackholing proxy) while its Job runs, so its lock is lost and its Job suspended;
/// cluster-b's Job for the same run is granted after the lease, runs it and records
/// it with its own fence. Once the cut heals, cluster-a's suspended Job is granted the
/// key again, finds the run completed and is deleted unrun.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn once_a_run_lost_to_a_store_cut_is_not_recorded_and_runs_in_the_other_cluster() {
    use support::proxy::{Mode, Proxy};
    let moto = Moto::shared();
    let bucket = moto.new_bucket("once-cut").await;
    let proxy = Proxy::start(moto.port());
    let through = |endpoint: String| {
        let bucket = bucket.clone();
        move |secret: &str| {
            s3_lock("x", &bucket, "nightly/lock", endpoint.clone(), secret)
                .spec
                .backend
        }
    };
    let a = cluster_on(
        ControlPlane::shared(),
        "cluster-a",
        through(proxy.endpoint()),
    )
    .await;
    let b = cluster_on(
        ControlPlane::shared(),
        "cluster-b",
        through(moto.endpoint()),
    )
    .await;
    let slot = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_263_200);
    let jobs = jobs_for_one_run(&[&a, &b], slot).await;
    let fence_of = |job: &Job| -> i64 {
        template_annotation(job, FENCE_ANNOTATION)
            .and_then(|f| f.parse().ok())
            .expect("a fence")
    };
    let (job_a, job_b) = (jobs[0].name_any(), jobs[1].name_any());
    // Cluster-a's Job first, running, then cluster-b's, waiting for the same run.
    a.jobs()
        .create(&PostParams::default(), &jobs[0])
        .await
        .unwrap();
    let first = support::eventually("cluster-a runs", PATIENCE, || async {
        a.jobs().get(&job_a).await.ok().filter(started)
    })
    .await;
    b.jobs()
        .create(&PostParams::default(), &jobs[1])
        .await
        .unwrap();
    // The cut: cluster-a's renewals go nowhere; its Job is suspended before cluster-b
    // may take the key (§6.3), and cluster-b's Job runs the same run.
    proxy.set_mode(Mode::Blackhole);
    let second = support::eventually("cluster-b runs the run", PATIENCE, || async {
        b.jobs().get(&job_b).await.ok().filter(started)
    })
    .await;
    let (f1, f2) = (fence_of(&first), fence_of(&second));
    assert!(f2 > f1, "{f1} then {f2}");
    let suspended = a.jobs().get(&job_a).await.unwrap();
    assert_eq!(
        suspended.spec.as_ref().and_then(|s| s.suspend),
        Some(true),
        "cluster-a's Job stopped when its lock was lost"
    );
    finish_pods(&b.client, &b.ns, &job_b, true).await;
    // Healed: cluster-a's Job waits for the key again, is granted it, finds the run
    // completed (by cluster-b, with fence f2) and is deleted unrun.
    proxy.set_mode(Mode::Pass);
    support::eventually("cluster-a's Job deleted unrun", PATIENCE, || async {
        a.jobs().get_opt(&job_a).await.ok()?.is_none().then_some(())
    })
    .await;
    let notes = a.events("RunCompleted").await;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("in cluster cluster-b") && n.contains(&format!("fence {f2}"))),
        "{notes:?}"
    );
}

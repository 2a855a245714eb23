//! Work stops when its lock is lost (docs/design.md §6.1): a gated Job whose lock is no
//! longer held is suspended — the real Job controller (kube-controller-manager in the
//! shared control plane) deletes its Pods — before anyone else can acquire the key;
//! then it waits for the lock again and restarts with a new fence. `on-lock-lost:
//! fail` stops it for good, `ignore` only warns.
//!
//! The loss trials cut one controller off from its store with the fault proxy while a
//! second controller (another cluster name, its own namespace, the store reached
//! directly) waits on the same key, and measure, per trial,
//! `margin = contender acquired − Job stopped`, both on this machine's wall clock and
//! both conservative: "stopped" is when the test's watches *saw* the Job suspended and
//! every Pod terminating or gone (later than it happened), "acquired" is a lower bound
//! (the later of the contender record's `acquiredAt`, stamped before its write, and
//! the send time of the last store read that still showed another holder).
//!
//! Timing argument (S3, lease 4 s, renew 1 s; docs/design.md §3 rules 1 and 2; the
//! durations from `support::timescale`): the holder stops claiming at
//! `sent + 4 s × 0.98 − 0.25 s`; the contender, observing the holder's last record from
//! no earlier than `sent`, takes over no sooner than `(4 s + D + 0.25 s) × 0.98` later,
//! `D` the lock-delay the controller gives the Job's lock for its Pods' grace (7 s for
//! the trials' 1 s, `timescale::LOSS_GRACE_SECONDS`: the Pods are never bound here, so
//! the grace acts through `D` alone): at least ~0.5 s + `D`, plus the contender's poll
//! delay, for the chain lock status → Job watch → suspend patch → Job controller. ZooKeeper
//! (no lock-delay there): the holder stops claiming when its client declares the 10 s
//! session disconnected, 4–4.5 s after the last reply it had (docs/design.md §3,
//! ZooKeeper), and the server expires the session no sooner than 10 s after it last
//! heard from the client: about 5.5 s (it would be only the 0.45 s of `10 s × 0.02 +
//! 0.25 s` if the holder ran out its deadline). `LOCKWARDEN_LOSS_TRIALS` trials per store (default 2),
//! S3's side by side, ZooKeeper's one at a time and alone ([`ALONE`]). Run with
//! `--test-threads=4`.

use lockwarden_testsupport as support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use lockwarden::api::{
    BackendSpec, DistributedLock, KubernetesBackend, LockPhase, S3Backend, SecretRef,
    ZooKeeperBackend,
};
use lockwarden::backend::{AwsOptions, ConnectOptions, Credentials, S3Options, Target};
use lockwarden::controller::FINALIZER;
use lockwarden::controller::jobs::{
    CLAIM_ANNOTATION, FENCE_ANNOTATION, LOCK_ANNOTATION, LOST_FENCE_ANNOTATION,
    ON_LOCK_LOST_ANNOTATION, STATUS_ANNOTATION, STOPPED_ANNOTATION, TEMPLATE_ANNOTATION,
    per_job_lock_name, template_annotation,
};
use lockwarden::lock::LockBackend;
use serde_json::json;
use support::eventually;
use support::kube::{
    finish_pods, job as gated_job, job_pods, namespace_with_observed_controller,
    wait_pods_with_fence,
};
use support::proxy::{Mode, Proxy};
use support::timescale::{LOSS_GRACE_SECONDS, LOSS_LEASE, LOSS_RENEW};

/// Generous: the test machine is a loaded 2-core box.
const TIMEOUT: Duration = Duration::from_secs(120);

/// One namespace with its own in-process controller (its own cluster name).
struct Side {
    client: Client,
    /// The controller's metrics.
    telemetry: std::sync::Arc<lockwarden::telemetry::Telemetry>,
    ns: String,
    cluster: &'static str,
    jobs: Api<Job>,
    locks: Api<DistributedLock>,
}

async fn side(prefix: &str, cluster: &'static str) -> Side {
    let (client, ns, telemetry) = namespace_with_observed_controller(prefix, cluster).await;
    Side {
        telemetry,
        jobs: Api::namespaced(client.clone(), &ns),
        locks: Api::namespaced(client.clone(), &ns),
        client,
        ns,
        cluster,
    }
}

impl Side {
    /// The holder identity of Job `job`'s own lock (the controller's convention).
    fn job_holder(&self, job: &Job) -> String {
        format!(
            "{}/{}/job/{}/{}",
            self.cluster,
            self.ns,
            job.name_any(),
            job.uid().unwrap()
        )
    }

    async fn job(&self, name: &str) -> Job {
        self.jobs.get(name).await.unwrap()
    }

    /// Waits until Job `name` runs: unsuspended, and its Pods (made by the Job
    /// controller) carry its fence; returns that fence.
    async fn wait_running(&self, name: &str, above: i64) -> i64 {
        let job = eventually(
            &format!("Job {name} running with a fence above {above}"),
            TIMEOUT,
            || async {
                let job = self.jobs.get(name).await.ok()?;
                // A stopped Job must stay able to run again: lockwarden's delete of its
                // Pods must not count as their failure (`jobs::untrack`).
                let failed = job.status.as_ref().and_then(|s| s.conditions.as_ref());
                if let Some(c) = failed.and_then(|c| c.iter().find(|c| c.type_ == "Failed")) {
                    panic!(
                        "Job {name} failed for good ({:?}: {:?}) instead of waiting to run again",
                        c.reason, c.message
                    );
                }
                (!suspended(&job) && fence(&job)? > above).then_some(job)
            },
        )
        .await;
        let fence = fence(&job).unwrap();
        wait_pods_with_fence(&self.client, &self.ns, name, fence).await;
        fence
    }

    async fn wait_event(&self, name: &str, type_: &str, reason: &str, words: &str) -> String {
        support::kube::wait_event(&self.client, &self.ns, name, type_, reason, words).await
    }

    /// A Secret `aws` with moto's test credentials.
    async fn aws_secret(&self) -> SecretRef {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "aws"},
            "stringData": {
                "AWS_ACCESS_KEY_ID": support::moto::ACCESS_KEY_ID,
                "AWS_SECRET_ACCESS_KEY": support::moto::SECRET_ACCESS_KEY,
            },
        }))
        .unwrap();
        Api::<Secret>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        SecretRef { name: "aws".into() }
    }
}

fn suspended(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false)
}

fn fence(job: &Job) -> Option<i64> {
    template_annotation(job, FENCE_ANNOTATION)?.parse().ok()
}

fn lock(name: &str, backend: BackendSpec, lease: &str, renew: &str) -> DistributedLock {
    support::locks::lock_on(name, backend, lease, renew)
}

fn lease_backend(lease: &str) -> BackendSpec {
    BackendSpec {
        kubernetes: Some(KubernetesBackend {
            lease_name: lease.into(),
            namespace: None,
        }),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------
// Loss trials

/// How one side reaches the store of the trials.
#[derive(Clone)]
enum Store {
    S3 {
        bucket: String,
        endpoint: String,
        secret: SecretRef,
    },
    ZooKeeper {
        server: String,
    },
}

impl Store {
    /// The same store reached through `proxy` (in front of it).
    fn through(&self, proxy: &Proxy) -> Store {
        match self {
            Store::S3 { bucket, secret, .. } => Store::S3 {
                bucket: bucket.clone(),
                endpoint: proxy.endpoint(),
                secret: secret.clone(),
            },
            Store::ZooKeeper { .. } => Store::ZooKeeper {
                server: proxy.address(),
            },
        }
    }

    fn backend(&self, key: &str) -> BackendSpec {
        match self {
            Store::S3 {
                bucket,
                endpoint,
                secret,
            } => BackendSpec {
                s3: Some(S3Backend {
                    bucket: bucket.clone(),
                    key: key.into(),
                    region: Some(support::moto::REGION.into()),
                    endpoint: Some(endpoint.clone()),
                    force_path_style: Some(true),
                    s3lock_compatible: None,
                    terraform_compatible: None,
                    credentials_secret_ref: Some(secret.clone()),
                }),
                ..Default::default()
            },
            Store::ZooKeeper { server } => BackendSpec {
                zookeeper: Some(ZooKeeperBackend {
                    servers: vec![server.clone()],
                    path: format!("/lockwarden-loss/{key}"),
                    chroot: None,
                    session_timeout: None,
                }),
                ..Default::default()
            },
        }
    }
}

/// The trials' two sides and the store: side A's controller reaches it through a fault
/// proxy of each trial's own (in front of `upstream`), side B's directly.
struct Trials {
    name: &'static str,
    a: Side,
    b: Side,
    upstream: u16,
    a_store: Store,
    b_store: Store,
    /// Trials side by side (each on its own key, proxy and Jobs), or one at a time.
    side_by_side: bool,
    /// The test's own view of the store (a third connection, never cut).
    inspect: Box<dyn Fn(&str) -> Target + Send + Sync>,
    inspect_options: ConnectOptions,
}

fn trial_count() -> usize {
    std::env::var("LOCKWARDEN_LOSS_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

/// The ZooKeeper trials measure a margin of a few hundred milliseconds (no lock-delay
/// there: the session's expiry against the holder's deadline, rule 2), which anything
/// running alongside would blur: they run alone, after the binary's other tests (which
/// hold this shared; run with `--test-threads=4`, every test starts at once). The S3
/// trials' margin is the lock-delay's seconds, and they run beside the others.
static ALONE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// [`ALONE`] taken alone, once no test holds it: a second first, so that the tests
/// started with this one have taken it shared.
async fn alone() -> tokio::sync::RwLockWriteGuard<'static, ()> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    loop {
        if let Ok(guard) = ALONE.try_write() {
            return guard;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_gated_job_is_suspended_before_a_contender_acquires() {
    let _shared = ALONE.read().await;
    let moto = tokio::task::spawn_blocking(support::moto::Moto::shared)
        .await
        .unwrap();
    let bucket = moto.new_bucket("loss").await;
    let a = side("loss-s3-a", "loss-a").await;
    let b = side("loss-s3-b", "loss-b").await;
    let (a_secret, b_secret) = (a.aws_secret().await, b.aws_secret().await);
    let inspect_bucket = bucket.clone();
    let trials = Trials {
        name: "S3",
        a_store: Store::S3 {
            bucket: bucket.clone(),
            endpoint: moto.endpoint(),
            secret: a_secret,
        },
        b_store: Store::S3 {
            bucket,
            endpoint: moto.endpoint(),
            secret: b_secret,
        },
        a,
        b,
        upstream: moto.port(),
        side_by_side: true,
        inspect: Box::new(move |key| {
            Target::parse(&format!("s3://{inspect_bucket}/{key}")).unwrap()
        }),
        inspect_options: ConnectOptions {
            aws: AwsOptions {
                endpoint: Some(moto.endpoint()),
                region: Some(support::moto::REGION.into()),
                credentials: Some(Credentials::new(
                    support::moto::ACCESS_KEY_ID,
                    support::moto::SECRET_ACCESS_KEY,
                    None,
                )),
                ..Default::default()
            },
            s3: S3Options {
                force_path_style: Some(true),
                ..Default::default()
            },
            ..Default::default()
        },
    };
    run_trials(&trials, LOSS_LEASE, LOSS_RENEW).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_gated_job_is_suspended_before_a_contender_acquires() {
    let _alone = alone().await;
    let zk = tokio::task::spawn_blocking(support::zookeeper::ZooKeeper::shared)
        .await
        .unwrap();
    let port = zk.node(0).port();
    let a = side("loss-zk-a", "loss-a").await;
    let b = side("loss-zk-b", "loss-b").await;
    // Three spellings of the server, three sessions (the registry keys sessions by
    // spelling): side A's through each trial's proxy, side B's and the test's direct.
    let trials = Trials {
        name: "ZooKeeper",
        a_store: Store::ZooKeeper {
            server: format!("127.0.0.1:{port}"),
        },
        b_store: Store::ZooKeeper {
            server: format!("localhost:{port}"),
        },
        a,
        b,
        upstream: port,
        side_by_side: false,
        inspect: Box::new(move |key| {
            Target::parse(&format!("zk://127.0.0.1:{port}/lockwarden-loss/{key}")).unwrap()
        }),
        inspect_options: ConnectOptions::default(),
    };
    // The lease of a ZooKeeper lock is its session's timeout (10 s); the lease here only
    // sets the renewal policy.
    run_trials(&trials, LOSS_LEASE, LOSS_RENEW).await;
}

async fn run_trials(trials: &Trials, lease: &str, renew: &str) {
    let n = trial_count();
    let one = |i: usize| async move {
        let margin = trial(trials, i, lease, renew).await;
        eprintln!(
            "[{}] trial {}/{n}: margin {:+.3} s (contender acquired − Job stopped)",
            trials.name,
            i + 1,
            margin
        );
        margin
    };
    let margins: Vec<f64> = if trials.side_by_side {
        futures::future::join_all((0..n).map(one)).await
    } else {
        let mut margins = Vec::with_capacity(n);
        for i in 0..n {
            margins.push(one(i).await);
        }
        margins
    };
    let mut sorted = margins.clone();
    sorted.sort_by(|x, y| x.partial_cmp(y).unwrap());
    eprintln!(
        "[{}] {n} trials: margins (s) {margins:.3?}; min {:.3}, median {:.3}",
        trials.name,
        sorted[0],
        sorted[n / 2]
    );
    assert!(
        margins.iter().all(|m| *m > 0.0),
        "[{}] a contender acquired before the Job was stopped: margins {margins:.3?}",
        trials.name
    );
}

/// One trial; returns `contender acquired − Job stopped`, in seconds.
async fn trial(t: &Trials, i: usize, lease: &str, renew: &str) -> f64 {
    let key = support::unique(&format!("loss-{i}"));
    let (a, b) = (&t.a, &t.b);
    let template = format!("t-{i}");
    let proxy = Proxy::start(t.upstream);
    let a_store = t.a_store.through(&proxy);
    for (side, store) in [(a, &a_store), (b, &t.b_store)] {
        let mut lock = lock(&template, store.backend(&key), lease, renew);
        lock.spec.release = true;
        side.locks
            .create(&PostParams::default(), &lock)
            .await
            .unwrap();
    }

    // A's Job runs; B's waits for the same key under the other controller.
    let (a_name, b_name) = (format!("a-{i}"), format!("b-{i}"));
    let on_template = [(TEMPLATE_ANNOTATION, template.as_str())];
    a.jobs
        .create(
            &PostParams::default(),
            &with_grace(gated_job(&a_name, &on_template, true)),
        )
        .await
        .unwrap();
    let first = a.wait_running(&a_name, 0).await;
    let b_job = b
        .jobs
        .create(
            &PostParams::default(),
            &with_grace(gated_job(&b_name, &on_template, true)),
        )
        .await
        .unwrap();
    let b_lock = per_job_lock_name(&b_job);
    eventually("B's lock to wait for A's", TIMEOUT, || async {
        let lock = b.locks.get(&b_lock).await.ok()?;
        (lock.status?.phase == Some(LockPhase::Waiting)).then_some(())
    })
    .await;

    // Cut A's controller off from the store.
    let stopped = watch_stopped(a.client.clone(), a.ns.clone(), a_name.clone()).await;
    let backend = (t.inspect)(&key).connect(&t.inspect_options).await.unwrap();
    let acquired = tokio::spawn(watch_acquired(backend, b.job_holder(&b_job)));
    proxy.set_mode(Mode::Blackhole);

    let stopped_at = tokio::time::timeout(TIMEOUT, stopped)
        .await
        .expect("A's Job stopped in time")
        .unwrap();
    let (acquired_at, b_fence) = tokio::time::timeout(TIMEOUT, acquired)
        .await
        .expect("B acquired in time")
        .unwrap();
    let margin = match acquired_at.duration_since(stopped_at) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    };

    // A's Job: suspended by lockwarden, remembering the fence it lost; B's runs with a
    // higher fence.
    let job = a.job(&a_name).await;
    assert!(suspended(&job));
    assert_eq!(
        job.annotations().get(LOST_FENCE_ANNOTATION),
        Some(&first.to_string())
    );
    a.wait_event(
        &a_name,
        "Warning",
        "Suspended",
        &format!("ran with fence {first}"),
    )
    .await;
    let second = b.wait_running(&b_name, first).await;
    assert_eq!(second, b_fence);

    // Heal. When B's Job ends, A's runs again with a fence above both.
    proxy.set_mode(Mode::Pass);
    finish_pods(&b.client, &b.ns, &b_name, true).await;
    let third = a.wait_running(&a_name, second).await;
    assert!(
        third > second && second > first,
        "{first} < {second} < {third}"
    );
    finish_pods(&a.client, &a.ns, &a_name, true).await;
    margin
}

/// `job` with the loss trials' grace period (`timescale::LOSS_GRACE_SECONDS`).
fn with_grace(mut job: Job) -> Job {
    let pod = job.spec.as_mut().unwrap().template.spec.as_mut().unwrap();
    pod.termination_grace_period_seconds = Some(LOSS_GRACE_SECONDS);
    job
}

/// Resolves (once the watches are running) to a task that yields the wall-clock time
/// at which Job `name` is first seen stopped: `spec.suspend` true and every Pod it had
/// terminating or gone. Event-driven: the Job and its Pods are watched, not polled.
async fn watch_stopped(
    client: Client,
    ns: String,
    name: String,
) -> tokio::task::JoinHandle<SystemTime> {
    enum Seen {
        Job(Box<watcher::Event<Job>>),
        Pod(Box<watcher::Event<Pod>>),
    }
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let jobs = Api::<Job>::namespaced(client.clone(), &ns);
        let pods = Api::<Pod>::namespaced(client, &ns);
        let job_events = watcher(
            jobs,
            watcher::Config::default().fields(&format!("metadata.name={name}")),
        )
        .filter_map(|e| async move { e.ok().map(|e| Seen::Job(Box::new(e))) });
        let pod_events = watcher(
            pods,
            watcher::Config::default().labels(&format!("batch.kubernetes.io/job-name={name}")),
        )
        .filter_map(|e| async move { e.ok().map(|e| Seen::Pod(Box::new(e))) });
        let mut events = futures::stream::select(job_events.boxed(), pod_events.boxed());
        let (mut job_suspended, mut jobs_listed, mut pods_listed) = (false, false, false);
        // Pod name → terminating.
        let mut live: BTreeMap<String, bool> = BTreeMap::new();
        let mut ready = Some(ready_tx);
        while let Some(seen) = events.next().await {
            match seen {
                Seen::Job(event) => match *event {
                    watcher::Event::Apply(j) | watcher::Event::InitApply(j) => {
                        job_suspended = suspended(&j);
                    }
                    watcher::Event::InitDone => jobs_listed = true,
                    _ => {}
                },
                Seen::Pod(event) => match *event {
                    watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                        live.insert(p.name_any(), p.metadata.deletion_timestamp.is_some());
                    }
                    watcher::Event::Delete(p) => {
                        live.remove(&p.name_any());
                    }
                    watcher::Event::Init => live.clear(),
                    watcher::Event::InitDone => pods_listed = true,
                },
            }
            if jobs_listed && pods_listed {
                if let Some(tx) = ready.take() {
                    assert!(!live.is_empty(), "Job {name} has no Pods to stop");
                    let _ = tx.send(());
                }
                if job_suspended && live.values().all(|terminating| *terminating) {
                    return SystemTime::now();
                }
            }
        }
        panic!("the watches of Job {name} ended");
    });
    tokio::time::timeout(TIMEOUT, ready_rx)
        .await
        .expect("the watches of the Job and its Pods started")
        .expect("the watch task is alive");
    task
}

/// Reads the store every 50 ms until `holder` holds the key; returns a lower bound of
/// when it acquired (the later of its record's `acquiredAt`, stamped before its write,
/// and the send time of the last read that still showed another holder or none) and
/// its fence.
async fn watch_acquired(backend: Arc<dyn LockBackend>, holder: String) -> (SystemTime, i64) {
    let mut last_other = SystemTime::UNIX_EPOCH;
    loop {
        let sent = SystemTime::now();
        if let Ok(Some(stored)) = backend.inspect().await
            && let Ok(record) = stored.record
            && record.holder == holder
            && record.state == lockwarden::lock::LockState::Held
        {
            return (last_other.max(record.acquired_at), record.fence.0 as i64);
        }
        last_other = sent;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------
// fail and ignore

/// A running Job on lock `db` (a Lease, renewed every 2 s, so a takeover is noticed
/// quickly), with `on-lock-lost: policy`; returns its fence.
async fn running_job_on_lease(side: &Side, job: &str, policy: &str) -> i64 {
    side.locks
        .create(
            &PostParams::default(),
            &lock("db", lease_backend("db-lease"), "6s", "2s"),
        )
        .await
        .unwrap();
    side.jobs
        .create(
            &PostParams::default(),
            &gated_job(
                job,
                &[(LOCK_ANNOTATION, "db"), (ON_LOCK_LOST_ANNOTATION, policy)],
                true,
            ),
        )
        .await
        .unwrap();
    side.wait_running(job, 0).await
}

/// Another DistributedLock takes the Lease over by force: the Job's lock is `Lost`.
async fn take_over_by_force(side: &Side) {
    let mut forcer = lock("forcer", lease_backend("db-lease"), "30s", "10s");
    forcer.spec.force = true;
    side.locks
        .create(&PostParams::default(), &forcer)
        .await
        .unwrap();
}

/// `on-lock-lost: fail`: the Job is suspended (its Pods deleted), marked stopped by
/// lockwarden (annotation and a Warning naming the reason and the fence), its lock
/// released and unclaimed, its finalizer dropped; it is never started again, even once
/// the lock is free and another Job takes it. Counted in `lockwarden_jobs_stopped`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_lock_lost_fail_stops_the_job_for_good() {
    let _shared = ALONE.read().await;
    let side = side("loss-fail", "loss-fail").await;
    let fence = running_job_on_lease(&side, "failing", "fail").await;
    take_over_by_force(&side).await;

    let note = side
        .wait_event("failing", "Warning", "Stopped", &format!("fence {fence}"))
        .await;
    assert!(
        note.contains("Lost") && note.contains("never started again"),
        "{note}"
    );
    eventually("the stopped Job let go of everything", TIMEOUT, || async {
        let job = side.jobs.get("failing").await.ok()?;
        let lock = side.locks.get("db").await.ok()?;
        let pods = job_pods(&side.client, &side.ns, "failing").await;
        (suspended(&job)
            && job.annotations().contains_key(STOPPED_ANNOTATION)
            && !job.finalizers().iter().any(|f| f == FINALIZER)
            && pods.iter().all(|p| p.metadata.deletion_timestamp.is_some())
            && lock.spec.release
            && !lock.annotations().contains_key(CLAIM_ANNOTATION))
        .then_some(())
    })
    .await;
    let metrics = side.telemetry.encode();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("lockwarden_jobs_stopped_total{reason=\"Lost\"}")),
        "{metrics}"
    );

    // The key is free again and another Job takes the lock: the stopped one stays so.
    side.locks
        .delete("forcer", &DeleteParams::default())
        .await
        .unwrap();
    side.jobs
        .create(
            &PostParams::default(),
            &gated_job("next", &[(LOCK_ANNOTATION, "db")], true),
        )
        .await
        .unwrap();
    let next = side.wait_running("next", fence).await;
    let stopped = side.job("failing").await;
    assert!(suspended(&stopped), "a failed Job was started again");
    assert_eq!(self::fence(&stopped), Some(fence));
    assert!(next > fence);
}

/// `on-lock-lost: ignore`: the old behaviour — a Warning that the Job runs with a fence
/// it no longer holds, and nothing else: the Job stays unsuspended, its Pods live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_lock_lost_ignore_only_warns() {
    let _shared = ALONE.read().await;
    let side = side("loss-ignore", "loss-ignore").await;
    let fence = running_job_on_lease(&side, "ignoring", "ignore").await;
    let pods_before = job_pods(&side.client, &side.ns, "ignoring").await;
    take_over_by_force(&side).await;

    let note = side
        .wait_event("ignoring", "Warning", "LockNotHeld", "")
        .await;
    assert!(
        note.contains(&format!("running with fence {fence}")) && note.contains("lock db is Lost"),
        "{note}"
    );
    let job = side.job("ignoring").await;
    assert!(!suspended(&job));
    assert!(!job.annotations().contains_key(LOST_FENCE_ANNOTATION));
    assert!(job.annotations()[STATUS_ANNOTATION].starts_with("running with fence"));
    let pods = job_pods(&side.client, &side.ns, "ignoring").await;
    assert_eq!(
        pods.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
        pods_before.iter().map(|p| p.name_any()).collect::<Vec<_>>()
    );
    assert!(pods.iter().all(|p| p.metadata.deletion_timestamp.is_none()));
}

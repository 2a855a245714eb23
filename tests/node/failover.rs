//! Failover of the in-cluster controller with locks held: 100 DistributedLocks held,
//! 50 on S3 (moto on 127.0.0.1, credentials from a Secret the chart lets the
//! controller read) and 50 on Leases (renew 10 s, the lease sized by a measured Pod
//! start, below; the chart's leader-election lease, 15 s), each key with a waiting contender of another cluster
//! (a DistributedLock in another namespace on the same key, run by a controller in
//! this test process with its own cluster name, which keeps trying while the
//! in-cluster one is down), 10 of the held locks (on S3) gating running Jobs. (a) the controller's process is SIGKILLed (the kubelet restarts
//! the container in place); (b) its Pod is deleted normally (the ReplicaSet makes
//! another); (c) its Pod is deleted with grace period 0 (`--grace-period=0 --force`);
//! (d) first of all, an upgrade: the locks are taken by the previous release's
//! controller (its image, `LOCKWARDEN_PREVIOUS_RELEASE`, under its CRD, installed the
//! way Helm installs it), then `helm upgrade` to this build's image, and the CRD
//! applied the way the README says (Helm never upgrades CRDs; the new controller warns
//! until it is). A watch over the whole run checks that no held lock leaves
//! `Acquired=True` or changes its fence, no contender acquires, no Job is suspended;
//! each case's recovery time (from the fault until every held lock's Lease or S3 record
//! was renewed after it) and the longest time any held lock went without a renewal
//! are printed.
//!
//! The lease (`support::timescale::failover_lease`, printed with its terms): after a
//! fault the locks go unrenewed for up to one renew interval (since the last renewal)
//! plus the election lease (a new leader waits for the old one's claim to expire) plus
//! a controller's start, which the holder's deadline (rule 2) must outlast; the start
//! is bounded by a Pod's start on this node, measured once per binary, times a safety
//! factor of 4, plus 35 s for the controller's own (docs/design.md §5 measured up to
//! 37 s unrenewed on a loaded node, and 53 s after a forced deletion here).

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use lockwarden::api::{DistributedLock, KubernetesBackend, LockPhase};
use serde_json::json;

use super::{
    CONTROLLER, KUBELET, RELEASE, RELEASE_NAMESPACE, TIMEOUT, controller_pid, controller_pods,
    controller_ready, gated_host_network_job, helm, is_true, phase, pod_start, text,
};
use crate::support::locks::{acquired, aws_secret, lease_lock_timed, s3_lock, timed};
use crate::support::moto::Moto;
use crate::support::node::Node;
use crate::support::timescale::{CHART_GRACE_SECONDS, FAILOVER_RENEW, failover_lease};
use crate::support::{eventually, repo_root, tool};
use lockwarden::backend::{AwsOptions, ConnectOptions, Credentials, S3Options, Target};
use lockwarden::lock::LockBackend;

const HELD: usize = 100;
/// Of the held locks, the first this many are on S3, the rest on Leases.
const ON_S3: usize = 50;
const JOBS: usize = 10;

/// What the watch saw go wrong, one line each.
type Violations = Arc<Mutex<Vec<String>>>;

/// Watches the test's locks and Jobs until aborted, recording every violation.
fn watch(client: &Client, ns: &str, fences: HashMap<String, i64>, violations: Violations) {
    let locks = Api::<DistributedLock>::namespaced(client.clone(), ns);
    let seen = violations.clone();
    tokio::spawn(async move {
        let mut events = watcher(locks, watcher::Config::default()).boxed();
        while let Some(event) = events.next().await {
            let lock = match event {
                Ok(watcher::Event::Apply(lock) | watcher::Event::InitApply(lock)) => lock,
                Ok(_) => continue,
                // The CRD's update in (d) restarts its watch cache: the API server ends
                // every watch of DistributedLocks with 410 Gone, and the watcher lists
                // them all again (each checked as it comes back).
                Err(watcher::Error::WatchError(status)) if status.code == 410 => {
                    println!("failover: the lock watch re-lists after a 410 ({status})");
                    continue;
                }
                Err(e) => {
                    seen.lock()
                        .unwrap()
                        .push(format!("the lock watch failed: {e}"));
                    continue;
                }
            };
            let name = lock.name_any();
            let fence = lock.status.as_ref().and_then(|s| s.fence);
            if let Some(want) = fences.get(&name) {
                if !acquired(&lock) {
                    seen.lock().unwrap().push(format!(
                        "{name} left Acquired=True: {:?}",
                        lock.status.as_ref().map(|s| (&s.phase, &s.conditions))
                    ));
                }
                if fence != Some(*want) {
                    seen.lock()
                        .unwrap()
                        .push(format!("{name}'s fence changed: {want} -> {fence:?}"));
                }
            } else if acquired(&lock) {
                seen.lock()
                    .unwrap()
                    .push(format!("contender {name} acquired (fence {fence:?})"));
            }
        }
    });
    let jobs = Api::<Job>::namespaced(client.clone(), ns);
    tokio::spawn(async move {
        let mut events = watcher(jobs, watcher::Config::default()).boxed();
        while let Some(event) = events.next().await {
            if let Ok(watcher::Event::Apply(job) | watcher::Event::InitApply(job)) = event
                && job.spec.as_ref().and_then(|s| s.suspend) == Some(true)
            {
                violations
                    .lock()
                    .unwrap()
                    .push(format!("Job {} was suspended", job.name_any()));
            }
        }
    });
}

/// The held locks' S3 records, read the way `lockwarden status` reads them.
#[derive(Clone)]
struct S3Records(Arc<Vec<Arc<dyn LockBackend>>>);

impl S3Records {
    async fn connect(bucket: &str) -> S3Records {
        let moto = Moto::shared();
        let options = ConnectOptions {
            aws: AwsOptions {
                endpoint: Some(moto.endpoint()),
                region: Some(crate::support::moto::REGION.into()),
                credentials: Some(Credentials::new(
                    crate::support::moto::ACCESS_KEY_ID,
                    crate::support::moto::SECRET_ACCESS_KEY,
                    None,
                )),
                ..AwsOptions::default()
            },
            s3: S3Options {
                force_path_style: Some(true),
                ..S3Options::default()
            },
            ..ConnectOptions::default()
        };
        let mut backends = Vec::new();
        for i in 0..ON_S3 {
            let target = Target::parse(&format!("s3://{bucket}/key-{i}")).unwrap();
            backends.push(target.connect(&options).await.expect("an S3 backend"));
        }
        S3Records(Arc::new(backends))
    }

    /// When each key's record was last renewed (`None`: unreadable now).
    async fn renewed(&self) -> Vec<Option<std::time::SystemTime>> {
        let mut out = Vec::new();
        for backend in self.0.iter() {
            let renewed = match backend.inspect().await {
                Ok(Some(stored)) => stored.record.ok().map(|r| r.renewed_at),
                _ => None,
            };
            out.push(renewed);
        }
        out
    }
}

/// Polls the held Leases until aborted; the longest gap between two renewals seen.
fn watch_renewal_gaps(client: &Client, ns: &str, s3: S3Records) -> Arc<Mutex<Duration>> {
    let leases = Api::<Lease>::namespaced(client.clone(), ns);
    let longest = Arc::new(Mutex::new(Duration::ZERO));
    let out = longest.clone();
    let s3_out = longest.clone();
    tokio::spawn(async move {
        // S3 records every 2 s (moto serializes its requests; the holders' and the
        // contenders' come first).
        let mut last: Vec<Option<std::time::SystemTime>> = vec![None; ON_S3];
        loop {
            for (i, renewed) in s3.renewed().await.into_iter().enumerate() {
                if let (Some(previous), Some(now)) = (last[i], renewed)
                    && let Ok(gap) = now.duration_since(previous)
                {
                    let mut longest = s3_out.lock().unwrap();
                    *longest = (*longest).max(gap);
                }
                if renewed.is_some() {
                    last[i] = renewed;
                }
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    });
    tokio::spawn(async move {
        let mut last: HashMap<String, Timestamp> = HashMap::new();
        loop {
            if let Ok(list) = leases.list(&ListParams::default()).await {
                for lease in list.items {
                    let Some(renewed) = lease.spec.as_ref().and_then(|s| s.renew_time.clone())
                    else {
                        continue;
                    };
                    if let Some(previous) = last.insert(lease.name_any(), renewed.0)
                        && let Ok(gap) = Duration::try_from(renewed.0.duration_since(previous))
                    {
                        let mut longest = out.lock().unwrap();
                        *longest = (*longest).max(gap);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    longest
}

/// A Job of one long-running hostNetwork Pod, gated on `lock`.
fn sleeping_job(name: &str, lock: &str, image: &str) -> Job {
    let container = json!({
        "name": "work", "image": image, "imagePullPolicy": "Never",
        "command": ["sleep", "3600"],
    });
    gated_host_network_job(name, lock, container, None)
}

/// Waits until every held lock (its Lease or its S3 record) was renewed after `since`;
/// returns how long after `started` that was.
async fn wait_all_renewed(
    client: &Client,
    ns: &str,
    s3: &S3Records,
    since: Timestamp,
    started: Instant,
) -> Duration {
    let leases = Api::<Lease>::namespaced(client.clone(), ns);
    let since_wall = std::time::SystemTime::from(since);
    eventually(
        "every held lock renewed after the fault",
        TIMEOUT,
        || async {
            let list = leases.list(&ListParams::default()).await.ok()?;
            let leases_renewed = list
                .items
                .iter()
                .filter(|l| {
                    l.spec
                        .as_ref()
                        .and_then(|s| s.renew_time.as_ref())
                        .is_some_and(|t| t.0 > since)
                })
                .count();
            let s3_renewed = s3
                .renewed()
                .await
                .into_iter()
                .filter(|r| r.is_some_and(|t| t > since_wall))
                .count();
            (list.items.len() == HELD - ON_S3
                && leases_renewed == HELD - ON_S3
                && s3_renewed == ON_S3)
                .then(|| started.elapsed())
        },
    )
    .await
}

/// Deletes the controller Pod `name` with `params`, waits for another one to be Ready;
/// returns how long after the delete every held lock had been renewed.
async fn delete_and_recover(
    client: &Client,
    ns: &str,
    s3: &S3Records,
    name: &str,
    params: DeleteParams,
) -> Duration {
    let controllers = Api::<Pod>::namespaced(client.clone(), RELEASE_NAMESPACE);
    let (since, started) = (Timestamp::now(), Instant::now());
    controllers
        .delete(name, &params)
        .await
        .expect("delete the controller Pod");
    eventually("a new controller Pod Ready", TIMEOUT, || async {
        let pods = controller_pods(client).await;
        pods.iter()
            .any(|p| p.name_any() != name && is_true(p, "Ready"))
            .then_some(())
    })
    .await;
    wait_all_renewed(client, ns, s3, since, started).await
}

fn restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map(|c| c.restart_count)
        .unwrap_or(0)
}

/// The image tag of `reference` (`repository:tag`).
fn tag_of(reference: &str) -> &str {
    reference.rsplit_once(':').expect("an image with a tag").1
}

/// The controller Pod Ready and running `image`: waits for it (an upgrade replaces the
/// Pod), returns it.
async fn controller_on(client: &Client, image: &str) -> Pod {
    eventually(
        &format!("a Ready controller Pod running {image}"),
        TIMEOUT,
        || async {
            // Not `controller_pods`: the API server drops connections while it reloads
            // a replaced CRD, and a failed poll is only a poll.
            let pods = Api::<Pod>::namespaced(client.clone(), RELEASE_NAMESPACE)
                .list(&ListParams::default().labels("app.kubernetes.io/instance=lockwarden"))
                .await
                .ok()?;
            pods.items.into_iter().find(|p| {
                is_true(p, "Ready")
                    && p.spec.as_ref().is_some_and(|s| {
                        s.containers
                            .iter()
                            .any(|c| c.image.as_deref() == Some(image))
                    })
            })
        },
    )
    .await
}

/// `helm upgrade` of the release to `image`'s tag (and `set`, if any), every other
/// value kept.
fn upgrade_to(node: &Node, image: &str, set: Option<&str>) {
    let chart = repo_root().join("charts/lockwarden");
    let mut tag = format!("image.tag={}", tag_of(image));
    if let Some(set) = set {
        tag = format!("{tag},{set}");
    }
    let out = helm(
        node,
        &[
            "upgrade",
            RELEASE,
            &chart.display().to_string(),
            "--namespace",
            RELEASE_NAMESPACE,
            "--reuse-values",
            "--set",
            &tag,
        ],
    );
    assert!(
        out.status.success(),
        "helm upgrade to {image} failed:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// The previous release's CRD, replacing the installed one the way Helm installs a CRD
/// (an update, not a server-side apply): what a cluster running that release has.
async fn install_previous_crd(client: &Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::PostParams;
    let path = tool("LOCKWARDEN_PREVIOUS_CRD");
    let yaml = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("read the previous release's CRD {}: {e}", path.display()));
    let mut previous: CustomResourceDefinition =
        serde_yaml_ng::from_str(&yaml).expect("the previous release's CRD");
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let installed = crds
        .get(lockwarden::api::CRD_NAME)
        .await
        .expect("the installed CRD");
    previous.metadata.resource_version = installed.metadata.resource_version;
    crds.replace(lockwarden::api::CRD_NAME, &PostParams::default(), &previous)
        .await
        .expect("install the previous release's CRD");
    let now = crds.get(lockwarden::api::CRD_NAME).await.unwrap();
    assert_eq!(
        lockwarden::api::installed_crd_revision(&now),
        Ok(1),
        "the previous release's CRD has no revision annotation"
    );
}

/// The README's step after `helm upgrade`: `kubectl apply --server-side
/// --force-conflicts` of the chart's CRDs (without `--force-conflicts` the API server
/// refuses it: the fields the install wrote have another manager).
fn apply_chart_crds(node: &Node) {
    let out = Command::new(tool("KUBECTL"))
        .arg("--kubeconfig")
        .arg(node.plane().kubeconfig_path())
        .args(["apply", "--server-side", "--force-conflicts", "-f"])
        .arg(repo_root().join("charts/lockwarden/crds/"))
        .output()
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "kubectl apply of the chart's CRDs failed:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// (d), then (a), (b) and (c) on one set of 100 held, contended locks, 10 of them
/// gating running Jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_failover_keeps_every_lock_held_and_every_job_running() {
    // Alone with the controller: the faults below are not other tests' business. The
    // kubelet is shared: the test's Pods need it, and no other test cuts it meanwhile.
    let _kubelet = KUBELET.read().await;
    let _alone = super::exclusive(&CONTROLLER).await;
    let (node, client) = controller_ready().await;
    // Fails here, naming the archive, if the previous release's image is not there.
    let (previous, current) = (node.images().previous(), &node.images().lockwarden);
    let lease = failover_lease(pod_start(node, &client).await);
    let (lease, renew) = (
        format!("{}s", lease.as_secs()),
        format!("{}s", FAILOVER_RENEW.as_secs()),
    );
    install_previous_crd(&client).await;
    upgrade_to(node, previous, None);
    controller_on(&client, previous).await;
    // The release may read Secrets here (rbac.secretNamespaces): the S3 credentials.
    let ns = super::FAILOVER_NAMESPACE.to_string();
    aws_secret(&client, &ns).await;
    let bucket = Moto::shared().new_bucket("node-failover").await;
    let s3 = S3Records::connect(&bucket).await;
    let held_lock = |name: &str, i: usize| {
        if i < ON_S3 {
            timed(
                s3_lock(
                    name,
                    &bucket,
                    &format!("key-{i}"),
                    Moto::shared().endpoint(),
                    "aws",
                ),
                &lease,
                &renew,
            )
        } else {
            lease_lock_timed(name, &format!("key-{i}"), &lease, &renew)
        }
    };
    let locks = Api::<DistributedLock>::namespaced(client.clone(), &ns);
    let jobs = Api::<Job>::namespaced(client.clone(), &ns);
    let image = &node.images().workload;
    for i in 0..HELD {
        let lock = held_lock(&format!("held-{i}"), i);
        locks
            .create(&PostParams::default(), &lock)
            .await
            .expect("create a held lock");
        if i < JOBS {
            jobs.create(
                &PostParams::default(),
                &sleeping_job(&format!("job-{i}"), &format!("held-{i}"), image),
            )
            .await
            .expect("create a gated Job");
        }
    }
    let fences: HashMap<String, i64> = eventually("every held lock Acquired", TIMEOUT, || async {
        let list = locks.list(&ListParams::default()).await.ok()?;
        let held: HashMap<String, i64> = list
            .items
            .iter()
            .filter(|l| acquired(l))
            .filter_map(|l| Some((l.name_any(), l.status.as_ref()?.fence?)))
            .collect();
        (held.len() == HELD).then_some(held)
    })
    .await;
    // The contenders: another cluster's locks on the same Leases, run by a controller
    // of this process (cluster name "contender") watching only their namespace.
    let contender_ns = node.namespace(&client, "node-contenders").await;
    let contenders = Api::<DistributedLock>::namespaced(client.clone(), &contender_ns);
    aws_secret(&client, &contender_ns).await;
    for i in 0..HELD {
        let mut lock = held_lock(&format!("wait-{i}"), i);
        if i >= ON_S3 {
            lock.spec.backend.kubernetes = Some(KubernetesBackend {
                lease_name: format!("key-{i}"),
                namespace: Some(ns.clone()),
            });
        }
        contenders
            .create(&PostParams::default(), &lock)
            .await
            .expect("create a contender");
    }
    let config = lockwarden::controller::ControllerConfig {
        cluster_name: "contender".into(),
        namespace: Some(contender_ns.clone()),
        ..Default::default()
    };
    let contender_client = client.clone();
    let contender = tokio::spawn(async move {
        let telemetry = Arc::new(lockwarden::telemetry::Telemetry::new());
        lockwarden::controller::run_with(contender_client, config, telemetry).await
    });
    eventually("every contender Waiting", TIMEOUT, || async {
        let list = contenders.list(&ListParams::default()).await.ok()?;
        let waiting = list
            .items
            .iter()
            .filter(|l| l.status.as_ref().and_then(|s| s.phase) == Some(LockPhase::Waiting))
            .count();
        (waiting == HELD).then_some(())
    })
    .await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    eventually("every gated Job's Pod Running", TIMEOUT, || async {
        let list = pods.list(&ListParams::default()).await.ok()?;
        let running = list.items.iter().filter(|p| phase(p) == "Running").count();
        (running == JOBS).then_some(())
    })
    .await;
    let violations: Violations = Arc::default();
    watch(&client, &ns, fences, violations.clone());
    watch(&client, &contender_ns, HashMap::new(), violations.clone());
    let longest_gap = watch_renewal_gaps(&client, &ns, s3.clone());

    // (d) `helm upgrade` to this build's image, then the CRD as the README says: the
    // new controller resumes every lock by its nonce (the formats of consecutive
    // releases are kept compatible, docs/design.md §3) and warns about the CRD. The
    // upgrade also gives the Pod back the chart's default grace, which (b) waits out.
    let (since, started) = (Timestamp::now(), Instant::now());
    upgrade_to(
        node,
        current,
        Some(&format!(
            "terminationGracePeriodSeconds={CHART_GRACE_SECONDS}"
        )),
    );
    let upgraded = controller_on(&client, current).await;
    let warned = eventually(
        "the upgraded controller's warning about the older CRD",
        TIMEOUT,
        || async {
            let out = Api::<Pod>::namespaced(client.clone(), RELEASE_NAMESPACE)
                .logs(&upgraded.name_any(), &Default::default())
                .await
                .ok()?;
            out.lines()
                .find(|l| l.contains("CRD is revision 1, older than this controller's"))
                .map(str::to_string)
        },
    )
    .await;
    println!("failover (d) the upgraded controller says: {warned}");
    apply_chart_crds(node);
    let upgrade = wait_all_renewed(&client, &ns, &s3, since, started).await;
    println!(
        "failover (d) helm upgrade from the previous release: every held lock renewed {upgrade:.1?} after it"
    );

    // (a) SIGKILL: the kubelet restarts the container in the same Pod.
    let pod = controller_pods(&client).await.into_iter().next().unwrap();
    let pid = controller_pid(&pod).expect("the controller's process on this host");
    let (since, started) = (Timestamp::now(), Instant::now());
    // SAFETY: a signal to the PID of the controller container's process.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let controllers = Api::<Pod>::namespaced(client.clone(), RELEASE_NAMESPACE);
    let name = pod.name_any();
    let before = restarts(&pod);
    eventually(
        "the controller restarted in place and Ready",
        TIMEOUT,
        || async {
            let p = controllers.get(&name).await.ok()?;
            (restarts(&p) > before && is_true(&p, "Ready")).then_some(())
        },
    )
    .await;
    let sigkill = wait_all_renewed(&client, &ns, &s3, since, started).await;
    println!("failover (a) SIGKILL: every held lock renewed {sigkill:.1?} after the kill");

    // (b) the Pod deleted normally: another Pod, another identity in the election. The
    // controller ignores SIGTERM (PID 1 without a handler), so the old one runs, and
    // renews, for the whole grace period (the chart's default 30 s: the full-scale
    // instance; the release's other replacements wait its scaled grace); only then may
    // the new Pod take the node's host port, win the election and resume the locks.
    let deleted = delete_and_recover(&client, &ns, &s3, &name, DeleteParams::default()).await;
    println!("failover (b) Pod deleted: every held lock renewed {deleted:.1?} after the delete");

    // (c) deleted with --grace-period=0 --force: the API object goes at once and the new
    // Pod is scheduled while the old container may still run (the kubelet kills it
    // shortly after). Safe because only the leader acts: the new controller cannot lead
    // while the old one's election Lease is valid, and the old one stops with its
    // process (a replica that loses the election exits at once).
    let current = controller_pods(&client)
        .await
        .into_iter()
        .find(|p| is_true(p, "Ready"))
        .expect("a Ready controller Pod");
    let forced = delete_and_recover(
        &client,
        &ns,
        &s3,
        &current.name_any(),
        DeleteParams::default().grace_period(0),
    )
    .await;
    println!(
        "failover (c) Pod force-deleted: every held lock renewed {forced:.1?} after the delete"
    );

    // One more renewal period under the watch: a late effect of either fault shows.
    tokio::time::sleep(FAILOVER_RENEW + Duration::from_secs(2)).await;
    let list = locks.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.iter().filter(|l| acquired(l)).count(), HELD);
    println!(
        "failover: the longest time a held lock went without renewal: {:.1?} (lease {lease})",
        *longest_gap.lock().unwrap()
    );
    let seen = violations.lock().unwrap().clone();
    assert!(
        seen.is_empty(),
        "violations over the run:\n{}",
        seen.join("\n")
    );
    assert!(
        !contender.is_finished(),
        "the contenders' controller stopped: {contender:?}"
    );
    contender.abort();
    super::delete_namespace(&client, &contender_ns).await;
    // Only this test's objects go, not the namespace: the release's Role for reading
    // its Secrets was made in it by `helm install`, and later tests (stop.rs) use it.
    jobs.delete_collection(&DeleteParams::background(), &ListParams::default())
        .await
        .expect("delete the failover Jobs");
    locks
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .expect("delete the failover locks");
}

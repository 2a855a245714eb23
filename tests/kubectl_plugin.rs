//! `kubectl lockwarden` (issue 30, item 3) through the real `kubectl`: the built binary
//! linked as `kubectl-lockwarden` and `kubectl_complete-lockwarden` in a directory on
//! PATH, against the shared kube-apiserver with a real controller per namespace.
//!
//! - `why` names the lock, the holder (with its fence) and the position of a waiting
//!   Job (a named lock held by another cluster's holder) and of a waiting Pod (its own
//!   lock from a template, the key held by another DistributedLock of this cluster);
//! - `status` and `history` agree with the DistributedLock after hand-offs;
//! - `kubectl plugin list` finds the plugin, and kubectl's plugin completion returns
//!   the commands and the namespace's lock names.

use lockwarden_testsupport as support;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::{Client, ResourceExt};
use lockwarden::api::{DistributedLock, LockPhase};
use lockwarden::backend::LeaseStore;
use lockwarden::controller::gating::{LOCK_ANNOTATION, TEMPLATE_ANNOTATION};
use lockwarden::lock::{AcquireRequest, CasLock, Lease, LockBackend};
use serde_json::Value;
use support::eventually;
use support::kube::{create, gated_pod, job};
use support::kubectl::{kubectl_with_plugin, plugin_dir, text};
use support::locks::{hold_lease, lease_lock, lease_template, phase, wait_acquired, wait_phase};
use support::workloads::{self, Workload, create_held};
use support::zookeeper::ZooKeeper;

const CLUSTER: &str = "plugin-cluster";
/// Generous: the test machine is a loaded 2-core box.
const TIMEOUT: Duration = Duration::from_secs(90);

/// A namespace with its own controller, the plugin linked in a directory, and the APIs
/// of the namespace's locks and of its workloads of kind `W`.
async fn setup<W: Workload>(
    prefix: &str,
) -> (
    Client,
    String,
    tempfile::TempDir,
    Api<DistributedLock>,
    Api<W>,
) {
    let (client, ns, locks, workloads) = workloads::namespace_for(prefix, CLUSTER).await;
    (client, ns, plugin_dir(), locks, workloads)
}

/// `kubectl lockwarden ARGS`, which must succeed; its stdout.
async fn plugin(dir: &tempfile::TempDir, args: &[&str]) -> String {
    let mut all = vec!["lockwarden"];
    all.extend_from_slice(args);
    let out = kubectl_with_plugin(dir.path(), &all).await;
    assert!(
        out.status.success(),
        "kubectl {all:?} failed:\n{}",
        text(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A string field of the plugin's JSON; any other value fails the test.
fn text_of(value: &Value) -> &str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("not a string: {value}"))
}

/// `kubectl lockwarden ARGS -o json`, parsed.
async fn plugin_json(dir: &tempfile::TempDir, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let out = plugin(dir, &all).await;
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}):\n{out}"))
}

/// Takes Lease `lease` of `ns` as a holder outside this cluster (as another cluster's
/// controller or `lockwarden lock` would).
async fn take_outside(
    client: &Client,
    ns: &str,
    lease: &str,
    holder: &str,
) -> (CasLock<LeaseStore>, Lease) {
    let mut request = AcquireRequest::new(holder, Duration::from_secs(60));
    request.cluster = Some("other-cluster".into());
    hold_lease(client, ns, lease, &request).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_names_the_lock_holder_and_position_of_a_waiting_job() {
    let (client, ns, dir, locks, jobs) = setup::<Job>("plugin-job").await;
    let (outsider, lease) =
        take_outside(&client, &ns, "contested", "other-cluster/ops/nightly").await;
    let fence = lease.fence().0 as i64;
    create(&locks, &lease_lock("contested", "contested")).await;
    create_held(&jobs, "blocked", &[(LOCK_ANNOTATION, "contested")]).await;
    // The lock waits for the outsider (who holds it throughout), and the Job says so.
    wait_phase(&locks, "contested", LockPhase::Waiting, TIMEOUT).await;
    eventually("the Job to have a status", TIMEOUT, || async {
        let job = jobs.get("blocked").await.ok()?;
        job.annotations()
            .contains_key("lockwarden.io/status")
            .then_some(())
    })
    .await;

    let why = plugin_json(&dir, &["why", "job/blocked", "-n", &ns]).await;
    assert_eq!(why["state"], "waiting", "{why:#}");
    let lock = &why["locks"][0];
    assert_eq!(lock["lock"], "contested", "{why:#}");
    assert_eq!(lock["state"], "waiting", "{why:#}");
    assert_eq!(lock["holder"], "other-cluster/ops/nightly", "{why:#}");
    assert_eq!(
        lock["fence"], fence,
        "the holder's fence, from the key's history"
    );
    assert!(
        lock.get("position").is_none(),
        "a lock without spec.queue has no place: {why:#}"
    );
    assert!(
        text_of(&lock["positionNote"]).starts_with("not known"),
        "{why:#}"
    );
    assert!(
        text_of(&lock["unblocks"]).contains("other-cluster/ops/nightly letting go"),
        "{why:#}"
    );
    // The text says the same, and names the Job's own words.
    let text = plugin(&dir, &["why", "job", "blocked", "--namespace", &ns]).await;
    for words in [
        format!("Job {ns}/blocked: waiting"),
        "the Job waits for lock contested, held by other-cluster/ops/nightly".to_string(),
        format!("(fence {fence})"),
        "position not known".into(),
        "Lock contested (lock contested): waiting".into(),
        "Controller: waiting for lock contested: held by other-cluster/ops/nightly".into(),
    ] {
        assert!(text.contains(&words), "{words:?} not in:\n{text}");
    }

    // A second Job naming the lock waits for the first one's claim; a Job naming a lock
    // that does not exist, and one created unsuspended, are called out.
    create_held(&jobs, "second", &[(LOCK_ANNOTATION, "contested")]).await;
    create_held(&jobs, "lost", &[(LOCK_ANNOTATION, "missing")]).await;
    create(
        &jobs,
        &job("eager", &[(LOCK_ANNOTATION, "contested")], false),
    )
    .await;
    let second = plugin_json(&dir, &["why", "job/second", "-n", &ns]).await;
    let lock = &second["locks"][0];
    assert_eq!(lock["state"], "claimed-by-another", "{second:#}");
    assert_eq!(lock["holder"], "Job blocked", "{second:#}");
    assert_eq!(
        second["summary"],
        "the Job waits for lock contested, claimed by Job blocked; position not known"
    );
    assert!(text_of(&lock["positionNote"]).contains("claims are not queued"));
    assert!(
        lock["unblocks"].as_str().unwrap().starts_with(
            "Job blocked finishing (it waits itself: the key is held by other-cluster/ops/nightly)"
        ),
        "{second:#}"
    );
    let lost = plugin_json(&dir, &["why", "job/lost", "-n", &ns]).await;
    assert_eq!(lost["locks"][0]["state"], "not-found", "{lost:#}");
    assert!(
        text_of(&lost["locks"][0]["unblocks"]).contains("creating DistributedLock missing"),
        "{lost:#}"
    );
    let eager = plugin_json(&dir, &["why", "job/eager", "-n", &ns]).await;
    assert_eq!(eager["state"], "misconfigured", "{eager:#}");
    assert!(
        text_of(&eager["summary"]).contains("is not suspended"),
        "{eager:#}"
    );

    // Released: the Job starts, and `why` says nothing blocks it.
    outsider.release(&lease).await.unwrap();
    wait_acquired(&locks, "contested", TIMEOUT).await;
    let why = eventually("the Job to run", TIMEOUT, || async {
        let why = plugin_json(&dir, &["why", "job/blocked", "-n", &ns]).await;
        (why["state"] == "running").then_some(why)
    })
    .await;
    assert_eq!(why["locks"][0]["state"], "held", "{why:#}");
    assert!(why["locks"][0]["fence"].as_i64().unwrap() > fence);
    assert_eq!(why["locks"][0]["unblocks"], "nothing: it holds this lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_names_the_lock_holder_and_position_of_a_waiting_pod() {
    let (_, ns, dir, locks, pods) = setup::<Pod>("plugin-pod").await;
    // Another DistributedLock of this cluster holds the key; the Pod's lock is a copy of
    // a template on the same key.
    create(&locks, &lease_lock("holder", "shared")).await;
    let held = wait_acquired(&locks, "holder", TIMEOUT).await;
    let fence = held.status.as_ref().unwrap().fence.unwrap();
    create(&locks, &lease_template("tpl", "shared")).await;
    let pod = create_held(&pods, "waiter", &[(TEMPLATE_ANNOTATION, "tpl")]).await;
    let own = format!("waiter-{}", &pod.uid().unwrap()[..8]);
    eventually("the Pod's own lock to wait", TIMEOUT, || async {
        let lock = locks.get(&own).await.ok()?;
        (phase(&lock) == Some(LockPhase::Waiting)).then_some(())
    })
    .await;

    let holder = format!("{CLUSTER}/{ns}/holder");
    let why = plugin_json(&dir, &["why", "pod/waiter", "-n", &ns]).await;
    assert_eq!(why["kind"], "Pod");
    assert_eq!(why["state"], "waiting", "{why:#}");
    let lock = &why["locks"][0];
    assert_eq!(lock["lock"], own.as_str(), "{why:#}");
    assert_eq!(lock["namedAs"], "template tpl", "{why:#}");
    assert_eq!(lock["holder"], holder.as_str(), "{why:#}");
    assert_eq!(lock["fence"], fence, "{why:#}");
    assert!(lock.get("position").is_none(), "{why:#}");
    let unblocks = lock["unblocks"].as_str().unwrap();
    assert!(
        unblocks.contains(&format!("DistributedLock {ns}/holder")),
        "the holder's lock in this cluster is named: {unblocks}"
    );
    let text = plugin(&dir, &["why", "pod/waiter", "-n", &ns]).await;
    for words in [
        format!("the Pod waits for lock {own}, held by {holder} (fence {fence})"),
        "position not known".into(),
    ] {
        assert!(text.contains(&words), "{words:?} not in:\n{text}");
    }

    // A Pod the controller never sees (no label) is called out as such.
    create(
        &pods,
        &gated_pod("unlabelled", &[(LOCK_ANNOTATION, "holder")], true, false),
    )
    .await;
    let why = plugin_json(&dir, &["why", "pod/unlabelled", "-n", &ns]).await;
    assert_eq!(why["state"], "misconfigured", "{why:#}");
    assert!(
        text_of(&why["summary"]).contains("has no label lockwarden.io/gated=true"),
        "{why:#}"
    );
}

/// On ZooKeeper the store keeps a queue, and the controller reports each waiter's
/// place in it: `why` gives the position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_gives_the_queue_position_on_zookeeper() {
    let (_, ns, dir, locks, jobs) = setup::<Job>("plugin-zk").await;
    let zk = ZooKeeper::shared();
    let path = format!("/{}/queue", support::unique("plugin"));
    let on_zk = |name: &str| {
        let mut lock = lease_lock(name, "unused");
        lock.spec.backend = support::locks::zookeeper_backend(&zk.connect_string(), &path);
        lock
    };
    create(&locks, &on_zk("zk-holder")).await;
    let held = wait_acquired(&locks, "zk-holder", TIMEOUT).await;
    let fence = held.status.as_ref().unwrap().fence.unwrap();
    let mut template = on_zk("zk-tpl");
    template.spec.release = true;
    create(&locks, &template).await;
    let mut own = Vec::new();
    for name in ["first", "second"] {
        let created = create_held(&jobs, name, &[(TEMPLATE_ANNOTATION, "zk-tpl")]).await;
        let lock = format!("{name}-{}", &created.uid().unwrap()[..8]);
        // One after the other, so that their places in the queue are known.
        let position = eventually(&format!("{lock} to queue"), TIMEOUT, || async {
            let status = locks.get(&lock).await.ok()?.status?;
            (status.phase == Some(LockPhase::Waiting))
                .then_some(status.queue_position)
                .flatten()
        })
        .await;
        own.push((name, lock, position));
    }
    let holder = format!("{CLUSTER}/{ns}/zk-holder");
    for (name, lock, position) in &own {
        let why = plugin_json(&dir, &["why", &format!("job/{name}"), "-n", &ns]).await;
        let wait = &why["locks"][0];
        assert_eq!(wait["lock"], lock.as_str(), "{why:#}");
        assert_eq!(wait["holder"], holder.as_str(), "{why:#}");
        assert_eq!(wait["fence"], fence, "{why:#}");
        assert_eq!(wait["position"], *position, "{why:#}");
        let text = plugin(&dir, &["why", &format!("job/{name}"), "-n", &ns]).await;
        assert!(text.contains(&format!("; position {position}\n")), "{text}");
    }
    let positions: Vec<i32> = own.iter().map(|(_, _, p)| *p).collect();
    assert!(
        positions[0] < positions[1],
        "queued in order: {positions:?}"
    );
    let status = plugin_json(&dir, &["status", &format!("dlock/{}", own[1].1), "-n", &ns]).await;
    assert_eq!(status["queue"]["position"], positions[1]);
    let waiting: Vec<&str> = status["waitingHere"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["lock"].as_str().unwrap())
        .collect();
    assert_eq!(waiting, [format!("{ns}/{}", own[0].1)], "{status:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_history_agree_with_the_lock_after_hand_offs() {
    let (client, ns, dir, locks, _) = setup::<Job>("plugin-history").await;
    // Two hand-offs outside this cluster, then the DistributedLock takes the key. The
    // second holder ran a scheduled run to completion (once per run, §6.7).
    let run = lockwarden::lock::RunKey::new("ops/nightly@2026-12-03T02:00:00Z").unwrap();
    for holder in ["ops/first", "ops/second"] {
        let (outsider, lease) = take_outside(&client, &ns, "handed", holder).await;
        if holder == "ops/second" {
            let done = lockwarden::lock::CompletedRun::now(
                &run,
                lease.fence(),
                holder,
                Some("other-cluster"),
            );
            outsider.release_completed(&lease, done, 64).await.unwrap();
        } else {
            outsider.release(&lease).await.unwrap();
        }
    }
    let (outsider, lease) = take_outside(&client, &ns, "handed", "ops/third").await;
    create(&locks, &lease_lock("handed", "handed")).await;
    eventually("the lock to wait for ops/third", TIMEOUT, || async {
        let lock = locks.get("handed").await.ok()?;
        (phase(&lock) == Some(LockPhase::Waiting)).then_some(())
    })
    .await;
    outsider.release(&lease).await.unwrap();
    let lock = wait_acquired(&locks, "handed", TIMEOUT).await;
    let status = lock.status.clone().unwrap();
    let mirrored = serde_json::to_value(status.history.clone().unwrap()).unwrap();
    let fences: Vec<i64> = status
        .history
        .as_ref()
        .unwrap()
        .iter()
        .map(|g| g.fence)
        .collect();
    assert_eq!(
        fences.len(),
        4,
        "three outside grants and ours: {mirrored:#}"
    );
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "oldest first: {fences:?}"
    );

    let history = plugin_json(&dir, &["history", "dlock/handed", "-n", &ns]).await;
    assert_eq!(history["history"], mirrored, "history is the resource's");
    assert_eq!(history["key"], status.key.clone().unwrap().as_str());
    assert!(text_of(&history["source"]).starts_with("status.history"));
    // The store itself (the Lease, read with this KUBECONFIG) has the same grants.
    let stored = plugin_json(&dir, &["history", "dlock/handed", "--store", "-n", &ns]).await;
    assert!(stored["source"].as_str().unwrap().starts_with("the store"));
    let grants = |v: &Value| -> Vec<(i64, String, String)> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|g| {
                let text = |f: &str| g[f].as_str().unwrap().to_string();
                (g["fence"].as_i64().unwrap(), text("holder"), text("ended"))
            })
            .collect()
    };
    assert_eq!(grants(&stored["history"]), grants(&mirrored));
    // …with the key's memory of completed runs, which status.history does not carry.
    let completed = &stored["runs"]["completed"];
    assert_eq!(completed[0]["run"], run.as_str(), "{stored:#}");
    assert_eq!(completed[0]["fence"], fences[1], "{stored:#}");
    assert_eq!(completed[0]["cluster"], "other-cluster", "{stored:#}");
    assert!(history.get("runs").is_none(), "{history:#}");
    let stored_table = plugin(&dir, &["history", "handed", "--store", "-n", &ns]).await;
    assert!(
        stored_table.contains("completed runs: 1, oldest first")
            && stored_table.contains(run.as_str()),
        "{stored_table}"
    );
    let table = plugin(&dir, &["history", "handed", "-n", &ns]).await;
    let rows: Vec<Vec<&str>> = table
        .lines()
        .skip_while(|l| !l.starts_with("FENCE"))
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    let shown: Vec<(i64, &str)> = rows.iter().map(|r| (r[0].parse().unwrap(), r[1])).collect();
    let holder = format!("{CLUSTER}/{ns}/handed");
    let want = vec![
        (fences[0], "ops/first"),
        (fences[1], "ops/second"),
        (fences[2], "ops/third"),
        (fences[3], holder.as_str()),
    ];
    assert_eq!(shown, want, "{table}");

    let json = plugin_json(&dir, &["status", "dlock/handed", "-n", &ns]).await;
    assert_eq!(json["phase"], "Held");
    assert_eq!(json["holder"], status.holder.clone().unwrap().as_str());
    assert_eq!(json["fence"], status.fence.unwrap());
    assert_eq!(json["key"], status.key.clone().unwrap().as_str());
    assert_eq!(json["queue"]["note"], "not waiting");
    let reasons: Vec<&str> = json["events"]
        .as_array()
        .expect("the lock's Events")
        .iter()
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    assert!(reasons.contains(&"Acquired"), "{reasons:?}");
    let text = plugin(&dir, &["status", "dlock/handed", "-n", &ns]).await;
    for words in [
        "Phase:        Held".to_string(),
        format!("Holder:       {holder}, fence {}", fences[3]),
        "Events:".into(),
    ] {
        assert!(text.contains(&words), "{words:?} not in:\n{text}");
    }
    // Every lock of the namespace, and with --kubeconfig given to the plugin itself.
    let kubeconfig = support::kube::ControlPlane::shared()
        .kubeconfig_path()
        .display()
        .to_string();
    let list = plugin(&dir, &["status", "-n", &ns, "--kubeconfig", &kubeconfig]).await;
    let row = list
        .lines()
        .find(|l| l.starts_with("handed "))
        .expect(&list);
    // --context picks a context of --kubeconfig, and its namespace is the default one,
    // as with kubectl.
    let mut config = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
    let mut context = config.contexts[0].clone();
    context.name = "plugin-context".into();
    context.context.as_mut().unwrap().namespace = Some(ns.clone());
    config.contexts.push(context);
    let with_context = dir.path().join("with-context.kubeconfig");
    std::fs::write(&with_context, serde_yaml_ng::to_string(&config).unwrap()).unwrap();
    let with_context = with_context.display().to_string();
    let listed = plugin(
        &dir,
        &[
            "status",
            "--kubeconfig",
            &with_context,
            "--context",
            "plugin-context",
        ],
    )
    .await;
    assert_eq!(listed, list, "the context's namespace is the default");
    // -A: every namespace, each row naming its namespace.
    let everywhere = plugin(&dir, &["status", "-A"]).await;
    assert!(
        everywhere
            .lines()
            .any(|l| l.starts_with(&format!("{ns} ")) && l.contains(" handed ")),
        "{everywhere}"
    );
    assert!(
        row.contains("Held") && row.contains(&fences[3].to_string()),
        "{list}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_finds_the_plugin_and_completes_it() {
    let (client, ns, dir, locks, jobs) = setup::<Job>("plugin-found").await;
    let out = kubectl_with_plugin(dir.path(), &["plugin", "list"]).await;
    let listed = dir.path().join("kubectl-lockwarden").display().to_string();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&listed),
        "kubectl plugin list: {}",
        text(&out)
    );

    let complete = |args: &'static [&'static str]| {
        let dir = dir.path().to_path_buf();
        let ns = ns.clone();
        async move {
            let args: Vec<String> = args.iter().map(|a| a.replace("NS", &ns)).collect();
            let mut all = vec!["__complete", "lockwarden"];
            all.extend(args.iter().map(String::as_str));
            let out = kubectl_with_plugin(&dir, &all).await;
            assert!(out.status.success(), "{}", text(&out));
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
    };
    let commands = complete(&[""]).await;
    let names: Vec<&str> = commands
        .lines()
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    assert_eq!(names, ["status", "why", "history", ":4"], "{commands}");

    for name in ["alpha", "beta"] {
        create(&locks, &lease_lock(name, name)).await;
    }
    let names = complete(&["status", "-n", "NS", ""]).await;
    assert_eq!(names, "dlock/alpha\ndlock/beta\n:4\n");
    let names = complete(&["history", "--namespace=NS", "dlock/b"]).await;
    assert_eq!(names, "dlock/beta\n:4\n");
    // why: the Jobs naming a lock and the Pods lockwarden watches.
    create_held(&jobs, "nightly", &[(LOCK_ANNOTATION, "alpha")]).await;
    create_held(&jobs, "plain", &[]).await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    create_held(&pods, "gated", &[(LOCK_ANNOTATION, "beta")]).await;
    let names = complete(&["why", "-n", "NS", ""]).await;
    assert_eq!(names, "job/nightly\npod/gated\n:4\n");
}

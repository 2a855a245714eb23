//! Part 7, node: the Job-to-Job hand-off on one lock on a real node (kubelet,
//! containerd, kube-scheduler: `support::node`), next to an ungated Job's start
//! measured in the same run.
//!
//! A chain of gated Jobs names one DistributedLock (a Kubernetes Lease lock): while Job
//! *k* runs, Job *k+1* is created and waits, suspended; then Job *k*'s container is told to
//! finish. The hand-off is the time from Job *k*'s container's last line to Job *k+1*'s
//! container's first line. The floor is an ungated Job (not suspended, no lockwarden
//! annotation) from its create request to its container's first line. The samples
//! alternate (one floor Job, one hand-off), so both see the same machine.
//!
//! Both ends of every interval are read on the host's clock: the containers append
//! `$EPOCHREALTIME` (busybox ash's builtin: `gettimeofday`, microseconds, no fork;
//! the workload image's `date` has no `%N`) to a register file in a hostPath
//! directory, and the benchmark's own instants are `SystemTime`s. A watch of the Jobs
//! and of the lock, also on the host clock, splits each hand-off into stages.
//!
//! The lockwarden controller runs in this process (`controller::run_with`) against the
//! node's control plane; the Pods have no host network and talk to nothing.
//!
//! `LOCKWARDEN_BENCH_NODE_GUARD=1`: the chain's Jobs run their script under `lockwarden
//! guard` (the guard from lockwarden's image, host network to read the Lease from the
//! API server on loopback, the Pod's ServiceAccount allowed to read it and to write the
//! guard's report), and the controller trusts the guards' reports, so the lock goes on
//! the guard's report of the exit (docs/design.md §6.3, "Early hand-off: the guard's
//! report"), and each guard starts its script on the renewal it asks for ("A renewal on
//! the guard's request"). The chart's admission policy that confines who writes a
//! report is not installed here (this control plane has no release). The floor stays
//! the ungated, unguarded Job. `LOCKWARDEN_BENCH_NODE_GUARD=in-image`: the same, with
//! the guard in the workload's image (no init container; [`GuardFrom::Image`]).
//! `LOCKWARDEN_BENCH_NODE_GUARD=chart`: the same shape made by the chart's injection
//! (`manifests/guard-injection.yaml` applied to the node's API server; the Jobs
//! annotated `lockwarden.io/guard: "true"` and `lockwarden.io/guard-path`, their commands
//! as written; [`GuardFrom::Chart`]).

use super::*;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use std::path::{Path, PathBuf};
use support::node::Node;

/// Generous: a loaded 2-core machine, and a Pod's start includes its sandbox.
const TIMEOUT: Duration = Duration::from_secs(180);

/// Microseconds since the Unix epoch, on the host's clock.
type Micros = i64;

fn now_us() -> Micros {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_micros() as Micros
}

fn ms_between(from: Micros, to: Micros) -> f64 {
    (to - from) as f64 / 1000.0
}

/// `$EPOCHREALTIME` (`SECONDS.MICROS`) as microseconds.
fn parse_epoch(s: &str) -> Option<Micros> {
    let (secs, frac) = s.split_once('.')?;
    let frac = format!("{frac:0<6}");
    Some(secs.parse::<i64>().ok()? * 1_000_000 + frac.get(..6)?.parse::<i64>().ok()?)
}

/// One register line: `(job, fence, what)` at a time.
#[derive(Clone, Debug)]
struct Line {
    at: Micros,
    job: String,
    fence: Option<i64>,
    what: String,
}

fn register_lines(register: &Path) -> Vec<Line> {
    std::fs::read_to_string(register.join("lines"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut parts = l.split(' ');
            Some(Line {
                at: parse_epoch(parts.next()?)?,
                job: parts.next()?.to_string(),
                fence: parts.next()?.parse().ok(),
                what: parts.next()?.to_string(),
            })
        })
        .collect()
}

/// Waits until Job `job`'s container has registered `what`; returns that line.
async fn wait_line(register: &Path, job: &str, what: &str) -> Line {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(line) = register_lines(register)
            .into_iter()
            .find(|l| l.job == job && l.what == what)
        {
            return line;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for Job {job}'s {what} line"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A Job of one Pod running the workload image with `script`, the register directory
/// mounted at `/register`; never restarted nor retried, stopped within a second.
fn job(name: &str, image: &str, register: &Path, script: String) -> Value {
    json!({
        "metadata": { "name": name },
        "spec": {
            "backoffLimit": 0,
            "template": { "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "work", "image": image, "imagePullPolicy": "Never",
                    "command": ["sh", "-c", script],
                    "env": [{ "name": "LOCKWARDEN_FENCE", "valueFrom": { "fieldRef": {
                        "fieldPath": "metadata.annotations['lockwarden.io/fence']" } } }],
                    "volumeMounts": [{ "name": "register", "mountPath": "/register" }],
                }],
                "volumes": [
                    { "name": "register", "hostPath": { "path": register, "type": "Directory" } },
                ],
            }},
        },
    })
}

/// The floor's Job: plain (not suspended, no lockwarden annotation); its container
/// registers one line and exits.
fn plain_job(name: &str, image: &str, register: &Path) -> Job {
    let script = format!(r#"echo "$EPOCHREALTIME {name} - first" >> /register/lines"#);
    serde_json::from_value(job(name, image, register, script)).expect("a Job")
}

/// A Job gated on `lock` (suspended, `lockwarden.io/lock`) whose container registers
/// its first line with its fence, waits for `register/go-<name>`, registers its last
/// line and exits.
fn gated_job(name: &str, lock: &str, image: &str, register: &Path) -> Job {
    let script = format!(
        r#"echo "$EPOCHREALTIME {name} $LOCKWARDEN_FENCE first" >> /register/lines
while [ ! -e /register/go-{name} ]; do sleep 0.05; done
echo "$EPOCHREALTIME {name} $LOCKWARDEN_FENCE last" >> /register/lines"#
    );
    let mut job = job(name, image, register, script);
    job["metadata"]["annotations"] = json!({ "lockwarden.io/lock": lock });
    job["spec"]["suspend"] = json!(true);
    serde_json::from_value(job).expect("a Job")
}

/// Where a guarded Job's guard comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GuardFrom {
    /// An init container copies it from lockwarden's image (`lockwarden install`), as
    /// the chart's injection does (`LOCKWARDEN_BENCH_NODE_GUARD=1`).
    InitContainer,
    /// The workload's image has it (`LOCKWARDEN_BENCH_NODE_GUARD=in-image`): the static
    /// binary mounted as a file stands for an image built `FROM` it, so the Pod starts
    /// one container, not two.
    Image,
    /// As [`GuardFrom::Image`], but the chart's injection wraps the commands and adds the
    /// environment (`LOCKWARDEN_BENCH_NODE_GUARD=chart`): the Jobs are written as a user
    /// writes them, with `lockwarden.io/guard-path` naming the guard in the image.
    Chart,
}

impl GuardFrom {
    /// `LOCKWARDEN_BENCH_NODE_GUARD`: unset (no guard), `1`, `in-image` or `chart`.
    fn from_env() -> Option<GuardFrom> {
        match std::env::var("LOCKWARDEN_BENCH_NODE_GUARD").ok()?.as_str() {
            "in-image" => Some(GuardFrom::Image),
            "chart" => Some(GuardFrom::Chart),
            _ => Some(GuardFrom::InitContainer),
        }
    }
}

/// [`gated_job`] under the guard: `lockwarden guard -- sh -c SCRIPT` from `from`, the
/// lock's URL, nonce and fence and the Pod's own name, namespace, uid and container name
/// in its environment (what the chart's injection policy adds), host network to reach
/// the API server.
fn guarded_job(name: &str, lock: &str, node: &Node, register: &Path, from: GuardFrom) -> Job {
    let mut job = serde_json::to_value(gated_job(name, lock, &node.images().workload, register))
        .expect("a Job as JSON");
    let spec = &mut job["spec"]["template"]["spec"];
    spec["hostNetwork"] = json!(true);
    let volume = match from {
        GuardFrom::InitContainer => {
            spec["initContainers"] = json!([{
                "name": "install-guard", "image": node.images().lockwarden, "imagePullPolicy": "Never",
                "command": ["/usr/local/bin/lockwarden", "install", "/guard"],
                "volumeMounts": [{ "name": "guard", "mountPath": "/guard" }],
            }]);
            json!({ "name": "guard", "emptyDir": {} })
        }
        GuardFrom::Image | GuardFrom::Chart => {
            let binary = node
                .static_binary()
                .parent()
                .expect("the binary's directory");
            json!({ "name": "guard", "hostPath": { "path": binary, "type": "Directory" } })
        }
    };
    spec["volumes"].as_array_mut().unwrap().push(volume);
    let container = &mut spec["containers"][0];
    container["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({ "name": "guard", "mountPath": "/guard" }));
    let service = [
        json!({ "name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1" }),
        json!({ "name": "KUBERNETES_SERVICE_PORT", "value": node.plane().port().to_string() }),
    ];
    let env = container["env"].as_array_mut().unwrap();
    env.extend(service);
    if from == GuardFrom::Chart {
        let annotations = job["metadata"]["annotations"].as_object_mut().unwrap();
        annotations.insert("lockwarden.io/guard".into(), json!("true"));
        annotations.insert(
            "lockwarden.io/guard-path".into(),
            json!("/guard/lockwarden"),
        );
        return serde_json::from_value(job).expect("a Job");
    }
    let command = container["command"].as_array().unwrap().clone();
    container["command"] = json!(["/guard/lockwarden", "guard", "--"]);
    container["command"].as_array_mut().unwrap().extend(command);
    let field = |variable: &str, path: &str| json!({ "name": variable, "valueFrom": { "fieldRef": { "fieldPath": path } } });
    let env = container["env"].as_array_mut().unwrap();
    env.extend([
        field(
            "LOCKWARDEN_URL",
            "metadata.annotations['lockwarden.io/url']",
        ),
        field(
            "LOCKWARDEN_NONCE",
            "metadata.annotations['lockwarden.io/nonce']",
        ),
        field("LOCKWARDEN_POD_NAME", "metadata.name"),
        field("LOCKWARDEN_POD_NAMESPACE", "metadata.namespace"),
        field("LOCKWARDEN_POD_UID", "metadata.uid"),
        json!({ "name": "LOCKWARDEN_CONTAINER_NAME", "value": "work" }),
    ]);
    serde_json::from_value(job).expect("a Job")
}

/// The chart's guard injection (`manifests/guard-injection.yaml`, the chart rendered
/// with its defaults) on the node's API server, once a dry run of a Job asking for the
/// guard in its image comes back wrapped.
async fn install_guard_injection(node: &Node, client: &Client, ns: &str) {
    let manifest = support::repo_root().join("manifests/guard-injection.yaml");
    let manifest = std::fs::read_to_string(&manifest).expect("manifests/guard-injection.yaml");
    let out =
        support::kubectl::kubectl_on(node.plane(), &["apply", "-f", "-"], Some(&manifest)).await;
    assert!(
        out.status.success(),
        "kubectl apply manifests/guard-injection.yaml: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let probe = guarded_job(
        "probe",
        "probe",
        node,
        &node.host_dir("bench-register"),
        GuardFrom::Chart,
    );
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let wrapped = jobs.create(&dry_run, &probe).await.ok().and_then(|job| {
            let spec = job.spec?.template.spec?;
            let command = spec.containers.first()?.command.clone()?;
            Some(command.first().map(String::as_str) == Some("/guard/lockwarden"))
        });
        if wrapped == Some(true) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the guard injection not in force after {TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the guards of `ns` need of the API server: to read the lock's Lease, and to
/// write their report on their own Pod.
async fn allow_the_guards(client: &Client, ns: &str) {
    let rules = json!([
        { "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"] },
        { "apiGroups": [""], "resources": ["pods"], "verbs": ["patch"] },
    ]);
    support::kube::grant_default_service_account(client, ns, "guard", rules).await;
}

/// A step of a Job (or of its Pod) a watch saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Step {
    /// Suspended, with lockwarden's `lockwarden.io/status` annotation (waiting).
    Waiting,
    /// `spec.suspend: false` (a gated Job: started).
    Started,
    /// Its Pod exists.
    PodCreated,
    /// Its Pod is bound to the node.
    PodScheduled,
    /// Its Pod's phase is `Succeeded` (the kubelet's status).
    PodSucceeded,
    /// Its Pod carries its guard's report (`guard-ended.lockwarden.io/work`).
    GuardReported,
    /// `SuccessCriteriaMet=True` (the Job controller's interim condition).
    SuccessCriteriaMet,
    /// `Complete=True`.
    Complete,
}

/// What a watch of the namespace's Jobs, their Pods and the lock saw, on the host clock.
#[derive(Default)]
struct Seen {
    /// (Job, step) → when first seen.
    steps: HashMap<(String, Step), Micros>,
    /// Every status of the lock seen: (when, phase, fence, Acquired).
    lock: Vec<(Micros, Option<LockPhase>, Option<i64>, bool)>,
}

impl Seen {
    fn at(&self, job: &str, step: Step) -> Option<Micros> {
        self.steps.get(&(job.to_string(), step)).copied()
    }
}

fn condition_true(job: &Job, type_: &str) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

struct Timeline {
    seen: Arc<Mutex<Seen>>,
    changed: Arc<Notify>,
}

impl Timeline {
    fn start(client: &Client, ns: &str) -> Timeline {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let changed = Arc::new(Notify::new());
        let jobs = Api::<Job>::namespaced(client.clone(), ns);
        Self::watch(jobs, &seen, &changed, |job, _| {
            let suspended = job.spec.as_ref().and_then(|s| s.suspend);
            let annotated = job.annotations().contains_key("lockwarden.io/status");
            [
                (Step::Started, suspended == Some(false)),
                (Step::Waiting, suspended == Some(true) && annotated),
                (
                    Step::SuccessCriteriaMet,
                    condition_true(&job, "SuccessCriteriaMet"),
                ),
                (Step::Complete, condition_true(&job, "Complete")),
            ]
            .into_iter()
            .filter(|s| s.1)
            .map(|s| (job.name_any(), s.0))
            .collect()
        });
        let pods = Api::<Pod>::namespaced(client.clone(), ns);
        Self::watch(pods, &seen, &changed, |pod, _| {
            let Some(job) = pod.labels().get("job-name").cloned() else {
                return Vec::new();
            };
            let status = pod.status.as_ref();
            [
                (Step::PodCreated, true),
                (
                    Step::PodScheduled,
                    pod.spec.as_ref().is_some_and(|s| s.node_name.is_some()),
                ),
                (
                    Step::PodSucceeded,
                    status.and_then(|s| s.phase.as_deref()) == Some("Succeeded"),
                ),
                (
                    Step::GuardReported,
                    pod.annotations()
                        .contains_key("guard-ended.lockwarden.io/work"),
                ),
            ]
            .into_iter()
            .filter(|s| s.1)
            .map(|s| (job.clone(), s.0))
            .collect()
        });
        let locks = Api::<DistributedLock>::namespaced(client.clone(), ns);
        Self::watch(locks, &seen, &changed, |lock, seen| {
            let status = lock.status.as_ref();
            let acquired = status.is_some_and(|st| conditions::is_true(&st.conditions, ACQUIRED));
            seen.lock.push((
                now_us(),
                status.and_then(|st| st.phase),
                status.and_then(|st| st.fence),
                acquired,
            ));
            Vec::new()
        });
        Timeline { seen, changed }
    }

    /// Watches `api`; `steps` says which steps each applied object shows.
    fn watch<K>(
        api: Api<K>,
        seen: &Arc<Mutex<Seen>>,
        changed: &Arc<Notify>,
        steps: impl Fn(K, &mut Seen) -> Vec<(String, Step)> + Send + 'static,
    ) where
        K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    {
        let (seen, changed) = (seen.clone(), changed.clone());
        tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(event) = events.next().await {
                let at = now_us();
                let Ok(object) = event else { continue };
                let mut seen = seen.lock().unwrap();
                for key in steps(object, &mut seen) {
                    seen.steps.entry(key).or_insert(at);
                }
                drop(seen);
                changed.notify_waiters();
            }
        });
    }

    async fn wait<T>(&self, what: &str, f: impl Fn(&Seen) -> Option<T>) -> T {
        wait_for(&self.seen, &self.changed, TIMEOUT, what, f).await
    }

    async fn step(&self, job: &str, step: Step) -> Micros {
        self.wait(&format!("Job {job} {step:?}"), |s| s.at(job, step))
            .await
    }
}

/// Summary of one series: n, p50, p90, min, max (ms).
fn summary(what: &str, samples: &[f64]) -> NodeRow {
    let v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    NodeRow {
        what: what.to_string(),
        n: v.len(),
        p50: pct(&v, 0.5),
        p90: pct(&v, 0.9),
        min: v.iter().copied().fold(f64::NAN, f64::min),
        max: v.iter().copied().fold(f64::NAN, f64::max),
    }
}

pub(crate) async fn part_node(opts: Opts, report: Shared) {
    // The machine-wide node: waits while another binary's node holds the machine lock.
    let node = tokio::task::spawn_blocking(Node::shared).await.unwrap();
    let client = node.client().await;
    install_lockwarden_crd(&client).await;
    let ns = node.namespace(&client, "bench-node").await;
    let register = node.host_dir("bench-register");
    let image = node.images().workload.clone();
    let guard_from = GuardFrom::from_env();
    let guarded = guard_from.is_some();
    if guarded {
        allow_the_guards(&client, &ns).await;
    }
    if guard_from == Some(GuardFrom::Chart) {
        install_guard_injection(node, &client, &ns).await;
    }
    let chained = |name: &str, lock: &str| match guard_from {
        Some(from) => guarded_job(name, lock, node, &register, from),
        None => gated_job(name, lock, &image, &register),
    };
    // Two builds side by side (LOCKWARDEN_BENCH_NODE_BEFORE): each hand-off under one
    // build's `lockwarden controller` process, alternating; otherwise the controller of
    // this build, in this process.
    let mut versions = std::env::var_os("LOCKWARDEN_BENCH_NODE_BEFORE").map(|before| {
        Versions::new(
            PathBuf::from(before),
            PathBuf::from(env!("CARGO_BIN_EXE_lockwarden")),
        )
    });
    let controller = match &mut versions {
        Some(versions) => {
            versions.run(Build::After, node, &ns, guarded).await;
            None
        }
        None => Some(tokio::spawn(controller::run_with(
            client.clone(),
            ControllerConfig {
                cluster_name: "bench-node".into(),
                namespace: Some(ns.clone()),
                trust_guard_reports: guarded,
                ..Default::default()
            },
            Arc::new(lockwarden::telemetry::Telemetry::new()),
        ))),
    };
    let timeline = Timeline::start(&client, &ns);
    let jobs = Api::<Job>::namespaced(client.clone(), &ns);
    let lock = "handoff";
    // A guard starts its command only once it has seen the lock renewed (rule 9), a
    // renewal and a poll (a twentieth of the lease) after its first read at most: the
    // guarded chain's lock renews every second on a 4 s lease (polls every 200 ms).
    let handoff_lock = match guarded {
        true => support::locks::lease_lock_timed(lock, "bench-handoff", "4s", "1s"),
        false => support::locks::lease_lock(lock, "bench-handoff"),
    };
    Api::<DistributedLock>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &handoff_lock)
        .await
        .expect("create the lock");

    // Untimed: the first sandbox and container of the run, and the chain's first Job.
    jobs.create(
        &PostParams::default(),
        &plain_job("warm", &image, &register),
    )
    .await
    .unwrap();
    wait_line(&register, "warm", "first").await;
    timeline.step("warm", Step::Complete).await;
    let mut current = "job-0".to_string();
    jobs.create(&PostParams::default(), &chained(&current, lock))
        .await
        .unwrap();
    let mut current_fence = wait_line(&register, &current, "first").await.fence;

    // Two builds: 30 pairs, each build once per pair, the order alternating pair by pair.
    let n = if versions.is_some() {
        2 * opts.n(30)
    } else {
        opts.n(20)
    };
    let mut floor = Vec::new();
    let mut handoff = Vec::new();
    // Per hand-off, the time between consecutive `points` (below).
    let mut raw: [Vec<f64>; 9] = Default::default();
    for i in 0..n {
        if let Some(versions) = &mut versions {
            versions
                .run(Build::for_handoff(i), node, &ns, guarded)
                .await;
        }
        // The floor: a plain Job from its create request to its first line.
        let plain = format!("plain-{i}");
        let created = now_us();
        jobs.create(
            &PostParams::default(),
            &plain_job(&plain, &image, &register),
        )
        .await
        .unwrap();
        let first = wait_line(&register, &plain, "first").await;
        floor.push(ms_between(created, first.at));
        timeline.step(&plain, Step::Complete).await;

        // The hand-off: the next Job waits on the lock, then the current one finishes.
        let next = format!("job-{}", i + 1);
        jobs.create(&PostParams::default(), &chained(&next, lock))
            .await
            .unwrap();
        timeline.step(&next, Step::Waiting).await;
        // Let the waiter settle, as a long wait would.
        tokio::time::sleep(Duration::from_millis(300)).await;
        std::fs::write(register.join(format!("go-{current}")), "").unwrap();
        let last = wait_line(&register, &current, "last").await;
        let first = wait_line(&register, &next, "first").await;
        handoff.push(ms_between(last.at, first.at));
        timeline.step(&current, Step::Complete).await;
        timeline.step(&next, Step::Started).await;
        let seen = timeline.seen.lock().unwrap();
        let released = seen
            .lock
            .iter()
            .find(|(at, phase, _, _)| *at >= last.at && *phase == Some(LockPhase::Released))
            .map(|e| e.0);
        let acquired = released.and_then(|r| {
            seen.lock
                .iter()
                .find(|(at, _, fence, acquired)| *at >= r && *acquired && *fence > current_fence)
                .map(|e| e.0)
        });
        // The path of the hand-off: the lock goes when the kubelet reports the exit
        // (docs/design.md §6.3, "Early hand-off"); the Job's own end comes later.
        let points = [
            Some(last.at),
            released,
            acquired,
            seen.at(&next, Step::Started),
            seen.at(&next, Step::PodCreated),
            seen.at(&next, Step::PodScheduled),
            Some(first.at),
        ];
        let between = |a: Option<Micros>, b: Option<Micros>| match (a, b) {
            (Some(a), Some(b)) => ms_between(a, b),
            _ => f64::NAN,
        };
        for (k, stage) in raw.iter_mut().take(points.len() - 1).enumerate() {
            stage.push(between(points[k], points[k + 1]));
        }
        // Off the path, for comparison: when the kubelet reports the Pod Succeeded
        // and the Job controller the Job Complete, which the hand-off waited for before.
        raw[6].push(between(
            Some(last.at),
            seen.at(&current, Step::PodSucceeded),
        ));
        raw[7].push(between(Some(last.at), seen.at(&current, Step::Complete)));
        raw[8].push(between(
            Some(last.at),
            seen.at(&current, Step::GuardReported),
        ));
        drop(seen);
        eprintln!(
            "[bench] node hand-off {}/{n}: {:.0} ms (fence {:?} → {:?}); floor Job {:.0} ms",
            i + 1,
            handoff[i],
            current_fence,
            first.fence,
            floor[i]
        );
        if let Some(versions) = &mut versions {
            // lockwarden's own part: lock Released → Job k+1 started (stages 1..3).
            let own: f64 = (1..3).map(|k| raw[k][i]).sum();
            versions.record(i, handoff[i], own);
        }
        current = next;
        current_fence = first.fence;
    }
    std::fs::write(register.join(format!("go-{current}")), "").unwrap();
    timeline.step(&current, Step::Complete).await;
    let handoff_what = match guarded {
        true => {
            "hand-off, guarded Jobs: Job k's container's last line → Job k+1's container's first line"
        }
        false => "hand-off: Job k's container's last line → Job k+1's container's first line",
    };
    if let Some(controller) = controller {
        controller.abort();
    }
    if let Some(versions) = versions {
        note(&report, versions.finish());
    }

    let handoff = summary(handoff_what, &handoff);
    let floor = summary(
        "floor: ungated Job created → its container's first line",
        &floor,
    );
    let reported_by = match guarded {
        true => "the guard reports the exit",
        false => "the kubelet reports the exit",
    };
    let released = format!(
        "Job k's container's last line → lock Released ({reported_by}; lockwarden lets go)"
    );
    let started = match guarded {
        true => {
            "→ Job k+1's container's first line (kubelet, containerd; the guard's install and its wait for a renewal)"
        }
        false => "→ Job k+1's container's first line (kubelet, containerd)",
    };
    let names = [
        released.as_str(),
        "→ lock Acquired for Job k+1 (lockwarden: claim, acquire)",
        "→ Job k+1 started (lockwarden: fence + unsuspend)",
        "→ Job k+1's Pod created (Job controller)",
        "→ Pod bound to the node (kube-scheduler)",
        started,
        "(off the path) Job k's container's last line → its Pod Succeeded (kubelet)",
        "(off the path) Job k's container's last line → Job k Complete (Job controller)",
        "(off the path) Job k's container's last line → its guard's report on the Pod",
    ];
    // Only the chain's own stages: no guard, no report.
    let stages: Vec<NodeRow> = names
        .iter()
        .zip(&raw)
        .map(|(what, v)| summary(what, v))
        .filter(|row| row.n > 0)
        .collect();
    // lock Released → Job k+1 started: lockwarden's part of the hand-off after it let
    // go; and Job k+1 started → its first line: the path an ungated Job's start takes.
    let sum = |stages: std::ops::Range<usize>| -> Vec<f64> {
        (0..raw[0].len())
            .map(|i| stages.clone().map(|k| raw[k][i]).sum())
            .collect()
    };
    let lockwarden = summary(
        "of which lock Released → Job k+1 started (lockwarden)",
        &sum(1..3),
    );
    let start = summary(
        "of which Job k+1 started → its container's first line (an ungated Job's path)",
        &sum(3..6),
    );
    let ratio = handoff.p50 / floor.p50;
    eprintln!(
        "[bench] node: hand-off p50 {:.0} ms p90 {:.0} min {:.0} max {:.0} (n={}); floor p50 {:.0} ms p90 {:.0} min {:.0} max {:.0} (n={}); hand-off / floor p50 = {:.2}×",
        handoff.p50,
        handoff.p90,
        handoff.min,
        handoff.max,
        handoff.n,
        floor.p50,
        floor.p90,
        floor.min,
        floor.max,
        floor.n,
        ratio
    );
    for s in &stages {
        eprintln!(
            "[bench] node stage {}: p50 {:.0} ms (n={})",
            s.what, s.p50, s.n
        );
    }
    note(
        &report,
        format!(
            "node: Job-to-Job hand-off p50 {} ms (n={}) against an ungated Job's start p50 {} ms (n={}): {}×; lockwarden's own stages (lock released → next Job started) p50 {} ms",
            fmt(handoff.p50),
            handoff.n,
            fmt(floor.p50),
            floor.n,
            fmt(ratio),
            fmt(lockwarden.p50)
        ),
    );
    report.lock().unwrap().node = Some(NodePart {
        handoff,
        lockwarden,
        start,
        floor,
        stages,
    });
}

/// Which build's controller runs a hand-off when two are compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Build {
    Before,
    After,
}

impl Build {
    /// Hand-offs 2p and 2p+1 are pair p: before then after in even pairs, after then
    /// before in odd ones, so neither build always runs first after a swap.
    fn for_handoff(i: usize) -> Build {
        let first = if (i / 2).is_multiple_of(2) {
            Build::Before
        } else {
            Build::After
        };
        match (i % 2, first) {
            (0, b) => b,
            (_, Build::Before) => Build::After,
            (_, Build::After) => Build::Before,
        }
    }
}

/// Two lockwarden builds' controllers as host processes, one at a time, and the
/// hand-offs measured under each: `LOCKWARDEN_BENCH_NODE_BEFORE` names the older
/// binary, the newer is this build's. A swap kills the running controller (SIGKILL: no
/// lock is released; the next resumes the running Job's lock from its status, as after
/// a crash) and waits for the other's `/readyz` before the next sample starts, so the
/// swap is outside every measured interval.
struct Versions {
    before: PathBuf,
    after: PathBuf,
    running: Option<(Build, std::process::Child)>,
    /// Per pair: (before's hand-off, after's hand-off), in ms.
    pairs: Vec<(f64, f64)>,
    /// Per pair, lockwarden's own part of each (Job k Complete → Job k+1 started).
    own: Vec<(f64, f64)>,
}

impl Versions {
    fn new(before: PathBuf, after: PathBuf) -> Versions {
        assert!(
            before.is_file(),
            "LOCKWARDEN_BENCH_NODE_BEFORE={}: not a file (an older lockwarden binary)",
            before.display()
        );
        Versions {
            before,
            after,
            running: None,
            pairs: Vec::new(),
            own: Vec::new(),
        }
    }

    /// Makes `build`'s controller the one running, watching `ns` on the node.
    async fn run(&mut self, build: Build, node: &Node, ns: &str, trust_guard_reports: bool) {
        if matches!(&self.running, Some((b, _)) if *b == build) {
            return;
        }
        if let Some((_, mut child)) = self.running.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let binary = match build {
            Build::Before => &self.before,
            Build::After => &self.after,
        };
        let port = support::free_port();
        let log = node.dir().join(format!("controller-{build:?}-{port}.log"));
        let log = std::fs::File::create(&log).expect("create the controller's log");
        let child = Command::new(binary)
            .args([
                "controller",
                "--cluster-name",
                "bench-node",
                "--watch-namespace",
                ns,
            ])
            .arg("--metrics-address")
            .arg(format!("127.0.0.1:{port}"))
            .env("KUBECONFIG", node.plane().kubeconfig_path())
            // An older build ignores it (and lets go on the kubelet's report).
            .env(
                "LOCKWARDEN_TRUST_GUARD_REPORTS",
                trust_guard_reports.to_string(),
            )
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
        self.running = Some((build, child));
        let deadline = Instant::now() + TIMEOUT;
        while !ready(port).await {
            assert!(
                Instant::now() < deadline,
                "the {build:?} controller ({}) is not ready after {TIMEOUT:?}",
                binary.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Hand-off `i` took `ms`, of which `own` ms were lockwarden's.
    fn record(&mut self, i: usize, ms: f64, own: f64) {
        if i.is_multiple_of(2) {
            self.pairs.push((f64::NAN, f64::NAN));
            self.own.push((f64::NAN, f64::NAN));
        }
        let (pair, own_pair) = (self.pairs.last_mut().unwrap(), self.own.last_mut().unwrap());
        match Build::for_handoff(i) {
            Build::Before => (pair.0, own_pair.0) = (ms, own),
            Build::After => (pair.1, own_pair.1) = (ms, own),
        }
    }

    /// Kills the running controller; the summary: each build's hand-off and the
    /// paired differences (after − before).
    fn finish(mut self) -> String {
        if let Some((_, mut child)) = self.running.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let line = |v: &[f64]| {
            format!(
                "p50 {:.0} ms (p25 {:.0}, p75 {:.0}, min {:.0}, max {:.0})",
                pct(v, 0.5),
                pct(v, 0.25),
                pct(v, 0.75),
                v.iter().copied().fold(f64::NAN, f64::min),
                v.iter().copied().fold(f64::NAN, f64::max)
            )
        };
        // Each build's series and the paired differences (after − before), complete
        // pairs only.
        let compare = |pairs: &[(f64, f64)]| {
            let pairs: Vec<(f64, f64)> = pairs
                .iter()
                .copied()
                .filter(|(b, a)| b.is_finite() && a.is_finite())
                .collect();
            let before: Vec<f64> = pairs.iter().map(|p| p.0).collect();
            let after: Vec<f64> = pairs.iter().map(|p| p.1).collect();
            let diff: Vec<f64> = pairs.iter().map(|(b, a)| a - b).collect();
            (
                pairs.len(),
                format!(
                    "before {}; after {}; paired difference after − before {}",
                    line(&before),
                    line(&after),
                    line(&diff)
                ),
            )
        };
        let (n, handoff) = compare(&self.pairs);
        let (_, own) = compare(&self.own);
        let text = format!(
            "node, two builds ({n} alternating pairs; before = {}): hand-off: {handoff}. \
             lockwarden's part (Job k Complete → Job k+1 started): {own}",
            self.before.display()
        );
        for (p, ((b, a), (ob, oa))) in self.pairs.iter().zip(&self.own).enumerate() {
            eprintln!(
                "[bench] node pair {p}: before {b:.0} ms, after {a:.0} ms, after − before \
                 {:+.0} ms (lockwarden's part {ob:.0} → {oa:.0} ms)",
                a - b
            );
        }
        text
    }
}

/// Whether the controller's `/readyz` on `port` answers 200.
async fn ready(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    let request = "GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    response.starts_with(b"HTTP/1.0 200") || response.starts_with(b"HTTP/1.1 200")
}

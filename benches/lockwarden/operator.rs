//! Part 3, operator: `DistributedLock` created → `Acquired=True` seen by a watch,
//! same-cluster hand-off, takeover after the holder's controller is SIGKILLed.

use super::api_writes::ApiWrites;
use super::*;

// ---------------------------------------------------------------------------------
// Part 3: operator

/// What a watch over every DistributedLock saw, by `namespace/name`.
#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) acquired: HashMap<String, Instant>,
    pub(crate) waiting: HashMap<String, Instant>,
    pub(crate) deleted: HashMap<String, Instant>,
    /// When its deletion timestamp was first seen.
    pub(crate) deleting: HashMap<String, Instant>,
    /// When each `status.fence` of an object was first seen.
    pub(crate) fences: HashMap<(String, i64), Instant>,
}

pub(crate) struct Watch {
    pub(crate) seen: Arc<Mutex<Seen>>,
    pub(crate) changed: Arc<Notify>,
}

impl Watch {
    pub(crate) fn start(client: Client) -> Watch {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let changed = Arc::new(Notify::new());
        let (s, c) = (seen.clone(), changed.clone());
        tokio::spawn(async move {
            let api = Api::<DistributedLock>::all(client);
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                let now = Instant::now();
                let Ok(event) = event else { continue };
                let mut seen = s.lock().unwrap();
                match event {
                    watcher::Event::Apply(l) | watcher::Event::InitApply(l) => {
                        let id = format!("{}/{}", l.namespace().unwrap_or_default(), l.name_any());
                        let status = l.status.as_ref();
                        if l.metadata.deletion_timestamp.is_some() {
                            seen.deleting.entry(id.clone()).or_insert(now);
                        }
                        if let Some(fence) = status.and_then(|st| st.fence) {
                            seen.fences.entry((id.clone(), fence)).or_insert(now);
                        }
                        if status.is_some_and(|st| conditions::is_true(&st.conditions, ACQUIRED)) {
                            seen.acquired.entry(id).or_insert(now);
                        } else if status.and_then(|st| st.phase) == Some(LockPhase::Waiting) {
                            seen.waiting.entry(id).or_insert(now);
                        }
                    }
                    watcher::Event::Delete(l) => {
                        let id = format!("{}/{}", l.namespace().unwrap_or_default(), l.name_any());
                        seen.deleted.insert(id, now);
                    }
                    _ => {}
                }
                drop(seen);
                c.notify_waiters();
            }
        });
        Watch { seen, changed }
    }

    pub(crate) async fn wait(&self, what: &str, f: impl Fn(&Seen) -> Option<Instant>) -> Instant {
        wait_for(&self.seen, &self.changed, WAIT, what, f).await
    }

    pub(crate) async fn acquired(&self, id: &str) -> Instant {
        self.wait(&format!("{id} Acquired"), |s| s.acquired.get(id).copied())
            .await
    }
    pub(crate) async fn waiting(&self, id: &str) -> Instant {
        self.wait(&format!("{id} Waiting"), |s| s.waiting.get(id).copied())
            .await
    }
    pub(crate) async fn deleted(&self, id: &str) -> Instant {
        self.wait(&format!("{id} deleted"), |s| s.deleted.get(id).copied())
            .await
    }
}

pub(crate) struct OperatorEnv {
    pub(crate) env: Arc<Env>,
    pub(crate) secret: std::collections::BTreeMap<String, lockwarden::api::SecretRef>,
}

impl OperatorEnv {
    pub(crate) async fn namespace(&mut self, prefix: &str) -> String {
        let ns = self.env.plane.namespace(&self.env.client, prefix).await;
        let secret = support::locks::aws_secret(&self.env.client, &ns).await;
        self.secret.insert(ns.clone(), secret);
        ns
    }

    /// A DistributedLock on `key` of `kind` in `ns`.
    pub(crate) fn lock(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        key: &str,
        lease: &str,
        renew: &str,
    ) -> DistributedLock {
        let env = &self.env;
        let secret = self.secret.get(ns).cloned();
        let backend = match kind {
            Kind::S3 => BackendSpec {
                s3: Some(lockwarden::api::S3Backend {
                    bucket: env.bucket.clone(),
                    key: format!("op/{key}"),
                    region: Some(support::moto::REGION.into()),
                    endpoint: Some(env.s3_server.endpoint()),
                    force_path_style: Some(true),
                    s3lock_compatible: None,
                    terraform_compatible: None,
                    credentials_secret_ref: secret,
                }),
                ..Default::default()
            },
            Kind::DynamoDb => BackendSpec {
                dynamodb: Some(lockwarden::api::DynamoDbBackend {
                    table: env.table.clone(),
                    key: format!("op-{key}"),
                    region: Some(support::moto::REGION.into()),
                    endpoint: Some(env.dynamodb_server.endpoint()),
                    credentials_secret_ref: secret,
                    ..Default::default()
                }),
                ..Default::default()
            },
            Kind::Lease => BackendSpec {
                kubernetes: Some(lockwarden::api::KubernetesBackend {
                    lease_name: format!("op-{key}"),
                    // One Lease namespace for every cluster's locks on this key.
                    namespace: Some(env.ns.clone()),
                }),
                ..Default::default()
            },
            Kind::ZooKeeper => BackendSpec {
                zookeeper: Some(lockwarden::api::ZooKeeperBackend {
                    servers: env
                        .zk
                        .connect_string()
                        .split(',')
                        .map(String::from)
                        .collect(),
                    path: format!("/bench-op/{key}"),
                    chroot: None,
                    session_timeout: None,
                }),
                ..Default::default()
            },
        };
        let mut lock = support::locks::lock_on(name, backend, lease, renew);
        lock.metadata.namespace = Some(ns.to_string());
        lock
    }
}

pub(crate) fn locks_api(client: &Client, ns: &str) -> Api<DistributedLock> {
    Api::namespaced(client.clone(), ns)
}

pub(crate) fn start_controller_process(
    kubeconfig: &std::path::Path,
    cluster: &str,
    ns: &str,
    metrics_port: u16,
) -> std::process::Child {
    start_controller_command(kubeconfig, cluster, ns, metrics_port)
        .spawn()
        .expect("start lockwarden controller")
}

/// The `lockwarden controller` command for one namespace, not started yet.
pub(crate) fn start_controller_command(
    kubeconfig: &std::path::Path,
    cluster: &str,
    ns: &str,
    metrics_port: u16,
) -> Command {
    // LOCKWARDEN_BENCH_CONTROLLER=PATH runs another build of the controller (a
    // "before" binary, for before → after figures from one run).
    let binary = std::env::var_os("LOCKWARDEN_BENCH_CONTROLLER").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_lockwarden")),
        PathBuf::from,
    );
    let mut cmd = Command::new(binary);
    cmd.args([
        "controller",
        "--cluster-name",
        cluster,
        "--watch-namespace",
        ns,
    ])
    .args(["--metrics-address", &format!("127.0.0.1:{metrics_port}")])
    .env("KUBECONFIG", kubeconfig)
    // LOCKWARDEN_BENCH_CONTROLLER_LOG=FILE keeps the controller's log (its stderr),
    // at the level LOCKWARDEN_LOG gives (e.g. lockwarden=debug).
    .stdout(Stdio::null())
    .stderr(match std::env::var_os("LOCKWARDEN_BENCH_CONTROLLER_LOG") {
        Some(path) => Stdio::from(std::fs::File::create(path).expect("controller log")),
        None => Stdio::null(),
    });
    cmd
}

pub(crate) async fn part_operator(env: Arc<Env>, opts: Opts, report: Shared) {
    let mut op = OperatorEnv {
        env: env.clone(),
        secret: Default::default(),
    };
    let watch = Watch::start(env.client.clone());
    let ns = op.namespace("bench-op").await;
    let config = ControllerConfig {
        cluster_name: "bench".into(),
        namespace: Some(ns.clone()),
        ..Default::default()
    };
    // The controller's own client, as the `lockwarden controller` process has, with its
    // writes timed: the waiter's status write and a Lease's on each hand-off's path.
    let api_writes = ApiWrites::default();
    let controller_client = api_writes.client(env.plane.kubeconfig_path()).await;
    tokio::spawn(controller::run(controller_client, config));
    let api = locks_api(&env.client, &ns);
    let n_create = opts.n(20);
    let n_handoff = opts.n(15);
    // One untimed lock per backend first: connections, the ZooKeeper session, the
    // controller's first reconcile.
    for kind in KINDS {
        let name = support::unique("warm");
        api.create(
            &PostParams::default(),
            &op.lock(kind, &ns, &name, &support::unique("w"), "30s", "10s"),
        )
        .await
        .unwrap();
        watch.acquired(&format!("{ns}/{name}")).await;
    }
    status_write_cost(&env, &api, &watch, &report).await;
    for kind in KINDS {
        let mut created = Vec::new();
        for _ in 0..n_create {
            let name = support::unique("c");
            let lock = op.lock(kind, &ns, &name, &support::unique("k"), "30s", "10s");
            let t = Instant::now();
            api.create(&PostParams::default(), &lock).await.unwrap();
            let seen = watch.acquired(&format!("{ns}/{name}")).await;
            created.push(ms(seen - t));
            api.delete(&name, &DeleteParams::default()).await.unwrap();
            watch.deleted(&format!("{ns}/{name}")).await;
        }
        add_row(
            &report,
            "operator",
            kind,
            "created → Acquired seen by a watch",
            &created,
            None,
        );

        let mut handoffs = Vec::new();
        let mut stages: Vec<(f64, f64)> = Vec::new();
        let mut delete_seen = Vec::new();
        let mut write_on_path = Vec::new();
        let mut store_writes_on_path = Vec::new();
        for _ in 0..n_handoff {
            let key = support::unique("h");
            let (h, w) = (support::unique("holder"), support::unique("waiter"));
            api.create(
                &PostParams::default(),
                &op.lock(kind, &ns, &h, &key, "30s", "10s"),
            )
            .await
            .unwrap();
            watch.acquired(&format!("{ns}/{h}")).await;
            api.create(
                &PostParams::default(),
                &op.lock(kind, &ns, &w, &key, "30s", "10s"),
            )
            .await
            .unwrap();
            watch.waiting(&format!("{ns}/{w}")).await;
            // Let the waiter settle into its poll back-off, as a long wait would.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let t = Instant::now();
            api.delete(&h, &DeleteParams::default()).await.unwrap();
            let acquired = watch.acquired(&format!("{ns}/{w}")).await;
            let gone = watch.deleted(&format!("{ns}/{h}")).await;
            let deleting = watch
                .wait(&format!("{ns}/{h} deleting"), |s| {
                    s.deleting.get(&format!("{ns}/{h}")).copied()
                })
                .await;
            handoffs.push(ms(acquired - t));
            stages.push((ms(gone.saturating_duration_since(t)), ms(acquired - t)));
            delete_seen.push(ms(deleting.saturating_duration_since(t)));
            write_on_path.extend(api_writes.status_write(&w, t).map(ms));
            if kind == Kind::Lease {
                // The release and the acquisition: the Lease's two writes on the path.
                let leases = format!("/apis/coordination.k8s.io/v1/namespaces/{}/leases", env.ns);
                let lease = format!("{leases}/op-{key}");
                let writes = api_writes.writes_to(&[&lease, &leases], t, acquired);
                if let [release, acquisition, ..] = writes[..] {
                    store_writes_on_path.push(ms(release + acquisition));
                }
            }
            api.delete(&w, &DeleteParams::default()).await.unwrap();
            watch.deleted(&format!("{ns}/{w}")).await;
        }
        add_row(
            &report,
            "operator",
            kind,
            "same-cluster hand-off (delete → next Acquired)",
            &handoffs,
            None,
        );
        let gone: Vec<f64> = stages.iter().map(|s| s.0).collect();
        report
            .lock()
            .unwrap()
            .handoff_stages
            .insert(kind, (pct(&gone, 0.5), pct(&handoffs, 0.5)));
        report
            .lock()
            .unwrap()
            .delete_seen
            .insert(kind, pct(&delete_seen, 0.5));
        if !write_on_path.is_empty() {
            report
                .lock()
                .unwrap()
                .status_write_on_path
                .insert(kind, (pct(&write_on_path, 0.5), write_on_path.len()));
        }
        if !store_writes_on_path.is_empty() {
            report.lock().unwrap().store_writes_on_path.insert(
                kind,
                (pct(&store_writes_on_path, 0.5), store_writes_on_path.len()),
            );
        }
        note(
            &report,
            format!(
                "{}: hand-off stages (n={}): holder's object gone (finalizer done) p50 {:.1} ms after the delete request; waiter Acquired p50 {:.1} ms",
                kind.name(),
                stages.len(),
                pct(&gone, 0.5),
                pct(&handoffs, 0.5)
            ),
        );
    }

    // Cross-cluster: the holder's controller is a `lockwarden controller` process in
    // its own namespace and cluster name; the contender's controller runs here. They
    // share nothing but the backend key (no wake-up: the contender polls).
    let n_takeover = if opts.quick { 1 } else { 3 };
    let east = op.namespace("bench-east").await;
    let west = op.namespace("bench-west").await;
    tokio::spawn(controller::run(
        env.client.clone(),
        ControllerConfig {
            cluster_name: "west".into(),
            namespace: Some(west.clone()),
            ..Default::default()
        },
    ));
    for kind in KINDS {
        let mut samples = Vec::new();
        for _ in 0..n_takeover {
            let key = support::unique("x");
            let mut east_controller = KillOnDrop(start_controller_process(
                env.plane.kubeconfig_path(),
                "east",
                &east,
                support::free_port(),
            ));
            let (a, b) = (support::unique("a"), support::unique("b"));
            locks_api(&env.client, &east)
                .create(
                    &PostParams::default(),
                    &op.lock(kind, &east, &a, &key, "3s", "1s"),
                )
                .await
                .unwrap();
            watch.acquired(&format!("{east}/{a}")).await;
            locks_api(&env.client, &west)
                .create(
                    &PostParams::default(),
                    &op.lock(kind, &west, &b, &key, "3s", "1s"),
                )
                .await
                .unwrap();
            watch.waiting(&format!("{west}/{b}")).await;
            let t = Instant::now();
            east_controller.kill();
            let seen = watch.acquired(&format!("{west}/{b}")).await;
            samples.push(ms(seen - t));
            let _ = locks_api(&env.client, &west)
                .delete(&b, &DeleteParams::default())
                .await;
        }
        // The lease a contender must see unrenewed: 3 s (ZooKeeper: the session
        // timeout, which the controller takes from the default of 10 s).
        let lease = if kind == Kind::ZooKeeper { 10.0 } else { 3.0 };
        let bound = (lease + 0.25 + 2.0 + 1.0) * 1000.0;
        add_row(
            &report,
            "operator",
            kind,
            "cross-cluster takeover (holder's controller SIGKILLed → other cluster Acquired)",
            &samples,
            None,
        );
        report.lock().unwrap().takeover.push((
            kind,
            pct(&samples, 0.5),
            pct(&samples, 1.0),
            bound,
            samples.len(),
        ));
    }
}

/// The status write on every hand-off's path, two ways: server-side apply (what the
/// controller sends) and a JSON merge patch of the same status, interleaved on one
/// object of a namespace no controller watches.
async fn status_write_cost(
    env: &Arc<Env>,
    api: &Api<DistributedLock>,
    watch: &Watch,
    report: &Shared,
) {
    use kube::api::{Patch, PatchParams};
    // The status of a held lock, as the controller wrote it (any warm lock will do).
    let Some(status) = api
        .list(&Default::default())
        .await
        .ok()
        .and_then(|l| l.items.into_iter().find_map(|o| o.status))
    else {
        return;
    };
    let other = env.plane.namespace(&env.client, "bench-status").await;
    let objects = locks_api(&env.client, &other);
    let name = support::unique("status");
    let lock = DistributedLock::new(
        &name,
        DistributedLockSpec {
            backend: BackendSpec {
                kubernetes: Some(lockwarden::api::KubernetesBackend {
                    lease_name: name.clone(),
                    namespace: None,
                }),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    objects.create(&PostParams::default(), &lock).await.unwrap();
    let (mut apply, mut merge, mut seen) = (Vec::new(), Vec::new(), Vec::new());
    let id = format!("{other}/{name}");
    for i in 0..50 {
        let mut s = status.clone();
        s.fence = Some(1000 + i);
        let body = serde_json::json!({
            "apiVersion": "lockwarden.io/v1alpha1",
            "kind": "DistributedLock",
            "status": s,
        });
        let t = Instant::now();
        objects
            .patch_status(
                &name,
                &PatchParams::apply(controller::FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .unwrap();
        apply.push(ms(t.elapsed()));
        // The same write as a watcher of it sees it: the hand-off's last step.
        let fence = 1000 + i;
        let at = watch
            .wait(&format!("{id} fence {fence}"), |s| {
                s.fences.get(&(id.clone(), fence)).copied()
            })
            .await;
        seen.push(ms(at.saturating_duration_since(t)));
        s.fence = Some(5000 + i);
        let body = serde_json::json!({ "status": s });
        let t = Instant::now();
        objects
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .unwrap();
        merge.push(ms(t.elapsed()));
    }
    report.lock().unwrap().status_write = Some((pct(&apply, 0.5), pct(&merge, 0.5)));
    report.lock().unwrap().status_write_seen = Some(pct(&seen, 0.5));
    note(
        report,
        format!(
            "status write on the hand-off path (API server, one DistributedLock, n=50 each, interleaved): server-side apply p50 {:.2} ms p99 {:.2} ms (seen by a watch p50 {:.2} ms after its send); JSON merge patch of the same status p50 {:.2} ms p99 {:.2} ms",
            pct(&apply, 0.5),
            pct(&apply, 0.99),
            pct(&seen, 0.5),
            pct(&merge, 0.5),
            pct(&merge, 0.99)
        ),
    );
}

//! Part 4, scale: one process holding 100 … 10,000 locks, and 1,000 through the
//! `lockwarden controller` binary; CPU, RSS and missed renewals.

use super::*;

// ---------------------------------------------------------------------------------
// Part 4: scale

pub(crate) fn proc_cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may contain spaces): utime is field 14.
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let utime: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let stime: f64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    (utime + stime) / ticks
}

/// Open sockets of process `pid` (its connections to the stores and the API server).
pub(crate) fn proc_sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
                .filter(|target| target.to_string_lossy().starts_with("socket:"))
                .count()
        })
        .unwrap_or(0)
}

/// Open TCP sockets of process `pid` connected to `port` on the other side (its
/// connections to one server): the process's socket inodes matched against the
/// kernel's TCP tables.
pub(crate) fn proc_sockets_to(pid: u32, port: u16) -> usize {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
                .filter_map(|target| {
                    let target = target.to_string_lossy().into_owned();
                    Some(
                        target
                            .strip_prefix("socket:[")?
                            .strip_suffix(']')?
                            .to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let remote = format!(":{port:04X}");
    ["tcp", "tcp6"]
        .iter()
        .filter_map(|t| std::fs::read_to_string(format!("/proc/{pid}/net/{t}")).ok())
        .map(|table| {
            table
                .lines()
                .skip(1)
                .filter(|line| {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    f.len() > 9 && f[2].ends_with(&remote) && inodes.contains(f[9])
                })
                .count()
        })
        .sum()
}

/// Context switches of every thread of process `pid`, voluntary and not: a renewal that
/// parks and wakes a runtime thread shows here.
pub(crate) fn proc_context_switches(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter_map(|l| {
                    l.strip_prefix("voluntary_ctxt_switches:")
                        .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
                        .and_then(|v| v.trim().parse::<f64>().ok())
                })
                .collect::<Vec<_>>()
        })
        .sum()
}

/// The machine's CPU time so far (`/proc/stat`, all cores), in clock ticks: (busy,
/// stolen by the hypervisor, total). The busy share of a window is what else ran
/// beside the process measured.
pub(crate) fn machine_cpu_ticks() -> (f64, f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return (0.0, 0.0, 0.0);
    };
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let field = |i: usize| f.get(i).copied().unwrap_or(0.0);
    // user nice system idle iowait irq softirq steal …
    let total: f64 = f.iter().take(8).sum();
    let idle = field(3) + field(4);
    (total - idle, field(7), total)
}

pub(crate) fn proc_status_kb(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0)
}

/// `--scale-child KIND N INTERVAL_S HOLD_S ENDPOINT BUCKET`: holds N locks in this
/// process the way the controller's holder tasks do (a HeldLock per lock with an
/// observer of its state), then reports one JSON line.
pub(crate) fn scale_child(args: &[String]) {
    let kind = args[0].as_str();
    let n: usize = args[1].parse().unwrap();
    let interval = Duration::from_secs_f64(args[2].parse().unwrap());
    let hold = Duration::from_secs_f64(args[3].parse().unwrap());
    let endpoint = args[4].clone();
    let bucket = args[5].clone();
    // As the `lockwarden` binary starts (src/main.rs), so the engine is measured as
    // shipped. LOCKWARDEN_BENCH_MALLOC_DEFAULT=1 leaves glibc's defaults (A/B aid).
    if std::env::var_os("LOCKWARDEN_BENCH_MALLOC_DEFAULT").is_none() {
        lockwarden::allocator::tune();
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    // LOCKWARDEN_BENCH_SCALE_WORKERS: the runtime's worker threads (debugging aid).
    let workers = std::env::var("LOCKWARDEN_BENCH_SCALE_WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap();
    let pid = std::process::id();
    let rss_start = proc_status_kb(pid, "VmRSS:");
    let out = rt.block_on(async move {
        let attempts = AttemptCounter::default();
        // The AWS clients are lockwarden's own (`client_config`, as the controller and
        // the CLI build them), with a counter of request attempts added.
        let aws = support::moto::aws_options_for(&endpoint);
        let s3 = if kind == "s3" {
            let config = lockwarden::backend::s3::client_config(&aws, &Default::default()).await;
            Some(aws_sdk_s3::Client::from_conf(
                config.interceptor(attempts.clone()).build(),
            ))
        } else {
            None
        };
        // Their writes (every renewal) are lockwarden's own too, which count their
        // attempts.
        let s3_puts = match kind {
            "s3" => lockwarden::backend::s3::signed_puts(&aws, &Default::default()).await,
            _ => None,
        };
        let ddb_updates = match kind {
            "dynamodb" => lockwarden::backend::dynamodb::signed_updates(&aws).await,
            _ => None,
        };
        let ddb = if kind == "dynamodb" {
            let config = lockwarden::backend::dynamodb::client_config(&aws).await;
            Some(aws_sdk_dynamodb::Client::from_conf(
                config.interceptor(attempts.clone()).build(),
            ))
        } else {
            None
        };
        // The stores' bound of requests in flight, as the controller's clients have it.
        let s3_gate = lockwarden::backend::s3::client_request_gate(&aws);
        let ddb_gate = lockwarden::backend::dynamodb::client_request_gate(&aws);
        let lease_len = interval * 3;
        let zk_sessions = Arc::new(ZkSessions::with_session_timeout(lease_len));
        let policy = RenewPolicy {
            interval,
            ..RenewPolicy::for_lease(lease_len)
        };
        let missed = Arc::new(AtomicU64::new(0));
        let began = Instant::now();
        let prefix = support::unique("scale");
        let sem = Arc::new(tokio::sync::Semaphore::new(64));
        let mut tasks = Vec::with_capacity(n);
        for i in 0..n {
            let backend: Arc<dyn LockBackend> = match (&s3, &ddb) {
                (Some(c), _) => {
                    let mut store =
                        S3Store::new(c.clone(), bucket.clone(), format!("{prefix}/{i}"))
                            .with_request_gate(s3_gate.clone());
                    if let Some(puts) = &s3_puts {
                        store = store.with_signed_puts(puts.clone());
                    }
                    Arc::new(CasLock::new(store))
                }
                // For DynamoDB, the BUCKET argument is the table.
                (_, Some(c)) => {
                    let mut store = DynamoStore::new(
                        c.clone(),
                        TableLayout::new(bucket.clone()),
                        format!("{prefix}/{i}"),
                    )
                    .with_request_gate(ddb_gate.clone());
                    if let Some(updates) = &ddb_updates {
                        store = store.with_signed_updates(updates.clone());
                    }
                    Arc::new(CasLock::new(store))
                }
                // The ZooKeeper lease is the session timeout: 30 s, so that a 10 s
                // renew interval is below half of it (as for the other stores).
                _ => Arc::new(
                    zk_sessions
                        .lock(&endpoint, &format!("/{prefix}/{i}"))
                        .unwrap(),
                ),
            };
            let sem = sem.clone();
            let missed = missed.clone();
            tasks.push(tokio::spawn(async move {
                let permit = sem.acquire_owned().await.unwrap();
                let req = AcquireRequest::new(format!("bench/scale/{i}"), lease_len);
                let lease = acquire_now(backend.as_ref(), &req.holder).await;
                drop(permit);
                // As controller::holders does: an observer in the holder task counts
                // transitions away from Held.
                let mut was_held = true;
                let observer = Box::new(move |state: &HolderState| {
                    let held_now = matches!(state, HolderState::Held { .. });
                    if was_held && !held_now {
                        missed.fetch_add(1, Ordering::Relaxed);
                    }
                    was_held = held_now;
                });
                HeldLock::hold_observed(backend, lease, policy, observer)
            }));
        }
        let mut held = Vec::with_capacity(n);
        for t in tasks {
            held.push(t.await.unwrap());
        }
        let acquire_all = began.elapsed().as_secs_f64();
        let rss_held = proc_status_kb(pid, "VmRSS:");
        let zk_port = endpoint
            .rsplit(':')
            .next()
            .unwrap_or("0")
            .parse::<u16>()
            .unwrap_or(0);
        let count = |attempts: &AttemptCounter| -> f64 {
            if kind == "s3" || kind == "dynamodb" {
                let puts = s3_puts.as_ref().map_or(0, |p| p.attempts());
                let updates = ddb_updates.as_ref().map_or(0, |u| u.attempts());
                (attempts.0.load(Ordering::Relaxed) + puts + updates) as f64
            } else {
                zk_mntr_packets(zk_port)
            }
        };
        let c0 = count(&attempts);
        let switches0 = proc_context_switches(pid);
        let machine0 = machine_cpu_ticks();
        let cpu0 = proc_cpu_seconds(pid);
        let t0 = Instant::now();
        let perf = perf_record(pid, hold.as_secs_f64());
        tokio::time::sleep(hold).await;
        if let Some(mut perf) = perf {
            let _ = tokio::task::spawn_blocking(move || perf.wait()).await;
        }
        let window = t0.elapsed().as_secs_f64();
        let cpu1 = proc_cpu_seconds(pid);
        let machine1 = machine_cpu_ticks();
        let switches1 = proc_context_switches(pid);
        let c1 = count(&attempts);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let machine_share = |i: fn(&(f64, f64, f64)) -> f64| {
            let total = machine1.2 - machine0.2;
            if total > 0.0 {
                cores * (i(&machine1) - i(&machine0)) / total
            } else {
                f64::NAN
            }
        };
        let still_held = held.iter().filter(|h| h.is_held()).count();
        json!({
            "acquire_all_s": acquire_all,
            "window_s": window,
            "cpu_s": cpu1 - cpu0,
            "context_switches": switches1 - switches0,
            // Cores busy and stolen over the window, this process included.
            "machine_busy_cores": machine_share(|t| t.0),
            "machine_steal_cores": machine_share(|t| t.1),
            "renewals": c1 - c0,
            "missed": missed.load(Ordering::Relaxed),
            "still_held": still_held,
            "rss_start_kb": rss_start,
            "rss_held_kb": rss_held,
            "hwm_kb": proc_status_kb(pid, "VmHWM:"),
        })
    });
    println!("{out}");
    // Leave without releasing: ZooKeeper drops the entries with the session, and S3
    // objects are just left behind in moto.
    std::process::exit(0);
}

pub(crate) fn zk_mntr_packets(port: u16) -> f64 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("mntr");
    s.write_all(b"mntr").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.lines()
        .find_map(|l| l.strip_prefix("zk_packets_received"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

pub(crate) fn run_scale_child(
    kind: &str,
    n: usize,
    interval: f64,
    hold: f64,
    endpoint: &str,
    bucket: &str,
) -> Result<Value, String> {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([
            "--scale-child",
            kind,
            &n.to_string(),
            &interval.to_string(),
            &hold.to_string(),
            endpoint,
            bucket,
        ])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
        .ok_or_else(|| {
            format!(
                "scale child {kind} {n} printed no result (exit {:?})",
                out.status
            )
        })
}

pub(crate) async fn part_scale(env: Arc<Env>, opts: Opts, report: Shared) {
    let hold: f64 = if opts.quick { 12.0 } else { 25.0 };
    let capacity = report.lock().unwrap().s3_capacity.map_or(0.0, |(_, c)| c);
    let capacity = if capacity > 0.0 {
        capacity
    } else {
        raw_throughput(&env, Kind::S3, WRITERS, 3.0).await
    };
    report.lock().unwrap().s3_capacity = Some((env.s3_server.name(), capacity));
    let sizes: &[usize] = if opts.quick {
        &[1000]
    } else {
        &[100, 1000, 3000, 10_000]
    };
    // (store, locks, renew interval s, endpoint, bucket or table)
    let mut plans: Vec<(&str, usize, f64, String, String)> = Vec::new();
    for &n in sizes {
        plans.push(("zookeeper", n, 10.0, env.zk.connect_string(), String::new()));
    }
    // DynamoDB at 1,000 locks: the renewal's cost per request, next to S3's.
    plans.push((
        "dynamodb",
        1000,
        10.0,
        env.dynamodb_server.endpoint(),
        env.table.clone(),
    ));
    for &n in sizes {
        // Renewals must stay under about half the server's measured capacity, and
        // acquiring all (2 requests each) must fit the time budget.
        let interval = (n as f64 / (0.5 * capacity)).max(10.0).ceil();
        let acquire_estimate = 2.0 * n as f64 / capacity;
        if acquire_estimate + hold.max(interval * 1.2) > 300.0 {
            note(
                &report,
                format!(
                    "scale s3 {n}: not run — {} measured {capacity:.0} conditional writes/s in this run, so acquiring {n} locks (2 requests each) takes ~{acquire_estimate:.0} s and renewing them needs an interval ≥ {interval:.0} s; beyond this run's time budget",
                    env.s3_server.name()
                ),
            );
            continue;
        }
        plans.push((
            "s3",
            n,
            interval,
            env.s3_server.endpoint(),
            env.bucket.clone(),
        ));
    }
    // LOCKWARDEN_BENCH_SCALE=s3:200 runs only that (debugging aid).
    if let Ok(only) = std::env::var("LOCKWARDEN_BENCH_SCALE") {
        let (k, n) = only.split_once(':').unwrap_or((only.as_str(), "1000"));
        let n: usize = n.parse().unwrap_or(1000);
        let (kind, endpoint, bucket) = match k {
            "s3" => ("s3", env.s3_server.endpoint(), env.bucket.clone()),
            "dynamodb" => (
                "dynamodb",
                env.dynamodb_server.endpoint(),
                env.table.clone(),
            ),
            _ => ("zookeeper", env.zk.connect_string(), String::new()),
        };
        let interval = if k == "s3" {
            (n as f64 / (0.5 * capacity)).max(10.0).ceil()
        } else {
            10.0
        };
        // LOCKWARDEN_BENCH_SCALE_INTERVAL=SECONDS overrides the renew interval (the
        // S3 one follows the server's capacity measured with the machine to itself).
        let interval = std::env::var("LOCKWARDEN_BENCH_SCALE_INTERVAL")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(interval);
        plans = vec![(kind, n, interval, endpoint, bucket)];
        // operator / operator-zookeeper / operator-s3: through the controller process.
        if let Some(store) = k
            .starts_with("operator")
            .then(|| ScaleStore::parse(k))
            .flatten()
        {
            plans.clear();
            let interval = if store == ScaleStore::S3
                || std::env::var_os("LOCKWARDEN_BENCH_SCALE_INTERVAL").is_some()
            {
                interval
            } else {
                10.0
            };
            match scale_operator(&env, store, n, hold.max(interval * 1.2), interval).await {
                Ok(row) => report.lock().unwrap().scale.push(row),
                Err(e) => note(
                    &report,
                    format!("scale operator {} {n}: failed: {e}", store.name()),
                ),
            }
        }
    }
    for (kind, n, interval, endpoint, bucket) in plans {
        // Hold for at least 1.2 renewal intervals so every lock renews at least once.
        let window = hold.max(interval * 1.2);
        let ep = endpoint.clone();
        let result = tokio::task::spawn_blocking(move || {
            run_scale_child(kind, n, interval, window, &ep, &bucket)
        })
        .await
        .unwrap();
        match result {
            Ok(v) => {
                let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
                let renewals_per_s = f("renewals") / f("window_s");
                let row = ScaleRow {
                    kind: kind.into(),
                    path: "engine (HeldLock + observer per lock, one process)".into(),
                    locks: n,
                    interval_s: interval,
                    hold_s: f("window_s"),
                    acquire_all_s: f("acquire_all_s"),
                    renewals: f("renewals"),
                    renewals_expected: n as f64 * f("window_s") / interval,
                    missed: f("missed"),
                    cpu_per_1k_renewals_per_s: 100.0 * (f("cpu_s") / f("window_s"))
                        / (renewals_per_s / 1000.0),
                    peak_rss_mb: f("hwm_kb") / 1024.0,
                    rss_per_1k_mb: (f("rss_held_kb") - f("rss_start_kb"))
                        / 1024.0
                        / (n as f64 / 1000.0),
                    status_writes_per_renewal: None,
                    note: format!(
                        "still held at the end: {}; CPU {:.1} % of a core over the window; {:.2} context switches per renewal; the machine {:.2} cores busy ({:.2} stolen)",
                        v["still_held"],
                        100.0 * f("cpu_s") / f("window_s"),
                        f("context_switches") / f("renewals"),
                        f("machine_busy_cores"),
                        f("machine_steal_cores"),
                    ),
                };
                eprintln!("[bench] scale {row:?}");
                report.lock().unwrap().scale.push(row);
            }
            Err(e) => note(&report, format!("scale {kind} {n}: failed: {e}")),
        }
    }
    if std::env::var_os("LOCKWARDEN_BENCH_SCALE").is_some() {
        return;
    }
    // Through the `lockwarden controller` binary: 1,000 Lease locks, and 10,000 on
    // ZooKeeper (LOCKWARDEN_BENCH_SCALE=operator-zookeeper:10000 /
    // operator-s3:10000 run one of them alone; the S3 interval follows the server's
    // measured capacity, as above).
    let n = if opts.quick { 300 } else { 1000 };
    match scale_operator(&env, ScaleStore::Lease, n, hold, 10.0).await {
        Ok(row) => report.lock().unwrap().scale.push(row),
        Err(e) => note(
            &report,
            format!("scale operator kubernetes {n}: failed: {e}"),
        ),
    }
}

/// The store behind the operator's scale run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum ScaleStore {
    Lease,
    ZooKeeper,
    S3,
}

impl ScaleStore {
    pub(crate) fn parse(name: &str) -> Option<ScaleStore> {
        match name {
            "operator" | "kubernetes" => Some(ScaleStore::Lease),
            "operator-zookeeper" | "zookeeper" => Some(ScaleStore::ZooKeeper),
            "operator-s3" | "s3" => Some(ScaleStore::S3),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ScaleStore::Lease => "kubernetes",
            ScaleStore::ZooKeeper => "zookeeper",
            ScaleStore::S3 => "s3",
        }
    }

    /// Lock `i`'s backend in namespace `ns`.
    fn backend(self, env: &Env, ns: &str, i: usize) -> BackendSpec {
        match self {
            ScaleStore::Lease => BackendSpec {
                kubernetes: Some(lockwarden::api::KubernetesBackend {
                    lease_name: format!("s-{i}"),
                    namespace: None,
                }),
                ..Default::default()
            },
            ScaleStore::ZooKeeper => BackendSpec {
                zookeeper: Some(lockwarden::api::ZooKeeperBackend {
                    servers: vec![env.zk.connect_string()],
                    path: format!("/bench/{ns}/s-{i}"),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ScaleStore::S3 => BackendSpec {
                s3: Some(lockwarden::api::S3Backend {
                    bucket: env.bucket.clone(),
                    key: format!("scale/{ns}/s-{i}"),
                    endpoint: Some(env.s3_server.endpoint()),
                    region: Some(support::moto::REGION.into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
        }
    }
}

/// `n` DistributedLocks through one `lockwarden controller` process, renewing every
/// `interval` s: time to acquire all, renewals missed, status writes and API-server
/// requests per renewal, CPU and RSS. On Leases renewals are counted as the Lease
/// writes the API server saw; on the other stores, as `n × window / interval` (the
/// controller does not count renewals), with missed renewals from
/// `lockwarden_renew_failures_total` on every store.
pub(crate) async fn scale_operator(
    env: &Arc<Env>,
    store: ScaleStore,
    n: usize,
    hold: f64,
    interval: f64,
) -> Result<ScaleRow, String> {
    let client = env.client.clone();
    let ns = env.plane.namespace(&client, "bench-scale").await;
    let metrics_port = support::free_port();
    let mut controller =
        start_controller_command(env.plane.kubeconfig_path(), "scale", &ns, metrics_port);
    if store == ScaleStore::S3 {
        controller
            .env("AWS_ACCESS_KEY_ID", support::moto::ACCESS_KEY_ID)
            .env("AWS_SECRET_ACCESS_KEY", support::moto::SECRET_ACCESS_KEY)
            .env("AWS_EC2_METADATA_DISABLED", "true");
    }
    let mut child = KillOnDrop(controller.spawn().expect("start lockwarden controller"));
    let pid = child.0.id();
    // The most sockets the controller had open at once (sampled every 0.5 s): what an
    // overloaded store draws (issue 45's bound of requests in flight).
    // Of them, those to the store (S3 and DynamoDB: the bounded clients).
    let store_port = match store {
        ScaleStore::S3 => env
            .s3_server
            .endpoint()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok()),
        _ => None,
    };
    let peak_sockets = Arc::new(AtomicU64::new(0));
    let peak_store_sockets = Arc::new(AtomicU64::new(0));
    // The highest RSS sampled (kB): taken and reset once all are acquired, so the
    // acquisition's peak and the steady state's are told apart.
    let peak_rss = Arc::new(AtomicU64::new(0));
    let (peak, peak_store, rss) = (
        peak_sockets.clone(),
        peak_store_sockets.clone(),
        peak_rss.clone(),
    );
    let socket_sampler = tokio::spawn(async move {
        loop {
            rss.fetch_max(proc_status_kb(pid, "VmRSS:") as u64, Ordering::Relaxed);
            peak.fetch_max(proc_sockets(pid) as u64, Ordering::Relaxed);
            if let Some(port) = store_port {
                peak_store.fetch_max(proc_sockets_to(pid, port) as u64, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let api = locks_api(&client, &ns);
    // Count Acquired objects with a watch of this namespace.
    let acquired = Arc::new(AtomicU64::new(0));
    let acq = acquired.clone();
    let watch_api = api.clone();
    let watch_task = tokio::spawn(async move {
        let mut seen = std::collections::HashSet::new();
        let mut events = watcher(watch_api, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(event) = events.next().await {
            // A failed poll (an overloaded API server) is retried by the watcher.
            let Ok(l) = event else { continue };
            if l.status
                .as_ref()
                .is_some_and(|s| conditions::is_true(&s.conditions, ACQUIRED))
                && seen.insert(l.name_any())
            {
                acq.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_start = proc_status_kb(pid, "VmRSS:");
    let began = Instant::now();
    let creates = futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            let lock = DistributedLock::new(
                &format!("s-{i}"),
                DistributedLockSpec {
                    backend: store.backend(env, &ns, i),
                    lease_duration: format!("{}s", interval * 3.0),
                    renew_interval: format!("{interval}s"),
                    ..Default::default()
                },
            );
            async move {
                match api.create(&PostParams::default(), &lock).await {
                    // A create the client retried after an overloaded reply.
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                    r => r.map(|_| ()),
                }
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    if let Some(Err(e)) = creates.into_iter().find(|r| r.is_err()) {
        return Err(format!("create: {e}"));
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    while (acquired.load(Ordering::Relaxed) as usize) < n {
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {n} acquired after 600 s; {} open sockets in the controller ({} at most, {} to the store), {:.0} MB RSS ({:.0} MB at most)",
                acquired.load(Ordering::Relaxed),
                proc_sockets(pid),
                peak_sockets.load(Ordering::Relaxed),
                peak_store_sockets.load(Ordering::Relaxed),
                proc_status_kb(pid, "VmRSS:") / 1024.0,
                proc_status_kb(pid, "VmHWM:") / 1024.0
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let acquire_all = began.elapsed().as_secs_f64();
    let rss_held = proc_status_kb(pid, "VmRSS:");
    let peak_rss_acquiring = peak_rss.swap(0, Ordering::Relaxed) as f64 / 1024.0;
    let sockets = proc_sockets(pid);
    // Let the acquisition burst settle before measuring the steady state.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let m0 = apiserver_counts(&client).await;
    let metrics0 = reqwest_metrics(metrics_port).await;
    let cpu0 = proc_cpu_seconds(pid);
    let t0 = Instant::now();
    let perf = perf_record(pid, hold);
    tokio::time::sleep(Duration::from_secs_f64(hold)).await;
    if let Some(mut perf) = perf {
        let _ = tokio::task::spawn_blocking(move || perf.wait()).await;
    }
    let window = t0.elapsed().as_secs_f64();
    let cpu1 = proc_cpu_seconds(pid);
    let m1 = apiserver_counts(&client).await;
    let hwm = proc_status_kb(pid, "VmHWM:");
    let peak_rss_renewing = peak_rss.load(Ordering::Relaxed) as f64 / 1024.0;
    let metrics = reqwest_metrics(metrics_port).await;
    child.kill();
    watch_task.abort();
    socket_sampler.abort();
    let peak_sockets = peak_sockets.load(Ordering::Relaxed);
    let peak_store_sockets = match store_port {
        Some(_) => format!(
            " ({} to the store)",
            peak_store_sockets.load(Ordering::Relaxed)
        ),
        None => String::new(),
    };
    let expected = n as f64 * window / interval;
    let counter = |text: &str, name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    // Counted by the controller (`lockwarden_renewals_total`); a controller built
    // before that counter existed (LOCKWARDEN_BENCH_CONTROLLER) is credited with the
    // expected number.
    let renewals = counter(&metrics, "lockwarden_renewals_total")
        .zip(counter(&metrics0, "lockwarden_renewals_total"))
        .map_or(expected, |(after, before)| after - before);
    let lease_writes = api_sum(&m1, "leases", true) - api_sum(&m0, "leases", true);
    let api_requests: f64 = m1.values().sum::<f64>() - m0.values().sum::<f64>();
    let mut writes: Vec<_> = m1
        .iter()
        .map(|(k, v)| (k.clone(), v - m0.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect();
    writes.sort_by(|a, b| b.1.total_cmp(&a.1));
    eprintln!("[bench] apiserver requests during the window: {writes:?}");
    let status_writes =
        api_sum(&m1, "distributedlocks", true) - api_sum(&m0, "distributedlocks", true);
    let failures = counter(&metrics, "lockwarden_renew_failures_total").unwrap_or(f64::NAN);
    let backend = format!("{{backend=\"{}\"}}", store.name());
    let waits = counter(
        &metrics,
        &format!("lockwarden_store_request_waits_total{backend}"),
    );
    let wait_s = counter(
        &metrics,
        &format!("lockwarden_store_request_wait_seconds_total{backend}"),
    );
    let bound = match (waits, wait_s) {
        (Some(waits), Some(wait_s)) => format!(
            "; {waits:.0} requests waited for the bound of requests in flight, {wait_s:.1} s in all"
        ),
        _ => String::new(),
    };
    let renewals_per_s = renewals / window;
    Ok(ScaleRow {
        kind: store.name().into(),
        path: "operator (`lockwarden controller` process)".into(),
        locks: n,
        interval_s: interval,
        hold_s: window,
        acquire_all_s: acquire_all,
        renewals,
        renewals_expected: expected,
        missed: failures,
        cpu_per_1k_renewals_per_s: 100.0 * ((cpu1 - cpu0) / window) / (renewals_per_s / 1000.0),
        peak_rss_mb: hwm / 1024.0,
        rss_per_1k_mb: (rss_held - rss_start) / 1024.0 / (n as f64 / 1000.0),
        status_writes_per_renewal: Some(if renewals > 0.0 {
            status_writes / renewals
        } else {
            f64::NAN
        }),
        note: format!(
            "acquire-all includes creating the objects ({n} creates, 8 in flight); CPU {:.1} % of a core over the window; {:.2} API-server requests per renewal; {sockets} open sockets in the controller once all were acquired, {peak_sockets} at most{peak_store_sockets}{bound}; RSS at most {peak_rss_acquiring:.0} MB while acquiring, {peak_rss_renewing:.0} MB while renewing (sampled every 0.5 s){}",
            100.0 * (cpu1 - cpu0) / window,
            api_requests / renewals,
            if store == ScaleStore::Lease {
                format!("; {lease_writes:.0} Lease writes counted by the API server")
            } else {
                String::new()
            }
        ),
    })
}

/// With LOCKWARDEN_BENCH_PERF=FILE: samples process `pid` with `perf record -g` for
/// `secs` (the steady-state window), for the profile in docs/benchmarks.md.
pub(crate) fn perf_record(pid: u32, secs: f64) -> Option<std::process::Child> {
    let out = std::env::var_os("LOCKWARDEN_BENCH_PERF")?;
    Command::new("perf")
        .args([
            "record",
            "-F",
            "499",
            "--call-graph",
            "dwarf,16384",
            "-p",
            &pid.to_string(),
            "-o",
        ])
        .arg(out)
        .args(["--", "sleep", &format!("{}", secs.floor())])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

/// A child process killed (SIGKILL) when dropped, on every return path.
pub(crate) struct KillOnDrop(pub(crate) std::process::Child);

impl KillOnDrop {
    pub(crate) fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.kill();
    }
}

/// GET http://127.0.0.1:PORT/metrics with a plain HTTP/1.0 request.
pub(crate) async fn reqwest_metrics(port: u16) -> String {
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return String::new();
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let _ = s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    })
    .await
    .unwrap_or_default()
}

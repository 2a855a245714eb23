//! `cargo bench --bench lockwarden`: lockwarden against real servers, next to the bare
//! backend round trip measured in the same run (issue 7, docs/design.md §8).
//!
//! Parts (`--only floor|engine|operator|scale`; `--quick` for fewer samples):
//! 1. floor: one conditional write with the raw SDK/client per backend (latency and
//!    throughput with several writers);
//! 2. engine: cold/warm acquire, renew, release latency per backend, round trips per
//!    operation counted (AWS SDK interceptor, kube-apiserver `/metrics`, ZooKeeper
//!    `mntr`), acquire+release throughput on many keys;
//! 3. operator: `DistributedLock` created → `Acquired=True` seen by a watch, same-cluster
//!    hand-off, takeover after the holder's controller process is SIGKILLed;
//! 4. scale: one process holding 1,000 / 10,000 locks (engine, as the controller's
//!    holder tasks do) and 1,000 through the `lockwarden controller` binary.
//!
//! Servers are started the way the tests start them (`tests/support`). Results go to
//! `docs/benchmarks.md` (between the GENERATED markers), `docs/benchmarks.svg` and
//! `target/bench-results.json`. Nothing here asserts a target: targets are reported.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use aws_sdk_s3::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_s3::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_s3::primitives::ByteStream;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease as KubeLease;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use lockwarden::api::conditions::{self, ACQUIRED};
use lockwarden::api::{BackendSpec, DistributedLock, DistributedLockSpec, LockPhase};
use lockwarden::backend::{DynamoStore, LeaseStore, S3Store, TableLayout, ZkSessions};
use lockwarden::controller::{self, ControllerConfig};
use lockwarden::lock::{
    AcquireRequest, Attempt, CasLock, HeldLock, HolderState, LockBackend, RenewPolicy,
};
use serde_json::{Value, json};
use support::kube::{ControlPlane, install_lockwarden_crd};
use support::moto::Moto;
use support::zookeeper::ZooKeeper;
use tokio::sync::Notify;

const KINDS: [Kind; 4] = [Kind::S3, Kind::DynamoDb, Kind::Lease, Kind::ZooKeeper];
const WAIT: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    S3,
    DynamoDb,
    Lease,
    ZooKeeper,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::S3 => "s3",
            Kind::DynamoDb => "dynamodb",
            Kind::Lease => "kubernetes",
            Kind::ZooKeeper => "zookeeper",
        }
    }
    fn floor_op(self) -> &'static str {
        match self {
            Kind::S3 => "PutObject If-Match",
            Kind::DynamoDb => "UpdateItem ConditionExpression",
            Kind::Lease => "Lease replace with resourceVersion",
            Kind::ZooKeeper => "setData with version",
        }
    }
}

// ---------------------------------------------------------------------------------
// Options and results

#[derive(Clone, Debug)]
struct Opts {
    quick: bool,
    only: Option<String>,
}

impl Opts {
    fn runs(&self, part: &str) -> bool {
        self.only
            .as_deref()
            .is_none_or(|o| o.split(',').any(|p| p == part))
    }
    /// Full count, or a fifth of it (at least 3) with --quick.
    fn n(&self, full: usize) -> usize {
        if self.quick { (full / 5).max(3) } else { full }
    }
}

#[derive(Clone, Debug)]
struct Floor {
    n: usize,
    p50: f64,
    p99: f64,
    create_p50: f64,
    ops_per_s: f64,
    writers: usize,
}

#[derive(Clone, Debug)]
struct Row {
    part: &'static str,
    kind: Kind,
    what: String,
    n: usize,
    p50: f64,
    p99: f64,
    round_trips: Option<f64>,
}

#[derive(Clone, Debug, Default)]
struct ScaleRow {
    kind: String,
    path: String,
    locks: usize,
    interval_s: f64,
    hold_s: f64,
    acquire_all_s: f64,
    renewals: f64,
    renewals_expected: f64,
    missed: f64,
    cpu_per_1k_renewals_per_s: f64,
    peak_rss_mb: f64,
    rss_per_1k_mb: f64,
    status_writes_per_renewal: Option<f64>,
    note: String,
}

#[derive(Default)]
struct Report {
    floors: BTreeMap<Kind, Floor>,
    rows: Vec<Row>,
    throughput: Vec<(Kind, f64, f64, usize)>, // engine ops/s, raw ops/s, writers
    takeover: Vec<(Kind, f64, f64, f64, usize)>, // p50, max, bound, n
    scale: Vec<ScaleRow>,
    plots: Vec<(Kind, String, Vec<f64>)>,
    notes: Vec<String>,
    moto_capacity: Option<f64>,
}

type Shared = Arc<Mutex<Report>>;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Nearest-rank percentile of unsorted samples.
fn pct(samples: &[f64], q: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut v = samples.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

fn add_row(
    report: &Shared,
    part: &'static str,
    kind: Kind,
    what: &str,
    samples: &[f64],
    round_trips: Option<f64>,
) {
    let mut r = report.lock().unwrap();
    r.rows.push(Row {
        part,
        kind,
        what: what.to_string(),
        n: samples.len(),
        p50: pct(samples, 0.5),
        p99: pct(samples, 0.99),
        round_trips,
    });
    r.plots
        .push((kind, format!("{part}: {what}"), samples.to_vec()));
    eprintln!(
        "[bench] {part} {} {what}: n={} p50={:.2} ms p99={:.2} ms rt={round_trips:?}",
        kind.name(),
        samples.len(),
        pct(samples, 0.5),
        pct(samples, 0.99)
    );
}

fn note(report: &Shared, text: String) {
    eprintln!("[bench] note: {text}");
    report.lock().unwrap().notes.push(text);
}

// ---------------------------------------------------------------------------------
// Counting round trips

/// Counts every HTTP attempt an AWS SDK client transmits.
#[derive(Clone, Debug, Default)]
struct AttemptCounter(Arc<AtomicU64>);

impl Intercept for AttemptCounter {
    fn name(&self) -> &'static str {
        "AttemptCounter"
    }
    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Sums `apiserver_request_total` per (resource, subresource, verb).
async fn apiserver_counts(client: &Client) -> HashMap<(String, String, String), f64> {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(req).await.expect("apiserver /metrics");
    let mut out = HashMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        *out.entry((label("resource"), label("subresource"), label("verb")))
            .or_insert(0.0) += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    out
}

fn api_sum(
    counts: &HashMap<(String, String, String), f64>,
    resource: &str,
    writes_only: bool,
) -> f64 {
    counts
        .iter()
        .filter(|((r, _, v), _)| {
            r == resource
                && (!writes_only
                    || matches!(v.as_str(), "PUT" | "PATCH" | "POST" | "APPLY" | "DELETE"))
        })
        .map(|(_, n)| n)
        .sum()
}

fn zk_packets(zk: &ZooKeeper) -> f64 {
    let out = zk.node(0).four_letter("mntr").expect("ZooKeeper mntr");
    out.lines()
        .find_map(|l| l.strip_prefix("zk_packets_received"))
        .and_then(|v| v.trim().parse().ok())
        .expect("zk_packets_received in mntr (4lw.commands.whitelist)")
}

// ---------------------------------------------------------------------------------
// Servers and backends

struct Env {
    moto: &'static Moto,
    zk: &'static ZooKeeper,
    plane: &'static ControlPlane,
    client: Client,
    s3: aws_sdk_s3::Client,
    ddb: aws_sdk_dynamodb::Client,
    aws_attempts: AttemptCounter,
    bucket: String,
    table: String,
    ns: String,
}

impl Env {
    async fn start() -> Env {
        let (moto, zk, plane) = tokio::task::spawn_blocking(|| {
            let plane = ControlPlane::shared();
            (Moto::shared(), ZooKeeper::shared(), plane)
        })
        .await
        .unwrap();
        let client = plane.client().await;
        install_lockwarden_crd(&client).await;
        let ns = plane.namespace(&client, "bench").await;
        let aws_attempts = AttemptCounter::default();
        let sdk = support::moto::sdk_config_for(&moto.endpoint()).await;
        let s3 = aws_sdk_s3::Client::from_conf(
            aws_sdk_s3::config::Builder::from(&sdk)
                .force_path_style(true)
                .interceptor(aws_attempts.clone())
                .build(),
        );
        let ddb = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(&sdk)
                .interceptor(aws_attempts.clone())
                .build(),
        );
        let bucket = moto.new_bucket("bench").await;
        let table = moto.new_table("bench", "key").await;
        Env {
            moto,
            zk,
            plane,
            client,
            s3,
            ddb,
            aws_attempts,
            bucket,
            table,
            ns,
        }
    }

    fn engine(&self, kind: Kind, key: &str) -> Arc<dyn LockBackend> {
        match kind {
            Kind::S3 => Arc::new(CasLock::new(S3Store::new(
                self.s3.clone(),
                self.bucket.clone(),
                format!("locks/{key}"),
            ))),
            Kind::DynamoDb => Arc::new(CasLock::new(DynamoStore::new(
                self.ddb.clone(),
                TableLayout::new(self.table.clone()),
                key.to_string(),
            ))),
            Kind::Lease => Arc::new(CasLock::new(LeaseStore::new(
                self.client.clone(),
                &self.ns,
                key,
            ))),
            Kind::ZooKeeper => Arc::new(
                ZkSessions::global()
                    .lock(&self.zk.connect_string(), &format!("/bench/{key}"))
                    .expect("zk lock"),
            ),
        }
    }

    /// Cumulative count of requests that reached the backend's server (for deltas).
    async fn round_trips(&self, kind: Kind) -> f64 {
        match kind {
            Kind::S3 | Kind::DynamoDb => self.aws_attempts.0.load(Ordering::Relaxed) as f64,
            Kind::Lease => api_sum(&apiserver_counts(&self.client).await, "leases", false),
            Kind::ZooKeeper => {
                // Each `mntr` exchange is itself counted as a packet by the server.
                static READS: AtomicU64 = AtomicU64::new(0);
                let reads = READS.fetch_add(1, Ordering::Relaxed) as f64;
                let zk = self.zk;
                tokio::task::spawn_blocking(move || zk_packets(zk))
                    .await
                    .unwrap()
                    - reads
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Part 1: floor

/// One raw conditional-write chain on one key, as the SDK/client does it.
#[allow(clippy::large_enum_variant)] // a handful of these live at a time
enum RawChain {
    S3 {
        client: aws_sdk_s3::Client,
        bucket: String,
        key: String,
        etag: String,
    },
    Dynamo {
        client: aws_sdk_dynamodb::Client,
        table: String,
        key: String,
        v: u64,
    },
    Lease {
        api: Api<KubeLease>,
        lease: KubeLease,
    },
    Zk {
        client: zookeeper_client::Client,
        path: String,
        version: i32,
    },
}

fn body(i: u64) -> Vec<u8> {
    // About the size of a lock record.
    format!(
        "{{\"holder\":\"bench/floor\",\"nonce\":\"{:032}\",\"revision\":\"{i:016}\",\"fence\":{i},\"leaseMs\":30000,\"state\":\"held\",\"acquiredAt\":\"2026-01-01T00:00:00Z\",\"renewedAt\":\"2026-01-01T00:00:00Z\"}}",
        i
    )
    .into_bytes()
}

impl RawChain {
    async fn new(env: &Env, kind: Kind, key: &str) -> RawChain {
        match kind {
            Kind::S3 => {
                let key = format!("floor/{key}");
                let out = env
                    .s3
                    .put_object()
                    .bucket(&env.bucket)
                    .key(&key)
                    .body(ByteStream::from(body(0)))
                    .send()
                    .await
                    .expect("floor put");
                RawChain::S3 {
                    client: env.s3.clone(),
                    bucket: env.bucket.clone(),
                    key,
                    etag: out.e_tag().unwrap().to_string(),
                }
            }
            Kind::DynamoDb => {
                use aws_sdk_dynamodb::types::AttributeValue as A;
                env.ddb
                    .put_item()
                    .table_name(&env.table)
                    .item("key", A::S(format!("floor-{key}")))
                    .item("v", A::N("0".into()))
                    .send()
                    .await
                    .expect("floor put_item");
                RawChain::Dynamo {
                    client: env.ddb.clone(),
                    table: env.table.clone(),
                    key: format!("floor-{key}"),
                    v: 0,
                }
            }
            Kind::Lease => {
                let api = Api::<KubeLease>::namespaced(env.client.clone(), &env.ns);
                let lease = KubeLease {
                    metadata: ObjectMeta {
                        name: Some(format!("floor-{key}")),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                let lease = api
                    .create(&PostParams::default(), &lease)
                    .await
                    .expect("floor lease");
                RawChain::Lease { api, lease }
            }
            Kind::ZooKeeper => {
                let client = env.zk.connect().await;
                let path = format!("/bench-floor-{key}");
                let open = zookeeper_client::Acls::anyone_all();
                let (stat, _) = client
                    .create(
                        &path,
                        &body(0),
                        &zookeeper_client::CreateMode::Persistent.with_acls(open),
                    )
                    .await
                    .expect("floor znode");
                RawChain::Zk {
                    client,
                    path,
                    version: stat.version,
                }
            }
        }
    }

    /// One conditional write on the version the previous one produced.
    async fn write(&mut self, i: u64) {
        match self {
            RawChain::S3 {
                client,
                bucket,
                key,
                etag,
            } => {
                let out = client
                    .put_object()
                    .bucket(bucket.as_str())
                    .key(key.as_str())
                    .if_match(etag.as_str())
                    .content_type("application/json")
                    .body(ByteStream::from(body(i)))
                    .send()
                    .await
                    .expect("floor If-Match put");
                *etag = out.e_tag().unwrap().to_string();
            }
            RawChain::Dynamo {
                client,
                table,
                key,
                v,
            } => {
                use aws_sdk_dynamodb::types::AttributeValue as A;
                client
                    .update_item()
                    .table_name(table.as_str())
                    .key("key", A::S(key.clone()))
                    .update_expression("SET v = :n, b = :b")
                    .condition_expression("v = :o")
                    .expression_attribute_values(":n", A::N((*v + 1).to_string()))
                    .expression_attribute_values(":o", A::N(v.to_string()))
                    .expression_attribute_values(":b", A::S(String::from_utf8(body(i)).unwrap()))
                    .send()
                    .await
                    .expect("floor conditional update");
                *v += 1;
            }
            RawChain::Lease { api, lease } => {
                lease
                    .annotations_mut()
                    .insert("bench/revision".into(), i.to_string());
                *lease = api
                    .replace(&lease.name_any(), &PostParams::default(), lease)
                    .await
                    .expect("floor lease replace");
            }
            RawChain::Zk {
                client,
                path,
                version,
            } => {
                let stat = client
                    .set_data(path, &body(i), Some(*version))
                    .await
                    .expect("floor setData");
                *version = stat.version;
            }
        }
    }
}

/// A raw create-if-absent on a fresh key (S3 If-None-Match; others for completeness).
async fn raw_create(env: &Env, kind: Kind, key: &str) {
    match kind {
        Kind::S3 => {
            env.s3
                .put_object()
                .bucket(&env.bucket)
                .key(format!("floor-create/{key}"))
                .if_none_match("*")
                .body(ByteStream::from(body(1)))
                .send()
                .await
                .expect("floor If-None-Match");
        }
        Kind::DynamoDb => {
            use aws_sdk_dynamodb::types::AttributeValue as A;
            env.ddb
                .put_item()
                .table_name(&env.table)
                .item("key", A::S(format!("floor-create-{key}")))
                .item("v", A::N("0".into()))
                .condition_expression("attribute_not_exists(#k)")
                .expression_attribute_names("#k", "key")
                .send()
                .await
                .expect("floor conditional create");
        }
        Kind::Lease => {
            let api = Api::<KubeLease>::namespaced(env.client.clone(), &env.ns);
            let lease = KubeLease {
                metadata: ObjectMeta {
                    name: Some(format!("floor-create-{key}")),
                    ..Default::default()
                },
                ..Default::default()
            };
            api.create(&PostParams::default(), &lease)
                .await
                .expect("floor create");
        }
        Kind::ZooKeeper => {}
    }
}

async fn raw_throughput(env: &Arc<Env>, kind: Kind, writers: usize, secs: f64) -> f64 {
    let mut chains = Vec::new();
    for w in 0..writers {
        let mut chain = RawChain::new(env, kind, &support::unique(&format!("tp{w}"))).await;
        chain.write(1).await;
        chains.push(chain);
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let began = Instant::now();
    let tasks: Vec<_> = chains
        .into_iter()
        .map(|mut chain| {
            let (stop, count) = (stop.clone(), count.clone());
            tokio::spawn(async move {
                let mut i = 2;
                while !stop.load(Ordering::Relaxed) {
                    chain.write(i).await;
                    i += 1;
                    count.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let done = count.load(Ordering::Relaxed) as f64 / began.elapsed().as_secs_f64();
    for t in tasks {
        t.await.unwrap();
    }
    done
}

const WRITERS: usize = 8;

async fn part_floor(env: Arc<Env>, opts: Opts, report: Shared) {
    let n = opts.n(200);
    let secs = if opts.quick { 3.0 } else { 6.0 };
    for kind in KINDS {
        let mut chain = RawChain::new(&env, kind, &support::unique("lat")).await;
        for i in 0..5 {
            chain.write(i).await; // warm connections
        }
        let mut samples = Vec::with_capacity(n);
        for i in 0..n as u64 {
            let t = Instant::now();
            chain.write(10 + i).await;
            samples.push(ms(t.elapsed()));
        }
        let mut creates = Vec::new();
        if kind != Kind::ZooKeeper {
            for _ in 0..n.min(50) {
                let key = support::unique("c");
                let t = Instant::now();
                raw_create(&env, kind, &key).await;
                creates.push(ms(t.elapsed()));
            }
        }
        let ops = raw_throughput(&env, kind, WRITERS, secs).await;
        let floor = Floor {
            n,
            p50: pct(&samples, 0.5),
            p99: pct(&samples, 0.99),
            create_p50: pct(&creates, 0.5),
            ops_per_s: ops,
            writers: WRITERS,
        };
        eprintln!("[bench] floor {}: {floor:?}", kind.name());
        let mut r = report.lock().unwrap();
        r.plots
            .push((kind, format!("floor: {}", kind.floor_op()), samples));
        if kind == Kind::S3 {
            r.moto_capacity = Some(ops);
        }
        r.floors.insert(kind, floor);
    }
}

// ---------------------------------------------------------------------------------
// Part 2: engine

fn req(holder: &str) -> AcquireRequest {
    AcquireRequest::new(holder, Duration::from_secs(30))
}

async fn acquire_now(b: &dyn LockBackend, holder: &str) -> lockwarden::lock::Lease {
    for _ in 0..50 {
        match b.try_acquire(&req(holder)).await {
            Ok(Attempt::Acquired(l)) => return l,
            Ok(Attempt::Busy { holder, .. }) => {
                panic!("{} busy, held by {}", b.url(), holder.holder)
            }
            Err(e) if e.is_transient() => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("{}: {e}", b.url()),
        }
    }
    panic!("{}: kept failing", b.url())
}

async fn part_engine(env: Arc<Env>, opts: Opts, report: Shared) {
    let n = opts.n(100);
    let secs = if opts.quick { 3.0 } else { 6.0 };
    for kind in KINDS {
        let key = support::unique("eng");
        // Latency: each round a new contender (cold: it knows nothing of the key),
        // then the same contender again (warm: its release left the version cached).
        let (mut cold, mut warm, mut renew, mut release) = (vec![], vec![], vec![], vec![]);
        for i in 0..n + 3 {
            let b = env.engine(kind, &key);
            let t = Instant::now();
            let mut lease = acquire_now(b.as_ref(), "bench/engine").await;
            let c = ms(t.elapsed());
            let t = Instant::now();
            b.renew(&mut lease).await.expect("renew");
            let r1 = ms(t.elapsed());
            let t = Instant::now();
            b.release(&lease).await.expect("release");
            let l1 = ms(t.elapsed());
            let t = Instant::now();
            let mut lease = acquire_now(b.as_ref(), "bench/engine").await;
            let w = ms(t.elapsed());
            let t = Instant::now();
            b.renew(&mut lease).await.expect("renew");
            let r2 = ms(t.elapsed());
            let t = Instant::now();
            b.release(&lease).await.expect("release");
            let l2 = ms(t.elapsed());
            if i >= 3 {
                cold.push(c);
                warm.push(w);
                renew.extend([r1, r2]);
                release.extend([l1, l2]);
            }
        }
        // Round trips: a separate pass with a counter read around every operation
        // (reading kube-apiserver's /metrics is too slow to do inside the timed loop).
        let rounds = 5;
        let (mut rt_cold, mut rt_warm, mut rt_renew, mut rt_release) = (0.0, 0.0, 0.0, 0.0);
        for _ in 0..rounds {
            let b = env.engine(kind, &key);
            let c0 = env.round_trips(kind).await;
            let mut lease = acquire_now(b.as_ref(), "bench/engine").await;
            let c1 = env.round_trips(kind).await;
            b.renew(&mut lease).await.expect("renew");
            let c2 = env.round_trips(kind).await;
            b.release(&lease).await.expect("release");
            let c3 = env.round_trips(kind).await;
            let lease = acquire_now(b.as_ref(), "bench/engine").await;
            let c4 = env.round_trips(kind).await;
            b.release(&lease).await.expect("release");
            rt_cold += c1 - c0;
            rt_renew += c2 - c1;
            rt_release += c3 - c2;
            rt_warm += c4 - c3;
        }
        let per = |x: f64| Some(x / rounds as f64);
        add_row(
            &report,
            "engine",
            kind,
            "acquire, cold",
            &cold,
            per(rt_cold),
        );
        add_row(
            &report,
            "engine",
            kind,
            "acquire, warm",
            &warm,
            per(rt_warm),
        );
        add_row(&report, "engine", kind, "renew", &renew, per(rt_renew));
        add_row(
            &report,
            "engine",
            kind,
            "release",
            &release,
            per(rt_release),
        );

        // Throughput: WRITERS tasks, each cycling acquire+release over its own keys.
        let keys_per_writer = 16;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cycles = Arc::new(AtomicU64::new(0));
        let ready = Arc::new(tokio::sync::Barrier::new(WRITERS + 1));
        let mut tasks = Vec::new();
        for w in 0..WRITERS {
            let (env, stop, cycles, ready) =
                (env.clone(), stop.clone(), cycles.clone(), ready.clone());
            tasks.push(tokio::spawn(async move {
                let prefix = support::unique(&format!("tp{w}"));
                let backends: Vec<_> = (0..keys_per_writer)
                    .map(|k| env.engine(kind, &format!("{prefix}-{k}")))
                    .collect();
                // One untimed round so every key exists and every contender is warm.
                for b in &backends {
                    let l = acquire_now(b.as_ref(), "bench/tp").await;
                    b.release(&l).await.expect("release");
                }
                ready.wait().await;
                'outer: loop {
                    for b in &backends {
                        if stop.load(Ordering::Relaxed) {
                            break 'outer;
                        }
                        let l = acquire_now(b.as_ref(), "bench/tp").await;
                        b.release(&l).await.expect("release");
                        cycles.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        ready.wait().await;
        let began = Instant::now();
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        stop.store(true, Ordering::Relaxed);
        let counted = cycles.load(Ordering::Relaxed);
        let elapsed_at_stop = began.elapsed().as_secs_f64();
        for t in tasks {
            t.await.unwrap();
        }
        let engine_ops = 2.0 * counted as f64 / elapsed_at_stop;
        let raw = report
            .lock()
            .unwrap()
            .floors
            .get(&kind)
            .map(|f| f.ops_per_s);
        let raw = match raw {
            Some(r) => r,
            None => raw_throughput(&env, kind, WRITERS, secs).await,
        };
        eprintln!(
            "[bench] engine {} throughput: {engine_ops:.0} writes/s (acquire+release) vs raw {raw:.0}/s",
            kind.name()
        );
        report
            .lock()
            .unwrap()
            .throughput
            .push((kind, engine_ops, raw, WRITERS));
    }
}

// ---------------------------------------------------------------------------------
// Part 3: operator

/// What a watch over every DistributedLock saw, by `namespace/name`.
#[derive(Default)]
struct Seen {
    acquired: HashMap<String, Instant>,
    waiting: HashMap<String, Instant>,
    deleted: HashMap<String, Instant>,
}

struct Watch {
    seen: Arc<Mutex<Seen>>,
    changed: Arc<Notify>,
}

impl Watch {
    fn start(client: Client) -> Watch {
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

    async fn wait(&self, what: &str, f: impl Fn(&Seen) -> Option<Instant>) -> Instant {
        let deadline = Instant::now() + WAIT;
        loop {
            let notified = self.changed.notified();
            if let Some(t) = f(&self.seen.lock().unwrap()) {
                return t;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
        }
    }

    async fn acquired(&self, id: &str) -> Instant {
        self.wait(&format!("{id} Acquired"), |s| s.acquired.get(id).copied())
            .await
    }
    async fn waiting(&self, id: &str) -> Instant {
        self.wait(&format!("{id} Waiting"), |s| s.waiting.get(id).copied())
            .await
    }
    async fn deleted(&self, id: &str) -> Instant {
        self.wait(&format!("{id} deleted"), |s| s.deleted.get(id).copied())
            .await
    }
}

struct OperatorEnv {
    env: Arc<Env>,
    secret: std::collections::BTreeMap<String, lockwarden::api::SecretRef>,
}

async fn aws_secret(client: &Client, ns: &str) -> lockwarden::api::SecretRef {
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "aws"},
        "stringData": {
            "AWS_ACCESS_KEY_ID": support::moto::ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": support::moto::SECRET_ACCESS_KEY,
        },
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    lockwarden::api::SecretRef { name: "aws".into() }
}

impl OperatorEnv {
    async fn namespace(&mut self, prefix: &str) -> String {
        let ns = self.env.plane.namespace(&self.env.client, prefix).await;
        let secret = aws_secret(&self.env.client, &ns).await;
        self.secret.insert(ns.clone(), secret);
        ns
    }

    /// A DistributedLock on `key` of `kind` in `ns`.
    fn lock(
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
                    endpoint: Some(env.moto.endpoint()),
                    force_path_style: Some(true),
                    credentials_secret_ref: secret,
                }),
                ..Default::default()
            },
            Kind::DynamoDb => BackendSpec {
                dynamodb: Some(lockwarden::api::DynamoDbBackend {
                    table: env.table.clone(),
                    key: format!("op-{key}"),
                    region: Some(support::moto::REGION.into()),
                    endpoint: Some(env.moto.endpoint()),
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
        let mut lock = DistributedLock::new(
            name,
            DistributedLockSpec {
                backend,
                lease_duration: lease.into(),
                renew_interval: renew.into(),
                ..Default::default()
            },
        );
        lock.metadata.namespace = Some(ns.to_string());
        lock
    }
}

fn locks_api(client: &Client, ns: &str) -> Api<DistributedLock> {
    Api::namespaced(client.clone(), ns)
}

fn start_controller_process(
    kubeconfig: &std::path::Path,
    cluster: &str,
    ns: &str,
    metrics_port: u16,
) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_lockwarden"))
        .args([
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
        })
        .spawn()
        .expect("start lockwarden controller")
}

async fn part_operator(env: Arc<Env>, opts: Opts, report: Shared) {
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
    tokio::spawn(controller::run(env.client.clone(), config));
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
            handoffs.push(ms(acquired - t));
            stages.push((ms(gone.saturating_duration_since(t)), ms(acquired - t)));
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

// ---------------------------------------------------------------------------------
// Part 4: scale

fn proc_cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may contain spaces): utime is field 14.
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let utime: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let stime: f64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    (utime + stime) / ticks
}

fn proc_status_kb(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0)
}

/// `--scale-child KIND N INTERVAL_S HOLD_S ENDPOINT BUCKET`: holds N locks in this
/// process the way the controller's holder tasks do (a HeldLock per lock plus a monitor
/// of its state), then reports one JSON line.
fn scale_child(args: &[String]) {
    let kind = args[0].as_str();
    let n: usize = args[1].parse().unwrap();
    let interval = Duration::from_secs_f64(args[2].parse().unwrap());
    let hold = Duration::from_secs_f64(args[3].parse().unwrap());
    let endpoint = args[4].clone();
    let bucket = args[5].clone();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let pid = std::process::id();
    let rss_start = proc_status_kb(pid, "VmRSS:");
    let out = rt.block_on(async move {
        let attempts = AttemptCounter::default();
        let s3 = if kind == "s3" {
            let sdk = support::moto::sdk_config_for(&endpoint).await;
            Some(aws_sdk_s3::Client::from_conf(
                aws_sdk_s3::config::Builder::from(&sdk)
                    .force_path_style(true)
                    .interceptor(attempts.clone())
                    .build(),
            ))
        } else {
            None
        };
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
            let backend: Arc<dyn LockBackend> = match &s3 {
                Some(c) => Arc::new(CasLock::new(S3Store::new(
                    c.clone(),
                    bucket.clone(),
                    format!("{prefix}/{i}"),
                ))),
                // The ZooKeeper lease is the session timeout: 30 s, so that a 10 s
                // renew interval is below half of it (as for the other stores).
                None => Arc::new(
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
                let held = HeldLock::hold(backend, lease, policy);
                let mut rx = held.watch();
                // As controller::holders does: watch for transitions away from Held.
                tokio::spawn(async move {
                    let mut was_held = true;
                    while rx.changed().await.is_ok() {
                        let held_now = matches!(*rx.borrow_and_update(), HolderState::Held { .. });
                        if was_held && !held_now {
                            missed.fetch_add(1, Ordering::Relaxed);
                        }
                        was_held = held_now;
                    }
                });
                held
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
            if kind == "s3" {
                attempts.0.load(Ordering::Relaxed) as f64
            } else {
                zk_mntr_packets(zk_port)
            }
        };
        let c0 = count(&attempts);
        let cpu0 = proc_cpu_seconds(pid);
        let t0 = Instant::now();
        let perf = perf_record(pid, hold.as_secs_f64());
        tokio::time::sleep(hold).await;
        if let Some(mut perf) = perf {
            let _ = tokio::task::spawn_blocking(move || perf.wait()).await;
        }
        let window = t0.elapsed().as_secs_f64();
        let cpu1 = proc_cpu_seconds(pid);
        let c1 = count(&attempts);
        let still_held = held.iter().filter(|h| h.is_held()).count();
        json!({
            "acquire_all_s": acquire_all,
            "window_s": window,
            "cpu_s": cpu1 - cpu0,
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

fn zk_mntr_packets(port: u16) -> f64 {
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

fn run_scale_child(
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

async fn part_scale(env: Arc<Env>, opts: Opts, report: Shared) {
    let hold: f64 = if opts.quick { 12.0 } else { 25.0 };
    let capacity = report.lock().unwrap().moto_capacity.unwrap_or(0.0);
    let capacity = if capacity > 0.0 {
        capacity
    } else {
        raw_throughput(&env, Kind::S3, WRITERS, 3.0).await
    };
    report.lock().unwrap().moto_capacity = Some(capacity);
    let sizes: &[usize] = if opts.quick { &[1000] } else { &[1000, 10_000] };
    let mut plans: Vec<(&str, usize, f64, String)> = Vec::new();
    for &n in sizes {
        plans.push(("zookeeper", n, 10.0, env.zk.connect_string()));
    }
    for &n in sizes {
        // Renewals must stay under about half the server's measured capacity, and
        // acquiring all (2 requests each) must fit the time budget.
        let interval = (n as f64 / (0.5 * capacity)).max(10.0).ceil();
        let acquire_estimate = 2.0 * n as f64 / capacity;
        if acquire_estimate + hold.max(interval * 1.2) > 300.0 {
            note(
                &report,
                format!(
                    "scale s3 {n}: not run — moto-atomic measured {capacity:.0} conditional writes/s in this run, so acquiring {n} locks (2 requests each) takes ~{acquire_estimate:.0} s and renewing them needs an interval ≥ {interval:.0} s; beyond this run's time budget"
                ),
            );
            continue;
        }
        plans.push(("s3", n, interval, env.moto.endpoint()));
    }
    // LOCKWARDEN_BENCH_SCALE=s3:200 runs only that (debugging aid).
    if let Ok(only) = std::env::var("LOCKWARDEN_BENCH_SCALE") {
        let (k, n) = only.split_once(':').unwrap_or((only.as_str(), "1000"));
        let n: usize = n.parse().unwrap_or(1000);
        let endpoint = if k == "s3" {
            env.moto.endpoint()
        } else {
            env.zk.connect_string()
        };
        let interval = if k == "s3" {
            (n as f64 / (0.5 * capacity)).max(10.0).ceil()
        } else {
            10.0
        };
        plans = vec![(
            if k == "s3" { "s3" } else { "zookeeper" },
            n,
            interval,
            endpoint,
        )];
        if k == "operator" {
            plans.clear();
            match scale_operator(&env, n, hold).await {
                Ok(row) => report.lock().unwrap().scale.push(row),
                Err(e) => note(
                    &report,
                    format!("scale operator kubernetes {n}: failed: {e}"),
                ),
            }
        }
    }
    for (kind, n, interval, endpoint) in plans {
        // Hold for at least 1.2 renewal intervals so every lock renews at least once.
        let window = hold.max(interval * 1.2);
        let (ep, bucket) = (endpoint.clone(), env.bucket.clone());
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
                    path: "engine (HeldLock + monitor per lock, one process)".into(),
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
                        "still held at the end: {}; CPU {:.1} % of a core over the window",
                        v["still_held"],
                        100.0 * f("cpu_s") / f("window_s")
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
    // 1,000 Lease locks through the `lockwarden controller` binary.
    let n = if opts.quick { 300 } else { 1000 };
    match scale_operator(&env, n, hold).await {
        Ok(row) => report.lock().unwrap().scale.push(row),
        Err(e) => note(
            &report,
            format!("scale operator kubernetes {n}: failed: {e}"),
        ),
    }
}

async fn scale_operator(env: &Arc<Env>, n: usize, hold: f64) -> Result<ScaleRow, String> {
    let client = env.client.clone();
    let ns = env.plane.namespace(&client, "bench-scale").await;
    let metrics_port = support::free_port();
    let mut child = KillOnDrop(start_controller_process(
        env.plane.kubeconfig_path(),
        "scale",
        &ns,
        metrics_port,
    ));
    let pid = child.0.id();
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
                    backend: BackendSpec {
                        kubernetes: Some(lockwarden::api::KubernetesBackend {
                            lease_name: format!("s-{i}"),
                            namespace: None,
                        }),
                        ..Default::default()
                    },
                    lease_duration: "30s".into(),
                    renew_interval: "10s".into(),
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
                "only {} of {n} acquired after 600 s",
                acquired.load(Ordering::Relaxed)
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let acquire_all = began.elapsed().as_secs_f64();
    let rss_held = proc_status_kb(pid, "VmRSS:");
    // Let the acquisition burst settle before measuring the steady state.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let m0 = apiserver_counts(&client).await;
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
    let metrics = reqwest_metrics(metrics_port).await;
    child.kill();
    watch_task.abort();
    let renewals = api_sum(&m1, "leases", true) - api_sum(&m0, "leases", true);
    let mut writes: Vec<_> = m1
        .iter()
        .map(|(k, v)| (k.clone(), v - m0.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect();
    writes.sort_by(|a, b| b.1.total_cmp(&a.1));
    eprintln!("[bench] apiserver requests during the window: {writes:?}");
    let status_writes =
        api_sum(&m1, "distributedlocks", true) - api_sum(&m0, "distributedlocks", true);
    let failures = metrics
        .lines()
        .find_map(|l| l.strip_prefix("lockwarden_renew_failures_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    let renewals_per_s = renewals / window;
    Ok(ScaleRow {
        kind: "kubernetes".into(),
        path: "operator (`lockwarden controller` process)".into(),
        locks: n,
        interval_s: 10.0,
        hold_s: window,
        acquire_all_s: acquire_all,
        renewals,
        renewals_expected: n as f64 * window / 10.0,
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
            "acquire-all includes creating the objects ({n} creates, 8 in flight); CPU {:.1} % of a core over the window",
            100.0 * (cpu1 - cpu0) / window
        ),
    })
}

/// With LOCKWARDEN_BENCH_PERF=FILE: samples process `pid` with `perf record -g` for
/// `secs` (the steady-state window), for the profile in docs/benchmarks.md.
fn perf_record(pid: u32, secs: f64) -> Option<std::process::Child> {
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
struct KillOnDrop(std::process::Child);

impl KillOnDrop {
    fn kill(&mut self) {
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
async fn reqwest_metrics(port: u16) -> String {
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

// ---------------------------------------------------------------------------------
// Output: markdown, SVG, JSON

fn fmt(v: f64) -> String {
    if v.is_nan() {
        "–".into()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn met(ok: bool) -> &'static str {
    if ok { "**met**" } else { "**not met**" }
}

fn render_markdown(r: &Report, opts: &Opts, elapsed: Duration, build: &str) -> String {
    let mut md = String::new();
    let when = humantime::format_rfc3339_seconds(SystemTime::now());
    let _ = writeln!(
        md,
        "Run {when}, `{}`, {build} build, {:.1} min, on this machine ({} CPUs). Every figure is from this one run; \
         the floor is the bare conditional write with the raw SDK/client on the same server, measured first.\n",
        if opts.quick {
            "scripts/bench --quick"
        } else {
            "scripts/bench"
        },
        elapsed.as_secs_f64() / 60.0,
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    md.push_str("### Floor (part 1)\n\n| backend | raw conditional write | n | p50 ms | p99 ms | create-if-absent p50 ms | throughput, writes/s |\n|---|---|---|---|---|---|---|\n");
    for (kind, f) in &r.floors {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {:.0} ({} writers) |",
            kind.name(),
            kind.floor_op(),
            f.n,
            fmt(f.p50),
            fmt(f.p99),
            fmt(f.create_p50),
            f.ops_per_s,
            f.writers
        );
    }
    for (part, title) in [
        ("engine", "Engine (part 2)"),
        ("operator", "Operator end to end (part 3)"),
    ] {
        let _ = writeln!(
            md,
            "\n### {title}\n\n| backend | measurement | n | p50 ms | p99 ms | p50 / floor p50 | round trips per op (counted) | floor p50 ms (n) |\n|---|---|---|---|---|---|---|---|"
        );
        for row in r.rows.iter().filter(|x| x.part == part) {
            let floor = r.floors.get(&row.kind);
            let (fp, fnn) = floor.map_or((f64::NAN, 0), |f| (f.p50, f.n));
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {}× | {} | {} ({}) |",
                row.kind.name(),
                row.what,
                row.n,
                fmt(row.p50),
                fmt(row.p99),
                fmt(row.p50 / fp),
                row.round_trips.map_or("–".into(), fmt),
                fmt(fp),
                fnn
            );
        }
        if part == "engine" && !r.throughput.is_empty() {
            md.push_str("\nThroughput: acquire+release cycles on 16 keys per writer, 8 writers, counted as conditional writes/s (2 per cycle on S3/DynamoDB/Lease; ZooKeeper's cycle is create + list + delete), against the floor's raw conditional writes/s with the same number of writers:\n\n| backend | engine writes/s | raw writes/s | engine / raw |\n|---|---|---|---|\n");
            for (kind, e, raw, _) in &r.throughput {
                let _ = writeln!(
                    md,
                    "| {} | {:.0} | {:.0} | {:.0} % |",
                    kind.name(),
                    e,
                    raw,
                    100.0 * e / raw
                );
            }
        }
    }
    if !r.scale.is_empty() {
        md.push_str("\n### Scale (part 4)\n\n| backend | path | locks | renew interval s | window s | acquire all s | renewals in window (expected) | missed | CPU % of a core per 1,000 renewals/s | peak RSS MB | RSS per 1,000 locks MB | status writes per renewal |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for s in &r.scale {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.0} | {:.0} | {} | {:.0} ({:.0}) | {} | {} | {} | {} | {} |",
                s.kind,
                s.path,
                s.locks,
                s.interval_s,
                s.hold_s,
                fmt(s.acquire_all_s),
                s.renewals,
                s.renewals_expected,
                fmt(s.missed),
                fmt(s.cpu_per_1k_renewals_per_s),
                fmt(s.peak_rss_mb),
                fmt(s.rss_per_1k_mb),
                s.status_writes_per_renewal.map_or("–".into(), fmt)
            );
        }
        for s in &r.scale {
            let _ = writeln!(md, "\n- {} {} × {}: {}", s.kind, s.path, s.locks, s.note);
        }
        if let Some(c) = r.moto_capacity {
            let _ = writeln!(
                md,
                "- moto-atomic capacity measured in this run: {c:.0} conditional PUTs/s (8 writers); the S3 renew interval is lengthened so renewals stay under half of it."
            );
        }
        let growth = |kind: &str| {
            let a = r
                .scale
                .iter()
                .find(|s| s.kind == kind && s.locks == 1000 && s.path.starts_with("engine"));
            let b = r
                .scale
                .iter()
                .find(|s| s.kind == kind && s.locks == 10_000 && s.path.starts_with("engine"));
            a.zip(b)
        };
        for kind in ["zookeeper", "s3"] {
            if let Some((a, b)) = growth(kind) {
                let _ = writeln!(
                    md,
                    "- {kind} growth 1k → 10k: acquire-all {}×, CPU per 1,000 renewals/s {}×, RSS per 1,000 locks {}×, missed {} → {}",
                    fmt(b.acquire_all_s / a.acquire_all_s),
                    fmt(b.cpu_per_1k_renewals_per_s / a.cpu_per_1k_renewals_per_s),
                    fmt(b.rss_per_1k_mb / a.rss_per_1k_mb),
                    a.missed,
                    b.missed
                );
            }
        }
    }
    // Targets.
    md.push_str("\n### Targets\n\n| target | measured | |\n|---|---|---|\n");
    for row in r.rows.iter().filter(|x| x.part == "engine") {
        let Some(rt) = row.round_trips else { continue };
        let (limit, label) = match row.what.as_str() {
            "renew" | "release" => (
                1.0,
                format!("{} {}: 1 round trip", row.kind.name(), row.what),
            ),
            "acquire, cold" => (
                2.0,
                format!("{} cold acquire: ≤ 2 round trips", row.kind.name()),
            ),
            _ => continue,
        };
        let _ = writeln!(
            md,
            "| {label} | {} | {} |",
            fmt(rt),
            met(rt <= limit + 0.05)
        );
    }
    for (kind, e, raw, _) in &r.throughput {
        let _ = writeln!(
            md,
            "| {} acquire+release throughput ≥ 90 % of raw | {:.0} % | {} |",
            kind.name(),
            100.0 * e / raw,
            met(e / raw >= 0.9)
        );
    }
    for row in r.rows.iter().filter(|x| x.what.starts_with("same-cluster")) {
        let _ = writeln!(
            md,
            "| {} same-cluster hand-off p50 ≤ 30 ms | {} ms | {} |",
            row.kind.name(),
            fmt(row.p50),
            met(row.p50 <= 30.0)
        );
    }
    for (kind, p50, max, bound, n) in &r.takeover {
        let _ = writeln!(
            md,
            "| {} cross-cluster takeover ≤ lease + grace + poll (2 s) + 1 s = {:.2} s | max {:.2} s, p50 {:.2} s (n={n}) | {} |",
            kind.name(),
            bound / 1000.0,
            max / 1000.0,
            p50 / 1000.0,
            met(*max <= *bound)
        );
    }
    for s in &r.scale {
        let _ = writeln!(
            md,
            "| {} {} locks ({}): 0 renewals missed | {} | {} |",
            s.kind,
            s.locks,
            s.path,
            fmt(s.missed),
            met(s.missed == 0.0)
        );
        if let Some(w) = s.status_writes_per_renewal {
            let _ = writeln!(
                md,
                "| {} {} locks: 0 DistributedLock writes per renewal | {} | {} |",
                s.kind,
                s.locks,
                fmt(w),
                met(w == 0.0)
            );
        }
    }
    if !r.notes.is_empty() {
        md.push_str("\n### Notes from this run\n\n");
        for n in &r.notes {
            let _ = writeln!(md, "- {n}");
        }
    }
    md.push_str("\n![Latency distributions](benchmarks.svg)\n");
    md
}

const COLORS: [&str; 10] = [
    "#000000", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    "#17becf", "#bcbd22",
];

/// Latency CDFs, one panel per backend, log-scale time axis.
fn render_svg(r: &Report) -> String {
    let (pw, ph) = (560.0, 330.0);
    let (ml, mr, mt, mb) = (50.0, 10.0, 28.0, 120.0);
    let all: Vec<f64> = r
        .plots
        .iter()
        .flat_map(|p| p.2.iter().copied())
        .filter(|v| *v > 0.0)
        .collect();
    let lo = all
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .max(0.05)
        .log10()
        .floor();
    let hi = all
        .iter()
        .copied()
        .fold(0.0, f64::max)
        .max(1.0)
        .log10()
        .ceil();
    let mut svg = String::new();
    let (w, h) = (2.0 * pw, 2.0 * ph);
    let _ = writeln!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>"
    );
    for (i, kind) in KINDS.iter().enumerate() {
        let (ox, oy) = ((i % 2) as f64 * pw, (i / 2) as f64 * ph);
        let (x0, y0, x1, y1) = (ox + ml, oy + mt, ox + pw - mr, oy + ph - mb);
        let xs = |v: f64| x0 + (v.max(1e-3).log10() - lo) / (hi - lo) * (x1 - x0);
        let ys = |q: f64| y1 - q * (y1 - y0);
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" font-size=\"13\" font-weight=\"bold\">{} — latency CDF (ms, log scale)</text>",
            x0,
            oy + 16.0,
            kind.name()
        );
        let _ = writeln!(
            svg,
            "<rect x=\"{x0}\" y=\"{y0}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>",
            x1 - x0,
            y1 - y0
        );
        let mut d = lo;
        while d <= hi {
            let x = xs(10f64.powf(d));
            let _ = writeln!(
                svg,
                "<line x1=\"{x}\" y1=\"{y0}\" x2=\"{x}\" y2=\"{y1}\" stroke=\"#ddd\"/><text x=\"{x}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                y1 + 12.0,
                10f64.powf(d)
            );
            d += 1.0;
        }
        for q in [0.5, 0.99] {
            let y = ys(q);
            let _ = writeln!(
                svg,
                "<line x1=\"{x0}\" y1=\"{y}\" x2=\"{x1}\" y2=\"{y}\" stroke=\"#ddd\" stroke-dasharray=\"3,3\"/><text x=\"{}\" y=\"{}\" text-anchor=\"end\">p{}</text>",
                x0 - 3.0,
                y + 4.0,
                (q * 100.0) as u32
            );
        }
        let series: Vec<_> = r
            .plots
            .iter()
            .filter(|p| p.0 == *kind && !p.2.is_empty())
            .collect();
        for (j, (_, label, samples)) in series.iter().enumerate() {
            let mut v = samples.clone();
            v.sort_by(|a, b| a.total_cmp(b));
            let color = COLORS[j % COLORS.len()];
            let mut path = String::new();
            for (k, s) in v.iter().enumerate() {
                let (x, y) = (xs(*s), ys((k + 1) as f64 / v.len() as f64));
                let _ = write!(path, "{}{x:.1},{y:.1} ", if k == 0 { "M" } else { "L" });
            }
            let _ = writeln!(
                svg,
                "<path d=\"{path}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\"/>"
            );
            let ly = y1 + 24.0 + j as f64 * 12.0;
            let _ = writeln!(
                svg,
                "<line x1=\"{x0}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{color}\" stroke-width=\"2\"/><text x=\"{}\" y=\"{ly}\">{} (n={}, p50 {} ms)</text>",
                ly - 4.0,
                x0 + 18.0,
                ly - 4.0,
                x0 + 22.0,
                label
                    .replace('→', "-&gt;")
                    .replace('&', "&amp;")
                    .replace("&amp;gt;", "&gt;"),
                v.len(),
                fmt(pct(&v, 0.5))
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}

fn results_json(r: &Report) -> Value {
    json!({
        "floors": r.floors.iter().map(|(k, f)| json!({"backend": k.name(), "n": f.n, "p50_ms": f.p50, "p99_ms": f.p99, "ops_per_s": f.ops_per_s})).collect::<Vec<_>>(),
        "rows": r.rows.iter().map(|x| json!({"part": x.part, "backend": x.kind.name(), "what": x.what, "n": x.n, "p50_ms": x.p50, "p99_ms": x.p99, "round_trips": x.round_trips})).collect::<Vec<_>>(),
        "throughput": r.throughput.iter().map(|(k, e, raw, w)| json!({"backend": k.name(), "engine_writes_per_s": e, "raw_writes_per_s": raw, "writers": w})).collect::<Vec<_>>(),
        "scale": r.scale.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>(),
        "notes": r.notes,
    })
}

const BEGIN: &str = "<!-- BEGIN GENERATED by scripts/bench: do not edit by hand -->";
const END: &str = "<!-- END GENERATED -->";

fn write_outputs(r: &Report, opts: &Opts, elapsed: Duration) {
    let build = if cfg!(debug_assertions) {
        "**debug** (unoptimized: CPU figures overstate)"
    } else {
        "optimized (`cargo bench` profile)"
    };
    let root = support::repo_root();
    let out_dir = std::env::var_os("LOCKWARDEN_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("docs"));
    std::fs::create_dir_all(&out_dir).unwrap();
    let generated = render_markdown(r, opts, elapsed, build);
    let doc_path = out_dir.join("benchmarks.md");
    let existing = std::fs::read_to_string(&doc_path).unwrap_or_default();
    let doc = match (existing.find(BEGIN), existing.find(END)) {
        (Some(b), Some(e)) if b < e => {
            format!("{}{BEGIN}\n{generated}{}", &existing[..b], &existing[e..])
        }
        _ => format!("# Benchmarks\n\n{BEGIN}\n{generated}{END}\n"),
    };
    std::fs::write(&doc_path, doc).unwrap();
    std::fs::write(out_dir.join("benchmarks.svg"), render_svg(r)).unwrap();
    let json_path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-results.json");
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(&results_json(r)).unwrap(),
    )
    .unwrap();
    eprintln!(
        "[bench] wrote {}, benchmarks.svg and {}",
        doc_path.display(),
        json_path.display()
    );
}

// ---------------------------------------------------------------------------------

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--scale-child") {
        scale_child(&args[i + 1..]);
        return;
    }
    let mut opts = Opts {
        quick: false,
        only: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => opts.quick = true,
            "--only" => opts.only = it.next().cloned(),
            "--bench" => {} // passed by `cargo bench`
            other if other.starts_with("--only=") => {
                opts.only = Some(other["--only=".len()..].to_string())
            }
            other => eprintln!("[bench] ignoring argument {other:?}"),
        }
    }
    let began = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let report: Shared = Arc::new(Mutex::new(Report::default()));
    rt.block_on(async {
        let t = Instant::now();
        let env = Arc::new(Env::start().await);
        eprintln!(
            "[bench] servers ready after {:.1} s",
            t.elapsed().as_secs_f64()
        );
        // Part 1 always runs: every other figure is given against it.
        run_part(
            "floor",
            part_floor(env.clone(), opts.clone(), report.clone()),
            &report,
        )
        .await;
        if opts.runs("engine") {
            run_part(
                "engine",
                part_engine(env.clone(), opts.clone(), report.clone()),
                &report,
            )
            .await;
        }
        if opts.runs("operator") {
            run_part(
                "operator",
                part_operator(env.clone(), opts.clone(), report.clone()),
                &report,
            )
            .await;
        }
        if opts.runs("scale") {
            run_part(
                "scale",
                part_scale(env.clone(), opts.clone(), report.clone()),
                &report,
            )
            .await;
        }
    });
    let r = report.lock().unwrap();
    write_outputs(&r, &opts, began.elapsed());
    std::process::exit(0);
}

/// Runs one part; a panic in it is reported in the notes, and the run goes on.
async fn run_part(
    name: &str,
    part: impl std::future::Future<Output = ()> + Send + 'static,
    report: &Shared,
) {
    let t = Instant::now();
    eprintln!("[bench] part {name}: start");
    if let Err(e) = tokio::spawn(part).await {
        let msg = e.try_into_panic().ok().and_then(|p| {
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        });
        note(
            report,
            format!(
                "part {name} failed: {}",
                msg.unwrap_or_else(|| "cancelled".into())
            ),
        );
    }
    eprintln!("[bench] part {name}: {:.1} s", t.elapsed().as_secs_f64());
}

//! `cargo bench --bench lockwarden`: lockwarden against real servers, next to the bare
//! backend round trip measured in the same run (issue 7, docs/design.md §8).
//!
//! Parts (`--only floor|engine|operator|scale|permits|cli|node`; `--quick` for fewer
//! samples):
//! 1. floor: one conditional write with the raw SDK/client per backend (latency and
//!    throughput with several writers);
//! 2. engine: cold/warm acquire, renew, release latency per backend, round trips per
//!    operation counted (AWS SDK interceptor, kube-apiserver `/metrics`, ZooKeeper
//!    `mntr`), acquire+release throughput on many keys;
//! 3. operator: `DistributedLock` created → `Acquired=True` seen by a watch, same-cluster
//!    hand-off, takeover after the holder's controller process is SIGKILLed;
//! 4. scale: one process holding 100 … 10,000 locks (engine, as the controller's
//!    holder tasks do) and 1,000 through the `lockwarden controller` binary;
//! 5. permits: one permit's acquire, renew and release on a key 1, 10 or 100 holders
//!    share, with round trips and lost write races counted;
//! 6. cli: one `lock` + `unlock` cycle of the CLI (two processes) against a Go tool
//!    doing the same job: wall, CPU and peak RSS;
//! 7. node: on a real node (`support::node`: kubelet, containerd, kube-scheduler; one
//!    per machine, so this part waits while another binary's node runs), the hand-off
//!    between two gated Jobs on one lock (the first one's container's last line → the
//!    second one's first line) against an ungated Job's create → first line. Runs last:
//!    the node's processes stay up until the benchmark exits.
//!
//! Servers are started the way the tests start them (`tests/support`). Results go to
//! `docs/benchmarks.md` (between the GENERATED markers), `docs/benchmarks.svg` and
//! `target/bench-results.json`. Nothing here asserts a target: targets are reported.

use lockwarden_testsupport as support;

mod api_writes;
mod cli;
mod counting;
mod engine;
mod env;
mod floor;
mod goals;
mod node;
mod operator;
mod output;
mod permits;
mod plots;
mod queue;
mod report;
mod scale;

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
    AcquireRequest, Attempt, CasLock, FenceToken, HeldLock, HolderState, LockBackend, LockRecord,
    RecordStore, RenewPolicy,
};
use serde_json::{Value, json};
use support::kube::{ControlPlane, install_lockwarden_crd};
use support::moto::{new_bucket_at, new_table_at};
use support::stores::{AwsServer, dynamodb_shared, s3_shared};
use support::zookeeper::ZooKeeper;
use tokio::sync::Notify;

use counting::*;
use engine::*;
use env::*;
use floor::*;
use operator::*;
use output::*;
use report::*;
use scale::*;

/// Waits (at most `limit`) until `f` finds what it looks for in `seen`, which a watch
/// updates, waking `changed` on every change; panics naming `what` after `limit`.
pub(crate) async fn wait_for<S, T>(
    seen: &Mutex<S>,
    changed: &Notify,
    limit: Duration,
    what: &str,
    f: impl Fn(&S) -> Option<T>,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        let notified = changed.notified();
        if let Some(t) = f(&seen.lock().unwrap()) {
            return t;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
    }
}

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

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--scale-child") {
        scale_child(&args[i + 1..]);
        return;
    }
    // RUST_LOG: the in-process controllers' logs (say `lockwarden=debug`), to stderr
    // with microsecond timestamps, for tracing where a measured path spends its time.
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
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
        if opts.runs("permits") {
            run_part(
                "permits",
                permits::part_permits(env.clone(), opts.clone(), report.clone()),
                &report,
            )
            .await;
        }
        if opts.runs("queue") {
            run_part(
                "queue",
                queue::part_queue(env.clone(), opts.clone(), report.clone()),
                &report,
            )
            .await;
        }
        if opts.runs("cli") {
            run_part(
                "cli",
                cli::part_cli(env.clone(), opts.clone(), report.clone()),
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
        // Last: the node (kubelet, containerd, …) keeps running until the process exits.
        if opts.runs("node") {
            run_part(
                "node",
                node::part_node(opts.clone(), report.clone()),
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

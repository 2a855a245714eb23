//! `cargo bench --bench stores` (`scripts/bench --stores`): how fast each S3/DynamoDB
//! test server applies conditional writes, all servers in the same run.
//!
//! For every server (moto-atomic for both APIs, versitygw for S3, dynalite for
//! DynamoDB) and for 1 and 8 writers: each writer keeps one key of its own and chains
//! conditional writes on it (S3 `PutObject If-Match` on the ETag the previous write
//! returned; DynamoDB `UpdateItem` with `ConditionExpression v = :old`), for a fixed
//! window; writes/s, per-write p50/p99, errors, and the CPU time the server process
//! and this client process spent per write are printed as a markdown table (the
//! client's share shows when the client, not the server, is the limit).
//! The writes are the floor's of `benches/lockwarden` (same body size, same
//! expressions), so the figures compare with its part 1. No writer contends with
//! another: this is the server's capacity, not the canary (`tests/canary.rs`), which
//! checks that racing writers get exactly one winner.
//!
//! `--quick`: a 3 s window instead of 8 s. Nothing here asserts a figure.

use lockwarden_testsupport as support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_s3::primitives::ByteStream;
use support::dynalite::Dynalite;
use support::moto::Moto;
use support::stores::AwsServer;
use support::versitygw::VersityGw;

const WRITER_COUNTS: [usize; 2] = [1, 8];

#[derive(Clone, Copy, PartialEq)]
enum Api {
    S3,
    DynamoDb,
}

impl Api {
    fn operation(self) -> &'static str {
        match self {
            Api::S3 => "PutObject If-Match",
            Api::DynamoDb => "UpdateItem ConditionExpression",
        }
    }
}

/// A lock-record-sized body (the floor's).
fn body(i: u64) -> String {
    format!(
        "{{\"holder\":\"bench/floor\",\"nonce\":\"{i:032}\",\"revision\":\"{i:016}\",\"fence\":{i},\"leaseMs\":30000,\"state\":\"held\",\"acquiredAt\":\"2026-01-01T00:00:00Z\",\"renewedAt\":\"2026-01-01T00:00:00Z\"}}"
    )
}

/// Where one server keeps the benchmark's keys.
#[derive(Clone)]
enum Target {
    S3 {
        client: aws_sdk_s3::Client,
        bucket: String,
    },
    DynamoDb {
        client: aws_sdk_dynamodb::Client,
        table: String,
    },
}

impl Target {
    async fn new(api: Api, endpoint: &str) -> Target {
        match api {
            Api::S3 => Target::S3 {
                client: support::moto::s3_client_for(endpoint).await,
                bucket: support::moto::new_bucket_at(endpoint, "stores").await,
            },
            Api::DynamoDb => Target::DynamoDb {
                client: support::moto::dynamodb_client_for(endpoint).await,
                table: support::moto::new_table_at(endpoint, "stores", "key").await,
            },
        }
    }
}

/// One writer's chain of conditional writes on its own key: the version it holds.
struct Chain {
    target: Target,
    key: String,
    /// S3: the ETag of the last write; DynamoDB: the number in `v`.
    version: String,
}

impl Chain {
    /// Creates the key unconditionally (the chain's first version).
    async fn start(target: Target) -> Result<Chain, String> {
        let key = support::unique("chain");
        let version = match &target {
            Target::S3 { client, bucket } => client
                .put_object()
                .bucket(bucket)
                .key(&key)
                .body(ByteStream::from(body(0).into_bytes()))
                .send()
                .await
                .map_err(|e| format!("{e:?}"))?
                .e_tag()
                .unwrap_or_default()
                .to_string(),
            Target::DynamoDb { client, table } => {
                client
                    .put_item()
                    .table_name(table)
                    .item("key", AttributeValue::S(key.clone()))
                    .item("v", AttributeValue::N("0".into()))
                    .send()
                    .await
                    .map_err(|e| format!("{e:?}"))?;
                "0".into()
            }
        };
        Ok(Chain {
            target,
            key,
            version,
        })
    }

    /// One conditional write on the version the previous one produced.
    async fn write(&mut self, i: u64) -> Result<(), String> {
        match &self.target {
            Target::S3 { client, bucket } => {
                let out = client
                    .put_object()
                    .bucket(bucket)
                    .key(&self.key)
                    .if_match(&self.version)
                    .content_type("application/json")
                    .body(ByteStream::from(body(i).into_bytes()))
                    .send()
                    .await
                    .map_err(|e| format!("{e:?}"))?;
                self.version = out.e_tag().unwrap_or_default().to_string();
            }
            Target::DynamoDb { client, table } => {
                let next = (self.version.parse::<u64>().unwrap_or(0) + 1).to_string();
                client
                    .update_item()
                    .table_name(table)
                    .key("key", AttributeValue::S(self.key.clone()))
                    .update_expression("SET v = :n, b = :b")
                    .condition_expression("v = :o")
                    .expression_attribute_values(":n", AttributeValue::N(next.clone()))
                    .expression_attribute_values(":o", AttributeValue::N(self.version.clone()))
                    .expression_attribute_values(":b", AttributeValue::S(body(i)))
                    .send()
                    .await
                    .map_err(|e| format!("{e:?}"))?;
                self.version = next;
            }
        }
        Ok(())
    }
}

/// CPU time (user + system) of process `pid` so far, from /proc.
fn cpu_seconds(pid: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    // Fields after the parenthesized command name; utime and stime are the 14th and
    // 15th fields of the line, the 12th and 13th after it.
    let after = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields[11..13]
        .iter()
        .map(|f| f.parse::<f64>().unwrap_or(f64::NAN))
        .sum();
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// One measurement: `writers` chains writing for `window`.
struct Measured {
    writes_per_s: f64,
    /// CPU ms the server / this client spent per write.
    server_cpu_ms: f64,
    client_cpu_ms: f64,
    latencies_ms: Vec<f64>,
    errors: usize,
    first_error: Option<String>,
}

async fn measure(target: &Target, server_pid: &str, writers: usize, window: Duration) -> Measured {
    let mut chains = Vec::with_capacity(writers);
    for _ in 0..writers {
        let mut chain = Chain::start(target.clone()).await.expect("create the key");
        chain.write(1).await.expect("warm-up write"); // connections open
        chains.push(chain);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let cpu_before = (cpu_seconds(server_pid), cpu_seconds("self"));
    let began = Instant::now();
    let tasks: Vec<_> = chains
        .into_iter()
        .map(|mut chain| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let (mut latencies, mut errors, mut first_error) = (Vec::new(), 0, None);
                let mut i = 2;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    match chain.write(i).await {
                        Ok(()) => latencies.push(t.elapsed().as_secs_f64() * 1000.0),
                        Err(e) => {
                            errors += 1;
                            first_error.get_or_insert(e);
                        }
                    }
                    i += 1;
                }
                (latencies, errors, first_error)
            })
        })
        .collect();
    tokio::time::sleep(window).await;
    stop.store(true, Ordering::Relaxed);
    let mut m = Measured {
        writes_per_s: 0.0,
        server_cpu_ms: 0.0,
        client_cpu_ms: 0.0,
        latencies_ms: Vec::new(),
        errors: 0,
        first_error: None,
    };
    for task in tasks {
        let (latencies, errors, first_error) = task.await.expect("writer task");
        m.latencies_ms.extend(latencies);
        m.errors += errors;
        m.first_error = m.first_error.or(first_error);
    }
    // Over the window and the writes still in flight when it closed.
    let writes = m.latencies_ms.len() as f64;
    m.writes_per_s = writes / began.elapsed().as_secs_f64();
    m.server_cpu_ms = (cpu_seconds(server_pid) - cpu_before.0) * 1000.0 / writes;
    m.client_cpu_ms = (cpu_seconds("self") - cpu_before.1) * 1000.0 / writes;
    m
}

/// Nearest-rank percentile.
fn pct(samples: &[f64], q: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut v = samples.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1]
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let window = Duration::from_secs(if quick { 3 } else { 8 });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let began = Instant::now();
    let load_before = load_average();
    let servers: Vec<(&'static dyn AwsServer, Api)> = vec![
        (Moto::shared(), Api::S3),
        (VersityGw::shared(), Api::S3),
        (Moto::shared(), Api::DynamoDb),
        (Dynalite::shared(), Api::DynamoDb),
    ];
    let mut table = String::from(
        "| server | API | conditional write | writers | writes/s | p50 ms | p99 ms | n | errors | server CPU ms/write | client CPU ms/write |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    rt.block_on(async {
        for (server, api) in servers {
            let name = server.name();
            let target = Target::new(api, &server.endpoint()).await;
            let pid = server.pid().expect("the server runs").to_string();
            for writers in WRITER_COUNTS {
                let m = measure(&target, &pid, writers, window).await;
                let api_name = if api == Api::S3 { "S3" } else { "DynamoDB" };
                let row = format!(
                    "| {name} | {api_name} | {} | {writers} | {:.0} | {:.1} | {:.1} | {} | {} | {:.2} | {:.2} |",
                    api.operation(),
                    m.writes_per_s,
                    pct(&m.latencies_ms, 0.5),
                    pct(&m.latencies_ms, 0.99),
                    m.latencies_ms.len(),
                    m.errors,
                    m.server_cpu_ms,
                    m.client_cpu_ms,
                );
                eprintln!("[stores] {row}");
                if let Some(e) = m.first_error {
                    eprintln!("[stores] {name} {api_name} first error: {e}");
                }
                table.push_str(&row);
                table.push('\n');
            }
        }
    });
    println!(
        "Stores: {} s window per row, {} build, load average {load_before} before and {} after, \
         {:.0} s in all\n\n{table}",
        window.as_secs(),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "optimized"
        },
        load_average(),
        began.elapsed().as_secs_f64()
    );
}

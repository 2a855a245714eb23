//! The servers and backends every part runs against, started as the tests start them.

use super::*;

// ---------------------------------------------------------------------------------
// Servers and backends

pub(crate) struct Env {
    /// As `LOCKWARDEN_S3_SERVER` / `LOCKWARDEN_DYNAMODB_SERVER` say (`support::stores`;
    /// moto-atomic when unset; `scripts/bench` sets versitygw and dynalite).
    pub(crate) s3_server: &'static dyn AwsServer,
    pub(crate) dynamodb_server: &'static dyn AwsServer,
    pub(crate) zk: &'static ZooKeeper,
    pub(crate) plane: &'static ControlPlane,
    pub(crate) client: Client,
    pub(crate) s3: aws_sdk_s3::Client,
    /// The S3 stores' PUTs, as lockwarden sends them (`s3::SignedPuts`), counting
    /// their attempts as `aws_attempts` counts the SDK's.
    pub(crate) s3_puts: Option<Arc<lockwarden::backend::s3::SignedPuts>>,
    /// The DynamoDB stores' writes, as lockwarden sends them, counted alike.
    pub(crate) ddb_updates: Option<Arc<lockwarden::backend::dynamodb::SignedUpdates>>,
    pub(crate) ddb: aws_sdk_dynamodb::Client,
    pub(crate) aws_attempts: AttemptCounter,
    pub(crate) bucket: String,
    pub(crate) table: String,
    pub(crate) ns: String,
}

/// With LOCKWARDEN_BENCH_S3_CPU=FRACTION (say `0.3`): the S3 server gets at most that
/// share of one core (a cgroup v1 CPU quota), so a scale run can put the controller in
/// front of a store that cannot keep up, the same way every run (issue 45's "at
/// capacity and overloaded"). The scale part measures the server's capacity after this.
fn limit_s3_server_cpu(server: &dyn AwsServer) {
    let Some(fraction) = std::env::var("LOCKWARDEN_BENCH_S3_CPU")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
    else {
        return;
    };
    let Some(pid) = server.pid() else {
        panic!("LOCKWARDEN_BENCH_S3_CPU: the S3 server's process id is unknown");
    };
    let group = std::path::Path::new("/sys/fs/cgroup/cpu/lockwarden-bench-s3");
    let period_us = 100_000.0;
    let result = std::fs::create_dir_all(group)
        .and_then(|()| std::fs::write(group.join("cpu.cfs_period_us"), "100000"))
        .and_then(|()| {
            std::fs::write(
                group.join("cpu.cfs_quota_us"),
                format!("{:.0}", fraction * period_us),
            )
        })
        .and_then(|()| std::fs::write(group.join("cgroup.procs"), pid.to_string()));
    match result {
        Ok(()) => eprintln!(
            "[bench] {} (pid {pid}) limited to {:.0} % of a core",
            server.name(),
            fraction * 100.0
        ),
        Err(e) => panic!(
            "LOCKWARDEN_BENCH_S3_CPU: cannot put the S3 server in {}: {e}",
            group.display()
        ),
    }
}

impl Env {
    pub(crate) async fn start() -> Env {
        let (s3_server, dynamodb_server, zk, plane) = tokio::task::spawn_blocking(|| {
            let plane = ControlPlane::shared();
            (s3_shared(), dynamodb_shared(), ZooKeeper::shared(), plane)
        })
        .await
        .unwrap();
        let client = plane.client().await;
        install_lockwarden_crd(&client).await;
        let ns = plane.namespace(&client, "bench").await;
        let aws_attempts = AttemptCounter::default();
        let sdk = support::moto::sdk_config_for(&s3_server.endpoint()).await;
        let s3 = aws_sdk_s3::Client::from_conf(
            aws_sdk_s3::config::Builder::from(&sdk)
                .force_path_style(true)
                .interceptor(aws_attempts.clone())
                .build(),
        );
        let s3_puts = lockwarden::backend::s3::signed_puts(
            &support::moto::aws_options_for(&s3_server.endpoint()),
            &Default::default(),
        )
        .await;
        let ddb_updates = lockwarden::backend::dynamodb::signed_updates(
            &support::moto::aws_options_for(&dynamodb_server.endpoint()),
        )
        .await;
        let sdk = support::moto::sdk_config_for(&dynamodb_server.endpoint()).await;
        let ddb = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(&sdk)
                .interceptor(aws_attempts.clone())
                .build(),
        );
        let bucket = new_bucket_at(&s3_server.endpoint(), "bench").await;
        limit_s3_server_cpu(s3_server);
        let table = new_table_at(&dynamodb_server.endpoint(), "bench", "key").await;
        Env {
            s3_server,
            dynamodb_server,
            zk,
            plane,
            client,
            s3,
            s3_puts,
            ddb_updates,
            ddb,
            aws_attempts,
            bucket,
            table,
            ns,
        }
    }

    pub(crate) fn engine(&self, kind: Kind, key: &str) -> Arc<dyn LockBackend> {
        match kind {
            Kind::S3 => Arc::new(CasLock::new(self.s3_store(key))),
            Kind::DynamoDb => Arc::new(CasLock::new(self.dynamo_store(key))),
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

    /// The store layer under [`engine`](Self::engine) alone (no protocol), for the
    /// stores with one record per key; `None` for ZooKeeper.
    pub(crate) fn store(&self, kind: Kind, key: &str) -> Option<Box<dyn RecordStore>> {
        match kind {
            Kind::S3 => Some(Box::new(self.s3_store(key))),
            Kind::DynamoDb => Some(Box::new(self.dynamo_store(key))),
            Kind::Lease => Some(Box::new(LeaseStore::new(
                self.client.clone(),
                &self.ns,
                key,
            ))),
            Kind::ZooKeeper => None,
        }
    }

    /// The S3 store of `key`, with lockwarden's PUTs.
    fn s3_store(&self, key: &str) -> S3Store {
        let store = S3Store::new(self.s3.clone(), self.bucket.clone(), format!("locks/{key}"));
        match &self.s3_puts {
            Some(puts) => store.with_signed_puts(puts.clone()),
            None => store,
        }
    }

    /// The DynamoDB store of `key`, with lockwarden's writes.
    fn dynamo_store(&self, key: &str) -> DynamoStore {
        let store = DynamoStore::new(self.ddb.clone(), TableLayout::new(self.table.clone()), key);
        match &self.ddb_updates {
            Some(updates) => store.with_signed_updates(updates.clone()),
            None => store,
        }
    }

    /// Cumulative count of requests that reached the backend's server (for deltas).
    pub(crate) async fn round_trips(&self, kind: Kind) -> f64 {
        match kind {
            Kind::S3 | Kind::DynamoDb => {
                let puts = self.s3_puts.as_ref().map_or(0, |p| p.attempts());
                let updates = self.ddb_updates.as_ref().map_or(0, |u| u.attempts());
                (self.aws_attempts.0.load(Ordering::Relaxed) + puts + updates) as f64
            }
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

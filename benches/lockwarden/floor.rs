//! Part 1, floor: one conditional write with the raw SDK/client per backend (latency,
//! and throughput with several writers).

use super::*;

// ---------------------------------------------------------------------------------
// Part 1: floor

/// One raw conditional-write chain on one key, as the SDK/client does it.
#[allow(clippy::large_enum_variant)] // a handful of these live at a time
pub(crate) enum RawChain {
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

pub(crate) fn body(i: u64) -> Vec<u8> {
    // About the size of a lock record.
    format!(
        "{{\"holder\":\"bench/floor\",\"nonce\":\"{:032}\",\"revision\":\"{i:016}\",\"fence\":{i},\"leaseMs\":30000,\"state\":\"held\",\"acquiredAt\":\"2026-01-01T00:00:00Z\",\"renewedAt\":\"2026-01-01T00:00:00Z\"}}",
        i
    )
    .into_bytes()
}

impl RawChain {
    pub(crate) async fn new(env: &Env, kind: Kind, key: &str) -> RawChain {
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
    pub(crate) async fn write(&mut self, i: u64) {
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
pub(crate) async fn raw_create(env: &Env, kind: Kind, key: &str) {
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

pub(crate) async fn raw_throughput(env: &Arc<Env>, kind: Kind, writers: usize, secs: f64) -> f64 {
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

pub(crate) const WRITERS: usize = 8;

pub(crate) async fn part_floor(env: Arc<Env>, opts: Opts, report: Shared) {
    let n = opts.n(200);
    let secs = if opts.quick { 3.0 } else { 6.0 };
    report.lock().unwrap().aws_servers = Some((env.s3_server.name(), env.dynamodb_server.name()));
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
            r.s3_capacity = Some((env.s3_server.name(), ops));
        }
        r.floors.insert(kind, floor);
    }
}

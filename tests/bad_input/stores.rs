//! Stored values that are not lockwarden records, put into the real stores (moto S3
//! and DynamoDB, ZooKeeper, kube-apiserver Leases): reported, never overwritten.

use super::*;

// ----- S3 -------------------------------------------------------------------------

struct S3Object {
    etag: String,
    body: Vec<u8>,
}

async fn s3_get(bucket: &str, key: &str) -> S3Object {
    let s3 = Moto::shared().s3_client().await;
    let out = s3.get_object().bucket(bucket).key(key).send().await;
    let out = out.unwrap_or_else(|e| panic!("get {key}: {e:?}"));
    S3Object {
        etag: out.e_tag().unwrap_or_default().to_string(),
        body: out.body.collect().await.unwrap().to_vec(),
    }
}

async fn s3_put(bucket: &str, key: &str, body: Vec<u8>) {
    let s3 = Moto::shared().s3_client().await;
    let put = s3.put_object().bucket(bucket).key(key);
    put.body(ByteStream::from(body))
        .send()
        .await
        .unwrap_or_else(|e| panic!("put {key}: {e:?}"));
}

async fn s3_lock(bucket: &str, key: &str) -> CasLock<S3Store> {
    CasLock::new(S3Store::new(Moto::shared().s3_client().await, bucket, key))
}

/// Every store's acquire answers a value that is not a lockwarden record the same
/// way: a foreign record, with a bounded description that names what is wrong.
fn expect_foreign(name: &str, attempt: Result<Attempt, LockError>, fragment: &str) {
    match attempt {
        Err(LockError::Foreign { found, .. }) => {
            assert!(found.what.contains(fragment), "{name}: {found}");
            assert_bounded(&found);
        }
        other => panic!("{name}: expected a foreign record, got {other:?}"),
    }
}

/// Objects that are not lockwarden records: acquire refuses with a bounded
/// description, inspect reports them foreign, `lock` exits 3, `status` shows them —
/// and the object is the same, byte for byte and ETag, afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_garbage_objects_are_reported_and_left_alone() {
    let bucket = Moto::shared().new_bucket("bad-s3").await;
    let mut ten_mb = b"{\"a\":\"".to_vec();
    ten_mb.extend(std::iter::repeat_n(b'x', 10 << 20));
    ten_mb.extend_from_slice(b"\"}");
    let huge_field = format!(r#"{{"{}":1}}"#, "f".repeat(1 << 20)).into_bytes();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "binary",
            vec![0x00, 0x9f, 0x92, 0x96, 0xff, 0x01],
            "not a lockwarden lock record",
        ),
        ("empty", Vec::new(), "not a lockwarden lock record"),
        // A bare UUID is not here: it is an s3lock lock, reported as held by s3lock
        // (tests/engine.rs s3_foreign_records_are_reported_not_overwritten, interop.rs).
        (
            "wrong-types",
            record_json(json!({"holder": 5, "fence": "three"})),
            "invalid type",
        ),
        (
            "negative-fence",
            record_json(json!({"fence": -1})),
            "invalid value",
        ),
        (
            "fence-beyond-u64",
            br#"{"lockwarden":1,"fence":18446744073709551616}"#.to_vec(),
            "not a lockwarden lock record",
        ),
        (
            "zero-lease",
            record_json(json!({"leaseMs": 0})),
            "zero lease",
        ),
        (
            "empty-nonce",
            record_json(json!({"nonce": ""})),
            "empty nonce",
        ),
        (
            "unknown-state",
            record_json(json!({"state": "stolen"})),
            "unknown variant",
        ),
        (
            "future-format",
            record_json(json!({"lockwarden": 7})),
            "format 7 is not supported",
        ),
        ("huge-field-name", huge_field, "missing field `lockwarden`"),
        ("ten-megabytes", ten_mb, "10485768 bytes"),
    ];
    let cli = cli();
    for (name, body, fragment) in cases {
        let key = format!("locks/{name}");
        let url = format!("s3://{bucket}/{key}");
        s3_put(&bucket, &key, body).await;
        let before = s3_get(&bucket, &key).await;
        let lock = s3_lock(&bucket, &key).await;

        expect_foreign(name, lock.try_acquire(&request("me")).await, fragment);
        let stored = lock.inspect().await.unwrap().expect("a record");
        assert!(stored.record.is_err(), "{name}: {stored:?}");

        let out = cli.run(&["lock", &url, "-o", "x.lock"]).await;
        out.expect(3, &[&url, "not a lockwarden lock", "--force"], name);
        let out = cli.run(&["status", &url, "-o", "json"]).await;
        assert_eq!(out.code, 0, "{name}: {out:#?}");
        let status: Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(status["state"], "foreign", "{name}: {status}");
        // No lockwarden fence on it: an error, never "current" nor "not current".
        let out = cli.run(&["check-fence", &url, "1"]).await;
        out.expect(
            1,
            &[&url, "cannot check fence 1", "not a lockwarden lock record"],
            name,
        );

        let after = s3_get(&bucket, &key).await;
        assert_eq!(after.etag, before.etag, "{name}: the object was rewritten");
        assert!(after.body == before.body, "{name}: the object changed");
    }
    assert!(!cli.path("x.lock").exists());
}

/// An s3lock lock (a bare UUID body) is another tool's: it has no lockwarden fence, so
/// `check-fence` is an error naming it, whatever the fence — never "current".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_fence_on_an_s3lock_lock_is_an_error() {
    let bucket = Moto::shared().new_bucket("bad-fence").await;
    let key = "locks/s3lock";
    let url = format!("s3://{bucket}/{key}");
    s3_put(
        &bucket,
        key,
        b"0d5e1f4c-3b1a-4c57-9d34-0c6a2f0e9a11".to_vec(),
    )
    .await;
    let before = s3_get(&bucket, key).await;
    let cli = cli();
    let status = cli.run(&["status", &url, "-o", "json"]).await;
    assert_eq!(status.code, 0, "{status:#?}");
    let status: Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(
        status["state"], "held",
        "s3lock's lock is read as held: {status}"
    );
    let shown = status["fence"]
        .as_u64()
        .expect("a fence placeholder")
        .to_string();
    for fence in ["0", "1", shown.as_str()] {
        let out = cli.run(&["check-fence", &url, fence]).await;
        out.expect(
            1,
            &[
                &url,
                &format!("cannot check fence {fence}"),
                "another tool's lock",
            ],
            &format!("check-fence {fence} on an s3lock lock"),
        );
    }
    assert_eq!(s3_get(&bucket, key).await.etag, before.etag);
}

/// Records in lockwarden's format with absurd values: a lease of 584 million years,
/// timestamps past year 9999, the last fence there is. Each is reported as held (or
/// refused, for a fence that cannot grow) without a panic and without a write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_records_with_absurd_values_are_reported_and_left_alone() {
    let bucket = Moto::shared().new_bucket("absurd-s3").await;
    let cli = cli();

    // Held "forever", acquired and renewed in the far future.
    let key = "locks/forever";
    let url = format!("s3://{bucket}/{key}");
    let body = record_json(json!({
        "leaseMs": u64::MAX,
        "acquiredAtMs": u64::MAX,
        "renewedAtMs": u64::MAX,
        "fence": u64::MAX - 1,
    }));
    s3_put(&bucket, key, body).await;
    let before = s3_get(&bucket, key).await;
    let lock = s3_lock(&bucket, key).await;
    match lock.try_acquire(&request("me")).await {
        Ok(Attempt::Busy { holder, .. }) => assert_eq!(holder.holder, "someone"),
        other => panic!("expected busy, got {other:?}"),
    }
    match acquire(&lock, &request("me"), Wait::For(Duration::from_millis(300))).await {
        Err(e @ LockError::Timeout { .. }) => {
            // Displaying a far-future "since" must not panic.
            assert!(e.to_string().contains("someone"), "{e}");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    let out = cli.run(&["lock", &url]).await;
    out.expect(3, &[&url, "lock already held by someone"], "forever");
    let out = cli.run(&["lock", &url, "--wait", "1"]).await;
    out.expect(3, &[&url, "gave up after waiting"], "forever --wait");
    for format in ["json", "yaml", "wide"] {
        let out = cli.run(&["status", &url, "-o", format]).await;
        assert_eq!(out.code, 0, "status -o {format}: {out:#?}");
        assert!(out.stdout.contains("someone"), "{out:#?}");
    }
    let out = cli.run(&["status", &url]).await;
    assert_eq!(out.code, 0, "status: {out:#?}");
    let after = s3_get(&bucket, key).await;
    assert_eq!((after.etag, after.body), (before.etag, before.body));

    // Released at the last fence: the next acquisition has no higher fence to carry,
    // so it must be refused (never a second holder with the same fence).
    let key = "locks/last-fence";
    let url = format!("s3://{bucket}/{key}");
    s3_put(
        &bucket,
        key,
        record_json(json!({"fence": u64::MAX, "state": "released"})),
    )
    .await;
    let before = s3_get(&bucket, key).await;
    let lock = s3_lock(&bucket, key).await;
    match lock.try_acquire(&request("me")).await {
        Err(LockError::Backend { message, .. }) => {
            assert!(message.contains("fence"), "{message}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let out = cli.run(&["lock", &url, "-o", "y.lock"]).await;
    out.expect(1, &[&url, "fence"], "last fence");
    let after = s3_get(&bucket, key).await;
    assert_eq!((after.etag, after.body), (before.etag, before.body));
    assert!(!cli.path("y.lock").exists());
}

// ----- DynamoDB -------------------------------------------------------------------

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_string())
}

fn n(v: &str) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// Items whose attributes have the wrong types or values: foreign, reported, and
/// the item is unchanged afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_items_with_wrong_types_are_reported_and_left_alone() {
    let moto = Moto::shared();
    let table = moto.new_table("bad-ddb", "key").await;
    let client = moto.dynamodb_client().await;
    let good: HashMap<String, AttributeValue> = HashMap::from([
        ("ownerName".to_string(), s("someone")),
        ("leaseDuration".to_string(), s("30s")),
        ("recordVersionNumber".to_string(), s("rvn-1")),
        ("fence".to_string(), n("3")),
        ("nonce".to_string(), s("0123456789abcdef")),
    ]);
    let huge_map = HashMap::from([("o".repeat(300_000), s("x"))]);
    // (case, the attribute changed from `good`, its value there, what the error names)
    #[rustfmt::skip]
    let cases: Vec<(&str, &str, AttributeValue, &str)> = vec![
        ("lease-number", "leaseDuration", n("30"), "leaseDuration is a number"),
        ("lease-garbage", "leaseDuration", s("soon"), "expected a duration"),
        ("lease-zero", "leaseDuration", s("0s"), "expected a duration"),
        ("lease-huge", "leaseDuration", s("99999999999h"), "expected a duration"),
        ("fence-string", "fence", s("3"), "fence is a string"),
        ("fence-negative", "fence", n("-3"), "non-negative integer"),
        ("fence-fraction", "fence", n("3.5"), "non-negative integer"),
        ("fence-beyond-u64", "fence", n("18446744073709551616"), "non-negative integer"),
        // isReleased of any type is not here: like dynamolock, a present isReleased
        // means released (see crates/stores/src/dynamodb/store.rs), so it is not bad input.
        ("data-number", "data", n("1"), "data is a number"),
        ("owner-list", "ownerName", AttributeValue::L(vec![s("a")]), "ownerName is a list"),
        ("owner-huge-map", "ownerName", AttributeValue::M(huge_map), "ownerName is a map"),
        // A missing nonce is not here: an item without lockwarden's own attributes is
        // a dynamolock lock, held by its ownerName (tests/interop.rs).
        ("rvn-null", "recordVersionNumber", AttributeValue::Null(true), "recordVersionNumber is null"),
    ];
    let cli = cli();
    for (name, attribute, value, fragment) in cases {
        let mut item = good.clone();
        item.insert(attribute.to_string(), value);
        item.insert("key".to_string(), s(name));
        client
            .put_item()
            .table_name(&table)
            .set_item(Some(item.clone()))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{name}: put: {e:?}"));
        let lock = CasLock::new(DynamoStore::new(
            client.clone(),
            TableLayout::new(&table),
            name,
        ));
        expect_foreign(name, lock.try_acquire(&request("me")).await, fragment);
        let url = format!("dynamodb://{table}/{name}");
        let out = cli.run(&["lock", &url, "-o", "x.lock"]).await;
        out.expect(3, &[&url, "not a lockwarden lock"], name);
        let out = cli.run(&["status", &url, "-o", "json"]).await;
        assert_eq!(out.code, 0, "{name}: {out:#?}");

        let stored = client
            .get_item()
            .table_name(&table)
            .key("key", s(name))
            .consistent_read(true)
            .send()
            .await
            .unwrap();
        assert_eq!(stored.item(), Some(&item), "{name}: the item changed");
    }
}

// ----- ZooKeeper ------------------------------------------------------------------

/// Queue entries another client left with garbage data: the lock is reported held
/// by that entry (docs/design.md §3 rule 6: foreign entries are never deleted), and the entry
/// is unchanged afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_garbage_queue_entries_are_reported_and_left_alone() {
    use zookeeper_client::{Acls, CreateMode};

    let zk = ZooKeeper::shared();
    let raw = zk.connect().await;
    let options = CreateMode::Persistent.with_acls(Acls::anyone_all());
    let sessions = ZkSessions::new();
    let cli = cli();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("binary", vec![0x00, 0xff, 0x13, 0x80]),
        (
            "json-of-someone-else",
            br#"{"owner_id":"kafka-kit","t":[1,2,3]}"#.to_vec(),
        ),
        ("wrong-types", record_json(json!({"fence": "x"}))),
        ("half-megabyte", vec![b'z'; 500_000]),
        ("empty", Vec::new()),
    ];
    for (name, data) in cases {
        let path = format!("/lockwarden-bad-input/{}", support::unique(name));
        // An entry that sorts first (sequence 0: ours get 1 and up), persistent so it
        // outlives its writer.
        let entry = format!("{path}/garbage-0000000000");
        let parent_options = CreateMode::Persistent.with_acls(Acls::anyone_all());
        let mut ancestor = String::new();
        for segment in path.trim_start_matches('/').split('/') {
            ancestor.push('/');
            ancestor.push_str(segment);
            let _ = raw.create(&ancestor, b"", &parent_options).await;
        }
        raw.create(&entry, &data, &options)
            .await
            .unwrap_or_else(|e| panic!("{name}: create {entry}: {e}"));
        let (_, stat_before) = raw.get_data(&entry).await.unwrap();

        let lock = sessions.lock(&zk.connect_string(), &path).unwrap();
        match lock.try_acquire(&request("me")).await {
            Ok(Attempt::Busy { holder, .. }) => {
                assert!(
                    holder
                        .holder
                        .contains("foreign queue entry garbage-0000000000"),
                    "{name}: {}",
                    holder.holder
                );
                assert!(
                    holder.holder.len() < 1024,
                    "{name}: {}",
                    holder.holder.len()
                );
            }
            other => panic!("{name}: expected busy, got {other:?}"),
        }
        lock.abandon().await;
        let url = format!("zk://{}{path}", zk.connect_string());
        let out = cli.run(&["lock", &url, "-o", "x.lock"]).await;
        out.expect(3, &[&url, "foreign queue entry"], name);

        let (data_after, stat_after) = raw.get_data(&entry).await.unwrap();
        assert!(data_after == data, "{name}: the entry's data changed");
        assert_eq!(stat_after.mzxid, stat_before.mzxid, "{name}: rewritten");
        // Our own queue entries are gone again; the foreign one stays.
        support::eventually(
            "only the foreign entry is left",
            Duration::from_secs(60),
            || {
                let raw = &raw;
                let path = path.clone();
                async move {
                    let (children, _) = raw.get_children(&path).await.ok()?;
                    (children == ["garbage-0000000000"]).then_some(())
                }
            },
        )
        .await;
    }
    assert!(!cli.path("x.lock").exists());
}

// ----- Kubernetes Lease -----------------------------------------------------------

/// Leases with odd fields (written by hand or by another client): reported as held or
/// foreign, never rewritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_leases_with_odd_fields_are_reported_and_left_alone() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let namespace = cp.namespace(&client, "bad-lease").await;
    let api: Api<KubeLease> = Api::namespaced(client.clone(), &namespace);
    let kubeconfig = cp.kubeconfig_path().display().to_string();
    let cli = cli().with("KUBECONFIG", kubeconfig);

    let ours = |extra: Value| {
        let mut annotations = json!({
            "lockwarden.io/nonce": "0123456789abcdef",
            "lockwarden.io/revision": "r1",
            "lockwarden.io/lease-ms": "30000",
            "lockwarden.io/state": "held",
            "lockwarden.io/holder": "someone",
        });
        for (k, v) in extra.as_object().unwrap() {
            annotations[k] = v.clone();
        }
        annotations
    };
    let lease_ms = "lease-ms is missing or not a positive integer";
    // (case, annotations over `ours`, the Lease's holderIdentity, what the error names).
    // A leaseDurationSeconds of 0 or less is refused by the API server itself.
    #[rustfmt::skip]
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        ("holder-mismatch-released", json!({"lockwarden.io/state": "released", "lockwarden.io/lease-ms": "0"}), "", lease_ms),
        ("lease-ms-garbage", json!({"lockwarden.io/lease-ms": "soon"}), "someone", lease_ms),
        ("lease-ms-huge", json!({"lockwarden.io/lease-ms": "99999999999999999999999"}), "someone", lease_ms),
        ("state-odd", json!({"lockwarden.io/state": "stolen"}), "someone", "\"stolen\""),
    ];
    for (name, extra, holder, fragment) in cases {
        let lease: KubeLease = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": ours(extra)},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 30},
        }))
        .unwrap();
        let created = api
            .create(&PostParams::default(), &lease)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let lock = CasLock::new(LeaseStore::new(client.clone(), &namespace, name));
        expect_foreign(name, lock.try_acquire(&request("me")).await, fragment);
        let url = format!("k8s://{namespace}/{name}");
        let out = cli.run(&["lock", &url, "-o", "x.lock"]).await;
        out.expect(3, &[&url, "not a lockwarden lock"], name);
        let after = api.get(name).await.unwrap();
        assert_eq!(
            after.metadata.resource_version, created.metadata.resource_version,
            "{name}: the Lease was rewritten"
        );
    }

    // A client-go Lease at the last fence a Lease can carry (leaseTransitions is an
    // int32), expired: taking it over would need fence 2^31, which the Lease cannot
    // store, so the takeover is refused instead of reusing a fence.
    let name = "last-transition";
    let lease: KubeLease = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "holderIdentity": "other",
            "leaseDurationSeconds": 1,
            "leaseTransitions": i32::MAX,
        },
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &lease).await.unwrap();
    let lock: Arc<dyn LockBackend> = Arc::new(CasLock::new(LeaseStore::new(
        client.clone(),
        &namespace,
        name,
    )));
    match acquire(&*lock, &request("me"), Wait::For(Duration::from_secs(60))).await {
        Err(LockError::Backend { message, .. }) => {
            assert!(message.contains("fence"), "{message}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let after = api.get(name).await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        created.metadata.resource_version
    );
}

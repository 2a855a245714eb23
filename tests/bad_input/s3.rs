//! S3 objects that are not lockwarden records, put into moto.

use super::*;

// ----- S3 -------------------------------------------------------------------------

struct S3Object {
    etag: String,
    body: Vec<u8>,
}

async fn s3_get(bucket: &str, key: &str) -> S3Object {
    let out = Moto::shared()
        .s3_client()
        .await
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .unwrap_or_else(|e| panic!("get {key}: {e:?}"));
    S3Object {
        etag: out.e_tag().unwrap_or_default().to_string(),
        body: out.body.collect().await.unwrap().to_vec(),
    }
}

async fn s3_put(bucket: &str, key: &str, body: Vec<u8>) {
    Moto::shared()
        .s3_client()
        .await
        .put_object()
        .bucket(bucket)
        .key(key)
        .body(ByteStream::from(body))
        .send()
        .await
        .unwrap_or_else(|e| panic!("put {key}: {e:?}"));
}

async fn s3_lock(bucket: &str, key: &str) -> CasLock<S3Store> {
    CasLock::new(S3Store::new(Moto::shared().s3_client().await, bucket, key))
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
        ("huge-field-name", huge_field, "unknown field"),
        ("ten-megabytes", ten_mb, "10485768 bytes"),
    ];
    let cli = cli();
    for (name, body, fragment) in cases {
        let key = format!("locks/{name}");
        let url = format!("s3://{bucket}/{key}");
        s3_put(&bucket, &key, body).await;
        let before = s3_get(&bucket, &key).await;
        let lock = s3_lock(&bucket, &key).await;

        match lock.try_acquire(&request("me")).await {
            Err(LockError::Foreign { found, .. }) => {
                assert!(found.what.contains(fragment), "{name}: {found}");
                assert_bounded(&found);
            }
            other => panic!("{name}: expected a foreign record, got {other:?}"),
        }
        let stored = lock.inspect().await.unwrap().expect("a record");
        assert!(stored.record.is_err(), "{name}: {stored:?}");

        let out = cli.run(&["lock", &url, "-o", "x.lock"]).await;
        out.expect(3, &[&url, "not a lockwarden lock", "--force"], name);
        let out = cli.run(&["status", &url, "-o", "json"]).await;
        assert_eq!(out.code, 0, "{name}: {out:#?}");
        let status: Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(status["state"], "foreign", "{name}: {status}");

        let after = s3_get(&bucket, &key).await;
        assert_eq!(after.etag, before.etag, "{name}: the object was rewritten");
        assert!(after.body == before.body, "{name}: the object changed");
    }
    assert!(!cli.path("x.lock").exists());
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

//! Admission: valid specs are accepted with their defaults; each invalid spec is
//! rejected with a message naming its field.

use super::*;

#[tokio::test]
async fn valid_locks_are_accepted_with_defaults() {
    let (client, namespace) = setup("crd-valid").await;
    let locks = Api::<DistributedLock>::namespaced(client.clone(), &namespace);

    let cases = [
        (
            "s3",
            s3("my-locks", "payments/db-migration"),
            BackendKind::S3,
            "s3://my-locks/payments/db-migration",
        ),
        (
            "dynamodb",
            dynamodb("Locks_v1", "db-migration"),
            BackendKind::DynamoDb,
            "dynamodb://Locks_v1/db-migration",
        ),
        (
            "zookeeper",
            zookeeper(
                json!(["zk-0.zk:2181", "127.0.0.1:2182", "[::1]:2183"]),
                "/locks/db",
            ),
            BackendKind::ZooKeeper,
            "zk://zk-0.zk:2181,127.0.0.1:2182,[::1]:2183/locks/db",
        ),
        (
            "kubernetes",
            lease("db-migration"),
            BackendKind::Kubernetes,
            "",
        ),
    ];
    for (name, backend, kind, url) in cases {
        create_raw(&client, &namespace, name, json!({ "backend": backend }))
            .await
            .unwrap_or_else(|e| panic!("valid {name} lock rejected: {e}"));
        let lock = locks.get(name).await.expect("read the lock back");
        assert_eq!(
            lock.spec.lease_duration, "30s",
            "{name}: default leaseDuration"
        );
        assert_eq!(
            lock.spec.renew_interval, "10s",
            "{name}: default renewInterval"
        );
        assert!(
            !lock.spec.release && !lock.spec.force,
            "{name}: defaults false"
        );
        assert_eq!(lock.spec.lease_duration().unwrap(), Duration::from_secs(30));
        assert_eq!(lock.spec.renew_interval().unwrap(), Duration::from_secs(10));
        assert_eq!(lock.spec.acquire_timeout().unwrap(), None);
        lock.spec.validate().expect("valid in Rust too");
        assert_eq!(lock.backend_kind().unwrap(), kind);
        let want = if url.is_empty() {
            format!("k8s://{namespace}/db-migration")
        } else {
            url.to_string()
        };
        assert_eq!(lock.lock_key().unwrap(), want);
    }
    let dynamo = locks.get("dynamodb").await.unwrap();
    assert_eq!(
        dynamo
            .spec
            .backend
            .dynamodb
            .as_ref()
            .unwrap()
            .partition_key_name,
        "key",
        "default partitionKeyName"
    );

    // Every field set, through the typed API.
    let full: DistributedLockSpec = serde_json::from_value(json!({
        "backend": { "s3": {
            "bucket": "locks.example-1", "key": "a/b", "region": "eu-west-1",
            "endpoint": "http://127.0.0.1:9000", "forcePathStyle": true,
            "credentialsSecretRef": { "name": "s3-creds" },
        }},
        "holderIdentity": "cluster-a/payments/db",
        "leaseDuration": "1m30s", "renewInterval": "500ms", "acquireTimeout": "10m",
        "release": false, "force": true, "data": "free text",
    }))
    .unwrap();
    let created = locks
        .create(
            &PostParams::default(),
            &DistributedLock::new("full", full.clone()),
        )
        .await
        .expect("fully specified lock accepted");
    assert_eq!(created.spec, full);
    assert_eq!(
        created.spec.lease_duration().unwrap(),
        Duration::from_secs(90)
    );
    assert_eq!(
        created.spec.renew_interval().unwrap(),
        Duration::from_millis(500)
    );
    assert_eq!(
        created.spec.acquire_timeout().unwrap(),
        Some(Duration::from_secs(600))
    );
    assert_eq!(created.holder_identity("ignored"), "cluster-a/payments/db");

    // An explicit null is pruned (fields are not nullable) and the default applies.
    create_raw(
        &client,
        &namespace,
        "nulls",
        json!({ "backend": lease("nulls"), "leaseDuration": null, "acquireTimeout": null, "release": null }),
    )
    .await
    .expect("nulls accepted");
    let nulls = locks.get("nulls").await.unwrap();
    assert_eq!(nulls.spec.lease_duration, "30s");
    assert_eq!(nulls.spec.acquire_timeout, None);
    assert_eq!(nulls.holder_identity("c1"), format!("c1/{namespace}/nulls"));

    // Unknown fields are pruned.
    create_raw(
        &client,
        &namespace,
        "unknown",
        json!({ "backend": lease("unknown"), "notAField": 1 }),
    )
    .await
    .expect("unknown field pruned, not rejected");
}

/// One invalid spec: what it is, the spec, and a substring the rejection must contain
/// (the field path the API server reports).
struct Invalid {
    what: &'static str,
    spec: Value,
    field: &'static str,
}

fn invalid(what: &'static str, spec: Value, field: &'static str) -> Invalid {
    Invalid { what, spec, field }
}

fn invalid_specs() -> Vec<Invalid> {
    let none = json!({});
    #[rustfmt::skip]
    let specs = vec![
        // Backend selection.
        invalid("no backend at all", json!({}), "spec.backend"),
        invalid("empty backend", spec(json!({}), none.clone()), "spec.backend"),
        invalid("two backends", spec(json!({ "s3": { "bucket": "abc", "key": "k" }, "kubernetes": { "leaseName": "l" } }), none.clone()), "spec.backend"),
        // Durations.
        invalid("zero leaseDuration", spec(lease("l"), json!({ "leaseDuration": "0s" })), "spec.leaseDuration"),
        invalid("bare zero leaseDuration", spec(lease("l"), json!({ "leaseDuration": "0" })), "spec.leaseDuration"),
        invalid("negative leaseDuration", spec(lease("l"), json!({ "leaseDuration": "-30s" })), "spec.leaseDuration"),
        invalid("leaseDuration without unit", spec(lease("l"), json!({ "leaseDuration": "30" })), "spec.leaseDuration"),
        invalid("leaseDuration in words", spec(lease("l"), json!({ "leaseDuration": "30 seconds" })), "spec.leaseDuration"),
        invalid("leaseDuration in days", spec(lease("l"), json!({ "leaseDuration": "1d" })), "spec.leaseDuration"),
        invalid("malformed renewInterval", spec(lease("l"), json!({ "renewInterval": "abc" })), "spec.renewInterval"),
        invalid("zero renewInterval", spec(lease("l"), json!({ "renewInterval": "0ms" })), "spec.renewInterval"),
        invalid("renewInterval exactly half the lease", spec(lease("l"), json!({ "leaseDuration": "20s", "renewInterval": "10s" })), "spec.renewInterval"),
        invalid("renewInterval above half the default lease", spec(lease("l"), json!({ "renewInterval": "20s" })), "spec.renewInterval"),
        invalid("renewInterval longer than the lease", spec(lease("l"), json!({ "leaseDuration": "1s", "renewInterval": "1m" })), "spec.renewInterval"),
        // Rule 8: the lock-delay is capped, and has nowhere to live on ZooKeeper.
        invalid("lockDelay above the maximum", spec(lease("l"), json!({ "lockDelay": "2h" })), "spec.lockDelay"),
        invalid("lockDelay on a zookeeper backend", spec(zookeeper(json!(["zk:2181"]), "/locks/db"), json!({ "lockDelay": "30s" })), "spec.lockDelay"),
        // Queues (docs/design.md §6.4).
        invalid("priority without a queue", spec(lease("l"), json!({ "priority": 5 })), "spec.priority"),
        invalid("weight above the permits", spec(lease("l"), json!({ "queue": true, "permits": 4, "weight": 5 })), "spec.weight"),
        invalid("weight on an exclusive lock", spec(lease("l"), json!({ "queue": true, "permits": 4, "mode": "exclusive", "weight": 2 })), "spec.weight"),
        invalid("priority on a zookeeper backend", spec(zookeeper(json!(["zk:2181"]), "/locks/db"), json!({ "queue": true, "priority": 5 })), "spec.priority"),
        invalid("priority beyond int32", spec(lease("l"), json!({ "queue": true, "priority": 3_000_000_000u64 })), "spec.priority"),
        invalid("zero acquireTimeout", spec(lease("l"), json!({ "acquireTimeout": "0s" })), "spec.acquireTimeout"),
        invalid("acquireTimeout with a space", spec(lease("l"), json!({ "acquireTimeout": "10 m" })), "spec.acquireTimeout"),
        invalid("signed leaseDuration", spec(lease("l"), json!({ "leaseDuration": "+30s" })), "spec.leaseDuration"),
        invalid("leaseDuration beyond Go's range", spec(lease("l"), json!({ "leaseDuration": "9999999999h" })), "spec.leaseDuration"),
        invalid("overlong duration string", spec(lease("l"), json!({ "acquireTimeout": "1h".repeat(20) })), "spec.acquireTimeout"),
        // S3.
        invalid("bucket too short", spec(s3("ab", "k"), none.clone()), "spec.backend.s3.bucket"),
        invalid("bucket with capitals", spec(s3("My-Bucket", "k"), none.clone()), "spec.backend.s3.bucket"),
        invalid("bucket with underscore", spec(s3("my_bucket", "k"), none.clone()), "spec.backend.s3.bucket"),
        invalid("bucket with '..'", spec(s3("my..bucket", "k"), none.clone()), "spec.backend.s3.bucket"),
        invalid("bucket ending in '-'", spec(s3("bucket-", "k"), none.clone()), "spec.backend.s3.bucket"),
        invalid("bucket too long", spec(s3(&"b".repeat(64), "k"), none.clone()), "spec.backend.s3.bucket"),
        invalid("empty S3 key", spec(s3("bucket", ""), none.clone()), "spec.backend.s3.key"),
        // Terraform/OpenTofu state locks (docs/design.md §6.8).
        invalid("terraformCompatible on a key that is no state lock's", spec(json!({ "s3": { "bucket": "bucket", "key": "env/prod/terraform.tfstate", "terraformCompatible": true } }), none.clone()), "spec.backend.s3.key"),
        invalid("terraformCompatible with s3lockCompatible", spec(json!({ "s3": { "bucket": "bucket", "key": "s.tflock", "terraformCompatible": true, "s3lockCompatible": true } }), none.clone()), "spec.backend.s3.terraformCompatible"),
        invalid("terraformCompatible on a table not keyed LockID", spec(json!({ "dynamodb": { "table": "tflocks", "key": "b/s", "terraformCompatible": true } }), none.clone()), "spec.backend.dynamodb.partitionKeyName"),
        invalid("terraformCompatible with a queue", spec(json!({ "s3": { "bucket": "bucket", "key": "s.tflock", "terraformCompatible": true } }), json!({ "queue": true })), "terraformCompatible"),
        invalid("terraformCompatible with permits", spec(json!({ "dynamodb": { "table": "tflocks", "key": "b/s", "partitionKeyName": "LockID", "terraformCompatible": true } }), json!({ "permits": 2 })), "terraformCompatible"),
        invalid("runKey with permits", spec(lease("l"), json!({ "runKey": "r", "permits": 3 })), "spec.runKey"),
        invalid("runKey with a queue", spec(lease("l"), json!({ "runKey": "r", "queue": true })), "spec.runKey"),
        invalid("runKey empty", spec(lease("l"), json!({ "runKey": "" })), "spec.runKey"),
        invalid("S3 credentials Secret name", spec(json!({ "s3": { "bucket": "bucket", "key": "k", "credentialsSecretRef": { "name": "Not A Name" } } }), none.clone()), "spec.backend.s3.credentialsSecretRef.name"),
        // DynamoDB.
        invalid("table too short", spec(dynamodb("ab", "k"), none.clone()), "spec.backend.dynamodb.table"),
        invalid("table with a space", spec(dynamodb("lock table", "k"), none.clone()), "spec.backend.dynamodb.table"),
        invalid("table with '/'", spec(dynamodb("locks/v1", "k"), none.clone()), "spec.backend.dynamodb.table"),
        invalid("empty DynamoDB key", spec(dynamodb("locks", ""), none.clone()), "spec.backend.dynamodb.key"),
        invalid("empty partitionKeyName", spec(json!({ "dynamodb": { "table": "locks", "key": "k", "partitionKeyName": "" } }), none.clone()), "spec.backend.dynamodb.partitionKeyName"),
        invalid("empty sort key value", spec(json!({ "dynamodb": { "table": "locks", "key": "k", "sortKey": { "name": "sk", "value": "" } } }), none.clone()), "spec.backend.dynamodb.sortKey.value"),
        // ZooKeeper.
        invalid("relative ZooKeeper path", spec(zookeeper(json!(["zk:2181"]), "locks/db"), none.clone()), "spec.backend.zookeeper.path"),
        invalid("ZooKeeper root path", spec(zookeeper(json!(["zk:2181"]), "/"), none.clone()), "spec.backend.zookeeper.path"),
        invalid("trailing slash", spec(zookeeper(json!(["zk:2181"]), "/locks/db/"), none.clone()), "spec.backend.zookeeper.path"),
        invalid("empty path segment", spec(zookeeper(json!(["zk:2181"]), "/locks//db"), none.clone()), "spec.backend.zookeeper.path"),
        invalid("'..' segment", spec(zookeeper(json!(["zk:2181"]), "/locks/../db"), none.clone()), "spec.backend.zookeeper.path"),
        invalid("'.' segment", spec(zookeeper(json!(["zk:2181"]), "/locks/./db"), none.clone()), "spec.backend.zookeeper.path"),
        invalid("no servers", spec(zookeeper(json!([]), "/locks/db"), none.clone()), "spec.backend.zookeeper.servers"),
        invalid("server without port", spec(zookeeper(json!(["zk-0"]), "/locks/db"), none.clone()), "spec.backend.zookeeper.servers"),
        invalid("server port out of range", spec(zookeeper(json!(["zk:2181", "zk:99999"]), "/locks/db"), none.clone()), "spec.backend.zookeeper.servers"),
        invalid("server with a URL", spec(zookeeper(json!(["http://zk:2181"]), "/locks/db"), none.clone()), "spec.backend.zookeeper.servers"),
        invalid("relative chroot", spec(json!({ "zookeeper": { "servers": ["zk:2181"], "path": "/db", "chroot": "app" } }), none.clone()), "spec.backend.zookeeper.chroot"),
        invalid("zero sessionTimeout", spec(json!({ "zookeeper": { "servers": ["zk:2181"], "path": "/db", "sessionTimeout": "0s" } }), none.clone()), "spec.backend.zookeeper.sessionTimeout"),
        // Kubernetes Lease.
        invalid("Lease name with capitals", spec(lease("My-Lease"), none.clone()), "spec.backend.kubernetes.leaseName"),
        invalid("Lease name with underscore", spec(lease("my_lease"), none.clone()), "spec.backend.kubernetes.leaseName"),
        invalid("empty Lease name", spec(lease(""), none.clone()), "spec.backend.kubernetes.leaseName"),
        invalid("Lease namespace with a dot", spec(json!({ "kubernetes": { "leaseName": "l", "namespace": "a.b" } }), none.clone()), "spec.backend.kubernetes.namespace"),
        // Wrong types (tests/bad_input/ has the other bad-input tables).
        invalid("leaseDuration as a number", spec(lease("l"), json!({ "leaseDuration": 30 })), "spec.leaseDuration"),
        invalid("bucket as a number", spec(json!({ "s3": { "bucket": 123, "key": "k" } }), none.clone()), "spec.backend.s3.bucket"),
        invalid("ZooKeeper servers as a string", spec(json!({ "zookeeper": { "servers": "zk:2181", "path": "/db" } }), none.clone()), "spec.backend.zookeeper.servers"),
        invalid("release as a string", spec(lease("l"), json!({ "release": "yes" })), "spec.release"),
        invalid("backend as a list", spec(json!([{ "kubernetes": { "leaseName": "l" } }]), none.clone()), "spec.backend"),
        // Huge values.
        invalid("S3 key over 1024 bytes", spec(s3("bucket", &"k".repeat(1025)), none.clone()), "spec.backend.s3.key"),
        invalid("DynamoDB key over 2048 bytes", spec(dynamodb("locks", &"k".repeat(2049)), none.clone()), "spec.backend.dynamodb.key"),
        invalid("Lease name over 253 characters", spec(lease(&"l".repeat(254)), none.clone()), "spec.backend.kubernetes.leaseName"),
        invalid("holderIdentity over 512 characters", spec(lease("l"), json!({ "holderIdentity": "h".repeat(513) })), "spec.holderIdentity"),
        invalid("data over 64 KiB", spec(lease("l"), json!({ "data": "d".repeat(65537) })), "spec.data"),
        // Permits and mode (docs/design.md §6.2).
        invalid("zero permits", spec(lease("l"), json!({ "permits": 0 })), "spec.permits"),
        invalid("257 permits", spec(lease("l"), json!({ "permits": 257 })), "spec.permits"),
        invalid("shared with one permit", spec(lease("l"), json!({ "mode": "shared" })), "spec.mode"),
        invalid("shared with permits 1 spelled out", spec(lease("l"), json!({ "permits": 1, "mode": "shared" })), "spec.mode"),
        invalid("an unknown mode", spec(lease("l"), json!({ "permits": 2, "mode": "read" })), "spec.mode"),
    ];
    specs
}

#[tokio::test]
async fn invalid_specs_are_rejected_naming_the_field() {
    let (client, namespace) = setup("crd-invalid").await;
    let cases = invalid_specs();
    assert!(
        cases.len() >= 20,
        "the table must hold at least 20 invalid specs"
    );
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        // The Rust checks agree: the spec does not deserialize, or does not validate.
        let parsed = serde_json::from_value::<DistributedLockSpec>(case.spec.clone());
        if parsed.is_ok_and(|spec| spec.validate().is_ok()) {
            failures.push(format!(
                "{}: accepted by DistributedLockSpec::validate",
                case.what
            ));
        }
        let result = create_raw(
            &client,
            &namespace,
            &format!("invalid-{i}"),
            case.spec.clone(),
        )
        .await;
        match result {
            Err(kube::Error::Api(status)) if status.code == 422 => {
                if !status.message.contains(case.field) {
                    failures.push(format!(
                        "{}: message does not name {}: {}",
                        case.what, case.field, status.message
                    ));
                } else {
                    eprintln!("[rejected] {}: {}", case.what, status.message);
                }
            }
            other => failures.push(format!(
                "{}: expected 422 Invalid, got {other:?}",
                case.what
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} invalid specs not handled as expected:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

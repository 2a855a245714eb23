//! The backend and key of a lock cannot change after creation.

use super::*;

/// Merge-patches `spec` of lock `name` with `patch`.
async fn patch_spec(
    locks: &Api<DistributedLock>,
    name: &str,
    patch: Value,
) -> Result<DistributedLock, kube::Error> {
    locks
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": patch })),
        )
        .await
}

#[tokio::test]
async fn backend_and_key_are_immutable() {
    let (client, namespace) = setup("crd-immutable").await;
    let locks = Api::<DistributedLock>::namespaced(client.clone(), &namespace);

    let s3_lock = json!({ "s3": { "bucket": "locks", "key": "a" } });
    create_raw(&client, &namespace, "s3", json!({ "backend": s3_lock }))
        .await
        .unwrap();
    let immutable = [
        (
            "change the S3 key",
            json!({ "backend": { "s3": { "key": "b" } } }),
            "spec.backend.s3.key",
        ),
        (
            "change the bucket",
            json!({ "backend": { "s3": { "bucket": "other" } } }),
            "spec.backend.s3.bucket",
        ),
        (
            "switch S3 to a Lease",
            json!({ "backend": { "s3": null, "kubernetes": { "leaseName": "l" } } }),
            "spec.backend",
        ),
    ];
    for (what, patch, field) in immutable {
        let message = rejection(patch_spec(&locks, "s3", patch).await, what);
        assert!(
            message.contains(field),
            "{what}: {field} not named in {message}"
        );
        assert!(
            message.contains("immutable"),
            "{what}: not called immutable: {message}"
        );
    }
    // What does not name the lock can change.
    let updated = patch_spec(
        &locks,
        "s3",
        json!({
            "backend": { "s3": { "region": "eu-west-1", "endpoint": "http://127.0.0.1:1", "forcePathStyle": true } },
            "leaseDuration": "1m", "renewInterval": "20s", "release": true, "data": "x",
        }),
    )
    .await
    .expect("mutable fields can change");
    assert_eq!(
        updated.spec.backend.s3.as_ref().unwrap().region.as_deref(),
        Some("eu-west-1")
    );
    assert!(updated.spec.release);

    // The other kinds' identity fields.
    let others = [
        (
            "dynamodb",
            json!({ "dynamodb": { "table": "locks", "key": "k" } }),
            json!({ "dynamodb": { "sortKey": { "name": "sk", "value": "v" } } }),
            "spec.backend.dynamodb.sortKey",
        ),
        (
            "dynamodb-table",
            json!({ "dynamodb": { "table": "locks", "key": "k" } }),
            json!({ "dynamodb": { "table": "locks2" } }),
            "spec.backend.dynamodb.table",
        ),
        (
            "zookeeper",
            json!({ "zookeeper": { "servers": ["zk:2181"], "path": "/a" } }),
            json!({ "zookeeper": { "path": "/b" } }),
            "spec.backend.zookeeper.path",
        ),
        (
            "zookeeper-chroot",
            json!({ "zookeeper": { "servers": ["zk:2181"], "path": "/a" } }),
            json!({ "zookeeper": { "chroot": "/app" } }),
            "spec.backend.zookeeper.chroot",
        ),
        (
            "lease",
            json!({ "kubernetes": { "leaseName": "l" } }),
            json!({ "kubernetes": { "leaseName": "m" } }),
            "spec.backend.kubernetes.leaseName",
        ),
        (
            "lease-namespace",
            json!({ "kubernetes": { "leaseName": "l" } }),
            json!({ "kubernetes": { "namespace": "elsewhere" } }),
            "spec.backend.kubernetes.namespace",
        ),
    ];
    for (name, backend, change, field) in others {
        create_raw(
            &client,
            &namespace,
            name,
            json!({ "backend": backend.clone() }),
        )
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let message = rejection(
            patch_spec(&locks, name, json!({ "backend": change.clone() })).await,
            name,
        );
        assert!(
            message.contains(field),
            "{name}: {field} not named in {message}"
        );
        let old = json!({ "backend": backend });
        assert_rust_refuses_update(name, old, &json!({ "backend": change }));
    }
    // Permits and mode: every lock on a key names the same permits, and a holder
    // takes the key in one mode.
    let semaphore = json!({ "backend": lease("sem"), "permits": 3 });
    create_raw(&client, &namespace, "semaphore", semaphore.clone())
        .await
        .unwrap();
    let fixed = [
        ("change permits", json!({ "permits": 4 }), "spec.permits"),
        ("add a mode", json!({ "mode": "exclusive" }), "spec.mode"),
    ];
    for (what, patch, field) in fixed {
        let message = rejection(patch_spec(&locks, "semaphore", patch.clone()).await, what);
        assert!(
            message.contains(field) && message.contains("immutable"),
            "{what}: {field} not named immutable in {message}"
        );
        assert_rust_refuses_update(what, semaphore.clone(), &patch);
    }
    create_raw(
        &client,
        &namespace,
        "reader",
        json!({ "backend": lease("rw"), "permits": 3, "mode": "shared" }),
    )
    .await
    .unwrap();
    let message = rejection(
        patch_spec(&locks, "reader", json!({ "mode": null })).await,
        "remove the mode",
    );
    assert!(message.contains("spec.mode"), "remove the mode: {message}");

    // The ZooKeeper ensemble may change (e.g. a server added).
    patch_spec(
        &locks,
        "zookeeper",
        json!({ "backend": { "zookeeper": { "servers": ["zk:2181", "zk-1:2181"], "sessionTimeout": "10s" } } }),
    )
    .await
    .expect("servers and sessionTimeout can change");
}

/// The Rust transition check agrees with the API server: the spec `old`, merge-patched
/// with `patch`, is refused by `validate_update`.
fn assert_rust_refuses_update(what: &str, old: Value, patch: &Value) {
    let old: DistributedLockSpec = serde_json::from_value(old).unwrap();
    let mut new_value = serde_json::to_value(&old).unwrap();
    json_merge(&mut new_value, patch);
    let new: DistributedLockSpec = serde_json::from_value(new_value).unwrap();
    assert!(
        new.validate_update(&old).is_err(),
        "{what}: Rust validate_update accepted"
    );
}

/// RFC 7386 JSON merge patch.
fn json_merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    json_merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

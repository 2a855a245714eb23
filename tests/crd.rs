//! The `DistributedLock` CRD: the generated file is current, the real API server
//! accepts it, applies its defaults, and rejects invalid specs at admission with a
//! message naming the field.

mod support;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, CustomResourceExt};
use lockwarden::api::conditions::{self, reason};
use lockwarden::api::{
    BackendKind, CRD_NAME, CRD_PATH, DistributedLock, DistributedLockSpec, DistributedLockStatus,
    LockPhase, crd, crd_yaml,
};
use serde_json::{Value, json};
use std::time::Duration;
use support::kube::{ControlPlane, install_lockwarden_crd as install_crd};

/// The Helm chart's copy of the CRD (`tests/helm.rs` checks it equals `crds/`).
const CHART_CRD_DIR: &str = "charts/lockwarden/crds";

/// `crds/` holds exactly what `crd_yaml()` generates. `LOCKWARDEN_UPDATE_CRDS=1`
/// rewrites the file, and the Helm chart's copy of it, instead of failing.
#[test]
fn crd_file_is_up_to_date() {
    let path = support::repo_root().join(CRD_PATH);
    let generated = crd_yaml();
    let parsed: CustomResourceDefinition =
        serde_yaml_ng::from_str(&generated).expect("crd_yaml() is a CRD in YAML");
    assert_eq!(parsed, crd(), "crd_yaml() does not read back as crd()");
    if std::env::var_os("LOCKWARDEN_UPDATE_CRDS").is_some_and(|v| v == "1") {
        let file_name = path.file_name().expect("CRD_PATH names a file");
        let chart_copy = support::repo_root().join(CHART_CRD_DIR).join(file_name);
        for target in [&path, &chart_copy] {
            std::fs::write(target, &generated)
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", target.display()));
            eprintln!("rewrote {}", target.display());
        }
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == generated,
        "{CRD_PATH} is out of date with src/api (or missing). Regenerate it (and the \
         chart's copy in {CHART_CRD_DIR}/) with \
         `LOCKWARDEN_UPDATE_CRDS=1 cargo test --test crd crd_file_is_up_to_date`"
    );
}

#[test]
fn crd_has_names_columns_and_list_map_conditions() {
    let crd = crd();
    assert_eq!(crd.metadata.name.as_deref(), Some(CRD_NAME));
    assert_eq!(DistributedLock::crd_name(), CRD_NAME);
    let names = &crd.spec.names;
    assert_eq!(names.kind, "DistributedLock");
    assert_eq!(
        names.short_names.as_deref(),
        Some(&["dlock".to_string()][..])
    );
    assert_eq!(
        names.categories.as_deref(),
        Some(&["lockwarden".to_string()][..])
    );
    assert_eq!(crd.spec.scope, "Namespaced");
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    assert!(version.subresources.as_ref().unwrap().status.is_some());
    let columns: Vec<&str> = version
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        columns,
        ["Backend", "Key", "Phase", "Holder", "Fence", "Age"]
    );
    let schema = serde_json::to_value(&version.schema).unwrap();
    let conditions = &schema["openAPIV3Schema"]["properties"]["status"]["properties"]["conditions"];
    assert_eq!(conditions["x-kubernetes-list-type"], json!("map"));
    assert_eq!(conditions["x-kubernetes-list-map-keys"], json!(["type"]));
    // Optional spec fields are not nullable: an explicit null is pruned, then defaulted.
    let text = serde_json::to_string(&schema["openAPIV3Schema"]["properties"]["spec"]).unwrap();
    assert!(!text.contains("nullable"), "nullable in spec schema");
}

/// A client, the CRD installed, and a fresh namespace.
async fn setup(prefix: &str) -> (Client, String) {
    let plane = ControlPlane::shared();
    let client = plane.client().await;
    install_crd(&client).await;
    let namespace = plane.namespace(&client, prefix).await;
    (client, namespace)
}

fn dynamic_api(client: &Client, namespace: &str) -> Api<DynamicObject> {
    let resource = ApiResource::erase::<DistributedLock>(&());
    Api::namespaced_with(client.clone(), namespace, &resource)
}

/// Creates a DistributedLock from raw JSON (so specs the Rust types cannot express
/// reach the server too).
async fn create_raw(
    client: &Client,
    namespace: &str,
    name: &str,
    spec: Value,
) -> Result<DynamicObject, kube::Error> {
    let resource = ApiResource::erase::<DistributedLock>(&());
    let obj = DynamicObject::new(name, &resource)
        .within(namespace)
        .data(json!({ "spec": spec }));
    dynamic_api(client, namespace)
        .create(&PostParams::default(), &obj)
        .await
}

/// The API server's message for a rejected request; panics unless it is 422 Invalid.
fn rejection<T: std::fmt::Debug>(result: Result<T, kube::Error>, what: &str) -> String {
    match result {
        Err(kube::Error::Api(status)) if status.code == 422 => status.message,
        other => panic!("{what}: expected 422 Invalid, got {other:?}"),
    }
}

fn s3(bucket: &str, key: &str) -> Value {
    json!({ "s3": { "bucket": bucket, "key": key } })
}

fn dynamodb(table: &str, key: &str) -> Value {
    json!({ "dynamodb": { "table": table, "key": key } })
}

fn zookeeper(servers: Value, path: &str) -> Value {
    json!({ "zookeeper": { "servers": servers, "path": path } })
}

fn lease(name: &str) -> Value {
    json!({ "kubernetes": { "leaseName": name } })
}

/// `{"backend": backend, …extra}`.
fn spec(backend: Value, extra: Value) -> Value {
    let mut spec = json!({ "backend": backend });
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    spec
}

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
    vec![
        // Backend selection.
        invalid("no backend at all", json!({}), "spec.backend"),
        invalid(
            "empty backend",
            spec(json!({}), none.clone()),
            "spec.backend",
        ),
        invalid(
            "two backends",
            spec(
                json!({ "s3": { "bucket": "abc", "key": "k" }, "kubernetes": { "leaseName": "l" } }),
                none.clone(),
            ),
            "spec.backend",
        ),
        // Durations.
        invalid(
            "zero leaseDuration",
            spec(lease("l"), json!({ "leaseDuration": "0s" })),
            "spec.leaseDuration",
        ),
        invalid(
            "bare zero leaseDuration",
            spec(lease("l"), json!({ "leaseDuration": "0" })),
            "spec.leaseDuration",
        ),
        invalid(
            "negative leaseDuration",
            spec(lease("l"), json!({ "leaseDuration": "-30s" })),
            "spec.leaseDuration",
        ),
        invalid(
            "leaseDuration without unit",
            spec(lease("l"), json!({ "leaseDuration": "30" })),
            "spec.leaseDuration",
        ),
        invalid(
            "leaseDuration in words",
            spec(lease("l"), json!({ "leaseDuration": "30 seconds" })),
            "spec.leaseDuration",
        ),
        invalid(
            "leaseDuration in days",
            spec(lease("l"), json!({ "leaseDuration": "1d" })),
            "spec.leaseDuration",
        ),
        invalid(
            "malformed renewInterval",
            spec(lease("l"), json!({ "renewInterval": "abc" })),
            "spec.renewInterval",
        ),
        invalid(
            "zero renewInterval",
            spec(lease("l"), json!({ "renewInterval": "0ms" })),
            "spec.renewInterval",
        ),
        invalid(
            "renewInterval exactly half the lease",
            spec(
                lease("l"),
                json!({ "leaseDuration": "20s", "renewInterval": "10s" }),
            ),
            "spec.renewInterval",
        ),
        invalid(
            "renewInterval above half the default lease",
            spec(lease("l"), json!({ "renewInterval": "20s" })),
            "spec.renewInterval",
        ),
        invalid(
            "renewInterval longer than the lease",
            spec(
                lease("l"),
                json!({ "leaseDuration": "1s", "renewInterval": "1m" }),
            ),
            "spec.renewInterval",
        ),
        invalid(
            "zero acquireTimeout",
            spec(lease("l"), json!({ "acquireTimeout": "0s" })),
            "spec.acquireTimeout",
        ),
        invalid(
            "acquireTimeout with a space",
            spec(lease("l"), json!({ "acquireTimeout": "10 m" })),
            "spec.acquireTimeout",
        ),
        invalid(
            "signed leaseDuration",
            spec(lease("l"), json!({ "leaseDuration": "+30s" })),
            "spec.leaseDuration",
        ),
        invalid(
            "leaseDuration beyond Go's range",
            spec(lease("l"), json!({ "leaseDuration": "9999999999h" })),
            "spec.leaseDuration",
        ),
        invalid(
            "overlong duration string",
            spec(lease("l"), json!({ "acquireTimeout": "1h".repeat(20) })),
            "spec.acquireTimeout",
        ),
        // S3.
        invalid(
            "bucket too short",
            spec(s3("ab", "k"), none.clone()),
            "spec.backend.s3.bucket",
        ),
        invalid(
            "bucket with capitals",
            spec(s3("My-Bucket", "k"), none.clone()),
            "spec.backend.s3.bucket",
        ),
        invalid(
            "bucket with underscore",
            spec(s3("my_bucket", "k"), none.clone()),
            "spec.backend.s3.bucket",
        ),
        invalid(
            "bucket with '..'",
            spec(s3("my..bucket", "k"), none.clone()),
            "spec.backend.s3.bucket",
        ),
        invalid(
            "bucket ending in '-'",
            spec(s3("bucket-", "k"), none.clone()),
            "spec.backend.s3.bucket",
        ),
        invalid(
            "bucket too long",
            spec(s3(&"b".repeat(64), "k"), none.clone()),
            "spec.backend.s3.bucket",
        ),
        invalid(
            "empty S3 key",
            spec(s3("bucket", ""), none.clone()),
            "spec.backend.s3.key",
        ),
        invalid(
            "S3 credentials Secret name",
            spec(
                json!({ "s3": { "bucket": "bucket", "key": "k", "credentialsSecretRef": { "name": "Not A Name" } } }),
                none.clone(),
            ),
            "spec.backend.s3.credentialsSecretRef.name",
        ),
        // DynamoDB.
        invalid(
            "table too short",
            spec(dynamodb("ab", "k"), none.clone()),
            "spec.backend.dynamodb.table",
        ),
        invalid(
            "table with a space",
            spec(dynamodb("lock table", "k"), none.clone()),
            "spec.backend.dynamodb.table",
        ),
        invalid(
            "table with '/'",
            spec(dynamodb("locks/v1", "k"), none.clone()),
            "spec.backend.dynamodb.table",
        ),
        invalid(
            "empty DynamoDB key",
            spec(dynamodb("locks", ""), none.clone()),
            "spec.backend.dynamodb.key",
        ),
        invalid(
            "empty partitionKeyName",
            spec(
                json!({ "dynamodb": { "table": "locks", "key": "k", "partitionKeyName": "" } }),
                none.clone(),
            ),
            "spec.backend.dynamodb.partitionKeyName",
        ),
        invalid(
            "empty sort key value",
            spec(
                json!({ "dynamodb": { "table": "locks", "key": "k", "sortKey": { "name": "sk", "value": "" } } }),
                none.clone(),
            ),
            "spec.backend.dynamodb.sortKey.value",
        ),
        // ZooKeeper.
        invalid(
            "relative ZooKeeper path",
            spec(zookeeper(json!(["zk:2181"]), "locks/db"), none.clone()),
            "spec.backend.zookeeper.path",
        ),
        invalid(
            "ZooKeeper root path",
            spec(zookeeper(json!(["zk:2181"]), "/"), none.clone()),
            "spec.backend.zookeeper.path",
        ),
        invalid(
            "trailing slash",
            spec(zookeeper(json!(["zk:2181"]), "/locks/db/"), none.clone()),
            "spec.backend.zookeeper.path",
        ),
        invalid(
            "empty path segment",
            spec(zookeeper(json!(["zk:2181"]), "/locks//db"), none.clone()),
            "spec.backend.zookeeper.path",
        ),
        invalid(
            "'..' segment",
            spec(zookeeper(json!(["zk:2181"]), "/locks/../db"), none.clone()),
            "spec.backend.zookeeper.path",
        ),
        invalid(
            "'.' segment",
            spec(zookeeper(json!(["zk:2181"]), "/locks/./db"), none.clone()),
            "spec.backend.zookeeper.path",
        ),
        invalid(
            "no servers",
            spec(zookeeper(json!([]), "/locks/db"), none.clone()),
            "spec.backend.zookeeper.servers",
        ),
        invalid(
            "server without port",
            spec(zookeeper(json!(["zk-0"]), "/locks/db"), none.clone()),
            "spec.backend.zookeeper.servers",
        ),
        invalid(
            "server port out of range",
            spec(
                zookeeper(json!(["zk:2181", "zk:99999"]), "/locks/db"),
                none.clone(),
            ),
            "spec.backend.zookeeper.servers",
        ),
        invalid(
            "server with a URL",
            spec(
                zookeeper(json!(["http://zk:2181"]), "/locks/db"),
                none.clone(),
            ),
            "spec.backend.zookeeper.servers",
        ),
        invalid(
            "relative chroot",
            spec(
                json!({ "zookeeper": { "servers": ["zk:2181"], "path": "/db", "chroot": "app" } }),
                none.clone(),
            ),
            "spec.backend.zookeeper.chroot",
        ),
        invalid(
            "zero sessionTimeout",
            spec(
                json!({ "zookeeper": { "servers": ["zk:2181"], "path": "/db", "sessionTimeout": "0s" } }),
                none.clone(),
            ),
            "spec.backend.zookeeper.sessionTimeout",
        ),
        // Kubernetes Lease.
        invalid(
            "Lease name with capitals",
            spec(lease("My-Lease"), none.clone()),
            "spec.backend.kubernetes.leaseName",
        ),
        invalid(
            "Lease name with underscore",
            spec(lease("my_lease"), none.clone()),
            "spec.backend.kubernetes.leaseName",
        ),
        invalid(
            "empty Lease name",
            spec(lease(""), none.clone()),
            "spec.backend.kubernetes.leaseName",
        ),
        invalid(
            "Lease namespace with a dot",
            spec(
                json!({ "kubernetes": { "leaseName": "l", "namespace": "a.b" } }),
                none.clone(),
            ),
            "spec.backend.kubernetes.namespace",
        ),
        // Wrong types (tests/bad_input.rs has the other bad-input tables).
        invalid(
            "leaseDuration as a number",
            spec(lease("l"), json!({ "leaseDuration": 30 })),
            "spec.leaseDuration",
        ),
        invalid(
            "bucket as a number",
            spec(json!({ "s3": { "bucket": 123, "key": "k" } }), none.clone()),
            "spec.backend.s3.bucket",
        ),
        invalid(
            "ZooKeeper servers as a string",
            spec(
                json!({ "zookeeper": { "servers": "zk:2181", "path": "/db" } }),
                none.clone(),
            ),
            "spec.backend.zookeeper.servers",
        ),
        invalid(
            "release as a string",
            spec(lease("l"), json!({ "release": "yes" })),
            "spec.release",
        ),
        invalid(
            "backend as a list",
            spec(
                json!([{ "kubernetes": { "leaseName": "l" } }]),
                none.clone(),
            ),
            "spec.backend",
        ),
        // Huge values.
        invalid(
            "S3 key over 1024 bytes",
            spec(s3("bucket", &"k".repeat(1025)), none.clone()),
            "spec.backend.s3.key",
        ),
        invalid(
            "DynamoDB key over 2048 bytes",
            spec(dynamodb("locks", &"k".repeat(2049)), none.clone()),
            "spec.backend.dynamodb.key",
        ),
        invalid(
            "Lease name over 253 characters",
            spec(lease(&"l".repeat(254)), none.clone()),
            "spec.backend.kubernetes.leaseName",
        ),
        invalid(
            "holderIdentity over 512 characters",
            spec(lease("l"), json!({ "holderIdentity": "h".repeat(513) })),
            "spec.holderIdentity",
        ),
        invalid(
            "data over 64 KiB",
            spec(lease("l"), json!({ "data": "d".repeat(65537) })),
            "spec.data",
        ),
    ]
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
        // The Rust transition check agrees.
        let old: DistributedLockSpec =
            serde_json::from_value(json!({ "backend": backend })).unwrap();
        let mut new_value = serde_json::to_value(&old).unwrap();
        json_merge(&mut new_value, &json!({ "backend": change }));
        let new: DistributedLockSpec = serde_json::from_value(new_value).unwrap();
        assert!(
            new.validate_update(&old).is_err(),
            "{name}: Rust validate_update accepted"
        );
    }
    // The ZooKeeper ensemble may change (e.g. a server added).
    patch_spec(
        &locks,
        "zookeeper",
        json!({ "backend": { "zookeeper": { "servers": ["zk:2181", "zk-1:2181"], "sessionTimeout": "10s" } } }),
    )
    .await
    .expect("servers and sessionTimeout can change");
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

#[tokio::test]
async fn status_is_written_through_the_status_subresource() {
    let (client, namespace) = setup("crd-status").await;
    let locks = Api::<DistributedLock>::namespaced(client.clone(), &namespace);
    let spec: DistributedLockSpec =
        serde_json::from_value(json!({ "backend": s3("locks", "team/job") })).unwrap();
    let created = locks
        .create(&PostParams::default(), &DistributedLock::new("job", spec))
        .await
        .expect("create");
    let generation = created.metadata.generation;
    assert!(created.status.is_none());

    // Status sent to the main resource is ignored.
    let ignored = locks
        .patch(
            "job",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "phase": "Held" } })),
        )
        .await
        .expect("patch main resource");
    assert!(
        ignored.status.is_none(),
        "status written through the main resource"
    );

    // Server-side apply on /status, as the controller does.
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let mut conds = Vec::new();
    conditions::set_condition(
        &mut conds,
        conditions::condition(
            conditions::ACQUIRED,
            true,
            reason::LEASE_HELD,
            "held",
            generation,
            now.clone(),
        ),
    );
    let status = DistributedLockStatus {
        phase: Some(LockPhase::Held),
        backend: Some(created.backend_kind().unwrap().to_string()),
        key: Some(created.lock_key().unwrap()),
        holder: Some("cluster-a/ns/job".into()),
        etag: Some("\"5d41402abc4b2a76b9719d911017c592\"".into()),
        fence: Some(42),
        nonce: Some("7f1c".into()),
        acquired_at: Some(now.clone()),
        renewed_at: Some(now.clone()),
        lease_expires_at: Some(now.clone()),
        queue_position: Some(0),
        observed_generation: generation,
        conditions: conds,
    };
    let apply = json!({
        "apiVersion": "lockwarden.io/v1alpha1",
        "kind": "DistributedLock",
        "status": status,
    });
    let written = locks
        .patch_status(
            "job",
            &PatchParams::apply("lockwarden-controller").force(),
            &Patch::Apply(&apply),
        )
        .await
        .expect("server-side apply status");
    let got = written.status.clone().expect("status set");
    assert_eq!(got.phase, Some(LockPhase::Held));
    assert_eq!(got.fence, Some(42));
    assert_eq!(got.key.as_deref(), Some("s3://locks/team/job"));
    assert_eq!(got.backend.as_deref(), Some("s3"));
    assert_eq!(
        written.metadata.generation, generation,
        "status write bumped generation"
    );
    let acquired = written.acquired_condition().expect("Acquired condition");
    assert_eq!(acquired.status, "True");
    assert_eq!(acquired.observed_generation, generation);

    // Conditions are a list-map keyed by type: another manager's condition type is
    // merged in, not replacing ours.
    let other = json!({
        "apiVersion": "lockwarden.io/v1alpha1",
        "kind": "DistributedLock",
        "status": { "conditions": [{
            "type": "Audited", "status": "True", "reason": "Checked", "message": "",
            "lastTransitionTime": now,
        }]},
    });
    let merged = locks
        .patch_status("job", &PatchParams::apply("auditor"), &Patch::Apply(&other))
        .await
        .expect("second manager applies its condition");
    let types: Vec<String> = merged
        .status
        .unwrap()
        .conditions
        .into_iter()
        .map(|c| c.type_)
        .collect();
    assert_eq!(types, ["Acquired", "Audited"]);

    // The status is selectable by key and phase, for indexing and kubectl.
    let by_key = locks
        .list(&ListParams::default().fields("status.key=s3://locks/team/job,status.phase=Held"))
        .await
        .expect("field selector on status.key");
    assert_eq!(by_key.items.len(), 1);

    // Printer columns, via kubectl and the short name.
    let out = support::kubectl::kubectl(&["get", "dlock", "-n", &namespace], None).await;
    let stdout = support::kubectl::stdout_ok(&out, "get dlock");
    let mut lines = stdout.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["NAME", "BACKEND", "KEY", "PHASE", "HOLDER", "FENCE", "AGE"]
    );
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        &row[..6],
        [
            "job",
            "s3",
            "s3://locks/team/job",
            "Held",
            "cluster-a/ns/job",
            "42"
        ],
        "kubectl get dlock:\n{stdout}"
    );
}

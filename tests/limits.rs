//! One set of name and size limits, wherever a lock key comes in: for every store, a
//! key at the limit and one byte over it, and keys with control characters, through
//! (a) the `DistributedLock` CRD on a real kube-apiserver (and its Rust twin,
//! `DistributedLockSpec::validate`) and (b) the command-line URL parser of the built
//! binary, where keys at the limit are locked and unlocked on the real stores (moto,
//! ZooKeeper, kube-apiserver). The rules live with each store (`lockwarden::backend::<store>`) and in
//! `lockwarden::lock::names`.

use lockwarden_testsupport as support;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, ObjectMeta, PostParams};
use lockwarden::api::{DistributedLock, DistributedLockSpec};
use lockwarden::backend::{dynamodb, s3, zookeeper};
use lockwarden::lock::names;
use serde_json::{Value, json};
use support::kube::{ControlPlane, install_lockwarden_crd};
use support::moto::{self, Moto};
use support::zookeeper::ZooKeeper;

const BIN: &str = env!("CARGO_BIN_EXE_lockwarden");
/// Generous: the test machine is a loaded 2-core box.
const TIMEOUT: Duration = Duration::from_secs(120);

/// `prefix` padded with `fill` to exactly `bytes` bytes (`fill` is one byte).
fn padded(prefix: &str, fill: char, bytes: usize) -> String {
    assert!(prefix.len() <= bytes && fill.len_utf8() == 1);
    let mut s = prefix.to_string();
    s.extend(std::iter::repeat_n(fill, bytes - prefix.len()));
    s
}

/// Where the lock keys of the rows live.
struct Places {
    bucket: String,
    table: String,
    zk_servers: String,
    /// A namespace whose name is exactly [`names::KUBERNETES_NAMESPACE_MAX_LEN`] long.
    long_namespace: String,
    namespace: String,
    unique: String,
}

/// One key: its spec.backend, the field a rejection names, its URL, and whether the
/// store's rules accept it (when not: a piece of the message that names the rule).
struct Row {
    what: String,
    backend: Value,
    field: &'static str,
    url: String,
    refused_because: Option<&'static str>,
}

/// The stores whose rows differ only in their key.
#[derive(Clone, Copy)]
enum Store {
    S3,
    DynamoDb,
    ZooKeeper,
}

/// A row of `store` for `key` (the S3 or DynamoDB key, the ZooKeeper path).
fn store_row(
    p: &Places,
    store: Store,
    what: &str,
    key: String,
    refused_because: Option<&'static str>,
) -> Row {
    let (backend, field, url) = match store {
        Store::S3 => (
            json!({ "s3": { "bucket": p.bucket, "key": key } }),
            "spec.backend.s3.key",
            format!("s3://{}/{key}", p.bucket),
        ),
        Store::DynamoDb => (
            json!({ "dynamodb": { "table": p.table, "key": key } }),
            "spec.backend.dynamodb.key",
            format!("dynamodb://{}/{key}", p.table),
        ),
        Store::ZooKeeper => (
            json!({ "zookeeper": { "servers": [p.zk_servers], "path": key } }),
            "spec.backend.zookeeper.path",
            format!("zk://{}{key}", p.zk_servers),
        ),
    };
    Row {
        what: what.into(),
        backend,
        field,
        url,
        refused_because,
    }
}

fn lease_row(
    what: &str,
    namespace: &str,
    name: String,
    field: &'static str,
    refused_because: Option<&'static str>,
) -> Row {
    Row {
        what: what.into(),
        backend: json!({ "kubernetes": { "leaseName": name, "namespace": namespace } }),
        field,
        url: format!("k8s://{namespace}/{name}"),
        refused_because,
    }
}

/// A store's keys for the rows: (what, key, refused because), of `store`.
type Keys<'a> = Vec<(&'a str, String, Option<&'static str>)>;

fn rows_of(p: &Places, store: Store, keys: Keys) -> Vec<Row> {
    keys.into_iter()
        .map(|(what, key, refused_because)| store_row(p, store, what, key, refused_because))
        .collect()
}

/// Every store at its limit and one byte over, and control characters.
fn rows(p: &Places) -> Vec<Row> {
    let u = &p.unique;
    let s3_max = s3::KEY_MAX_BYTES;
    let ddb_max = dynamodb::KEY_MAX_BYTES;
    let zk_max = zookeeper::PATH_MAX_BYTES;
    let lease_max = names::KUBERNETES_NAME_MAX_LEN;
    // 'é' is two bytes: a key of whole 'é's after the prefix, filled up with ASCII.
    let two_byte_key = |bytes: usize| {
        let mut key = format!("{u}/");
        while key.len() + 2 <= bytes {
            key.push('é');
        }
        padded(&key, 'k', bytes)
    };
    let (control, over_1024) = (Some("control characters"), Some("longer than 1024 bytes"));
    let s3_key = |bytes| padded(&format!("{u}/"), 'k', bytes);
    let zk_path = |bytes| padded(&format!("/{u}/"), 'z', bytes);
    let mut rows = rows_of(
        p,
        Store::S3,
        vec![
            ("S3 key of 1024 bytes", s3_key(s3_max), None),
            ("S3 key of 1025 bytes", s3_key(s3_max + 1), over_1024),
            (
                "S3 key of 1024 bytes, mostly two-byte characters",
                two_byte_key(s3_max),
                None,
            ),
            (
                "S3 key of 1025 bytes in fewer than 1024 characters",
                two_byte_key(s3_max + 1),
                over_1024,
            ),
            ("S3 key with a tab", format!("{u}/a\tb"), control),
        ],
    );
    rows.extend(rows_of(
        p,
        Store::DynamoDb,
        vec![
            ("DynamoDB key of 2048 bytes", padded(u, 'k', ddb_max), None),
            (
                "DynamoDB key of 2049 bytes",
                padded(u, 'k', ddb_max + 1),
                Some("longer than 2048 bytes"),
            ),
            ("DynamoDB key with U+0001", format!("{u}\u{1}"), control),
        ],
    ));
    rows.extend(rows_of(
        p,
        Store::ZooKeeper,
        vec![
            ("ZooKeeper path of 1024 bytes", zk_path(zk_max), None),
            (
                "ZooKeeper path of 1025 bytes",
                zk_path(zk_max + 1),
                over_1024,
            ),
            (
                "ZooKeeper path with U+0085 (a C1 control)",
                format!("/{u}/a\u{85}b"),
                control,
            ),
            (
                "ZooKeeper path with U+007F",
                format!("/{u}/a\u{7f}"),
                control,
            ),
            (
                "ZooKeeper path with U+E000 (ZooKeeper refuses it)",
                format!("/{u}/a\u{e000}"),
                Some("U+E000"),
            ),
        ],
    ));
    // Leases: the name in the default namespace, and the namespace.
    let (name, namespace) = (
        "spec.backend.kubernetes.leaseName",
        "spec.backend.kubernetes.namespace",
    );
    let lease_name = |bytes| padded(&format!("{u}-"), 'l', bytes);
    let (long, longer) = (p.long_namespace.clone(), format!("{}n", p.long_namespace));
    for (what, ns, lease, field, refused_because) in [
        (
            "Lease name of 253 characters",
            &p.namespace,
            lease_name(lease_max),
            name,
            None,
        ),
        (
            "Lease name of 254 characters",
            &p.namespace,
            lease_name(lease_max + 1),
            name,
            Some("at most 253"),
        ),
        (
            "Lease namespace of 63 characters",
            &long,
            u.clone(),
            namespace,
            None,
        ),
        (
            "Lease namespace of 64 characters",
            &longer,
            u.clone(),
            namespace,
            Some("at most 63"),
        ),
    ] {
        rows.push(lease_row(what, ns, lease, field, refused_because));
    }
    rows
}

fn places(unique: &str) -> Places {
    Places {
        bucket: "limits-bucket".into(),
        table: "limits-table".into(),
        zk_servers: "127.0.0.1:2181".into(),
        long_namespace: padded(
            &format!("{unique}-"),
            'n',
            names::KUBERNETES_NAMESPACE_MAX_LEN,
        ),
        namespace: "default".into(),
        unique: unique.into(),
    }
}

#[tokio::test]
async fn crd_admission_applies_the_store_limits() {
    let plane = ControlPlane::shared();
    let client = plane.client().await;
    install_lockwarden_crd(&client).await;
    let namespace = plane.namespace(&client, "limits-crd").await;
    let resource = ApiResource::erase::<DistributedLock>(&());
    let api = Api::<DynamicObject>::namespaced_with(client, &namespace, &resource);

    let p = places(&support::unique_suffix());
    let mut rows = rows(&p);
    // The CRD has a chroot too: chroot and path together are one ZooKeeper path.
    let chroot = format!("/{}", p.unique);
    let path_bytes = zookeeper::PATH_MAX_BYTES - chroot.len();
    for (what, bytes, refused_because) in [
        ("ZooKeeper chroot + path of 1024 bytes", path_bytes, None),
        (
            "ZooKeeper chroot + path of 1025 bytes",
            path_bytes + 1,
            Some("at most 1024 bytes"),
        ),
    ] {
        let path = padded("/", 'z', bytes);
        rows.push(Row {
            what: what.into(),
            backend: json!({ "zookeeper": { "servers": [p.zk_servers], "chroot": chroot, "path": path } }),
            field: "spec.backend.zookeeper.path",
            url: format!("zk://{}{chroot}{path}", p.zk_servers),
            refused_because,
        });
    }
    let mut failures = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let spec = json!({ "backend": row.backend });
        // The Rust twin of the CEL rules agrees.
        let rust = serde_json::from_value::<DistributedLockSpec>(spec.clone())
            .expect("the row's spec has the right shape")
            .validate();
        match (&rust, row.refused_because) {
            (Ok(()), None) => {}
            (Err(e), Some(_)) if e.to_string().contains(row.field) => {}
            (verdict, _) => failures.push(format!(
                "{}: DistributedLockSpec::validate said {verdict:?}",
                row.what
            )),
        }
        let object = DynamicObject::new(&format!("row-{i}"), &resource)
            .within(&namespace)
            .data(json!({ "spec": spec }));
        let created = api.create(&PostParams::default(), &object).await;
        match (created, row.refused_because) {
            (Ok(_), None) => eprintln!("[accepted] {}", row.what),
            (Err(kube::Error::Api(status)), Some(_))
                if status.code == 422 && status.message.contains(row.field) =>
            {
                eprintln!("[refused] {}: {}", row.what, status.message)
            }
            (outcome, expected) => failures.push(format!(
                "{}: expected {}, got {outcome:?}",
                row.what,
                if expected.is_some() {
                    format!("422 naming {}", row.field)
                } else {
                    "it to be created".into()
                }
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Runs the binary with `args` in `dir`, with moto and the control plane as the
/// stores; returns (exit code, stderr).
async fn lockwarden(dir: &Path, args: &[&str]) -> (i32, String) {
    let kubeconfig = ControlPlane::shared().kubeconfig_path().to_owned();
    let run = tokio::process::Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env_remove("AWS_PROFILE")
        .env_remove("LOCKWARDEN_LOG")
        .env("AWS_ENDPOINT_URL", Moto::shared().endpoint())
        .env("AWS_REGION", moto::REGION)
        .env("AWS_ACCESS_KEY_ID", moto::ACCESS_KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", moto::SECRET_ACCESS_KEY)
        .env("AWS_CONFIG_FILE", "/nonexistent/aws-config")
        .env(
            "AWS_SHARED_CREDENTIALS_FILE",
            "/nonexistent/aws-credentials",
        )
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(TIMEOUT, run)
        .await
        .unwrap_or_else(|_| panic!("lockwarden did not finish within {TIMEOUT:?}"))
        .expect("run lockwarden");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code().unwrap_or(-1), stderr)
}

#[tokio::test]
async fn cli_url_parser_applies_the_store_limits() {
    let moto = Moto::shared();
    let zk = tokio::task::spawn_blocking(ZooKeeper::shared)
        .await
        .expect("ZooKeeper starts");
    let plane = ControlPlane::shared();
    let client = plane.client().await;
    let unique = support::unique_suffix();
    let mut p = places(&unique);
    p.bucket = moto.new_bucket("limits").await;
    p.table = moto.new_table("limits", "key").await;
    p.zk_servers = zk.connect_string();
    p.namespace = plane.namespace(&client, "limits-cli").await;
    let long_namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(p.long_namespace.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &long_namespace)
        .await
        .expect("a namespace name of 63 characters is valid");

    let dir = tempfile::tempdir().expect("temp dir");
    let mut failures = Vec::new();
    for (i, row) in rows(&p).iter().enumerate() {
        let file = format!("row-{i}.lock");
        let (code, stderr) = lockwarden(dir.path(), &["lock", &row.url, "-o", &file]).await;
        match row.refused_because {
            // At the limit: the real store takes the key, and the lock comes back off.
            None if code == 0 => {
                let (code, stderr) = lockwarden(dir.path(), &["unlock", &file]).await;
                if code != 0 {
                    failures.push(format!("{}: unlock exited {code}: {stderr}", row.what));
                } else {
                    eprintln!("[locked and unlocked] {}", row.what);
                }
            }
            None => failures.push(format!("{}: lock exited {code}: {stderr}", row.what)),
            Some(because) if code == 2 && stderr.contains(because) => {
                eprintln!("[refused] {}: {}", row.what, stderr.trim());
            }
            Some(because) => failures.push(format!(
                "{}: expected exit 2 naming {because:?}, got {code}: {stderr}",
                row.what
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

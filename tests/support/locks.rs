//! `DistributedLock` fixtures: one spelling of the locks the tests create, and the
//! waits on their status.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use lockwarden::api::conditions::{self, ACQUIRED};
use lockwarden::api::{
    BackendSpec, DistributedLock, DistributedLockSpec, DynamoDbBackend, KubernetesBackend,
    LockPhase, S3Backend, SecretRef, ZooKeeperBackend,
};
use lockwarden::backend::LeaseStore;
use lockwarden::lock::{AcquireRequest, Attempt, CasLock, Lease, LockBackend};
use serde_json::json;

/// One `#[tokio::test]` per row, `name: body(store, more arguments)`, running `body` on
/// a fresh key of `support::keys::Key::store()` (`support::on_each_store!`): each store's test stays a test of its
/// own, under its own name, run in parallel with the others. (A macro: a function
/// cannot declare tests.)
#[macro_export]
macro_rules! on_each_store {
    ($($name:ident: $body:ident($store:ident $(, $arg:expr)*);)+) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            $body($crate::keys::Key::$store().await $(, $arg)*).await;
        }
    )+};
}

/// A lock on the Kubernetes Lease `lease` in the lock's own namespace, with the
/// default lease duration and renew interval (30 s / 10 s).
pub fn lease_lock(name: &str, lease: &str) -> DistributedLock {
    DistributedLock::new(
        name,
        DistributedLockSpec {
            backend: BackendSpec {
                kubernetes: Some(KubernetesBackend {
                    lease_name: lease.into(),
                    namespace: None,
                }),
                ..Default::default()
            },
            ..Default::default()
        },
    )
}

/// A lock template on Lease `lease`: `spec.release: true`, so it holds nothing itself
/// and only lends its spec to the workloads' own locks (docs/design.md §6).
pub fn lease_template(name: &str, lease: &str) -> DistributedLock {
    let mut template = lease_lock(name, lease);
    template.spec.release = true;
    template
}

/// [`lease_lock`] with its own lease duration and renew interval.
pub fn lease_lock_timed(name: &str, lease: &str, duration: &str, renew: &str) -> DistributedLock {
    timed(lease_lock(name, lease), duration, renew)
}

/// A lock named `name` on `backend`, with this lease duration and renew interval.
pub fn lock_on(name: &str, backend: BackendSpec, duration: &str, renew: &str) -> DistributedLock {
    timed(
        DistributedLock::new(
            name,
            DistributedLockSpec {
                backend,
                ..Default::default()
            },
        ),
        duration,
        renew,
    )
}

/// `lock` with another lease duration and renew interval.
pub fn timed(mut lock: DistributedLock, duration: &str, renew: &str) -> DistributedLock {
    lock.spec.lease_duration = duration.into();
    lock.spec.renew_interval = renew.into();
    lock
}

/// A lock on `s3://bucket/key` reached through `endpoint` (moto or a proxy in front of
/// it), path-style, with credentials from the Secret `secret` (see [`aws_secret`]).
pub fn s3_lock(
    name: &str,
    bucket: &str,
    key: &str,
    endpoint: String,
    secret: &str,
) -> DistributedLock {
    let mut lock = lease_lock(name, "unused");
    lock.spec.backend = BackendSpec {
        s3: Some(S3Backend {
            bucket: bucket.into(),
            key: key.into(),
            region: Some(super::moto::REGION.into()),
            endpoint: Some(endpoint),
            force_path_style: Some(true),
            s3lock_compatible: None,
            terraform_compatible: None,
            credentials_secret_ref: Some(SecretRef {
                name: secret.into(),
            }),
        }),
        ..Default::default()
    };
    lock
}

/// The ZooKeeper backend at `path` on the servers of `connect` (a connect string).
pub fn zookeeper_backend(connect: &str, path: &str) -> BackendSpec {
    BackendSpec {
        zookeeper: Some(ZooKeeperBackend {
            servers: connect.split(',').map(String::from).collect(),
            path: path.into(),
            chroot: None,
            session_timeout: None,
        }),
        ..Default::default()
    }
}

/// The DynamoDB backend on moto's (or a proxy's) `endpoint`: item `key` of `table`,
/// credentials from `secret` (see [`aws_secret`]).
pub fn dynamodb_backend(
    table: &str,
    key: &str,
    endpoint: String,
    secret: SecretRef,
) -> BackendSpec {
    BackendSpec {
        dynamodb: Some(DynamoDbBackend {
            table: table.into(),
            key: key.into(),
            region: Some(super::moto::REGION.into()),
            endpoint: Some(endpoint),
            credentials_secret_ref: Some(secret),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Merges `spec` into lock `name`'s spec (e.g. `{"release": true}`), as a user would.
pub async fn patch_spec(locks: &Api<DistributedLock>, name: &str, spec: serde_json::Value) {
    let merge = Patch::Merge(json!({ "spec": spec }));
    locks
        .patch(name, &PatchParams::default(), &merge)
        .await
        .unwrap_or_else(|e| panic!("patch the spec of {name}: {e}"));
}

/// Takes the key at once with `req` (the library call, no controller); panics naming
/// the holder and the key when the attempt does not acquire.
pub async fn acquire_now(lock: &dyn LockBackend, req: &AcquireRequest) -> Lease {
    match lock.try_acquire(req).await {
        Ok(Attempt::Acquired(lease)) => lease,
        other => panic!(
            "{} should have acquired {}: {other:?}",
            req.holder,
            lock.url()
        ),
    }
}

/// A holder outside this cluster's controller (another cluster, or the CLI) takes
/// Lease `lease` of `ns` directly in the store with `req`; the handle to let it go.
pub async fn hold_lease(
    client: &Client,
    ns: &str,
    lease: &str,
    req: &AcquireRequest,
) -> (CasLock<LeaseStore>, Lease) {
    let outsider = CasLock::new(LeaseStore::new(client.clone(), ns, lease));
    let held = acquire_now(&outsider, req).await;
    (outsider, held)
}

/// Creates the Secret `aws` in `namespace` with the moto test credentials.
pub async fn aws_secret(client: &Client, namespace: &str) -> SecretRef {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "aws" },
        "stringData": {
            "AWS_ACCESS_KEY_ID": super::moto::ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": super::moto::SECRET_ACCESS_KEY,
        },
    }))
    .expect("a Secret");
    Api::<Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap_or_else(|e| panic!("create {namespace}/aws: {e}"));
    SecretRef { name: "aws".into() }
}

/// Whether the lock's Acquired condition is True.
pub fn acquired(lock: &DistributedLock) -> bool {
    lock.status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, ACQUIRED))
}

pub fn phase(lock: &DistributedLock) -> Option<LockPhase> {
    lock.status.as_ref().and_then(|s| s.phase)
}

/// Waits until the lock `name` is in `phase`; returns it. On timeout, the failure
/// shows the status it was last seen with: its conditions say why it is not there.
pub async fn wait_phase(
    locks: &Api<DistributedLock>,
    name: &str,
    phase: LockPhase,
    timeout: Duration,
) -> DistributedLock {
    let deadline = std::time::Instant::now() + timeout;
    let mut last = None;
    loop {
        if let Ok(lock) = locks.get(name).await {
            if self::phase(&lock) == Some(phase) {
                return lock;
            }
            last = lock.status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {name} to be {phase}; its status last: {}",
            serde_json::to_string_pretty(&last).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Waits until the lock `name` is Acquired; returns it.
pub async fn wait_acquired(
    locks: &Api<DistributedLock>,
    name: &str,
    timeout: Duration,
) -> DistributedLock {
    super::eventually(&format!("{name} to be Acquired"), timeout, || async {
        locks.get(name).await.ok().filter(acquired)
    })
    .await
}

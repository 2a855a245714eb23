//! `DistributedLock` fixtures: one spelling of the locks the tests create, and the
//! waits on their status.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, PostParams};
use lockwarden::api::conditions::{self, ACQUIRED};
use lockwarden::api::{
    BackendSpec, DistributedLock, DistributedLockSpec, KubernetesBackend, LockPhase, S3Backend,
    SecretRef,
};
use serde_json::json;

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
            credentials_secret_ref: Some(SecretRef {
                name: secret.into(),
            }),
        }),
        ..Default::default()
    };
    lock
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

/// Waits until the lock `name` is in `phase`; returns it.
pub async fn wait_phase(
    locks: &Api<DistributedLock>,
    name: &str,
    phase: LockPhase,
    timeout: Duration,
) -> DistributedLock {
    super::eventually(&format!("{name} to be {phase}"), timeout, || async {
        locks
            .get(name)
            .await
            .ok()
            .filter(|l| self::phase(l) == Some(phase))
    })
    .await
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

//! The controller against a real API server, mostly with the Kubernetes-Lease backend
//! (it needs no other server). Each test runs its own controller, in-process or as a
//! `lockwarden controller` process, scoped to the test's own namespace.

mod backends;
mod handoff;
mod lifecycle;
mod restart;
mod semaphore;
use lockwarden_testsupport as support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use lockwarden::api::conditions::{self, ACQUIRED, reason};
use lockwarden::api::{BackendSpec, DistributedLock, LockPhase};
use lockwarden::backend::LeaseStore;
use lockwarden::controller::{self, ControllerConfig, FINALIZER};
use lockwarden::lock::{AcquireRequest, Attempt, CasLock, LockBackend};
use serde_json::json;
use support::eventually;
use support::kube::{ControlPlane, install_lockwarden_crd as install_crd};
use support::locks::{
    acquired, aws_secret, dynamodb_backend, lease_lock_timed, patch_spec, phase, s3_lock, timed,
    wait_acquired, wait_phase, zookeeper_backend,
};

/// Generous: the test machine is a loaded 2-core box.
const TIMEOUT: Duration = Duration::from_secs(60);
const CLUSTER: &str = "test-cluster";

/// A client, the CRD, a fresh namespace, and a controller watching that namespace.
async fn setup(prefix: &str) -> (Client, String, Api<DistributedLock>) {
    let (client, namespace) = support::kube::namespace_with_controller(prefix, CLUSTER).await;
    let locks = Api::namespaced(client.clone(), &namespace);
    (client, namespace, locks)
}

/// A ZooKeeper lock on the shared server, spelled `localhost:PORT`. The process-wide
/// ZooKeeper session registry keys sessions by that spelling and a session lives on
/// the runtime of the test that opened it, so each test that uses ZooKeeper spells the
/// server its own way (one runtime per test here; one for the whole process in
/// production).
fn zk_lock(name: &str, path: &str) -> DistributedLock {
    let zk = support::zookeeper::ZooKeeper::shared();
    let mut lock = lease_lock_timed(name, "unused", "30s", "10s");
    lock.spec.backend = BackendSpec {
        zookeeper: Some(lockwarden::api::ZooKeeperBackend {
            servers: zk
                .connect_string()
                .split(',')
                .map(|s| s.replace("127.0.0.1", "localhost"))
                .collect(),
            path: path.to_string(),
            chroot: None,
            session_timeout: None,
        }),
        ..Default::default()
    };
    lock
}

async fn create(locks: &Api<DistributedLock>, lock: &DistributedLock) {
    locks
        .create(&PostParams::default(), lock)
        .await
        .unwrap_or_else(|e| panic!("create {}: {e}", lock.name_any()));
}

/// [`setup`] for a test on moto (S3 or DynamoDB): also the shared moto server and the
/// Secret `aws` with its credentials in the namespace.
async fn setup_on_moto(
    prefix: &str,
) -> (
    Api<DistributedLock>,
    &'static support::moto::Moto,
    lockwarden::api::SecretRef,
) {
    let (client, ns, locks) = setup(prefix).await;
    let moto = shared_moto().await;
    let secret = aws_secret(&client, &ns).await;
    (locks, moto, secret)
}

/// The shared moto server, started off the async runtime (it blocks while starting).
async fn shared_moto() -> &'static support::moto::Moto {
    tokio::task::spawn_blocking(support::moto::Moto::shared)
        .await
        .unwrap()
}

/// The shared ZooKeeper server, started off the async runtime.
async fn shared_zookeeper() -> &'static support::zookeeper::ZooKeeper {
    tokio::task::spawn_blocking(support::zookeeper::ZooKeeper::shared)
        .await
        .unwrap()
}

//! The `DistributedLock` CRD: the generated file is current, the real API server
//! accepts it, applies its defaults, and rejects invalid specs at admission with a
//! message naming the field.

mod admission;
mod immutability;
mod schema;
mod status;
use lockwarden_testsupport as support;

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

/// The Helm chart's copy of the CRD (`tests/helm/` checks it equals `crds/`).
const CHART_CRD_DIR: &str = "charts/lockwarden/crds";

/// A client, the CRD installed, and a fresh namespace.
async fn setup(prefix: &str) -> (Client, String) {
    support::kube::namespace_with_crd(prefix).await
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

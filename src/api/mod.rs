//! The `DistributedLock` API (`lockwarden.io/v1alpha1`): Rust types, the generated
//! CustomResourceDefinition and its admission rules (docs/design.md §4).
//!
//! - [`distributed_lock`]: [`DistributedLock`], its spec, status and [`LockPhase`].
//! - [`backend_spec`]: `spec.backend` (exactly one of S3, DynamoDB, ZooKeeper, Lease),
//!   [`BackendKind`] and the lock key URL.
//! - [`conditions`]: condition types, reasons and `set_condition`.
//! - [`duration`]: Go-style duration strings.
//!
//! The CRD is generated from these types ([`crd`], [`crd_yaml`]); the copy in
//! `crds/distributedlocks.lockwarden.io.yaml` is checked against it by `tests/crd/`
//! (`LOCKWARDEN_UPDATE_CRDS=1 cargo test --test crd` rewrites it).
//!
//! Every optional field is non-nullable in the schema, so the API server prunes an
//! explicit `null` (and then applies the field's default) instead of storing it.

pub mod backend_spec;
pub mod conditions;
pub mod distributed_lock;
mod error;
mod kind;
pub mod validated;
mod validation;

pub use crate::duration;
pub use crate::duration::{
    DurationError, format_duration, parse_duration, parse_positive_duration,
};
pub use backend_spec::{
    BackendKind, BackendSpec, DynamoDbBackend, KubernetesBackend, S3Backend, SecretRef,
    SelectedBackend, SortKey, ZooKeeperBackend,
};
pub use distributed_lock::{
    DEFAULT_LEASE_DURATION, DEFAULT_RENEW_INTERVAL, DistributedLock, DistributedLockSpec,
    DistributedLockStatus, LockPhase,
};
pub use error::SpecError;
pub use validated::{LockAddress, ValidatedSpec};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use schemars::transform::{Transform, transform_subschemas};
use serde_json::Value;

/// The CRD's name (`<plural>.<group>`).
pub const CRD_NAME: &str = "distributedlocks.lockwarden.io";

/// Where the generated CRD is kept, relative to the repository root.
pub const CRD_PATH: &str = "crds/distributedlocks.lockwarden.io.yaml";

/// The `DistributedLock` CustomResourceDefinition.
pub fn crd() -> CustomResourceDefinition {
    DistributedLock::crd()
}

/// The CRD as YAML, exactly as stored in [`CRD_PATH`] and printed by `lockwarden crd`.
pub fn crd_yaml() -> String {
    let yaml = serde_yaml_ng::to_string(&crd()).expect("a CustomResourceDefinition serializes");
    format!(
        "# Generated from src/api by `lockwarden crd`; do not edit.\n\
         # Regenerate: LOCKWARDEN_UPDATE_CRDS=1 cargo test --test crd crd_file_is_up_to_date\n\
         {yaml}"
    )
}

/// Schema transform: gives every integer a format Kubernetes knows, recursively.
///
/// schemars names Rust's unsigned types (`format: uint32`…), which the API server does
/// not know and warns about on every `kubectl apply` of the CRD. An integer whose
/// declared maximum fits in 32 bits is `int32`, any other `int64`; its `minimum`
/// (schemars writes 0 for an unsigned type) still keeps it non-negative.
pub(crate) fn kubernetes_integer_formats(schema: &mut schemars::Schema) {
    KubernetesIntegerFormats.transform(schema);
}

struct KubernetesIntegerFormats;

impl Transform for KubernetesIntegerFormats {
    fn transform(&mut self, schema: &mut schemars::Schema) {
        transform_subschemas(self, schema);
        let Some(obj) = schema.as_object_mut() else {
            return;
        };
        let Some(Value::String(format)) = obj.get("format") else {
            return;
        };
        if matches!(format.as_str(), "int32" | "int64") || !format.contains("int") {
            return;
        }
        let fits_int32 = obj
            .get("maximum")
            .and_then(Value::as_f64)
            .is_some_and(|max| max <= f64::from(i32::MAX))
            || matches!(format.as_str(), "int8" | "uint8" | "int16" | "uint16");
        let known = if fits_int32 { "int32" } else { "int64" };
        obj.insert("format".into(), Value::from(known));
    }
}

/// Schema transform: makes every optional field non-nullable (drops `null` from
/// `type` and `enum`, unwraps `anyOf: [T, null]`, removes `nullable`), recursively.
pub(crate) fn strip_nullable(schema: &mut schemars::Schema) {
    StripNullable.transform(schema);
}

struct StripNullable;

impl Transform for StripNullable {
    fn transform(&mut self, schema: &mut schemars::Schema) {
        transform_subschemas(self, schema);
        let Some(obj) = schema.as_object_mut() else {
            return;
        };
        obj.remove("nullable");
        if let Some(Value::Array(types)) = obj.get_mut("type") {
            types.retain(|t| t != "null");
            if types.len() == 1 {
                let only = types.remove(0);
                obj.insert("type".into(), only);
            }
        }
        if let Some(Value::Array(values)) = obj.get_mut("enum") {
            values.retain(|v| !v.is_null());
        }
        let is_null = |v: &Value| {
            v.get("type") == Some(&Value::from("null"))
                || v.get("enum") == Some(&Value::Array(vec![Value::Null]))
                || v.get("enum") == Some(&Value::Array(vec![]))
        };
        if let Some(Value::Array(any_of)) = obj.get("anyOf")
            && any_of.len() == 2
            && let Some(other) = any_of.iter().find(|v| !is_null(v)).cloned()
            && any_of.iter().any(is_null)
        {
            obj.remove("anyOf");
            if let Value::Object(other) = other {
                for (k, v) in other {
                    obj.entry(k).or_insert(v);
                }
            }
        }
    }
}

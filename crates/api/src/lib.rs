//! lockwarden-api: the `DistributedLock` and `LockAdmissionConfig` APIs
//! (`lockwarden.io/v1alpha1`): Rust types, the generated CustomResourceDefinitions and
//! their admission rules (docs/design.md §4, §6.6).
//! Spec data only: serde and schemars types, no SDK or client. Every store's part of
//! the spec is here whatever lockwarden-stores' features are, so `crds/` is always
//! generated whole.
//!
//! - [`distributed_lock`]: [`DistributedLock`], its spec, status and [`LockPhase`].
//! - [`backend_spec`]: `spec.backend`, exactly one store's part (each declared in
//!   `stores/<store>.rs`), and the lock key URL.
//! - [`store_spec`]: what every store's part provides ([`StoreSpec`]) and its errors;
//!   [`SelectedSpec`] (in `backend_spec`) is the one part that is set.
//! - [`lock_admission_config`]: [`LockAdmissionConfig`], the parameters of a Kueue
//!   AdmissionCheck of lockwarden's.
//! - [`conditions`]: condition types, reasons and `set_condition`.
//! - [`duration`]: Go-style duration strings.
//!
//! The CRD is generated from these types ([`crd`], [`crd_yaml`]); the copy in
//! `crds/distributedlocks.lockwarden.io.yaml` is checked against it by `tests/crd/`
//! (`LOCKWARDEN_UPDATE_CRDS=1 cargo test --test crd` rewrites it).
//!
//! Every optional field is non-nullable in the schema, so the API server prunes an
//! explicit `null` (and then applies the field's default) instead of storing it.

// Functions over clippy.toml's threshold are split into named steps (issue 41);
// unit tests are not held to it.
#![warn(clippy::too_many_lines)]
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod backend_spec;
pub mod conditions;
pub mod distributed_lock;
mod error;
pub mod lock_admission_config;
pub mod schema;
pub mod store_spec;
pub mod stores;
mod validation;

pub use backend_spec::BackendSpec;
pub use backend_spec::SelectedSpec;
pub use distributed_lock::{
    DEFAULT_LEASE_DURATION, DEFAULT_RENEW_INTERVAL, DistributedLock, DistributedLockSpec,
    DistributedLockStatus, HistoryEntry, LockPhase,
};
pub use error::SpecError;
pub use lock_admission_config::{
    AdmissionConfigError, LockAdmissionConfig, LockAdmissionConfigSpec, TemplateRef,
};
pub use lockwarden_core::duration;
pub use lockwarden_core::duration::{
    DurationError, format_duration, parse_duration, parse_positive_duration,
};
pub use lockwarden_stores::BackendKind;
pub use store_spec::{SecretRef, SpecFieldError, StoreSpec};
pub use stores::dynamodb::{DynamoDbBackend, SortKey};
pub use stores::kubernetes::KubernetesBackend;
pub use stores::s3::S3Backend;
pub use stores::zookeeper::ZooKeeperBackend;
/// Why a run key needs one permit and no queue (docs/design.md §6.7).
pub use validation::A_RUN_HAS_ONE_HOLDER;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The CRD's name (`<plural>.<group>`).
pub const CRD_NAME: &str = "distributedlocks.lockwarden.io";

/// Where the generated CRD is kept, relative to the repository root.
pub const CRD_PATH: &str = "crds/distributedlocks.lockwarden.io.yaml";

/// The revision of the CRD this build generates, in its [`CRD_REVISION_ANNOTATION`].
/// One more with every change of the generated schema (`tests/crd/` fails until it is
/// bumped): the controller compares it with the installed CRD's, since Helm installs a
/// CRD once and never upgrades it. Revision 1 is the CRD before the annotation existed.
pub const CRD_REVISION: u32 = 8;

/// The annotation of the generated CRD that carries [`CRD_REVISION`].
pub const CRD_REVISION_ANNOTATION: &str = "lockwarden.io/crd-revision";

/// The `DistributedLock` CustomResourceDefinition.
pub fn crd() -> CustomResourceDefinition {
    let mut crd = DistributedLock::crd();
    crd.metadata
        .annotations
        .get_or_insert_default()
        .insert(CRD_REVISION_ANNOTATION.into(), CRD_REVISION.to_string());
    crd
}

/// The revision an installed CRD says it is: its [`CRD_REVISION_ANNOTATION`], or 1
/// for a CRD without it (what every build before the annotation installed).
pub fn installed_crd_revision(crd: &CustomResourceDefinition) -> Result<u32, CrdRevisionError> {
    match crd
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CRD_REVISION_ANNOTATION))
    {
        None => Ok(1),
        Some(value) => value.parse().map_err(|source| CrdRevisionError {
            value: value.clone(),
            source,
        }),
    }
}

/// An installed CRD's [`CRD_REVISION_ANNOTATION`] that is not a revision.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{} is {value:?}, not a number", CRD_REVISION_ANNOTATION)]
pub struct CrdRevisionError {
    pub value: String,
    #[source]
    pub source: std::num::ParseIntError,
}

/// The CRD as YAML, exactly as stored in [`CRD_PATH`].
pub fn crd_yaml() -> String {
    generated_yaml(&crd())
}

/// The `LockAdmissionConfig` CRD's name: the parameters of a Kueue AdmissionCheck of
/// lockwarden's (docs/design.md §6.6).
pub const ADMISSION_CONFIG_CRD_NAME: &str = "lockadmissionconfigs.lockwarden.io";

/// Where the generated `LockAdmissionConfig` CRD is kept, relative to the repository
/// root.
pub const ADMISSION_CONFIG_CRD_PATH: &str = "crds/lockadmissionconfigs.lockwarden.io.yaml";

/// The `LockAdmissionConfig` CustomResourceDefinition.
pub fn admission_config_crd() -> CustomResourceDefinition {
    LockAdmissionConfig::crd()
}

/// The `LockAdmissionConfig` CRD as YAML, exactly as stored in
/// [`ADMISSION_CONFIG_CRD_PATH`].
pub fn admission_config_crd_yaml() -> String {
    generated_yaml(&admission_config_crd())
}

/// Every CRD of lockwarden's as one YAML stream, as `lockwarden crd` prints it.
pub fn all_crds_yaml() -> String {
    format!("{}---\n{}", crd_yaml(), admission_config_crd_yaml())
}

fn generated_yaml(crd: &CustomResourceDefinition) -> String {
    let yaml = serde_yaml_ng::to_string(crd).expect("a CustomResourceDefinition serializes");
    format!(
        "# Generated from crates/api by `lockwarden crd`; do not edit.\n\
         # Regenerate: LOCKWARDEN_UPDATE_CRDS=1 cargo test --test crd crd_file_is_up_to_date\n\
         {yaml}"
    )
}

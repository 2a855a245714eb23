// TEMPORARY until H2's api::BackendSpec::target lands.
//
// The methods below have the names and signatures of the inherent methods
// `BackendSpec::{target, connect_options, credentials_secret}` and of the free function
// `backend::connect` that are being added in `src/api` and `src/backend`. They are an
// extension trait so that the call sites (`api/validated.rs`, `controller/connect.rs`)
// are already final: once the inherent methods exist they win over these, and this file
// and its two `use` lines can be deleted (and `connect_shim::connect` becomes
// `crate::backend::connect`).

use std::sync::Arc;

use crate::api::{BackendSpec, SecretRef, SelectedBackend, SpecError};
use crate::backend::{ConnectError, ConnectOptions, Target};
use crate::lock::LockBackend;

pub trait BackendSpecShim {
    fn target(&self, lock_namespace: &str) -> Result<Target, SpecError>;
    fn connect_options(&self) -> ConnectOptions;
    fn credentials_secret(&self) -> Option<&SecretRef>;
}

impl BackendSpecShim for BackendSpec {
    fn target(&self, lock_namespace: &str) -> Result<Target, SpecError> {
        Target::parse(&self.lock_url(lock_namespace)?).map_err(|e| SpecError::Invalid {
            field: "spec.backend".to_string(),
            message: e.to_string(),
        })
    }

    fn connect_options(&self) -> ConnectOptions {
        let mut options = ConnectOptions::default();
        match self.selected() {
            Ok(SelectedBackend::S3(s)) => {
                options.endpoint = s.endpoint.clone().filter(|e| !e.is_empty());
                options.region = s.region.clone();
                options.force_path_style = s.force_path_style;
                options.s3lock_compatible = s.s3lock_compatible.unwrap_or(false);
            }
            Ok(SelectedBackend::DynamoDb(d)) => {
                options.endpoint = d.endpoint.clone().filter(|e| !e.is_empty());
                options.region = d.region.clone();
                options.partition_key = Some(d.partition_key_name.clone());
                options.sort_key = d
                    .sort_key
                    .as_ref()
                    .map(|s| (s.name.clone(), s.value.clone()));
                options.create_table = d.create_table.unwrap_or(false);
            }
            _ => {}
        }
        options
    }

    fn credentials_secret(&self) -> Option<&SecretRef> {
        match self.selected() {
            Ok(SelectedBackend::S3(s)) => s.credentials_secret_ref.as_ref(),
            Ok(SelectedBackend::DynamoDb(d)) => d.credentials_secret_ref.as_ref(),
            _ => None,
        }
    }
}

pub async fn connect(
    target: &Target,
    options: &ConnectOptions,
) -> Result<Arc<dyn LockBackend>, ConnectError> {
    target.connect(options).await
}

//! Each store's part of `spec.backend`, one file per store: its fields, its CEL rules
//! and their Rust twin, and how it becomes the store's key and connection options
//! (lockwarden-stores' types, which are plain data without the stores' features).

use lockwarden_stores::aws::AwsOptions;

pub mod dynamodb;
pub mod kubernetes;
pub mod s3;
pub mod zookeeper;

/// How an AWS store's part of the spec reaches AWS: its `endpoint` (an empty one is
/// unset) and `region`; credentials come from its Secret.
fn aws_options(endpoint: &Option<String>, region: &Option<String>) -> AwsOptions {
    AwsOptions {
        endpoint: endpoint.clone().filter(|e| !e.is_empty()),
        region: region.clone(),
        ..AwsOptions::default()
    }
}

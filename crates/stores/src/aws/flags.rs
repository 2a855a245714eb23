//! The command line's AWS flags (feature `cli`).

use serde::{Deserialize, Serialize};

use super::AwsOptions;

/// The command line's AWS flags; a lock file saves them, so `unlock` reaches the same
/// store.
#[derive(clap::Args, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct AwsFlags {
    /// AWS endpoint URL, e.g. an S3-compatible server [default: AWS_ENDPOINT_URL, else AWS]
    #[arg(long, value_name = "URL", value_parser = parse_endpoint)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,

    /// AWS region [default: AWS_REGION / the profile's]
    #[arg(long, value_name = "REGION", value_parser = parse_region)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,

    /// Hold a Terraform/OpenTofu state lock as those tools do: an S3 object
    /// `<state key>.tflock` or an item of their DynamoDB lock table (partition key
    /// LockID), written as a lock they parse and print, deleted on release (unfenced
    /// across releases, unqueued)
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub terraform_compatible: bool,
}

impl AwsFlags {
    /// These flags, falling back to `saved` for anything not given.
    pub fn options(&self, saved: &AwsFlags) -> AwsOptions {
        AwsOptions {
            endpoint: self.endpoint.clone().or_else(|| saved.endpoint.clone()),
            region: self.region.clone().or_else(|| saved.region.clone()),
            ..AwsOptions::default()
        }
    }
}

/// An AWS flag's value that is refused; the message names it and the form expected.
#[derive(Debug, thiserror::Error)]
enum AwsFlagError {
    #[error("{0:?} is not an endpoint URL: expected http(s)://HOST[:PORT]")]
    Endpoint(String),
    #[error("{0:?} is not a region name: expected e.g. eu-west-1")]
    Region(String),
}

fn parse_endpoint(s: &str) -> Result<String, AwsFlagError> {
    let ok = (s.starts_with("http://") || s.starts_with("https://"))
        && s.split_once("://").is_some_and(|(_, h)| !h.is_empty());
    if !ok {
        return Err(AwsFlagError::Endpoint(s.to_string()));
    }
    Ok(s.to_string())
}

fn parse_region(s: &str) -> Result<String, AwsFlagError> {
    if s.is_empty()
        || !s
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err(AwsFlagError::Region(s.to_string()));
    }
    Ok(s.to_string())
}

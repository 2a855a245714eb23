//! `spec.backend.s3` of a `DistributedLock`: a lock object in S3, its admission rules
//! (CEL, and the same checks in Rust) and how it becomes a key and connection options.

use kube::KubeSchema;
use kube::core::Rule;
use serde::{Deserialize, Serialize};

use crate::schema::{
    RuleExt, immutable, lit, max_bytes, no_control_characters, non_empty, optional_immutable,
};
use crate::store_spec::{
    SecretRef, SpecFieldError, StoreSpec, check, check_secret, invalid, unchanged,
};
use lockwarden_stores::aws::AwsOptions;
use lockwarden_stores::s3::S3Options;
use lockwarden_stores::s3::key::{self, KEY_MAX_BYTES, S3Key};
use lockwarden_stores::terraform;

/// A lock object in S3 (or an S3-compatible store).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::strip_nullable)]
#[x_kube(
    validation = terraform_lock_key(),
    validation = one_tools_compatibility(),
    validation = optional_immutable("terraformCompatible")
)]
pub struct S3Backend {
    /// Bucket name.
    #[schemars(length(max = 63))]
    #[x_kube(validation = bucket_rule(), validation = immutable("bucket"))]
    pub bucket: String,
    /// Object key of the lock record (at most 1,024 bytes of UTF-8).
    #[schemars(length(max = KEY_MAX_BYTES))]
    #[x_kube(
        validation = non_empty("key"),
        validation = max_bytes("key", KEY_MAX_BYTES),
        validation = no_control_characters("key"),
        validation = immutable("key")
    )]
    pub key: String,
    /// AWS region; the usual AWS configuration chain when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub region: Option<String>,
    /// Endpoint URL of an S3-compatible store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub endpoint: Option<String>,
    /// Path-style addressing (`endpoint/bucket/key`), needed by most S3-compatible stores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force_path_style: Option<bool>,
    /// A Secret in the lock's namespace with AWS credentials
    /// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, optional `AWS_SESSION_TOKEN`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<SecretRef>,
    /// Delete the object on release (after writing the release record), so
    /// winebarrel/s3lock clients, which lock with `PUT If-None-Match: *`, can lock the
    /// key after lockwarden. The fencing token then restarts at 1 after each release
    /// (the object holding the counter is gone). Needs `s3:DeleteObject`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3lock_compatible: Option<bool>,
    /// Hold a Terraform/OpenTofu state lock as those tools do (`use_lockfile`): `key` is
    /// the state's key followed by `.tflock`, and the lock object is a `LockInfo` the
    /// tools parse and print (`tofu plan` names this lock's holder; `tofu force-unlock
    /// ID` removes it), deleted on release so that they can lock after lockwarden.
    /// Unfenced across releases (the fencing token restarts at 1) and unqueued (no
    /// `queue`, `permits` 1). Needs `s3:DeleteObject`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terraform_compatible: Option<bool>,
}

/// On the S3 part: `terraformCompatible` names a state lock's key, `<state key>.tflock`.
fn terraform_lock_key() -> Rule {
    Rule::new(format!(
        "!has(self.terraformCompatible) || !self.terraformCompatible || \
         (self.key.endsWith({suffix}) && self.key.size() > {len})",
        suffix = lit(terraform::S3_LOCK_SUFFIX),
        len = terraform::S3_LOCK_SUFFIX.len()
    ))
    .msg(TERRAFORM_KEY_MESSAGE)
    .field_path(".key")
}

const TERRAFORM_KEY_MESSAGE: &str = "terraformCompatible holds a Terraform/OpenTofu state \
     lock: key must be the state's key followed by .tflock (env/prod/terraform.tfstate.tflock)";

/// On the S3 part: one tool's compatibility at a time.
fn one_tools_compatibility() -> Rule {
    Rule::new(
        "!has(self.terraformCompatible) || !self.terraformCompatible || \
         !has(self.s3lockCompatible) || !self.s3lockCompatible",
    )
    .msg(ONE_TOOL_MESSAGE)
    .field_path(".terraformCompatible")
}

const ONE_TOOL_MESSAGE: &str = "terraformCompatible and s3lockCompatible: a key is one \
     tool's lock (a Terraform state lock is no s3lock lock); set one of them";

/// On `bucket`: a valid bucket name.
fn bucket_rule() -> Rule {
    Rule::new(format!(
        "self.matches({}) && !self.contains('..')",
        lit(&key::bucket_pattern())
    ))
    .msg("bucket must be a valid S3 bucket name: 3-63 characters of lowercase letters, digits, '.' and '-', starting and ending with a letter or digit")
}

impl S3Backend {
    /// How to reach the store: endpoint, region and path-style addressing, and
    /// delete-on-release (s3lock compatibility). Credentials come from the Secret.
    pub fn options(&self) -> (AwsOptions, S3Options) {
        let aws = super::aws_options(&self.endpoint, &self.region);
        let s3 = S3Options {
            force_path_style: self.force_path_style,
            s3lock_compatible: self.s3lock_compatible.unwrap_or(false),
            terraform_compatible: self.terraform_compatible.unwrap_or(false),
        };
        (aws, s3)
    }
}

impl StoreSpec for S3Backend {
    type Key = S3Key;

    fn key(&self, _lock_namespace: &str) -> S3Key {
        S3Key {
            bucket: self.bucket.clone(),
            key: self.key.clone(),
        }
    }

    fn validate(&self) -> Result<(), SpecFieldError> {
        check("s3.bucket", key::bucket_name(&self.bucket))?;
        check("s3.key", key::object_key(&self.key))?;
        if self.holds_a_tools_lock() {
            if terraform::s3_state_path(&self.bucket, &self.key).is_none() {
                return Err(invalid("s3.key", TERRAFORM_KEY_MESSAGE));
            }
            if self.s3lock_compatible == Some(true) {
                return Err(invalid("s3.terraformCompatible", ONE_TOOL_MESSAGE));
            }
        }
        check_secret("s3", &self.credentials_secret_ref)
    }

    fn validate_update(&self, old: &S3Backend) -> Result<(), SpecFieldError> {
        unchanged("s3.bucket", &self.bucket, &old.bucket)?;
        unchanged("s3.key", &self.key, &old.key)?;
        unchanged(
            "s3.terraformCompatible",
            &self.terraform_compatible,
            &old.terraform_compatible,
        )
    }

    fn holds_a_tools_lock(&self) -> bool {
        self.terraform_compatible == Some(true)
    }

    fn credentials_secret(&self) -> Option<&SecretRef> {
        self.credentials_secret_ref.as_ref()
    }
}

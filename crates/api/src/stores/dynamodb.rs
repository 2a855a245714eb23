//! `spec.backend.dynamodb` of a `DistributedLock`: a lock item in DynamoDB, its
//! admission rules (CEL, and the same checks in Rust) and how it becomes a key and
//! connection options.

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
use lockwarden_stores::dynamodb::DEFAULT_PARTITION_KEY;
use lockwarden_stores::dynamodb::DynamoDbOptions;
use lockwarden_stores::dynamodb::key::{
    self, ATTRIBUTE_NAME_MAX_BYTES, DynamoDbKey, KEY_MAX_BYTES, SORT_KEY_MAX_BYTES, TABLE_PATTERN,
};
use lockwarden_stores::terraform;

/// A lock item in DynamoDB.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::strip_nullable)]
#[x_kube(
    validation = optional_immutable("sortKey"),
    validation = terraform_lock_table(),
    validation = optional_immutable("terraformCompatible")
)]
pub struct DynamoDbBackend {
    /// Table name.
    #[schemars(length(max = 255))]
    #[x_kube(validation = table_rule(), validation = immutable("table"))]
    pub table: String,
    /// Partition key value of the lock item (at most 2,048 bytes of UTF-8).
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
    /// Endpoint URL of a DynamoDB-compatible service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub endpoint: Option<String>,
    /// Name of the table's partition key attribute (a string attribute).
    #[serde(default = "default_partition_key_name")]
    #[schemars(length(max = ATTRIBUTE_NAME_MAX_BYTES))]
    #[x_kube(
        validation = non_empty("partitionKeyName"),
        validation = max_bytes("partitionKeyName", ATTRIBUTE_NAME_MAX_BYTES),
        validation = no_control_characters("partitionKeyName"),
        validation = immutable("partitionKeyName")
    )]
    pub partition_key_name: String,
    /// For tables with a sort key: its attribute name and the value for this lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sort_key: Option<SortKey>,
    /// Create the table (on-demand capacity) if it does not exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_table: Option<bool>,
    /// A Secret in the lock's namespace with AWS credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<SecretRef>,
    /// Hold an item of Terraform's/OpenTofu's DynamoDB lock table as those tools do
    /// (`dynamodb_table`): `partitionKeyName` is `LockID`, `key` the state's
    /// `<bucket>/<state key>`, and the item's `Info` a `LockInfo` the tools parse and
    /// print (`tofu force-unlock ID` removes it), the item deleted on release. Unfenced
    /// across releases (the fencing token restarts at 1) and unqueued (no `queue`,
    /// `permits` 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terraform_compatible: Option<bool>,
}

/// On the DynamoDB part: `terraformCompatible` names an item of the tools' lock table.
fn terraform_lock_table() -> Rule {
    Rule::new(format!(
        "!has(self.terraformCompatible) || !self.terraformCompatible || \
         self.partitionKeyName == {}",
        lit(terraform::DYNAMODB_LOCK_KEY)
    ))
    .msg(TERRAFORM_TABLE_MESSAGE)
    .field_path(".partitionKeyName")
}

const TERRAFORM_TABLE_MESSAGE: &str = "terraformCompatible holds an item of a \
     Terraform/OpenTofu lock table: partitionKeyName must be LockID (and key the state's \
     <bucket>/<state key>)";

impl Default for DynamoDbBackend {
    fn default() -> Self {
        DynamoDbBackend {
            table: String::new(),
            key: String::new(),
            region: None,
            endpoint: None,
            partition_key_name: default_partition_key_name(),
            sort_key: None,
            create_table: None,
            credentials_secret_ref: None,
            terraform_compatible: None,
        }
    }
}

fn default_partition_key_name() -> String {
    DEFAULT_PARTITION_KEY.to_string()
}

/// A DynamoDB sort key attribute (string) and its value.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SortKey {
    /// Attribute name.
    #[schemars(length(max = ATTRIBUTE_NAME_MAX_BYTES))]
    #[x_kube(
        validation = non_empty("name"),
        validation = max_bytes("name", ATTRIBUTE_NAME_MAX_BYTES),
        validation = no_control_characters("name")
    )]
    pub name: String,
    /// Attribute value for this lock (at most 1,024 bytes of UTF-8).
    #[schemars(length(max = SORT_KEY_MAX_BYTES))]
    #[x_kube(
        validation = non_empty("value"),
        validation = max_bytes("value", SORT_KEY_MAX_BYTES),
        validation = no_control_characters("value")
    )]
    pub value: String,
}

/// On `table`: a valid table name.
fn table_rule() -> Rule {
    Rule::new(format!("self.matches({})", lit(TABLE_PATTERN))).msg(
        "table must be a valid DynamoDB table name: 3-255 characters of letters, digits, '_', '.' and '-'",
    )
}

impl DynamoDbBackend {
    /// How to reach the table and where lock items sit in it: endpoint, region, the
    /// key layout and table creation. Credentials come from the Secret.
    pub fn options(&self) -> (AwsOptions, DynamoDbOptions) {
        let aws = super::aws_options(&self.endpoint, &self.region);
        let dynamodb = DynamoDbOptions {
            partition_key: Some(self.partition_key_name.clone()),
            sort_key: self
                .sort_key
                .as_ref()
                .map(|s| (s.name.clone(), s.value.clone())),
            create_table: self.create_table.unwrap_or(false),
            terraform_compatible: self.terraform_compatible.unwrap_or(false),
        };
        (aws, dynamodb)
    }
}

impl StoreSpec for DynamoDbBackend {
    type Key = DynamoDbKey;

    fn key(&self, _lock_namespace: &str) -> DynamoDbKey {
        DynamoDbKey {
            table: self.table.clone(),
            key: self.key.clone(),
        }
    }

    fn validate(&self) -> Result<(), SpecFieldError> {
        check("dynamodb.table", key::table_name(&self.table))?;
        check("dynamodb.key", key::key_value(&self.key))?;
        check(
            "dynamodb.partitionKeyName",
            key::attribute_name(&self.partition_key_name),
        )?;
        if let Some(s) = &self.sort_key {
            check("dynamodb.sortKey.name", key::attribute_name(&s.name))?;
            check("dynamodb.sortKey.value", key::sort_key_value(&s.value))?;
        }
        if self.holds_a_tools_lock() && self.partition_key_name != terraform::DYNAMODB_LOCK_KEY {
            return Err(invalid(
                "dynamodb.partitionKeyName",
                TERRAFORM_TABLE_MESSAGE,
            ));
        }
        check_secret("dynamodb", &self.credentials_secret_ref)
    }

    fn validate_update(&self, old: &DynamoDbBackend) -> Result<(), SpecFieldError> {
        unchanged("dynamodb.table", &self.table, &old.table)?;
        unchanged("dynamodb.key", &self.key, &old.key)?;
        unchanged(
            "dynamodb.partitionKeyName",
            &self.partition_key_name,
            &old.partition_key_name,
        )?;
        unchanged("dynamodb.sortKey", &self.sort_key, &old.sort_key)?;
        unchanged(
            "dynamodb.terraformCompatible",
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

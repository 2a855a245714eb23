//! The command line's DynamoDB flags (feature `cli`).

use serde::{Deserialize, Serialize};

use lockwarden_core::names::NameError;

use super::{DynamoDbOptions, attribute_name, sort_key_value};

/// The command line's DynamoDB flags; a lock file saves the key layout.
#[derive(clap::Args, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct DynamoDbFlags {
    /// DynamoDB partition key attribute name [default: key]
    #[arg(long, value_name = "NAME", value_parser = parse_attribute_name)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition_key: Option<String>,

    /// DynamoDB sort key: attribute name and the value lock items use
    #[arg(long, value_name = "NAME=VALUE", value_parser = parse_sort_key)]
    #[serde(skip_serializing_if = "Option::is_none", with = "name_equals_value")]
    pub sort_key: Option<(String, String)>,

    /// Create the DynamoDB table (on-demand billing) if it does not exist
    #[arg(long)]
    #[serde(skip)]
    pub create_table: bool,
}

impl DynamoDbFlags {
    /// These flags, falling back to `saved`'s key layout for anything not given.
    pub fn options(&self, saved: &DynamoDbFlags) -> DynamoDbOptions {
        DynamoDbOptions {
            partition_key: self
                .partition_key
                .clone()
                .or_else(|| saved.partition_key.clone()),
            sort_key: self.sort_key.clone().or_else(|| saved.sort_key.clone()),
            create_table: self.create_table,
            // `--terraform-compatible` is one flag for both AWS stores (AwsFlags).
            terraform_compatible: false,
        }
    }
}

/// A DynamoDB flag's value that is refused; the message names it.
#[derive(Debug, thiserror::Error)]
enum DynamoDbFlagError {
    #[error("{name:?}: an attribute name has 1-255 characters ({source})")]
    AttributeName {
        name: String,
        #[source]
        source: NameError,
    },
    /// `--sort-key NAME=VALUE` with a VALUE no lock item can have.
    #[error("{flag:?}: {source}")]
    SortKeyValue {
        flag: String,
        #[source]
        source: NameError,
    },
    #[error("{0:?}: expected NAME=VALUE, e.g. sk=lock")]
    SortKeyForm(String),
}

fn parse_attribute_name(s: &str) -> Result<String, DynamoDbFlagError> {
    attribute_name(s).map_err(|source| DynamoDbFlagError::AttributeName {
        name: s.to_string(),
        source,
    })?;
    Ok(s.to_string())
}

fn parse_sort_key(s: &str) -> Result<(String, String), DynamoDbFlagError> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() && !value.is_empty() => {
            sort_key_value(value).map_err(|source| DynamoDbFlagError::SortKeyValue {
                flag: s.to_string(),
                source,
            })?;
            Ok((parse_attribute_name(name)?, value.to_string()))
        }
        _ => Err(DynamoDbFlagError::SortKeyForm(s.to_string())),
    }
}

/// A sort key as a lock file keeps it: `NAME=VALUE`.
mod name_equals_value {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        value: &Option<(String, String)>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some((name, value)) => serializer.serialize_str(&format!("{name}={value}")),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<(String, String)>, D::Error> {
        let text = Option::<String>::deserialize(deserializer)?;
        Ok(text.and_then(|s| {
            s.split_once('=')
                .map(|(n, v)| (n.to_string(), v.to_string()))
        }))
    }
}

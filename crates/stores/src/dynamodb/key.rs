//! A DynamoDB lock key, `dynamodb://TABLE/KEY`, and DynamoDB's name rules: table names
//! 3-255 of `a-z A-Z 0-9 _ . -`; a partition key value at most 2,048 bytes, a sort key
//! value at most 1,024 bytes; key attribute names at most 255 bytes; none with control
//! characters.

use std::fmt;

use crate::store::{StoreKey, TargetError, bad_name, split_two};
use lockwarden_core::names::{self, NameError};

/// Table names: at least this many characters.
pub const TABLE_MIN_LEN: usize = 3;
/// Table names: at most this many characters.
pub const TABLE_MAX_LEN: usize = 255;
/// Partition key values: at most this many bytes of UTF-8.
pub const KEY_MAX_BYTES: usize = 2048;
/// Sort key values: at most this many bytes of UTF-8.
pub const SORT_KEY_MAX_BYTES: usize = 1024;
/// Key attribute names: at most this many bytes of UTF-8.
pub const ATTRIBUTE_NAME_MAX_BYTES: usize = 255;
/// Table names as a regular expression, length included.
pub const TABLE_PATTERN: &str = "^[a-zA-Z0-9_.-]{3,255}$";

const TABLE_RULE: &str = "3-255 letters, digits, underscores, hyphens and dots";

/// A table name.
pub fn table_name(name: &str) -> Result<(), NameError> {
    let ok = (TABLE_MIN_LEN..=TABLE_MAX_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(names::invalid("DynamoDB table name", name, TABLE_RULE))
    }
}

/// The partition key value of a lock item: 1 to 2,048 bytes of UTF-8, no control
/// characters.
pub fn key_value(value: &str) -> Result<(), NameError> {
    names::bounded_text("DynamoDB key", value, KEY_MAX_BYTES)
}

/// The sort key value of a lock item: 1 to 1,024 bytes of UTF-8, no control
/// characters.
pub fn sort_key_value(value: &str) -> Result<(), NameError> {
    names::bounded_text("DynamoDB sort key value", value, SORT_KEY_MAX_BYTES)
}

/// A key attribute name: 1 to 255 bytes of UTF-8, no control characters.
pub fn attribute_name(name: &str) -> Result<(), NameError> {
    names::bounded_text("DynamoDB attribute name", name, ATTRIBUTE_NAME_MAX_BYTES)
}

/// An item in a DynamoDB table (partition key value `key`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DynamoDbKey {
    pub table: String,
    pub key: String,
}

impl StoreKey for DynamoDbKey {
    const KIND: &'static str = "dynamodb";
    const SCHEMES: &'static [&'static str] = &["dynamodb", "ddb"];
    const FORM: &'static str = "dynamodb://TABLE/KEY";
    const ABOUT: &'static str = "DynamoDB item (dynamolock-compatible attributes)";

    fn parse(url: &str, rest: &str) -> Result<DynamoDbKey, TargetError> {
        let (table, key) = split_two(url, rest, "table", "key", Self::FORM)?;
        table_name(table).map_err(|e| bad_name(url, e.named("table name"), Self::FORM))?;
        key_value(key).map_err(|e| bad_name(url, e, Self::FORM))?;
        Ok(DynamoDbKey {
            table: table.to_string(),
            key: key.to_string(),
        })
    }

    fn name(&self) -> &str {
        &self.key
    }
}

impl fmt::Display for DynamoDbKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dynamodb://{}/{}", self.table, self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        assert_eq!(table_name("Locks_v1.x-y"), Ok(()));
        assert!(table_name("ab").is_err());
        assert!(table_name("a b c").is_err());
        assert!(table_name(&"a".repeat(256)).is_err());
    }

    #[test]
    fn values_are_bounded_in_bytes_and_free_of_control_characters() {
        assert_eq!(key_value(&"k".repeat(2048)), Ok(()));
        assert!(key_value(&"k".repeat(2049)).is_err());
        assert_eq!(sort_key_value(&"k".repeat(1024)), Ok(()));
        assert!(sort_key_value(&"k".repeat(1025)).is_err());
        assert!(attribute_name(&"p".repeat(256)).is_err());
        for c in ['\0', '\n', '\u{7f}', '\u{9f}'] {
            let s = format!("a{c}b");
            assert!(key_value(&s).is_err(), "{s:?}");
            assert!(sort_key_value(&s).is_err(), "{s:?}");
            assert!(attribute_name(&s).is_err(), "{s:?}");
        }
    }
}

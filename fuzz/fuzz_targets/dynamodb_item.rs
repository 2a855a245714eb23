//! A DynamoDB item as GetItem returns it, read as a lock record.
#![no_main]
use std::collections::HashMap;

use arbitrary::Arbitrary;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use libfuzzer_sys::fuzz_target;
use lockwarden::backend::dynamodb::parse_item;

/// Mostly lockwarden's and dynamolock's attribute names, so records get far.
const NAMES: &[&str] = &[
    "key",
    "ownerName",
    "leaseDuration",
    "recordVersionNumber",
    "isReleased",
    "data",
    "fence",
    "nonce",
    "acquiredAtMs",
    "renewedAtMs",
];

#[derive(Arbitrary, Debug)]
enum Name {
    Known(u8),
    Other(String),
}

#[derive(Arbitrary, Debug)]
enum Value {
    S(String),
    N(String),
    NumberLike(u64),
    Duration(u16, bool),
    B(Vec<u8>),
    Bool(bool),
    Null,
    L(Vec<Value>),
    M(Vec<(String, Value)>),
    Ss(Vec<String>),
}

impl Value {
    fn into_attribute(self, depth: usize) -> AttributeValue {
        match self {
            Value::S(s) => AttributeValue::S(s),
            Value::N(s) => AttributeValue::N(s),
            Value::NumberLike(n) => AttributeValue::N(n.to_string()),
            Value::Duration(n, ms) => {
                AttributeValue::S(format!("{n}{}", if ms { "ms" } else { "s" }))
            }
            Value::B(b) => AttributeValue::B(Blob::new(b)),
            Value::Bool(b) => AttributeValue::Bool(b),
            Value::Null => AttributeValue::Null(true),
            Value::L(_) | Value::M(_) if depth > 3 => AttributeValue::Null(true),
            Value::L(l) => {
                AttributeValue::L(l.into_iter().map(|v| v.into_attribute(depth + 1)).collect())
            }
            Value::M(m) => AttributeValue::M(
                m.into_iter()
                    .map(|(k, v)| (k, v.into_attribute(depth + 1)))
                    .collect(),
            ),
            Value::Ss(s) => AttributeValue::Ss(s),
        }
    }
}

fuzz_target!(|attributes: Vec<(Name, Value)>| {
    let item: HashMap<String, AttributeValue> = attributes
        .into_iter()
        .map(|(name, value)| {
            let name = match name {
                Name::Known(i) => NAMES[usize::from(i) % NAMES.len()].to_string(),
                Name::Other(s) => s,
            };
            (name, value.into_attribute(0))
        })
        .collect();
    match parse_item(&item) {
        Ok(record) => assert!(!record.lease.is_zero()),
        Err(foreign) => assert!(foreign.what.len() <= 1024, "{} bytes", foreign.what.len()),
    }
});

//! A fenced DynamoDB item ([`FencedObject`]): the item carries the highest fence that
//! wrote it (`fence`, a number) and that fence's lock (`fenceLock`, a string).
//!
//! A write is one `UpdateItem` that SETs only the attributes given (every other
//! attribute of the item stays), with one condition expression:
//!
//! ```text
//! (attribute_not_exists(fence) AND attribute_not_exists(recordVersionNumber)
//!     AND attribute_not_exists(ownerName))
//! OR (fence <= :fence AND fenceLock = :lock)
//! ```
//!
//! so the fence check and the write are one atomic step in DynamoDB itself; the first
//! branch also keeps lock records (dynamolock's and lockwarden's own, which have
//! `recordVersionNumber` and `ownerName`) out. When the condition fails, a consistent
//! read says why (the stored fence, another lock, a lock record).
//!
//! The item's key comes from the table's key schema (DescribeTable): the URL's KEY is
//! the partition key value; a table with a sort key takes its value from
//! `--sort-key NAME=VALUE` (the same flag as lock items; NAME must be the table's sort
//! key). String and number keys are supported.
//!
//! Input and output are DynamoDB JSON, an object of attributes:
//! `{"count":{"N":"3"},"state":{"S":"done"}}`.

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, KeyType, ScalarAttributeType};
use futures::FutureExt;
use serde_json::{Map, Value};
use tokio::sync::OnceCell;

use super::store::{LEASE, OWNER, RVN};
use crate::aws::{RequestGate, fenced_error, fenced_send};
use lockwarden_core::FenceToken;
use lockwarden_core::fenced::{
    Content, Fence, FencedError, FencedObject, FencedRead, MAX_ATTEMPTS, Written, check,
};

/// The highest fence that wrote the item (a number).
pub const FENCE_ATTRIBUTE: &str = "fence";
/// The lock of that fence (a string).
pub const LOCK_ATTRIBUTE: &str = "fenceLock";
/// On a tombstone: `true`.
pub const DELETED_ATTRIBUTE: &str = "fenceDeleted";
/// Attributes a lock record has and data never should: their presence makes an item
/// a lock record.
const LOCK_RECORD_ATTRIBUTES: [&str; 3] = [RVN, OWNER, LEASE];

/// The condition of every fenced write (see the module documentation).
const CONDITION: &str = "(attribute_not_exists(#fence) AND attribute_not_exists(#rvn) \
AND attribute_not_exists(#owner)) OR (#fence <= :fence AND #lock = :lock)";

/// One item in a table, written only with fences.
pub struct FencedDynamoItem {
    client: Client,
    table: String,
    partition_value: String,
    /// `--sort-key NAME=VALUE`, checked against the table's schema on first use.
    sort_key: Option<(String, String)>,
    url: String,
    key: OnceCell<HashMap<String, AttributeValue>>,
    /// The client's bound of requests in flight (`aws::RequestGate`).
    requests: RequestGate,
}

impl FencedDynamoItem {
    pub fn new(
        client: Client,
        table: impl Into<String>,
        partition_value: impl Into<String>,
        sort_key: Option<(String, String)>,
    ) -> Self {
        let (table, partition_value) = (table.into(), partition_value.into());
        let url = format!("dynamodb://{table}/{partition_value}");
        FencedDynamoItem {
            client,
            table,
            partition_value,
            sort_key,
            url,
            key: OnceCell::new(),
            requests: RequestGate::unbounded(),
        }
    }

    /// Sends every request through `gate` (see `DynamoStore::with_request_gate`).
    pub fn with_request_gate(mut self, gate: RequestGate) -> Self {
        self.requests = gate;
        self
    }

    /// The item's key, from the table's key schema (read once).
    async fn item_key(&self) -> Result<&HashMap<String, AttributeValue>, FencedError> {
        self.key.get_or_try_init(|| self.describe_key()).await
    }

    async fn describe_key(&self) -> Result<HashMap<String, AttributeValue>, FencedError> {
        let request = self.client.describe_table().table_name(&self.table);
        let out = fenced_send(&self.requests, "DescribeTable", || request.send())
            .await?
            .map_err(|e| fenced_error(e, "DescribeTable"))?;
        let table = out
            .table()
            .ok_or_else(|| FencedError::store("DescribeTable", "the answer describes no table"))?;
        let type_of = |name: &str| {
            table
                .attribute_definitions()
                .iter()
                .find(|d| d.attribute_name() == name)
                .map(|d| d.attribute_type().clone())
        };
        let mut key = HashMap::new();
        let mut table_sort_key = None;
        for element in table.key_schema() {
            let name = element.attribute_name();
            let value = match element.key_type() {
                KeyType::Hash => self.partition_value.clone(),
                KeyType::Range => {
                    table_sort_key = Some(name.to_string());
                    match &self.sort_key {
                        Some((given, value)) if given == name => value.clone(),
                        Some((given, _)) => {
                            return Err(FencedError::Unsupported(format!(
                                "--sort-key names {given:?}, but the table's sort key is {name:?}"
                            )));
                        }
                        None => {
                            return Err(FencedError::Unsupported(format!(
                                "table {} has the sort key {name:?}: give its value with --sort-key {name}=VALUE",
                                self.table
                            )));
                        }
                    }
                }
                other => {
                    return Err(FencedError::Unsupported(format!(
                        "key attribute {name:?} of an unknown key type {other:?}"
                    )));
                }
            };
            let value = match type_of(name) {
                Some(ScalarAttributeType::S) => AttributeValue::S(value),
                Some(ScalarAttributeType::N) => {
                    if !is_number(&value) {
                        return Err(FencedError::InvalidData(format!(
                            "key attribute {name:?} is a number, {value:?} is not"
                        )));
                    }
                    AttributeValue::N(value)
                }
                other => {
                    return Err(FencedError::Unsupported(format!(
                        "key attribute {name:?} is of type {other:?}: only string and number keys are supported"
                    )));
                }
            };
            key.insert(name.to_string(), value);
        }
        if let (None, Some((given, _))) = (&table_sort_key, &self.sort_key) {
            return Err(FencedError::Unsupported(format!(
                "--sort-key names {given:?}, but table {} has no sort key",
                self.table
            )));
        }
        Ok(key)
    }

    /// The item as stored, read consistently.
    async fn read(&self) -> Result<Option<HashMap<String, AttributeValue>>, FencedError> {
        let key = self.item_key().await?.clone();
        let request = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key))
            .consistent_read(true);
        let out = fenced_send(&self.requests, "GetItem", || request.send())
            .await?
            .map_err(|e| fenced_error(e, "GetItem"))?;
        Ok(out.item)
    }

    /// Why a fenced write's condition failed, from the item as it is now; `Ok` when it
    /// would pass now (the item changed again in between: try again).
    async fn why_refused(&self, fence: &Fence) -> Result<(), FencedError> {
        let Some(item) = self.read().await? else {
            return Ok(());
        };
        refuse_lock_record(&item)?;
        let (stored, deleted) = fence_of(&item)?;
        check(stored.as_ref(), deleted, fence)
    }

    /// Runs `write` (one conditional request) until it applies, or the item says why
    /// it must not.
    async fn fenced<F, Fut, E>(&self, fence: &Fence, op: &str, write: F) -> Result<(), FencedError>
    where
        F: Fn() -> Fut,
        // Boxed: an SDK error is some 400 bytes, moved through every attempt.
        Fut: std::future::Future<Output = Result<(), Box<SdkError<E, HttpResponse>>>>,
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        for _ in 0..MAX_ATTEMPTS {
            let Err(e) = fenced_send(&self.requests, op, &write).await? else {
                return Ok(());
            };
            match *e {
                SdkError::ServiceError(ref failed)
                    if failed.err().code() == Some("ConditionalCheckFailedException") =>
                {
                    self.why_refused(fence).await?;
                }
                e => return Err(fenced_error(e, op)),
            }
        }
        Err(FencedError::Contended {
            attempts: MAX_ATTEMPTS,
            last: format!("{op}: the condition failed, then held on a consistent read"),
        })
    }
}

/// `#fence`, `#lock`, `#rvn`, `#owner` and `:fence`, `:lock`: what [`CONDITION`] uses.
fn condition_names(fence: &Fence) -> (HashMap<String, String>, HashMap<String, AttributeValue>) {
    let names = HashMap::from([
        ("#fence".to_string(), FENCE_ATTRIBUTE.to_string()),
        ("#lock".to_string(), LOCK_ATTRIBUTE.to_string()),
        ("#rvn".to_string(), RVN.to_string()),
        ("#owner".to_string(), OWNER.to_string()),
    ]);
    let values = HashMap::from([
        (
            ":fence".to_string(),
            AttributeValue::N(fence.token.to_string()),
        ),
        (":lock".to_string(), AttributeValue::S(fence.lock.clone())),
    ]);
    (names, values)
}

#[async_trait]
impl FencedObject for FencedDynamoItem {
    fn url(&self) -> &str {
        &self.url
    }

    fn check_data(&self, data: &[u8]) -> Result<(), FencedError> {
        parse_attributes(data, &HashMap::new()).map(|_| ())
    }

    async fn put(&self, fence: &Fence, data: &[u8]) -> Result<Written, FencedError> {
        // Malformed input is refused before any request.
        let attributes = parse_attributes(data, &HashMap::new())?;
        let key = self.item_key().await?.clone();
        if let Some(name) = attributes.keys().find(|name| key.contains_key(*name)) {
            return Err(FencedError::InvalidData(key_attribute(name)));
        }
        let (mut names, mut values) = condition_names(fence);
        names.insert("#deleted".into(), DELETED_ATTRIBUTE.into());
        let mut sets = Vec::new();
        // Sorted, so that the request is the same for the same input.
        let mut attributes: Vec<_> = attributes.into_iter().collect();
        attributes.sort_by(|a, b| a.0.cmp(&b.0));
        for (i, (name, value)) in attributes.into_iter().enumerate() {
            names.insert(format!("#a{i}"), name);
            values.insert(format!(":a{i}"), value);
            sets.push(format!("#a{i} = :a{i}"));
        }
        sets.push("#fence = :fence".into());
        sets.push("#lock = :lock".into());
        // Writing over a tombstone brings the item back.
        let update = format!("SET {} REMOVE #deleted", sets.join(", "));
        self.fenced(fence, "UpdateItem", || {
            self.client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(key.clone()))
                .update_expression(&update)
                .condition_expression(CONDITION)
                .set_expression_attribute_names(Some(names.clone()))
                .set_expression_attribute_values(Some(values.clone()))
                .send()
                .map(|r| r.map(|_| ()).map_err(Box::new))
        })
        .await?;
        Ok(Written { version: None })
    }

    async fn get(&self) -> Result<Option<FencedRead>, FencedError> {
        let Some(item) = self.read().await? else {
            return Ok(None);
        };
        refuse_lock_record(&item)?;
        let (written_by, deleted) = fence_of(&item)?;
        if deleted {
            return Ok(Some(FencedRead {
                written_by,
                content: Content::Deleted,
            }));
        }
        let key = self.item_key().await?;
        let data: Map<String, Value> = item
            .iter()
            .filter(|(name, _)| !key.contains_key(*name) && !is_ours(name))
            .map(|(name, value)| (name.clone(), attribute_to_json(value)))
            .collect();
        Ok(Some(FencedRead {
            written_by,
            content: Content::Data(Value::Object(data).to_string().into_bytes()),
        }))
    }

    /// A delete is a conditional `PutItem` of the key and the fence alone, marked
    /// deleted: it drops every data attribute atomically and keeps the fence, which a
    /// conditional `DeleteItem` would remove — and with it the only thing that stops
    /// a stale holder from recreating the item (`attribute_not_exists(fence)` would
    /// hold again).
    async fn delete(&self, fence: &Fence) -> Result<Written, FencedError> {
        let mut item = self.item_key().await?.clone();
        item.insert(
            FENCE_ATTRIBUTE.into(),
            AttributeValue::N(fence.token.to_string()),
        );
        item.insert(LOCK_ATTRIBUTE.into(), AttributeValue::S(fence.lock.clone()));
        item.insert(DELETED_ATTRIBUTE.into(), AttributeValue::Bool(true));
        let (names, values) = condition_names(fence);
        self.fenced(fence, "PutItem", || {
            self.client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(item.clone()))
                .condition_expression(CONDITION)
                .set_expression_attribute_names(Some(names.clone()))
                .set_expression_attribute_values(Some(values.clone()))
                .send()
                .map(|r| r.map(|_| ()).map_err(Box::new))
        })
        .await?;
        Ok(Written { version: None })
    }
}

fn is_ours(name: &str) -> bool {
    [FENCE_ATTRIBUTE, LOCK_ATTRIBUTE, DELETED_ATTRIBUTE].contains(&name)
}

fn refuse_lock_record(item: &HashMap<String, AttributeValue>) -> Result<(), FencedError> {
    match LOCK_RECORD_ATTRIBUTES
        .iter()
        .find(|a| item.contains_key(**a))
    {
        Some(attribute) => {
            let owner = item
                .get(OWNER)
                .and_then(|o| o.as_s().ok())
                .map(|o| format!(", owner {o:?}"))
                .unwrap_or_default();
            Err(FencedError::LockRecord {
                what: format!("a lock item: it has {attribute}{owner}"),
            })
        }
        None => Ok(()),
    }
}

/// The fence and tombstone mark of an item.
fn fence_of(item: &HashMap<String, AttributeValue>) -> Result<(Option<Fence>, bool), FencedError> {
    let Some(token) = item.get(FENCE_ATTRIBUTE) else {
        return Ok((None, false));
    };
    // Unreadable fence attributes are refused rather than overwritten.
    let token = token
        .as_n()
        .ok()
        .and_then(|n| n.parse::<u64>().ok())
        .ok_or_else(|| {
            FencedError::Unsupported(format!(
                "the item's {FENCE_ATTRIBUTE} attribute {token:?} is not a fence (a whole number)"
            ))
        })?;
    let lock = item
        .get(LOCK_ATTRIBUTE)
        .and_then(|l| l.as_s().ok())
        .cloned()
        .unwrap_or_default();
    let deleted = matches!(
        item.get(DELETED_ATTRIBUTE),
        Some(AttributeValue::Bool(true))
    );
    Ok((
        Some(Fence {
            token: FenceToken(token),
            lock,
        }),
        deleted,
    ))
}

/// Parses DynamoDB JSON, an object of attributes, for a put: no key attribute, none
/// of ours.
pub fn parse_attributes(
    data: &[u8],
    key: &HashMap<String, AttributeValue>,
) -> Result<HashMap<String, AttributeValue>, FencedError> {
    let invalid = |m: String| FencedError::InvalidData(m);
    let value: Value = serde_json::from_slice(data).map_err(|e| {
        invalid(format!(
            "not DynamoDB JSON ({e}); expected an object of attributes such as {{\"count\":{{\"N\":\"3\"}},\"state\":{{\"S\":\"done\"}}}}"
        ))
    })?;
    let Value::Object(map) = value else {
        return Err(invalid(
            "DynamoDB JSON must be an object of attributes, e.g. {\"state\":{\"S\":\"done\"}}"
                .into(),
        ));
    };
    let mut attributes = HashMap::new();
    for (name, value) in map {
        if name.is_empty() {
            return Err(invalid("an attribute name is empty".into()));
        }
        if key.contains_key(&name) {
            return Err(invalid(key_attribute(&name)));
        }
        if is_ours(&name) || LOCK_RECORD_ATTRIBUTES.contains(&name.as_str()) {
            return Err(invalid(format!(
                "{name:?} is reserved: lockwarden keeps the fence there"
            )));
        }
        let attribute =
            attribute_from_json(&value).map_err(|e| invalid(format!("{name:?}: {e}")))?;
        attributes.insert(name, attribute);
    }
    Ok(attributes)
}

fn key_attribute(name: &str) -> String {
    format!("{name:?} is a key attribute: the URL (and --sort-key) give the key")
}

fn is_number(text: &str) -> bool {
    let t = text.trim();
    !t.is_empty() && t == text && t.parse::<f64>().is_ok_and(f64::is_finite)
}

/// The form of one DynamoDB JSON value, for messages.
const ATTRIBUTE_FORM: &str =
    "expected one type and its value, e.g. {\"S\":\"text\"} or {\"N\":\"3\"}";

/// A DynamoDB JSON value that is not an attribute; `kind` is the type it names.
#[derive(Debug, thiserror::Error)]
enum AttributeJsonError {
    #[error("{0}: {ATTRIBUTE_FORM}", ATTRIBUTE_FORM = ATTRIBUTE_FORM)]
    NotOneType(Value),
    #[error("{kind}: {value} is not a string")]
    NotAString { kind: String, value: Value },
    #[error("{kind}: {text:?} is not a number")]
    NotANumber { kind: String, text: String },
    #[error("{kind}: {text:?} is not base64")]
    NotBase64 { kind: String, text: String },
    #[error("{kind}: {value} is not a list")]
    NotAList { kind: String, value: Value },
    #[error("BOOL: {0} is not true or false")]
    NotABool(Value),
    #[error("NULL: {0}: expected true")]
    NullNotTrue(Value),
    #[error("M: {0} is not an object")]
    NotAMap(Value),
    #[error("unknown type {0:?}: {ATTRIBUTE_FORM}", ATTRIBUTE_FORM = ATTRIBUTE_FORM)]
    UnknownType(String),
}

/// One DynamoDB JSON value: `{"S": "…"}`, `{"N": "3"}`, `{"B": "base64"}`,
/// `{"BOOL": true}`, `{"NULL": true}`, `{"L": […]}`, `{"M": {…}}`, `{"SS": […]}`,
/// `{"NS": […]}`, `{"BS": […]}`.
fn attribute_from_json(value: &Value) -> Result<AttributeValue, AttributeJsonError> {
    let Some((kind, inner)) = value
        .as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.iter().next())
    else {
        return Err(AttributeJsonError::NotOneType(value.clone()));
    };
    let string = |v: &Value| {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| AttributeJsonError::NotAString {
                kind: kind.clone(),
                value: v.clone(),
            })
    };
    let number = |v: &Value| {
        let n = string(v)?;
        if is_number(&n) {
            Ok(n)
        } else {
            Err(AttributeJsonError::NotANumber {
                kind: kind.clone(),
                text: n,
            })
        }
    };
    let binary = |v: &Value| {
        let text = string(v)?;
        match base64_decode(&text) {
            Some(bytes) => Ok(Blob::new(bytes)),
            None => Err(AttributeJsonError::NotBase64 {
                kind: kind.clone(),
                text,
            }),
        }
    };
    let list = |v: &Value| {
        v.as_array()
            .cloned()
            .ok_or_else(|| AttributeJsonError::NotAList {
                kind: kind.clone(),
                value: v.clone(),
            })
    };
    Ok(match kind.as_str() {
        "S" => AttributeValue::S(string(inner)?),
        "N" => AttributeValue::N(number(inner)?),
        "B" => AttributeValue::B(binary(inner)?),
        "BOOL" => AttributeValue::Bool(
            inner
                .as_bool()
                .ok_or_else(|| AttributeJsonError::NotABool(inner.clone()))?,
        ),
        "NULL" if inner == &Value::Bool(true) => AttributeValue::Null(true),
        "NULL" => return Err(AttributeJsonError::NullNotTrue(inner.clone())),
        "L" => AttributeValue::L(
            list(inner)?
                .iter()
                .map(attribute_from_json)
                .collect::<Result<_, _>>()?,
        ),
        "M" => AttributeValue::M(
            inner
                .as_object()
                .ok_or_else(|| AttributeJsonError::NotAMap(inner.clone()))?
                .iter()
                .map(|(k, v)| Ok((k.clone(), attribute_from_json(v)?)))
                .collect::<Result<_, AttributeJsonError>>()?,
        ),
        "SS" => AttributeValue::Ss(list(inner)?.iter().map(string).collect::<Result<_, _>>()?),
        "NS" => AttributeValue::Ns(list(inner)?.iter().map(number).collect::<Result<_, _>>()?),
        "BS" => AttributeValue::Bs(list(inner)?.iter().map(binary).collect::<Result<_, _>>()?),
        other => return Err(AttributeJsonError::UnknownType(other.to_string())),
    })
}

/// An attribute as DynamoDB JSON.
fn attribute_to_json(value: &AttributeValue) -> Value {
    let one = |kind: &str, v: Value| Value::Object(Map::from_iter([(kind.to_string(), v)]));
    let strings = |v: &[String]| Value::Array(v.iter().cloned().map(Value::String).collect());
    match value {
        AttributeValue::S(s) => one("S", Value::String(s.clone())),
        AttributeValue::N(n) => one("N", Value::String(n.clone())),
        AttributeValue::B(b) => one("B", Value::String(base64_encode(b.as_ref()))),
        AttributeValue::Bool(b) => one("BOOL", Value::Bool(*b)),
        AttributeValue::Null(_) => one("NULL", Value::Bool(true)),
        AttributeValue::L(l) => one("L", Value::Array(l.iter().map(attribute_to_json).collect())),
        AttributeValue::M(m) => one(
            "M",
            Value::Object(
                m.iter()
                    .map(|(k, v)| (k.clone(), attribute_to_json(v)))
                    .collect(),
            ),
        ),
        AttributeValue::Ss(v) => one("SS", strings(v)),
        AttributeValue::Ns(v) => one("NS", strings(v)),
        AttributeValue::Bs(v) => one(
            "BS",
            Value::Array(
                v.iter()
                    .map(|b| Value::String(base64_encode(b.as_ref())))
                    .collect(),
            ),
        ),
        _ => one("S", Value::String(format!("{value:?}"))),
    }
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (*b as u32) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(BASE64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let bytes = text.trim_end_matches('=').as_bytes();
    if !text.len().is_multiple_of(4) || text.len() - bytes.len() > 2 {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, b) in chunk.iter().enumerate() {
            let v = BASE64.iter().position(|c| c == b)? as u32;
            n |= v << (18 - 6 * i);
        }
        for i in 0..chunk.len().saturating_sub(1) {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> HashMap<String, AttributeValue> {
        HashMap::from([("pk".to_string(), AttributeValue::S("k".into()))])
    }

    #[test]
    fn dynamodb_json_parses_every_type() {
        let data = br#"{"count":{"N":"3"},"state":{"S":"done"},"ok":{"BOOL":true},
            "none":{"NULL":true},"raw":{"B":"aGk="},"list":{"L":[{"N":"1"},{"S":"a"}]},
            "map":{"M":{"x":{"S":"y"}}},"ss":{"SS":["a","b"]},"ns":{"NS":["1","2.5"]}}"#;
        let attributes = parse_attributes(data, &key()).unwrap();
        assert_eq!(attributes["count"], AttributeValue::N("3".into()));
        assert_eq!(
            attributes["raw"],
            AttributeValue::B(Blob::new(b"hi".to_vec()))
        );
        assert_eq!(attributes.len(), 9);
        for (name, value) in &attributes {
            let back = attribute_from_json(&attribute_to_json(value)).unwrap();
            assert_eq!(&back, value, "{name}");
        }
    }

    #[test]
    fn malformed_dynamodb_json_says_what_is_wrong() {
        for (data, expect) in [
            ("{", "not DynamoDB JSON"),
            ("[]", "must be an object"),
            (r#"{"a":"text"}"#, "expected one type"),
            (r#"{"a":{"N":"three"}}"#, "\"three\" is not a number"),
            (r#"{"a":{"N":3}}"#, "is not a string"),
            (r#"{"a":{"X":"1"}}"#, "unknown type \"X\""),
            (r#"{"a":{"B":"!!"}}"#, "not base64"),
            (r#"{"pk":{"S":"x"}}"#, "key attribute"),
            (r#"{"fence":{"N":"9"}}"#, "reserved"),
            (r#"{"ownerName":{"S":"x"}}"#, "reserved"),
        ] {
            let err = parse_attributes(data.as_bytes(), &key())
                .unwrap_err()
                .to_string();
            assert!(err.contains(expect), "{data}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn base64_round_trips() {
        for bytes in [&b""[..], b"a", b"ab", b"abc", b"abcd", &[0, 255, 128, 7, 9]] {
            let text = base64_encode(bytes);
            assert_eq!(base64_decode(&text).as_deref(), Some(bytes), "{text}");
        }
        assert_eq!(base64_encode(b"hi"), "aGk=");
    }

    #[test]
    fn lock_items_are_recognised() {
        let mut item = key();
        item.insert(RVN.into(), AttributeValue::S("v".into()));
        assert!(refuse_lock_record(&item).is_err());
        assert!(refuse_lock_record(&key()).is_ok());
    }
}

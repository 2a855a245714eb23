//! The DynamoDB [`RecordStore`]: one lock key, one item (see the module above).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ReturnValuesOnConditionCheckFailure, ScalarAttributeType, TableStatus,
};

use super::update::{SignedUpdates, Update, UpdateReply};
use crate::aws::{
    RequestGate, SendError, describe, reply_detail, status_and_code, store_admit, store_send,
};
use crate::terraform::{self, LockInfo};
use lockwarden_core::duration::{format_duration, parse_duration};
use lockwarden_core::history;
use lockwarden_core::{
    ANOTHER_TOOL_NONCE_PREFIX, FenceToken, ForeignRecord, HolderSet, LockRecord, LockState,
    RecordStore, StoreError, Stored, UnknownFields, Version,
};

use super::DEFAULT_PARTITION_KEY;

pub(super) const OWNER: &str = "ownerName";
pub(super) const LEASE: &str = "leaseDuration";
pub(super) const RVN: &str = "recordVersionNumber";
const RELEASED: &str = "isReleased";
const DATA: &str = "data";
const FENCE: &str = "fence";
const NONCE: &str = "nonce";
/// The `recordVersionNumber` lockwarden wrote last (see the module documentation).
const LOCKWARDEN_RVN: &str = "lockwardenRvn";
/// dynamolock's "released" marker value (it tests presence, and conditions on "1").
const RELEASED_MARK: &str = "1";
const ACQUIRED: &str = "acquiredAtMs";
const RENEWED: &str = "renewedAtMs";
/// The holder set of a key with more than one permit (JSON); absent on mutexes.
const HOLDERS: &str = "holders";
/// The key's holder history (JSON text, `lockwarden_core::history`); absent when empty.
const HISTORY: &str = "history";
/// The key's memory of completed runs (JSON text, `lockwarden_core::runs`, docs/design.md
/// §6.7); absent on keys never used with a run key.
const RUNS: &str = "runs";
/// Every attribute this build writes: a record's unknown fields never take these names.
const OURS: [&str; 14] = [
    OWNER,
    LEASE,
    RVN,
    RELEASED,
    DATA,
    FENCE,
    NONCE,
    LOCKWARDEN_RVN,
    ACQUIRED,
    RENEWED,
    HOLDERS,
    HISTORY,
    RUNS,
    terraform::DYNAMODB_INFO_ATTRIBUTE,
];

/// Where the lock items live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableLayout {
    pub table: String,
    pub partition_key: String,
    /// Optional sort key attribute name and the value lockwarden's items use for it.
    pub sort_key: Option<(String, String)>,
}

impl TableLayout {
    pub fn new(table: impl Into<String>) -> Self {
        TableLayout {
            table: table.into(),
            partition_key: DEFAULT_PARTITION_KEY.into(),
            sort_key: None,
        }
    }
}

/// One lock key in a DynamoDB table.
pub struct DynamoStore {
    client: Client,
    layout: TableLayout,
    key: String,
    url: String,
    /// Hold the item as Terraform and OpenTofu hold theirs in their lock table
    /// (`terraformCompatible`): with an `Info` they parse. Without it an item of such a
    /// table is read, never written.
    terraform_compatible: bool,
    /// The client's bound of requests in flight (`aws::RequestGate`).
    requests: RequestGate,
    /// The client's writes without the SDK's orchestrator (`update.rs`), when given.
    updates: Option<Arc<SignedUpdates>>,
}

impl DynamoStore {
    pub fn new(client: Client, layout: TableLayout, key: impl Into<String>) -> Self {
        let key = key.into();
        let url = format!("dynamodb://{}/{key}", layout.table);
        DynamoStore {
            client,
            layout,
            key,
            url,
            terraform_compatible: false,
            requests: RequestGate::unbounded(),
            updates: None,
        }
    }

    /// Sends the item's `UpdateItem`s as `updates` signs them, not through the SDK's
    /// orchestrator (`update.rs`; `connect` passes the process client's).
    pub fn with_signed_updates(mut self, updates: Arc<SignedUpdates>) -> Self {
        self.updates = Some(updates);
        self
    }

    /// Sends the lock's requests through `gate`: the bound of requests in flight of the
    /// client's (`connect` passes the one of the process's client; without it, none).
    pub fn with_request_gate(mut self, gate: RequestGate) -> Self {
        self.requests = gate;
        self
    }

    /// Holds the item as Terraform and OpenTofu hold their state lock (the table must
    /// be their lock table: partition key `LockID`, the key `<bucket>/<state key>`);
    /// the caller deletes it on release, as they need.
    pub fn terraform_compatible(mut self, on: bool) -> Self {
        self.terraform_compatible = on;
        self
    }

    /// Whether the table is keyed as the tools' lock table (`LockID`).
    fn is_state_lock_table(&self) -> bool {
        self.layout.partition_key == terraform::DYNAMODB_LOCK_KEY
    }

    /// Whether the item is one the tools would lock: in their table, under a state's
    /// `<bucket>/<state key>` (their `LockID`s always name a bucket and a key). Other
    /// items of a table keyed `LockID` are ordinary lockwarden locks.
    fn is_state_lock_item(&self) -> bool {
        self.is_state_lock_table() && self.key.contains('/')
    }

    /// The `Info` attribute a write of `record` sets (with `terraformCompatible`), or
    /// why the item may not be written: a state's item of the tools' lock table without
    /// `Info` would keep them out for good (they neither wait for nor force-unlock a
    /// lock whose `Info` they cannot read).
    fn state_lock_info(&self, record: &LockRecord) -> Result<Option<String>, StoreError> {
        match (self.is_state_lock_table(), self.terraform_compatible) {
            (true, true) => Ok(Some(LockInfo::of_record(record, &self.key).to_go_json())),
            (true, false) if self.is_state_lock_item() => Err(StoreError::Rejected(format!(
                "{} is an item of a Terraform/OpenTofu lock table (partition key {}): \
                 lockwarden holds it only as they do, with --terraform-compatible \
                 (spec.backend.dynamodb.terraformCompatible: true)",
                self.url,
                terraform::DYNAMODB_LOCK_KEY
            ))),
            (false, true) => Err(StoreError::Rejected(format!(
                "{}: --terraform-compatible holds an item of a Terraform/OpenTofu lock table, \
                 whose partition key is {} (--partition-key {})",
                self.url,
                terraform::DYNAMODB_LOCK_KEY,
                terraform::DYNAMODB_LOCK_KEY
            ))),
            (_, false) => Ok(None),
        }
    }

    fn item_key(&self) -> HashMap<String, AttributeValue> {
        let mut k = HashMap::from([(
            self.layout.partition_key.clone(),
            AttributeValue::S(self.key.clone()),
        )]);
        if let Some((name, value)) = &self.layout.sort_key {
            k.insert(name.clone(), AttributeValue::S(value.clone()));
        }
        k
    }

    /// Creates the table (on-demand billing) if it does not exist, and waits until it
    /// is active.
    pub async fn ensure_table(&self) -> Result<(), StoreError> {
        let l = &self.layout;
        let mut req = self
            .client
            .create_table()
            .table_name(&l.table)
            .billing_mode(BillingMode::PayPerRequest)
            .attribute_definitions(attr_def(&l.partition_key))
            .key_schema(key_elem(&l.partition_key, KeyType::Hash));
        if let Some((sk, _)) = &l.sort_key {
            req = req
                .attribute_definitions(attr_def(sk))
                .key_schema(key_elem(sk, KeyType::Range));
        }
        match req.send().await {
            Ok(_) => {}
            Err(SdkError::ServiceError(e)) if e.err().is_resource_in_use_exception() => {}
            Err(e) => {
                return Err(StoreError::Rejected(format!(
                    "creating table {}: {}",
                    l.table,
                    describe(&e)
                )));
            }
        }
        for _ in 0..600 {
            let out = self
                .client
                .describe_table()
                .table_name(&l.table)
                .send()
                .await
                .map_err(|e| {
                    StoreError::Unavailable(format!(
                        "describing table {}: {}",
                        l.table,
                        describe(&e)
                    ))
                })?;
            if out.table().and_then(|t| t.table_status()) == Some(&TableStatus::Active) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(StoreError::Unavailable(format!(
            "table {} did not become ACTIVE within 60s",
            l.table
        )))
    }

    fn parse(&self, item: &HashMap<String, AttributeValue>) -> Stored {
        let rvn = item.get(RVN).and_then(|v| v.as_s().ok());
        let version = Version(rvn.cloned().unwrap_or_default());
        // The tools' own lock: `LockID` and `Info`, none of the lock attributes.
        let tools_info = item
            .get(terraform::DYNAMODB_INFO_ATTRIBUTE)
            .and_then(|v| v.as_s().ok())
            .filter(|_| rvn.is_none());
        let record = match tools_info {
            Some(info) => LockInfo::parse(info.as_bytes(), Some(&self.key))
                .map(|info| info.foreign_record(""))
                .map_err(|why| ForeignRecord::from_bytes(&why.to_string(), info.as_bytes())),
            None => parse_item(item),
        };
        Stored { record, version }
    }

    async fn update(
        &self,
        record: &LockRecord,
        condition: &str,
        expected: Option<&Version>,
    ) -> Result<Version, StoreError> {
        let info = self.state_lock_info(record)?;
        // The update's expression and values are built once admitted, like the rest of
        // the request: behind an overloaded store every held lock keeps a renewal
        // waiting for the gate, and its attribute values are a map of a dozen strings
        // (docs/design.md §3, "Requests in flight are bounded").
        let expression_of = move || {
            let UpdateOf {
                mut expression,
                mut names,
                mut values,
            } = update_of(record, &self.layout);
            if let Some(info) = info {
                // SET comes first in the expression: one more assignment of it.
                expression = expression.replacen("SET ", "SET #info = :info, ", 1);
                names.push(("#info".into(), terraform::DYNAMODB_INFO_ATTRIBUTE));
                values.insert(":info".into(), AttributeValue::S(info));
            }
            if let Some(v) = expected {
                values.insert(":expected".into(), AttributeValue::S(v.0.clone()));
            }
            // Only name what the condition uses besides the update's own names.
            if !condition.contains("#pk") {
                names.retain(|(placeholder, _)| placeholder != "#pk");
            }
            (expression, names, values)
        };
        if let Some(updates) = &self.updates
            && let Some(target) = updates.target().await
        {
            let update = || {
                let (expression, names, values) = expression_of();
                updates.send(
                    target,
                    Update {
                        table: &self.layout.table,
                        key: self.item_key(),
                        expression,
                        condition,
                        names,
                        values,
                    },
                )
            };
            let outcome = store_send(&self.requests, "UpdateItem", &self.url, update).await?;
            return self.classify_signed_update(outcome, record);
        }
        // Built once admitted: a request waiting for the gate is then this closure, not
        // the SDK's input.
        let update = || {
            let (expression, names, values) = expression_of();
            self.client
                .update_item()
                .table_name(&self.layout.table)
                .set_key(Some(self.item_key()))
                .update_expression(expression)
                .condition_expression(condition)
                .set_expression_attribute_names(Some(
                    names
                        .iter()
                        .map(|(placeholder, name)| (placeholder.to_string(), name.to_string()))
                        .collect(),
                ))
                .set_expression_attribute_values(Some(values))
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .send()
        };
        match store_send(&self.requests, "UpdateItem", &self.url, update).await? {
            Ok(_) => Ok(Version(record.revision.clone())),
            Err(e) => Err(self.classify_write(e)),
        }
    }

    /// What a signed write's outcome (`update.rs`) means.
    fn classify_signed_update(
        &self,
        outcome: Result<UpdateReply, SendError>,
        record: &LockRecord,
    ) -> Result<Version, StoreError> {
        let reply = outcome.map_err(|e| e.into_store_error("UpdateItem", &self.url))?;
        if (200..300).contains(&reply.status) {
            return Ok(Version(record.revision.clone()));
        }
        if reply.code.as_deref() == Some("ConditionalCheckFailedException") {
            return Err(StoreError::Conflict {
                current: reply.item.as_ref().map(|item| Box::new(self.parse(item))),
            });
        }
        let detail = reply_detail(
            reply.status,
            reply.code.as_deref(),
            reply.message.as_deref(),
        );
        Err(classify_reply(reply.status, reply.code.as_deref(), detail))
    }

    fn classify_write<E>(&self, err: SdkError<E, HttpResponse>) -> StoreError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static + AsConditionFailure,
    {
        if let SdkError::ServiceError(e) = &err
            && let Some(item) = e.err().condition_failure_item()
        {
            return StoreError::Conflict {
                current: item.map(|i| Box::new(self.parse(i))),
            };
        }
        classify(err, &self.url)
    }
}

/// Access to the item DynamoDB returns with a failed condition (`ALL_OLD`).
pub trait AsConditionFailure {
    /// `Some(item)` if this is a condition failure (`item` is `None` when no item existed).
    fn condition_failure_item(&self) -> Option<Option<&HashMap<String, AttributeValue>>>;
}

impl AsConditionFailure for aws_sdk_dynamodb::operation::update_item::UpdateItemError {
    fn condition_failure_item(&self) -> Option<Option<&HashMap<String, AttributeValue>>> {
        match self {
            Self::ConditionalCheckFailedException(e) => Some(e.item()),
            _ => None,
        }
    }
}

impl AsConditionFailure for aws_sdk_dynamodb::operation::delete_item::DeleteItemError {
    fn condition_failure_item(&self) -> Option<Option<&HashMap<String, AttributeValue>>> {
        match self {
            Self::ConditionalCheckFailedException(e) => Some(e.item()),
            _ => None,
        }
    }
}

fn classify<E>(err: SdkError<E, HttpResponse>, url: &str) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let (status, code) = status_and_code(&err);
    let detail = describe(&err);
    match status {
        Some(status) => classify_reply(status, code.as_deref(), detail),
        // A code without a reply cannot be; no reply: the request may have applied.
        None => match &err {
            SdkError::ConstructionFailure(_) => StoreError::Rejected(detail),
            _ => StoreError::Indeterminate(format!("{url}: {detail}")),
        },
    }
}

/// What a reply with HTTP `status` and DynamoDB error `code` means; `detail` says what
/// failed, for the message.
fn classify_reply(status: u16, code: Option<&str>, detail: String) -> StoreError {
    match (status, code) {
        // Throttling and transaction conflicts are definite refusals: retry later.
        (
            _,
            Some(
                "ProvisionedThroughputExceededException"
                | "ThrottlingException"
                | "RequestLimitExceeded"
                | "TransactionConflictException",
            ),
        ) => StoreError::Unavailable(detail),
        (_, Some("ResourceNotFoundException")) => {
            StoreError::Rejected(format!("table not found: {detail}"))
        }
        // 5xx, or success with a reply we cannot read: the write may have applied.
        (s, _) if s >= 500 || (200..300).contains(&s) => StoreError::Indeterminate(detail),
        _ => StoreError::Rejected(detail),
    }
}

fn attr_def(name: &str) -> AttributeDefinition {
    AttributeDefinition::builder()
        .attribute_name(name)
        .attribute_type(ScalarAttributeType::S)
        .build()
        .expect("attribute definition has name and type")
}

fn key_elem(name: &str, kind: KeyType) -> KeySchemaElement {
    KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(kind)
        .build()
        .expect("key schema element has name and type")
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The `UpdateItem` that writes `record` in full: the expression and its attribute
/// names and values (the caller adds its condition's). A renewal's hot path (issue 45):
/// the names borrow what they name and the expression is written into one buffer.
struct UpdateOf<'a> {
    expression: String,
    names: ExpressionNames<'a>,
    values: HashMap<String, AttributeValue>,
}

/// The attribute names of an update: placeholder (`#owner`) and the name it stands for.
pub(crate) type ExpressionNames<'a> = Vec<(Cow<'static, str>, &'a str)>;

/// What every write of a lock item sets, in that order.
const ALWAYS_SET: &str = "SET #owner = :owner, #lease = :lease, #rvn = :rvn, \
                          #lwrvn = :rvn, #fence = :fence, #nonce = :nonce, #acq = :acq, \
                          #ren = :ren";

/// Room for a lock item's update expression, so that it seldom grows while written.
const EXPRESSION_CAPACITY: usize = 256;

fn update_of<'a>(record: &'a LockRecord, layout: &'a TableLayout) -> UpdateOf<'a> {
    let mut names = attribute_names(layout);
    let mut values = always_written_values(record);
    let mut expression = String::with_capacity(EXPRESSION_CAPACITY);
    expression.push_str(ALWAYS_SET);
    let mut remove = String::new();
    for (name, placeholder, value) in optional_values(record) {
        match value {
            Some(value) => {
                for part in [", ", name, " = ", placeholder] {
                    expression.push_str(part);
                }
                values.insert(placeholder.into(), value);
            }
            None => {
                remove.push_str(if remove.is_empty() { " REMOVE " } else { ", " });
                remove.push_str(name);
            }
        }
    }
    for (i, (name, value)) in unknown_fields(record, layout).enumerate() {
        names.push((format!("#u{i}").into(), name.as_str()));
        values.insert(format!(":u{i}"), attribute_of(value));
        expression.push_str(&format!(", #u{i} = :u{i}"));
    }
    expression.push_str(&remove);
    UpdateOf {
        expression,
        names,
        values,
    }
}

/// The placeholders of the attribute names an update of a lock item uses.
fn attribute_names(layout: &TableLayout) -> ExpressionNames<'_> {
    let mut names = Vec::with_capacity(16);
    names.push(("#pk".into(), layout.partition_key.as_str()));
    names.extend(
        [
            ("#owner", OWNER),
            ("#lease", LEASE),
            ("#rvn", RVN),
            ("#lwrvn", LOCKWARDEN_RVN),
            ("#rel", RELEASED),
            ("#fence", FENCE),
            ("#nonce", NONCE),
            ("#acq", ACQUIRED),
            ("#ren", RENEWED),
            ("#data", DATA),
            ("#holders", HOLDERS),
            ("#history", HISTORY),
            ("#runs", RUNS),
        ]
        .map(|(placeholder, name)| (Cow::Borrowed(placeholder), name)),
    );
    names
}

/// The values of the attributes every write of a lock item sets.
fn always_written_values(record: &LockRecord) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (
            ":owner".to_string(),
            AttributeValue::S(record.holder.clone()),
        ),
        (
            ":lease".to_string(),
            AttributeValue::S(format_duration(record.lease)),
        ),
        (
            ":rvn".to_string(),
            AttributeValue::S(record.revision.clone()),
        ),
        (
            ":fence".to_string(),
            AttributeValue::N(record.fence.0.to_string()),
        ),
        (
            ":nonce".to_string(),
            AttributeValue::S(record.nonce.clone()),
        ),
        (
            ":acq".to_string(),
            AttributeValue::N(unix_ms(record.acquired_at).to_string()),
        ),
        (
            ":ren".to_string(),
            AttributeValue::N(unix_ms(record.renewed_at).to_string()),
        ),
    ])
}

/// The attributes a record may leave out, as (name placeholder, value placeholder,
/// value): set when there is a value, else removed from the item.
fn optional_values(
    record: &LockRecord,
) -> [(&'static str, &'static str, Option<AttributeValue>); 5] {
    [
        // dynamolock: a present isReleased means released (see the module docs).
        (
            "#rel",
            ":rel",
            (record.state == LockState::Released)
                .then(|| AttributeValue::S(RELEASED_MARK.to_string())),
        ),
        (
            "#data",
            ":data",
            record
                .data
                .as_ref()
                .map(|d| AttributeValue::B(Blob::new(d.as_bytes()))),
        ),
        (
            "#holders",
            ":holders",
            record
                .set
                .as_ref()
                .map(|holders| AttributeValue::S(holders.to_json())),
        ),
        (
            "#history",
            ":history",
            (!record.history.is_empty())
                .then(|| AttributeValue::S(history::to_text(&record.history))),
        ),
        (
            "#runs",
            ":runs",
            (!record.runs.is_empty()).then(|| AttributeValue::S(record.runs.to_text())),
        ),
    ]
}

/// The record's fields this build does not know, but for any that would take the name
/// of an attribute it writes or of the table's key.
fn unknown_fields<'a>(
    record: &'a LockRecord,
    layout: &TableLayout,
) -> impl Iterator<Item = (&'a String, &'a serde_json::Value)> {
    let keys = std::iter::once(&layout.partition_key).chain(layout.sort_key.iter().map(|(k, _)| k));
    let reserved: Vec<&str> = OURS.into_iter().chain(keys.map(String::as_str)).collect();
    record
        .unknown
        .iter()
        .filter(move |(name, _)| !reserved.contains(&name.as_str()))
}

/// An unknown field as an attribute: scalars as themselves, anything else as JSON text.
fn attribute_of(value: &serde_json::Value) -> AttributeValue {
    match value {
        serde_json::Value::String(s) => AttributeValue::S(s.clone()),
        serde_json::Value::Number(n) => AttributeValue::N(n.to_string()),
        serde_json::Value::Bool(b) => AttributeValue::Bool(*b),
        serde_json::Value::Null => AttributeValue::Null(true),
        other => AttributeValue::S(other.to_string()),
    }
}

/// Reads a lock item; an item without lockwarden's attributes (or with wrong types)
/// is foreign. Attributes it does not name are ignored: another client's, or a newer
/// lockwarden's, which `UpdateItem` leaves in place. Public for the fuzzers (`fuzz/`).
pub fn parse_item(item: &HashMap<String, AttributeValue>) -> Result<LockRecord, ForeignRecord> {
    let holder = s(item, OWNER)?.clone();
    let lease = lease(item)?;
    let released = released(item);
    let data = data(item)?;
    let rvn = s(item, RVN)?;
    let written = if written_by_lockwarden(item, rvn) {
        Written::by_lockwarden(item)?
    } else {
        Written::by_another_client(item, rvn)?
    };
    Ok(LockRecord {
        holder,
        nonce: written.nonce,
        revision: rvn.clone(),
        fence: written.fence,
        lease,
        state: if released {
            LockState::Released
        } else {
            LockState::Held
        },
        data,
        acquired_at: written.acquired_at,
        renewed_at: written.renewed_at,
        set: written.set,
        // Read whoever wrote the item last: dynamolock keeps attributes it does not
        // know, so the key's history survives its holds too.
        history: match item.get(HISTORY) {
            Some(AttributeValue::S(text)) => history::parse_text(text),
            _ => Vec::new(),
        },
        // The same for the memory of completed runs: a writer that drops it loses it,
        // and no writer invents one.
        runs: match item.get(RUNS) {
            Some(AttributeValue::S(text)) => lockwarden_core::RunMemory::parse_text(text),
            _ => Default::default(),
        },
        // Not read: no write of this build removes what it does not name.
        unknown: UnknownFields::new(),
    })
}

/// The lease of a lock item: a positive duration.
fn lease(item: &HashMap<String, AttributeValue>) -> Result<Duration, ForeignRecord> {
    let lease_text = s(item, LEASE)?;
    parse_duration(lease_text)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            ForeignRecord::new(format!(
                "attribute {LEASE} is {lease_text:?}, expected a duration such as \"30s\""
            ))
        })
}

/// Whether a lock item is released.
fn released(item: &HashMap<String, AttributeValue>) -> bool {
    match item.get(RELEASED) {
        None => false,
        // Items written before lockwarden followed dynamolock's presence rule.
        Some(AttributeValue::Bool(b)) => *b,
        // dynamolock: present means released, whatever the value.
        Some(_) => true,
    }
}

/// Whether lockwarden wrote the item last (at `recordVersionNumber` `rvn`), rather
/// than another client (dynamolock).
fn written_by_lockwarden(item: &HashMap<String, AttributeValue>, rvn: &str) -> bool {
    match item.get(LOCKWARDEN_RVN) {
        Some(AttributeValue::S(last_ours)) => last_ours == rvn,
        // Items written before `lockwardenRvn` existed carried a boolean isReleased.
        None => {
            item.contains_key(NONCE) && matches!(item.get(RELEASED), Some(AttributeValue::Bool(_)))
        }
        Some(_) => false,
    }
}

/// The fields of a lock item that depend on who wrote it last.
struct Written {
    nonce: String,
    fence: FenceToken,
    acquired_at: SystemTime,
    renewed_at: SystemTime,
    set: Option<HolderSet>,
}

impl Written {
    /// lockwarden's own attributes.
    fn by_lockwarden(item: &HashMap<String, AttributeValue>) -> Result<Written, ForeignRecord> {
        let optional_ms =
            |name: &str| SystemTime::UNIX_EPOCH + Duration::from_millis(n(item, name).unwrap_or(0));
        let set = match item.get(HOLDERS) {
            None => None,
            Some(AttributeValue::S(json)) => Some(HolderSet::from_json(json)?),
            Some(v) => {
                return Err(ForeignRecord::new(format!(
                    "attribute {HOLDERS} is {}, expected a string",
                    kind(v)
                )));
            }
        };
        Ok(Written {
            nonce: s(item, NONCE)?.clone(),
            fence: FenceToken(n(item, FENCE)?),
            acquired_at: optional_ms(ACQUIRED),
            renewed_at: optional_ms(RENEWED),
            set,
        })
    }

    /// Another client (dynamolock) wrote the item last: it holds (or released) it
    /// under its ownerName. A fence lockwarden left behind (dynamolock copies unknown
    /// attributes) is where the next lockwarden acquisition continues.
    fn by_another_client(
        item: &HashMap<String, AttributeValue>,
        rvn: &str,
    ) -> Result<Written, ForeignRecord> {
        let fence = if item.contains_key(FENCE) {
            n(item, FENCE)?
        } else {
            0
        };
        Ok(Written {
            nonce: format!("{ANOTHER_TOOL_NONCE_PREFIX}rvn:{rvn}"),
            fence: FenceToken(fence),
            acquired_at: SystemTime::UNIX_EPOCH,
            renewed_at: SystemTime::UNIX_EPOCH,
            set: None,
        })
    }
}

/// A string attribute of a lock item.
fn s<'a>(
    item: &'a HashMap<String, AttributeValue>,
    name: &str,
) -> Result<&'a String, ForeignRecord> {
    match item.get(name) {
        Some(AttributeValue::S(v)) => Ok(v),
        Some(other) => Err(ForeignRecord::new(format!(
            "attribute {name} is {}, expected a string",
            kind(other)
        ))),
        None => Err(ForeignRecord::new(format!(
            "attribute {name} is missing (not a lockwarden item)"
        ))),
    }
}
/// A non-negative integer attribute of a lock item.
fn n(item: &HashMap<String, AttributeValue>, name: &str) -> Result<u64, ForeignRecord> {
    match item.get(name) {
        Some(AttributeValue::N(v)) => v.parse().map_err(|_| {
            ForeignRecord::new(format!(
                "attribute {name} is {v:?}, expected a non-negative integer"
            ))
        }),
        Some(other) => Err(ForeignRecord::new(format!(
            "attribute {name} is {}, expected a number",
            kind(other)
        ))),
        None => Err(ForeignRecord::new(format!(
            "attribute {name} is missing (not a lockwarden item)"
        ))),
    }
}

/// The free text of a lock item (binary, or a string as older writers stored it).
fn data(item: &HashMap<String, AttributeValue>) -> Result<Option<String>, ForeignRecord> {
    match item.get(DATA) {
        None => Ok(None),
        Some(AttributeValue::B(b)) => Ok(Some(String::from_utf8_lossy(b.as_ref()).into_owned())),
        Some(AttributeValue::S(v)) => Ok(Some(v.clone())),
        Some(other) => Err(ForeignRecord::new(format!(
            "attribute {DATA} is {}, expected binary",
            kind(other)
        ))),
    }
}

fn kind(v: &AttributeValue) -> &'static str {
    match v {
        AttributeValue::S(_) => "a string",
        AttributeValue::N(_) => "a number",
        AttributeValue::B(_) => "binary",
        AttributeValue::Bool(_) => "a boolean",
        AttributeValue::Null(_) => "null",
        AttributeValue::L(_) => "a list",
        AttributeValue::M(_) => "a map",
        AttributeValue::Ss(_) | AttributeValue::Ns(_) | AttributeValue::Bs(_) => "a set",
        _ => "an unknown type",
    }
}

#[async_trait]
impl RecordStore for DynamoStore {
    fn url(&self) -> &str {
        &self.url
    }

    async fn admit(&self) -> Result<Option<lockwarden_core::Admission>, StoreError> {
        store_admit(&self.requests, &self.url).await
    }

    async fn read(&self) -> Result<Option<Stored>, StoreError> {
        let get = || {
            self.client
                .get_item()
                .table_name(&self.layout.table)
                .set_key(Some(self.item_key()))
                .consistent_read(true)
                .send()
        };
        let out = store_send(&self.requests, "GetItem", &self.url, get)
            .await?
            .map_err(|e| classify(e, &self.url).for_read())?;
        Ok(out.item().map(|item| self.parse(item)))
    }

    async fn create(&self, record: &LockRecord) -> Result<Version, StoreError> {
        self.update(record, "attribute_not_exists(#pk)", None).await
    }

    async fn replace(
        &self,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StoreError> {
        if expected.0.is_empty() {
            // A foreign item without a version attribute (force takeover).
            return self
                .update(
                    record,
                    "attribute_exists(#pk) AND attribute_not_exists(#rvn)",
                    None,
                )
                .await;
        }
        self.update(record, "#rvn = :expected", Some(expected))
            .await
    }

    async fn delete(&self, expected: &Version) -> Result<(), StoreError> {
        let delete = || {
            self.client
                .delete_item()
                .table_name(&self.layout.table)
                .set_key(Some(self.item_key()))
                .condition_expression("#rvn = :expected")
                .expression_attribute_names("#rvn", RVN)
                .expression_attribute_values(":expected", AttributeValue::S(expected.0.clone()))
                .send()
        };
        store_send(&self.requests, "DeleteItem", &self.url, delete)
            .await?
            .map(|_| ())
            .map_err(|e| self.classify_write(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dynamolock_item(released: bool) -> HashMap<String, AttributeValue> {
        let mut item = HashMap::from([
            ("key".to_string(), AttributeValue::S("k".into())),
            (OWNER.to_string(), AttributeValue::S("worker-1".into())),
            (LEASE.to_string(), AttributeValue::S("3s".into())),
            (RVN.to_string(), AttributeValue::S("AbC123".into())),
        ]);
        if released {
            item.insert(RELEASED.to_string(), AttributeValue::S("1".into()));
        }
        item
    }

    #[test]
    fn dynamolock_items_are_held_by_their_owner() {
        let r = parse_item(&dynamolock_item(false)).unwrap();
        assert_eq!(r.holder, "worker-1");
        assert_eq!(r.lease, Duration::from_secs(3));
        assert_eq!(r.state, LockState::Held);
        assert_eq!(r.fence, FenceToken(0));
        assert!(r.by_another_tool(), "{}", r.nonce);
        let r = parse_item(&dynamolock_item(true)).unwrap();
        assert_eq!(r.state, LockState::Released);
    }

    #[test]
    fn a_dynamolock_write_over_a_lockwarden_item_is_not_ours() {
        // dynamolock's PutItem copies our attributes but writes a new version.
        let mut item = dynamolock_item(false);
        item.insert(NONCE.to_string(), AttributeValue::S("ournonce".into()));
        item.insert(FENCE.to_string(), AttributeValue::N("7".into()));
        item.insert(LOCKWARDEN_RVN.to_string(), AttributeValue::S("old".into()));
        let r = parse_item(&item).unwrap();
        assert_ne!(r.nonce, "ournonce");
        assert_eq!(r.holder, "worker-1");
        assert_eq!(r.fence, FenceToken(7), "the fence continues");
        item.insert(
            LOCKWARDEN_RVN.to_string(),
            AttributeValue::S("AbC123".into()),
        );
        let r = parse_item(&item).unwrap();
        assert_eq!(r.nonce, "ournonce");
    }

    #[test]
    fn wrong_types_are_foreign() {
        let item = HashMap::from([
            (OWNER.to_string(), AttributeValue::N("3".into())),
            (LEASE.to_string(), AttributeValue::S("10s".into())),
        ]);
        let err = parse_item(&item).unwrap_err();
        assert!(err.what.contains("ownerName is a number"), "{err}");
    }

    /// The history is one string attribute, removed when a record has none; read also
    /// from an item dynamolock wrote last (it keeps attributes it does not know).
    #[test]
    fn the_history_is_an_attribute_of_ours() {
        let layout = TableLayout::new("t");
        let mut record =
            LockRecord::new_acquisition("h", FenceToken(2), Duration::from_secs(30), None);
        let update = update_of(&record, &layout);
        assert!(update.expression.contains("REMOVE") && update.expression.contains("#history"));
        record.history = vec![lockwarden_core::Grant::new(
            "h",
            Some("east"),
            FenceToken(2),
            record.acquired_at,
        )];
        let update = update_of(&record, &layout);
        assert!(
            update.expression.contains("#history = :history"),
            "{}",
            update.expression
        );
        let AttributeValue::S(text) = &update.values[":history"] else {
            panic!("a string attribute")
        };
        let mut item = dynamolock_item(false);
        item.insert(HISTORY.to_string(), AttributeValue::S(text.clone()));
        let read = parse_item(&item).unwrap();
        assert!(read.by_another_tool());
        assert_eq!(read.history, record.history);
    }

    /// A record's unknown fields are written as attributes of their own, never in
    /// place of lockwarden's or of the item's key.
    #[test]
    fn unknown_fields_are_written_beside_ours() {
        let layout = TableLayout::new("t");
        let mut record =
            LockRecord::new_acquisition("h", FenceToken(2), Duration::from_secs(30), None);
        record.unknown.insert("newer".into(), "kept".into());
        record.unknown.insert("count".into(), 3.into());
        record.unknown.insert(OWNER.into(), "not-the-owner".into());
        record.unknown.insert("key".into(), "not-the-key".into());
        let update = update_of(&record, &layout);
        let written: HashMap<&str, &AttributeValue> = update
            .names
            .iter()
            .filter(|(placeholder, _)| placeholder.starts_with("#u"))
            .map(|(placeholder, name)| (*name, &update.values[&placeholder.replace('#', ":")]))
            .collect();
        assert_eq!(written.len(), 2, "{written:?}");
        assert_eq!(written["newer"], &AttributeValue::S("kept".into()));
        assert_eq!(written["count"], &AttributeValue::N("3".into()));
        assert_eq!(update.values[":owner"], AttributeValue::S("h".into()));
        assert!(
            update.expression.contains("#u0 = :u0, #u1 = :u1"),
            "{}",
            update.expression
        );
    }
}

//! A lock item's `UpdateItem`, signed and sent without the SDK's orchestrator (issue
//! 45; `crate::aws::signed` says why and what is shared with S3's PUTs).
//!
//! The URL comes from the SDK's endpoint rules (`DefaultResolver`), resolved once per
//! client; rules that ask for anything but plain SigV4 or for extra headers leave the
//! writes to the SDK ([`SignedUpdates::target`] is `None`). The request is the
//! `awsJson1_0` protocol's: a POST of the operation's input as JSON, named by
//! `x-amz-target`; the reply of a failed condition carries the item as it is
//! (`ReturnValuesOnConditionCheckFailure: ALL_OLD`), in the same JSON form.

use std::collections::HashMap;
use std::time::Duration;

use aws_config::SdkConfig;
use aws_sdk_dynamodb::config::endpoint::{DefaultResolver, Params, ResolveEndpoint};
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sigv4::http_request::SigningSettings;
use aws_smithy_runtime_api::client::http::SharedHttpConnector;
use bytes::Bytes;
use serde::ser::{Error as _, Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};

use super::store::ExpressionNames;
use crate::aws::{Reply, SendError, SignedRequests, Signing, USER_AGENT};

/// The `UpdateItem`s of the DynamoDB stores on one client.
pub struct SignedUpdates {
    requests: SignedRequests,
    /// The configured endpoint (`AWS_ENDPOINT_URL_DYNAMODB`, `--endpoint`, …), if any.
    endpoint: Option<String>,
    /// Resolved on the first write: the client's endpoint does not depend on the item.
    target: tokio::sync::OnceCell<Option<UpdateTarget>>,
}

/// Where the client's writes go and how they are signed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct UpdateTarget {
    url: String,
    signing: Signing,
}

/// The reply to an `UpdateItem` that reached the store and was answered.
#[derive(Debug)]
pub(crate) struct UpdateReply {
    pub status: u16,
    /// The error's type (`ConditionalCheckFailedException`, …) and message.
    pub code: Option<String>,
    pub message: Option<String>,
    /// With a failed condition: the item as it is, when there is one.
    pub item: Option<HashMap<String, AttributeValue>>,
}

/// The input of one `UpdateItem`, in the SDK's types.
pub(crate) struct Update<'a> {
    pub table: &'a str,
    pub key: HashMap<String, AttributeValue>,
    pub expression: String,
    pub condition: &'a str,
    pub names: ExpressionNames<'a>,
    pub values: HashMap<String, AttributeValue>,
}

impl SignedUpdates {
    /// The writes for the DynamoDB client configured by `sdk`, at the DynamoDB
    /// `endpoint` its SDK client uses, on `connector`.
    pub(crate) fn new(
        sdk: &SdkConfig,
        endpoint: Option<String>,
        attempt_timeout: Duration,
        connector: SharedHttpConnector,
    ) -> Option<SignedUpdates> {
        Some(SignedUpdates {
            requests: SignedRequests::new(sdk, attempt_timeout, connector)?,
            endpoint,
            target: tokio::sync::OnceCell::new(),
        })
    }

    /// Requests sent so far, every attempt counted.
    pub fn attempts(&self) -> u64 {
        self.requests.attempts()
    }

    /// Where the writes go, by the SDK's endpoint rules; `None` when they ask for more
    /// than a SigV4-signed request to a URL, or fail (the SDK then sends the write).
    pub(crate) async fn target(&self) -> Option<&UpdateTarget> {
        self.target.get_or_init(|| self.resolve()).await.as_ref()
    }

    async fn resolve(&self) -> Option<UpdateTarget> {
        let params = Params::builder()
            .set_region(self.requests.region.clone())
            .use_fips(self.requests.use_fips)
            .use_dual_stack(self.requests.use_dual_stack)
            .set_endpoint(self.endpoint.clone())
            .build()
            .ok()?;
        let endpoint = DefaultResolver::new()
            .resolve_endpoint(&params)
            .await
            .ok()?;
        let signing =
            self.requests
                .signing_for(&endpoint, "dynamodb", SigningSettings::default())?;
        Some(UpdateTarget {
            url: endpoint.url().to_string(),
            signing,
        })
    }

    /// Sends `update` to `target`, retried as the SDK retries; the last attempt's reply.
    pub(crate) async fn send(
        &self,
        target: &UpdateTarget,
        update: Update<'_>,
    ) -> Result<UpdateReply, SendError> {
        let request = request(target, &update)?;
        let reply = self
            .requests
            .send(&request, &target.signing, error_code)
            .await?;
        Ok(update_reply(reply))
    }
}

/// Room for a lock item's `UpdateItem` body: a renewal's is about 1 KB, so the buffer
/// seldom grows while it is written.
const BODY_CAPACITY: usize = 2048;

fn request(target: &UpdateTarget, update: &Update<'_>) -> Result<http::Request<Bytes>, SendError> {
    let not_sent =
        |e: &dyn std::fmt::Display| SendError::NotSent(format!("building the request: {e}"));
    let mut body = Vec::with_capacity(BODY_CAPACITY);
    serde_json::to_writer(&mut body, &Input(update)).map_err(|e| not_sent(&e))?;
    let body = Bytes::from(body);
    http::Request::builder()
        .method(http::Method::POST)
        .uri(&target.url)
        .header(http::header::USER_AGENT, USER_AGENT)
        .header(http::header::CONTENT_TYPE, "application/x-amz-json-1.0")
        .header("x-amz-target", "DynamoDB_20120810.UpdateItem")
        .header(http::header::CONTENT_LENGTH, body.len())
        .body(body)
        .map_err(|e| not_sent(&e))
}

fn update_reply(reply: Reply) -> UpdateReply {
    let code = error_code(&reply);
    if reply.is_success() {
        return UpdateReply {
            status: reply.status,
            code: None,
            message: None,
            item: None,
        };
    }
    let body: Value = serde_json::from_slice(&reply.body).unwrap_or(Value::Null);
    let message = ["message", "Message"]
        .iter()
        .find_map(|k| body.get(*k).and_then(Value::as_str))
        .map(str::to_string);
    let item = body
        .get("Item")
        .and_then(Value::as_object)
        .and_then(item_from_json);
    UpdateReply {
        status: reply.status,
        code,
        message,
        item,
    }
}

/// The error type of an `awsJson1_0` reply, as the SDK reads it: the
/// `x-amzn-errortype` header, else the body's `__type` or `code`, without the
/// namespace before `#` or the URI after `:`.
fn error_code(reply: &Reply) -> Option<String> {
    if reply.is_success() {
        return None;
    }
    let from_body = || {
        let body: Value = serde_json::from_slice(&reply.body).ok()?;
        ["__type", "code"]
            .iter()
            .find_map(|k| body.get(*k).and_then(Value::as_str).map(str::to_string))
    };
    let raw = reply
        .headers
        .get("x-amzn-errortype")
        .map(str::to_string)
        .or_else(from_body)?;
    let raw = raw.split(':').next().unwrap_or_default();
    let code = raw.rsplit('#').next().unwrap_or_default();
    (!code.is_empty()).then(|| code.to_string())
}

/// An attribute value that has no JSON form here (the SDK's `Unknown`).
#[derive(Debug, thiserror::Error)]
#[error("an attribute value of a kind this build does not know")]
pub(crate) struct UnknownKind;

/// The `UpdateItem` input in the `awsJson1_0` form, written straight from the
/// update's borrowed parts. Built as a `serde_json::Value` first, the tree's copies and
/// its drop were a fifth of a DynamoDB renewal's CPU (issue 45, docs/benchmarks.md).
struct Input<'u>(&'u Update<'u>);

impl Serialize for Input<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let update = self.0;
        let mut input = serializer.serialize_map(Some(7))?;
        input.serialize_entry("TableName", update.table)?;
        input.serialize_entry("Key", &Item(&update.key))?;
        input.serialize_entry("UpdateExpression", &update.expression)?;
        input.serialize_entry("ConditionExpression", update.condition)?;
        input.serialize_entry("ExpressionAttributeNames", &Names(&update.names))?;
        input.serialize_entry("ExpressionAttributeValues", &Item(&update.values))?;
        input.serialize_entry("ReturnValuesOnConditionCheckFailure", "ALL_OLD")?;
        input.end()
    }
}

/// The expression's attribute names, placeholder to name.
struct Names<'a>(&'a ExpressionNames<'a>);

impl Serialize for Names<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(placeholder, name)| (placeholder, name)))
    }
}

/// An item (or a map of expression values) in DynamoDB's JSON form.
struct Item<'a>(&'a HashMap<String, AttributeValue>);

impl Serialize for Item<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(name, value)| (name, Attribute(value))))
    }
}

/// An attribute value in DynamoDB's JSON form (`{"S": "…"}`, `{"N": "1"}`, …); a kind
/// this build does not know is an error ([`UnknownKind`]).
struct Attribute<'a>(&'a AttributeValue);

impl Serialize for Attribute<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let base64 = |b: &Blob| aws_smithy_types::base64::encode(b.as_ref());
        let mut value = serializer.serialize_map(Some(1))?;
        match self.0 {
            AttributeValue::S(s) => value.serialize_entry("S", s)?,
            AttributeValue::N(n) => value.serialize_entry("N", n)?,
            AttributeValue::B(b) => value.serialize_entry("B", &base64(b))?,
            AttributeValue::Bool(b) => value.serialize_entry("BOOL", b)?,
            AttributeValue::Null(b) => value.serialize_entry("NULL", b)?,
            AttributeValue::Ss(v) => value.serialize_entry("SS", v)?,
            AttributeValue::Ns(v) => value.serialize_entry("NS", v)?,
            AttributeValue::Bs(v) => {
                value.serialize_entry("BS", &v.iter().map(base64).collect::<Vec<_>>())?
            }
            AttributeValue::L(v) => {
                value.serialize_entry("L", &v.iter().map(Attribute).collect::<Vec<_>>())?
            }
            AttributeValue::M(m) => value.serialize_entry("M", &Item(m))?,
            _ => return Err(S::Error::custom(UnknownKind)),
        }
        value.end()
    }
}

fn item_from_json(item: &Map<String, Value>) -> Option<HashMap<String, AttributeValue>> {
    item.iter()
        .map(|(name, value)| Some((name.clone(), value_from_json(value)?)))
        .collect()
}

/// An attribute value from DynamoDB's JSON form; `None` if it is not one.
fn value_from_json(value: &Value) -> Option<AttributeValue> {
    let (kind, inner) = value.as_object()?.iter().next()?;
    let text = |v: &Value| v.as_str().map(str::to_string);
    let blob = |v: &Value| {
        aws_smithy_types::base64::decode(v.as_str()?)
            .ok()
            .map(Blob::new)
    };
    let each = |f: &dyn Fn(&Value) -> Option<String>| -> Option<Vec<String>> {
        inner.as_array()?.iter().map(f).collect()
    };
    Some(match kind.as_str() {
        "S" => AttributeValue::S(text(inner)?),
        "N" => AttributeValue::N(text(inner)?),
        "B" => AttributeValue::B(blob(inner)?),
        "BOOL" => AttributeValue::Bool(inner.as_bool()?),
        "NULL" => AttributeValue::Null(inner.as_bool()?),
        "SS" => AttributeValue::Ss(each(&text)?),
        "NS" => AttributeValue::Ns(each(&text)?),
        "BS" => AttributeValue::Bs(inner.as_array()?.iter().map(blob).collect::<Option<_>>()?),
        "L" => AttributeValue::L(
            inner
                .as_array()?
                .iter()
                .map(value_from_json)
                .collect::<Option<_>>()?,
        ),
        "M" => AttributeValue::M(item_from_json(inner.as_object()?)?),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::testing::{CaptureSigned, signed_again, signed_at};
    use crate::aws::{AwsOptions, Credentials};

    /// The signature is the SDK's: the SDK's client signs an UpdateItem at a fixed
    /// time, and the request it built, signed again with the client's target, carries
    /// the same `Authorization`; its URL is the target's. (No test server checks
    /// DynamoDB signatures, so this is the check.)
    #[tokio::test]
    async fn an_update_is_signed_as_the_sdk_signs_it() {
        let aws = AwsOptions {
            endpoint: None,
            region: Some("ap-southeast-2".into()),
            credentials: Some(Credentials::new("AKID", "secret", None)),
            request_timeout: None,
        };
        let capture = CaptureSigned::default();
        let config = crate::dynamodb::client_config(&aws)
            .await
            .time_source(aws_smithy_async::time::StaticTimeSource::new(signed_at()))
            .interceptor(capture.clone())
            .build();
        let _ = aws_sdk_dynamodb::Client::from_conf(config)
            .update_item()
            .table_name("locks")
            .key("key", AttributeValue::S("a/b".into()))
            .update_expression("SET #o = :o")
            .condition_expression("#o = :x")
            .expression_attribute_names("#o", "ownerName")
            .expression_attribute_values(":o", AttributeValue::S("me".into()))
            .expression_attribute_values(":x", AttributeValue::S("you".into()))
            .send()
            .await;
        let captured = capture.take();

        let updates = crate::dynamodb::signed_updates(&aws).await.unwrap();
        let target = updates.target().await.expect("plain SigV4");
        assert_eq!(
            target.url.trim_end_matches('/'),
            captured.uri().to_string().trim_end_matches('/')
        );
        let again = signed_again(
            &captured,
            &target.signing,
            aws_credential_types::Credentials::new("AKID", "secret", None, None, "t"),
        );
        for header in ["authorization", "x-amz-date"] {
            assert_eq!(
                again.headers().get(header),
                captured.headers().get(header),
                "{header}"
            );
        }
        // lockwarden's own update (its body is its own JSON), signed with the day's
        // cached key, is signed as aws-sigv4 signs it.
        let update = Update {
            table: "locks",
            key: HashMap::from([("key".to_string(), AttributeValue::S("a/b".into()))]),
            expression: "SET #o = :o".into(),
            condition: "#o = :x",
            names: vec![("#o".into(), "ownerName")],
            values: HashMap::from([(":o".to_string(), AttributeValue::S("me".into()))]),
        };
        let request = request(target, &update).unwrap();
        crate::aws::assert_signed_as_aws_sigv4_signs(&request, &target.signing);
        assert_eq!(
            captured.headers().get("x-amz-target").unwrap(),
            "DynamoDB_20120810.UpdateItem",
            "the operation's name, as this module sends it"
        );
        assert_eq!(
            captured.headers().get("content-type").unwrap(),
            "application/x-amz-json-1.0"
        );
    }

    #[test]
    fn every_attribute_kind_round_trips_through_its_json_form() {
        let item = HashMap::from([
            ("s".to_string(), AttributeValue::S("text".into())),
            ("n".to_string(), AttributeValue::N("12.5".into())),
            (
                "b".to_string(),
                AttributeValue::B(Blob::new(vec![0, 1, 255])),
            ),
            ("bool".to_string(), AttributeValue::Bool(true)),
            ("null".to_string(), AttributeValue::Null(true)),
            (
                "ss".to_string(),
                AttributeValue::Ss(vec!["a".into(), "b".into()]),
            ),
            ("ns".to_string(), AttributeValue::Ns(vec!["1".into()])),
            (
                "bs".to_string(),
                AttributeValue::Bs(vec![Blob::new(vec![7])]),
            ),
            (
                "l".to_string(),
                AttributeValue::L(vec![
                    AttributeValue::S("x".into()),
                    AttributeValue::N("2".into()),
                ]),
            ),
            (
                "m".to_string(),
                AttributeValue::M(HashMap::from([(
                    "inner".to_string(),
                    AttributeValue::Bool(false),
                )])),
            ),
        ]);
        let json = serde_json::to_value(Item(&item)).unwrap();
        assert_eq!(json["s"], serde_json::json!({"S": "text"}));
        assert_eq!(json["b"], serde_json::json!({"B": "AAH/"}));
        assert_eq!(json["null"], serde_json::json!({"NULL": true}));
        assert_eq!(item_from_json(json.as_object().unwrap()), Some(item));
        assert_eq!(value_from_json(&serde_json::json!({"X": 1})), None);
        assert_eq!(value_from_json(&serde_json::json!("S")), None);
    }

    /// The body is the operation's input in the `awsJson1_0` form, every attribute
    /// value in DynamoDB's JSON form.
    #[test]
    fn an_update_body_is_the_operations_input() {
        let target = UpdateTarget {
            url: "http://127.0.0.1:1/".into(),
            signing: Signing {
                region: "us-east-1".into(),
                name: "dynamodb".into(),
                settings: SigningSettings::default(),
            },
        };
        let update = Update {
            table: "locks",
            key: HashMap::from([("key".to_string(), AttributeValue::S("a/b".into()))]),
            expression: "SET #o = :o, #f = :f".into(),
            condition: "#o = :x",
            names: vec![("#o".into(), "ownerName"), ("#f".into(), "fence")],
            values: HashMap::from([
                (":o".to_string(), AttributeValue::S("me \"quoted\"".into())),
                (":f".to_string(), AttributeValue::N("7".into())),
                (
                    ":l".to_string(),
                    AttributeValue::L(vec![AttributeValue::Bool(true)]),
                ),
            ]),
        };
        let body = request(&target, &update).unwrap().into_body();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "TableName": "locks",
                "Key": {"key": {"S": "a/b"}},
                "UpdateExpression": "SET #o = :o, #f = :f",
                "ConditionExpression": "#o = :x",
                "ExpressionAttributeNames": {"#o": "ownerName", "#f": "fence"},
                "ExpressionAttributeValues": {
                    ":o": {"S": "me \"quoted\""},
                    ":f": {"N": "7"},
                    ":l": {"L": [{"BOOL": true}]},
                },
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            })
        );
    }

    fn reply(status: u16, header: Option<&str>, body: &str) -> Reply {
        let mut headers = aws_smithy_runtime_api::http::Headers::new();
        if let Some(h) = header {
            headers.insert("x-amzn-errortype", h.to_string());
        }
        Reply {
            status,
            headers,
            body: Bytes::from(body.to_string()),
        }
    }

    #[test]
    fn an_error_reply_gives_its_type_message_and_item() {
        let failed = update_reply(reply(
            400,
            None,
            r#"{"__type":"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException",
                "message":"The conditional request failed","Item":{"k":{"S":"v"}}}"#,
        ));
        assert_eq!(
            failed.code.as_deref(),
            Some("ConditionalCheckFailedException")
        );
        assert_eq!(
            failed.message.as_deref(),
            Some("The conditional request failed")
        );
        assert_eq!(
            failed.item,
            Some(HashMap::from([(
                "k".to_string(),
                AttributeValue::S("v".into())
            )]))
        );
        let header = reply(
            400,
            Some(
                "ThrottlingException:http://internal.amazon.com/coral/com.amazon.coral.availability/",
            ),
            "{}",
        );
        assert_eq!(error_code(&header).as_deref(), Some("ThrottlingException"));
        assert_eq!(error_code(&reply(500, None, "not json")), None);
        assert_eq!(error_code(&reply(200, None, "{}")), None);
    }
}

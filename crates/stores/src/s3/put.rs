//! A lock record's PUT, signed and sent without the SDK's orchestrator (issue 45;
//! `crate::aws::signed` says why and what is shared with DynamoDB's writes).
//!
//! The URL comes from the SDK's endpoint rules (`DefaultResolver`), resolved once per
//! key with the parameters the SDK's client would pass; a key whose rules ask for
//! anything but plain SigV4 (S3 Express, multi-region access points) or for extra
//! headers is left to the SDK ([`SignedPuts::target`] is `None`). The signature uses
//! S3's settings: no double encoding, no path normalization, the payload's SHA-256 in
//! `x-amz-content-sha256`. Left out, as a conditional write of a small body does not
//! need them: the request checksum (the signed SHA-256 already covers the body), the
//! SDK's user-agent and invocation headers, stalled-stream protection.

use std::time::Duration;

use aws_config::SdkConfig;
use aws_sdk_s3::config::endpoint::{DefaultResolver, Params, ResolveEndpoint};
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SigningSettings, UriPathNormalizationMode,
};
use aws_smithy_runtime_api::client::http::SharedHttpConnector;
use bytes::Bytes;

use crate::aws::{Reply, SendError, SignedRequests, Signing, USER_AGENT};

/// The PUTs of the S3 stores on one client.
pub struct SignedPuts {
    requests: SignedRequests,
    /// The configured endpoint (`AWS_ENDPOINT_URL_S3`, `--endpoint`, …), if any.
    endpoint: Option<String>,
    force_path_style: bool,
    resolver: DefaultResolver,
}

/// Where one key's PUTs go and how they are signed: resolved once per key.
#[derive(Debug, Clone, PartialEq)]
pub struct PutTarget {
    /// The object's URL: the resolved endpoint and the key, encoded as the SDK does.
    url: String,
    signing: Signing,
}

/// One PUT of a lock record.
pub(crate) struct Put<'a> {
    pub body: Bytes,
    pub content_type: &'a str,
    /// `If-Match: <etag>`, or `If-None-Match: *` when `None`.
    pub if_match: Option<&'a str>,
    /// User metadata (`x-amz-meta-<name>`), ASCII.
    pub metadata: Option<(&'a str, String)>,
}

/// The reply to a PUT that reached the store and was answered.
pub(crate) struct PutReply {
    pub status: u16,
    pub etag: Option<String>,
    /// The S3 error's `Code` and `Message`, for a failure.
    pub code: Option<String>,
    pub message: Option<String>,
}

impl SignedPuts {
    /// The PUTs for the S3 client configured by `sdk`, at the S3 `endpoint` and with
    /// the addressing the store's SDK client uses, on `connector`.
    pub(crate) fn new(
        sdk: &SdkConfig,
        endpoint: Option<String>,
        force_path_style: bool,
        attempt_timeout: Duration,
        connector: SharedHttpConnector,
    ) -> Option<SignedPuts> {
        Some(SignedPuts {
            requests: SignedRequests::new(sdk, attempt_timeout, connector)?,
            endpoint,
            force_path_style,
            resolver: DefaultResolver::new(),
        })
    }

    /// Requests sent so far, every attempt counted.
    pub fn attempts(&self) -> u64 {
        self.requests.attempts()
    }

    /// Where `bucket`/`key`'s PUTs go, by the SDK's endpoint rules; `None` when those
    /// rules ask for more than a SigV4-signed request to a URL (the SDK then sends the
    /// PUT) or fail (the SDK's request then fails with its own error).
    pub async fn target(&self, bucket: &str, key: &str) -> Option<PutTarget> {
        let params = Params::builder()
            .bucket(bucket)
            .key(key)
            .set_region(self.requests.region.clone())
            .use_fips(self.requests.use_fips)
            .use_dual_stack(self.requests.use_dual_stack)
            .set_endpoint(self.endpoint.clone())
            .force_path_style(self.force_path_style)
            .build()
            .ok()?;
        let endpoint = self.resolver.resolve_endpoint(&params).await.ok()?;
        let mut settings = SigningSettings::default();
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        let signing = self.requests.signing_for(&endpoint, "s3", settings)?;
        let base = endpoint.url().trim_end_matches('/');
        let path = aws_smithy_http::label::fmt_string(
            key,
            aws_smithy_http::label::EncodingStrategy::Greedy,
        );
        Some(PutTarget {
            url: format!("{base}/{path}"),
            signing,
        })
    }

    /// Sends `put` to `target`, retried as the SDK retries; the last attempt's reply.
    pub(crate) async fn send(
        &self,
        target: &PutTarget,
        put: Put<'_>,
    ) -> Result<PutReply, SendError> {
        let request = request(target, put)
            .map_err(|e| SendError::NotSent(format!("building the request: {e}")))?;
        let reply = self
            .requests
            .send(&request, &target.signing, |reply| {
                error_code_and_message(&reply.body).0
            })
            .await?;
        Ok(put_reply(reply))
    }
}

fn request(target: &PutTarget, put: Put<'_>) -> Result<http::Request<Bytes>, http::Error> {
    let mut builder = http::Request::builder()
        .method(http::Method::PUT)
        .uri(&target.url)
        .header(http::header::USER_AGENT, USER_AGENT)
        .header(http::header::CONTENT_TYPE, put.content_type)
        .header(http::header::CONTENT_LENGTH, put.body.len());
    builder = match put.if_match {
        Some(etag) => builder.header(http::header::IF_MATCH, etag),
        None => builder.header(http::header::IF_NONE_MATCH, "*"),
    };
    if let Some((name, value)) = &put.metadata {
        builder = builder.header(format!("x-amz-meta-{name}"), value.as_str());
    }
    builder.body(put.body)
}

fn put_reply(reply: Reply) -> PutReply {
    let etag = reply.headers.get("etag").map(str::to_string);
    if reply.is_success() {
        return PutReply {
            status: reply.status,
            etag,
            code: None,
            message: None,
        };
    }
    let (code, message) = error_code_and_message(&reply.body);
    PutReply {
        status: reply.status,
        etag,
        code,
        message,
    }
}

/// The `Code` and `Message` of an S3 error body (`<Error><Code>…</Code>…</Error>`).
fn error_code_and_message(body: &[u8]) -> (Option<String>, Option<String>) {
    let Ok(text) = std::str::from_utf8(body) else {
        return (None, None);
    };
    let mut document = aws_smithy_xml::decode::Document::new(text);
    let Ok(mut root) = document.root_element() else {
        return (None, None);
    };
    let (mut code, mut message) = (None, None);
    while let Some(mut tag) = root.next_tag() {
        let field = if tag.start_el().matches("Code") {
            &mut code
        } else if tag.start_el().matches("Message") {
            &mut message
        } else {
            continue;
        };
        *field = aws_smithy_xml::decode::try_data(&mut tag)
            .ok()
            .map(std::borrow::Cow::into_owned);
    }
    (code, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::testing::{CaptureSigned, signed_again, signed_at};
    use crate::aws::{AwsOptions, Credentials};

    /// The signature is the SDK's: the SDK's client signs a PutObject of a key that
    /// needs encoding at a fixed time, and the request it built, signed again with
    /// the key's target, carries the same `Authorization`. versitygw checks the
    /// signatures end to end (`tests/engine.rs`).
    #[tokio::test]
    async fn a_put_is_signed_as_the_sdk_signs_it() {
        let aws = AwsOptions {
            endpoint: Some("http://127.0.0.1:9".into()),
            region: Some("eu-west-1".into()),
            credentials: Some(Credentials::new("AKID", "secret", Some("token".into()))),
            request_timeout: None,
        };
        let capture = CaptureSigned::default();
        let config = crate::s3::client_config(&aws, &Default::default())
            .await
            .time_source(aws_smithy_async::time::StaticTimeSource::new(signed_at()))
            .interceptor(capture.clone())
            .build();
        let key = "dir/ünï code+plus=eq&(x)*~";
        let _ = aws_sdk_s3::Client::from_conf(config)
            .put_object()
            .bucket("bucket")
            .key(key)
            .if_match("\"etag\"")
            .body(aws_sdk_s3::primitives::ByteStream::from_static(b"{}"))
            .send()
            .await;
        let captured = capture.take();

        let puts = crate::s3::signed_puts(&aws, &Default::default())
            .await
            .unwrap();
        let target = puts.target("bucket", key).await.expect("plain SigV4");
        let sdk_url = captured.uri().to_string();
        assert_eq!(
            sdk_url.split('?').next(),
            Some(target.url.as_str()),
            "the SDK's URL (but the operation's name in its query, which S3 ignores)"
        );
        let again = signed_again(
            &captured,
            &target.signing,
            aws_credential_types::Credentials::new(
                "AKID",
                "secret",
                Some("token".into()),
                None,
                "t",
            ),
        );
        for header in [
            "authorization",
            "x-amz-date",
            "x-amz-content-sha256",
            "x-amz-security-token",
        ] {
            assert_eq!(
                again.headers().get(header),
                captured.headers().get(header),
                "{header}"
            );
        }
        // The SDK's request names its operation in a query, so it was signed again by
        // aws-sigv4; lockwarden's own PUT has none and takes the day's cached key.
        for (if_match, metadata) in [
            (Some("\"etag\""), None),
            (None, Some(("holder", "pod a  b".to_string()))),
        ] {
            let put = Put {
                body: Bytes::from_static(b"{\"holder\":\"x\"}"),
                content_type: "application/json",
                if_match,
                metadata,
            };
            let request = request(&target, put).unwrap();
            crate::aws::assert_signed_as_aws_sigv4_signs(&request, &target.signing);
        }
    }

    #[test]
    fn an_s3_error_body_gives_its_code_and_message() {
        let body = br#"<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>PreconditionFailed</Code><Message>At least one of the pre-conditions you specified did not hold</Message><Condition>If-Match</Condition></Error>"#;
        let (code, message) = error_code_and_message(body);
        assert_eq!(code.as_deref(), Some("PreconditionFailed"));
        assert!(message.unwrap().contains("pre-conditions"));
        assert_eq!(error_code_and_message(b"not xml"), (None, None));
        assert_eq!(error_code_and_message(b""), (None, None));
    }
}

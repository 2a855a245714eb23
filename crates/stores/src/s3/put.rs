//! A lock record's PUT, signed and sent without the SDK's orchestrator (issue 45).
//!
//! Renewals are most of what a controller holding many S3 locks does, and each is one
//! conditional PUT of a few hundred bytes. Through the SDK a renewal cost about 0.4 ms
//! of CPU, half of it in the SDK's orchestrator (its configuration layers, interceptors,
//! endpoint resolution and retry machinery, run again for every request) and most of
//! the rest in the allocations they make (docs/benchmarks.md, "Renewal CPU"). The
//! request itself is small: the method, the URL, five headers and the body, signed.
//!
//! So the store's PUTs are built here from the SDK's own parts, each fixed once per
//! client or per key, not per request:
//! - the URL from the SDK's endpoint rules (`DefaultResolver`), resolved once per key
//!   with the parameters the SDK's client would pass; an endpoint whose rules ask for
//!   anything but plain SigV4 (S3 Express, multi-region access points) or for extra
//!   headers is left to the SDK ([`SignedPuts::target`] is `None`);
//! - the signature from `aws-sigv4`, with S3's settings (no double encoding, no path
//!   normalization, the payload's SHA-256 in `x-amz-content-sha256`);
//! - the credentials from the SDK configuration's provider, cached until shortly
//!   before they expire ([`CredentialCache`]);
//! - the connection pool the SDK client uses ([`crate::aws::http_connector`]);
//! - the SDK's retry configuration: the same attempts and backoff on the same
//!   transient failures ([`retryable`]), each attempt limited by the client's attempt
//!   timeout.
//!
//! What the SDK would add and a conditional write of a small body does not need is
//! left out: the request checksum (the signed SHA-256 of the body already covers it),
//! the SDK's user-agent and invocation headers, stalled-stream protection.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use aws_config::SdkConfig;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sdk_s3::config::endpoint::{DefaultResolver, Params, ResolveEndpoint};
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode, sign,
};
use aws_smithy_runtime_api::client::http::{HttpConnector, SharedHttpConnector};
use aws_smithy_runtime_api::client::identity::Identity;
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::byte_stream::ByteStream;
use aws_smithy_types::retry::RetryConfig;

/// When cached credentials are replaced: this long before they expire, or (for
/// credentials without an expiry, which a provider may still rotate) this long after
/// they were fetched. The SDK's identity cache uses the same 15 minutes.
const CREDENTIALS_REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(5 * 60);
const CREDENTIALS_WITHOUT_EXPIRY_KEPT: Duration = Duration::from_secs(15 * 60);

/// The PUTs of the S3 stores on one client: what every request shares.
pub struct SignedPuts {
    connector: SharedHttpConnector,
    credentials: CredentialCache,
    region: Option<String>,
    use_fips: bool,
    use_dual_stack: bool,
    /// The configured endpoint (`AWS_ENDPOINT_URL_S3`, `--endpoint`, …), if any.
    endpoint: Option<String>,
    force_path_style: bool,
    retry: RetryConfig,
    attempt_timeout: Duration,
    resolver: DefaultResolver,
    /// Requests sent, every attempt counted (the benchmarks' round trips).
    attempts: AtomicU64,
}

/// Where one key's PUTs go and how they are signed: resolved once per key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutTarget {
    /// The object's URL: the resolved endpoint and the key, encoded as the SDK does.
    url: String,
    signing_region: String,
    signing_name: String,
}

/// One PUT of a lock record.
pub(crate) struct Put<'a> {
    pub body: bytes::Bytes,
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

/// Why a PUT has no reply.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PutError {
    /// The request was never sent: it could not be built or signed, or no credentials.
    #[error("{0}")]
    NotSent(String),
    /// Sent, or perhaps sent, and no reply came (connection lost, timeout).
    #[error("{0}")]
    NoReply(String),
}

impl SignedPuts {
    /// The PUTs for the S3 client configured by `sdk` (and, beyond it, the S3 endpoint
    /// and addressing the store's client uses), on `connector`.
    pub(crate) fn new(
        sdk: &SdkConfig,
        endpoint: Option<String>,
        force_path_style: bool,
        attempt_timeout: Duration,
        connector: SharedHttpConnector,
    ) -> Option<SignedPuts> {
        // Anonymous access has nothing to sign with: the SDK sends those.
        let provider = sdk.credentials_provider()?;
        Some(SignedPuts {
            connector,
            credentials: CredentialCache::new(provider),
            region: sdk.region().map(|r| r.to_string()),
            use_fips: sdk.use_fips().unwrap_or(false),
            use_dual_stack: sdk.use_dual_stack().unwrap_or(false),
            endpoint,
            force_path_style,
            retry: sdk
                .retry_config()
                .cloned()
                .unwrap_or_else(RetryConfig::standard),
            attempt_timeout,
            resolver: DefaultResolver::new(),
            attempts: AtomicU64::new(0),
        })
    }

    /// Requests sent so far, every attempt counted.
    pub fn attempts(&self) -> u64 {
        self.attempts.load(Ordering::Relaxed)
    }

    /// Where `bucket`/`key`'s PUTs go, by the SDK's endpoint rules; `None` when those
    /// rules ask for more than a SigV4-signed request to a URL (the SDK then sends the
    /// PUT) or fail (the SDK's request then fails with its own error).
    pub async fn target(&self, bucket: &str, key: &str) -> Option<PutTarget> {
        let params = Params::builder()
            .bucket(bucket)
            .key(key)
            .set_region(self.region.clone())
            .use_fips(self.use_fips)
            .use_dual_stack(self.use_dual_stack)
            .set_endpoint(self.endpoint.clone())
            .force_path_style(self.force_path_style)
            .build()
            .ok()?;
        let endpoint = self.resolver.resolve_endpoint(&params).await.ok()?;
        if endpoint.headers().next().is_some() {
            return None;
        }
        let scheme = match endpoint.properties().get("authSchemes") {
            None => None,
            Some(schemes) => Some(schemes.as_array()?.first()?.as_object()?),
        };
        let text = |name: &str| {
            scheme
                .and_then(|s| s.get(name))
                .and_then(|v| v.as_string())
                .map(str::to_string)
        };
        if text("name").is_some_and(|name| name != "sigv4") {
            return None;
        }
        let signing_region = text("signingRegion").or_else(|| self.region.clone())?;
        let signing_name = text("signingName").unwrap_or_else(|| "s3".to_string());
        let base = endpoint.url().trim_end_matches('/');
        let path = aws_smithy_http::label::fmt_string(
            key,
            aws_smithy_http::label::EncodingStrategy::Greedy,
        );
        Some(PutTarget {
            url: format!("{base}/{path}"),
            signing_region,
            signing_name,
        })
    }

    /// Sends `put` to `target`, retried as the SDK retries; the last attempt's reply.
    pub(crate) async fn send(
        &self,
        target: &PutTarget,
        put: Put<'_>,
    ) -> Result<PutReply, PutError> {
        let mut attempt = 1;
        loop {
            let identity = self.credentials.identity().await?;
            let request = self.signed_request(target, &put, &identity)?;
            self.attempts.fetch_add(1, Ordering::Relaxed);
            let outcome = tokio::time::timeout(self.attempt_timeout, self.exchange(request))
                .await
                .unwrap_or_else(|_| {
                    Err(PutError::NoReply(format!(
                        "no reply within the attempt timeout ({:?})",
                        self.attempt_timeout
                    )))
                });
            if attempt >= self.retry.max_attempts() || !retryable(&outcome) {
                return outcome;
            }
            tokio::time::sleep(self.backoff(attempt)).await;
            attempt += 1;
        }
    }

    /// The SDK's standard backoff: a random part of the initial backoff doubled per
    /// attempt, at most the maximum.
    fn backoff(&self, attempt: u32) -> Duration {
        let doubled = self
            .retry
            .initial_backoff()
            .saturating_mul(2u32.saturating_pow(attempt - 1));
        doubled
            .min(self.retry.max_backoff())
            .mul_f64(rand::random::<f64>())
    }

    fn signed_request(
        &self,
        target: &PutTarget,
        put: &Put<'_>,
        identity: &Identity,
    ) -> Result<http::Request<SdkBody>, PutError> {
        let body = &put.body;
        let not_sent = |what: &str, e: &dyn std::fmt::Display| {
            PutError::NotSent(format!("building the request: {what}: {e}"))
        };
        let mut builder = http::Request::builder()
            .method(http::Method::PUT)
            .uri(&target.url)
            .header(http::header::CONTENT_TYPE, put.content_type)
            .header(http::header::CONTENT_LENGTH, body.len());
        builder = match put.if_match {
            Some(etag) => builder.header(http::header::IF_MATCH, etag),
            None => builder.header(http::header::IF_NONE_MATCH, "*"),
        };
        if let Some((name, value)) = &put.metadata {
            builder = builder.header(format!("x-amz-meta-{name}"), value.as_str());
        }
        let mut request = builder
            .body(SdkBody::from(body.clone()))
            .map_err(|e| not_sent("headers", &e))?;

        let mut settings = SigningSettings::default();
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(identity)
            .region(&target.signing_region)
            .name(&target.signing_name)
            .time(SystemTime::now())
            .settings(settings)
            .build()
            .map_err(|e| not_sent("signing parameters", &e))?
            .into();
        let headers = request
            .headers()
            .iter()
            .map(|(name, value)| Ok((name.as_str(), value.to_str()?)))
            .collect::<Result<Vec<_>, http::header::ToStrError>>()
            .map_err(|e| not_sent("a header is not text", &e))?;
        let signable = SignableRequest::new(
            "PUT",
            target.url.as_str(),
            headers.into_iter(),
            SignableBody::Bytes(body),
        )
        .map_err(|e| not_sent("signing", &e))?;
        let (instructions, _signature) = sign(signable, &params)
            .map_err(|e| not_sent("signing", &e))?
            .into_parts();
        instructions.apply_to_request_http1x(&mut request);
        Ok(request)
    }

    async fn exchange(&self, request: http::Request<SdkBody>) -> Result<PutReply, PutError> {
        let request = aws_smithy_runtime_api::http::Request::try_from(request)
            .map_err(|e| PutError::NotSent(format!("building the request: {e}")))?;
        let response = self
            .connector
            .call(request)
            .await
            .map_err(|e| PutError::NoReply(describe_connector_error(&e)))?;
        let status = response.status().as_u16();
        let etag = response.headers().get("etag").map(str::to_string);
        if (200..300).contains(&status) {
            return Ok(PutReply {
                status,
                etag,
                code: None,
                message: None,
            });
        }
        let body = ByteStream::new(response.into_body())
            .collect()
            .await
            .map(|b| b.into_bytes())
            .unwrap_or_default();
        let (code, message) = error_code_and_message(&body);
        Ok(PutReply {
            status,
            etag,
            code,
            message,
        })
    }
}

/// Whether the SDK's standard retry strategy retries after `outcome`: a failure on the
/// way (a lost connection, a timeout), a server error or throttling.
fn retryable(outcome: &Result<PutReply, PutError>) -> bool {
    match outcome {
        Ok(reply) => {
            matches!(reply.status, 500 | 502 | 503 | 504)
                || reply.code.as_deref().is_some_and(|code| {
                    matches!(
                        code,
                        "SlowDown"
                            | "Throttling"
                            | "ThrottlingException"
                            | "ThrottledException"
                            | "RequestThrottled"
                            | "RequestThrottledException"
                            | "TooManyRequestsException"
                            | "RequestLimitExceeded"
                            | "BandwidthLimitExceeded"
                            | "PriorRequestNotComplete"
                            | "RequestTimeout"
                            | "RequestTimeoutException"
                    )
                })
        }
        Err(PutError::NoReply(_)) => true,
        Err(PutError::NotSent(_)) => false,
    }
}

/// A connector's failure with its causes, as `crate::aws::describe` gives an SDK one.
fn describe_connector_error(err: &ConnectorError) -> String {
    let mut parts = vec![err.to_string()];
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        parts.push(s.to_string());
        source = s.source();
    }
    parts.dedup();
    parts.join(": ")
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
            .map(Cow::into_owned);
    }
    (code, message)
}

/// The credentials of one client, fetched from its provider when missing or about to
/// expire. The SDK keeps them in its identity cache, which only its orchestrator can
/// use; without a cache, a provider such as IMDS or STS would be asked on every PUT.
struct CredentialCache {
    provider: SharedCredentialsProvider,
    cached: std::sync::Mutex<Option<(Identity, Instant)>>,
    /// One refresh at a time: the others wait for it instead of asking too.
    refreshing: tokio::sync::Mutex<()>,
}

impl CredentialCache {
    fn new(provider: SharedCredentialsProvider) -> Self {
        CredentialCache {
            provider,
            cached: std::sync::Mutex::new(None),
            refreshing: tokio::sync::Mutex::new(()),
        }
    }

    fn fresh(&self) -> Option<Identity> {
        let cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        cached
            .as_ref()
            .filter(|(_, refresh_at)| Instant::now() < *refresh_at)
            .map(|(identity, _)| identity.clone())
    }

    async fn identity(&self) -> Result<Identity, PutError> {
        if let Some(identity) = self.fresh() {
            return Ok(identity);
        }
        let _refreshing = self.refreshing.lock().await;
        if let Some(identity) = self.fresh() {
            return Ok(identity);
        }
        let credentials = self
            .provider
            .provide_credentials()
            .await
            .map_err(|e| PutError::NotSent(format!("no credentials: {e}")))?;
        let refresh_at = refresh_at(credentials.expiry(), SystemTime::now(), Instant::now());
        let identity = Identity::from(credentials);
        *self.cached.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((identity.clone(), refresh_at));
        Ok(identity)
    }
}

/// When credentials fetched at `now` (`now_instant` on the monotonic clock) and
/// expiring at `expiry` are replaced: [`CREDENTIALS_REFRESH_BEFORE_EXPIRY`] before they
/// expire, or halfway for credentials that expire sooner than twice that.
fn refresh_at(expiry: Option<SystemTime>, now: SystemTime, now_instant: Instant) -> Instant {
    let Some(expiry) = expiry else {
        return now_instant + CREDENTIALS_WITHOUT_EXPIRY_KEPT;
    };
    let left = expiry.duration_since(now).unwrap_or_default();
    now_instant + left.saturating_sub(CREDENTIALS_REFRESH_BEFORE_EXPIRY.min(left / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn credentials_are_refreshed_before_they_expire() {
        let (now, at) = (SystemTime::now(), Instant::now());
        let hour = Duration::from_secs(3600);
        assert_eq!(
            refresh_at(Some(now + hour), now, at),
            at + hour - CREDENTIALS_REFRESH_BEFORE_EXPIRY
        );
        let short = Duration::from_secs(60);
        assert_eq!(refresh_at(Some(now + short), now, at), at + short / 2);
        assert_eq!(
            refresh_at(Some(now - short), now, at),
            at,
            "expired: refresh now"
        );
        assert_eq!(
            refresh_at(None, now, at),
            at + CREDENTIALS_WITHOUT_EXPIRY_KEPT
        );
    }

    fn reply(status: u16, code: Option<&str>) -> Result<PutReply, PutError> {
        Ok(PutReply {
            status,
            etag: None,
            code: code.map(str::to_string),
            message: None,
        })
    }

    #[test]
    fn put_is_retried_where_the_sdk_retries() {
        assert!(retryable(&reply(503, Some("SlowDown"))));
        assert!(retryable(&reply(500, None)));
        assert!(retryable(&reply(400, Some("RequestTimeout"))));
        assert!(retryable(&Err(PutError::NoReply("reset".into()))));
        assert!(!retryable(&reply(412, Some("PreconditionFailed"))));
        assert!(!retryable(&reply(403, Some("AccessDenied"))));
        assert!(!retryable(&reply(200, None)));
        assert!(!retryable(&Err(PutError::NotSent("no credentials".into()))));
    }
}

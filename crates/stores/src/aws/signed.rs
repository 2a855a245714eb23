//! A store's writes, signed and sent without the SDK's orchestrator (issue 45).
//!
//! Renewals are most of what a controller holding many locks does, and each is one
//! small conditional write. Through the SDK an S3 renewal cost about 0.4 ms of CPU,
//! half of it in the orchestrator (configuration layers, interceptors, endpoint
//! resolution and retry machinery, run again for every request) and most of the rest
//! in the allocations they make (docs/benchmarks.md, "Renewal CPU"). The request itself
//! is small: a method, a URL, a few headers and a body, signed.
//!
//! [`SignedRequests`] sends such a request with the SDK's own parts, each fixed once
//! per client rather than per request:
//! - the signature from `aws-sigv4`, with the settings the service's SDK client uses
//!   ([`Signing`]);
//! - the credentials from the SDK configuration's provider, cached until shortly
//!   before they expire ([`CredentialCache`]);
//! - the connection pool the SDK client uses ([`super::http_connector`]);
//! - the SDK configuration's retries: the same attempts and backoff, after a lost reply
//!   or a reply the service's caller calls transient, each attempt within the client's
//!   attempt timeout.
//!
//! Each store builds its request and reads its reply (`s3/put.rs`, `dynamodb/update.rs`);
//! where its URL comes from is the SDK's endpoint rules, resolved once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use aws_config::SdkConfig;
use aws_credential_types::Credentials;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sigv4::http_request::{
    SignableBody, SignableRequest, SigningInstructions, SigningSettings, sign,
};
use aws_smithy_runtime_api::client::http::{HttpConnector, SharedHttpConnector};
use aws_smithy_runtime_api::client::identity::Identity;
use aws_smithy_runtime_api::http::Headers;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::byte_stream::ByteStream;
use aws_smithy_types::retry::RetryConfig;
use bytes::Bytes;
use lockwarden_core::StoreError;

use super::client::error_chain;
use super::sigv4::{SigningKeys, sign_headers};

/// When cached credentials are replaced: this long before they expire, or (for
/// credentials without an expiry, which a provider may still rotate) this long after
/// they were fetched, as the SDK's identity cache does.
const CREDENTIALS_REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(5 * 60);
const CREDENTIALS_WITHOUT_EXPIRY_KEPT: Duration = Duration::from_secs(15 * 60);

/// The throttling and transient error codes the SDK's standard retry strategy retries
/// on (aws-runtime's classifiers), beside 5xx replies and lost replies.
const RETRIED_ERROR_CODES: [&str; 16] = [
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "TransactionInProgressException",
    "RequestLimitExceeded",
    "BandwidthLimitExceeded",
    "LimitExceededException",
    "RequestThrottled",
    "SlowDown",
    "PriorRequestNotComplete",
    "EC2ThrottledException",
    "RequestTimeout",
    "RequestTimeoutException",
];

/// The `User-Agent` of lockwarden's own requests (not signed, as the SDK's is not).
pub(crate) const USER_AGENT: &str = concat!("lockwarden/", env!("CARGO_PKG_VERSION"));

/// The signed requests of one service client: what every request shares.
pub struct SignedRequests {
    connector: SharedHttpConnector,
    credentials: CredentialCache,
    /// The configured region (the endpoint rules' input; a target's signing region
    /// comes from them).
    pub(crate) region: Option<String>,
    pub(crate) use_fips: bool,
    pub(crate) use_dual_stack: bool,
    retry: RetryConfig,
    attempt_timeout: Duration,
    /// The signing key of the day and the date of the second (`sigv4.rs`).
    keys: SigningKeys,
    /// Requests sent, every attempt counted (the benchmarks' round trips).
    attempts: AtomicU64,
}

/// How one target's requests are signed: the SigV4 scope and the service's settings.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Signing {
    pub region: String,
    pub name: String,
    pub settings: SigningSettings,
}

/// A reply that came.
pub(crate) struct Reply {
    pub status: u16,
    pub headers: Headers,
    pub body: Bytes,
}

impl Reply {
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// Why a request has no reply.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    /// Never sent: it could not be built or signed, or there were no credentials.
    #[error("{0}")]
    NotSent(String),
    /// Sent, or perhaps sent, and no reply came (connection lost, timeout).
    #[error("{0}")]
    NoReply(String),
}

impl SendError {
    /// What a write (`op` to `url`) without a reply means for the store: never sent is
    /// *unavailable* (certainly not applied), a lost reply *indeterminate* (rule 4).
    pub(crate) fn into_store_error(self, op: &str, url: &str) -> StoreError {
        match self {
            SendError::NotSent(why) => StoreError::Unavailable(format!("{op} to {url}: {why}")),
            SendError::NoReply(why) => StoreError::Indeterminate(format!("{op} to {url}: {why}")),
        }
    }
}

/// A failed reply's text for an error message: its status, the service's error code
/// and message when it gave them.
pub(crate) fn reply_detail(status: u16, code: Option<&str>, message: Option<&str>) -> String {
    match (code, message) {
        (Some(code), Some(message)) => format!("HTTP {status} {code}: {message}"),
        (Some(code), None) => format!("HTTP {status} {code}"),
        (None, _) => format!("HTTP {status}"),
    }
}

impl SignedRequests {
    /// The signed requests of the client configured by `sdk`, each attempt within
    /// `attempt_timeout`, on `connector`. `None` without a credentials provider
    /// (anonymous access has nothing to sign with: the SDK sends those requests).
    pub(crate) fn new(
        sdk: &SdkConfig,
        attempt_timeout: Duration,
        connector: SharedHttpConnector,
    ) -> Option<SignedRequests> {
        Some(SignedRequests {
            connector,
            credentials: CredentialCache::new(sdk.credentials_provider()?),
            region: sdk.region().map(|r| r.to_string()),
            use_fips: sdk.use_fips().unwrap_or(false),
            use_dual_stack: sdk.use_dual_stack().unwrap_or(false),
            retry: sdk
                .retry_config()
                .cloned()
                .unwrap_or_else(RetryConfig::standard),
            attempt_timeout,
            keys: SigningKeys::default(),
            attempts: AtomicU64::new(0),
        })
    }

    /// Requests sent so far, every attempt counted.
    pub fn attempts(&self) -> u64 {
        self.attempts.load(Ordering::Relaxed)
    }

    /// How requests to `endpoint` (resolved by the service's endpoint rules) are
    /// signed, with the service's `settings` and its default signing `name`; `None`
    /// when the rules ask for more than SigV4 with no extra headers (the SDK then
    /// sends those requests), or no region is known.
    pub(crate) fn signing_for(
        &self,
        endpoint: &aws_smithy_types::endpoint::Endpoint,
        name: &str,
        settings: SigningSettings,
    ) -> Option<Signing> {
        if endpoint.headers().next().is_some() {
            return None;
        }
        let scheme = match endpoint.properties().get("authSchemes") {
            None => None,
            Some(schemes) => Some(schemes.as_array()?.first()?.as_object()?),
        };
        let text = |key: &str| {
            scheme
                .and_then(|s| s.get(key))
                .and_then(|v| v.as_string())
                .map(str::to_string)
        };
        if text("name").is_some_and(|scheme| scheme != "sigv4") {
            return None;
        }
        Some(Signing {
            region: text("signingRegion").or_else(|| self.region.clone())?,
            name: text("signingName").unwrap_or_else(|| name.to_string()),
            settings,
        })
    }

    /// Sends `request` signed as `signing` says, retried as the SDK retries: after a
    /// lost reply, a 5xx, or an error whose code (`error_code` reads the service's)
    /// is a throttling or transient one. The last attempt's outcome.
    pub(crate) async fn send(
        &self,
        request: &http::Request<Bytes>,
        signing: &Signing,
        error_code: impl Fn(&Reply) -> Option<String>,
    ) -> Result<Reply, SendError> {
        // A success is never retried, and its body never read for a code.
        let transient = |reply: &Reply| {
            !reply.is_success()
                && (matches!(reply.status, 500 | 502 | 503 | 504)
                    || error_code(reply).is_some_and(|c| RETRIED_ERROR_CODES.contains(&c.as_str())))
        };
        let mut attempt = 1;
        loop {
            let identity = self.credentials.identity().await?;
            let signed = sign_request(request, signing, &identity, SystemTime::now(), &self.keys)?;
            self.attempts.fetch_add(1, Ordering::Relaxed);
            let outcome = tokio::time::timeout(self.attempt_timeout, self.exchange(signed))
                .await
                .unwrap_or_else(|_| {
                    Err(SendError::NoReply(format!(
                        "no reply within the attempt timeout ({:?})",
                        self.attempt_timeout
                    )))
                });
            let retried = match &outcome {
                Ok(reply) => transient(reply),
                Err(SendError::NoReply(_)) => true,
                Err(SendError::NotSent(_)) => false,
            };
            if !retried || attempt >= self.retry.max_attempts() {
                return outcome;
            }
            tokio::time::sleep(backoff(&self.retry, attempt)).await;
            attempt += 1;
        }
    }

    async fn exchange(&self, request: http::Request<SdkBody>) -> Result<Reply, SendError> {
        let request = aws_smithy_runtime_api::http::Request::try_from(request)
            .map_err(|e| SendError::NotSent(format!("building the request: {e}")))?;
        let mut response = self
            .connector
            .call(request)
            .await
            .map_err(|e| SendError::NoReply(error_chain(&e)))?;
        let status = response.status().as_u16();
        let headers = std::mem::take(response.headers_mut());
        let body = ByteStream::new(response.into_body())
            .collect()
            .await
            .map_err(|e| SendError::NoReply(format!("reading the reply's body: {e}")))?
            .into_bytes();
        Ok(Reply {
            status,
            headers,
            body,
        })
    }
}

/// `request` with SigV4 headers for `identity` at `time`: from `sigv4.rs` with the day's
/// key in `keys`, or from `aws_sigv4::sign` for a request that signer does not take.
pub(crate) fn sign_request(
    request: &http::Request<Bytes>,
    signing: &Signing,
    identity: &Identity,
    time: SystemTime,
    keys: &SigningKeys,
) -> Result<http::Request<SdkBody>, SendError> {
    let not_sent = |what: &str, e: &dyn std::fmt::Display| {
        SendError::NotSent(format!("building the request: {what}: {e}"))
    };
    let mut signed = http::Request::builder()
        .method(request.method().clone())
        .uri(request.uri().clone())
        .body(SdkBody::from(request.body().clone()))
        .map_err(|e| not_sent("the request", &e))?;
    *signed.headers_mut() = request.headers().clone();
    if let Some(credentials) = identity.data::<Credentials>()
        && let Some(headers) = sign_headers(request, signing, credentials, time, keys)
    {
        for (name, value) in headers {
            let value = http::HeaderValue::try_from(value)
                .map_err(|e| not_sent("a signature header", &e))?;
            signed
                .headers_mut()
                .insert(http::HeaderName::from_static(name), value);
        }
        return Ok(signed);
    }
    aws_sigv4_signature(request, signing, identity, time)?.apply_to_request_http1x(&mut signed);
    Ok(signed)
}

/// What `aws_sigv4::sign` adds to `request` to sign it as `signing` says, for `identity`
/// at `time`: the signer of any request `sigv4.rs` does not take, and what the tests
/// hold that signer to.
pub(crate) fn aws_sigv4_signature(
    request: &http::Request<Bytes>,
    signing: &Signing,
    identity: &Identity,
    time: SystemTime,
) -> Result<SigningInstructions, SendError> {
    let not_sent = |what: &str, e: &dyn std::fmt::Display| {
        SendError::NotSent(format!("building the request: {what}: {e}"))
    };
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(identity)
        .region(&signing.region)
        .name(&signing.name)
        .time(time)
        .settings(signing.settings.clone())
        .build()
        .map_err(|e| not_sent("signing parameters", &e))?
        .into();
    let headers = request
        .headers()
        .iter()
        .map(|(name, value)| Ok((name.as_str(), value.to_str()?)))
        .collect::<Result<Vec<_>, http::header::ToStrError>>()
        .map_err(|e| not_sent("a header is not text", &e))?;
    let uri = request.uri().to_string();
    let signable = SignableRequest::new(
        request.method().as_str(),
        uri.as_str(),
        headers.into_iter(),
        SignableBody::Bytes(request.body()),
    )
    .map_err(|e| not_sent("signing", &e))?;
    let (instructions, _signature) = sign(signable, &params)
        .map_err(|e| not_sent("signing", &e))?
        .into_parts();
    Ok(instructions)
}

/// The SDK's standard backoff before retry `attempt + 1`: a random part of the initial
/// backoff doubled per attempt, at most the maximum.
fn backoff(retry: &RetryConfig, attempt: u32) -> Duration {
    let doubled = retry
        .initial_backoff()
        .saturating_mul(2u32.saturating_pow(attempt - 1));
    doubled
        .min(retry.max_backoff())
        .mul_f64(rand::random::<f64>())
}

/// The credentials of one client, fetched from its provider when missing or about to
/// expire. The SDK keeps them in its identity cache, which only its orchestrator can
/// use; without a cache, a provider such as IMDS or STS would be asked on every write.
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

    async fn identity(&self) -> Result<Identity, SendError> {
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
            .map_err(|e| SendError::NotSent(format!("no credentials: {e}")))?;
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

/// What the tests of each store's signed writes compare with: the request the SDK's
/// client signs for the same operation.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::{Arc, Mutex};

    use aws_smithy_runtime_api::box_error::BoxError;
    use aws_smithy_runtime_api::client::interceptors::Intercept;
    use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
    use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
    use aws_smithy_types::config_bag::ConfigBag;

    use super::*;

    /// The fixed time both signatures of a test are made at.
    pub(crate) fn signed_at() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
    }

    /// The signed request an SDK client was about to send; it is not sent.
    #[derive(Debug, Clone, Default)]
    pub(crate) struct CaptureSigned(Arc<Mutex<Option<http::Request<Bytes>>>>);

    impl CaptureSigned {
        /// The request captured.
        pub(crate) fn take(&self) -> http::Request<Bytes> {
            let captured = self.0.lock().unwrap().take();
            captured.expect("the SDK signed a request")
        }
    }

    impl Intercept for CaptureSigned {
        fn name(&self) -> &'static str {
            "CaptureSigned"
        }

        fn read_before_transmit(
            &self,
            context: &BeforeTransmitInterceptorContextRef<'_>,
            _components: &RuntimeComponents,
            _cfg: &mut ConfigBag,
        ) -> Result<(), BoxError> {
            let request = context.request();
            let mut builder = http::Request::builder()
                .method(request.method())
                .uri(request.uri());
            for (name, value) in request.headers() {
                builder = builder.header(name, value);
            }
            let body = Bytes::copy_from_slice(request.body().bytes().unwrap_or_default());
            *self.0.lock().unwrap() = Some(builder.body(body)?);
            Err("captured, not sent".into())
        }
    }

    /// The SDK's signed request `captured`, signed again by [`sign_request`] with
    /// `signing` at [`signed_at`]: its signature headers and its signature.
    pub(crate) fn signed_again(
        captured: &http::Request<Bytes>,
        signing: &Signing,
        credentials: aws_credential_types::Credentials,
    ) -> http::Request<SdkBody> {
        let mut unsigned = http::Request::builder()
            .method(captured.method())
            .uri(captured.uri())
            .body(captured.body().clone())
            .unwrap();
        *unsigned.headers_mut() = captured.headers().clone();
        // What the signer adds, and the SDK's own headers it leaves out of the
        // signature (lockwarden's writes do not send them).
        for header in [
            "authorization",
            "x-amz-date",
            "x-amz-security-token",
            "amz-sdk-invocation-id",
            "amz-sdk-request",
        ] {
            unsigned.headers_mut().remove(header);
        }
        sign_request(
            &unsigned,
            signing,
            &Identity::from(credentials),
            signed_at(),
            &SigningKeys::default(),
        )
        .unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn the_backoff_doubles_within_the_maximum() {
        let retry = RetryConfig::standard()
            .with_initial_backoff(Duration::from_millis(100))
            .with_max_backoff(Duration::from_millis(300));
        for _ in 0..100 {
            assert!(backoff(&retry, 1) <= Duration::from_millis(100));
            assert!(backoff(&retry, 2) <= Duration::from_millis(200));
            assert!(backoff(&retry, 5) <= Duration::from_millis(300));
        }
    }
}

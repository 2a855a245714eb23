//! The SDK side of the AWS stores (feature `s3` or `dynamodb`): the SDK configuration
//! an [`AwsOptions`] describes, the bounded client cache, and reading an SDK failure.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_config::Region;
use aws_config::timeout::TimeoutConfig;
use aws_smithy_runtime_api::client::http::{
    HttpConnectorSettings, SharedHttpClient, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_runtime_api::http::Response;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

use lockwarden_core::StoreError;
use lockwarden_core::fenced::FencedError;

use super::in_flight::{InFlightStats, RequestGate, requests_in_flight};
use super::{AwsOptions, Credentials};

/// Connect and per-attempt timeouts: a dead endpoint fails an attempt instead of
/// hanging it; the SDK's standard retries (3 attempts) still apply.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub(crate) const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// The SDK configuration `options` describe.
pub(crate) async fn sdk_config(options: &AwsOptions) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(BehaviorVersion::latest()).timeout_config(
        TimeoutConfig::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .operation_attempt_timeout(options.request_timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT))
            .build(),
    );
    if let Some(endpoint) = &options.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    if let Some(region) = &options.region {
        loader = loader.region(Region::new(region.clone()));
    }
    if let Some(credentials) = &options.credentials {
        loader = loader.credentials_provider(sdk_credentials(credentials));
    } else if env_credentials_present() {
        // The default chain would use them first anyway; naming that provider skips
        // building the rest of the chain, whose web-identity step sets up an STS
        // client (and with it TLS and the system's root certificates) on every start:
        // most of a short command's CPU time (issue 18).
        loader = loader.credentials_provider(
            aws_config::environment::EnvironmentVariableCredentialsProvider::new(),
        );
    }
    loader.load().await
}

/// Whether `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` are both set: the first
/// source of the SDK's default credential chain.
fn env_credentials_present() -> bool {
    ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
        .iter()
        .all(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()))
}

/// The endpoint a service's requests go to, when one is configured: the service's own
/// variable (`AWS_ENDPOINT_URL_S3`, …) first, as the SDK resolves it, then the general one.
pub(crate) fn service_endpoint(sdk: &aws_config::SdkConfig, variable: &str) -> Option<String> {
    std::env::var(variable)
        .ok()
        .filter(|v| !v.is_empty())
        .or_else(|| sdk.endpoint_url().map(str::to_string))
}

/// The connection pool of a service's client: for a service reached over plain HTTP
/// (a local or on-premises server), one without TLS: the SDK's default client reads
/// and parses the system's root certificates when it starts, which was the largest
/// part of a short `lockwarden lock`'s CPU time (issue 18), for an endpoint that never
/// uses them. Otherwise the SDK's default HTTPS connector (rustls with aws-lc, the
/// proxy from the environment), built as the SDK builds it. Only the service client
/// gets this one: credential providers (SSO, STS, IMDS) keep the default client.
///
/// One pool serves the SDK client ([`http_client`]) and the store's own signed PUTs
/// (`s3::put`), so that the sockets of both stay within one bound of requests in
/// flight plus the pool's idle connections.
pub(crate) fn http_connector(endpoint: Option<&str>) -> SharedHttpConnector {
    use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
    let builder = aws_smithy_http_client::ConnectorBuilder::default()
        .connector_settings(
            HttpConnectorSettings::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .build(),
        )
        .sleep_impl(aws_smithy_async::rt::sleep::TokioSleep::new())
        .proxy_config(aws_smithy_http_client::proxy::ProxyConfig::from_env());
    if endpoint.is_some_and(|e| e.starts_with("http://")) {
        SharedHttpConnector::new(builder.build_http())
    } else {
        SharedHttpConnector::new(
            builder
                .tls_provider(tls::Provider::Rustls(CryptoMode::AwsLc))
                .build(),
        )
    }
}

/// The HTTP client of a service's SDK client: every request on `connector`. The SDK's
/// per-request connector settings are the ones `connector` was built with (the
/// connect timeout; the attempt timeout is the SDK's own).
pub(crate) fn http_client(connector: SharedHttpConnector) -> SharedHttpClient {
    aws_smithy_runtime_api::client::http::http_client_fn(move |_settings, _components| {
        connector.clone()
    })
}

/// The gate of the requests of one service client built now for `options`: the bound
/// of requests in flight set for new clients ([`requests_in_flight`]), a wait no longer
/// than one attempt may take, counted in `stats`.
pub(crate) fn request_gate(options: &AwsOptions, stats: &'static InFlightStats) -> RequestGate {
    RequestGate::bounded(
        requests_in_flight(),
        options.request_timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT),
        stats,
    )
}

/// The SDK's static credentials provider for `credentials`.
fn sdk_credentials(credentials: &Credentials) -> aws_credential_types::Credentials {
    aws_credential_types::Credentials::new(
        &credentials.access_key_id,
        &credentials.secret_access_key,
        credentials.session_token.clone(),
        None,
        "lockwarden",
    )
}

/// Why this system cannot verify a TLS certificate, if it cannot: no root certificate
/// where the SDK looks (`SSL_CERT_FILE` and `SSL_CERT_DIR` when set, else the system's
/// bundle and directory). A workload image without CA certificates (busybox, scratch)
/// is such a system: every request would fail its handshake, and a debug build of the
/// SDK panics instead. Reads and parses the bundle: for a process's start, not per
/// request.
pub fn missing_root_certificates() -> Option<String> {
    let found = rustls_native_certs::load_native_certs();
    if !found.certs.is_empty() {
        return None;
    }
    let searched = match (
        std::env::var_os("SSL_CERT_FILE"),
        std::env::var_os("SSL_CERT_DIR"),
    ) {
        (None, None) => "the system's certificate bundle and directory".to_string(),
        (file, dir) => [("SSL_CERT_FILE", file), ("SSL_CERT_DIR", dir)]
            .into_iter()
            .filter_map(|(name, v)| v.map(|v| format!("{name}={}", v.to_string_lossy())))
            .collect::<Vec<_>>()
            .join(", "),
    };
    Some(format!(
        "no CA certificates found ({searched}), so the store's TLS certificate cannot be \
         verified: use an image with CA certificates, or mount a bundle and set SSL_CERT_FILE"
    ))
}

/// Distinct client configurations kept at once. Each Secret (and each rotation of one)
/// is a configuration; past this many the cache starts afresh, which costs only new
/// clients for the locks that connect next: clients in use stay with their locks.
pub(crate) const MAX_CACHED_CLIENTS: usize = 64;

/// A service's clients by configuration, bounded: see [`MAX_CACHED_CLIENTS`].
///
/// An SDK client is meant to be shared: it holds its connection pool, credential cache
/// and configuration. The operator connects once per `DistributedLock`, so building a
/// client per lock gave 10,000 S3 locks 10,000 connection pools — 10,000 TCP
/// connections to the store and a configuration load each — where one client per
/// endpoint, region and credentials serves them all (issue 18). Each store keeps one
/// cache for its service, keyed by the [`AwsOptions`] and what else goes into its
/// client.
pub(crate) struct ClientCache<K, C> {
    clients: Mutex<Option<HashMap<K, C>>>,
    capacity: usize,
}

impl<K: Eq + Hash, C: Clone> ClientCache<K, C> {
    pub(crate) const fn new(capacity: usize) -> Self {
        ClientCache {
            clients: Mutex::new(None),
            capacity,
        }
    }

    /// The client for `key`, built by `build` the first time. Two first callers may
    /// both build; the first to finish is kept and the other's is used once.
    pub(crate) async fn get_or_build<F, Fut>(&self, key: K, build: F) -> C
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = C>,
    {
        if let Some(client) = self.lock().get_or_insert_default().get(&key) {
            return client.clone();
        }
        let built = build().await;
        let mut guard = self.lock();
        let clients = guard.get_or_insert_default();
        if clients.len() >= self.capacity && !clients.contains_key(&key) {
            clients.clear();
        }
        clients.entry(key).or_insert(built).clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<HashMap<K, C>>> {
        // A panic while holding the lock leaves a map that is still consistent.
        self.clients.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The SDK's own Display is terse ("service error"); the source chain has the cause.
pub(crate) fn describe<E, R>(err: &SdkError<E, R>) -> String
where
    E: std::error::Error + 'static,
    R: std::fmt::Debug,
{
    error_chain(err)
}

/// `err` and its causes, each once, joined.
pub(crate) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut parts = vec![err.to_string()];
    let mut source = err.source();
    while let Some(s) = source {
        parts.push(s.to_string());
        source = s.source();
    }
    parts.dedup();
    parts.join(": ")
}

/// A fenced object's request (`op`) that failed, the SDK's error its source.
pub(crate) fn fenced_error<E>(err: SdkError<E, Response>, op: &str) -> FencedError
where
    E: std::error::Error + Send + Sync + 'static,
{
    FencedError::Store {
        op: op.to_string(),
        detail: describe(&err),
        source: Some(Box::new(err)),
    }
}

/// The reply to the request `build` makes once `gate` lets it go, for a lock record's
/// request (`op` on `url`); one that never went is [`StoreError::Unavailable`].
pub(crate) async fn store_send<F: Future>(
    gate: &RequestGate,
    op: &str,
    url: &str,
    build: impl FnOnce() -> F,
) -> Result<F::Output, StoreError> {
    gate.run(build)
        .await
        .map_err(|e| StoreError::Unavailable(format!("{op} to {url}: {e}")))
}

/// A slot of `gate` for the running task's next requests to the record at `url`
/// (`lockwarden_core::admission`); one never given within the wait limit is
/// [`StoreError::Unavailable`], as a request never sent.
pub(crate) async fn store_admit(
    gate: &RequestGate,
    url: &str,
) -> Result<Option<lockwarden_core::Admission>, StoreError> {
    gate.admit()
        .await
        .map_err(|e| StoreError::Unavailable(format!("requests to {url}: {e}")))
}

/// The reply to the request `build` makes once `gate` lets it go, for a fenced
/// object's request (`op`); one that never went is a store failure.
pub(crate) async fn fenced_send<F: Future>(
    gate: &RequestGate,
    op: &str,
    build: impl FnOnce() -> F,
) -> Result<F::Output, FencedError> {
    gate.run(build).await.map_err(|e| FencedError::Store {
        op: op.to_string(),
        detail: e.to_string(),
        source: Some(Box::new(e)),
    })
}

/// The HTTP status and the service's error code, when there was a response.
pub(crate) fn status_and_code<E: ProvideErrorMetadata>(
    err: &SdkError<E, Response>,
) -> (Option<u16>, Option<String>) {
    match err {
        SdkError::ServiceError(e) => (
            Some(e.raw().status().as_u16()),
            e.err().code().map(str::to_string),
        ),
        SdkError::ResponseError(e) => (Some(e.raw().status().as_u16()), None),
        _ => (None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn options(access_key: &str) -> AwsOptions {
        AwsOptions {
            endpoint: Some("http://127.0.0.1:9000".into()),
            region: Some("us-east-1".into()),
            credentials: Some(Credentials::new(access_key, "secret", None)),
            ..AwsOptions::default()
        }
    }

    #[tokio::test]
    async fn locks_reaching_a_store_the_same_way_share_one_client() {
        let cache = ClientCache::new(8);
        let counter = AtomicUsize::new(0);
        let built = &counter;
        let build = move || async move { built.fetch_add(1, Ordering::SeqCst) };
        let first = cache.get_or_build(options("a"), build).await;
        let again = cache.get_or_build(options("a"), build).await;
        let other = cache.get_or_build(options("b"), build).await;
        assert_eq!((first, again, other), (0, 0, 1));
        assert_eq!(
            built.load(Ordering::SeqCst),
            2,
            "one client per configuration"
        );
    }

    #[test]
    fn credentials_never_show_the_secret() {
        let shown = format!(
            "{:?}",
            Credentials::new("AKID", "s3cr3t", Some("t0k3n".into()))
        );
        assert!(shown.contains("AKID"), "{shown}");
        assert!(
            !shown.contains("s3cr3t") && !shown.contains("t0k3n"),
            "{shown}"
        );
    }

    #[tokio::test]
    async fn a_full_client_cache_starts_afresh_instead_of_growing() {
        let cache = ClientCache::new(2);
        for (i, key) in ["a", "b", "c"].into_iter().enumerate() {
            let got = cache.get_or_build(options(key), || async move { i }).await;
            assert_eq!(got, i);
        }
        assert_eq!(
            cache.lock().as_ref().map_or(0, HashMap::len),
            1,
            "cleared when full, then the new one kept"
        );
        let rebuilt = cache.get_or_build(options("a"), || async { 9 }).await;
        assert_eq!(rebuilt, 9, "an evicted configuration gets a new client");
    }
}

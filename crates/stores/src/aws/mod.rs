//! What the two AWS stores (S3 and DynamoDB) share: how to reach AWS (endpoint,
//! region, credentials, timeouts), one SDK client per distinct way of reaching a
//! service, and reading an SDK failure.
//!
//! Clients come from the AWS SDK default chain (`AWS_ENDPOINT_URL`, `AWS_REGION`,
//! `AWS_PROFILE`, environment credentials, `~/.aws`, SSO, IRSA / Pod Identity, IMDS),
//! overridden by [`AwsOptions`]. The options are plain data (lockwarden-api fills them
//! from a spec without any SDK); the clients (`client.rs`), their bound of requests in
//! flight (`in_flight.rs`) and the writes they sign themselves (`signed.rs`, their
//! signatures `sigv4.rs`) come with the `s3` or `dynamodb` feature, the command
//! line's flags (`flags.rs`) with `cli`.

#[cfg(feature = "aws")]
mod client;
#[cfg(feature = "cli")]
mod flags;
#[cfg(feature = "aws")]
mod in_flight;
#[cfg(feature = "aws")]
mod signed;
#[cfg(feature = "aws")]
mod sigv4;

use std::fmt;
use std::time::Duration;

#[cfg(feature = "aws")]
pub use client::missing_root_certificates;
#[cfg(feature = "aws")]
pub(crate) use client::{
    ClientCache, DEFAULT_REQUEST_TIMEOUT, MAX_CACHED_CLIENTS, describe, fenced_error, fenced_send,
    http_client, http_connector, request_gate, sdk_config, service_endpoint, status_and_code,
    store_admit, store_send,
};
#[cfg(feature = "cli")]
pub use flags::AwsFlags;
#[cfg(feature = "aws")]
pub use in_flight::{
    InFlightStats, NotAdmitted, RequestGate, requests_in_flight, set_requests_in_flight,
};
#[cfg(all(test, feature = "aws"))]
pub(crate) use in_flight::{assert_waiting_requests_are_small, unreachable_endpoint};
#[cfg(feature = "aws")]
pub use signed::SignedRequests;
#[cfg(all(test, feature = "aws"))]
pub(crate) use signed::testing;
#[cfg(feature = "aws")]
pub(crate) use signed::{Reply, SendError, Signing, USER_AGENT, reply_detail};
#[cfg(all(test, feature = "aws"))]
pub(crate) use sigv4::testing::assert_signed_as_aws_sigv4_signs;

/// The default bound of requests one S3 or DynamoDB client keeps in flight
/// (`registry::set_requests_in_flight`, `in_flight.rs`): far above what a healthy store
/// needs (10,000 S3 locks renewed every 10 s keep a handful of requests in flight at a
/// few milliseconds each), far below the thousands of sockets an overloaded store drew
/// without a bound.
pub const DEFAULT_REQUESTS_IN_FLIGHT: usize = 64;

/// How to reach AWS, beyond what the lock URL says. Everything is optional: the
/// defaults come from the SDK's chain (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct AwsOptions {
    /// AWS endpoint (S3-compatible server, DynamoDB endpoint, a local emulator).
    /// Default: `AWS_ENDPOINT_URL` / `AWS_ENDPOINT_URL_S3` / the profile, else AWS.
    pub endpoint: Option<String>,
    /// AWS region. Default: `AWS_REGION` / the profile.
    pub region: Option<String>,
    /// Static credentials (e.g. from a Kubernetes Secret). Default: the SDK chain.
    pub credentials: Option<Credentials>,
    /// Timeout of one request attempt. Default 20 s.
    pub request_timeout: Option<Duration>,
}

/// Static AWS credentials. Their `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl Credentials {
    pub fn new(
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
        session_token: Option<String>,
    ) -> Credentials {
        Credentials {
            access_key_id: access_key_id.into(),
            secret_access_key: secret_access_key.into(),
            session_token,
        }
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// Whether the service whose endpoint variable is `variable` (`AWS_ENDPOINT_URL_S3`,
/// …) is reached over TLS, which the SDK verifies against the system's root
/// certificates: an `https://` endpoint, or AWS itself when none is set. (An endpoint
/// from an AWS profile is not looked at: profiles name AWS's own, TLS endpoints.)
pub fn reached_over_tls(options: &AwsOptions, variable: &str) -> bool {
    let set = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let endpoint = set(variable)
        .or_else(|| options.endpoint.clone())
        .or_else(|| set("AWS_ENDPOINT_URL"));
    !endpoint.is_some_and(|e| e.starts_with("http://"))
}

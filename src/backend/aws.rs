//! What the two AWS backends share: reading an SDK failure.

use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_smithy_runtime_api::http::Response;

/// The SDK's own Display is terse ("service error"); the source chain has the cause.
pub(crate) fn describe<E, R>(err: &SdkError<E, R>) -> String
where
    E: std::error::Error + 'static,
    R: std::fmt::Debug,
{
    let mut parts = vec![err.to_string()];
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        parts.push(s.to_string());
        source = s.source();
    }
    parts.dedup();
    parts.join(": ")
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

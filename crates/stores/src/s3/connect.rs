//! The process's S3 clients and the backends on them (feature `s3`).

use std::sync::Arc;

use lockwarden_core::fenced::FencedObject;
use lockwarden_core::{CasLock, LockBackend};

use super::{FencedS3Object, S3Key, S3Options, S3Store};
use crate::aws::{
    AwsOptions, ClientCache, InFlightStats, MAX_CACHED_CLIENTS, RequestGate, http_client,
    request_gate, sdk_config, service_endpoint,
};
use crate::store::ConnectError;

/// The lock at `key`, on the process's S3 client for `aws` and `s3`.
pub async fn connect(
    key: &S3Key,
    aws: &AwsOptions,
    s3: &S3Options,
) -> Result<Arc<dyn LockBackend>, ConnectError> {
    let (client, gate) = client(aws, s3).await;
    let store = S3Store::new(client, key.bucket.clone(), key.key.clone())
        .with_request_gate(gate)
        .terraform_compatible(s3.terraform_compatible);
    // Both tools lock with a create that any object refuses: the object goes on release.
    let delete_on_release = s3.s3lock_compatible || s3.terraform_compatible;
    Ok(Arc::new(
        CasLock::new(store).with_delete_on_release(delete_on_release),
    ))
}

/// The fenced object at `key` (`lockwarden put s3://BUCKET/KEY`), on the process's S3
/// client for `aws` and `s3`.
pub async fn connect_fenced(
    key: &S3Key,
    aws: &AwsOptions,
    s3: &S3Options,
) -> Box<dyn FencedObject> {
    let (client, gate) = client(aws, s3).await;
    Box::new(
        FencedS3Object::new(client, key.bucket.clone(), key.key.clone()).with_request_gate(gate),
    )
}

/// The process's S3 clients, one per endpoint, region, credentials, timeout and
/// addressing style, each with the gate of its requests in flight.
static CLIENTS: ClientCache<(AwsOptions, Option<bool>), (aws_sdk_s3::Client, RequestGate)> =
    ClientCache::new(MAX_CACHED_CLIENTS);

/// The requests in flight of the process's S3 clients (`crate::aws::in_flight`).
pub static IN_FLIGHT: InFlightStats = InFlightStats::new();

pub(crate) async fn client(aws: &AwsOptions, s3: &S3Options) -> (aws_sdk_s3::Client, RequestGate) {
    let key = (aws.clone(), s3.force_path_style);
    CLIENTS
        .get_or_build(key, || async {
            let client = aws_sdk_s3::Client::from_conf(client_config(aws, s3).await.build());
            (client, request_gate(aws, &IN_FLIGHT))
        })
        .await
}

/// A gate for the requests of an S3 client built from [`client_config`] for `aws`: the
/// one the process's clients get (public so that the benchmarks bound theirs alike).
pub fn client_request_gate(aws: &AwsOptions) -> RequestGate {
    request_gate(aws, &IN_FLIGHT)
}

/// The configuration of the S3 client for `aws` and `s3`: the SDK's, with path-style
/// addressing for a configured endpoint and lockwarden's HTTP client (plain HTTP for an
/// `http://` endpoint). Its requests in flight are bounded by the stores, through
/// [`client_request_gate`].
/// Public so that the benchmarks measure the client lockwarden uses.
pub async fn client_config(aws: &AwsOptions, s3: &S3Options) -> aws_sdk_s3::config::Builder {
    let sdk = sdk_config(aws).await;
    let endpoint = service_endpoint(&sdk, "AWS_ENDPOINT_URL_S3");
    let path_style = s3.force_path_style.unwrap_or(endpoint.is_some());
    let config = aws_sdk_s3::config::Builder::from(&sdk).force_path_style(path_style);
    config.http_client(http_client(endpoint.as_deref()))
}

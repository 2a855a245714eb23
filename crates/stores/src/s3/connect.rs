//! The process's S3 clients and the backends on them (feature `s3`).

use std::sync::Arc;

use lockwarden_core::fenced::FencedObject;
use lockwarden_core::{CasLock, LockBackend};

use super::{FencedS3Object, S3Key, S3Options, S3Store};
use crate::aws::{
    AwsOptions, ClientCache, MAX_CACHED_CLIENTS, plain_http_client, sdk_config, service_endpoint,
};
use crate::store::ConnectError;

/// The lock at `key`, on the process's S3 client for `aws` and `s3`.
pub async fn connect(
    key: &S3Key,
    aws: &AwsOptions,
    s3: &S3Options,
) -> Result<Arc<dyn LockBackend>, ConnectError> {
    let client = client(aws, s3).await;
    let store = S3Store::new(client, key.bucket.clone(), key.key.clone())
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
    let client = client(aws, s3).await;
    Box::new(FencedS3Object::new(
        client,
        key.bucket.clone(),
        key.key.clone(),
    ))
}

/// The process's S3 clients, one per endpoint, region, credentials, timeout and
/// addressing style.
static CLIENTS: ClientCache<(AwsOptions, Option<bool>), aws_sdk_s3::Client> =
    ClientCache::new(MAX_CACHED_CLIENTS);

async fn client(aws: &AwsOptions, s3: &S3Options) -> aws_sdk_s3::Client {
    let key = (aws.clone(), s3.force_path_style);
    CLIENTS
        .get_or_build(key, || async {
            let sdk = sdk_config(aws).await;
            let endpoint = service_endpoint(&sdk, "AWS_ENDPOINT_URL_S3");
            let path_style = s3.force_path_style.unwrap_or(endpoint.is_some());
            let mut config = aws_sdk_s3::config::Builder::from(&sdk).force_path_style(path_style);
            if let Some(client) = plain_http_client(endpoint.as_deref()) {
                config = config.http_client(client);
            }
            aws_sdk_s3::Client::from_conf(config.build())
        })
        .await
}

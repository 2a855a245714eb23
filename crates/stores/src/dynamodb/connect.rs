//! The process's DynamoDB clients and the backends on them (feature `dynamodb`).

use std::sync::Arc;

use lockwarden_core::fenced::FencedObject;
use lockwarden_core::{CasLock, LockBackend};

use aws_smithy_runtime_api::client::http::SharedHttpConnector;

use super::{
    DEFAULT_PARTITION_KEY, DynamoDbKey, DynamoDbOptions, DynamoStore, FencedDynamoItem,
    SignedUpdates, TableLayout,
};
use crate::aws::{
    AwsOptions, ClientCache, DEFAULT_REQUEST_TIMEOUT, InFlightStats, MAX_CACHED_CLIENTS,
    RequestGate, http_client, http_connector, request_gate, sdk_config, service_endpoint,
};
use crate::store::ConnectError;

/// The lock at `key`, on the process's DynamoDB client for `aws`; creates the table
/// first when asked to.
pub async fn connect(
    key: &DynamoDbKey,
    aws: &AwsOptions,
    options: &DynamoDbOptions,
) -> Result<Arc<dyn LockBackend>, ConnectError> {
    let client = client(aws).await;
    let layout = TableLayout {
        table: key.table.clone(),
        partition_key: options
            .partition_key
            .clone()
            .unwrap_or_else(|| DEFAULT_PARTITION_KEY.to_string()),
        sort_key: options.sort_key.clone(),
    };
    let mut store = DynamoStore::new(client.sdk, layout, key.key.clone())
        .with_request_gate(client.gate)
        .terraform_compatible(options.terraform_compatible);
    if let Some(updates) = client.updates {
        store = store.with_signed_updates(updates);
    }
    if options.create_table {
        store
            .ensure_table()
            .await
            .map_err(|e| ConnectError::Backend {
                url: key.to_string(),
                cause: e.into(),
            })?;
    }
    // The tools lock with `attribute_not_exists(LockID)`: the item goes on release.
    Ok(Arc::new(
        CasLock::new(store).with_delete_on_release(options.terraform_compatible),
    ))
}

/// The fenced item at `key` (`lockwarden put dynamodb://TABLE/KEY`): KEY is the
/// partition key value, `options.sort_key` the sort key's name and value where the
/// table has one (its key schema is read from DescribeTable on first use).
pub async fn connect_fenced(
    key: &DynamoDbKey,
    aws: &AwsOptions,
    options: &DynamoDbOptions,
) -> Box<dyn FencedObject> {
    let client = client(aws).await;
    Box::new(
        FencedDynamoItem::new(
            client.sdk,
            key.table.clone(),
            key.key.clone(),
            options.sort_key.clone(),
        )
        .with_request_gate(client.gate),
    )
}

/// The process's DynamoDB clients, one per endpoint, region, credentials and timeout.
static CLIENTS: ClientCache<AwsOptions, DynamoClient> = ClientCache::new(MAX_CACHED_CLIENTS);

/// The requests in flight of the process's DynamoDB clients (`crate::aws::in_flight`).
pub static IN_FLIGHT: InFlightStats = InFlightStats::new();

/// One way of reaching DynamoDB: the SDK's client, lockwarden's own writes beside it on
/// the same connection pool, and the bound both share.
#[derive(Clone)]
struct DynamoClient {
    sdk: aws_sdk_dynamodb::Client,
    updates: Option<Arc<SignedUpdates>>,
    gate: RequestGate,
}

async fn client(aws: &AwsOptions) -> DynamoClient {
    CLIENTS
        .get_or_build(aws.clone(), || async {
            let sdk = sdk_config(aws).await;
            let endpoint = service_endpoint(&sdk, "AWS_ENDPOINT_URL_DYNAMODB");
            let connector = http_connector(endpoint.as_deref());
            let config = aws_sdk_dynamodb::config::Builder::from(&sdk)
                .http_client(http_client(connector.clone()));
            DynamoClient {
                sdk: aws_sdk_dynamodb::Client::from_conf(config.build()),
                updates: updates_on(aws, &sdk, endpoint, connector).map(Arc::new),
                gate: client_request_gate(aws),
            }
        })
        .await
}

/// The writes of [`client`]'s stores for `aws`, on a connection pool of their own:
/// public so that the benchmarks measure the writes lockwarden sends. `None` with no
/// credentials to sign with.
pub async fn signed_updates(aws: &AwsOptions) -> Option<Arc<SignedUpdates>> {
    let sdk = sdk_config(aws).await;
    let endpoint = service_endpoint(&sdk, "AWS_ENDPOINT_URL_DYNAMODB");
    let connector = http_connector(endpoint.as_deref());
    updates_on(aws, &sdk, endpoint, connector).map(Arc::new)
}

fn updates_on(
    aws: &AwsOptions,
    sdk: &aws_config::SdkConfig,
    endpoint: Option<String>,
    connector: SharedHttpConnector,
) -> Option<SignedUpdates> {
    let attempt_timeout = aws.request_timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT);
    SignedUpdates::new(sdk, endpoint, attempt_timeout, connector)
}

/// A gate for the requests of a DynamoDB client built from [`client_config`] for `aws`:
/// the one the process's clients get (public so that the benchmarks bound theirs alike).
pub fn client_request_gate(aws: &AwsOptions) -> RequestGate {
    request_gate(aws, &IN_FLIGHT)
}

/// The configuration of the DynamoDB client for `aws`: the SDK's, with lockwarden's
/// HTTP client (plain HTTP for an `http://` endpoint). Its requests in flight are
/// bounded by the stores, through [`client_request_gate`].
/// Public so that the benchmarks measure the client lockwarden uses.
pub async fn client_config(aws: &AwsOptions) -> aws_sdk_dynamodb::config::Builder {
    let sdk = sdk_config(aws).await;
    let endpoint = service_endpoint(&sdk, "AWS_ENDPOINT_URL_DYNAMODB");
    aws_sdk_dynamodb::config::Builder::from(&sdk)
        .http_client(http_client(http_connector(endpoint.as_deref())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dynamodb::{DynamoStore, TableLayout};

    /// As S3's (`s3::connect::tests`): a waiting request holds no SDK input. Building
    /// the request before the gate made a waiting UpdateItem 3.4 KB, a GetItem 2.5 KB
    /// and a DeleteItem 3.0 KB.
    #[tokio::test]
    async fn a_request_waiting_for_the_gate_holds_no_sdk_input() {
        let client = client(&crate::aws::unreachable_endpoint()).await;
        let store =
            DynamoStore::new(client.sdk, TableLayout::new("t"), "k").with_request_gate(client.gate);
        crate::aws::assert_waiting_requests_are_small(&store, "DynamoDB");
    }
}

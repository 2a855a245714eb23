//! The process's S3 clients and the backends on them (feature `s3`).

use std::sync::Arc;

use lockwarden_core::fenced::FencedObject;
use lockwarden_core::{CasLock, LockBackend};

use aws_smithy_runtime_api::client::http::SharedHttpConnector;

use super::{FencedS3Object, S3Key, S3Options, S3Store, SignedPuts};
use crate::aws::{
    AwsOptions, ClientCache, DEFAULT_REQUEST_TIMEOUT, InFlightStats, MAX_CACHED_CLIENTS,
    RequestGate, http_client, http_connector, request_gate, sdk_config, service_endpoint,
};
use crate::store::ConnectError;

/// The lock at `key`, on the process's S3 client for `aws` and `s3`.
pub async fn connect(
    key: &S3Key,
    aws: &AwsOptions,
    s3: &S3Options,
) -> Result<Arc<dyn LockBackend>, ConnectError> {
    let client = client(aws, s3).await;
    let mut store = S3Store::new(client.sdk, key.bucket.clone(), key.key.clone())
        .with_request_gate(client.gate)
        .terraform_compatible(s3.terraform_compatible);
    if let Some(puts) = client.puts {
        store = store.with_signed_puts(puts);
    }
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
    Box::new(
        FencedS3Object::new(client.sdk, key.bucket.clone(), key.key.clone())
            .with_request_gate(client.gate),
    )
}

/// The process's S3 clients, one per endpoint, region, credentials, timeout and
/// addressing style, each with the gate of its requests in flight.
static CLIENTS: ClientCache<(AwsOptions, Option<bool>), S3Client> =
    ClientCache::new(MAX_CACHED_CLIENTS);

/// The requests in flight of the process's S3 clients (`crate::aws::in_flight`).
pub static IN_FLIGHT: InFlightStats = InFlightStats::new();

/// One way of reaching S3: the SDK's client, lockwarden's own PUTs beside it on the
/// same connection pool, and the bound both share.
#[derive(Clone)]
pub(crate) struct S3Client {
    pub sdk: aws_sdk_s3::Client,
    pub puts: Option<Arc<SignedPuts>>,
    pub gate: RequestGate,
}

pub(crate) async fn client(aws: &AwsOptions, s3: &S3Options) -> S3Client {
    let key = (aws.clone(), s3.force_path_style);
    CLIENTS
        .get_or_build(key, || async {
            let sdk = sdk_config(aws).await;
            let endpoint = service_endpoint(&sdk, "AWS_ENDPOINT_URL_S3");
            let connector = http_connector(endpoint.as_deref());
            let config = client_config_on(&sdk, s3, endpoint.as_deref(), connector.clone());
            S3Client {
                sdk: aws_sdk_s3::Client::from_conf(config.build()),
                puts: puts_on(aws, &sdk, s3, endpoint, connector).map(Arc::new),
                gate: client_request_gate(aws),
            }
        })
        .await
}

/// The PUTs of [`client`]'s stores for `aws` and `s3`, on a connection pool of their
/// own: public so that the benchmarks measure the PUTs lockwarden sends. `None` with
/// no credentials to sign with.
pub async fn signed_puts(aws: &AwsOptions, s3: &S3Options) -> Option<Arc<SignedPuts>> {
    let sdk = sdk_config(aws).await;
    let endpoint = service_endpoint(&sdk, "AWS_ENDPOINT_URL_S3");
    let connector = http_connector(endpoint.as_deref());
    puts_on(aws, &sdk, s3, endpoint, connector).map(Arc::new)
}

fn puts_on(
    aws: &AwsOptions,
    sdk: &aws_config::SdkConfig,
    s3: &S3Options,
    endpoint: Option<String>,
    connector: SharedHttpConnector,
) -> Option<SignedPuts> {
    let path_style = s3.force_path_style.unwrap_or(endpoint.is_some());
    let attempt_timeout = aws.request_timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT);
    SignedPuts::new(sdk, endpoint, path_style, attempt_timeout, connector)
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
    let connector = http_connector(endpoint.as_deref());
    client_config_on(&sdk, s3, endpoint.as_deref(), connector)
}

fn client_config_on(
    sdk: &aws_config::SdkConfig,
    s3: &S3Options,
    endpoint: Option<&str>,
    connector: SharedHttpConnector,
) -> aws_sdk_s3::config::Builder {
    let path_style = s3.force_path_style.unwrap_or(endpoint.is_some());
    aws_sdk_s3::config::Builder::from(sdk)
        .force_path_style(path_style)
        .http_client(http_client(connector))
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::aws::{Credentials, DEFAULT_REQUESTS_IN_FLIGHT, set_requests_in_flight};

    /// A store that accepts connections and never answers: every request stays in
    /// flight. Returns its address and the connections it accepted.
    fn silent_store() -> (String, Arc<Mutex<Vec<std::net::TcpStream>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let address = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let kept = accepted.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                kept.lock().unwrap().push(stream);
            }
        });
        (address, accepted)
    }

    async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The process's S3 store for `key` on the silent store at `endpoint`, its client
    /// built with a bound of `limit` requests in flight.
    async fn store_with_bound(endpoint: &str, limit: usize, key: &str) -> S3Store {
        let aws = AwsOptions {
            endpoint: Some(endpoint.to_string()),
            region: Some("us-east-1".into()),
            credentials: Some(Credentials::new("key", "secret", None)),
            request_timeout: Some(Duration::from_secs(300)),
        };
        // Process-wide: read when a client is built, so only this test's client has it.
        set_requests_in_flight(limit);
        let client = client(&aws, &Default::default()).await;
        set_requests_in_flight(DEFAULT_REQUESTS_IN_FLIGHT);
        S3Store::new(client.sdk, "b", key).with_request_gate(client.gate)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_beyond_the_bound_wait_without_opening_connections() {
        use lockwarden_core::RecordStore;
        let (endpoint, accepted) = silent_store();
        let stats = &IN_FLIGHT;
        let (in_flight_before, waiting_before) = (stats.in_flight(), stats.waiting());
        let mut requests = Vec::new();
        for i in 0..10 {
            let store = store_with_bound(&endpoint, 3, &format!("k{i}")).await;
            requests.push(tokio::spawn(async move { store.read().await }));
        }
        eventually("3 requests on the wire and 7 waiting", || {
            stats.in_flight() - in_flight_before == 3 && stats.waiting() - waiting_before == 7
        })
        .await;
        eventually("the store to accept the 3 connections", || {
            accepted.lock().unwrap().len() == 3
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            accepted.lock().unwrap().len(),
            3,
            "the waiting requests opened no connection"
        );

        // A cancelled request (a dropped renewal) leaves both counts.
        for request in &requests {
            request.abort();
        }
        eventually("the counts to return to where they were", || {
            stats.in_flight() == in_flight_before && stats.waiting() == waiting_before
        })
        .await;
    }

    /// A request waiting for the gate is the closure that would build it, not the SDK's
    /// input: 10,000 renewals waiting on an overloaded store cost that much each
    /// (docs/design.md §3, "Requests in flight are bounded"). Building the request
    /// before the gate made a waiting PUT 5.6 KB and a GET 3.4 KB.
    #[tokio::test]
    async fn a_request_waiting_for_the_gate_holds_no_sdk_input() {
        // Not through `store_with_bound`: that sets the process-wide bound, which the
        // socket test above relies on while it builds its client.
        let client = client(&crate::aws::unreachable_endpoint(), &Default::default()).await;
        let store = S3Store::new(client.sdk, "b", "k").with_request_gate(client.gate);
        crate::aws::assert_waiting_requests_are_small(&store, "S3");
    }
}

//! The controller's Kubernetes client, with its requests to the API server bounded
//! (issue 45).
//!
//! kube's HTTP/1.1 client opens a connection for every request in flight that finds no
//! idle one, and kube-runtime runs reconciles with no bound on their number. With
//! 10,000 DistributedLocks acquiring at once against a busy API server, the controller
//! held 4,500 connections to it, each one more request for the API server to serve
//! while it was already the bottleneck. [`BoundedApiRequests`] lets at most
//! `--api-requests-in-flight` requests through at a time; the rest wait in the
//! controller, in order.
//!
//! Watches are not counted: each stays open for as long as the controller runs, so
//! counting them would take permits for good (and a bound below the number of watches
//! would stall the controller). Only requests that end are bounded.
//!
//! Waiting is safe for the same reason as for the stores' bound (docs/design.md §3,
//! "Requests in flight are bounded"): a Lease renewal's send time is taken before the
//! request is made, so a wait here spends the holder's own deadline.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::Request;
use kube::client::Body;
use tokio::sync::Semaphore;
use tower::buffer::Buffer;
use tower::{BoxError, Layer, Service, ServiceExt};

/// The default of `--api-requests-in-flight`: kube's own default queue for a client is
/// 1,024 requests; 64 at once keeps a busy API server's connections few while a healthy
/// one answers each in milliseconds.
pub const DEFAULT_API_REQUESTS_IN_FLIGHT: usize = 64;

/// Requests a [`Buffer`] in front of the inner service may queue (kube's own figure).
/// kube's service is a `BoxService`, which cannot be cloned; the buffer makes it so, so
/// that a request takes its permit first and only then waits for the service's readiness.
const BUFFERED: usize = 1024;

/// The controller's client for `config`: kube's default stack with
/// [`BoundedApiRequests`] of `limit`.
pub fn bounded_client(config: kube::Config, limit: usize) -> Result<kube::Client, kube::Error> {
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(builder
        .with_layer(&BoundedApiRequestsLayer { limit })
        .build())
}

/// Wraps a service in [`BoundedApiRequests`].
#[derive(Clone, Copy, Debug)]
pub struct BoundedApiRequestsLayer {
    pub limit: usize,
}

impl<S> Layer<S> for BoundedApiRequestsLayer
where
    S: Service<Request<Body>> + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError> + Send + Sync,
{
    type Service = BoundedApiRequests<Buffer<Request<Body>, S::Future>>;

    fn layer(&self, inner: S) -> Self::Service {
        BoundedApiRequests {
            inner: Buffer::new(inner, BUFFERED),
            permits: Arc::new(Semaphore::new(self.limit.max(1))),
        }
    }
}

/// At most a fixed number of non-watch requests in flight; see the module documentation.
#[derive(Clone, Debug)]
pub struct BoundedApiRequests<S> {
    inner: S,
    permits: Arc<Semaphore>,
}

/// Whether `request` opens a watch (`?watch=true`, `?watch=1`): a request that does
/// not end.
fn is_watch<B>(request: &Request<B>) -> bool {
    request.uri().query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| matches!(pair, "watch=true" | "watch=1"))
    })
}

impl<S, B> Service<Request<B>> for BoundedApiRequests<S>
where
    S: Service<Request<B>, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Readiness is awaited per request, after its permit (in `call`).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        let permits = (!is_watch(&request)).then(|| self.permits.clone());
        Box::pin(async move {
            let _permit = match permits {
                Some(permits) => Some(permits.acquire_owned().await.map_err(Box::new)?),
                None => None,
            };
            // The permit goes with the response's head: the body follows on the same
            // connection, so connections stay within the bound plus the bodies being read.
            inner.oneshot(request).await
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    fn request(uri: &str) -> Request<Body> {
        Request::get(uri).body(Body::from(Vec::new())).unwrap()
    }

    #[test]
    fn watches_are_told_from_requests_that_end() {
        assert!(is_watch(&request(
            "/api/v1/pods?watch=true&resourceVersion=1"
        )));
        assert!(is_watch(&request("/apis/x/v1/ys?labelSelector=a&watch=1")));
        assert!(!is_watch(&request("/api/v1/pods?limit=500")));
        assert!(!is_watch(&request("/api/v1/namespaces/a/pods/watch-me")));
        assert!(!is_watch(&request("/api/v1/pods?watchful=true")));
    }

    #[tokio::test]
    async fn requests_beyond_the_bound_wait_and_watches_pass() {
        // A service that never answers, counting the requests that reached it.
        let reached = Arc::new(AtomicUsize::new(0));
        let counted = reached.clone();
        let never = tower::service_fn(move |_: Request<Body>| {
            counted.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<Result<(), BoxError>>()
        });
        let service = BoundedApiRequestsLayer { limit: 2 }.layer(never);
        let mut calls = Vec::new();
        for i in 0..5 {
            calls.push(tokio::spawn(
                service
                    .clone()
                    .oneshot(request(&format!("/api/v1/pods/{i}"))),
            ));
        }
        for i in 0..3 {
            calls.push(tokio::spawn(
                service
                    .clone()
                    .oneshot(request(&format!("/api/v1/pods?watch=true&i={i}"))),
            ));
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while reached.load(Ordering::SeqCst) < 5 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "requests never reached"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            reached.load(Ordering::SeqCst),
            5,
            "2 requests and the 3 watches go through; 3 requests wait"
        );
        for call in calls {
            call.abort();
        }
    }
}

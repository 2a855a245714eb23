//! The in-process controller's writes to the API server, timed where they run (issue 45).
//!
//! A hand-off's steps are measured alone in each run: the waiter's `Acquired` status
//! write at the start of the operator part (`status_write_cost`), a Lease's record
//! written through the store layer in the engine part. On the hand-off's path the same
//! writes meet an API server still busy with the holder's `DELETE` and its watch events,
//! on the same two cores; traced, the status write took up to twice as long there. A
//! layer on the controller's client records when each write was sent and answered, so
//! that every run shows what the path costs the API server, and by how much.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Method, Request};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tower::{Layer, Service};

/// One answered write: its request's path, when it was sent and when it was answered.
struct Write {
    path: String,
    sent: Instant,
    answered: Instant,
}

impl Write {
    fn took(&self) -> Duration {
        self.answered - self.sent
    }
}

/// The writes (every method but `GET`) of a client made by [`ApiWrites::client`], as a
/// [`Layer`].
#[derive(Clone, Default)]
pub(crate) struct ApiWrites(Arc<Mutex<Vec<Write>>>);

impl ApiWrites {
    /// A client for `kubeconfig` whose writes this records.
    pub(crate) async fn client(&self, kubeconfig: &std::path::Path) -> Client {
        let kubeconfig = Kubeconfig::read_from(kubeconfig).expect("read the kubeconfig");
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .expect("a client configuration from the kubeconfig");
        kube::client::ClientBuilder::try_from(config)
            .expect("a client from the kubeconfig")
            .with_layer(self)
            .build()
    }

    /// How long the first status write of the object `name` sent at or after `since`
    /// took to be answered (the waiter's `Acquired`, when `since` is the holder's
    /// `DELETE`).
    pub(crate) fn status_write(&self, name: &str, since: Instant) -> Option<Duration> {
        let suffix = format!("/{name}/status");
        let writes = self.0.lock().unwrap();
        writes
            .iter()
            .filter(|w| w.sent >= since && w.path.ends_with(&suffix))
            .min_by_key(|w| w.sent)
            .map(Write::took)
    }

    /// How long each write to one of `paths` (without their queries: an object's, and
    /// its collection's for a create) took, of those sent at or after `since` and
    /// answered by `until`, in the order they were sent.
    pub(crate) fn writes_to(
        &self,
        paths: &[&str],
        since: Instant,
        until: Instant,
    ) -> Vec<Duration> {
        let writes = self.0.lock().unwrap();
        let mut on: Vec<&Write> = writes
            .iter()
            .filter(|w| paths.contains(&w.path.as_str()) && w.sent >= since && w.answered <= until)
            .collect();
        on.sort_by_key(|w| w.sent);
        on.into_iter().map(Write::took).collect()
    }
}

impl<S> Layer<S> for ApiWrites {
    type Service = TimedWrites<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TimedWrites {
            inner,
            writes: self.clone(),
        }
    }
}

/// The service [`ApiWrites`] wraps around the client's stack.
pub(crate) struct TimedWrites<S> {
    inner: S,
    writes: ApiWrites,
}

impl<S, B> Service<Request<B>> for TimedWrites<S>
where
    S: Service<Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let path = (request.method() != Method::GET).then(|| request.uri().path().to_string());
        let sent = Instant::now();
        let response = self.inner.call(request);
        let writes = self.writes.clone();
        Box::pin(async move {
            let response = response.await;
            if let (Some(path), Ok(_)) = (path, &response) {
                writes.0.lock().unwrap().push(Write {
                    path,
                    sent,
                    answered: Instant::now(),
                });
            }
            response
        })
    }
}

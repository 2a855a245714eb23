//! The in-process controller's status writes, timed where they run (issue 45).
//!
//! The hand-off's last step, the waiter's `Acquired` status write, is measured alone at
//! the start of the operator part (`status_write_cost`). On the hand-off's path the same
//! write meets an API server still busy with the holder's `DELETE` and the stores' servers
//! still busy with the release, on the same two cores; traced, it took up to twice as
//! long there. A layer on the controller's client records when each status write was
//! sent and answered, so that every run shows that cost of the path and by how much.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Method, Request};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tower::{Layer, Service};

/// One status write: the object's name, when it was sent and when it was answered.
struct StatusWrite {
    name: String,
    sent: Instant,
    answered: Instant,
}

/// The status writes of a client made by [`StatusWrites::client`], as a [`Layer`].
#[derive(Clone, Default)]
pub(crate) struct StatusWrites(Arc<Mutex<Vec<StatusWrite>>>);

impl StatusWrites {
    /// A client for `kubeconfig` whose status writes this records.
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

    /// How long the first status write of `name` sent at or after `since` took to be
    /// answered (the waiter's `Acquired`, when `since` is the holder's `DELETE`).
    pub(crate) fn first_since(&self, name: &str, since: Instant) -> Option<Duration> {
        let writes = self.0.lock().unwrap();
        writes
            .iter()
            .filter(|w| w.name == name && w.sent >= since)
            .min_by_key(|w| w.sent)
            .map(|w| w.answered - w.sent)
    }
}

/// The object whose status `request` writes: `PATCH …/<name>/status`.
fn status_write_of<B>(request: &Request<B>) -> Option<String> {
    if request.method() != Method::PATCH {
        return None;
    }
    let path = request.uri().path().strip_suffix("/status")?;
    path.rsplit('/').next().map(String::from)
}

impl<S> Layer<S> for StatusWrites {
    type Service = TimedStatusWrites<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TimedStatusWrites {
            inner,
            writes: self.clone(),
        }
    }
}

/// The service [`StatusWrites`] wraps around the client's stack.
pub(crate) struct TimedStatusWrites<S> {
    inner: S,
    writes: StatusWrites,
}

impl<S, B> Service<Request<B>> for TimedStatusWrites<S>
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
        let name = status_write_of(&request);
        let sent = Instant::now();
        let response = self.inner.call(request);
        let writes = self.writes.clone();
        Box::pin(async move {
            let response = response.await;
            if let (Some(name), Ok(_)) = (name, &response) {
                writes.0.lock().unwrap().push(StatusWrite {
                    name,
                    sent,
                    answered: Instant::now(),
                });
            }
            response
        })
    }
}

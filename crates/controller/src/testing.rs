//! Test builds only: a scripted API server behind a real `kube::Client`, and a
//! [`Connector`] handing out locks on an in-memory store.
//!
//! The client is `kube::Client::new` over `tower_test`'s mock service, so everything
//! above the HTTP exchange (request building, serialisation, `Api`, the finalizer
//! helper, the Event recorder) is the production code. A [`Script`] runs on its own
//! task: it takes the requests in the order it expects them, asserts what each must
//! say, and answers. A request it expects that never comes fails the test after
//! [`PATIENCE`]; a request after the script's end is answered 500 and reported by
//! [`Script::finish`].

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tower_test::mock::{self, Handle, SendResponse};

use super::connect::{ConnectFailure, Connector};
use super::validated::LockAddress;
use lockwarden_core::memory::MemoryStore;
use lockwarden_core::{CasLock, LockBackend};

/// How long a script waits for each request it expects (a loaded 2-core machine; the
/// requests normally come within milliseconds).
pub const PATIENCE: Duration = Duration::from_secs(10);

/// The server side of a mock `kube::Client`.
pub struct ApiServer {
    handle: Handle<Request<Body>, Response<Body>>,
    /// How many requests were taken so far (for messages).
    taken: usize,
}

/// A client whose every request goes to the returned [`ApiServer`].
pub fn mock_client() -> (kube::Client, ApiServer) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    (client, ApiServer { handle, taken: 0 })
}

/// One request of the code under test, waiting for its answer.
pub struct Exchange {
    pub method: Method,
    /// The path without the query.
    pub path: String,
    pub query: String,
    pub content_type: String,
    /// The body as JSON (`Null` when empty).
    pub body: Value,
    reply: SendResponse<Response<Body>>,
}

impl Exchange {
    /// Answers with `status` and `body` as JSON.
    pub fn respond(self, status: StatusCode, body: &Value) {
        let response = Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(body).expect("JSON")))
            .expect("a response");
        self.reply.send_response(response);
    }

    /// Answers 200 with `body`.
    pub fn ok(self, body: &Value) {
        self.respond(StatusCode::OK, body)
    }

    /// Answers 201 with the request's own body (what a create returns).
    pub fn created(self) {
        let body = self.body.clone();
        self.respond(StatusCode::CREATED, &body)
    }
}

impl ApiServer {
    /// The next request, whatever it is; panics when none comes within [`PATIENCE`].
    pub async fn next(&mut self, expected: &str) -> Exchange {
        self.taken += 1;
        let n = self.taken;
        let (request, reply) =
            match tokio::time::timeout(PATIENCE, self.handle.next_request()).await {
                Ok(Some(next)) => next,
                Ok(None) => panic!("request {n} ({expected}): the client is gone"),
                Err(_) => panic!("request {n} ({expected}) was never sent (waited {PATIENCE:?})"),
            };
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.expect("the request's body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("a JSON request body")
        };
        Exchange {
            method: parts.method,
            path: parts.uri.path().to_string(),
            query: parts.uri.query().unwrap_or_default().to_string(),
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string(),
            body,
            reply,
        }
    }

    /// The next request, which must be `method path`.
    pub async fn expect(&mut self, method: Method, path: &str) -> Exchange {
        let expected = format!("{method} {path}");
        let exchange = self.next(&expected).await;
        assert_eq!(
            format!("{} {}", exchange.method, exchange.path),
            expected,
            "request {} is not the one expected; its body: {}",
            self.taken,
            exchange.body
        );
        exchange
    }
}

/// A script running against an [`ApiServer`] on its own task; it ends with a `T`
/// (what it saw, for the test's own assertions).
pub struct Script<T> {
    done: oneshot::Receiver<T>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<ApiServer>,
    unscripted: Arc<Mutex<Vec<String>>>,
}

impl<T: Send + 'static> Script<T> {
    /// Runs `script`. After its end the server answers every further request 500 and
    /// notes it, until [`finish`](Self::finish).
    pub fn run<F, Fut>(server: ApiServer, script: F) -> Script<T>
    where
        F: FnOnce(ApiServer) -> Fut + Send + 'static,
        Fut: Future<Output = (ApiServer, T)> + Send + 'static,
    {
        let (done_tx, done) = oneshot::channel();
        let (stop, mut stopped) = oneshot::channel();
        let unscripted = Arc::new(Mutex::new(Vec::new()));
        let noted = unscripted.clone();
        let task = tokio::spawn(async move {
            let (mut server, seen) = script(server).await;
            let _ = done_tx.send(seen);
            loop {
                let (request, reply) = tokio::select! {
                    _ = &mut stopped => return server,
                    next = server.handle.next_request() => match next {
                        Some(next) => next,
                        None => return server,
                    },
                };
                let line = format!("{} {}", request.method(), request.uri());
                noted.lock().expect("unscripted").push(line);
                let refused = Response::builder()
                    .status(StatusCode::INTERNAL_SERVER_ERROR)
                    .body(Body::from(br#"{"kind":"Status","code":500}"#.to_vec()))
                    .expect("a response");
                reply.send_response(refused);
            }
        });
        Script {
            done,
            stop,
            task,
            unscripted,
        }
    }

    /// Waits for the script's end (its own assertions fail the test here), then checks
    /// that no request came that it did not expect, and gives the server back. Call
    /// after the code under test has finished.
    pub async fn finish(self) -> (ApiServer, T) {
        let seen = match self.done.await {
            Ok(seen) => seen,
            Err(_) => match self.task.await {
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                other => panic!("the script ended without finishing: {:?}", other.err()),
            },
        };
        let _ = self.stop.send(());
        let server = self.task.await.expect("the server task");
        let unscripted = self.unscripted.lock().expect("unscripted").clone();
        assert!(
            unscripted.is_empty(),
            "requests no script expected (answered 500): {unscripted:?}"
        );
        (server, seen)
    }
}

/// Hands out a new [`CasLock`] on one [`MemoryStore`] per request (as the real
/// connector builds a new backend per lock), and counts the requests.
pub struct MemoryConnector {
    pub store: MemoryStore,
    connects: AtomicUsize,
}

impl MemoryConnector {
    pub fn new(store: MemoryStore) -> Self {
        MemoryConnector {
            store,
            connects: AtomicUsize::new(0),
        }
    }

    /// How many backends were asked for.
    pub fn connects(&self) -> usize {
        self.connects.load(Ordering::SeqCst)
    }
}

impl Connector for MemoryConnector {
    fn backend<'a>(
        &'a self,
        _client: &'a kube::Client,
        _lock_namespace: &'a str,
        _address: &'a LockAddress,
    ) -> BoxFuture<'a, Result<Arc<dyn LockBackend>, ConnectFailure>> {
        self.connects.fetch_add(1, Ordering::SeqCst);
        let backend: Arc<dyn LockBackend> = Arc::new(CasLock::new(self.store.clone()));
        async move { Ok(backend) }.boxed()
    }
}

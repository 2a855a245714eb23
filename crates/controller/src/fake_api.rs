//! (tests only) An in-memory Kubernetes API behind a real `kube::Client`, for driving
//! the gating machine through whole life-cycles in `cargo test --lib`: objects by path,
//! GET / POST / merge PATCH (with the `metadata.resourceVersion` precondition) /
//! DELETE (finalizers keep an object, with a deletionTimestamp), status subresources,
//! and Events accepted and kept. It plays the API server's storage rules only — no
//! controller runs in it, so a test plays the lock controller and the workload's own
//! controller by writing objects itself. The proof that Kubernetes works this way is
//! the integration suite against a real kube-apiserver (tests/jobs.rs, tests/pods.rs).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::client::Body;
use serde_json::{Value, json};

/// A DistributedLock's status as the lock controller writes it ([`FakeApi::set_lock_status`]).
pub struct LockStatus<'a> {
    pub phase: &'a str,
    /// The `Acquired` condition: True (`LeaseHeld`), or False (`Lost`).
    pub acquired: bool,
    /// The condition's message.
    pub message: &'a str,
    pub fence: i64,
    pub holder: &'a str,
    pub nonce: Option<&'a str>,
}

#[derive(Default)]
struct State {
    objects: BTreeMap<String, Value>,
    events: Vec<Value>,
    /// Every request but Events: method and path, in order.
    requests: Vec<String>,
    revision: u64,
}

/// The API's storage, shared by the client and the test.
#[derive(Clone, Default)]
pub struct FakeApi(Arc<Mutex<State>>);

impl FakeApi {
    /// A client whose every request this API answers.
    pub fn client(&self) -> kube::Client {
        let api = self.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            let api = api.clone();
            async move {
                let (parts, body) = request.into_parts();
                let bytes = body
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                let body: Option<Value> = serde_json::from_slice(&bytes).ok();
                let selector = parts.uri.query().and_then(label_selector);
                let (status, answer) = match (&parts.method, selector) {
                    (&Method::GET, Some(selector)) => api.list(parts.uri.path(), &selector),
                    _ => api.answer(&parts.method, parts.uri.path(), body),
                };
                let response = Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&answer).expect("json")))
                    .expect("response");
                Ok::<_, Infallible>(response)
            }
        });
        kube::Client::new(service, "default")
    }

    /// Stores `object` at its path (created, or replaced whole), as a controller the
    /// test plays would.
    pub fn put(&self, path: &str, mut object: Value) {
        let mut state = self.0.lock().expect("fake api");
        state.revision += 1;
        let revision = state.revision.to_string();
        let meta = &mut object["metadata"];
        meta["resourceVersion"] = json!(revision);
        if meta["uid"].is_null() {
            meta["uid"] = json!(format!("uid-{revision}"));
        }
        if meta["generation"].is_null() {
            meta["generation"] = json!(1);
        }
        state.objects.insert(path.to_string(), object);
    }

    /// Plays another controller: merges `patch` (RFC 7386) into the object at `path`.
    pub fn merge(&self, path: &str, patch: Value) {
        let mut object = self.get(path).expect(path);
        json_patch::merge(&mut object, &patch);
        self.put(path, object);
    }

    /// Plays the lock controller: writes `status` on the DistributedLock at `path`, for
    /// its current generation.
    pub fn set_lock_status(&self, path: &str, status: &LockStatus<'_>) {
        let mut lock = self.get(path).expect(path);
        let generation = lock["metadata"]["generation"].clone();
        let (condition, reason) = match status.acquired {
            true => ("True", "LeaseHeld"),
            false => ("False", "Lost"),
        };
        lock["status"] = json!({
            "phase": status.phase, "fence": status.fence, "holder": status.holder,
            "observedGeneration": generation,
            "conditions": [{
                "type": "Acquired", "status": condition, "reason": reason,
                "message": status.message,
                "observedGeneration": generation, "lastTransitionTime": "2026-01-01T00:00:00Z",
            }],
        });
        if let Some(nonce) = status.nonce {
            lock["status"]["nonce"] = json!(nonce);
        }
        self.put(path, lock);
    }

    /// The object at `path`, if any.
    pub fn get(&self, path: &str) -> Option<Value> {
        self.0.lock().expect("fake api").objects.get(path).cloned()
    }

    /// The object at `path` as `K`.
    pub fn object<K: serde::de::DeserializeOwned>(&self, path: &str) -> K {
        let value = self
            .get(path)
            .unwrap_or_else(|| panic!("no object at {path}"));
        serde_json::from_value(value).expect("object of its kind")
    }

    /// The reasons of the Events recorded so far, in order.
    pub fn event_reasons(&self) -> Vec<String> {
        let state = self.0.lock().expect("fake api");
        state
            .events
            .iter()
            .map(|e| e["reason"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// The requests (`METHOD path`) since the last call, Events left out.
    pub fn take_requests(&self) -> Vec<String> {
        std::mem::take(&mut self.0.lock().expect("fake api").requests)
    }

    /// A LIST with a label selector (`key=value`, one term): the objects directly
    /// under the collection `path` whose labels match.
    fn list(&self, path: &str, selector: &(String, String)) -> (StatusCode, Value) {
        let mut state = self.0.lock().expect("fake api");
        state.requests.push(format!("LIST {path}"));
        let prefix = format!("{path}/");
        let items: Vec<Value> = state
            .objects
            .iter()
            .filter(|(at, _)| at.strip_prefix(&prefix).is_some_and(|n| !n.contains('/')))
            .filter(|(_, o)| o["metadata"]["labels"][&selector.0] == selector.1.as_str())
            .map(|(_, o)| o.clone())
            .collect();
        let list = json!({ "kind": "List", "apiVersion": "v1", "metadata": {}, "items": items });
        (StatusCode::OK, list)
    }

    fn answer(&self, method: &Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut state = self.0.lock().expect("fake api");
        if path.contains("/events") {
            // kube's Recorder: a new Event, or a PATCH of a series.
            if let Some(event) = body.clone() {
                state.events.push(event);
            }
            return (StatusCode::CREATED, body.unwrap_or(json!({})));
        }
        state.requests.push(format!("{method} {path}"));
        let object_path = path.strip_suffix("/status").unwrap_or(path).to_string();
        match *method {
            Method::GET => match state.objects.get(&object_path) {
                Some(object) => (StatusCode::OK, object.clone()),
                None => not_found(&object_path),
            },
            Method::POST => {
                let mut object = body.unwrap_or(json!({}));
                let name = object["metadata"]["name"].as_str().unwrap_or_default();
                let at = format!("{path}/{name}");
                if state.objects.contains_key(&at) {
                    return status(StatusCode::CONFLICT, "AlreadyExists", &at);
                }
                state.revision += 1;
                let revision = state.revision;
                object["metadata"]["resourceVersion"] = json!(revision.to_string());
                object["metadata"]["uid"] = json!(format!("uid-{revision}"));
                object["metadata"]["generation"] = json!(1);
                state.objects.insert(at, object.clone());
                (StatusCode::CREATED, object)
            }
            Method::PATCH => {
                let Some(stored) = state.objects.get(&object_path).cloned() else {
                    return not_found(&object_path);
                };
                let patch = body.unwrap_or(json!({}));
                let wanted = &patch["metadata"]["resourceVersion"];
                if !wanted.is_null() && *wanted != stored["metadata"]["resourceVersion"] {
                    return status(StatusCode::CONFLICT, "Conflict", &object_path);
                }
                let mut object = stored.clone();
                json_patch::merge(&mut object, &patch);
                state.revision += 1;
                object["metadata"]["resourceVersion"] = json!(state.revision.to_string());
                if object["spec"] != stored["spec"] {
                    let generation = stored["metadata"]["generation"].as_i64().unwrap_or(1);
                    object["metadata"]["generation"] = json!(generation + 1);
                }
                if finalized(&object) {
                    state.objects.remove(&object_path);
                } else {
                    state.objects.insert(object_path, object.clone());
                }
                (StatusCode::OK, object)
            }
            Method::DELETE => {
                let Some(mut object) = state.objects.get(&object_path).cloned() else {
                    return not_found(&object_path);
                };
                let uid = body.as_ref().map(|b| &b["preconditions"]["uid"]);
                if uid.is_some_and(|u| !u.is_null() && *u != object["metadata"]["uid"]) {
                    return status(StatusCode::CONFLICT, "Conflict", &object_path);
                }
                let has_finalizers = object["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| !f.is_empty());
                // A Pod bound to a node is deleted gracefully: it stays until its
                // kubelet confirms its containers have stopped.
                let graceful = object["kind"] == "Pod" && !object["spec"]["nodeName"].is_null();
                if has_finalizers || graceful {
                    object["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
                    state.objects.insert(object_path, object.clone());
                } else {
                    state.objects.remove(&object_path);
                }
                (StatusCode::OK, object)
            }
            _ => status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", path),
        }
    }
}

/// `labelSelector=key%3Dvalue` of a query, decoded.
fn label_selector(query: &str) -> Option<(String, String)> {
    let value = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("labelSelector="))?;
    let decoded = value.replace("%3D", "=").replace("%2F", "/");
    let (key, value) = decoded.split_once('=')?;
    Some((key.to_string(), value.to_string()))
}

/// Deleted and its last finalizer gone: the API server removes it.
fn finalized(object: &Value) -> bool {
    !object["metadata"]["deletionTimestamp"].is_null()
        && object["metadata"]["finalizers"]
            .as_array()
            .is_none_or(|f| f.is_empty())
}

fn not_found(path: &str) -> (StatusCode, Value) {
    status(StatusCode::NOT_FOUND, "NotFound", path)
}

fn status(code: StatusCode, reason: &str, path: &str) -> (StatusCode, Value) {
    (
        code,
        json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": reason, "code": code.as_u16(), "message": format!("{reason}: {path}"),
        }),
    )
}

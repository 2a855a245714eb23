//! The reconciler, phase by phase, against a scripted API server
//! ([`crate::testing`]) and a lock on an in-memory store: each test names
//! the requests its phase must send, in order (method, path, what the body says), and
//! what the store must hold when they are answered.

use std::sync::Arc;
use std::time::Duration;

use crate::queue::Action;
use http::Method;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::context::WAITERS_FIRST;
use super::{ErrorCategory, HELD_RESYNC, ReconcileError, error_policy, reconcile};
use crate::telemetry::Telemetry;
use crate::testing::{ApiServer, MemoryConnector, PATIENCE, Script, mock_client};
use crate::validated::ValidatedSpec;
use crate::waiters::WaitStart;
use crate::{Context, ControllerConfig, FINALIZER};
use lockwarden_api::conditions::{self, ACQUIRED, reason};
use lockwarden_api::{
    DistributedLock, DistributedLockSpec, DistributedLockStatus, KubernetesBackend, LockPhase,
};
use lockwarden_core::memory::MemoryStore;
use lockwarden_core::{
    AcquireRequest, Attempt, CasLock, FenceToken, LockBackend, LockRecord, LockState, Permits,
};

const NAME: &str = "db";
const NAMESPACE: &str = "team";
const LOCK_PATH: &str = "/apis/lockwarden.io/v1alpha1/namespaces/team/distributedlocks/db";
const STATUS_PATH: &str = "/apis/lockwarden.io/v1alpha1/namespaces/team/distributedlocks/db/status";
const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/team/events";
/// `<clusterName>/<namespace>/<name>` with the default cluster name.
const HOLDER: &str = "local/team/db";
const KEY: &str = "k8s://team/db";
const STORE_URL: &str = "mem://team/db";

/// A valid lock on a Lease key (the backend is the in-memory store whatever the spec
/// names: the controller never looks at the kind), its finalizer already on.
fn lock() -> DistributedLock {
    let mut spec = DistributedLockSpec {
        lease_duration: "3s".into(),
        renew_interval: "500ms".into(),
        ..Default::default()
    };
    spec.backend.kubernetes = Some(KubernetesBackend {
        lease_name: NAME.into(),
        namespace: None,
    });
    let mut lock = DistributedLock::new(NAME, spec);
    lock.metadata.namespace = Some(NAMESPACE.into());
    lock.metadata.uid = Some("uid-db".into());
    lock.metadata.generation = Some(1);
    lock.metadata.finalizers = Some(vec![FINALIZER.into()]);
    lock
}

struct Fixture {
    ctx: Arc<Context>,
    server: Option<ApiServer>,
    connector: Arc<MemoryConnector>,
    store: MemoryStore,
    /// What holder tasks and releases send to trigger a reconcile.
    wakes: UnboundedReceiver<ObjectRef<DistributedLock>>,
}

fn fixture() -> Fixture {
    let (client, server) = mock_client();
    let (wake, wakes) = unbounded_channel();
    let store = MemoryStore::new(STORE_URL);
    let connector = Arc::new(MemoryConnector::new(store.clone()));
    let telemetry = Arc::new(Telemetry::new());
    let ctx = Context::new(client, ControllerConfig::default(), wake, telemetry)
        .with_connector(connector.clone());
    Fixture {
        ctx: Arc::new(ctx),
        server: Some(server),
        connector,
        store,
        wakes,
    }
}

impl Fixture {
    /// One reconcile of `lock` while `script` plays the API server; the script's
    /// findings come back with the result.
    async fn reconcile<T, F, Fut>(
        &mut self,
        lock: &DistributedLock,
        script: F,
    ) -> (Result<Action, ReconcileError>, T)
    where
        T: Send + 'static,
        F: FnOnce(ApiServer) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = (ApiServer, T)> + Send + 'static,
    {
        let server = self.server.take().expect("one reconcile at a time");
        let script = Script::run(server, script);
        let result = tokio::time::timeout(
            PATIENCE * 3,
            reconcile(Arc::new(lock.clone()), self.ctx.clone()),
        )
        .await
        .expect("the reconcile finished");
        let (server, seen) = script.finish().await;
        self.server = Some(server);
        (result, seen)
    }

    /// A reconcile that must send no request at all.
    async fn reconcile_silently(
        &mut self,
        lock: &DistributedLock,
    ) -> Result<Action, ReconcileError> {
        self.reconcile(lock, |server| async move { (server, ()) })
            .await
            .0
    }

    /// The first reconcile with the finalizer on: acquires and reports it. Returns
    /// the status written.
    async fn acquire(&mut self, lock: &DistributedLock) -> DistributedLockStatus {
        let (result, (status, _note)) = self
            .reconcile_writing_status_and_event(lock, "Normal", "Acquired")
            .await;
        assert_eq!(result.expect("acquired"), Action::requeue(HELD_RESYNC));
        status
    }

    /// A reconcile whose only request is the status write. Returns the status written.
    async fn reconcile_writing_status(
        &mut self,
        lock: &DistributedLock,
    ) -> (Result<Action, ReconcileError>, DistributedLockStatus) {
        let answer = lock.clone();
        self.reconcile(lock, move |mut server| async move {
            let status = status_write(&mut server, &answer).await;
            (server, status)
        })
        .await
    }

    /// A reconcile that writes the status and then posts an Event of `type_` and
    /// `reason`. Returns the status written and the Event's note.
    async fn reconcile_writing_status_and_event(
        &mut self,
        lock: &DistributedLock,
        type_: &'static str,
        reason: &'static str,
    ) -> (
        Result<Action, ReconcileError>,
        (DistributedLockStatus, String),
    ) {
        let answer = lock.clone();
        self.reconcile(lock, move |mut server| async move {
            let status = status_write(&mut server, &answer).await;
            let note = event(&mut server, type_, reason).await;
            (server, (status, note))
        })
        .await
    }

    /// A lock this controller has acquired, its status as the acquisition wrote it.
    async fn held_lock(&mut self) -> DistributedLock {
        let mut lock = lock();
        lock.status = Some(self.acquire(&lock).await);
        lock
    }

    fn metrics(&self) -> String {
        self.ctx.telemetry.encode()
    }
}

/// Takes the status write (server-side apply of `status` as field manager
/// `lockwarden`) and answers with `lock` carrying it. Returns the status written.
async fn status_write(server: &mut ApiServer, lock: &DistributedLock) -> DistributedLockStatus {
    let write = server.expect(Method::PATCH, STATUS_PATH).await;
    assert_eq!(write.content_type, "application/apply-patch+yaml");
    assert!(
        write.query.contains("fieldManager=lockwarden") && write.query.contains("force=true"),
        "{}",
        write.query
    );
    assert_eq!(
        (&write.body["apiVersion"], &write.body["kind"]),
        (&json!("lockwarden.io/v1alpha1"), &json!("DistributedLock"))
    );
    let status: DistributedLockStatus =
        serde_json::from_value(write.body["status"].clone()).expect("a status");
    let mut answer = serde_json::to_value(lock).expect("JSON");
    answer["status"] = write.body["status"].clone();
    write.ok(&answer);
    status
}

/// Takes an Event about the lock of `type_` and `reason`; returns its note.
async fn event(server: &mut ApiServer, type_: &str, reason: &str) -> String {
    let post = server.expect(Method::POST, EVENTS_PATH).await;
    let body = &post.body;
    assert_eq!(
        (body["type"].as_str(), body["reason"].as_str()),
        (Some(type_), Some(reason)),
        "{body}"
    );
    assert_eq!(
        (&body["regarding"]["kind"], &body["regarding"]["name"]),
        (&json!("DistributedLock"), &json!(NAME)),
        "{body}"
    );
    let note = body["note"].as_str().unwrap_or_default().to_string();
    post.created();
    note
}

fn acquired(status: &DistributedLockStatus) -> &Condition {
    conditions::find_condition(&status.conditions, ACQUIRED).expect("the Acquired condition")
}

fn condition_says(status: &DistributedLockStatus) -> (&str, &str, &str) {
    let c = acquired(status);
    (c.status.as_str(), c.reason.as_str(), c.message.as_str())
}

/// What the API server does to an object deleted while a finalizer is on it.
fn mark_deleted(lock: &mut DistributedLock) {
    lock.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
}

/// Another holder on the same key, through its own contender on the store.
async fn held_elsewhere(store: &MemoryStore, holder: &str, permits: Permits) -> LockRecord {
    let other = CasLock::new(store.clone());
    let request = AcquireRequest {
        permits,
        ..AcquireRequest::new(holder, Duration::from_secs(60))
    };
    match other.try_acquire(&request).await.expect("the other holder") {
        Attempt::Acquired(lease) => lease.record,
        Attempt::Busy { .. } => panic!("the key was free"),
    }
}

/// `lockwarden_renewals_total`.
fn renewals(telemetry: &Telemetry) -> u64 {
    let metrics = telemetry.encode();
    let line = metrics
        .lines()
        .find_map(|l| l.strip_prefix("lockwarden_renewals_total "))
        .expect("the renewals counter");
    line.trim().parse().expect("a count")
}

/// Waits (generously) until `done` holds.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "{what}: never");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn first_acquire_adds_the_finalizer_then_writes_held_with_its_fence() {
    let mut f = fixture();
    let mut new = lock();
    new.metadata.finalizers = None;
    let answer = lock();
    let (result, ()) = f
        .reconcile(&new, move |mut server| async move {
            let add = server.expect(Method::PATCH, LOCK_PATH).await;
            assert_eq!(add.content_type, "application/json-patch+json");
            assert_eq!(
                add.body,
                json!([
                    {"op": "test", "path": "/metadata/finalizers", "value": null},
                    {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]},
                ])
            );
            add.ok(&serde_json::to_value(&answer).expect("JSON"));
            (server, ())
        })
        .await;
    assert_eq!(result.expect("finalizer added"), Action::await_change());
    assert_eq!(
        (f.connector.connects(), f.store.requests()),
        (0, (0, 0)),
        "nothing is acquired before the finalizer is on"
    );

    let with_finalizer = lock();
    let answer = with_finalizer.clone();
    let store = f.store.clone();
    let (result, (status, note)) = f
        .reconcile(&with_finalizer, move |mut server| async move {
            let status = status_write(&mut server, &answer).await;
            let stored = store.record();
            assert_eq!(
                (stored.state, stored.holder.as_str()),
                (LockState::Held, HOLDER),
                "the store holds the lock before the status says so"
            );
            let note = event(&mut server, "Normal", "Acquired").await;
            (server, (status, note))
        })
        .await;
    assert_eq!(result.expect("acquired"), Action::requeue(HELD_RESYNC));
    let record = f.store.record();
    assert_eq!(status.phase, Some(LockPhase::Held));
    assert_eq!(status.holder.as_deref(), Some(HOLDER));
    assert_eq!(status.key.as_deref(), Some(KEY));
    assert_eq!(status.fence, Some(1));
    assert_eq!(status.nonce.as_deref(), Some(record.nonce.as_str()));
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(
        condition_says(&status),
        ("True", reason::LEASE_HELD, "held with fence 1")
    );
    assert_eq!(note, format!("acquired {KEY} as {HOLDER} with fence 1"));
    assert!(f.metrics().contains("lockwarden_locks{phase=\"Held\"} 1\n"));
}

#[tokio::test]
async fn busy_waits_naming_the_holder() {
    let mut f = fixture();
    let theirs = held_elsewhere(&f.store, "east/team/db", Permits::MUTEX).await;
    let lock = lock();
    let (result, status) = f.reconcile_writing_status(&lock).await;
    let action = result.expect("waiting");
    assert_ne!(action, Action::await_change(), "a waiting lock tries again");
    assert_eq!(status.phase, Some(LockPhase::Waiting));
    assert_eq!(status.holder.as_deref(), Some("east/team/db"));
    assert!(status.waiting_since.is_some());
    assert_eq!(status.fence, None, "the holder's fence is not ours");
    assert_eq!(
        condition_says(&status),
        ("False", reason::WAITING, "held by east/team/db (fence 1)")
    );
    assert_eq!(f.store.record(), theirs, "still theirs");
    let obj = ObjectRef::from_obj(&lock);
    assert!(
        f.ctx.waiters.current(&obj, "uid-db", KEY).is_some(),
        "waiting on the key, to be woken by a release"
    );
}

#[tokio::test]
async fn held_and_renewing_writes_no_status_per_renewal() {
    let mut f = fixture();
    let lock = f.held_lock().await;
    // Two renewals (every 500 ms) land in the store and are counted...
    let telemetry = f.ctx.telemetry.clone();
    eventually("two renewals counted", || renewals(&telemetry) >= 2).await;
    let history = f.store.history();
    assert!(history.len() >= 3, "acquisition + renewals: {history:?}");
    // ...and wake no reconcile: renewals are not transitions.
    assert!(f.wakes.try_recv().is_err(), "a renewal woke a reconcile");
    // A resync of the held lock finds nothing to write.
    let action = f.reconcile_silently(&lock).await.expect("held");
    assert_eq!(action, Action::requeue(HELD_RESYNC));
    assert_eq!(f.store.record().holder, HOLDER);
}

#[tokio::test]
async fn released_on_delete_before_the_finalizer_goes() {
    let mut f = fixture();
    let mut lock = f.held_lock().await;
    mark_deleted(&mut lock);
    let mut gone = lock.clone();
    gone.metadata.finalizers = None;
    let store = f.store.clone();
    let (result, note) = f
        .reconcile(&lock, move |mut server| async move {
            let note = event(&mut server, "Normal", "Released").await;
            let remove = server.expect(Method::PATCH, LOCK_PATH).await;
            assert_eq!(
                store.record().state,
                LockState::Released,
                "the store release comes before the finalizer's removal"
            );
            assert_eq!(remove.content_type, "application/json-patch+json");
            assert_eq!(
                remove.body,
                json!([
                    {"op": "test", "path": "/metadata/finalizers/0", "value": FINALIZER},
                    {"op": "remove", "path": "/metadata/finalizers/0"},
                ])
            );
            remove.ok(&serde_json::to_value(&gone).expect("JSON"));
            (server, note)
        })
        .await;
    assert_eq!(result.expect("cleaned up"), Action::await_change());
    assert_eq!(note, format!("released {KEY} (fence 1) before deletion"));
    assert!(f.metrics().contains("lockwarden_release_errors_total 0\n"));
    assert!(!f.metrics().contains("lockwarden_locks{phase=\"Held\"} 1\n"));
}

/// A release lets the waiters it woke reconcile before its own last writes (a waiter's
/// status write at the same moment shares the API server with them), and waits for a
/// waiter whose reconcile does not end no longer than `WAITERS_FIRST`. On the paused
/// clock: no time passes unless everything waits for a timer.
#[tokio::test(start_paused = true)]
async fn a_hand_off_lets_the_woken_waiters_reconcile_first_for_at_most_a_bound() {
    let mut f = fixture();
    let holder = ObjectRef::<DistributedLock>::new("holder").within(NAMESPACE);
    let waiter = ObjectRef::<DistributedLock>::new("waiter").within(NAMESPACE);
    let backend: Arc<dyn LockBackend> = Arc::new(CasLock::new(f.store.clone()));
    f.ctx
        .waiters
        .insert(&waiter, "uid-w", KEY, backend, WaitStart::now());
    let hand_off = |ctx: Arc<Context>, holder: ObjectRef<DistributedLock>| {
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            ctx.hand_off(KEY, &holder, None).await;
            start.elapsed()
        })
    };

    let handing = hand_off(f.ctx.clone(), holder.clone());
    assert_eq!(
        f.wakes.recv().await,
        Some(waiter.clone()),
        "the waiter woken"
    );
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert!(
        !handing.is_finished(),
        "went on before the waiter's reconcile ended"
    );
    f.ctx.reconciled(&waiter);
    let waited = handing.await.expect("handed off");
    assert_eq!(
        waited,
        Duration::ZERO,
        "waited on after the waiter's reconcile"
    );

    let handing = hand_off(f.ctx.clone(), holder);
    assert_eq!(f.wakes.recv().await, Some(waiter), "the waiter woken again");
    let waited = handing.await.expect("handed off");
    assert!(
        waited >= WAITERS_FIRST && waited < WAITERS_FIRST * 2,
        "waited {waited:?} for a reconcile that did not end"
    );
}

/// docs/design.md §6.3: a lock deleted while the Job that claims it still has a Pod
/// running is not released (no clean release beside running processes); it stays held
/// until the Job's Pods are observed ended, then is released.
#[tokio::test]
async fn stop_a_lock_deleted_under_a_running_job_is_released_only_once_its_pods_ended() {
    const JOB_PATH: &str = "/apis/batch/v1/namespaces/team/jobs/j";
    const PODS_PATH: &str = "/api/v1/namespaces/team/pods";
    let mut f = fixture();
    let mut lock = f.held_lock().await;
    lock.metadata.annotations = Some(
        [(
            crate::gating::CLAIM_ANNOTATION.to_string(),
            "j/job-uid".to_string(),
        )]
        .into(),
    );
    mark_deleted(&mut lock);
    let job = |active: i32| {
        json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": { "name": "j", "namespace": NAMESPACE, "uid": "job-uid" },
            "spec": { "template": { "spec": { "containers": [{ "name": "c" }] } } },
            "status": { "active": active },
        })
    };
    let running = job(1);
    let (result, ()) = f
        .reconcile(&lock, move |mut server| async move {
            server.expect(Method::GET, JOB_PATH).await.ok(&running);
            (server, ())
        })
        .await;
    assert_eq!(
        result.expect("waits"),
        Action::requeue(super::CLAIMANT_RECHECK)
    );
    assert_eq!(f.store.record().state, LockState::Held, "not released");

    let ended = job(0);
    let mut gone = lock.clone();
    gone.metadata.finalizers = None;
    let store = f.store.clone();
    let (result, ()) = f
        .reconcile(&lock, move |mut server| async move {
            server.expect(Method::GET, JOB_PATH).await.ok(&ended);
            let list = server.expect(Method::GET, PODS_PATH).await;
            assert!(list.query.contains("controller-uid"), "{}", list.query);
            list.ok(&json!({ "apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [] }));
            event(&mut server, "Normal", "Released").await;
            server
                .expect(Method::PATCH, LOCK_PATH)
                .await
                .ok(&serde_json::to_value(&gone).expect("JSON"));
            assert_eq!(store.record().state, LockState::Released);
            (server, ())
        })
        .await;
    assert_eq!(result.expect("cleaned up"), Action::await_change());
}

#[tokio::test]
async fn a_release_the_store_refuses_on_delete_is_counted_and_told() {
    let mut f = fixture();
    let mut lock = f.held_lock().await;
    f.store.set_unreachable(true);
    mark_deleted(&mut lock);
    let (result, note) = f
        .reconcile(&lock, move |mut server| async move {
            let note = event(&mut server, "Normal", "Released").await;
            let remove = server.expect(Method::PATCH, LOCK_PATH).await;
            remove.ok(&json!({
                "apiVersion": "lockwarden.io/v1alpha1", "kind": "DistributedLock",
                "metadata": {"name": NAME, "namespace": NAMESPACE}, "spec": {"backend": {}},
            }));
            (server, note)
        })
        .await;
    assert_eq!(result.expect("deletion goes on"), Action::await_change());
    assert!(
        note.starts_with(&format!("deleting; release of {KEY} reported: ")),
        "{note}"
    );
    assert!(
        f.metrics().contains("lockwarden_release_errors_total 1\n"),
        "{}",
        f.metrics()
    );
}

/// Held before a restart and deleted before it was resumed: released by the nonce in
/// its status (no holder task), then the finalizer goes.
#[tokio::test]
async fn released_by_nonce_on_delete_after_a_restart() {
    let mut f = fixture();
    let before_restart = held_elsewhere(&f.store, HOLDER, Permits::MUTEX).await;
    let mut lock = lock();
    lock.status = Some(DistributedLockStatus {
        phase: Some(LockPhase::Held),
        nonce: Some(before_restart.nonce.clone()),
        fence: Some(1),
        ..Default::default()
    });
    mark_deleted(&mut lock);
    let mut gone = lock.clone();
    gone.metadata.finalizers = None;
    let store = f.store.clone();
    let (result, ()) = f
        .reconcile(&lock, move |mut server| async move {
            let remove = server.expect(Method::PATCH, LOCK_PATH).await;
            let stored = store.record();
            assert_eq!(
                (stored.state, stored.nonce.as_str()),
                (LockState::Released, before_restart.nonce.as_str()),
                "released by its nonce before the finalizer's removal"
            );
            assert_eq!(
                remove.body[1],
                json!({"op": "remove", "path": "/metadata/finalizers/0"})
            );
            remove.ok(&serde_json::to_value(&gone).expect("JSON"));
            (server, ())
        })
        .await;
    assert_eq!(result.expect("cleaned up"), Action::await_change());
    assert_eq!(f.connector.connects(), 1);
    assert!(f.metrics().contains("lockwarden_release_errors_total 0\n"));
}

#[tokio::test]
async fn lost_reports_lost_with_a_warning_event() {
    let mut f = fixture();
    let lock = f.held_lock().await;
    let thief = LockRecord::new_acquisition("thief", FenceToken(7), Duration::from_secs(60), None);
    f.store.put(Ok(thief));
    let woken = tokio::time::timeout(Duration::from_secs(30), f.wakes.recv())
        .await
        .expect("the holder task reports the loss")
        .expect("a wake");
    assert_eq!(woken, ObjectRef::from_obj(&lock));
    let (result, (status, note)) = f
        .reconcile_writing_status_and_event(&lock, "Warning", "Lost")
        .await;
    assert_eq!(result.expect("reported"), Action::await_change());
    assert_eq!(status.phase, Some(LockPhase::Lost));
    assert_eq!((status.fence, status.nonce.as_deref()), (None, None));
    let (ok, why, message) = condition_says(&status);
    assert_eq!((ok, why), ("False", reason::LOST));
    assert!(
        message.starts_with("lock lost: taken over by thief (fence 7"),
        "{message}"
    );
    assert_eq!(note, message);
    assert_eq!(f.store.record().holder, "thief", "nothing written over it");
}

#[tokio::test]
async fn invalid_spec_fails_without_a_store_request() {
    let mut f = fixture();
    let mut lock = lock();
    lock.spec.renew_interval = "2s".into(); // not less than half the 3 s lease
    let expected = ValidatedSpec::of(&lock, "local")
        .expect_err("invalid")
        .to_string();
    let (result, (status, note)) = f
        .reconcile_writing_status_and_event(&lock, "Warning", "Failed")
        .await;
    let error = result.expect_err("an invalid spec is an error");
    assert_eq!(error.category(), ErrorCategory::Invalid);
    assert_eq!(status.phase, Some(LockPhase::Failed));
    assert_eq!(
        condition_says(&status),
        ("False", reason::INVALID_SPEC, expected.as_str())
    );
    assert_eq!(note, expected);
    assert_eq!(
        (f.connector.connects(), f.store.requests()),
        (0, (0, 0)),
        "no backend is asked for"
    );
    // Waits for the spec to change instead of retrying.
    let action = error_policy(Arc::new(lock), &error, f.ctx.clone());
    assert_eq!(action, Action::await_change());
    assert!(
        f.metrics()
            .contains("lockwarden_reconcile_errors_total{category=\"invalid\"} 1\n"),
        "{}",
        f.metrics()
    );
}

#[tokio::test]
async fn permits_disagreeing_fails_and_stops_waiting() {
    let mut f = fixture();
    held_elsewhere(&f.store, "east/team/db", Permits::semaphore(3)).await;
    let mut lock = lock();
    lock.spec.permits = 2;
    let (result, (status, note)) = f
        .reconcile_writing_status_and_event(&lock, "Warning", "Failed")
        .await;
    assert_eq!(result.expect("final"), Action::await_change());
    assert_eq!(status.phase, Some(LockPhase::Failed));
    let (ok, why, message) = condition_says(&status);
    assert_eq!((ok, why), ("False", reason::PERMITS_DISAGREE));
    assert!(
        message.contains("held with 3 permits but this lock asks for 2"),
        "{message}"
    );
    assert_eq!(note, message);
    let obj = ObjectRef::from_obj(&lock);
    assert!(
        f.ctx.waiters.current(&obj, "uid-db", KEY).is_none(),
        "no longer waiting on the key"
    );
}

#[tokio::test]
async fn backend_unavailable_says_so_and_backs_off() {
    let mut f = fixture();
    f.store.set_unreachable(true);
    let lock = lock(); // no creation time: not a lock whose store may still be starting
    let (result, status) = f.reconcile_writing_status(&lock).await;
    let error = result.expect_err("the store is unreachable");
    assert!(
        matches!(
            &error,
            ReconcileError::Finalizer(e)
                if matches!(&**e, kube::runtime::finalizer::Error::ApplyFailed(ReconcileError::Store(_)))
        ),
        "{error:?}"
    );
    assert_eq!(error.category(), ErrorCategory::StoreUnavailable);
    let message = format!("{STORE_URL}: backend unavailable: store unreachable (test)");
    assert_eq!(status.phase, Some(LockPhase::Pending));
    assert_eq!(
        condition_says(&status),
        ("False", reason::BACKEND_ERROR, message.as_str())
    );
    let action = error_policy(Arc::new(lock), &error, f.ctx.clone());
    assert_ne!(action, Action::await_change(), "retried");
    assert!(
        f.metrics()
            .contains("lockwarden_reconcile_errors_total{category=\"store_unavailable\"} 1\n"),
        "{}",
        f.metrics()
    );
    // The cause is kept as the error's source, with the same text.
    let ReconcileError::Finalizer(e) = &error else {
        unreachable!()
    };
    let kube::runtime::finalizer::Error::ApplyFailed(ReconcileError::Store(lock_error)) = &**e
    else {
        unreachable!()
    };
    let cause = std::error::Error::source(lock_error).expect("a source");
    assert_eq!(cause.to_string(), "store unreachable (test)");
}

#[test]
fn kubernetes_errors_are_categorised_by_their_code() {
    let api = |code: u16| {
        let status: kube::core::Status = serde_json::from_value(json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
        }))
        .expect("a Status");
        ReconcileError::Status(kube::Error::Api(Box::new(status)))
    };
    assert_eq!(api(409).category(), ErrorCategory::Conflict);
    assert_eq!(api(422).category(), ErrorCategory::Invalid);
    assert_eq!(api(400).category(), ErrorCategory::Invalid);
    assert_eq!(api(500).category(), ErrorCategory::KubernetesApi);
    assert_eq!(api(429).category(), ErrorCategory::KubernetesApi);
    assert_eq!(api(403).category(), ErrorCategory::KubernetesApi);
    let finalizer = |e| ReconcileError::Finalizer(Box::new(e));
    use kube::runtime::finalizer::Error as F;
    let ReconcileError::Status(e) = api(409) else {
        unreachable!()
    };
    assert_eq!(
        finalizer(F::RemoveFinalizer(e)).category(),
        ErrorCategory::Conflict
    );
    assert_eq!(
        finalizer(F::ApplyFailed(api(503))).category(),
        ErrorCategory::KubernetesApi
    );
    assert_eq!(
        finalizer(F::UnnamedObject).category(),
        ErrorCategory::Invalid
    );
    let unavailable = lockwarden_core::LockError::Unavailable {
        url: STORE_URL.into(),
        cause: "down".into(),
    };
    assert_eq!(
        finalizer(F::CleanupFailed(ReconcileError::Store(unavailable))).category(),
        ErrorCategory::StoreUnavailable
    );
    // The backoffs docs/architecture.md states.
    let backoffs: Vec<_> = [
        ErrorCategory::StoreUnavailable,
        ErrorCategory::Conflict,
        ErrorCategory::Invalid,
        ErrorCategory::KubernetesApi,
    ]
    .iter()
    .map(|c| (c.as_str(), c.backoff()))
    .collect();
    assert_eq!(
        backoffs,
        [
            ("store_unavailable", Some(Duration::from_secs(5))),
            ("conflict", Some(Duration::from_secs(1))),
            ("invalid", None),
            ("kubernetes_api", Some(Duration::from_secs(10))),
        ]
    );
}

/// `lockwarden_lock_losses_total{reason}`: every `LostReason` maps as docs/metrics.md
/// ("Loss reasons") says, and renewals failing before the loss make it
/// `store_unavailable` whatever the store said.
#[test]
fn loss_reasons_map_as_the_metrics_doc_says() {
    use crate::telemetry::LossReason;
    use lockwarden_core::{FenceToken, ForeignRecord, HeldBy, LostReason};
    let by = HeldBy {
        holder: "other".into(),
        fence: FenceToken(2),
        since: None,
        nonce: String::new(),
    };
    let foreign = ForeignRecord {
        what: "not ours".into(),
    };
    let rows = [
        (LostReason::TakenOver(by.clone()), LossReason::TakenOver),
        (LostReason::Deleted, LossReason::ReleasedByHand),
        (LostReason::ReleasedElsewhere, LossReason::ReleasedByHand),
        (LostReason::Foreign(foreign), LossReason::ReleasedByHand),
        (LostReason::SessionExpired, LossReason::Expired),
        (LostReason::EntryGone, LossReason::Expired),
        (LostReason::NotOurs, LossReason::Expired),
    ];
    for (why, reason) in rows {
        assert_eq!(super::loss_reason(&why, false), reason, "{why}");
        assert_eq!(
            super::loss_reason(&why, true),
            LossReason::StoreUnavailable,
            "{why} after LeaseExpiring"
        );
    }
}

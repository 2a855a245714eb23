//! The pure Pod-gate decisions: annotations → settings, Pod → phase.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::*;
use crate::gating::LOST_GRACE_ANNOTATION;
use crate::gating::decide::{Gate, LockSet};
use crate::gating::decide::{LockStanding, RunningAction};
use crate::gating::machine::workload;
use crate::gating::{Phase, Settings};

/// The decision for a running workload with these settings.
fn running_action(standing: &LockStanding, s: &Settings, not_held_for: Duration) -> RunningAction {
    crate::gating::decide::running_action(standing, s.loss_policy(), not_held_for)
}

fn pod(annotations: serde_json::Value, gates: &[&str]) -> Pod {
    let gates: Vec<_> = gates.iter().map(|g| json!({ "name": g })).collect();
    serde_json::from_value(json!({
        "metadata": { "name": "p", "uid": "0123456789ab", "annotations": annotations },
        "spec": { "containers": [], "schedulingGates": gates },
    }))
    .unwrap()
}

#[test]
fn settings_default_to_delete_and_take_the_shared_annotations() {
    let s = Settings::of(&pod(json!({ LOCK_ANNOTATION: "db" }), &[SCHEDULING_GATE]))
        .unwrap()
        .unwrap();
    assert_eq!(s.locks, LockSet::one(Gate::Named("db".into())));
    assert_eq!(s.on_lock_lost, OnLockLost::Stop);
    assert_eq!(s.lost_grace, Duration::ZERO);
    let s = Settings::of(&pod(
        json!({ TEMPLATE_ANNOTATION: "q", ON_LOCK_LOST_ANNOTATION: "ignore",
                LOST_GRACE_ANNOTATION: "200ms" }),
        &[SCHEDULING_GATE],
    ))
    .unwrap()
    .unwrap();
    assert_eq!(s.locks, LockSet::one(Gate::Template("q".into())));
    assert_eq!(s.on_lock_lost, OnLockLost::Ignore);
    assert_eq!(s.lost_grace, Duration::from_millis(200));
    assert_eq!(Settings::of(&pod(json!({}), &[SCHEDULING_GATE])), Ok(None));
}

#[test]
fn bad_annotations_name_the_problem() {
    let bad = |a: serde_json::Value| {
        Settings::of(&pod(a, &[SCHEDULING_GATE]))
            .unwrap_err()
            .to_string()
    };
    // A Job's policy is not a Pod's: the message names the value and the allowed ones.
    let e = bad(json!({ LOCK_ANNOTATION: "db", ON_LOCK_LOST_ANNOTATION: "suspend" }));
    assert!(
        e.contains("\"suspend\"") && e.contains("delete, ignore"),
        "{e}"
    );
    let e = bad(json!({ LOCK_ANNOTATION: "db", TEMPLATE_ANNOTATION: "q" }));
    assert!(e.contains("a Pod names one lock"), "{e}");
    let e = bad(json!({ LOCK_ANNOTATION: "other/db" }));
    assert!(e.contains("another namespace"), "{e}");
    let e = bad(json!({ LOCK_ANNOTATION: "Not_A_Name" }));
    assert!(e.contains(LOCK_ANNOTATION), "{e}");
    let e = bad(json!({ LOCK_ANNOTATION: "db", LOST_GRACE_ANNOTATION: "10s" }));
    assert!(e.contains("keep the Pod running"), "{e}");
}

#[test]
fn phases_follow_the_gate_the_fence_and_the_pod_phase() {
    let gated = pod(
        json!({ LOCK_ANNOTATION: "db" }),
        &["other", SCHEDULING_GATE],
    );
    assert_eq!(Phase::of(&gated), Phase::HeldBack);
    assert_eq!(other_gates(&gated).len(), 1);
    assert_eq!(other_gates(&gated)[0].name, "other");

    let mut running = pod(json!({ LOCK_ANNOTATION: "db", FENCE_ANNOTATION: "7" }), &[]);
    assert_eq!(Phase::of(&running), Phase::Running);
    let db = [WorkloadLock {
        gate: Gate::Named("db".into()),
        name: "db".into(),
    }];
    assert_eq!(running.fences(&db), [("db".to_string(), Some(7))]);
    // Gate still there: not ungated by us, whatever the annotations say.
    let fenced_but_gated = pod(
        json!({ LOCK_ANNOTATION: "db", FENCE_ANNOTATION: "7" }),
        &[SCHEDULING_GATE],
    );
    assert_eq!(Phase::of(&fenced_but_gated), Phase::HeldBack);
    assert_eq!(
        Phase::of(&pod(json!({ LOCK_ANNOTATION: "db" }), &[])),
        Phase::NotHeldBack
    );

    running.spec.as_mut().unwrap().node_name = Some("node-1".into());
    let mut deleted = running.clone();
    deleted.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
    );
    assert_eq!(Phase::of(&deleted), Phase::Deleted);
    assert!(
        !processes_ended(&deleted),
        "bound, not terminal: containers may run"
    );
    deleted.status = Some(serde_json::from_value(json!({ "phase": "Failed" })).unwrap());
    assert!(processes_ended(&deleted));
    let mut unbound = running.clone();
    unbound.spec.as_mut().unwrap().node_name = None;
    assert!(
        !processes_ended(&unbound),
        "not bound yet, but the scheduler may still bind it"
    );
    unbound.metadata.deletion_timestamp = deleted.metadata.deletion_timestamp.clone();
    assert!(
        processes_ended(&unbound),
        "deleted before it was bound: nothing ran"
    );

    running.status = Some(serde_json::from_value(json!({ "phase": "Succeeded" })).unwrap());
    assert_eq!(Phase::of(&running), Phase::Finished);
}

#[test]
fn a_pod_acts_on_a_lost_lock_unless_it_ignores_it() {
    let lost = LockStanding::NotHeld {
        reason: "Lost",
        why: "lock db is Lost".into(),
        may_recover: false,
    };
    let mut s = Settings::of(&pod(json!({ LOCK_ANNOTATION: "db" }), &[SCHEDULING_GATE]))
        .unwrap()
        .unwrap();
    assert_eq!(
        running_action(&lost, &s, Duration::ZERO),
        RunningAction::Stop
    );
    assert_eq!(
        running_action(&LockStanding::Held, &s, Duration::ZERO),
        RunningAction::Continue
    );
    s.on_lock_lost = OnLockLost::Ignore;
    assert_eq!(
        running_action(&lost, &s, Duration::ZERO),
        RunningAction::Warn
    );
}

#[test]
fn a_pods_own_lock_and_claim_say_it_is_a_pod() {
    let p = pod(json!({}), &[]);
    let w = workload(&p);
    assert_eq!(w.own_lock_name(), "p-01234567");
    assert_eq!(w.claim(), "pod/p/0123456789ab");
    let owner = w.owner_reference();
    assert_eq!(
        (owner.kind.as_str(), owner.api_version.as_str()),
        ("Pod", "v1")
    );
}

/// The release paths against the scripted API (docs/design.md §6.3): the test plays the
/// lock controller and the kubelet by writing the objects.
mod release_waits_for_the_containers {
    use std::sync::Arc;

    use kube::ResourceExt;
    use serde_json::{Value, json};

    use super::*;
    use crate::config::FINALIZER;
    use crate::fake_api::{FakeApi, LockStatus};
    use crate::gating::machine::{Gating, reconcile};
    use crate::gating::{CLAIM_ANNOTATION, GUARD_ANNOTATION, STATUS_ANNOTATION};

    const LOCK: &str = "/apis/lockwarden.io/v1alpha1/namespaces/ns/distributedlocks/db";
    const POD: &str = "/api/v1/namespaces/ns/pods/p";

    /// A gated Pod running on a node with fence 5, its lock db claimed and held for it.
    fn scene() -> (FakeApi, Arc<Gating<Pod>>) {
        let api = FakeApi::default();
        api.put(
            LOCK,
            json!({
                "apiVersion": "lockwarden.io/v1alpha1", "kind": "DistributedLock",
                "metadata": { "name": "db", "namespace": "ns",
                              "annotations": { CLAIM_ANNOTATION: "pod/p/pod-uid" } },
                "spec": { "backend": { "kubernetes": { "leaseName": "db" } } },
            }),
        );
        lock_status(&api, "Held", true);
        api.put(
            POD,
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": { "name": "p", "namespace": "ns", "uid": "pod-uid",
                              "finalizers": [FINALIZER],
                              "labels": { GATED_LABEL: "true" },
                              "annotations": { LOCK_ANNOTATION: "db", FENCE_ANNOTATION: "5" } },
                "spec": { "nodeName": "node-1", "containers": [{ "name": "c" }] },
                "status": { "phase": "Running" },
            }),
        );
        let ctx = Gating::<Pod>::alone(api.client());
        (api, ctx)
    }

    fn lock_status(api: &FakeApi, phase: &str, acquired: bool) {
        let status = LockStatus {
            phase,
            acquired,
            message: "m",
            fence: 5,
            holder: "c/ns/pod/p/pod-uid",
            nonce: None,
        };
        api.set_lock_status(LOCK, &status);
    }

    async fn step(api: &FakeApi, ctx: &Arc<Gating<Pod>>) {
        let pod: Pod = api.object(POD);
        reconcile(Arc::new(pod), ctx.clone())
            .await
            .expect("reconcile");
    }

    fn released(api: &FakeApi) -> bool {
        let lock = api.get(LOCK).unwrap();
        lock["spec"]["release"] == true
            && lock["metadata"]["annotations"][CLAIM_ANNOTATION].is_null()
    }

    #[tokio::test]
    async fn stop_a_pod_deleted_after_a_loss_is_released_only_once_it_has_ended() {
        let (api, ctx) = scene();
        lock_status(&api, "Lost", false);
        step(&api, &ctx).await;
        let pod: Pod = api.object(POD);
        assert!(pod.metadata.deletion_timestamp.is_some(), "deleted");
        step(&api, &ctx).await;
        assert!(!released(&api), "released while its containers may run");
        api.merge(POD, json!({ "status": { "phase": "Failed" } }));
        step(&api, &ctx).await;
        assert!(released(&api));
        assert!(api.get(POD).is_none(), "the finalizer went");
    }

    #[tokio::test]
    async fn stop_a_force_deleted_running_pod_is_released_only_once_it_has_ended() {
        let (api, ctx) = scene();
        api.merge(
            POD,
            json!({ "metadata": { "deletionTimestamp": "2026-01-01T00:00:00Z",
                                  "deletionGracePeriodSeconds": 0 } }),
        );
        step(&api, &ctx).await;
        assert!(!released(&api), "released while its containers may run");
        let pod: Pod = api.object(POD);
        assert!(pod.finalizers().iter().any(|f| f == FINALIZER));
        api.merge(POD, json!({ "status": { "phase": "Succeeded" } }));
        step(&api, &ctx).await;
        assert!(released(&api));
    }

    /// A labelled Pod as created with the gate and `lockwarden.io/guard: "true"`, its one
    /// container running `command`; db held for it.
    fn guard_scene(command: Value) -> (FakeApi, Arc<Gating<Pod>>) {
        let (api, ctx) = scene();
        let mut pod = api.get(POD).unwrap();
        pod["metadata"]["annotations"] = json!({ LOCK_ANNOTATION: "db", GUARD_ANNOTATION: "true" });
        pod["spec"] = json!({
            "schedulingGates": [{ "name": SCHEDULING_GATE }],
            "containers": [{ "name": "work", "command": command }],
        });
        pod["status"] = json!({ "phase": "Pending" });
        api.put(POD, pod);
        (api, ctx)
    }

    #[tokio::test]
    async fn guard_a_pod_asking_for_the_guard_without_it_stays_gated_with_a_warning() {
        let (api, ctx) = guard_scene(json!(["sh", "-c", "work"]));
        step(&api, &ctx).await;
        let pod: Pod = api.object(POD);
        assert!(pod.held_back(), "still gated");
        let status = &pod.annotations()[STATUS_ANNOTATION];
        assert!(
            status.contains("container work does not run `lockwarden guard`"),
            "{status}"
        );
        assert_eq!(api.event_reasons(), ["GuardMissing"]);
    }

    #[tokio::test]
    async fn guard_a_pod_whose_containers_run_the_guard_is_ungated() {
        let (api, ctx) = guard_scene(json!(["lockwarden", "guard", "--", "sh"]));
        step(&api, &ctx).await;
        let pod: Pod = api.object(POD);
        assert!(!pod.held_back(), "ungated: {pod:?}");
        // (A named lock without a lock-delay is warned about too: not the guard's.)
        let reasons = api.event_reasons();
        assert_eq!(
            reasons.first().map(String::as_str),
            Some("Started"),
            "{reasons:?}"
        );
        assert!(!reasons.iter().any(|r| r == "GuardMissing"), "{reasons:?}");
    }
}

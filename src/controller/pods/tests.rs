//! The pure Pod-gate decisions: annotations → settings, Pod → phase.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::*;
use crate::controller::gating::LOST_GRACE_ANNOTATION;
use crate::controller::gating::decide::{Gate, LockSet};
use crate::controller::gating::decide::{LockStanding, RunningAction};
use crate::controller::gating::machine::workload;
use crate::controller::gating::{Phase, Settings};

/// The decision for a running workload with these settings.
fn running_action(standing: &LockStanding, s: &Settings, not_held_for: Duration) -> RunningAction {
    crate::controller::gating::decide::running_action(standing, s.loss_policy(), not_held_for)
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
    let bad = |a: serde_json::Value| Settings::of(&pod(a, &[SCHEDULING_GATE])).unwrap_err();
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
        deleted.still_running_after_delete().is_some(),
        "bound, not terminal: containers may run"
    );
    deleted.status = Some(serde_json::from_value(json!({ "phase": "Failed" })).unwrap());
    assert!(deleted.still_running_after_delete().is_none());
    let mut unbound = running.clone();
    unbound.spec.as_mut().unwrap().node_name = None;
    assert!(
        unbound.still_running_after_delete().is_none(),
        "never bound: nothing ran"
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

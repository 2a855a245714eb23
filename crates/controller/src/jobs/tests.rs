//! The pure Job-gate decisions: annotations → settings, Job → phase, lock → standing,
//! standing + settings → action.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

use super::*;
use crate::gating::decide::{Gate, LockSet, max_lost_grace};
use crate::gating::{Phase, Settings};
use lockwarden_api::DistributedLockSpec;
use lockwarden_api::conditions::condition;
use lockwarden_api::conditions::{ACQUIRED, reason};
use lockwarden_api::{DistributedLock, LockPhase};

use crate::gating::decide::{LockStanding, RunningAction};
use crate::gating::decide::{is_old_acquisition, standing};
use crate::gating::lockset::WorkloadLock;
use lockwarden_core::SafetyMargins;

/// The decision for a running workload with these settings.
fn running_action(standing: &LockStanding, s: &Settings, not_held_for: Duration) -> RunningAction {
    crate::gating::decide::running_action(standing, s.loss_policy(), not_held_for)
}

fn job(annotations: serde_json::Value, spec: serde_json::Value) -> Job {
    let mut spec = spec;
    spec["template"] = json!({ "spec": { "containers": [] } });
    serde_json::from_value(json!({
        "metadata": { "name": "j", "uid": "0123456789ab", "annotations": annotations },
        "spec": spec,
    }))
    .unwrap()
}

fn gated(extra: &[(&str, &str)]) -> Job {
    let mut annotations = json!({ LOCK_ANNOTATION: "db" });
    for (k, v) in extra {
        annotations[*k] = json!(v);
    }
    job(annotations, json!({ "suspend": true }))
}

/// The one lock of `gated()`.
fn db() -> Vec<WorkloadLock> {
    vec![WorkloadLock {
        gate: Gate::Named("db".into()),
        name: "db".into(),
    }]
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// A lock in `phase` with `fence`, its Acquired condition `acquired` for `reason`.
fn lock(phase: LockPhase, fence: i64, acquired: bool, why: &str) -> DistributedLock {
    let mut lock = DistributedLock::new("db", DistributedLockSpec::default());
    lock.metadata.generation = Some(1);
    lock.status = Some(lockwarden_api::DistributedLockStatus {
        phase: Some(phase),
        fence: Some(fence),
        holder: Some("c/ns/db".into()),
        observed_generation: Some(1),
        conditions: vec![condition(ACQUIRED, acquired, why, "msg", Some(1), now())],
        ..Default::default()
    });
    lock
}

#[test]
fn settings_default_to_suspend_without_grace() {
    let s = Settings::of(&gated(&[])).unwrap().unwrap();
    assert_eq!(s.locks, LockSet::one(Gate::Named("db".into())));
    assert_eq!(s.on_lock_lost, OnLockLost::Stop);
    assert_eq!(s.lost_grace, Duration::ZERO);
}

#[test]
fn on_lock_lost_values_and_a_bad_one() {
    for (value, policy) in [
        ("suspend", OnLockLost::Stop),
        ("fail", OnLockLost::Fail),
        ("ignore", OnLockLost::Ignore),
    ] {
        let s = Settings::of(&gated(&[(ON_LOCK_LOST_ANNOTATION, value)])).unwrap();
        assert_eq!(s.unwrap().on_lock_lost, policy);
    }
    let err = Settings::of(&gated(&[(ON_LOCK_LOST_ANNOTATION, "Suspend")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains(ON_LOCK_LOST_ANNOTATION), "{err}");
    assert!(err.contains("suspend, fail, ignore"), "{err}");
}

#[test]
fn lost_grace_must_end_before_the_earliest_takeover() {
    let max = max_lost_grace(&SafetyMargins::default());
    // grace 250 ms × (1 − 0.02) + margin 250 ms
    assert_eq!(max, Duration::from_millis(495));
    let s = Settings::of(&gated(&[(LOST_GRACE_ANNOTATION, "300ms")])).unwrap();
    assert_eq!(s.unwrap().lost_grace, Duration::from_millis(300));
    for too_long in ["495ms", "1s", "30s"] {
        let err = Settings::of(&gated(&[(LOST_GRACE_ANNOTATION, too_long)]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("another holder may acquire"), "{err}");
        assert!(err.contains("495ms"), "{err}");
    }
    let err = Settings::of(&gated(&[(LOST_GRACE_ANNOTATION, "soon")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains(LOST_GRACE_ANNOTATION), "{err}");
}

#[test]
fn gate_annotations() {
    assert_eq!(Settings::of(&job(json!({}), json!({}))).unwrap(), None);
    let both = job(
        json!({ LOCK_ANNOTATION: "a", TEMPLATE_ANNOTATION: "b" }),
        json!({}),
    );
    assert!(
        Settings::of(&both)
            .unwrap_err()
            .to_string()
            .contains("both")
    );
    let other_ns = job(json!({ TEMPLATE_ANNOTATION: "ns/b" }), json!({}));
    assert!(
        Settings::of(&other_ns)
            .unwrap_err()
            .to_string()
            .contains("another namespace")
    );
    let bad = job(json!({ LOCK_ANNOTATION: "Not_A_Name" }), json!({}));
    assert!(
        Settings::of(&bad)
            .unwrap_err()
            .to_string()
            .contains("invalid DistributedLock name")
    );
}

#[test]
fn phases_of_a_job() {
    assert_eq!(Phase::of(&gated(&[])), Phase::HeldBack);
    let unsuspended = job(
        json!({ LOCK_ANNOTATION: "db" }),
        json!({ "suspend": false }),
    );
    assert_eq!(Phase::of(&unsuspended), Phase::NotHeldBack);

    let mut started = gated(&[]);
    started.spec.as_mut().unwrap().suspend = Some(false);
    started.spec.as_mut().unwrap().template.metadata =
        Some(serde_json::from_value(json!({ "annotations": { FENCE_ANNOTATION: "7" } })).unwrap());
    assert_eq!(Phase::of(&started), Phase::Running);
    assert_eq!(started.fences(&db()), [("db".to_string(), Some(7))]);

    // Suspended after a loss: gated again, remembering the fence it lost.
    let mut regated = started.clone();
    regated.spec.as_mut().unwrap().suspend = Some(true);
    regated
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(LOST_FENCE_ANNOTATION.into(), "7".into());
    assert_eq!(Phase::of(&regated), Phase::HeldBack);
    assert_eq!(regated.lost_fences(&db()), [("db".to_string(), 7)].into());

    let mut stopped = regated.clone();
    stopped
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(STOPPED_ANNOTATION.into(), "Lost".into());
    assert_eq!(Phase::of(&stopped), Phase::StoppedForGood);

    let mut finished_job = started.clone();
    finished_job.status = Some(
        serde_json::from_value(json!({ "conditions": [
            { "type": "SuccessCriteriaMet", "status": "True" },
        ]}))
        .unwrap(),
    );
    assert_eq!(Phase::of(&finished_job), Phase::Running, "not terminal yet");
    finished_job.status = Some(
        serde_json::from_value(json!({ "conditions": [
            { "type": "Complete", "status": "True" },
        ]}))
        .unwrap(),
    );
    assert_eq!(Phase::of(&finished_job), Phase::Finished);
}

#[test]
fn standing_of_a_running_jobs_lock() {
    let held_lock = lock(LockPhase::Held, 7, true, reason::LEASE_HELD);
    assert_eq!(
        standing(Some(&held_lock), "db", Some(7)),
        LockStanding::Held
    );
    // Held, but with another fence: a new acquisition is not the one the Job ran with.
    assert!(matches!(
        standing(Some(&held_lock), "db", Some(6)),
        LockStanding::NotHeld {
            reason: "NotHeld",
            may_recover: false,
            ..
        }
    ));
    let expiring = lock(LockPhase::Held, 7, false, reason::LEASE_EXPIRING);
    assert!(matches!(
        standing(Some(&expiring), "db", Some(7)),
        LockStanding::NotHeld {
            reason: reason::LEASE_EXPIRING,
            may_recover: true,
            ..
        }
    ));
    let lost = lock(LockPhase::Lost, 7, false, reason::LOST);
    assert!(matches!(
        standing(Some(&lost), "db", Some(7)),
        LockStanding::NotHeld {
            reason: reason::LOST,
            may_recover: false,
            ..
        }
    ));
    assert!(matches!(
        standing(None, "db", Some(7)),
        LockStanding::NotHeld {
            reason: "LockDeleted",
            ..
        }
    ));
    // A spec edit not yet reported on (generation ahead) is not a loss.
    let mut edited = held_lock.clone();
    edited.metadata.generation = Some(2);
    assert_eq!(standing(Some(&edited), "db", Some(7)), LockStanding::Held);
}

#[test]
fn actions_for_a_lock_not_held() {
    let settings = |policy, grace_ms| Settings {
        locks: LockSet::one(Gate::Named("db".into())),
        on_lock_lost: policy,
        lost_grace: Duration::from_millis(grace_ms),
    };
    let expiring = LockStanding::NotHeld {
        reason: reason::LEASE_EXPIRING,
        why: String::new(),
        may_recover: true,
    };
    let lost = LockStanding::NotHeld {
        reason: reason::LOST,
        why: String::new(),
        may_recover: false,
    };
    let zero = Duration::ZERO;
    let s = settings(OnLockLost::Stop, 0);
    assert_eq!(
        running_action(&LockStanding::Held, &s, zero),
        RunningAction::Continue
    );
    assert_eq!(running_action(&expiring, &s, zero), RunningAction::Stop);
    assert_eq!(
        running_action(&expiring, &settings(OnLockLost::Fail, 0), zero),
        RunningAction::Stop
    );
    assert_eq!(
        running_action(&expiring, &settings(OnLockLost::Ignore, 300), zero),
        RunningAction::Warn
    );
    // Grace rides out an expiring lease, not a lost one.
    let graced = settings(OnLockLost::Stop, 300);
    assert_eq!(
        running_action(&expiring, &graced, Duration::from_millis(100)),
        RunningAction::WaitGrace(Duration::from_millis(200))
    );
    assert_eq!(
        running_action(&expiring, &graced, Duration::from_millis(300)),
        RunningAction::Stop
    );
    assert_eq!(running_action(&lost, &graced, zero), RunningAction::Stop);
}

#[test]
fn an_old_acquisition_is_let_go_before_a_restart() {
    assert!(is_old_acquisition(
        &lock(LockPhase::Held, 7, true, reason::LEASE_HELD),
        7
    ));
    assert!(is_old_acquisition(
        &lock(LockPhase::Lost, 7, false, reason::LOST),
        7
    ));
    assert!(!is_old_acquisition(
        &lock(LockPhase::Held, 8, true, reason::LEASE_HELD),
        7
    ));
    // Released (or waiting for a new acquisition): nothing left to let go.
    assert!(!is_old_acquisition(
        &lock(LockPhase::Released, 7, false, reason::RELEASED),
        7
    ));
    assert!(!is_old_acquisition(
        &lock(LockPhase::Waiting, 7, false, reason::WAITING),
        7
    ));
}

#[test]
fn pods_of_a_suspended_job() {
    let mut j = gated(&[]);
    assert!(pods_gone(&j));
    j.status = Some(serde_json::from_value(json!({ "active": 1 })).unwrap());
    assert!(!pods_gone(&j));
    j.status = Some(serde_json::from_value(json!({ "active": 0, "terminating": 1 })).unwrap());
    assert!(!pods_gone(&j));
    j.status = Some(serde_json::from_value(json!({ "active": 0 })).unwrap());
    assert!(pods_gone(&j));
}

/// The release paths against the scripted API (docs/design.md §6.3): the test plays the
/// lock controller, the Job controller and the kubelet by writing the objects.
mod release_waits_for_the_pods {
    use std::sync::Arc;

    use serde_json::{Value, json};

    use super::*;
    use crate::config::FINALIZER;
    use crate::fake_api::{FakeApi, LockStatus};
    use crate::gating::GUARD_ANNOTATION;
    use crate::gating::machine::{Gating, IN_USE_RECHECK, reconcile};

    const LOCK: &str = "/apis/lockwarden.io/v1alpha1/namespaces/ns/distributedlocks/db";
    const JOB: &str = "/apis/batch/v1/namespaces/ns/jobs/j";
    const POD: &str = "/api/v1/namespaces/ns/pods/j-abc";

    /// A running gated Job (fence 5, `on-lock-lost: policy`) with one Pod Running on a
    /// node, its lock db claimed and held for it.
    fn scene(policy: &str) -> (FakeApi, Arc<Gating<Job>>) {
        let api = FakeApi::default();
        api.put(
            LOCK,
            json!({
                "apiVersion": "lockwarden.io/v1alpha1", "kind": "DistributedLock",
                "metadata": { "name": "db", "namespace": "ns",
                              "annotations": { CLAIM_ANNOTATION: "j/job-uid" } },
                "spec": { "backend": { "kubernetes": { "leaseName": "db" } } },
            }),
        );
        lock_status(&api, "Held", true, 5);
        api.put(
            JOB,
            json!({
                "apiVersion": "batch/v1", "kind": "Job",
                "metadata": { "name": "j", "namespace": "ns", "uid": "job-uid",
                              "finalizers": [FINALIZER],
                              "annotations": { LOCK_ANNOTATION: "db", ON_LOCK_LOST_ANNOTATION: policy } },
                "spec": { "suspend": false, "template": {
                    "metadata": { "annotations": { FENCE_ANNOTATION: "5" } },
                    "spec": { "containers": [{ "name": "c" }], "restartPolicy": "Never" },
                } },
                "status": { "active": 1 },
            }),
        );
        api.put(
            POD,
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": { "name": "j-abc", "namespace": "ns", "uid": "pod-uid",
                              // The Job controller's tracking finalizer keeps a deleted
                              // Pod until it has ended.
                              "finalizers": ["batch.kubernetes.io/job-tracking"],
                              "labels": { "batch.kubernetes.io/controller-uid": "job-uid" } },
                "spec": { "nodeName": "node-1", "containers": [{ "name": "c" }] },
                "status": { "phase": "Running" },
            }),
        );
        let ctx = Gating::<Job>::alone(api.client());
        (api, ctx)
    }

    /// Plays the lock controller: db's status.
    fn lock_status(api: &FakeApi, phase: &str, acquired: bool, fence: i64) {
        let status = LockStatus {
            phase,
            acquired,
            message: "m",
            fence,
            holder: "c/ns/job/j/job-uid",
            nonce: Some("nonce-5"),
        };
        api.set_lock_status(LOCK, &status);
    }

    async fn step(api: &FakeApi, ctx: &Arc<Gating<Job>>) -> Job {
        let job: Job = api.object(JOB);
        reconcile(Arc::new(job), ctx.clone())
            .await
            .expect("reconcile");
        api.object(JOB)
    }

    /// Whether db was let go cleanly (released and unclaimed).
    fn released(api: &FakeApi) -> bool {
        let lock = api.get(LOCK).unwrap();
        lock["spec"]["release"] == true
            && lock["metadata"]["annotations"][CLAIM_ANNOTATION].is_null()
    }

    /// The kubelet reports the Pod ended and the Job controller counts nothing left.
    fn pods_end(api: &FakeApi) {
        api.merge(POD, json!({ "status": { "phase": "Failed" } }));
        api.merge(JOB, json!({ "status": { "active": 0, "terminating": 0 } }));
    }

    /// Loss: the Job is suspended, lockwarden deletes its Pod itself (the Pod's own grace
    /// period), and db stays claimed, unreleased, while the Pod terminates.
    async fn lose(api: &FakeApi, ctx: &Arc<Gating<Job>>) -> Job {
        lock_status(api, "Lost", false, 5);
        api.take_requests();
        let job = step(api, ctx).await;
        let requests = api.take_requests();
        let suspend = requests.iter().position(|r| r == &format!("PATCH {JOB}"));
        let untrack = requests.iter().position(|r| r == &format!("PATCH {POD}"));
        let delete = requests.iter().position(|r| r == &format!("DELETE {POD}"));
        assert!(
            suspend.is_some() && untrack.is_some() && delete.is_some(),
            "the suspend patch, the Pod untracked, then deleted: {requests:?}"
        );
        assert!(
            suspend < untrack && untrack < delete,
            "the suspend patch, the Pod untracked, then deleted: {requests:?}"
        );
        assert!(job.spec.as_ref().unwrap().suspend == Some(true));
        let pod = api.get(POD).unwrap();
        assert!(!pod["metadata"]["deletionTimestamp"].is_null(), "{pod}");
        assert_eq!(
            pod["metadata"]["finalizers"],
            json!([]),
            "the Job controller must not count the stopped Pod as failed: {pod}"
        );
        assert!(!released(api), "released while the Pod may run");
        // The Job controller's view: the Pod terminating.
        api.merge(JOB, json!({ "status": { "active": 0, "terminating": 1 } }));
        job
    }

    /// The kubelet reports the Pod's one container exited with `code`; its phase is
    /// not terminal yet (that comes a relist later), nor is the Job finished.
    fn container_exits(api: &FakeApi, code: i32) {
        api.merge(
            POD,
            json!({ "spec": { "restartPolicy": "Never" }, "status": { "containerStatuses": [{
                "name": "c", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": { "terminated": { "exitCode": code } } }] } }),
        );
    }

    /// Early hand-off (§6.3): every container of every Pod exited 0 lets the lock go
    /// before the Job is `Complete`, once; `Complete` later changes nothing.
    #[tokio::test]
    async fn early_hand_off_the_lock_goes_when_the_kubelet_reports_every_container_exited_zero() {
        let (api, ctx) = scene("suspend");
        step(&api, &ctx).await;
        assert!(!released(&api), "held while the container runs");
        container_exits(&api, 0);
        let job = step(&api, &ctx).await;
        assert!(released(&api), "let go before the Job is Complete");
        assert!(!job.finalizers().iter().any(|f| f == FINALIZER));
        let status = &job.annotations()[STATUS_ANNOTATION];
        assert!(status.contains("ended in success"), "{status}");
        api.merge(
            JOB,
            json!({ "status": { "active": 0, "succeeded": 1,
                "conditions": [{ "type": "Complete", "status": "True" }] } }),
        );
        api.take_requests();
        step(&api, &ctx).await;
        let writes: Vec<String> = api
            .take_requests()
            .into_iter()
            .filter(|r| !r.starts_with("GET"))
            .collect();
        assert!(writes.is_empty(), "nothing more once Complete: {writes:?}");
    }

    /// Early hand-off on the guard's report (§6.3): a guarded container's report on its
    /// Pod lets the lock go while the kubelet still reports it running, where the
    /// controller trusts the reports; without that trust it waits for the kubelet.
    #[tokio::test]
    async fn early_hand_off_on_the_guards_report_when_trusted_and_only_then() {
        for trusted in [false, true] {
            let (api, ctx) = scene("suspend");
            let ctx = if trusted {
                let config = ControllerConfig {
                    trust_guard_reports: true,
                    ..ControllerConfig::default()
                };
                Gating::<Job>::configured(api.client(), config)
            } else {
                ctx
            };
            let guarded = json!({ "restartPolicy": "Never", "containers": [{ "name": "c",
                "command": ["/lockwarden-guard/lockwarden", "guard", "--", "work"] }] });
            api.merge(POD, json!({ "spec": guarded }));
            api.merge(JOB, json!({ "spec": { "template": { "spec": guarded } } }));
            step(&api, &ctx).await;
            assert!(!released(&api), "held while the container runs");
            api.merge(
                POD,
                json!({ "metadata": { "annotations": { "guard-ended.lockwarden.io/c": "succeeded" } } }),
            );
            let job = step(&api, &ctx).await;
            assert_eq!(released(&api), trusted, "trusted: {trusted}");
            if trusted {
                let status = &job.annotations()[STATUS_ANNOTATION];
                assert!(status.contains("ended in success"), "{status}");
            }
        }
    }

    /// A second Job `k`, suspended, naming the scene's lock `db`.
    fn next_job_on_the_named_lock(api: &FakeApi) -> Job {
        let path = "/apis/batch/v1/namespaces/ns/jobs/k";
        api.put(
            path,
            json!({
                "apiVersion": "batch/v1", "kind": "Job",
                "metadata": { "name": "k", "namespace": "ns", "uid": "k-uid",
                              "finalizers": [FINALIZER],
                              "annotations": { LOCK_ANNOTATION: "db" } },
                "spec": { "suspend": true, "template": {
                    "spec": { "containers": [{ "name": "c" }], "restartPolicy": "Never" },
                } },
            }),
        );
        api.object(path)
    }

    /// After the early hand-off the next Job on the named lock starts at once, though
    /// the first one is not `Complete` yet: nothing of it runs, so it does not hold the
    /// lock "in use" (before, the next Job waited for the 60 s resync).
    #[tokio::test]
    async fn early_hand_off_the_next_job_on_the_named_lock_starts_before_the_first_is_complete() {
        let (api, ctx) = scene("suspend");
        container_exits(&api, 0);
        step(&api, &ctx).await;
        assert!(released(&api), "let go early");
        // The lock controller releases it: free for the next claim.
        lock_status(&api, "Released", false, 5);
        let first: Job = api.object(JOB);
        assert!(
            first.status.as_ref().unwrap().conditions.is_none(),
            "not Complete yet"
        );
        let next = next_job_on_the_named_lock(&api);
        // The next Job's reconcile sees the first in its cache, as the watch has it.
        let ctx = Gating::<Job>::with_cached(api.client(), vec![first]);
        reconcile(Arc::new(next), ctx.clone())
            .await
            .expect("reconcile");
        let lock = api.get(LOCK).unwrap();
        assert_eq!(
            lock["metadata"]["annotations"][CLAIM_ANNOTATION], "k/k-uid",
            "the next Job claims the lock at once: {lock}"
        );
    }

    /// The lock's changes can reach the next Job before the first Job's finalizer
    /// removal reaches this controller's cache (it lets the lock go first): the next
    /// Job then sees the lock still in use, and looks again within `IN_USE_RECHECK`,
    /// not at the 60 s resync, since that change of the first Job wakes only the first.
    #[tokio::test]
    async fn a_lock_seen_in_use_by_a_job_that_let_it_go_is_looked_at_again_soon() {
        let (api, ctx) = scene("suspend");
        let first_as_cached: Job = api.object(JOB);
        container_exits(&api, 0);
        step(&api, &ctx).await;
        assert!(released(&api), "let go early");
        lock_status(&api, "Released", false, 5);
        let next = next_job_on_the_named_lock(&api);
        let ctx = Gating::<Job>::with_cached(api.client(), vec![first_as_cached]);
        let action = reconcile(Arc::new(next), ctx.clone())
            .await
            .expect("reconcile");
        assert_eq!(
            action,
            kube::runtime::controller::Action::requeue(IN_USE_RECHECK)
        );
        let lock = api.get(LOCK).unwrap();
        assert!(
            lock["metadata"]["annotations"][CLAIM_ANNOTATION].is_null(),
            "claimed beside a Job seen running: {lock}"
        );
    }

    /// No early hand-off for a container that failed, a Pod whose containers may
    /// restart or share a PID namespace, or a Job its owner suspended: it waits for the
    /// Job's end as before.
    #[tokio::test]
    async fn early_hand_off_not_for_a_failed_container_nor_one_that_may_restart_or_share_pids() {
        for (code, pod_spec, job_patch) in [
            (1, json!({}), json!({})),
            (0, json!({ "restartPolicy": "OnFailure" }), json!({})),
            (0, json!({ "shareProcessNamespace": true }), json!({})),
            // Suspended by its owner: its Pods are deleted, not counted.
            (0, json!({}), json!({ "spec": { "suspend": true } })),
        ] {
            let (api, ctx) = scene("suspend");
            container_exits(&api, code);
            api.merge(POD, json!({ "spec": pod_spec }));
            api.merge(JOB, job_patch.clone());
            let job = step(&api, &ctx).await;
            assert!(
                !released(&api),
                "exit {code}, {pod_spec}, {job_patch}: let go early"
            );
            assert!(job.finalizers().iter().any(|f| f == FINALIZER));
        }
    }

    /// A Pod that changed since it was read (it may have succeeded) keeps the Job
    /// controller's finalizer, to be counted, and is not deleted by lockwarden.
    #[tokio::test]
    async fn stop_a_pod_that_changed_since_it_was_read_keeps_the_job_controllers_finalizer() {
        let (api, _ctx) = scene("suspend");
        let read: Pod = api.object(POD);
        api.merge(POD, json!({ "status": { "phase": "Succeeded" } }));
        let pods = Api::<Pod>::namespaced(api.client(), "ns");
        assert!(!untrack(&pods, &read).await.expect("a conflict is no error"));
        let pod = api.get(POD).unwrap();
        assert_eq!(
            pod["metadata"]["finalizers"],
            json!([JOB_TRACKING_FINALIZER]),
            "{pod}"
        );
        assert!(pod["metadata"]["deletionTimestamp"].is_null(), "{pod}");
    }

    #[tokio::test]
    async fn stop_a_suspended_jobs_lock_is_released_only_once_its_pods_have_ended() {
        let (api, ctx) = scene("suspend");
        lose(&api, &ctx).await;
        let job = step(&api, &ctx).await;
        assert!(!released(&api), "released while the Pod terminates");
        let status = &job.annotations()[STATUS_ANNOTATION];
        assert!(status.contains("have not ended yet"), "{status}");
        pods_end(&api);
        step(&api, &ctx).await;
        assert!(released(&api), "released once the Pod ended");
    }

    #[tokio::test]
    async fn stop_on_lock_lost_fail_releases_only_once_its_pods_have_ended() {
        let (api, ctx) = scene("fail");
        lose(&api, &ctx).await;
        let job = step(&api, &ctx).await;
        assert!(!released(&api), "released while the Pod terminates");
        assert!(job.finalizers().iter().any(|f| f == FINALIZER));
        pods_end(&api);
        let job = step(&api, &ctx).await;
        assert!(released(&api), "released once the Pod ended");
        assert!(job.finalizers().is_empty());
    }

    #[tokio::test]
    async fn stop_a_complete_job_whose_pod_still_terminates_is_not_released_yet() {
        let (api, ctx) = scene("suspend");
        api.merge(
            JOB,
            json!({ "status": { "active": 0, "terminating": 1,
                    "conditions": [{ "type": "Complete", "status": "True" }] } }),
        );
        step(&api, &ctx).await;
        assert!(!released(&api), "a Complete condition alone is not proof");
        pods_end(&api);
        let job = step(&api, &ctx).await;
        assert!(released(&api));
        assert!(job.finalizers().is_empty());
    }

    #[tokio::test]
    async fn stop_a_job_deleted_while_running_deletes_its_pods_and_releases_once_they_ended() {
        let (api, ctx) = scene("suspend");
        api.merge(
            JOB,
            json!({ "metadata": { "deletionTimestamp": "2026-01-01T00:00:00Z" } }),
        );
        api.take_requests();
        step(&api, &ctx).await;
        assert!(
            api.take_requests().contains(&format!("DELETE {POD}")),
            "the Pod is deleted (its grace starts now)"
        );
        assert!(!released(&api), "released while the Pod may run");
        // The Job controller may not count the Pods of a Job being deleted: the Pod
        // itself is what is looked at.
        api.merge(JOB, json!({ "status": { "active": 0, "terminating": 0 } }));
        step(&api, &ctx).await;
        assert!(!released(&api), "released while the Pod terminates");
        api.merge(POD, json!({ "status": { "phase": "Succeeded" } }));
        let job: Job = api.object(JOB);
        reconcile(Arc::new(job), ctx.clone())
            .await
            .expect("reconcile");
        assert!(released(&api));
        assert!(
            api.get(JOB).is_none(),
            "the finalizer went, so the Job is gone"
        );
    }

    /// A suspended Job on template `tpl` (a Lease template, or ZooKeeper's) whose Pods
    /// have `grace` seconds of grace period; the template's `lockDelay` as given.
    fn template_scene(
        grace: i64,
        zookeeper: bool,
        delay: Option<&str>,
    ) -> (FakeApi, Arc<Gating<Job>>) {
        let api = FakeApi::default();
        let backend = if zookeeper {
            json!({ "zookeeper": { "servers": ["127.0.0.1:2181"], "path": "/locks/a" } })
        } else {
            json!({ "kubernetes": { "leaseName": "a" } })
        };
        let mut spec = json!({ "backend": backend, "release": true });
        if let Some(delay) = delay {
            spec["lockDelay"] = json!(delay);
        }
        api.put(
            TEMPLATE,
            json!({
                "apiVersion": "lockwarden.io/v1alpha1", "kind": "DistributedLock",
                "metadata": { "name": "tpl", "namespace": "ns" }, "spec": spec,
            }),
        );
        api.put(
            JOB,
            json!({
                "apiVersion": "batch/v1", "kind": "Job",
                "metadata": { "name": "j", "namespace": "ns", "uid": "job-uid",
                              "annotations": { TEMPLATE_ANNOTATION: "tpl" } },
                "spec": { "suspend": true, "template": {
                    "spec": { "containers": [{ "name": "c" }], "restartPolicy": "Never",
                              "terminationGracePeriodSeconds": grace },
                } },
            }),
        );
        let ctx = Gating::<Job>::alone(api.client());
        (api, ctx)
    }

    const TEMPLATE: &str = "/apis/lockwarden.io/v1alpha1/namespaces/ns/distributedlocks/tpl";
    const OWN: &str = "/apis/lockwarden.io/v1alpha1/namespaces/ns/distributedlocks/j-job-uid";

    /// The Job's own lock as created (finalizer first, then the lock).
    async fn own_lock_delay(api: &FakeApi, ctx: &Arc<Gating<Job>>) -> Value {
        step(api, ctx).await;
        step(api, ctx).await;
        api.get(OWN).expect("the Job's own lock")["spec"]["lockDelay"].clone()
    }

    #[tokio::test]
    async fn rule8_a_templates_own_lock_gets_the_delay_its_pods_need() {
        let (api, ctx) = template_scene(30, false, None);
        assert_eq!(own_lock_delay(&api, &ctx).await, "37s");
        let (api, ctx) = template_scene(1, false, None);
        assert_eq!(own_lock_delay(&api, &ctx).await, "7s");
        // The template's own delay is kept (a shorter one is warned about at start).
        let (api, ctx) = template_scene(30, false, Some("5s"));
        assert_eq!(own_lock_delay(&api, &ctx).await, "5s");
        // ZooKeeper cannot carry one.
        let (api, ctx) = template_scene(30, true, None);
        assert!(own_lock_delay(&api, &ctx).await.is_null());
    }

    #[tokio::test]
    async fn stop_a_grace_too_long_for_any_delay_keeps_the_job_unstarted_with_a_warning() {
        let (api, ctx) = template_scene(3600, false, None);
        step(&api, &ctx).await;
        let job = step(&api, &ctx).await;
        assert!(api.get(OWN).is_none(), "no lock taken");
        assert_eq!(job.spec.as_ref().unwrap().suspend, Some(true));
        let status = &job.annotations()[STATUS_ANNOTATION];
        assert!(
            status.contains("terminationGracePeriodSeconds 3600")
                && status.contains("maximum of 600s"),
            "{status}"
        );
        assert_eq!(api.event_reasons(), ["LockDelayTooLong"]);
    }

    /// The Job of `scene` as created suspended and never started, annotated
    /// `lockwarden.io/guard: "true"`, its one container running `command`; db held for
    /// it.
    fn guard_scene(command: Value) -> (FakeApi, Arc<Gating<Job>>) {
        let (api, ctx) = scene("suspend");
        let mut job = api.get(JOB).unwrap();
        job["metadata"]["annotations"][GUARD_ANNOTATION] = json!("true");
        job["spec"]["suspend"] = json!(true);
        job["spec"]["template"] = json!({ "spec": {
            "containers": [{ "name": "work", "command": command }],
            "restartPolicy": "Never",
        } });
        job["status"] = json!({});
        api.put(JOB, job);
        (api, ctx)
    }

    #[tokio::test]
    async fn guard_a_job_asking_for_the_guard_without_it_stays_suspended_with_a_warning() {
        let (api, ctx) = guard_scene(json!(["sh", "-c", "work"]));
        let job = step(&api, &ctx).await;
        assert_eq!(job.spec.as_ref().unwrap().suspend, Some(true));
        let status = &job.annotations()[STATUS_ANNOTATION];
        assert!(
            status.contains("container work does not run `lockwarden guard`")
                && status.contains("created before the guard's admission policy")
                && status.contains("README \"Guard\""),
            "{status}"
        );
        assert_eq!(api.event_reasons(), ["GuardMissing"]);
        // Nothing about its fence was written: it never ran.
        assert!(job.spec.unwrap().template.metadata.is_none());
    }

    #[tokio::test]
    async fn guard_a_job_whose_containers_run_the_guard_is_started() {
        let (api, ctx) = guard_scene(json!(["/lockwarden-guard/lockwarden", "guard", "--", "sh"]));
        let job = step(&api, &ctx).await;
        assert_eq!(job.spec.as_ref().unwrap().suspend, Some(false), "{job:?}");
        // (A named lock without a lock-delay is warned about too: not the guard's.)
        let reasons = api.event_reasons();
        assert_eq!(
            reasons.first().map(String::as_str),
            Some("Started"),
            "{reasons:?}"
        );
        assert!(!reasons.iter().any(|r| r == "GuardMissing"), "{reasons:?}");
    }

    /// A suspended Job naming lock db that lockwarden has not touched yet.
    fn untouched_scene() -> (FakeApi, Arc<Gating<Job>>) {
        let (api, ctx) = scene("suspend");
        let mut job = api.get(JOB).unwrap();
        job["metadata"]["finalizers"] = json!([]);
        job["spec"]["suspend"] = json!(true);
        job["spec"]["template"]["metadata"] = json!({});
        job["status"] = json!({});
        api.put(JOB, job);
        api.take_requests();
        (api, ctx)
    }

    const WORKLOADS: &str = "/apis/kueue.x-k8s.io/v1beta2/namespaces/ns/workloads";

    #[tokio::test]
    async fn kueue_a_job_with_a_queue_name_is_left_to_kueue_with_a_warning_and_never_written() {
        let (api, ctx) = untouched_scene();
        api.merge(
            JOB,
            json!({ "metadata": { "labels": { crate::kueue::QUEUE_NAME_LABEL: "lq" } } }),
        );
        api.take_requests();
        let before = api.get(JOB).unwrap();
        step(&api, &ctx).await;
        assert_eq!(api.take_requests(), Vec::<String>::new());
        assert_eq!(api.get(JOB).unwrap(), before, "the Job was written");
        assert_eq!(api.event_reasons(), ["ManagedElsewhere"]);
    }

    #[tokio::test]
    async fn kueue_a_job_whose_workload_names_it_is_left_to_kueue_and_others_are_gated() {
        let (api, ctx) = untouched_scene();
        // No Workload names it: gated as ever (our finalizer first).
        step(&api, &ctx).await;
        let requests = api.take_requests();
        assert_eq!(requests.first(), Some(&format!("LIST {WORKLOADS}")));
        assert!(requests.contains(&format!("PATCH {JOB}")), "{requests:?}");

        let (api, ctx) = untouched_scene();
        api.put(
            &format!("{WORKLOADS}/job-j-1"),
            json!({
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                "metadata": { "name": "job-j-1", "namespace": "ns",
                              "labels": { crate::kueue::JOB_UID_LABEL: "job-uid" } },
            }),
        );
        let before = api.get(JOB).unwrap();
        step(&api, &ctx).await;
        assert_eq!(api.take_requests(), [format!("LIST {WORKLOADS}")]);
        assert_eq!(api.get(JOB).unwrap(), before, "the Job was written");
        assert_eq!(api.event_reasons(), ["ManagedElsewhere"]);
    }
}

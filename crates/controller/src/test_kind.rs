//! (tests only) A third kind of gated workload, `Work`, in one file: what it takes to
//! add a kind — implement [`GatedWorkload`], register it — and a proof that the gating
//! machine alone drives it through claim, start, loss, stop and finish, with no code of
//! Jobs or Pods involved (an in-memory API, [`super::fake_api`], stands in for the
//! API server; the test plays the lock controller by writing the lock's status).

use std::sync::Arc;

use async_trait::async_trait;
use kube::api::Api;
use kube::{CustomResource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::config::FINALIZER;
use super::fake_api::{FakeApi, LockStatus};
use super::gating::kind::patch_as_read;
use super::gating::lockset::{self, RanWith, WorkloadLock};
use super::gating::machine::{Gating, reconcile};
use super::gating::{
    CLAIM_ANNOTATION, FENCE_ANNOTATION, GatedWorkload, Kind, LOCK_ANNOTATION, OnLockLost,
    STATUS_ANNOTATION, Stopped, Stopping,
};
use crate::telemetry::Telemetry;

/// Where `Work` keeps the fence of a run that lost its lock.
const LOST_FENCE: &str = "test.lockwarden.io/lost-fence";
/// Marks a Work whose processes have not ended (`GatedWorkload::processes_ended`).
const PROCESSES_RUNNING: &str = "test.lockwarden.io/processes-running";

#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "test.lockwarden.io",
    version = "v1",
    kind = "Work",
    namespaced,
    status = "WorkStatus"
)]
pub struct WorkSpec {
    /// Held back while true.
    pub paused: bool,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
pub struct WorkStatus {
    pub done: bool,
}

static WORK: Kind = Kind {
    name: "Work",
    api_version: "test.lockwarden.io/v1",
    claim_prefix: Some("work"),
    block_owner_deletion: false,
    templates_elsewhere: false,
    // A kind names only the policies it can carry out: Work has no "fail".
    on_lock_lost: &[("pause", OnLockLost::Stop), ("ignore", OnLockLost::Ignore)],
};

#[async_trait]
impl GatedWorkload for Work {
    const KIND: &'static Kind = &WORK;

    fn finished(&self) -> Option<&str> {
        self.status.as_ref().filter(|s| s.done).map(|_| "Done")
    }

    fn running(&self) -> bool {
        self.annotations().contains_key(FENCE_ANNOTATION)
            && !self.annotations().contains_key(LOST_FENCE)
    }

    fn held_back(&self) -> bool {
        self.spec.paused
    }

    fn fences(&self, locks: &[WorkloadLock]) -> Vec<(String, Option<i64>)> {
        lockset::fences_of(self.annotations(), locks)
    }

    fn lost_fences(&self, locks: &[WorkloadLock]) -> std::collections::BTreeMap<String, i64> {
        let lost = self
            .annotations()
            .get(LOST_FENCE)
            .and_then(|f| f.parse().ok());
        match (lost, locks) {
            (Some(fence), [only]) => [(only.name.clone(), fence)].into(),
            _ => Default::default(),
        }
    }

    fn not_held_back(&self, what: &str) -> (&'static str, String) {
        ("NotPaused", format!("names {what} but is not paused"))
    }

    fn pod_spec(&self) -> Option<&k8s_openapi::api::core::v1::PodSpec> {
        None
    }

    /// Ended unless marked as still running processes.
    async fn processes_ended(&self, _client: &kube::Client) -> Result<bool, kube::Error> {
        Ok(!self.annotations().contains_key(PROCESSES_RUNNING))
    }

    fn start_patch(&self, ran: &RanWith, _locks: &[WorkloadLock]) -> serde_json::Value {
        let mut annotations = ran.annotations();
        annotations.insert(LOST_FENCE.into(), serde_json::Value::Null);
        json!({ "metadata": { "annotations": annotations }, "spec": { "paused": false } })
    }

    async fn stop(
        &self,
        api: &Api<Work>,
        stop: &Stopping<'_>,
    ) -> Result<Stopped<Work>, kube::Error> {
        let patch = json!({
            "metadata": { "annotations": { LOST_FENCE: stop.fences } },
            "spec": { "paused": true },
        });
        let paused = patch_as_read(api, self, patch).await?;
        Ok(Stopped {
            object: Some(paused),
            event_reason: "Paused",
            message: format!("paused: {} lost ({})", stop.locks, stop.why),
            let_go_now: true,
        })
    }

    fn count_stopped(_telemetry: &Telemetry, _reason: &str) {}
}

const LOCK: &str = "/apis/lockwarden.io/v1alpha1/namespaces/ns/distributedlocks/db";
const WORK_PATH: &str = "/apis/test.lockwarden.io/v1/namespaces/ns/works/w";

/// Plays the lock controller: `db`'s status as it would write it.
fn lock_status(api: &FakeApi, phase: &str, acquired: bool, fence: i64) {
    let status = LockStatus {
        phase,
        acquired,
        message: if acquired {
            "held"
        } else {
            "taken over by another holder"
        },
        fence,
        holder: "test/ns/db",
        nonce: None,
    };
    api.set_lock_status(LOCK, &status);
}

#[tokio::test]
async fn the_machine_drives_a_new_kind_through_claim_start_loss_stop_and_finish() {
    let api = FakeApi::default();
    api.put(
        LOCK,
        json!({
            "apiVersion": "lockwarden.io/v1alpha1", "kind": "DistributedLock",
            "metadata": { "name": "db", "namespace": "ns" },
            "spec": { "backend": { "kubernetes": { "leaseName": "db" } } },
        }),
    );
    api.put(
        WORK_PATH,
        json!({
            "apiVersion": "test.lockwarden.io/v1", "kind": "Work",
            "metadata": { "name": "w", "namespace": "ns", "annotations": { LOCK_ANNOTATION: "db" } },
            "spec": { "paused": true },
        }),
    );
    let ctx = Gating::<Work>::alone(api.client());
    let step = || async {
        let work: Work = api.object(WORK_PATH);
        reconcile(Arc::new(work), ctx.clone())
            .await
            .expect("reconcile");
        api.object::<Work>(WORK_PATH)
    };

    // Claim: the finalizer first, then the claim on the lock; not held yet, so it waits.
    let work = step().await;
    assert!(work.finalizers().iter().any(|f| f == FINALIZER));
    let work = step().await;
    let lock = api.get(LOCK).unwrap();
    assert_eq!(
        lock["metadata"]["annotations"][CLAIM_ANNOTATION],
        "work/w/uid-2"
    );
    assert!(work.spec.paused);
    assert_eq!(
        work.annotations()[STATUS_ANNOTATION],
        "waiting for lock db: not acquired yet"
    );

    // Start: held with fence 5, so one write sets the fence and lifts the pause.
    lock_status(&api, "Held", true, 5);
    let work = step().await;
    assert!(!work.spec.paused);
    assert_eq!(work.annotations()[FENCE_ANNOTATION], "5");
    assert!(work.annotations()[STATUS_ANNOTATION].starts_with("started holding lock db (fence 5"));

    // Held and renewing: nothing written.
    api.take_requests();
    step().await;
    assert_eq!(api.take_requests(), [format!("GET {LOCK}")]);

    // Loss while its processes may still run: stopped the kind's way, the fence it ran
    // with recorded, the lock not let go (docs/design.md §6.3).
    let mut running = api.get(WORK_PATH).unwrap();
    running["metadata"]["annotations"][PROCESSES_RUNNING] = json!("yes");
    api.put(WORK_PATH, running);
    lock_status(&api, "Lost", false, 5);
    let work = step().await;
    assert!(work.spec.paused);
    assert_eq!(work.annotations()[LOST_FENCE], "5");
    let lock = api.get(LOCK).unwrap();
    assert_ne!(lock["spec"]["release"], true);
    assert_eq!(
        lock["metadata"]["annotations"][CLAIM_ANNOTATION],
        "work/w/uid-2"
    );
    step().await;
    assert_ne!(api.get(LOCK).unwrap()["spec"]["release"], true);

    // Its processes ended: the lost acquisition is let go.
    let mut ended = api.get(WORK_PATH).unwrap();
    ended["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove(PROCESSES_RUNNING);
    api.put(WORK_PATH, ended);
    step().await;
    let lock = api.get(LOCK).unwrap();
    assert_eq!(lock["spec"]["release"], true);
    assert!(lock["metadata"]["annotations"][CLAIM_ANNOTATION].is_null());

    // Finish: the finalizer goes, the status says so.
    let mut done = api.get(WORK_PATH).unwrap();
    done["status"] = json!({ "done": true });
    api.put(WORK_PATH, done);
    let work = step().await;
    assert!(work.finalizers().is_empty());
    assert_eq!(
        work.annotations()[STATUS_ANNOTATION],
        "Work done; lock db was already let go"
    );
    assert_eq!(
        api.event_reasons(),
        // Named lock db has no lockDelay, below what a workload with unknown Pods
        // needs (the default grace): warned about once, at the start. Then waiting for
        // the processes to end, and letting the lost acquisition go.
        [
            "Waiting",
            "Started",
            "LockDelayTooShort",
            "Paused",
            "Waiting",
            "Waiting",
            "Released"
        ]
    );
}

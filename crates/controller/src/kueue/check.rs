//! lockwarden's Kueue AdmissionChecks (`controllerName: lockwarden.io/lock`): their
//! `Active` condition (docs/design.md §6.6). Kueue deactivates a ClusterQueue whose
//! checks are not all `Active` (`AdmissionCheckInactive`), so no Workload of it gets
//! quota while a check cannot work. A check is `Active=False` when:
//!
//! - its `parameters` do not name a usable `LockAdmissionConfig` (missing, another kind,
//!   no template, a template named twice, a bad duration);
//! - a ClusterQueue asks it after another lockwarden check: Kueue runs checks side by
//!   side, and two of ours would take their locks in no common order (a deadlock) and
//!   set the same Pod annotations (which Kueue refuses); one lockwarden check per
//!   ClusterQueue takes all of its locks, in the global key order.
//!
//! A missing template is not the check's fault (it may appear later): the Workloads
//! wait `Pending` with a message naming it.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde_json::json;

use super::types::{AdmissionCheck, CONTROLLER_NAME, ClusterQueue};
use super::workload::{UnusableParameters, parameters_of};
use crate::config::FIELD_MANAGER;
use lockwarden_api::LockAdmissionConfig;

/// The condition Kueue reads.
pub const ACTIVE: &str = "Active";

/// Looked at again this often: a ClusterQueue or parameters changed while the watch
/// was down is caught up with.
const RESYNC: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

/// Why a lockwarden AdmissionCheck cannot work: the message of its `Active=False`
/// condition.
#[derive(Debug, thiserror::Error)]
pub enum Inactive {
    #[error(transparent)]
    Parameters(#[from] UnusableParameters),
    /// A ClusterQueue asks it after another lockwarden check.
    #[error(
        "ClusterQueue {queue} already asks lockwarden's check {earlier}: one lockwarden \
         check per ClusterQueue takes all of its locks (list every template in that \
         check's LockAdmissionConfig)"
    )]
    SecondCheck { queue: String, earlier: String },
}

struct Ctx {
    client: kube::Client,
}

/// Whether check `name` may work, or why not.
pub async fn activity(
    client: &kube::Client,
    check: &AdmissionCheck,
    queues: &[ClusterQueue],
) -> Result<Result<(), Inactive>, kube::Error> {
    if let Err(why) = parameters_of(client, check).await? {
        return Ok(Err(why.into()));
    }
    let name = check.name_any();
    let checks = Api::<AdmissionCheck>::all(client.clone());
    for queue in queues {
        let names: Vec<&str> = queue.check_names().collect();
        let Some(at) = names.iter().position(|n| *n == name) else {
            continue;
        };
        for earlier in &names[..at] {
            let Some(other) = checks.get_opt(earlier).await? else {
                continue;
            };
            if other.spec.controller_name == CONTROLLER_NAME {
                return Ok(Err(Inactive::SecondCheck {
                    queue: queue.name_any(),
                    earlier: earlier.to_string(),
                }));
            }
        }
    }
    Ok(Ok(()))
}

async fn reconcile(check: Arc<AdmissionCheck>, ctx: Arc<Ctx>) -> Result<Action, CheckError> {
    if check.spec.controller_name != CONTROLLER_NAME {
        return Ok(Action::await_change());
    }
    let queues = Api::<ClusterQueue>::all(ctx.client.clone())
        .list(&Default::default())
        .await?
        .items;
    let (status, reason, message) = match activity(&ctx.client, &check, &queues).await? {
        Ok(()) => (
            "True",
            "Active",
            "lockwarden takes the Workloads' locks".to_string(),
        ),
        Err(why) => ("False", "InvalidParameters", why.to_string()),
    };
    let current = check
        .status
        .iter()
        .flat_map(|s| s.conditions.iter())
        .find(|c| c.type_ == ACTIVE);
    let generation = check.metadata.generation;
    if current.is_some_and(|c| {
        c.status == status && c.message == message && c.observed_generation == generation
    }) {
        return Ok(Action::requeue(RESYNC));
    }
    let since = match current {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => Time(k8s_openapi::jiff::Timestamp::now()),
    };
    let patch = json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "AdmissionCheck",
        "metadata": { "name": check.name_any() },
        "status": { "conditions": [{
            "type": ACTIVE,
            "status": status,
            "reason": reason,
            "message": message,
            "observedGeneration": generation,
            "lastTransitionTime": since,
        }] },
    });
    Api::<AdmissionCheck>::all(ctx.client.clone())
        .patch_status(
            &check.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    tracing::info!(check = %check.name_any(), active = status, %message, "admission check");
    Ok(Action::requeue(RESYNC))
}

fn error_policy(_check: Arc<AdmissionCheck>, err: &CheckError, _ctx: Arc<Ctx>) -> Action {
    tracing::debug!(error = %err, "admission check reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// Runs the AdmissionCheck controller until its watch ends (it does not on its own).
pub async fn run(client: kube::Client) {
    let checks = Api::<AdmissionCheck>::all(client.clone());
    let controller = Controller::new(checks, watcher::Config::default());
    let store = controller.store();
    let by_config = store.clone();
    let by_queue = store.clone();
    controller
        .watches(
            Api::<LockAdmissionConfig>::all(client.clone()),
            watcher::Config::default(),
            move |config| {
                let name = config.name_any();
                by_config
                    .state()
                    .iter()
                    .filter(|c| c.spec.parameters.as_ref().is_some_and(|p| p.name == name))
                    .map(|c| ObjectRef::from_obj(&**c))
                    .collect::<Vec<_>>()
            },
        )
        .watches(
            Api::<ClusterQueue>::all(client.clone()),
            watcher::Config::default(),
            move |queue| {
                let names: Vec<String> = queue.check_names().map(str::to_string).collect();
                by_queue
                    .state()
                    .iter()
                    .filter(|c| names.contains(&c.name_any()))
                    .map(|c| ObjectRef::from_obj(&**c))
                    .collect::<Vec<_>>()
            },
        )
        .run(reconcile, error_policy, Arc::new(Ctx { client }))
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "admission check reconcile failed");
            }
        })
        .await;
}

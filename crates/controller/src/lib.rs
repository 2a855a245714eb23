//! lockwarden-controller: the operator, a reconcile [`queue`] over `DistributedLock`
//! (docs/design.md §5) on kube-runtime's watcher and reflector, and its [`telemetry`]
//! (metrics, health).
//!
//! - [`reconcile`]: phase by phase — validate once (into a
//!   [`validated::ValidatedSpec`]), resume, acquire (one attempt per reconcile, jittered
//!   requeue while waiting), hold, release, finalizer cleanup — each phase a method of
//!   one reconcile context, in a file of its own.
//! - [`connect`]: the one way to a backend: the lock's address plus the credentials
//!   from its Secret, handed to the backend factory (the controller never names a store).
//! - [`waiters`]: the locks waiting for their key, by object and by key.
//! - [`holders`]: one [`holders::HolderTask`] per held lock, wrapping
//!   [`lockwarden_core::HeldLock`]; it reports state *transitions* (not renewals) on a
//!   channel that triggers a reconcile of its object.
//! - [`guard_requests`]: with `--trust-guard-reports`, a watch of the Pods' metadata
//!   that renews a held lock at once when a guard waits for a renewal of it.
//! - [`status`]: status built from what is known and written with server-side apply
//!   (field manager `lockwarden`) only when it differs from the stored one.
//!
//! - [`gating`]: the gating machine — one controller per kind of gated workload, every
//!   phase written once (claim, take the locks in order, start with fences, watch for
//!   loss, stop per `on-lock-lost`, let go) — and the [`gating::GatedWorkload`] trait a
//!   kind implements; run next to the first under the same leader election and
//!   namespace scope.
//! - [`jobs`]: `batch/v1` Jobs held back by `spec.suspend` (docs/design.md §6).
//! - [`pods`]: Pods held back by the scheduling gate `lockwarden.io/lock`
//!   (docs/design.md §6.1), watching only Pods labelled `lockwarden.io/gated=true`.
//! - [`kueue`]: Kueue Workloads held back by lockwarden's AdmissionCheck
//!   (docs/design.md §6.6), with `--kueue-admission-check`; and that check's `Active`
//!   condition.
//!
//! A new kind of gated workload is one file implementing [`gating::GatedWorkload`] and
//! one line in [`gated_kinds`].
//!
//! Wake-ups do not come from polling the API server: the requests of the reconcile
//! [`queue`] are the watch on `DistributedLock`s merged with a channel fed by holder
//! tasks and by releases (which wake every lock waiting on the same backend key).

#![warn(clippy::too_many_lines)]
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod admission;
pub mod api_client;
mod config;
pub mod connect;
pub mod crd_check;
mod events;
#[cfg(test)]
mod fake_api;
pub mod gating;
pub mod guard_requests;
pub mod holders;
pub mod jobs;
mod kinds;
pub mod kueue;
pub mod leader;
pub mod pods;
pub mod queue;
pub mod reconcile;
pub mod status;
pub mod telemetry;
#[cfg(test)]
mod test_kind;
#[cfg(test)]
pub mod testing;
pub mod validated;
pub mod waiters;

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};

use crate::telemetry::Telemetry;
use lockwarden_api::DistributedLock;

pub use api_client::{DEFAULT_API_REQUESTS_IN_FLIGHT, bounded_client};
pub use config::{ControllerConfig, FIELD_MANAGER, FINALIZER};
pub use kinds::gated_kinds;
pub use leader::{LeaderElectionArgs, OnLostLeadership, run_elected, run_elected_with};

pub use reconcile::{Context, ReconcileError};

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("cannot serve metrics on {0}: {1}")]
    Metrics(std::net::SocketAddr, #[source] std::io::Error),
    #[error(
        "cannot list DistributedLocks (is the CRD installed and may this identity list them?): {0}"
    )]
    Crd(#[source] kube::Error),
    #[error("leader election: {0}")]
    LeaderElection(#[source] kube_lease_manager::LeaseManagerError),
    #[error("leader election: the election task ended")]
    ElectionEnded,
    #[error("lost leadership as {0:?}: another replica leads now")]
    LostLeadership(String),
}

/// Runs the controller until its watch stream ends (it does not on its own).
pub async fn run(client: kube::Client, config: ControllerConfig) -> Result<(), ControllerError> {
    let telemetry = serve_telemetry(&config).await?;
    run_with(client, config, telemetry).await
}

/// Starts /metrics, /healthz and /readyz if the config asks for them.
pub(crate) async fn serve_telemetry(
    config: &ControllerConfig,
) -> Result<Arc<Telemetry>, ControllerError> {
    let telemetry = Arc::new(Telemetry::new());
    if let Some(addr) = config.metrics_address {
        telemetry::serve(addr, telemetry.clone())
            .await
            .map_err(|e| ControllerError::Metrics(addr, e))?;
    }
    Ok(telemetry)
}

/// Lists DistributedLocks once before starting, so a missing CRD or missing RBAC is a
/// clear error at start-up. An API server that is merely unreachable or overloaded
/// (restarting, network blip, 5xx, 429) is waited for instead: exiting would only turn a
/// blip into a crash loop, and nothing is held yet that could need the time.
async fn wait_for_lock_api(api: &Api<DistributedLock>) -> Result<(), ControllerError> {
    let mut delay = std::time::Duration::from_millis(200);
    loop {
        match api.list(&ListParams::default().limit(1)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code < 500 && status.code != 429 => {
                return Err(ControllerError::Crd(kube::Error::Api(status)));
            }
            Err(error) => {
                tracing::warn!(%error, retry_in = ?delay, "cannot reach the API server to list DistributedLocks yet");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_secs(5));
            }
        }
    }
}

/// The controller reporting into `telemetry` (the caller serves it, or reads it: an
/// embedding process or a test).
pub async fn run_with(
    client: kube::Client,
    config: ControllerConfig,
    telemetry: Arc<Telemetry>,
) -> Result<(), ControllerError> {
    // Here, the one path every entry takes (`run`, and `run_elected` once leading), so
    // that the flag holds with and without leader election.
    lockwarden_stores::set_requests_in_flight(config.store_requests_in_flight);
    let api: Api<DistributedLock> = match &config.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    wait_for_lock_api(&api).await?;
    crd_check::warn_if_outdated(&client).await;
    // Only the replica that leads gets here (a standby waits in `run_elected`).
    telemetry.set_leader(true);

    let (wake_tx, wake_rx) = tokio::sync::mpsc::unbounded_channel::<ObjectRef<DistributedLock>>();
    let ctx = Arc::new(Context::new(client, config, wake_tx, telemetry.clone()));

    let (reader, writer) = reflector::store();
    // Without `managedFields`: server-side apply's record of who set which field is
    // about a kilobyte of JSON per lock that no reconcile reads, kept as a tree of
    // maps in the cache (tens of MB at 10,000 locks). Status writes are applied with
    // `force`, so they never need it either.
    let without_managed_fields = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(|lock: &mut DistributedLock| lock.metadata.managed_fields = None);
    let watch = reflector::reflector(writer, without_managed_fields)
        .inspect_ok(move |event| {
            // Ready once the first list of DistributedLocks has been seen in full.
            if matches!(event, watcher::Event::InitDone) {
                telemetry.set_ready();
            }
        })
        .applied_objects()
        .filter_map(|object| async move {
            match object {
                Ok(lock) => Some(ObjectRef::from_obj(&lock)),
                // The watcher backs off and watches again by itself.
                Err(error) => {
                    tracing::warn!(%error, "watching DistributedLocks failed; retrying");
                    None
                }
            }
        });
    let from_wakes =
        futures::stream::unfold(
            wake_rx,
            |mut rx| async move { rx.recv().await.map(|r| (r, rx)) },
        );
    let requests = futures::stream::select(watch, from_wakes);

    // Reconciles beyond the bound wait in the queue as object references: a reconcile
    // in flight is a future of several KB, and behind a slow store every lock would keep
    // one (docs/design.md §3, "Requests in flight are bounded").
    let reconciles_in_flight = usize::from(ctx.config.reconciles_in_flight);
    let kueue_checks = ctx.config.kueue_admission_check.then(|| ctx.client.clone());
    let guards = ctx.clone();
    let kinds = gated_kinds();
    let gating = kinds.run_all(
        ctx.client.clone(),
        ctx.config.clone(),
        ctx.telemetry.clone(),
    );
    let locks = queue::run(reader, requests, reconciles_in_flight, move |lock| {
        let ctx = ctx.clone();
        async move {
            let obj = ObjectRef::from_obj(&*lock);
            match reconcile::reconcile(lock.clone(), ctx.clone()).await {
                Ok(next) => {
                    tracing::trace!(lock = %obj, "reconciled");
                    next
                }
                // It logs the error with its lock and category.
                Err(error) => reconcile::error_policy(lock, &error, ctx),
            }
        }
    });
    // Kueue's AdmissionChecks of lockwarden's: their `Active` condition (§6.6).
    let checks = async {
        if let Some(client) = kueue_checks {
            kueue::check::run(client).await;
        }
    };
    // The guards' requests for a renewal, where their writes are confined (§6.3).
    let guard_requests = async {
        if guards.config.trust_guard_reports {
            let namespace = guards.config.namespace.as_deref();
            guard_requests::run(guards.client.clone(), namespace, &guards.holders).await;
        }
    };
    futures::future::join4(locks, gating, checks, guard_requests).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gating::Workload;
    use k8s_openapi::api::core::v1::Pod;

    #[test]
    fn claims_of_every_registered_kind_parse_back_to_their_kind() {
        let kinds = gated_kinds();
        for kind in [&jobs::JOB, &pods::POD] {
            let w = Workload {
                kind,
                name: "w-1".into(),
                uid: "0123-4567".into(),
                namespace: "ns".into(),
            };
            let c = kinds.claimant(&w.claim()).unwrap();
            assert_eq!(
                (c.kind, c.name.as_str(), c.uid.as_str()),
                (kind, "w-1", "0123-4567")
            );
        }
        // A Job named "pod" keeps the Job format: `pod/<uid>` has one slash only.
        let job = kinds.claimant("pod/0123").unwrap();
        assert_eq!((job.kind, job.name.as_str()), (&jobs::JOB, "pod"));
        // A kind this build does not know is nobody's to judge stale.
        assert_eq!(
            gating::Kinds::default().with::<Pod>().claimant("j/0123"),
            None
        );
    }
}

//! High availability: several `lockwarden controller` replicas, one active.
//!
//! Leader election runs on a `coordination.k8s.io/v1` Lease through the maintained
//! `kube-lease-manager` crate (not hand-rolled). A replica runs the controller only
//! while it leads; a new leader resumes every held lock from `status.nonce` through
//! the ordinary reconcile (same nonce in the store → same fence, no gap). A replica
//! that loses leadership exits at once instead of stopping its holder tasks one by one:
//! its renewals stop with the process, and its Deployment restarts it as a standby.

use std::time::Duration;

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use lockwarden_core::duration::DurationError;

use super::{ControllerConfig, ControllerError, run, run_with, serve_telemetry};

/// `--leader-elect` and its settings.
#[derive(Clone, Debug, clap::Args)]
pub struct LeaderElectionArgs {
    /// Run several replicas, one active, elected on a Lease
    #[arg(long)]
    pub leader_elect: bool,

    /// Namespace of the leader-election Lease (default: the pod's namespace from
    /// POD_NAMESPACE, else "default")
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub leader_election_namespace: String,

    /// Name of the leader-election Lease
    #[arg(long, default_value = "lockwarden-controller")]
    pub leader_election_lease: String,

    /// How long a leader's claim lasts without renewal
    #[arg(long, default_value = "15s", value_parser = parse_seconds)]
    pub leader_election_lease_duration: Duration,

    /// This replica's identity in the Lease (default: POD_NAME, else host:pid)
    #[arg(long, env = "POD_NAME")]
    pub leader_election_identity: Option<String>,
}

/// Why a `--leader-election-lease-duration` is refused.
#[derive(Debug, thiserror::Error)]
pub enum LeaseDurationError {
    /// Not a positive duration.
    #[error(transparent)]
    Duration(#[from] DurationError),
    /// Not whole seconds (a Lease's `leaseDurationSeconds` is an integer), or below 2s.
    #[error("{text:?}: expected whole seconds, at least 2s (e.g. 15s)")]
    NotWholeSeconds { text: String },
}

fn parse_seconds(text: &str) -> Result<Duration, LeaseDurationError> {
    let d = lockwarden_core::duration::parse_positive_duration(text)?;
    if d < Duration::from_secs(2) || d.subsec_nanos() != 0 {
        return Err(LeaseDurationError::NotWholeSeconds {
            text: text.to_string(),
        });
    }
    Ok(d)
}

/// What a leader does when it loses leadership.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnLostLeadership {
    /// Exit the process at once (the binary): nothing is released, as with SIGKILL.
    ExitProcess,
    /// Return [`ControllerError::LostLeadership`], dropping the controller, whose held
    /// locks then ask for their release. Only for a controller run inside a test
    /// binary, where exiting would end every other test of that binary silently.
    Return,
}

/// Runs the controller, under leader election when `election.leader_elect` is set;
/// exits the process if it loses leadership (see [`run_elected_with`]).
pub async fn run_elected(
    client: Client,
    config: ControllerConfig,
    election: LeaderElectionArgs,
) -> Result<(), ControllerError> {
    run_elected_with(client, config, election, OnLostLeadership::ExitProcess).await
}

/// [`run_elected`] with the choice of what losing leadership does.
pub async fn run_elected_with(
    client: Client,
    config: ControllerConfig,
    election: LeaderElectionArgs,
    on_lost: OnLostLeadership,
) -> Result<(), ControllerError> {
    if !election.leader_elect {
        return run(client, config).await;
    }
    let identity = election
        .leader_election_identity
        .clone()
        .unwrap_or_else(|| {
            let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "lockwarden".into());
            format!("{host}:{}", std::process::id())
        });
    // A standby serves /healthz and /readyz too (probes must pass, and a rollout must
    // complete, while it waits); it is ready as long as it is healthy and standing by.
    let telemetry = serve_telemetry(&config).await?;
    telemetry.set_ready();
    let seconds = election.leader_election_lease_duration.as_secs();
    let manager = LeaseManagerBuilder::new(client.clone(), &election.leader_election_lease)
        .with_namespace(&election.leader_election_namespace)
        .with_identity(&identity)
        .with_duration(seconds)
        // Renew a third of the lease before it runs out.
        .with_grace((seconds / 3).max(1))
        .build()
        .await
        .map_err(ControllerError::LeaderElection)?;
    let (mut leading, _task) = manager.watch().await;
    tracing::info!(%identity, lease = %election.leader_election_lease, "waiting to become the leader");
    while !*leading.borrow_and_update() {
        leading
            .changed()
            .await
            .map_err(|_| ControllerError::ElectionEnded)?;
    }
    tracing::info!(%identity, "became the leader; starting the controller");
    tokio::select! {
        result = run_with(client, config, telemetry) => result,
        _ = leading.wait_for(|is_leader| !is_leader) => {
            // Exit here rather than return: returning drops the controller, and every
            // dropped HeldLock asks for a release, which the runtime's worker threads
            // would write while the new leader resumes the same locks and their gated
            // workloads still run. Exiting is what SIGKILL does: nothing is released.
            if on_lost == OnLostLeadership::ExitProcess {
                tracing::error!(%identity, "lost leadership; exiting so a standby takes over");
                std::process::exit(1)
            }
            tracing::error!(%identity, "lost leadership; stopping this in-process controller");
            Err(ControllerError::LostLeadership(identity))
        }
    }
}

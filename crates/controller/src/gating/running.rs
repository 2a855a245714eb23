//! A running workload, whatever its kind: the standing of every lock it runs with, and
//! what follows from it under its `on-lock-lost` policy. Only *how* a workload stops
//! (a Job is suspended, a Pod deleted) is the kind's own.

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::Api;

use super::decide::{self, LockStanding, LossPolicy, RunningAction};
use super::error::LockRequestFailed;
use super::lockset::{WorkloadLock, describe, fence_text};
use super::{NotHeldSince, STATUS_ANNOTATION};
use lockwarden_api::DistributedLock;

/// How the status of a running workload whose lock is no longer held begins
/// (`on-lock-lost: ignore`); a later `Continue` replaces it.
const NOT_HELD_PREFIX: &str = "running with fence";

/// What the kind's reconcile does next.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Held. `Some(message)`: it was reported not held before and is held again, so
    /// the status (and an Event, `LockHeld`) says so.
    Continue(Option<String>),
    /// Within `lost-grace`: look again after this long.
    WaitGrace(Duration),
    /// `ignore`: report this (Warning `LockNotHeld`), keep running.
    Warn(String),
    /// Stop the workload: `reason` labels the metric and the Event, `why` says what
    /// happened, `locks` names them and `fences` is what it ran with.
    Stop {
        reason: &'static str,
        why: String,
        locks: String,
        fences: String,
    },
}

/// What one running workload is checked against.
pub struct Running<'a> {
    pub api: &'a Api<DistributedLock>,
    pub locks: &'a [WorkloadLock],
    /// The fence it runs with, per lock (`lockset::fences_of`).
    pub fences: &'a [(String, Option<i64>)],
    /// The workload's own annotations (for its current status).
    pub annotations: &'a BTreeMap<String, String>,
    pub uid: &'a str,
    pub policy: LossPolicy,
}

impl Running<'_> {
    /// The next step: every lock's standing (the first not held decides), how long this
    /// controller has seen it not held, and the policy.
    pub async fn step(&self, not_held_since: &NotHeldSince) -> Result<Step, LockRequestFailed> {
        let standing = self.standing().await?;
        let not_held_for = match standing {
            LockStanding::Held => {
                not_held_since.forget(self.uid);
                Duration::ZERO
            }
            LockStanding::NotHeld { .. } => not_held_since.not_held_for(self.uid),
        };
        let fences = fence_text(self.fences);
        let action = decide::running_action(&standing, self.policy, not_held_for);
        Ok(match (action, standing) {
            (RunningAction::WaitGrace(left), _) => Step::WaitGrace(left),
            (RunningAction::Warn, LockStanding::NotHeld { why, .. }) => Step::Warn(format!(
                "{NOT_HELD_PREFIX} {fences} but no longer holds the lock: {why}"
            )),
            (RunningAction::Stop, LockStanding::NotHeld { reason, why, .. }) => Step::Stop {
                reason,
                why,
                locks: describe(self.locks),
                fences,
            },
            // Held (`running_action` answers Warn and Stop only for a lock not held).
            _ => {
                let warned = self
                    .annotations
                    .get(STATUS_ANNOTATION)
                    .is_some_and(|s| s.starts_with(NOT_HELD_PREFIX));
                // The lock came back (e.g. renewals recovered): say so instead of
                // leaving the warning in place.
                Step::Continue(
                    warned
                        .then(|| format!("holds {} again (fence {fences})", describe(self.locks))),
                )
            }
        })
    }

    /// Held only if every lock the workload runs with is still held with its fence:
    /// the first one that is not decides.
    async fn standing(&self) -> Result<LockStanding, LockRequestFailed> {
        for (name, fence) in self.fences {
            let lock = self
                .api
                .get_opt(name)
                .await
                .map_err(LockRequestFailed::about(name))?;
            let standing = decide::standing(lock.as_ref(), name, *fence);
            if standing != LockStanding::Held {
                return Ok(standing);
            }
        }
        Ok(LockStanding::Held)
    }
}

//! The admission rules of the `DistributedLock` spec, twice: as CEL
//! (`x-kubernetes-validations`, enforced by the API server) and as Rust (the same
//! checks, for the CLI, the controller and unit tests). Keep the two in step:
//! `tests/crd/` sends every invalid spec of its table to a real API server and also
//! through [`DistributedLockSpec::validate`].
//!
//! The rules of each store's part of `spec.backend` live with the store
//! (`stores/<store>.rs`); the building blocks of every rule in [`crate::schema`]; the
//! name and size rules in each store's `key.rs` (lockwarden-stores) and
//! [`lockwarden_core::names`], shared with the command-line URL parser.
//!
//! [`DistributedLockSpec::validate`]: super::DistributedLockSpec::validate

use std::time::Duration;

use kube::core::{Reason, Rule};

use super::SpecError;
pub(crate) use crate::schema::*;
use crate::store_spec::parse_spec_duration;
use lockwarden_core::{Mode, Permits};
use lockwarden_stores::BackendKind;

/// On the spec: `renewInterval < leaseDuration / 2` (skipped while either is malformed;
/// their own rules report that).
pub(crate) fn renew_below_half_lease() -> Rule {
    let re = lit(DURATION_RE);
    Rule::new(format!(
        "!(self.leaseDuration.matches({re}) && self.renewInterval.matches({re})) || \
         duration(self.renewInterval) + duration(self.renewInterval) < duration(self.leaseDuration)"
    ))
    .msg("renewInterval must be less than half of leaseDuration")
    .field_path(".renewInterval")
}

/// On the backend: exactly one kind is set.
/// On `lockDelay`: at most [`super::distributed_lock::MAX_LOCK_DELAY`] (docs/design.md
/// rule 8: a delay blocks the key that long after every expiry).
pub(crate) fn lock_delay_at_most_the_maximum() -> Rule {
    let max = super::distributed_lock::MAX_LOCK_DELAY.as_secs();
    Rule::new(format!(
        "!self.matches({}) || duration(self) <= duration('{max}s')",
        lit(DURATION_RE)
    ))
    .msg(format!(
        "lockDelay must be at most {max}s: a lock delay blocks the key that long after every expiry"
    ))
}

/// On the spec: no `lockDelay` on a ZooKeeper backend (docs/design.md rule 8: session
/// expiry deletes the holder's entry and every waiter takes over at once).
pub(crate) fn lock_delay_needs_a_lease_store() -> Rule {
    Rule::new("!has(self.lockDelay) || !has(self.backend.zookeeper)")
        .msg(
            "lockDelay is not supported on a ZooKeeper backend: an expired session's entry is \
             deleted by the server and every waiter takes over at once",
        )
        .field_path(".lockDelay")
}

/// `spec.priority` / `spec.weight` need `queue: true` on a store whose queue lives in
/// the record (docs/design.md §6.4).
pub(crate) fn needs_a_queue(field: &'static str) -> Rule {
    Rule::new(format!(
        "!has(self.{field}) || (has(self.queue) && self.queue && !has(self.backend.zookeeper))"
    ))
    .msg(format!(
        "{field} needs queue: true, on S3, DynamoDB or a Lease (a ZooKeeper key's queue is \
         the order of its entries, which every client of the key obeys)"
    ))
    .field_path(format!(".{field}"))
}

/// Why a run key needs one permit and no queue (docs/design.md §6.7).
pub const A_RUN_HAS_ONE_HOLDER: &str = "a run is completed by one holder, and the key's \
     memory of completed runs lives in an exclusive key's record: permits 1, no queue";

/// On the spec: `runKey` only with one permit and no queue.
pub(crate) fn a_run_has_one_holder_without_a_queue() -> Rule {
    Rule::new(
        "!has(self.runKey) || ((!has(self.queue) || !self.queue) && \
         (!has(self.permits) || self.permits == 1))",
    )
    .msg(A_RUN_HAS_ONE_HOLDER)
    .field_path(".runKey")
}

/// Why a Terraform/OpenTofu state lock (`terraformCompatible`) takes no queue and one
/// holder.
pub(crate) const A_TOOLS_LOCK_IS_A_MUTEX: &str = "terraformCompatible: a Terraform/OpenTofu \
     state lock is deleted on release (the tools lock only an absent key), so nothing keeps \
     a queue while nobody holds it, and they know one holder: no queue, permits 1";

pub(crate) fn weight_at_most_the_permits() -> Rule {
    Rule::new(
        "!has(self.weight) || self.weight == 1 || \
         (self.weight <= self.permits && (!has(self.mode) || self.mode != 'exclusive'))",
    )
    .msg("weight must be at most permits, on a shared lock (an exclusive one takes them all)")
    .field_path(".weight")
}

pub(crate) fn exactly_one_backend() -> Rule {
    let count = BackendKind::ALL
        .iter()
        .map(|k| format!("(has(self.{k}) ? 1 : 0)"))
        .collect::<Vec<_>>()
        .join(" + ");
    Rule::new(format!("{count} == 1")).msg(format!(
        "exactly one of {} must be set",
        BackendKind::listed("backend.", "or")
    ))
}

/// On the backend: the kind cannot change.
pub(crate) fn backend_kind_immutable() -> Rule {
    let same = BackendKind::ALL
        .iter()
        .map(|k| format!("has(self.{k}) == has(oldSelf.{k})"))
        .collect::<Vec<_>>()
        .join(" && ");
    Rule::new(same)
        .msg(format!(
            "the backend kind ({}) is immutable; create a new DistributedLock instead",
            BackendKind::listed("", "or")
        ))
        .reason(Reason::FieldValueForbidden)
}

/// On `spec.permits`: it cannot change (every lock on one key names the same number).
pub(crate) fn permits_immutable() -> Rule {
    Rule::new("self == oldSelf")
        .msg(
            "permits is immutable: every lock on a key must name the same permits; \
             create a new DistributedLock instead",
        )
        .reason(Reason::FieldValueForbidden)
}

/// On the spec: `mode` cannot be added, removed or changed.
pub(crate) fn mode_immutable() -> Rule {
    Rule::new(
        "has(self.mode) == has(oldSelf.mode) && (!has(self.mode) || self.mode == oldSelf.mode)",
    )
    .msg("mode is immutable: create a new DistributedLock instead")
    .reason(Reason::FieldValueForbidden)
    .field_path(".mode")
}

/// On the spec: `mode: shared` needs two permits or more (with the lock layer's
/// message).
pub(crate) fn shared_needs_permits() -> Rule {
    let shared_one = Permits {
        total: 1,
        mode: Mode::Shared,
    };
    let message = shared_one
        .validate()
        .expect_err("shared with one permit is refused");
    Rule::new("!has(self.mode) || self.mode != 'shared' || self.permits >= 2")
        .msg(message.to_string())
        .field_path(".mode")
}

/// A positive duration field of the spec, with the CRD's length limit.
pub(crate) fn parse_field(field: &'static str, value: &str) -> Result<Duration, SpecError> {
    Ok(parse_spec_duration(field, value)?)
}

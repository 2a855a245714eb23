//! The pure decisions every gated workload shares: which lock its annotations name,
//! whether that lock is held for it, and what to do about a running workload whose
//! lock is not. No API calls here; unit-tested through the Job and Pod gates.

use std::collections::BTreeMap;
use std::num::ParseIntError;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use kube::ResourceExt;

use lockwarden_api::conditions::{self, ACQUIRED, reason};
use lockwarden_api::{DistributedLock, LockPhase};
use lockwarden_core::SafetyMargins;
use lockwarden_core::duration::{DurationError, format_duration, parse_duration};
use lockwarden_core::names::{self, NameError};

use super::{
    GUARD_ANNOTATION, Kind, LOCK_ANNOTATION, LOCKS_ANNOTATION, LOST_GRACE_ANNOTATION,
    ON_LOCK_LOST_ANNOTATION, OnLockLost, PRIORITY_ANNOTATION, TEMPLATE_ANNOTATION,
    TEMPLATES_ANNOTATION, WEIGHT_ANNOTATION,
};

/// One lock a workload asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// An existing DistributedLock, claimed while the workload runs.
    Named(String),
    /// A DistributedLock of its own, copied from this template.
    Template(String),
}

impl Gate {
    /// The DistributedLock named in the annotation: the lock, or the template.
    pub fn named(&self) -> &str {
        match self {
            Gate::Named(n) | Gate::Template(n) => n,
        }
    }
}

/// Every lock a workload asks for, in the order its annotations name them (one for
/// `lockwarden.io/lock` or `lock-template`; a list for `locks` and `lock-templates`).
/// They are *taken* in another order: see [`super::lockset`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockSet(pub Vec<Gate>);

impl LockSet {
    pub fn one(gate: Gate) -> LockSet {
        LockSet(vec![gate])
    }

    /// More than one lock: the workload carries `lockwarden.io/fences` instead of
    /// `lockwarden.io/fence`, and its own locks' names say which template they come from.
    pub fn several(&self) -> bool {
        self.0.len() > 1
    }

    pub fn gates(&self) -> &[Gate] {
        &self.0
    }
}

/// Why a workload's gating annotations cannot be acted on: its text is the Warning's
/// and the status annotation's, and the chart's admission rules refuse the same
/// mistakes with the same words (tests/bad_input/admission.rs compares them).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationError {
    /// `lock` and `lock-template` together.
    #[error(
        "both {LOCK_ANNOTATION} and {TEMPLATE_ANNOTATION} are set; a {kind} names one \
         lock with them (for several, list them in {LOCKS_ANNOTATION} and \
         {TEMPLATES_ANNOTATION})"
    )]
    LockAndTemplate { kind: &'static str },
    /// A single-lock annotation together with a list.
    #[error(
        "both {single} and {list} are set; name one lock with {single}, or list every \
         lock in {LOCKS_ANNOTATION} / {TEMPLATES_ANNOTATION}"
    )]
    OneAndList {
        single: &'static str,
        list: &'static str,
    },
    /// A list with nothing between two commas.
    #[error(
        "{which}: {value:?} has an empty entry; give DistributedLock names \
         separated by commas, e.g. \"db,bucket\""
    )]
    EmptyEntry { which: &'static str, value: String },
    /// A lock named twice across the lists.
    #[error("{which}: {name:?} is named twice")]
    NamedTwice { which: &'static str, name: String },
    /// `NAMESPACE/NAME` where the kind may only name its own namespace's locks.
    #[error(
        "{which}: {name:?} names a lock in another namespace; a {kind} can only use \
         a DistributedLock in its own namespace (give the name alone)"
    )]
    OtherNamespace {
        which: &'static str,
        name: String,
        kind: &'static str,
    },
    /// Not a valid namespace or DistributedLock name (the error names which).
    #[error("{which}: {source}")]
    Name {
        which: &'static str,
        #[source]
        source: NameError,
    },
    /// An `on-lock-lost` the kind does not take.
    #[error("{ON_LOCK_LOST_ANNOTATION}: {value:?} is not one of {allowed} (for a {kind})")]
    OnLockLost {
        value: String,
        allowed: String,
        kind: &'static str,
    },
    /// A `lost-grace` that is not a duration.
    #[error("{LOST_GRACE_ANNOTATION}: {value:?}: {source}")]
    LostGraceSyntax {
        value: String,
        #[source]
        source: DurationError,
    },
    /// A `lost-grace` that would keep the workload running past the earliest takeover.
    #[error(
        "{LOST_GRACE_ANNOTATION}: {value:?} would keep the {kind} running past the point \
         where another holder may acquire the lock; it must be less than {max} (the gap \
         between the holder deadline and the earliest takeover)"
    )]
    LostGraceTooLong {
        value: String,
        kind: &'static str,
        /// The longest allowed, as a duration string.
        max: String,
    },
    /// A `priority` that is not an int32.
    #[error(
        "not started: {PRIORITY_ANNOTATION} {text:?} is not a priority ({source}): a whole \
         number from -2147483648 to 2147483647"
    )]
    Priority {
        text: String,
        #[source]
        source: ParseIntError,
    },
    /// A `weight` that is not a whole number of at least one permit.
    #[error(
        "not started: {WEIGHT_ANNOTATION} {text:?} is not a weight: a whole number of \
         permits, at least 1"
    )]
    Weight { text: String },
}

/// The workload's locks from its annotations, `None` if it names none.
///
/// `lock` and `lock-template` name one lock each and exclude each other (as since Job
/// gating began); `locks` and `lock-templates` are comma-separated lists that may be
/// combined with each other, not with the single forms.
pub fn locks(
    annotations: &BTreeMap<String, String>,
    kind: &Kind,
) -> Result<Option<LockSet>, AnnotationError> {
    let elsewhere = kind.templates_elsewhere;
    let kind = kind.as_str();
    let get = |a: &str| annotations.get(a);
    let single = match (get(LOCK_ANNOTATION), get(TEMPLATE_ANNOTATION)) {
        (Some(_), Some(_)) => return Err(AnnotationError::LockAndTemplate { kind }),
        (Some(n), None) => Some((LOCK_ANNOTATION, n, Gate::Named as fn(String) -> Gate)),
        (None, Some(n)) => Some((TEMPLATE_ANNOTATION, n, Gate::Template as fn(String) -> Gate)),
        (None, None) => None,
    };
    let lists = [
        (LOCKS_ANNOTATION, Gate::Named as fn(String) -> Gate),
        (TEMPLATES_ANNOTATION, Gate::Template as fn(String) -> Gate),
    ];
    let listed: Vec<_> = lists
        .iter()
        .filter_map(|(a, g)| get(a).map(|v| (*a, v, *g)))
        .collect();
    if let (Some((single, ..)), Some((list, ..))) = (&single, listed.first()) {
        return Err(AnnotationError::OneAndList { single, list });
    }
    if let Some((which, name, gate)) = single {
        return Ok(Some(LockSet::one(gate(lock_name(
            which, name, kind, elsewhere,
        )?))));
    }
    let mut gates: Vec<Gate> = Vec::new();
    for (which, value, gate) in listed {
        for name in value.split(',').map(str::trim) {
            if name.is_empty() {
                return Err(AnnotationError::EmptyEntry {
                    which,
                    value: value.clone(),
                });
            }
            if gates.iter().any(|g| g.named() == name) {
                return Err(AnnotationError::NamedTwice {
                    which,
                    name: name.to_string(),
                });
            }
            gates.push(gate(lock_name(which, name, kind, elsewhere)?));
        }
    }
    Ok((!gates.is_empty()).then_some(LockSet(gates)))
}

/// The workload's locks and its `lockwarden.io/on-lock-lost` policy, `None` if it names
/// no lock: every check of its annotations that needs nothing but the annotations.
/// These are the checks the chart's admission rules make the API server run too
/// (charts/lockwarden/templates/admission-rules.yaml, the same rules in CEL;
/// tests/bad_input/admission.rs runs one table through both). `lost-grace` is left to
/// [`lost_grace`]: its maximum comes from the safety margins, and its syntax is ours.
pub fn locks_and_on_lock_lost(
    annotations: &BTreeMap<String, String>,
    kind: &Kind,
) -> Result<Option<(LockSet, OnLockLost)>, AnnotationError> {
    let Some(locks) = locks(annotations, kind)? else {
        return Ok(None);
    };
    let on_lock_lost = match annotations.get(ON_LOCK_LOST_ANNOTATION) {
        None => kind.default_on_lock_lost(),
        Some(value) => {
            kind.parse_on_lock_lost(value)
                .ok_or_else(|| AnnotationError::OnLockLost {
                    value: value.clone(),
                    allowed: kind.on_lock_lost_allowed(),
                    kind: kind.name,
                })?
        }
    };
    Ok(Some((locks, on_lock_lost)))
}

/// A DistributedLock name from annotation `which`: in the workload's own namespace,
/// and valid as one. A kind whose templates may live elsewhere
/// ([`Kind::templates_elsewhere`]) may name a template `NAMESPACE/NAME`.
fn lock_name(
    which: &'static str,
    name: &str,
    kind: &'static str,
    elsewhere: bool,
) -> Result<String, AnnotationError> {
    let is_template = which == TEMPLATE_ANNOTATION || which == TEMPLATES_ANNOTATION;
    let (namespace, local) = template_ref(name);
    let invalid = |what, e: NameError| AnnotationError::Name {
        which,
        source: e.named(what),
    };
    if let Some(namespace) = namespace {
        if !(elsewhere && is_template) {
            return Err(AnnotationError::OtherNamespace {
                which,
                name: name.to_string(),
                kind,
            });
        }
        names::kubernetes_namespace(namespace).map_err(|e| invalid("namespace", e))?;
    }
    // The same rule as the CRD's metadata.name and the CLI's Lease names.
    names::kubernetes_name(local).map_err(|e| invalid("DistributedLock name", e))?;
    Ok(name.to_string())
}

/// A template reference: `NAME` (the workload's namespace) or `NAMESPACE/NAME`.
pub fn template_ref(template: &str) -> (Option<&str>, &str) {
    match template.split_once('/') {
        Some((namespace, name)) => (Some(namespace), name),
        None => (None, template),
    }
}

/// Whether a workload with these annotations names DistributedLock `name` (as a lock
/// or a template, alone or in a list): its changes concern the workload.
pub fn names_lock(annotations: &BTreeMap<String, String>, name: &str) -> bool {
    [LOCK_ANNOTATION, TEMPLATE_ANNOTATION]
        .iter()
        .any(|a| annotations.get(*a).map(String::as_str) == Some(name))
        || [LOCKS_ANNOTATION, TEMPLATES_ANNOTATION].iter().any(|a| {
            annotations
                .get(*a)
                .is_some_and(|v| v.split(',').any(|n| n.trim() == name))
        })
}

/// Whether `container` runs the node-side guard: its command and args together start
/// with a file named `lockwarden` and the word `guard` (the chart's
/// `lockwarden.runsGuard` in CEL says the same).
pub fn runs_guard(container: &Container) -> bool {
    let mut argv = container
        .command
        .iter()
        .flatten()
        .chain(container.args.iter().flatten());
    let program = argv.next().map(String::as_str);
    program.is_some_and(|p| p.rsplit('/').next() == Some("lockwarden"))
        && argv.next().map(String::as_str) == Some("guard")
}

/// Where a gated workload's queue priority comes from (docs/design.md §6.4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueuePriority {
    /// None asked for: the template's `spec.priority`, if any.
    Template,
    /// `lockwarden.io/priority`, or the Pod's resolved `spec.priority`.
    Value(i32),
    /// A PriorityClass the Pods name, whose value the controller looks up.
    Class(String),
}

/// The workload's queue priority: `lockwarden.io/priority`, else its Pods' priority
/// (a Pod's is resolved from its class at admission), else its Pods' PriorityClass;
/// an annotation that is not an int32 is refused, naming it.
pub fn queue_priority(
    annotations: &BTreeMap<String, String>,
    spec: Option<&PodSpec>,
) -> Result<QueuePriority, AnnotationError> {
    if let Some(text) = annotations.get(PRIORITY_ANNOTATION) {
        return text
            .trim()
            .parse()
            .map(QueuePriority::Value)
            .map_err(|source| AnnotationError::Priority {
                text: text.clone(),
                source,
            });
    }
    Ok(match spec {
        Some(PodSpec {
            priority: Some(p), ..
        }) => QueuePriority::Value(*p),
        Some(PodSpec {
            priority_class_name: Some(class),
            ..
        }) if !class.is_empty() => QueuePriority::Class(class.clone()),
        _ => QueuePriority::Template,
    })
}

/// The weight `lockwarden.io/weight` asks for its own locks: `None` without it, why not
/// when it is not a whole number of at least 1.
pub fn queue_weight(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<u32>, AnnotationError> {
    let Some(text) = annotations.get(WEIGHT_ANNOTATION) else {
        return Ok(None);
    };
    match text.trim().parse::<u32>() {
        Ok(w) if w >= 1 => Ok(Some(w)),
        _ => Err(AnnotationError::Weight { text: text.clone() }),
    }
}

#[cfg(test)]
mod queue_weight_tests {
    use super::*;

    #[test]
    fn bad_input_a_weight_is_a_whole_number_of_at_least_one_permit() {
        let of = |v: &str| queue_weight(&BTreeMap::from([(WEIGHT_ANNOTATION.into(), v.into())]));
        assert_eq!(queue_weight(&BTreeMap::new()), Ok(None));
        assert_eq!(of("3"), Ok(Some(3)));
        for bad in ["0", "-1", "two", "1.5", ""] {
            let e = of(bad).unwrap_err().to_string();
            assert!(
                e.contains(WEIGHT_ANNOTATION) && e.contains("at least 1"),
                "{bad}: {e}"
            );
        }
    }
}

#[cfg(test)]
mod queue_priority_tests {
    use super::*;

    #[test]
    fn the_annotation_goes_first_then_the_pods_priority_then_its_class() {
        let annotated: BTreeMap<String, String> =
            [(PRIORITY_ANNOTATION.to_string(), "-7".to_string())].into();
        let spec = |priority: Option<i32>, class: Option<&str>| PodSpec {
            priority,
            priority_class_name: class.map(String::from),
            ..PodSpec::default()
        };
        let none = BTreeMap::new();
        let with_both = spec(Some(100), Some("high"));
        assert_eq!(
            queue_priority(&annotated, Some(&with_both)),
            Ok(QueuePriority::Value(-7))
        );
        assert_eq!(
            queue_priority(&none, Some(&with_both)),
            Ok(QueuePriority::Value(100))
        );
        assert_eq!(
            queue_priority(&none, Some(&spec(None, Some("high")))),
            Ok(QueuePriority::Class("high".into()))
        );
        assert_eq!(queue_priority(&none, None), Ok(QueuePriority::Template));
        let bad: BTreeMap<String, String> =
            [(PRIORITY_ANNOTATION.to_string(), "urgent".to_string())].into();
        let err = queue_priority(&bad, None).unwrap_err().to_string();
        assert!(
            err.contains("lockwarden.io/priority \"urgent\" is not a priority"),
            "{err}"
        );
    }
}

/// What stands between a workload annotated `lockwarden.io/guard: "true"` and its start:
/// the containers of `spec` (its Pods' spec) that do not run the guard, in a message
/// for the Warning; `None` when it does not ask for the guard or every container runs
/// it. Its containers cannot be changed any more (a suspended Job's template, a Pod),
/// so only the owner can fix it, by creating it anew with the guard.
pub fn guard_missing(
    annotations: &BTreeMap<String, String>,
    spec: Option<&PodSpec>,
) -> Option<String> {
    if annotations.get(GUARD_ANNOTATION).map(String::as_str) != Some("true") {
        return None;
    }
    let containers = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
    let unguarded: Vec<&Container> = containers.iter().filter(|c| !runs_guard(c)).collect();
    if unguarded.is_empty() && !containers.is_empty() {
        return None;
    }
    let names: Vec<&str> = unguarded.iter().map(|c| c.name.as_str()).collect();
    let without_command: Vec<&str> = unguarded
        .iter()
        .filter(|c| c.command.as_ref().is_none_or(Vec::is_empty))
        .map(|c| c.name.as_str())
        .collect();
    let hint = if without_command.is_empty() {
        String::new()
    } else {
        format!(
            " ({} has no command: the guard can only wrap a command, so set it)",
            without_command.join(", ")
        )
    };
    let which = match names.as_slice() {
        [] => "it has no container that runs".to_string(),
        [one] => format!("container {one} does not run"),
        many => format!("containers {} do not run", many.join(", ")),
    };
    Some(format!(
        "not started: {GUARD_ANNOTATION} is \"true\" but {which} `lockwarden guard`{hint}; \
         created before the guard's admission policy, or with it off: add the guard to the \
         template, see README \"Guard\""
    ))
}

/// The longest `lockwarden.io/lost-grace` that still stops the workload before another
/// holder may acquire the key.
///
/// The holder stops claiming at `sent + lease × (1 − δ) − margin` (rule 2); a contender
/// that started observing the record no earlier than `sent` takes over at the soonest
/// after `(lease + grace) × (1 − δ)` of real time (its clock may run δ fast). The gap
/// between the two, `grace × (1 − δ) + margin`, does not depend on the lease: that is
/// all a workload may wait past the holder deadline. (Its own stop then takes an API
/// round trip or two, which comes out of the same gap: hence strictly less.)
pub fn max_lost_grace(margins: &SafetyMargins) -> Duration {
    margins.grace.mul_f64(1.0 - margins.drift) + margins.margin
}

/// `lockwarden.io/lost-grace` of a workload of `kind`: zero when absent.
pub fn lost_grace(
    annotations: &BTreeMap<String, String>,
    kind: &Kind,
) -> Result<Duration, AnnotationError> {
    let Some(value) = annotations.get(LOST_GRACE_ANNOTATION) else {
        return Ok(Duration::ZERO);
    };
    let grace = parse_duration(value).map_err(|source| AnnotationError::LostGraceSyntax {
        value: value.clone(),
        source,
    })?;
    let max = max_lost_grace(&SafetyMargins::default());
    if grace >= max {
        return Err(AnnotationError::LostGraceTooLong {
            value: value.clone(),
            kind: kind.as_str(),
            max: format_duration(max),
        });
    }
    Ok(grace)
}

/// Acquired for its current spec, with a fence: what a workload may be started with.
pub fn held(lock: &DistributedLock) -> Option<(i64, String)> {
    let status = lock.status.as_ref()?;
    let generation = lock.metadata.generation;
    let condition = conditions::find_condition(&status.conditions, ACQUIRED)?;
    (condition.status == conditions::TRUE
        && condition.observed_generation == generation
        && status.observed_generation == generation
        && lock.metadata.deletion_timestamp.is_none())
    .then_some(())?;
    Some((status.fence?, status.holder.clone()?))
}

/// Whether `lock` still carries an acquisition a stopped workload ran with (fence at
/// most `lost_fence`): it must be let go and acquired anew before the workload starts
/// again.
pub fn is_old_acquisition(lock: &DistributedLock, lost_fence: i64) -> bool {
    let Some(status) = &lock.status else {
        return false;
    };
    // A Lost lock is final for its generation, whatever fence its status shows now (it
    // may name the holder that took it over): it must be let go before a new acquisition.
    !lock.spec.release
        && match status.phase {
            Some(LockPhase::Lost) => true,
            Some(LockPhase::Held) => status.fence.is_some_and(|f| f <= lost_fence),
            _ => false,
        }
}

/// Why a lock is not (yet) held, and whether that is a problem (Warning) rather than
/// ordinary waiting.
pub fn not_held_reason(lock: &DistributedLock) -> (String, bool) {
    let name = lock.name_any();
    let Some(status) = &lock.status else {
        return (format!("waiting for lock {name}: not acquired yet"), false);
    };
    let message = conditions::find_condition(&status.conditions, ACQUIRED)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    match status.phase {
        Some(LockPhase::Waiting) => {
            let holder = status.holder.as_deref().unwrap_or("another holder");
            let position = match (status.queue_position, status.queue_length) {
                (Some(p), Some(n)) => format!(", queue position {p} of {n}"),
                (Some(p), None) => format!(", queue position {p}"),
                _ => String::new(),
            };
            let expected = status
                .expected_start
                .as_ref()
                .map(|t| format!(", expected to start about {t}"))
                .unwrap_or_default();
            let position = format!("{position}{expected}");
            // A key with more than one permit has several holders: say how many.
            // (A queued mutex is stored as a set too: it has one holder to name.)
            let held_by = match (status.holders, status.permits_in_use) {
                (Some(holders), Some(in_use)) if lock.spec.permits > 1 => format!(
                    "no permit free: {in_use} of {} in use by {holders} holder{}",
                    lock.spec.permits,
                    if holders == 1 { "" } else { "s" }
                ),
                _ => format!("held by {holder}"),
            };
            (
                format!("waiting for lock {name}: {held_by}{position}"),
                false,
            )
        }
        Some(phase @ (LockPhase::Failed | LockPhase::Lost)) => (
            format!("lock {name} is {}: {message}", phase.as_str()),
            true,
        ),
        _ if message.is_empty() => (format!("waiting for lock {name}: not acquired yet"), false),
        _ => (format!("waiting for lock {name}: {message}"), false),
    }
}

/// How a running workload's lock stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockStanding {
    /// Held with the fence the workload was started with.
    Held,
    /// Not held. `reason` labels the metric and the Event (`LeaseExpiring`, `Lost`,
    /// `LockDeleted`, `NotHeld`); `may_recover`: only the holder deadline passed (the
    /// lock may come back if a renewal gets through), so `lost-grace` applies.
    NotHeld {
        reason: &'static str,
        why: String,
        may_recover: bool,
    },
}

/// The standing of the lock a running workload was started with `fence`. Read from
/// what the status says now, whatever generation it describes: a spec edit the lock
/// controller has not reported on yet does not make the workload lose its lock.
pub fn standing(lock: Option<&DistributedLock>, name: &str, fence: Option<i64>) -> LockStanding {
    let Some(lock) = lock.filter(|l| l.metadata.deletion_timestamp.is_none()) else {
        return LockStanding::NotHeld {
            reason: "LockDeleted",
            why: format!("lock {name} was deleted"),
            may_recover: false,
        };
    };
    let status = lock.status.clone().unwrap_or_default();
    let acquired = conditions::find_condition(&status.conditions, ACQUIRED);
    let same_fence = fence.is_some() && status.fence == fence;
    if status.phase == Some(LockPhase::Held) && same_fence {
        match acquired {
            Some(c) if c.status == conditions::TRUE => return LockStanding::Held,
            Some(c) if c.reason == reason::LEASE_EXPIRING => {
                return LockStanding::NotHeld {
                    reason: reason::LEASE_EXPIRING,
                    why: format!("lock {name}: {}", c.message),
                    may_recover: true,
                };
            }
            _ => {}
        }
    }
    let why = not_held_reason(lock).0;
    let reason = if status.phase == Some(LockPhase::Lost) {
        reason::LOST
    } else {
        "NotHeld"
    };
    LockStanding::NotHeld {
        reason,
        why,
        may_recover: false,
    }
}

/// What to do about a running workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunningAction {
    /// The lock is held: nothing to do.
    Continue,
    /// `ignore`: warn that the lock is no longer held, keep running.
    Warn,
    /// Within `lost-grace`: look again after this long.
    WaitGrace(Duration),
    /// Stop the workload (as its `on-lock-lost` says).
    Stop,
}

/// What a workload's annotations say about losing its lock: ignore it
/// (`on-lock-lost: ignore`), or stop the workload — after `lost_grace` if the lock may
/// still recover. (How a workload is stopped is its kind's own.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LossPolicy {
    pub ignores: bool,
    pub lost_grace: Duration,
}

/// The decision for a running workload under `policy`: `not_held_for` is how long this
/// controller has seen the lock not held (zero the first time).
pub fn running_action(
    standing: &LockStanding,
    policy: LossPolicy,
    not_held_for: Duration,
) -> RunningAction {
    match standing {
        LockStanding::Held => RunningAction::Continue,
        LockStanding::NotHeld { .. } if policy.ignores => RunningAction::Warn,
        LockStanding::NotHeld { may_recover, .. }
            if *may_recover && not_held_for < policy.lost_grace =>
        {
            RunningAction::WaitGrace(policy.lost_grace - not_held_for)
        }
        LockStanding::NotHeld { .. } => RunningAction::Stop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gating::OnLockLost;

    /// A kind for the decisions that do not depend on one.
    static WORK: Kind = Kind {
        name: "Work",
        api_version: "test.lockwarden.io/v1",
        claim_prefix: None,
        block_owner_deletion: false,
        templates_elsewhere: false,
        on_lock_lost: &[("stop", OnLockLost::Stop)],
    };

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn several_locks_come_from_the_lists_in_annotation_order() {
        let set = locks(
            &annotations(&[
                (LOCKS_ANNOTATION, "db, bucket"),
                (TEMPLATES_ANNOTATION, "queue"),
            ]),
            &WORK,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            set.gates(),
            [
                Gate::Named("db".into()),
                Gate::Named("bucket".into()),
                Gate::Template("queue".into())
            ]
        );
        assert!(set.several());
        let one = locks(&annotations(&[(LOCKS_ANNOTATION, "db")]), &WORK)
            .unwrap()
            .unwrap();
        assert_eq!(one, LockSet::one(Gate::Named("db".into())));
        assert!(!one.several());
    }

    #[test]
    fn bad_lists_say_what_is_wrong() {
        let err =
            |pairs: &[(&str, &str)]| locks(&annotations(pairs), &WORK).unwrap_err().to_string();
        let e = err(&[(LOCK_ANNOTATION, "a"), (LOCKS_ANNOTATION, "b,c")]);
        assert!(e.contains("both") && e.contains(LOCKS_ANNOTATION), "{e}");
        let e = err(&[(LOCKS_ANNOTATION, "a,,b")]);
        assert!(e.contains("empty entry"), "{e}");
        let e = err(&[(LOCKS_ANNOTATION, "a,b"), (TEMPLATES_ANNOTATION, "a")]);
        assert!(e.contains("\"a\" is named twice"), "{e}");
        let e = err(&[(TEMPLATES_ANNOTATION, "ns/a")]);
        assert!(e.contains("another namespace"), "{e}");
        let e = err(&[(LOCKS_ANNOTATION, "Bad_Name")]);
        assert!(e.contains("invalid DistributedLock name"), "{e}");
    }

    #[test]
    fn a_workload_names_a_lock_alone_or_in_a_list() {
        let a = annotations(&[(LOCKS_ANNOTATION, "db, bucket")]);
        assert!(names_lock(&a, "bucket"));
        assert!(!names_lock(&a, "buck"));
        assert!(names_lock(&annotations(&[(TEMPLATE_ANNOTATION, "q")]), "q"));
    }

    #[test]
    fn a_waiting_workload_says_for_whom_or_that_no_permit_is_free() {
        let mut lock = DistributedLock::new("db", lockwarden_api::DistributedLockSpec::default());
        lock.status = Some(lockwarden_api::DistributedLockStatus {
            phase: Some(LockPhase::Waiting),
            holder: Some("east/ns/job/a".into()),
            ..Default::default()
        });
        assert_eq!(
            not_held_reason(&lock),
            ("waiting for lock db: held by east/ns/job/a".into(), false)
        );
        lock.spec.permits = 3;
        let status = lock.status.as_mut().unwrap();
        status.holders = Some(2);
        status.permits_in_use = Some(3);
        assert_eq!(
            not_held_reason(&lock).0,
            "waiting for lock db: no permit free: 3 of 3 in use by 2 holders"
        );
    }

    fn container(name: &str, command: &[&str], args: &[&str]) -> Container {
        let list = |l: &[&str]| (!l.is_empty()).then(|| l.iter().map(|s| s.to_string()).collect());
        Container {
            name: name.into(),
            command: list(command),
            args: list(args),
            ..Container::default()
        }
    }

    #[test]
    fn guard_runs_where_command_and_args_start_with_lockwarden_guard() {
        assert!(runs_guard(&container(
            "a",
            &["/g/lockwarden", "guard", "--", "sh"],
            &[]
        )));
        assert!(runs_guard(&container(
            "a",
            &["lockwarden"],
            &["guard", "--", "sh"]
        )));
        assert!(!runs_guard(&container(
            "a",
            &["sh", "-c", "lockwarden guard"],
            &[]
        )));
        assert!(!runs_guard(&container(
            "a",
            &["/g/notlockwarden", "guard"],
            &[]
        )));
        assert!(!runs_guard(&container("a", &["/g/lockwarden", "run"], &[])));
        assert!(!runs_guard(&container("a", &[], &[])));
    }

    #[test]
    fn guard_missing_names_each_unguarded_container_and_one_without_command() {
        let ask = BTreeMap::from([(GUARD_ANNOTATION.to_string(), "true".to_string())]);
        let spec = |containers: Vec<Container>| PodSpec {
            containers,
            ..PodSpec::default()
        };
        let guarded = container("ok", &["/g/lockwarden", "guard", "--", "x"], &[]);
        assert_eq!(
            guard_missing(&ask, Some(&spec(vec![guarded.clone()]))),
            None
        );
        // Not asked for: none of its business.
        let plain = container("work", &["sh"], &[]);
        assert_eq!(
            guard_missing(&BTreeMap::new(), Some(&spec(vec![plain.clone()]))),
            None
        );
        let message = guard_missing(
            &ask,
            Some(&spec(vec![
                guarded,
                plain,
                container("entry", &[], &["run"]),
            ])),
        )
        .unwrap();
        assert!(
            message.contains("containers work, entry do not run `lockwarden guard`")
                && message.contains("(entry has no command")
                && message.contains("add the guard to the template, see README \"Guard\""),
            "{message}"
        );
    }
}

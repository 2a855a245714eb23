//! Several locks for one workload without deadlock (docs/design.md §6.1).
//!
//! A workload that needs locks {a, b} and another that needs {b, a} would deadlock if
//! each took its first lock and waited for its second. So every workload takes its locks
//! one at a time in one global order — by the key each names in its store
//! ([`Target::order_key`], which is the same in every cluster), then by name — and
//! asks for the next only once the previous is held. It keeps what it holds while it
//! waits for the rest: whoever holds the lowest contended key can always finish, so
//! nobody waits forever, and nobody releases and retries (no livelock). A loss of any
//! of them is a loss of the workload's lock.

use std::collections::BTreeMap;

use kube::api::Api;
use kube::runtime::events::EventType;

use super::decide::{self, Gate, LockSet};
use super::locks::{self, Claim, claim, own_lock};
use super::{FENCE_ANNOTATION, FENCES_ANNOTATION, HOLDER_ANNOTATION, Kinds, Workload};
use crate::api::DistributedLock;
use crate::controller::validated::LockAddress;

/// One of a workload's locks: how it gets it, and the DistributedLock's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadLock {
    pub gate: Gate,
    pub name: String,
}

/// The workload's locks with their DistributedLock names, in annotation order.
pub fn named(set: &LockSet, workload: &Workload) -> Vec<WorkloadLock> {
    set.gates()
        .iter()
        .map(|gate| WorkloadLock {
            gate: gate.clone(),
            name: workload.lock_name(gate, set.several()),
        })
        .collect()
}

/// Not (yet) possible: the Event type, reason and message to report.
pub type Waiting = (EventType, &'static str, String);

/// The workload's locks in the order they are taken. One lock needs no order (and no
/// read); for several, each lock's key is read from the lock or its template.
pub async fn in_take_order(
    api: &Api<DistributedLock>,
    set: &LockSet,
    workload: &Workload,
) -> Result<Result<Vec<WorkloadLock>, Waiting>, kube::Error> {
    let all = named(set, workload);
    if !set.several() {
        return Ok(Ok(all));
    }
    let mut keyed = Vec::with_capacity(all.len());
    for lock in all {
        let source = lock.gate.named();
        let Some(found) = api.get_opt(source).await? else {
            let what = match lock.gate {
                Gate::Named(_) => "DistributedLock",
                Gate::Template(_) => "lock template (a DistributedLock)",
            };
            return Ok(Err((
                EventType::Warning,
                "LockNotFound",
                format!("{what} {source} does not exist in this namespace; create it"),
            )));
        };
        match LockAddress::of(&found) {
            Ok(address) => keyed.push((address.target.order_key(), lock)),
            Err(e) => {
                return Ok(Err((
                    EventType::Warning,
                    "InvalidLock",
                    format!("lock {source} cannot be ordered with the others: {e}"),
                )));
            }
        }
    }
    keyed.sort_by(|a, b| (&a.0, &a.1.name).cmp(&(&b.0, &b.1.name)));
    if let Some(pair) = keyed.windows(2).find(|p| p[0].0 == p[1].0) {
        return Ok(Err((
            EventType::Warning,
            "InvalidLockAnnotation",
            format!(
                "locks {} and {} name the same key {}: a workload cannot hold one key twice",
                pair[0].1.gate.named(),
                pair[1].1.gate.named(),
                pair[0].0
            ),
        )));
    }
    Ok(Ok(keyed.into_iter().map(|(_, lock)| lock).collect()))
}

/// What a workload runs with: per lock, in the order taken, its fence and holder.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RanWith(pub Vec<(String, i64, String)>);

impl RanWith {
    /// The annotations that record it on the workload: `lockwarden.io/fence` and
    /// `lockwarden.io/holder` for one lock, `lockwarden.io/fences` for several.
    pub fn annotations(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut out = serde_json::Map::new();
        match &self.0[..] {
            [(_, fence, holder)] => {
                out.insert(FENCE_ANNOTATION.into(), fence.to_string().into());
                out.insert(HOLDER_ANNOTATION.into(), holder.clone().into());
            }
            several => {
                out.insert(FENCES_ANNOTATION.into(), format_fences(several).into());
            }
        }
        out
    }

    /// "lock db (fence 3)" or "locks db, bucket (fences db=3,bucket=7)".
    pub fn describe(&self) -> String {
        match &self.0[..] {
            [(name, fence, holder)] => format!("lock {name} (fence {fence}, holder {holder})"),
            several => format!(
                "locks {} (fences {})",
                several
                    .iter()
                    .map(|l| l.0.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                format_fences(several)
            ),
        }
    }
}

fn format_fences(locks: &[(String, i64, String)]) -> String {
    locks
        .iter()
        .map(|(name, fence, _)| format!("{name}={fence}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The fence per lock a workload was started with, from its annotations
/// (`lockwarden.io/fence` names the one lock of `locks`; `lockwarden.io/fences` each, in
/// the order they were taken, which this keeps). A lock missing from them maps to `None`.
pub fn fences_of(
    annotations: &BTreeMap<String, String>,
    locks: &[WorkloadLock],
) -> Vec<(String, Option<i64>)> {
    let recorded: Vec<(&str, i64)> = match (
        annotations.get(FENCES_ANNOTATION),
        annotations.get(FENCE_ANNOTATION),
        locks,
    ) {
        (Some(list), _, _) => parse_fences(list),
        (None, Some(fence), [only]) => fence
            .parse()
            .ok()
            .map(|f| vec![(only.name.as_str(), f)])
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    let mut out: Vec<(String, Option<i64>)> = recorded
        .iter()
        .filter(|(name, _)| locks.iter().any(|l| l.name == *name))
        .map(|(name, fence)| (name.to_string(), Some(*fence)))
        .collect();
    for lock in locks {
        if !out.iter().any(|(name, _)| *name == lock.name) {
            out.push((lock.name.clone(), None));
        }
    }
    out
}

/// `db=3,bucket=7` → [(db, 3), (bucket, 7)], in order; entries that do not parse are
/// left out (a lock without its fence is not held for the workload, which is the safe
/// reading).
pub fn parse_fences(list: &str) -> Vec<(&str, i64)> {
    list.split(',')
        .filter_map(|e| {
            let (name, fence) = e.trim().split_once('=')?;
            Some((name.trim(), fence.trim().parse().ok()?))
        })
        .collect()
}

/// The names of a workload's locks, for messages: "lock db" or "locks db, bucket".
pub fn describe(locks: &[WorkloadLock]) -> String {
    let names: Vec<&str> = locks.iter().map(|l| l.name.as_str()).collect();
    match names[..] {
        [one] => format!("lock {one}"),
        _ => format!("locks {}", names.join(", ")),
    }
}

/// What a workload ran with, for messages and `lockwarden.io/lost-fence`: "7" for one
/// lock, "db=3,bucket=7" for several ("?" for a fence it does not carry).
pub fn fence_text(fences: &[(String, Option<i64>)]) -> String {
    let shown = |f: &Option<i64>| f.map_or_else(|| "?".to_string(), |f| f.to_string());
    match fences {
        [(_, fence)] => shown(fence),
        several => several
            .iter()
            .map(|(name, fence)| format!("{name}={}", shown(fence)))
            .collect::<Vec<_>>()
            .join(","),
    }
}

/// What taking the locks came to.
pub enum Taking {
    /// Every lock is held for the workload.
    Held(RanWith),
    /// Still waiting (or a problem to report).
    Waiting(Waiting),
}

/// How one workload takes its locks.
pub struct Taker<'a> {
    pub api: &'a Api<DistributedLock>,
    /// Every kind a claim may name (a stale claim is released).
    pub kinds: &'a Kinds,
    pub workload: &'a Workload,
    /// This controller's cluster name (the holder identity of the workload's own locks).
    pub cluster: &'a str,
    /// Another unfinished workload started with named lock NAME (from the caller's
    /// cache), if any: a claim removed by hand must not let a second one start.
    pub in_use_by: &'a (dyn Fn(&str) -> Option<String> + Sync),
    /// Per lock, the fence the workload ran with before it was stopped after a loss: that
    /// acquisition is let go and a new one taken.
    pub lost: &'a BTreeMap<String, i64>,
}

impl Taker<'_> {
    /// Takes `ordered` one at a time: each is claimed (or created) only once every lock
    /// before it is held for the workload.
    pub async fn take(&self, ordered: &[WorkloadLock]) -> Result<Taking, kube::Error> {
        let mut held = RanWith::default();
        for (i, lock) in ordered.iter().enumerate() {
            let step = |(type_, reason, message): Waiting| {
                Taking::Waiting((type_, reason, progress(message, i, ordered, &held)))
            };
            let found = match self.claim(lock).await? {
                Claim::Ours(found) => *found,
                Claim::Waiting(type_, reason, message) => {
                    return Ok(step((type_, reason, message)));
                }
            };
            if let Some(&lost) = self.lost.get(&lock.name)
                && decide::is_old_acquisition(&found, lost)
            {
                // Still the acquisition the workload lost: let it go, so the next is new.
                locks::let_go(self.api, self.workload, &lock.gate, &lock.name, true).await?;
                let message = format!(
                    "waiting for lock {}: letting go of the acquisition lost with fence {lost}",
                    lock.name
                );
                return Ok(step((EventType::Normal, "Waiting", message)));
            }
            let Some((fence, holder)) = decide::held(&found) else {
                let (message, problem) = decide::not_held_reason(&found);
                let (type_, reason) = if problem {
                    (EventType::Warning, "LockFailed")
                } else {
                    (EventType::Normal, "Waiting")
                };
                return Ok(step((type_, reason, message)));
            };
            held.0.push((lock.name.clone(), fence, holder));
        }
        Ok(Taking::Held(held))
    }

    async fn claim(&self, lock: &WorkloadLock) -> Result<Claim, kube::Error> {
        match &lock.gate {
            Gate::Named(name) => {
                claim(
                    self.api,
                    self.kinds,
                    self.workload,
                    name,
                    (self.in_use_by)(name),
                )
                .await
            }
            Gate::Template(template) => {
                own_lock(self.api, self.cluster, self.workload, template, &lock.name).await
            }
        }
    }
}

/// With several locks, says how far the workload got: which lock of how many it waits
/// for, and what it holds meanwhile.
fn progress(message: String, i: usize, ordered: &[WorkloadLock], held: &RanWith) -> String {
    if ordered.len() < 2 {
        return message;
    }
    let holding = if held.0.is_empty() {
        String::new()
    } else {
        format!(
            "; holding {}",
            held.0
                .iter()
                .map(|(n, f, _)| format!("{n} (fence {f})"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    format!(
        "lock {} of {} in order: {message}{holding}",
        i + 1,
        ordered.len()
    )
}

/// Lets every lock of the workload go; what was done, for the Event.
pub async fn let_go_all(
    api: &Api<DistributedLock>,
    workload: &Workload,
    locks: &[WorkloadLock],
    ran: bool,
) -> Result<Vec<String>, kube::Error> {
    let mut notes = Vec::new();
    for lock in locks {
        if let Some(note) = locks::let_go(api, workload, &lock.gate, &lock.name, ran).await? {
            notes.push(note);
        }
    }
    Ok(notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(name: &str) -> WorkloadLock {
        WorkloadLock {
            gate: Gate::Named(name.into()),
            name: name.into(),
        }
    }

    #[test]
    fn one_lock_is_recorded_as_fence_and_holder_several_as_fences() {
        let one = RanWith(vec![("db".into(), 3, "c/ns/db".into())]);
        let a = one.annotations();
        assert_eq!(a[FENCE_ANNOTATION], "3");
        assert_eq!(a[HOLDER_ANNOTATION], "c/ns/db");
        assert!(!a.contains_key(FENCES_ANNOTATION));
        let two = RanWith(vec![
            ("db".into(), 3, "h".into()),
            ("bucket".into(), 7, "h".into()),
        ]);
        let a = two.annotations();
        assert_eq!(a[FENCES_ANNOTATION], "db=3,bucket=7");
        assert!(!a.contains_key(FENCE_ANNOTATION));
    }

    #[test]
    fn fences_read_back_per_lock_and_a_missing_one_is_none() {
        let annotations = BTreeMap::from([(
            FENCES_ANNOTATION.to_string(),
            "db=3, bucket=7,x=y".to_string(),
        )]);
        // In the order taken (the annotation's), whatever order the locks come in.
        let locks = [lock("bucket"), lock("other"), lock("db")];
        assert_eq!(
            fences_of(&annotations, &locks),
            [
                ("db".to_string(), Some(3)),
                ("bucket".to_string(), Some(7)),
                ("other".to_string(), None)
            ]
        );
        let single = BTreeMap::from([(FENCE_ANNOTATION.to_string(), "5".to_string())]);
        assert_eq!(
            fences_of(&single, &[lock("db")]),
            [("db".to_string(), Some(5))]
        );
    }

    #[test]
    fn progress_names_the_step_and_what_is_held() {
        let ordered = [lock("a"), lock("b"), lock("c")];
        let held = RanWith(vec![("a".into(), 4, "h".into())]);
        assert_eq!(
            progress("waiting for lock b: held by x".into(), 1, &ordered, &held),
            "lock 2 of 3 in order: waiting for lock b: held by x; holding a (fence 4)"
        );
        assert_eq!(
            progress("waiting".into(), 0, &ordered[..1], &RanWith::default()),
            "waiting"
        );
    }
}

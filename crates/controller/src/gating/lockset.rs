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
use std::time::Duration;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;

use super::decide::{self, Gate, LockSet};
use super::error::LockRequestFailed;
use super::locks::{self, Claim, OwnLockTerms, claim, own_lock};
use super::machine::Ended;
use super::{
    FENCE_ANNOTATION, FENCES_ANNOTATION, HOLDER_ANNOTATION, Kinds, NONCE_ANNOTATION,
    NONCES_ANNOTATION, URL_ANNOTATION, URLS_ANNOTATION, Workload,
};
use crate::validated::LockAddress;
use lockwarden_api::DistributedLock;

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

/// The DistributedLock a gate names: the lock, or its template (in the workload's
/// namespace, or in the one a `NAMESPACE/NAME` template reference names).
pub async fn lock_or_template(
    api: &Api<DistributedLock>,
    gate: &Gate,
) -> Result<Option<DistributedLock>, kube::Error> {
    match gate {
        Gate::Named(name) => api.get_opt(name).await,
        Gate::Template(template) => match decide::template_ref(template) {
            (None, name) => api.get_opt(name).await,
            (Some(namespace), name) => {
                Api::<DistributedLock>::namespaced(api.clone().into_client(), namespace)
                    .get_opt(name)
                    .await
            }
        },
    }
}

/// Not (yet) possible: the Event type, reason and message to report.
pub type Waiting = (EventType, &'static str, String);

/// The workload's locks in the order they are taken. One lock needs no order (and no
/// read); for several, each lock's key is read from the lock or its template.
pub async fn in_take_order(
    api: &Api<DistributedLock>,
    set: &LockSet,
    workload: &Workload,
) -> Result<Result<Vec<WorkloadLock>, Waiting>, LockRequestFailed> {
    let all = named(set, workload);
    if !set.several() {
        return Ok(Ok(all));
    }
    let mut keyed = Vec::with_capacity(all.len());
    for lock in all {
        let source = lock.gate.named();
        let Some(found) = lock_or_template(api, &lock.gate)
            .await
            .map_err(LockRequestFailed::about(source))?
        else {
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

/// One lock a workload runs with, as the lock's status and spec say when it starts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ran {
    /// The DistributedLock's name.
    pub name: String,
    pub fence: i64,
    /// The holder identity written in the store.
    pub holder: String,
    /// The acquisition's nonce (`status.nonce`), for the node-side guard.
    pub nonce: String,
    /// The store URL of the lock (`s3://bucket/key`, …), for the node-side guard.
    pub url: String,
    /// `spec.lockDelay` (zero when unset).
    pub lock_delay: Duration,
    /// Whether its store can carry a lock-delay (not ZooKeeper).
    pub supports_lock_delay: bool,
}

impl Ran {
    /// What `lock`, held for the workload with `fence` and `holder`, runs with.
    pub fn of(lock: &DistributedLock, fence: i64, holder: String) -> Ran {
        let ns = lock.namespace().unwrap_or_default();
        Ran {
            name: lock.name_any(),
            fence,
            holder,
            nonce: lock
                .status
                .as_ref()
                .and_then(|s| s.nonce.clone())
                .unwrap_or_default(),
            url: lock.spec.backend.lock_url(&ns).unwrap_or_default(),
            lock_delay: lock.spec.lock_delay().ok().flatten().unwrap_or_default(),
            supports_lock_delay: lock.spec.backend.supports_lock_delay(),
        }
    }
}

/// What a workload runs with: per lock, in the order taken.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RanWith(pub Vec<Ran>);

impl RanWith {
    /// The annotations that record it on the workload: `lockwarden.io/fence`,
    /// `lockwarden.io/holder`, `lockwarden.io/nonce` and `lockwarden.io/url` for one
    /// lock; `lockwarden.io/fences`, `lockwarden.io/nonces` and `lockwarden.io/urls`
    /// (`NAME=VALUE` per lock, in the order taken; comma-separated, the URLs
    /// space-separated) for several. The nonce and URL are
    /// what the node-side guard reads the record by.
    pub fn annotations(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut out = serde_json::Map::new();
        match &self.0[..] {
            [one] => {
                out.insert(FENCE_ANNOTATION.into(), one.fence.to_string().into());
                out.insert(HOLDER_ANNOTATION.into(), one.holder.clone().into());
                out.insert(NONCE_ANNOTATION.into(), one.nonce.clone().into());
                out.insert(URL_ANNOTATION.into(), one.url.clone().into());
            }
            several => {
                let list = |value: fn(&Ran) -> String, separator: &str| {
                    several
                        .iter()
                        .map(|r| format!("{}={}", r.name, value(r)))
                        .collect::<Vec<_>>()
                        .join(separator)
                };
                out.insert(
                    FENCES_ANNOTATION.into(),
                    list(|r| r.fence.to_string(), ",").into(),
                );
                out.insert(
                    NONCES_ANNOTATION.into(),
                    list(|r| r.nonce.clone(), ",").into(),
                );
                // Spaces: a ZooKeeper URL's server list has commas.
                out.insert(URLS_ANNOTATION.into(), list(|r| r.url.clone(), " ").into());
            }
        }
        out
    }

    /// "lock db (fence 3)" or "locks db, bucket (fences db=3,bucket=7)".
    pub fn describe(&self) -> String {
        match &self.0[..] {
            [one] => format!(
                "lock {} (fence {}, holder {})",
                one.name, one.fence, one.holder
            ),
            several => format!(
                "locks {} (fences {})",
                several
                    .iter()
                    .map(|l| l.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                format_fences(several)
            ),
        }
    }
}

fn format_fences(locks: &[Ran]) -> String {
    locks
        .iter()
        .map(|r| format!("{}={}", r.name, r.fence))
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
    /// Never possible for this workload: why.
    Impossible(String),
    /// Its run is already completed (once per run, §6.7): its lock was granted and let
    /// go at once; why.
    RunDone(String),
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
    /// Whether the processes of the run that lost it are observed ended: only then is a
    /// lost acquisition let go (docs/design.md §6.3).
    pub ended: Option<&'a Ended>,
    /// What its own locks made from templates take: the lock-delay its Pods need, its
    /// queue priority and weight.
    pub terms: OwnLockTerms,
}

impl Taker<'_> {
    /// Takes `ordered` one at a time: each is claimed (or created) only once every lock
    /// before it is held for the workload.
    pub async fn take(&self, ordered: &[WorkloadLock]) -> Result<Taking, LockRequestFailed> {
        let mut held = RanWith::default();
        for (i, lock) in ordered.iter().enumerate() {
            let step = |(type_, reason, message): Waiting| {
                Taking::Waiting((type_, reason, progress(message, i, ordered, &held)))
            };
            let found = match self
                .claim(lock)
                .await
                .map_err(LockRequestFailed::about(&lock.name))?
            {
                Claim::Ours(found) => *found,
                Claim::Waiting(type_, reason, message) => {
                    return Ok(step((type_, reason, message)));
                }
                Claim::Impossible(why) => return Ok(Taking::Impossible(why)),
            };
            if let Some(why) = super::once::run_completed(&found) {
                return Ok(Taking::RunDone(why));
            }
            if let Some(&lost) = self.lost.get(&lock.name)
                && decide::is_old_acquisition(&found, lost)
            {
                // Still the acquisition the workload lost: let it go, so the next is new —
                // once the processes of the run that lost it have ended.
                let Some(ended) = self.ended else {
                    let message = format!(
                        "waiting for lock {}: the processes of the run that lost it (fence \
                         {lost}) have not ended yet",
                        lock.name
                    );
                    return Ok(step((EventType::Normal, "Waiting", message)));
                };
                let done = locks::Done {
                    ran: true,
                    succeeded: false,
                };
                locks::let_go(ended, self.api, self.workload, &lock.gate, &lock.name, done)
                    .await
                    .map_err(LockRequestFailed::about(&lock.name))?;
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
            held.0.push(Ran::of(&found, fence, holder));
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
                own_lock(
                    self.api,
                    self.cluster,
                    self.workload,
                    template,
                    &lock.name,
                    &self.terms,
                )
                .await
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
                .map(|r| format!("{} (fence {})", r.name, r.fence))
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
    ended: &Ended,
    api: &Api<DistributedLock>,
    workload: &Workload,
    locks: &[WorkloadLock],
    ran: bool,
    succeeded: bool,
) -> Result<Vec<String>, LockRequestFailed> {
    let mut notes = Vec::new();
    for lock in locks {
        let done = locks::Done { ran, succeeded };
        if let Some(note) = locks::let_go(ended, api, workload, &lock.gate, &lock.name, done)
            .await
            .map_err(LockRequestFailed::about(&lock.name))?
        {
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

    fn ran(name: &str, fence: i64) -> Ran {
        Ran {
            name: name.into(),
            fence,
            holder: format!("c/ns/{name}"),
            nonce: format!("n-{name}"),
            url: format!("s3://b/{name}"),
            lock_delay: Duration::ZERO,
            supports_lock_delay: true,
        }
    }

    #[test]
    fn one_lock_is_recorded_as_fence_holder_nonce_and_url_several_as_lists() {
        let one = RanWith(vec![ran("db", 3)]);
        let a = one.annotations();
        assert_eq!(a[FENCE_ANNOTATION], "3");
        assert_eq!(a[HOLDER_ANNOTATION], "c/ns/db");
        assert_eq!(a[NONCE_ANNOTATION], "n-db");
        assert_eq!(a[URL_ANNOTATION], "s3://b/db");
        assert!(!a.contains_key(FENCES_ANNOTATION));
        assert!(!a.contains_key(NONCES_ANNOTATION));
        let two = RanWith(vec![ran("db", 3), ran("bucket", 7)]);
        let a = two.annotations();
        // The same order in every list: the order taken.
        assert_eq!(a[FENCES_ANNOTATION], "db=3,bucket=7");
        assert_eq!(a[NONCES_ANNOTATION], "db=n-db,bucket=n-bucket");
        assert_eq!(a[URLS_ANNOTATION], "db=s3://b/db bucket=s3://b/bucket");
        assert!(!a.contains_key(FENCE_ANNOTATION));
        assert!(!a.contains_key(NONCE_ANNOTATION));
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
        let held = RanWith(vec![ran("a", 4)]);
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

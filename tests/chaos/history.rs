//! The recorded history of one schedule, the fenced register the contenders write to,
//! and the checkers (docs/safety.md, "Fault-injection harness", defines each rule).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::mirror::{MirrorCounts, S3Mirror, Verdict};

/// Who a claim or write belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An engine client: claims while its `HeldLock` says Held.
    Engine,
    /// A command under `lockwarden run` (claims until `run` stops it), or the script
    /// around `lockwarden lock` (claims within the lease it asked for).
    Cli,
    /// A `DistributedLock`: claims while its status says Acquired=True (as watched),
    /// up to the deadline its controller must respect (see `controller_claims`).
    Controller,
}

#[derive(Clone, Debug)]
pub struct Claim {
    pub key: String,
    pub who: String,
    pub nonce: String,
    pub fence: u64,
    pub start: f64,
    pub end: f64,
}

#[derive(Clone, Debug)]
struct RegisterWrite {
    key: String,
    writer: String,
    kind: Kind,
    fence: u64,
    /// When the register applied it.
    t: f64,
    /// When its writer sent it: `t`, except for a CLI command's line, which carries
    /// its own send time (the harness may read a line late on a loaded machine).
    sent: f64,
    accepted: bool,
    high_water: u64,
    /// Permits this write's holder takes on a key with more than one (an exclusive
    /// holder: all of them); 0 on a mutex key.
    weight: u32,
}

/// One observer read of a key with more than one permit: the holder set.
#[derive(Clone, Debug)]
struct SetPoll {
    key: String,
    complete: f64,
    /// The last fence granted on the key (the record's fence).
    last_fence: u64,
    /// (nonce, fence) of every holder, in grant order.
    entries: Vec<(String, u64)>,
}

/// One entry of a queued holder set as an observer read showed it.
#[derive(Clone, Debug)]
pub struct QueuedEntry {
    pub nonce: String,
    pub holder: String,
    pub ticket: u64,
    pub priority: i32,
    pub revision: String,
    pub lease: Duration,
}

impl QueuedEntry {
    /// Whether `self` goes before `other` in grant order (docs/design.md §6.4, Q2).
    fn goes_before(&self, other: &QueuedEntry) -> bool {
        (other.priority, std::cmp::Reverse(other.ticket))
            < (self.priority, std::cmp::Reverse(self.ticket))
    }
}

/// One observer read of a key whose holder set keeps a queue.
#[derive(Clone, Debug)]
struct QueuePoll {
    key: String,
    complete: f64,
    holders: Vec<QueuedEntry>,
    waiters: Vec<QueuedEntry>,
}

impl QueuePoll {
    fn entries(&self) -> impl Iterator<Item = &QueuedEntry> {
        self.holders.iter().chain(&self.waiters)
    }
}

/// When a fault of the schedule was on, from `start` to `end`.
#[derive(Clone, Debug)]
struct FaultWindow {
    start: f64,
    end: f64,
}

/// One poll of the backend record by the harness's observer.
#[derive(Clone, Debug)]
struct Poll {
    key: String,
    invoke: f64,
    complete: f64,
    /// (nonce, fence, version, held)
    record: Option<(String, u64, String, bool)>,
}

#[derive(Clone, Debug)]
struct StatusObs {
    t: f64,
    lock: String,
    key: String,
    acquired: bool,
    fence: u64,
    nonce: String,
    holder: String,
}

/// An acquisition learned from any source: (key, t, nonce, fence, source).
#[derive(Clone, Debug)]
struct Evidence {
    key: String,
    t: f64,
    nonce: String,
    fence: u64,
    source: String,
    /// When the contender began asking (its own acquire): the grant came later.
    invoke: Option<f64>,
}

impl Evidence {
    /// An acquisition seen by `source` at `t` (not its own acquire: no invoke time).
    fn seen(key: &str, t: f64, nonce: &str, fence: u64, source: &str) -> Evidence {
        Evidence {
            key: key.into(),
            t,
            nonce: nonce.into(),
            fence,
            source: source.into(),
            invoke: None,
        }
    }
}

#[derive(Default)]
struct Inner {
    lines: Vec<Value>,
    writes: Vec<RegisterWrite>,
    high_water: HashMap<String, u64>,
    polls: Vec<Poll>,
    status: Vec<StatusObs>,
    evidence: Vec<Evidence>,
    claims: Vec<Claim>,
    violations: Vec<String>,
    /// key -> lease of the DistributedLocks on it
    controller_lease: HashMap<String, Duration>,
    /// lock -> when the harness (the "Job" of that DistributedLock) let go of it.
    let_go: HashMap<String, f64>,
    /// Every key of a session-bound backend (ZooKeeper): its record versions do not
    /// change on renewal.
    session_bound: bool,
    /// key -> its permits, for keys with more than one (checked by the permit rules).
    permits: HashMap<String, u32>,
    set_polls: Vec<SetPoll>,
    /// Reads of keys whose set keeps a queue (rules (o) and (q)).
    queue_polls: Vec<QueuePoll>,
    /// When faults were on (rule (q) does not count their time).
    fault_windows: Vec<FaultWindow>,
    /// Guarded rounds: (key, who, the guard's latest deadline if it logged one).
    guard_deadlines: Vec<(String, String, Option<f64>)>,
    /// How guarded rounds ended (`ended`, `stopped-unconfirmed`…) -> count.
    guard_outcomes: BTreeMap<String, usize>,
}

/// The history of one schedule. Times are seconds since the schedule began.
pub struct History {
    pub seed: u64,
    base: Instant,
    inner: Mutex<Inner>,
    /// S3 schedules: the register's writes also go to S3 as fenced puts (rule (f)).
    mirror: OnceLock<S3Mirror>,
}

/// What a check found, and numbers for the summary.
#[derive(Default, Debug)]
pub struct Report {
    pub violations: Vec<String>,
    pub writes_accepted: usize,
    pub writes_rejected_stale_status: usize,
    /// Holders' writes sent before a higher fence wrote, refused on arrival after it.
    pub writes_refused_in_flight: usize,
    pub acquisitions: usize,
    pub claims: usize,
    /// Claims of command-line holders (`run`'s commands, scripts around `lock`).
    pub cli_claims: usize,
    pub polls: usize,
    pub operations: usize,
    /// Per key: seconds from healing until some contender claimed the lock.
    pub liveness: Vec<f64>,
    /// S3 schedules: what S3 said to the register's writes mirrored as fenced puts.
    pub s3_fenced: MirrorCounts,
    /// Per key with more than one permit: (most permits in flight at once, permits).
    pub permits_in_flight: Vec<(u32, u32)>,
    /// Claims of exclusive holders on keys with more than one permit.
    pub exclusive_claims: usize,
    /// Claims of guarded commands (under `lockwarden guard`).
    pub guarded_claims: usize,
    /// How guarded rounds ended -> count.
    pub guard_outcomes: BTreeMap<String, usize>,
    /// Grants on queued keys checked against a waiter registered before them (rule (o)).
    pub queue_grants_checked: usize,
    /// Longest time an entry of a queued set was seen unchanged while waiters waited,
    /// outside faults (rule (q)), in seconds.
    pub queue_longest_unchanged: f64,
}

impl History {
    pub fn new(seed: u64, session_bound: bool) -> History {
        History {
            seed,
            base: Instant::now(),
            inner: Mutex::new(Inner {
                session_bound,
                ..Default::default()
            }),
            mirror: OnceLock::new(),
        }
    }

    /// Writes `fence` to `key`'s S3 object only (the checker's own test: S3 then
    /// disagrees with the register).
    pub async fn mirror_write_behind_the_registers_back(&self, key: &str, fence: u64) {
        let mirror = self.mirror.get().expect("a mirror");
        mirror.write_object_only(key, fence).await;
    }

    /// Mirrors every later register write on a mutex key to S3 ([`S3Mirror`]).
    pub fn mirror_to(&self, mirror: S3Mirror) {
        assert!(self.mirror.set(mirror).is_ok(), "one mirror per history");
    }

    pub fn now(&self) -> f64 {
        self.base.elapsed().as_secs_f64()
    }

    fn line(&self, inner: &mut Inner, mut v: Value) {
        v["schedule"] = json!(self.seed);
        inner.lines.push(v);
    }

    /// Records a free-form history line (faults, acquire attempts…).
    pub fn record(&self, v: Value) {
        let mut inner = self.inner.lock().unwrap();
        self.line(&mut inner, v);
    }

    pub fn set_controller_lease(&self, key: &str, lease: Duration) {
        self.inner
            .lock()
            .unwrap()
            .controller_lease
            .insert(key.to_string(), lease);
    }

    /// A write to the fenced register ([`History::write`]), and on S3 schedules the
    /// same write to S3 as a fenced put, whose verdict must be the register's (rule
    /// (f)). The write's time is when it was made, before it waits for its key's turn.
    pub async fn write_fenced(&self, key: &str, writer: &str, kind: Kind, fence: u64) -> bool {
        let t = self.now();
        self.write_fenced_sent(key, writer, kind, fence, t).await
    }

    /// [`History::write_fenced`] of a write its writer sent at `sent` (on this
    /// history's clock), no later than now.
    pub async fn write_fenced_sent(
        &self,
        key: &str,
        writer: &str,
        kind: Kind,
        fence: u64,
        sent: f64,
    ) -> bool {
        let t = self.now();
        let sent = sent.min(t);
        let Some(mirror) = self.mirror.get() else {
            return self.write_at(key, writer, kind, fence, (t, sent));
        };
        let (accepted, verdict) = mirror
            .write(key, writer, fence, || {
                self.write_at(key, writer, kind, fence, (t, sent))
            })
            .await;
        if let Verdict::Disagree(how) = verdict {
            self.violation(format!("seed {}: {how}", self.seed));
        }
        accepted
    }

    /// The fenced register: accepts a write iff its fence is at least the highest
    /// fence it has accepted for `key`.
    pub fn write(&self, key: &str, writer: &str, kind: Kind, fence: u64) -> bool {
        let t = self.now();
        self.write_at(key, writer, kind, fence, (t, t))
    }

    /// Applies a write at `t`, sent at `sent`.
    fn write_at(
        &self,
        key: &str,
        writer: &str,
        kind: Kind,
        fence: u64,
        (t, sent): (f64, f64),
    ) -> bool {
        let mut inner = self.inner.lock().unwrap();
        let hw = inner.high_water.get(key).copied().unwrap_or(0);
        let accepted = fence >= hw;
        if accepted {
            inner.high_water.insert(key.to_string(), fence);
        }
        inner.writes.push(RegisterWrite {
            key: key.to_string(),
            writer: writer.to_string(),
            kind,
            fence,
            t,
            sent,
            accepted,
            high_water: hw,
            weight: 0,
        });
        self.line(
            &mut inner,
            json!({"process": writer, "op": "write", "key": key, "invoke": t, "complete": t,
                   "result": if accepted {"ok"} else {"fail"}, "fence": fence, "highWater": hw}),
        );
        accepted
    }

    /// Declares `key` a key with `permits` permits (more than one): its writes go to
    /// [`History::write_permit`] and the permit rules check it instead of (a) and (c).
    pub fn set_permits(&self, key: &str, permits: u32) {
        assert!(permits > 1, "a key with one permit is a mutex");
        self.inner
            .lock()
            .unwrap()
            .permits
            .insert(key.to_string(), permits);
    }

    /// The permit register of a key with more than one permit: it keeps every write
    /// with its fence and the permits its holder takes (`weight`: 1 shared, all of
    /// them exclusive). Whether a write should have been accepted depends on when its
    /// holder's claim and the others' end, so the register accepts it and the checker
    /// decides over the whole history (rule (p), docs/safety.md): a holder whose
    /// writes overlap higher-fenced claims beyond the permits is flagged.
    pub fn write_permit(&self, key: &str, writer: &str, fence: u64, weight: u32) {
        self.write_permit_at(key, writer, fence, weight, self.now());
    }

    /// A write to the permit register at `t`.
    pub fn write_permit_at(&self, key: &str, writer: &str, fence: u64, weight: u32, t: f64) {
        let mut inner = self.inner.lock().unwrap();
        inner.writes.push(RegisterWrite {
            key: key.to_string(),
            writer: writer.to_string(),
            kind: Kind::Engine,
            fence,
            t,
            sent: t,
            accepted: true,
            high_water: 0,
            weight,
        });
        self.line(
            &mut inner,
            json!({"process": writer, "op": "write", "key": key, "invoke": t, "complete": t,
                   "result": "ok", "fence": fence, "permits": weight}),
        );
    }

    #[allow(clippy::too_many_arguments)]
    pub fn acquired(
        &self,
        key: &str,
        who: &str,
        invoke: f64,
        nonce: &str,
        fence: u64,
        version: &str,
    ) {
        let t = self.now();
        let mut inner = self.inner.lock().unwrap();
        inner.evidence.push(Evidence {
            key: key.into(),
            t,
            nonce: nonce.into(),
            fence,
            source: who.into(),
            invoke: Some(invoke),
        });
        self.line(
            &mut inner,
            json!({"process": who, "op": "acquire", "key": key, "invoke": invoke, "complete": t,
                   "result": "ok", "fence": fence, "version": version, "nonce": nonce}),
        );
    }

    /// An operation that failed or whose outcome is unknown.
    pub fn failed(&self, key: &str, who: &str, op: &str, invoke: f64, result: &str, error: &str) {
        let t = self.now();
        let mut inner = self.inner.lock().unwrap();
        self.line(
            &mut inner,
            json!({"process": who, "op": op, "key": key, "invoke": invoke, "complete": t,
                   "result": result, "error": error}),
        );
    }

    /// The latest deadline the guard of `who` logged (history time), or `None` if it
    /// logged none: rule (g) checks `who`'s writes against it.
    pub fn guard_deadline(&self, key: &str, who: &str, deadline: Option<f64>) {
        self.inner
            .lock()
            .unwrap()
            .guard_deadlines
            .push((key.into(), who.into(), deadline));
    }

    /// When the latest register write of a writer whose name starts with `prefix` was
    /// made.
    pub fn last_write_by(&self, prefix: &str) -> Option<f64> {
        let inner = self.inner.lock().unwrap();
        inner
            .writes
            .iter()
            .rev()
            .find(|w| w.writer.starts_with(prefix))
            .map(|w| w.t)
    }

    /// How one guarded round ended, counted for the summary.
    pub fn guard_outcome(&self, outcome: &str) {
        *self
            .inner
            .lock()
            .unwrap()
            .guard_outcomes
            .entry(outcome.into())
            .or_default() += 1;
    }

    pub fn claim(&self, claim: Claim) {
        let mut inner = self.inner.lock().unwrap();
        self.line(
            &mut inner,
            json!({"process": claim.who, "op": "claim", "key": claim.key, "invoke": claim.start,
                   "complete": claim.end, "result": "ok", "fence": claim.fence, "nonce": claim.nonce}),
        );
        inner.claims.push(claim);
    }

    /// An observer read from `invoke` to `complete`: its history line with what it
    /// `found` (only changes go to the JSONL file: polls are frequent), and the evidence
    /// of every holder it saw, `(nonce, fence)`.
    fn observer_read<'a>(
        &self,
        inner: &mut Inner,
        key: &str,
        (invoke, complete): (f64, f64),
        found: Option<Value>,
        seen: impl IntoIterator<Item = (&'a String, u64)>,
    ) {
        if let Some(Value::Object(found)) = found {
            let mut v = json!({"process": "observer", "op": "read", "key": key, "invoke": invoke,
                               "complete": complete, "result": "ok"});
            v.as_object_mut().expect("an object").extend(found);
            self.line(inner, v);
        }
        for (nonce, fence) in seen {
            inner
                .evidence
                .push(Evidence::seen(key, complete, nonce, fence, "observer"));
        }
    }

    pub fn poll(&self, key: &str, invoke: f64, record: Option<(String, u64, String, bool)>) {
        self.poll_at(key, invoke, self.now(), record);
    }

    /// An observer read that ran from `invoke` to `complete`.
    pub fn poll_at(
        &self,
        key: &str,
        invoke: f64,
        complete: f64,
        record: Option<(String, u64, String, bool)>,
    ) {
        let mut inner = self.inner.lock().unwrap();
        if let Some((nonce, fence, version, held)) = &record {
            // Only changes go to the JSONL file (polls are frequent).
            let changed = inner
                .polls
                .iter()
                .rev()
                .find(|p| p.key == key)
                .is_none_or(|p| p.record.as_ref().map(|r| &r.2) != Some(version));
            let found = json!({"fence": fence, "version": version, "nonce": nonce, "held": held});
            let line = changed.then_some(found);
            self.observer_read(&mut inner, key, (invoke, complete), line, [(nonce, *fence)]);
        }
        inner.polls.push(Poll {
            key: key.into(),
            invoke,
            complete,
            record,
        });
    }

    pub fn set_poll(&self, key: &str, invoke: f64, last_fence: u64, entries: Vec<(String, u64)>) {
        self.set_poll_at(key, invoke, self.now(), last_fence, entries);
    }

    /// An observer read of a key with more than one permit that ran from `invoke` to
    /// `complete` and found these holders (nonce, fence), in grant order.
    pub fn set_poll_at(
        &self,
        key: &str,
        invoke: f64,
        complete: f64,
        last_fence: u64,
        entries: Vec<(String, u64)>,
    ) {
        let mut inner = self.inner.lock().unwrap();
        let changed = inner
            .set_polls
            .iter()
            .rev()
            .find(|p| p.key == key)
            .is_none_or(|p| p.entries != entries || p.last_fence != last_fence);
        let line = changed.then(|| json!({"fence": last_fence, "holders": entries}));
        let seen = entries.iter().map(|(nonce, fence)| (nonce, *fence));
        self.observer_read(&mut inner, key, (invoke, complete), line, seen);
        inner.set_polls.push(SetPoll {
            key: key.into(),
            complete,
            last_fence,
            entries,
        });
    }

    /// An observer read of a key whose holder set keeps a queue: its holders and its
    /// waiters as stored.
    pub fn queue_poll(&self, key: &str, holders: Vec<QueuedEntry>, waiters: Vec<QueuedEntry>) {
        let complete = self.now();
        self.inner.lock().unwrap().queue_polls.push(QueuePoll {
            key: key.into(),
            complete,
            holders,
            waiters,
        });
    }

    /// A fault of the schedule was on from `start` to `end`.
    pub fn fault_window(&self, start: f64, end: f64) {
        let mut inner = self.inner.lock().unwrap();
        inner.fault_windows.push(FaultWindow { start, end });
    }

    /// A status seen at `t`.
    #[allow(clippy::too_many_arguments)]
    pub fn status_at(
        &self,
        t: f64,
        lock: &str,
        key: &str,
        acquired: bool,
        fence: u64,
        nonce: &str,
        holder: &str,
        raw: Value,
    ) {
        let mut inner = self.inner.lock().unwrap();
        if acquired {
            inner
                .evidence
                .push(Evidence::seen(key, t, nonce, fence, lock));
        }
        self.line(
            &mut inner,
            json!({"process": lock, "op": "status", "key": key, "invoke": t, "complete": t,
                   "result": "ok", "acquired": acquired, "fence": fence, "nonce": nonce,
                   "holder": holder, "status": raw}),
        );
        inner.status.push(StatusObs {
            t,
            lock: lock.into(),
            key: key.into(),
            acquired,
            fence,
            nonce: nonce.into(),
            holder: holder.into(),
        });
    }

    /// The harness, acting as the Job gated on DistributedLock `lock`, is done with it
    /// and is about to delete it: its claim ends here.
    pub fn let_go(&self, lock: &str) {
        let t = self.now();
        let mut inner = self.inner.lock().unwrap();
        inner.let_go.insert(lock.to_string(), t);
        self.line(
            &mut inner,
            json!({"process": lock, "op": "let-go", "invoke": t, "complete": t, "result": "ok"}),
        );
    }

    pub fn has_let_go(&self, lock: &str) -> bool {
        self.inner.lock().unwrap().let_go.contains_key(lock)
    }

    /// Whether every key had an accepted register write after `t` (someone claimed it).
    pub fn claimed_after(&self, t: f64, keys: &[String]) -> bool {
        let inner = self.inner.lock().unwrap();
        keys.iter().all(|k| {
            inner
                .writes
                .iter()
                .rev()
                .take_while(|w| w.t >= t)
                .any(|w| &w.key == k && w.accepted)
        })
    }

    pub fn violation(&self, what: String) {
        let mut inner = self.inner.lock().unwrap();
        self.line(&mut inner, json!({"op": "violation", "detail": what}));
        inner.violations.push(what);
    }

    /// Appends every line to `out` (JSONL).
    pub fn write_jsonl(&self, out: &mut impl Write) {
        let inner = self.inner.lock().unwrap();
        for l in &inner.lines {
            let _ = writeln!(out, "{l}");
        }
    }

    /// The claims of `DistributedLock`s, from watched statuses and observed records.
    ///
    /// A run of watched `Acquired=True` statuses with nonce N, from `s` (first seen) to
    /// `e` (first seen otherwise), is a claim on `[s, min(e, cap, g)]`, where `g` is when
    /// the harness (the lock's "Job") let go of it before deleting it, and `cap` bounds
    /// the controller's own holder deadline (rule 2) from the backend records the
    /// observer read: for stores whose version changes on every renewal, the latest
    /// version with nonce N was written before the read that first returned it
    /// completed, and the holder claims at most `lease × (1 − δ) − margin` after
    /// sending it; for ZooKeeper, whose renewals are reads, the holder's znode must
    /// still exist, so `cap` is the start of the last read that still returned it.
    fn controller_claims(inner: &Inner, end_of_history: f64) -> Vec<Claim> {
        let margins = lockwarden::lock::SafetyMargins::default();
        let mut by_lock: BTreeMap<&str, Vec<&StatusObs>> = BTreeMap::new();
        for s in &inner.status {
            by_lock.entry(&s.lock).or_default().push(s);
        }
        let mut claims = Vec::new();
        for (lock, obs) in by_lock {
            let mut i = 0;
            while i < obs.len() {
                if !obs[i].acquired {
                    i += 1;
                    continue;
                }
                let first = obs[i];
                let mut j = i + 1;
                while j < obs.len() && obs[j].acquired && obs[j].nonce == first.nonce {
                    j += 1;
                }
                let end = obs.get(j).map_or(end_of_history, |o| o.t);
                let polls = inner.polls.iter().filter(|p| {
                    p.key == first.key
                        && p.record.as_ref().is_some_and(|r| r.0 == first.nonce && r.3)
                });
                let cap = if inner.session_bound {
                    polls.map(|p| p.invoke).fold(f64::NEG_INFINITY, f64::max)
                } else {
                    let lease = inner
                        .controller_lease
                        .get(&first.key)
                        .copied()
                        .unwrap_or(Duration::from_secs(3));
                    let validity = margins.holder_validity(lease).as_secs_f64();
                    let mut first_seen: HashMap<&str, f64> = HashMap::new();
                    for p in polls {
                        let v = p.record.as_ref().unwrap().2.as_str();
                        first_seen.entry(v).or_insert(p.complete);
                    }
                    first_seen
                        .values()
                        .map(|t| t + validity)
                        .fold(f64::NEG_INFINITY, f64::max)
                };
                let let_go = inner.let_go.get(lock).copied().unwrap_or(f64::INFINITY);
                let stop = end.min(cap).min(let_go);
                if stop > first.t {
                    claims.push(Claim {
                        key: first.key.clone(),
                        who: format!("{lock} ({})", first.holder),
                        nonce: first.nonce.clone(),
                        fence: first.fence,
                        start: first.t,
                        end: stop,
                    });
                }
                i = j;
            }
        }
        claims
    }

    /// Runs every checker. `healed_at`: when the last fault ended (liveness is
    /// measured from there); `end`: when the contenders stopped.
    /// Whether refused write `w` was sent before any higher fence had written to its
    /// key: a write in flight when the lock changed hands, which the register refuses
    /// as a fenced store does. Its claim, which ends at its send time, is judged by
    /// rule (c); a write *sent* after a higher fence wrote is a violation of rule (a).
    fn in_flight_when_overtaken(writes: &[RegisterWrite], w: &RegisterWrite) -> bool {
        let overtaken_at = writes
            .iter()
            .filter(|o| o.key == w.key && o.accepted && o.fence > w.fence)
            .map(|o| o.t)
            .min_by(f64::total_cmp);
        overtaken_at.is_some_and(|at| w.sent < at)
    }

    pub fn check(&self, healed_at: f64, end: f64, keys: &[String], liveness_bound: f64) -> Report {
        let mut inner = self.inner.lock().unwrap();
        let seed = self.seed;
        let mut report = Report {
            polls: inner.polls.len() + inner.set_polls.len(),
            s3_fenced: self.mirror.get().map(S3Mirror::counts).unwrap_or_default(),
            ..Default::default()
        };
        let mut violations = std::mem::take(&mut inner.violations);

        // (a) The register accepted no stale fence, and no claiming engine or CLI
        // holder was ever refused (a refusal means someone with a higher fence wrote
        // while it still claimed the lock).
        // (Keys with more than one permit: rule (p) below.)
        let mut hw: HashMap<&str, u64> = HashMap::new();
        for w in &inner.writes {
            if inner.permits.contains_key(&w.key) {
                report.writes_accepted += 1;
                continue;
            }
            let h = hw.entry(&w.key).or_insert(0);
            if w.accepted {
                if w.fence < *h {
                    violations.push(format!(
                        "seed {seed}: (a) {} accepted a stale write on {}: fence {} after {}",
                        w.writer, w.key, w.fence, h
                    ));
                }
                *h = (*h).max(w.fence);
                report.writes_accepted += 1;
            } else if matches!(w.kind, Kind::Engine | Kind::Cli)
                && !Self::in_flight_when_overtaken(&inner.writes, w)
            {
                violations.push(format!(
                    "seed {seed}: (a) {} wrote to {} with fence {} at {:.3}s while claiming the lock, \
                     but fence {} had already written",
                    w.writer, w.key, w.fence, w.t, w.high_water
                ));
            } else if matches!(w.kind, Kind::Engine | Kind::Cli) {
                report.writes_refused_in_flight += 1;
            } else {
                report.writes_rejected_stale_status += 1;
            }
        }

        // (b) Fences strictly increase per key, in the order acquisitions were first
        // seen; one nonce, one fence.
        let mut by_key: BTreeMap<&str, HashMap<&str, (f64, u64, &str)>> = BTreeMap::new();
        for e in &inner.evidence {
            let m = by_key.entry(&e.key).or_default();
            match m.get_mut(e.nonce.as_str()) {
                Some(seen) => {
                    if seen.1 != e.fence {
                        violations.push(format!(
                            "seed {seed}: (b) nonce {} on {} has fence {} ({}) and {} ({})",
                            e.nonce, e.key, seen.1, seen.2, e.fence, e.source
                        ));
                    }
                    if e.t < seen.0 {
                        seen.0 = e.t;
                    }
                }
                None => {
                    m.insert(&e.nonce, (e.t, e.fence, &e.source));
                }
            }
        }
        for (key, m) in &by_key {
            let mut acq: Vec<_> = m.iter().collect();
            acq.sort_by(|a, b| a.1.0.total_cmp(&b.1.0));
            report.acquisitions += acq.len();
            // Grants on a key with more than one permit may be first seen in another
            // order than their fences: rule (b) for them is `permit_fence_order`.
            if inner.permits.contains_key(*key) {
                continue;
            }
            for pair in acq.windows(2) {
                let (n1, (t1, f1, s1)) = pair[0];
                let (n2, (t2, f2, s2)) = pair[1];
                if f2 <= f1 {
                    violations.push(format!(
                        "seed {seed}: (b) fence did not increase on {key}: {f1} (nonce {n1}, {s1}, \
                         {t1:.3}s) then {f2} (nonce {n2}, {s2}, {t2:.3}s)"
                    ));
                }
            }
        }

        // (c) No two claims on one key overlap.
        let mut claims = inner.claims.clone();
        claims.extend(Self::controller_claims(&inner, end));
        report.claims = claims.len();
        report.cli_claims = inner
            .claims
            .iter()
            .filter(|c| c.who.starts_with("cli-"))
            .count();
        for (i, a) in claims.iter().enumerate() {
            for b in &claims[i + 1..] {
                if a.key != b.key || a.nonce == b.nonce || inner.permits.contains_key(&a.key) {
                    continue;
                }
                let overlap = a.end.min(b.end) - a.start.max(b.start);
                if overlap > 0.0 {
                    violations.push(format!(
                        "seed {seed}: (c) overlapping claims on {} for {:.0} ms: {} (fence {}) \
                         [{:.3}s, {:.3}s] and {} (fence {}) [{:.3}s, {:.3}s]",
                        a.key,
                        overlap * 1000.0,
                        a.who,
                        a.fence,
                        a.start,
                        a.end,
                        b.who,
                        b.fence,
                        b.start,
                        b.end
                    ));
                }
            }
        }

        // (g) No guarded write is sent after its guard's deadline (rule 9): the guard
        // stops its command's whole tree a kill margin before it. A command's line
        // carries its send time, which its arrival can only follow.
        report.guarded_claims = inner
            .claims
            .iter()
            .filter(|c| {
                inner
                    .guard_deadlines
                    .iter()
                    .any(|(_, who, _)| *who == c.who)
            })
            .count();
        report.guard_outcomes = inner.guard_outcomes.clone();
        for (key, who, deadline) in &inner.guard_deadlines {
            let writes: Vec<f64> = inner
                .writes
                .iter()
                .filter(|w| &w.writer == who && &w.key == key)
                .map(|w| w.sent)
                .collect();
            let Some(&last) = writes.iter().max_by(|a, b| a.total_cmp(b)) else {
                continue;
            };
            match deadline {
                None => violations.push(format!(
                    "seed {seed}: (g) the command guarded as {who} wrote to {key} (last at \
                     {last:.3}s) but its guard logged no deadline"
                )),
                Some(d) => {
                    let late = writes.iter().filter(|t| **t > *d).count();
                    if late > 0 {
                        violations.push(format!(
                            "seed {seed}: (g) the command guarded as {who} wrote to {key} {late} \
                             time(s) after its guard's deadline {d:.3}s, the last {:.0} ms after it",
                            (last - d) * 1000.0
                        ));
                    }
                }
            }
        }

        // Keys with more than one permit: (b) fence order, (p) permits, (r) rule 2.
        Self::permit_fence_order(&inner, seed, &mut violations);
        Self::permit_claims(&inner, seed, &mut report, &mut violations);
        Self::writes_after_the_permit_was_gone(&inner, seed, &mut violations);
        // Keys with a queue: (o) grant order, (q) rule 1 per entry while waiters wait.
        report.queue_grants_checked = Self::queue_order(&inner, seed, &mut violations);
        report.queue_longest_unchanged = Self::dead_entries_leave(&inner, seed, &mut violations);

        // (d) Liveness: after healing, some contender claims each lock.
        for key in keys {
            let first = claims
                .iter()
                .filter(|c| &c.key == key && c.end > healed_at)
                .map(|c| c.start.max(healed_at))
                .fold(f64::INFINITY, f64::min);
            if first.is_finite() && first - healed_at <= liveness_bound {
                report.liveness.push(first - healed_at);
            } else {
                violations.push(format!(
                    "seed {seed}: (d) nobody claimed {key} within {liveness_bound:.1}s after the \
                     faults healed at {healed_at:.3}s"
                ));
            }
        }
        report.operations = inner.lines.len() + inner.polls.len() + inner.set_polls.len();
        for v in &violations {
            let line = json!({"op": "violation", "detail": v, "schedule": seed});
            inner.lines.push(line);
        }
        report.violations = violations;
        report
    }

    /// (b) on a key with more than one permit. Grants may be first seen in another
    /// order than their fences (two grants within one observer period, a grant whose
    /// reply was lost), so the order is checked where it is certain:
    /// - one nonce, one fence (above), and one fence, one nonce;
    /// - in one observer read the holders, in grant order, have increasing fences, none
    ///   above the key's last fence; the last fence never goes down from one read to
    ///   the next;
    /// - a holder that appears in a read and not in the read before was granted after
    ///   that earlier read: its fence is above that read's last fence;
    /// - an acquisition first seen (by anyone) before an engine contender began asking
    ///   for the permit it got has the lower fence.
    fn permit_fence_order(inner: &Inner, seed: u64, violations: &mut Vec<String>) {
        for key in inner.permits.keys() {
            let evidence: Vec<&Evidence> =
                inner.evidence.iter().filter(|e| &e.key == key).collect();
            let mut nonce_of: BTreeMap<u64, &str> = BTreeMap::new();
            let mut twice: Vec<(u64, &str)> = Vec::new();
            let mut first_seen: HashMap<&str, (f64, u64)> = HashMap::new();
            for e in &evidence {
                let other = *nonce_of.entry(e.fence).or_insert(&e.nonce);
                if other != e.nonce && !twice.contains(&(e.fence, e.nonce.as_str())) {
                    twice.push((e.fence, &e.nonce));
                    violations.push(format!(
                        "seed {seed}: (b) fence {} on {key} granted twice: nonces {other} and {} ({})",
                        e.fence, e.nonce, e.source
                    ));
                }
                let seen = first_seen.entry(&e.nonce).or_insert((e.t, e.fence));
                seen.0 = seen.0.min(e.t);
            }
            let polls: Vec<&SetPoll> = inner.set_polls.iter().filter(|p| &p.key == key).collect();
            for p in &polls {
                let ordered = p.entries.windows(2).all(|w| w[0].1 < w[1].1);
                if !ordered || p.entries.iter().any(|e| e.1 > p.last_fence) {
                    violations.push(format!(
                        "seed {seed}: (b) a read of {key} at {:.3}s found holders {:?} out of \
                         fence order or above the last fence {}",
                        p.complete, p.entries, p.last_fence
                    ));
                }
            }
            for pair in polls.windows(2) {
                let (before, after) = (pair[0], pair[1]);
                if after.last_fence < before.last_fence {
                    violations.push(format!(
                        "seed {seed}: (b) the last fence of {key} went down from {} ({:.3}s) to {} ({:.3}s)",
                        before.last_fence, before.complete, after.last_fence, after.complete
                    ));
                }
                for (nonce, fence) in &after.entries {
                    let new = !before.entries.iter().any(|(n, _)| n == nonce);
                    if new && *fence <= before.last_fence {
                        violations.push(format!(
                            "seed {seed}: (b) holder {nonce} of {key} with fence {fence} appeared \
                             at {:.3}s, after a read ({:.3}s) whose last fence was already {}",
                            after.complete, before.complete, before.last_fence
                        ));
                    }
                }
            }
            let mut seen: Vec<(f64, u64, &str)> =
                first_seen.iter().map(|(n, (t, f))| (*t, *f, *n)).collect();
            seen.sort_by(|a, b| a.0.total_cmp(&b.0));
            for asked in evidence.iter().filter(|e| e.invoke.is_some()) {
                let invoke = asked.invoke.unwrap_or_default();
                if let Some((t, f, n)) = seen
                    .iter()
                    .take_while(|(t, ..)| *t < invoke)
                    .filter(|(_, _, n)| *n != asked.nonce)
                    .max_by_key(|(_, f, _)| *f)
                    && *f >= asked.fence
                {
                    violations.push(format!(
                        "seed {seed}: (b) {} began asking for a permit of {key} at {invoke:.3}s \
                         and got fence {}, but nonce {n} with fence {f} was seen at {t:.3}s",
                        asked.source, asked.fence
                    ));
                }
            }
        }
    }

    /// (p) On a key with N permits, a holder's claim runs from its first write to its
    /// last; at no moment do claims take more than N permits (an exclusive holder takes
    /// all N). Where they do, the holders with the lowest fences beyond the N are the
    /// ones whose permits were reclaimed by the later grants: their writes from the
    /// moment of the excess on are the ones a fenced resource would refuse, reported
    /// with them. Also collects the most permits in flight per key.
    fn permit_claims(inner: &Inner, seed: u64, report: &mut Report, violations: &mut Vec<String>) {
        for (key, &permits) in &inner.permits {
            // fence -> (writer, weight, first, last)
            let mut claims: BTreeMap<u64, (&str, u32, f64, f64)> = BTreeMap::new();
            for w in inner.writes.iter().filter(|w| &w.key == key) {
                let c = claims
                    .entry(w.fence)
                    .or_insert((&w.writer, w.weight, w.t, w.t));
                c.2 = c.2.min(w.t);
                c.3 = c.3.max(w.t);
            }
            report.exclusive_claims += claims.values().filter(|c| c.1 >= permits).count();
            // Starts before ends at one instant: a claim is closed at both ends.
            let mut events: Vec<(f64, bool, u64)> = Vec::new();
            for (fence, c) in &claims {
                events.push((c.2, false, *fence));
                events.push((c.3, true, *fence));
            }
            events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let mut live: Vec<u64> = Vec::new();
            let mut most = 0;
            let mut reported: Vec<u64> = Vec::new();
            for (t, end, fence) in events {
                if end {
                    live.retain(|f| *f != fence);
                    continue;
                }
                live.push(fence);
                let in_use: u32 = live.iter().map(|f| claims[f].1).sum();
                most = most.max(in_use);
                if in_use <= permits {
                    continue;
                }
                let reclaimed = Self::reclaimed(inner, key, permits, fence, &live, &claims);
                for f in reclaimed {
                    if reported.contains(&f) {
                        continue;
                    }
                    reported.push(f);
                    let (writer, weight, first, last) = claims[&f];
                    let late = inner
                        .writes
                        .iter()
                        .filter(|w| &w.key == key && w.fence == f && w.t >= t)
                        .count();
                    let holders: Vec<String> = live
                        .iter()
                        .map(|f| {
                            format!(
                                "{} (fence {f}, {} permits, [{:.3}s, {:.3}s])",
                                claims[f].0, claims[f].1, claims[f].2, claims[f].3
                            )
                        })
                        .collect();
                    violations.push(format!(
                        "seed {seed}: (p) {in_use} permits in flight on {key} (permits {permits}) at \
                         {t:.3}s: {}; {writer} (fence {f}, {weight} permits, [{first:.3}s, \
                         {last:.3}s]) kept writing after higher fences took its permit: {late} \
                         writes from {t:.3}s on would be refused",
                        holders.join(", ")
                    ));
                }
            }
            report.permits_in_flight.push((most, permits));
        }
    }

    /// Whose permits the grant of `newcomer` took, among the `live` claims: those
    /// missing from the first observer read that shows the newcomer; where that does
    /// not account for the excess (no such read), the lowest fences beyond the permits.
    fn reclaimed(
        inner: &Inner,
        key: &str,
        permits: u32,
        newcomer: u64,
        live: &[u64],
        claims: &BTreeMap<u64, (&str, u32, f64, f64)>,
    ) -> Vec<u64> {
        let shown = inner
            .set_polls
            .iter()
            .find(|p| p.key == key && p.entries.iter().any(|(_, f)| *f == newcomer));
        let mut reclaimed: Vec<u64> = live
            .iter()
            .copied()
            .filter(|f| shown.is_some_and(|p| !p.entries.iter().any(|(_, e)| e == f)))
            .collect();
        let mut rest: Vec<u64> = live
            .iter()
            .copied()
            .filter(|f| !reclaimed.contains(f))
            .collect();
        rest.sort_unstable();
        let weight = |fs: &[u64]| fs.iter().map(|f| claims[f].1).sum::<u32>();
        while weight(&rest) > permits && !rest.is_empty() {
            reclaimed.push(rest.remove(0));
        }
        reclaimed
    }

    /// (r) Rule 2 per permit: a holder writes only while its lease is valid, and a
    /// valid lease's entry is still in the store (it is reclaimed only after its
    /// observed expiry, and released only after its holder stopped writing). So no
    /// write may come after an observer read that completed without the holder's entry,
    /// once an earlier read had shown it (an entry never comes back).
    fn writes_after_the_permit_was_gone(inner: &Inner, seed: u64, violations: &mut Vec<String>) {
        for key in inner.permits.keys() {
            let nonce_of: HashMap<u64, &str> = inner
                .evidence
                .iter()
                .filter(|e| &e.key == key)
                .map(|e| (e.fence, e.nonce.as_str()))
                .collect();
            let mut gone_at: HashMap<&str, f64> = HashMap::new();
            let mut before: Option<&SetPoll> = None;
            for p in inner.set_polls.iter().filter(|p| &p.key == key) {
                for (nonce, _) in before.iter().flat_map(|b| b.entries.iter()) {
                    if !p.entries.iter().any(|(n, _)| n == nonce) {
                        gone_at.entry(nonce).or_insert(p.complete);
                    }
                }
                before = Some(p);
            }
            let mut reported: Vec<u64> = Vec::new();
            for w in inner.writes.iter().filter(|w| &w.key == key) {
                let Some(gone) = nonce_of.get(&w.fence).and_then(|n| gone_at.get(n)) else {
                    continue;
                };
                if w.t > *gone && !reported.contains(&w.fence) {
                    reported.push(w.fence);
                    let late = inner
                        .writes
                        .iter()
                        .filter(|x| &x.key == key && x.fence == w.fence && x.t > *gone)
                        .count();
                    violations.push(format!(
                        "seed {seed}: (r) {} wrote to {key} with fence {} at {:.3}s, after a read \
                         completed at {gone:.3}s without its permit ({late} writes after that)",
                        w.writer, w.fence, w.t
                    ));
                }
            }
        }
    }

    /// (o) Grant order (docs/design.md §6.4, Q2): only the head of the queue is granted.
    /// Between two observer reads of a queued key, a holder that appears (a grant; each
    /// grant is a new entry) must not rank behind a waiter that both reads show. That
    /// waiter was in the store all along (a dropped entry never comes back: its nonce is
    /// never written again), so it was in the set the grant was decided on, live (else
    /// the grant's write would have dropped it), and ahead. Returns how many grants were
    /// checked against at least one such waiter.
    fn queue_order(inner: &Inner, seed: u64, violations: &mut Vec<String>) -> usize {
        let mut checked = 0;
        let mut before: HashMap<&str, &QueuePoll> = HashMap::new();
        for p in &inner.queue_polls {
            if let Some(b) = before.insert(&p.key, p) {
                let granted = p
                    .holders
                    .iter()
                    .filter(|h| h.ticket > 0 && !b.holders.iter().any(|x| x.nonce == h.nonce));
                for h in granted {
                    let waited: Vec<&QueuedEntry> = b
                        .waiters
                        .iter()
                        .filter(|w| p.waiters.iter().any(|x| x.nonce == w.nonce))
                        .collect();
                    if !waited.is_empty() {
                        checked += 1;
                    }
                    if let Some(w) = waited.iter().find(|w| w.goes_before(h)) {
                        violations.push(format!(
                            "seed {seed}: (o) {} (priority {}, ticket {}) was granted on {} \
                             between reads at {:.3}s and {:.3}s while {} (priority {}, ticket {}) \
                             waited ahead of it in both",
                            h.holder,
                            h.priority,
                            h.ticket,
                            p.key,
                            b.complete,
                            p.complete,
                            w.holder,
                            w.priority,
                            w.ticket
                        ));
                    }
                }
            }
        }
        checked
    }

    /// (q) Rule 1 per entry with waiters (docs/design.md §6.4, Q4): an entry that stops
    /// changing is dropped by the waiters once they have seen it unchanged for its lease
    /// plus the grace — however often other entries change. Every contender looks at
    /// least once a second (a waiter's refresh is due every third of its 3 s waiter
    /// lease; between attempts it pauses at most 0.6 s) and drops what it has seen
    /// expire in its next write. So, counted from the end of the last fault, an entry
    /// seen unchanged for longer than `takeover + Q_SLACK` while every read showed
    /// another waiter is an entry the waiters failed to drop. Returns the longest such
    /// time seen.
    fn dead_entries_leave(inner: &Inner, seed: u64, violations: &mut Vec<String>) -> f64 {
        /// One look to start observing, one to drop, request times and a loaded
        /// machine's scheduling: generous.
        const Q_SLACK: f64 = 4.0;
        let margins = lockwarden::lock::SafetyMargins::default();
        let quiet_since = |t: f64| {
            inner
                .fault_windows
                .iter()
                .filter(|f| f.start <= t)
                .map(|f| f.end)
                .fold(f64::NEG_INFINITY, f64::max)
        };
        let mut longest: f64 = 0.0;
        let keys: std::collections::BTreeSet<&str> =
            inner.queue_polls.iter().map(|p| p.key.as_str()).collect();
        for key in keys {
            let polls: Vec<&QueuePoll> =
                inner.queue_polls.iter().filter(|p| p.key == key).collect();
            // nonce -> (revision, since when it has been seen unchanged with waiters)
            let mut unchanged: HashMap<&str, (&str, f64)> = HashMap::new();
            let mut reported: Vec<&str> = Vec::new();
            for p in &polls {
                if p.waiters.is_empty() {
                    // Nobody waits: nobody needs the entry gone. Start again.
                    unchanged.clear();
                    continue;
                }
                let mut now: HashMap<&str, (&str, f64)> = HashMap::new();
                for e in p.entries() {
                    if !p.waiters.iter().any(|w| w.nonce != e.nonce) {
                        // Only itself waits: nobody else needs it gone.
                        continue;
                    }
                    let since = match unchanged.get(e.nonce.as_str()) {
                        Some((rev, since)) if *rev == e.revision => *since,
                        _ => p.complete,
                    };
                    now.insert(&e.nonce, (&e.revision, since));
                    let counted = p.complete - since.max(quiet_since(p.complete));
                    longest = longest.max(counted);
                    let bound = margins.takeover_after(e.lease).as_secs_f64() + Q_SLACK;
                    if counted > bound && !reported.contains(&e.nonce.as_str()) {
                        reported.push(&e.nonce);
                        violations.push(format!(
                            "seed {seed}: (q) {}'s entry on {key} was seen unchanged for {:.1}s \
                             (from {since:.3}s to {:.3}s, outside faults) while waiters waited: \
                             more than its lease {:.1}s plus grace and slack ({bound:.1}s)",
                            e.holder,
                            counted,
                            p.complete,
                            e.lease.as_secs_f64()
                        ));
                    }
                }
                unchanged = now;
            }
        }
        longest
    }
}

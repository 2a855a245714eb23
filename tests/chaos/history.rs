//! The recorded history of one schedule, the fenced register the contenders write to,
//! and the checkers (docs/safety.md, "Fault-injection harness", defines each rule).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

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
    t: f64,
    accepted: bool,
    high_water: u64,
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
}

/// The history of one schedule. Times are seconds since the schedule began.
pub struct History {
    pub seed: u64,
    base: Instant,
    inner: Mutex<Inner>,
}

/// What a check found, and numbers for the summary.
#[derive(Default, Debug)]
pub struct Report {
    pub violations: Vec<String>,
    pub writes_accepted: usize,
    pub writes_rejected_stale_status: usize,
    pub acquisitions: usize,
    pub claims: usize,
    /// Claims of command-line holders (`run`'s commands, scripts around `lock`).
    pub cli_claims: usize,
    pub polls: usize,
    pub operations: usize,
    /// Per key: seconds from healing until some contender claimed the lock.
    pub liveness: Vec<f64>,
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
        }
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

    /// The fenced register: accepts a write iff its fence is at least the highest
    /// fence it has accepted for `key`.
    pub fn write(&self, key: &str, writer: &str, kind: Kind, fence: u64) -> bool {
        let t = self.now();
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
            accepted,
            high_water: hw,
        });
        self.line(
            &mut inner,
            json!({"process": writer, "op": "write", "key": key, "invoke": t, "complete": t,
                   "result": if accepted {"ok"} else {"fail"}, "fence": fence, "highWater": hw}),
        );
        accepted
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

    pub fn claim(&self, claim: Claim) {
        let mut inner = self.inner.lock().unwrap();
        self.line(
            &mut inner,
            json!({"process": claim.who, "op": "claim", "key": claim.key, "invoke": claim.start,
                   "complete": claim.end, "result": "ok", "fence": claim.fence, "nonce": claim.nonce}),
        );
        inner.claims.push(claim);
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
            if changed {
                self.line(
                    &mut inner,
                    json!({"process": "observer", "op": "read", "key": key, "invoke": invoke,
                           "complete": complete, "result": "ok", "fence": fence, "version": version,
                           "nonce": nonce, "held": held}),
                );
            }
            inner.evidence.push(Evidence {
                key: key.into(),
                t: complete,
                nonce: nonce.clone(),
                fence: *fence,
                source: "observer".into(),
            });
        }
        inner.polls.push(Poll {
            key: key.into(),
            invoke,
            complete,
            record,
        });
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
            inner.evidence.push(Evidence {
                key: key.into(),
                t,
                nonce: nonce.into(),
                fence,
                source: lock.into(),
            });
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
    pub fn check(&self, healed_at: f64, end: f64, keys: &[String], liveness_bound: f64) -> Report {
        let mut inner = self.inner.lock().unwrap();
        let seed = self.seed;
        let mut report = Report {
            polls: inner.polls.len(),
            ..Default::default()
        };
        let mut violations = std::mem::take(&mut inner.violations);

        // (a) The register accepted no stale fence, and no claiming engine or CLI
        // holder was ever refused (a refusal means someone with a higher fence wrote
        // while it still claimed the lock).
        let mut hw: HashMap<&str, u64> = HashMap::new();
        for w in &inner.writes {
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
            } else if matches!(w.kind, Kind::Engine | Kind::Cli) {
                violations.push(format!(
                    "seed {seed}: (a) {} wrote to {} with fence {} at {:.3}s while claiming the lock, \
                     but fence {} had already written",
                    w.writer, w.key, w.fence, w.t, w.high_water
                ));
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
                if a.key != b.key || a.nonce == b.nonce {
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
        report.operations = inner.lines.len() + inner.polls.len();
        for v in &violations {
            let line = json!({"op": "violation", "detail": v, "schedule": seed});
            inner.lines.push(line);
        }
        report.violations = violations;
        report
    }
}

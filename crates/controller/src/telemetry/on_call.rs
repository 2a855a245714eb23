//! The on-call metrics of each (namespace, backend) pair, and what the controller
//! tells them: status writes (waits, expiring leases, queue positions), acquisitions,
//! ends of holds and losses. The live gauges are computed from what is tracked per lock
//! at each scrape.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use super::Telemetry;
use super::families::{LockLabels, LossLabels, LossReason};
use lockwarden_api::LockPhase;

/// What a status write said about a lock, for the on-call metrics.
#[derive(Clone, Copy, Debug)]
pub struct LockView<'a> {
    pub namespace: &'a str,
    pub backend: &'a str,
    pub phase: Option<LockPhase>,
    /// `status.waitingSince` while waiting.
    pub waiting_since: Option<SystemTime>,
    /// Held, but renewals failing past the holder deadline (`LeaseExpiring`).
    pub expiring: bool,
    /// The position in the key's queue the store reported (a ZooKeeper key, or a key
    /// with `spec.queue` on the other stores).
    pub queue_position: Option<u32>,
}

/// What the metrics keep about one lock (by uid) between status writes.
#[derive(Debug)]
pub(super) struct Tracked {
    labels: LockLabels,
    waiting_since: Option<SystemTime>,
    expiring_since: Option<SystemTime>,
    queue_position: Option<u32>,
    /// Written `Waiting` since its last acquisition: the next one is a hand-off.
    waited: bool,
}

impl Telemetry {
    /// Creates every series of the pair at zero, once (see the module doc).
    fn ensure_pair(&self, labels: &LockLabels) {
        let mut pairs = self.pairs.lock().expect("pairs");
        if pairs.contains(labels) {
            return;
        }
        let on_call = &self.on_call;
        on_call.wait.get_or_create_owned(labels);
        on_call.hold.get_or_create_owned(labels);
        on_call.oldest_wait.get_or_create_owned(labels);
        on_call.expiring.get_or_create_owned(labels);
        on_call.handoffs.get_or_create(labels).inc_by(0);
        on_call.takeovers.get_or_create(labels).inc_by(0);
        for reason in LossReason::ALL {
            on_call
                .losses
                .get_or_create(&LossLabels::of(labels, reason))
                .inc_by(0);
        }
        pairs.insert(labels.clone());
    }

    /// The labels of a lock in `namespace` on `backend`, its pair's series created.
    fn pair(&self, namespace: &str, backend: &str) -> LockLabels {
        let labels = LockLabels::of(namespace, backend);
        self.ensure_pair(&labels);
        labels
    }

    /// Records what a status write said about the object `uid`: its phase (as
    /// [`set_phase`](Self::set_phase)) and, for the live gauges, when its wait began,
    /// since when it has been expiring, its queue position.
    pub fn observe_status(&self, uid: &str, view: LockView<'_>) {
        self.set_phase(uid, view.phase);
        let labels = self.pair(view.namespace, view.backend);
        let mut tracked = self.tracked.lock().expect("tracked");
        let entry = tracked.entry(uid.to_string()).or_insert_with(|| Tracked {
            labels: labels.clone(),
            waiting_since: None,
            expiring_since: None,
            queue_position: None,
            waited: false,
        });
        entry.labels = labels;
        let waiting = view.phase == Some(LockPhase::Waiting);
        entry.waiting_since = if waiting {
            view.waiting_since
                .or(entry.waiting_since)
                .or_else(|| Some(SystemTime::now()))
        } else {
            None
        };
        entry.queue_position = view.queue_position.filter(|_| waiting);
        if entry.queue_position.is_some() {
            // The first position reported in a pair creates its queue-length series
            // (only queued keys report one).
            let mut queued = self.queued.lock().expect("queued");
            if !queued.contains(&entry.labels) {
                self.on_call.queue_length.get_or_create_owned(&entry.labels);
                queued.insert(entry.labels.clone());
            }
        }
        entry.waited = match view.phase {
            Some(LockPhase::Waiting) => true,
            // A wait that ended without acquiring is not followed by a hand-off.
            Some(LockPhase::Released | LockPhase::Lost | LockPhase::Failed) => false,
            _ => entry.waited,
        };
        entry.expiring_since = if view.expiring {
            entry.expiring_since.or_else(|| Some(SystemTime::now()))
        } else {
            None
        };
    }

    /// Forgets the object `uid` (deleted): its phase and its part in the live gauges.
    pub fn forget(&self, uid: &str) {
        self.set_phase(uid, None);
        self.tracked.lock().expect("tracked").remove(uid);
    }

    /// Whether the object `uid` was last written as `LeaseExpiring`.
    pub fn was_expiring(&self, uid: &str) -> bool {
        let tracked = self.tracked.lock().expect("tracked");
        tracked.get(uid).is_some_and(|t| t.expiring_since.is_some())
    }

    /// An acquisition of the object `uid` after waiting `waited`: the wait histogram,
    /// and a hand-off (it had been `Waiting`) or a takeover (`forced`).
    pub fn count_acquired(
        &self,
        uid: &str,
        namespace: &str,
        backend: &str,
        waited: Duration,
        forced: bool,
    ) {
        let labels = self.pair(namespace, backend);
        self.on_call
            .wait
            .get_or_create(&labels)
            .observe(waited.as_secs_f64());
        let had_waited = {
            let mut tracked = self.tracked.lock().expect("tracked");
            tracked
                .get_mut(uid)
                .map(|t| std::mem::replace(&mut t.waited, false))
                .unwrap_or(false)
        };
        if forced {
            self.on_call.takeovers.get_or_create(&labels).inc();
        } else if had_waited {
            self.on_call.handoffs.get_or_create(&labels).inc();
        }
    }

    /// The end of a hold that began at `acquired_at` (wall clock: a resumed lock keeps
    /// the time of its acquisition).
    pub fn observe_hold(&self, namespace: &str, backend: &str, acquired_at: SystemTime) {
        let labels = self.pair(namespace, backend);
        let held = SystemTime::now()
            .duration_since(acquired_at)
            .unwrap_or_default();
        self.on_call
            .hold
            .get_or_create(&labels)
            .observe(held.as_secs_f64());
    }

    /// A held lock lost for `reason`.
    pub fn count_loss(&self, namespace: &str, backend: &str, reason: LossReason) {
        let labels = self.pair(namespace, backend);
        self.on_call
            .losses
            .get_or_create(&LossLabels::of(&labels, reason))
            .inc();
    }

    /// Sets the live gauges from what is tracked now, for every known pair (0 where
    /// nothing waits or expires): called at each scrape, so their values are as of it.
    pub(super) fn refresh_live_gauges(&self) {
        let now = SystemTime::now();
        let age = |since: SystemTime| now.duration_since(since).unwrap_or_default().as_secs_f64();
        let mut oldest: HashMap<LockLabels, f64> = HashMap::new();
        let mut expiring: HashMap<LockLabels, f64> = HashMap::new();
        let mut queue: HashMap<LockLabels, u32> = HashMap::new();
        for t in self.tracked.lock().expect("tracked").values() {
            if let Some(since) = t.waiting_since {
                let o = oldest.entry(t.labels.clone()).or_default();
                *o = o.max(age(since));
            }
            if let Some(since) = t.expiring_since {
                let e = expiring.entry(t.labels.clone()).or_default();
                *e = e.max(age(since));
            }
            if let Some(position) = t.queue_position {
                // Position 0 is the next in line: a queue of at least position + 1.
                let q = queue.entry(t.labels.clone()).or_default();
                *q = (*q).max(position.saturating_add(1));
            }
        }
        for labels in self.pairs.lock().expect("pairs").iter() {
            let get = |m: &HashMap<LockLabels, f64>| m.get(labels).copied().unwrap_or(0.0);
            self.on_call
                .oldest_wait
                .get_or_create(labels)
                .set(get(&oldest));
            self.on_call
                .expiring
                .get_or_create(labels)
                .set(get(&expiring));
        }
        for labels in self.queued.lock().expect("queued").iter() {
            let position = queue.get(labels).copied().unwrap_or(0);
            self.on_call
                .queue_length
                .get_or_create(labels)
                .set(i64::from(position));
        }
    }
}

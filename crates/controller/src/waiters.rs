//! The locks this controller is waiting to acquire, indexed by object and by key.
//!
//! A waiter keeps its backend across attempts (so that the rule-1 observation of the
//! holder's lease survives from one attempt to the next), when it started waiting
//! (for `acquireTimeout` and the acquire-duration metric), its poll interval, and — on
//! a store that can watch (ZooKeeper) — the task waiting on that watch. The index by
//! key lets a release here wake every lock waiting on the same key at once instead of
//! at its next poll.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use kube::runtime::reflector::ObjectRef;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use lockwarden_api::DistributedLock;

/// Bounds of the waiting poll (cross-cluster holders are only seen by polling).
pub const POLL_MIN: Duration = Duration::from_millis(100);
pub const POLL_MAX: Duration = Duration::from_secs(2);

/// The shortest time between two status writes of one waiter that only move its place
/// in the key's queue (docs/design.md §6.4).
pub const PLACE_INTERVAL: Duration = Duration::from_secs(5);

/// When a wait began: by this process's clock, plus how long it had already lasted
/// before this process took it over (a restart: the start is kept in status).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitStart {
    at: Instant,
    before: Duration,
    /// The wall-clock start, for status.
    pub wall: SystemTime,
}

impl WaitStart {
    pub fn now() -> WaitStart {
        WaitStart {
            at: Instant::now(),
            before: Duration::ZERO,
            wall: SystemTime::now(),
        }
    }

    /// A wait that began at `wall` (read back from status after a restart). A start in
    /// the future (clock skew between controllers) counts from now.
    pub fn resumed(wall: SystemTime) -> WaitStart {
        WaitStart {
            at: Instant::now(),
            before: SystemTime::now().duration_since(wall).unwrap_or_default(),
            wall,
        }
    }

    /// How long the lock has been waiting.
    pub fn elapsed(&self) -> Duration {
        self.before + self.at.elapsed()
    }
}

type Obj = ObjectRef<DistributedLock>;

/// One waiting lock. `B` is what it keeps between attempts (its backend).
struct Waiter<B> {
    uid: String,
    key: String,
    backend: B,
    since: WaitStart,
    poll: Duration,
    /// The task waiting on the store's watch, if one is running.
    watch: Option<AbortHandle>,
    /// When a status write last showed its place in the key's queue.
    place_shown: Option<std::time::Instant>,
}

struct Index<B> {
    waiters: HashMap<Obj, Waiter<B>>,
    /// key → locks waiting on it.
    by_key: HashMap<String, HashSet<Obj>>,
}

impl<B> Default for Index<B> {
    fn default() -> Self {
        Index {
            waiters: HashMap::new(),
            by_key: HashMap::new(),
        }
    }
}

impl<B> Index<B> {
    fn remove(&mut self, obj: &Obj) -> Option<Waiter<B>> {
        let waiter = self.waiters.remove(obj)?;
        if let Some(watch) = &waiter.watch {
            watch.abort();
        }
        if let Some(set) = self.by_key.get_mut(&waiter.key) {
            set.remove(obj);
            if set.is_empty() {
                self.by_key.remove(&waiter.key);
            }
        }
        Some(waiter)
    }
}

/// Every lock waiting for its key, by object and by key.
pub struct WaiterIndex<B> {
    index: Mutex<Index<B>>,
}

impl<B> Default for WaiterIndex<B> {
    fn default() -> Self {
        WaiterIndex {
            index: Mutex::default(),
        }
    }
}

impl<B: Clone> WaiterIndex<B> {
    /// The backend and start of `obj`'s wait, if it is waiting as this `uid` on this
    /// `key` (a recreated object or a changed key starts a new wait).
    pub fn current(&self, obj: &Obj, uid: &str, key: &str) -> Option<(B, WaitStart)> {
        let index = self.index.lock().expect("waiters");
        index
            .waiters
            .get(obj)
            .filter(|w| w.uid == uid && w.key == key)
            .map(|w| (w.backend.clone(), w.since))
    }

    /// Starts (or restarts) `obj`'s wait on `key`, begun at `since`.
    pub fn insert(&self, obj: &Obj, uid: &str, key: &str, backend: B, since: WaitStart) {
        let mut index = self.index.lock().expect("waiters");
        index.remove(obj);
        index.waiters.insert(
            obj.clone(),
            Waiter {
                uid: uid.to_string(),
                key: key.to_string(),
                backend,
                since,
                poll: POLL_MIN,
                watch: None,
                place_shown: None,
            },
        );
        index
            .by_key
            .entry(key.to_string())
            .or_default()
            .insert(obj.clone());
    }

    /// Runs `start_watch` for `obj` unless a watch task it started is still running;
    /// the task is aborted when the wait ends. Returns whether one was started.
    pub fn watch(&self, obj: &Obj, start_watch: impl FnOnce() -> AbortHandle) -> bool {
        let mut index = self.index.lock().expect("waiters");
        let Some(waiter) = index.waiters.get_mut(obj) else {
            return false;
        };
        if waiter.watch.as_ref().is_some_and(|w| !w.is_finished()) {
            return false;
        }
        waiter.watch = Some(start_watch());
        true
    }

    /// Ends `obj`'s wait; its backend, if it was waiting.
    pub fn stop_waiting(&self, obj: &Obj) -> Option<B> {
        let mut index = self.index.lock().expect("waiters");
        index.remove(obj).map(|w| w.backend)
    }

    /// The locks waiting on `key`, except `except` (the one that let go).
    pub fn waiting_on(&self, key: &str, except: &Obj) -> Vec<Obj> {
        self.backends_waiting_on(key, except)
            .into_iter()
            .map(|(obj, _)| obj)
            .collect()
    }

    /// [`waiting_on`](Self::waiting_on), each with the backend it waits with.
    pub fn backends_waiting_on(&self, key: &str, except: &Obj) -> Vec<(Obj, B)> {
        let index = self.index.lock().expect("waiters");
        let Some(objs) = index.by_key.get(key) else {
            return Vec::new();
        };
        objs.iter()
            .filter(|o| *o != except)
            .filter_map(|o| Some((o.clone(), index.waiters.get(o)?.backend.clone())))
            .collect()
    }

    /// Whether a status write that only moves `obj`'s place in the queue may go now:
    /// at most one per [`PLACE_INTERVAL`] each (a grant moves every waiter, and n
    /// waiters must not mean n² writes), except that becoming next (position 0) is
    /// always shown. Records the write when it may go.
    pub fn may_show_place(&self, obj: &Obj, next: bool) -> bool {
        let mut index = self.index.lock().expect("waiters");
        let Some(w) = index.waiters.get_mut(obj) else {
            return true;
        };
        let now = std::time::Instant::now();
        let due = w
            .place_shown
            .is_none_or(|t| now.duration_since(t) >= PLACE_INTERVAL);
        if due || next {
            w.place_shown = Some(now);
        }
        due || next
    }

    /// The pause before `obj`'s next attempt: [`POLL_MIN`] at first, then 1.5 times
    /// longer each time, up to [`POLL_MAX`].
    pub fn next_poll(&self, obj: &Obj) -> Duration {
        let mut index = self.index.lock().expect("waiters");
        match index.waiters.get_mut(obj) {
            Some(w) => {
                let poll = w.poll;
                w.poll = w.poll.mul_f64(1.5).min(POLL_MAX);
                poll
            }
            None => POLL_MIN,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(name: &str) -> Obj {
        ObjectRef::new(name).within("ns")
    }

    #[test]
    fn a_waiters_place_is_shown_at_most_once_per_interval_unless_it_is_next() {
        let waiters = WaiterIndex::<&str>::default();
        let a = obj("a");
        // Not waiting (yet): nothing to limit.
        assert!(waiters.may_show_place(&a, false));
        waiters.insert(&a, "ua", "s3://b/k", "backend a", WaitStart::now());
        assert!(
            waiters.may_show_place(&a, false),
            "the first place is shown"
        );
        assert!(
            !waiters.may_show_place(&a, false),
            "a second within the interval is not"
        );
        assert!(waiters.may_show_place(&a, true), "becoming next always is");
        assert!(!waiters.may_show_place(&a, false));
    }

    #[test]
    fn waking_a_key_skips_the_one_that_let_go_and_other_keys() {
        let waiters = WaiterIndex::<&str>::default();
        waiters.insert(&obj("a"), "ua", "s3://b/k", "backend a", WaitStart::now());
        waiters.insert(&obj("b"), "ub", "s3://b/k", "backend b", WaitStart::now());
        waiters.insert(
            &obj("c"),
            "uc",
            "s3://b/other",
            "backend c",
            WaitStart::now(),
        );
        let mut woken = waiters.waiting_on("s3://b/k", &obj("a"));
        woken.sort_by_key(|o| o.name.clone());
        assert_eq!(woken, vec![obj("b")]);
        assert_eq!(
            waiters.waiting_on("s3://b/other", &obj("a")),
            vec![obj("c")]
        );
        assert!(waiters.waiting_on("s3://b/none", &obj("a")).is_empty());
    }

    #[test]
    fn stop_waiting_returns_the_backend_and_drops_empty_keys() {
        let waiters = WaiterIndex::<&str>::default();
        waiters.insert(&obj("a"), "ua", "s3://b/k", "backend a", WaitStart::now());
        assert_eq!(waiters.stop_waiting(&obj("a")), Some("backend a"));
        assert_eq!(waiters.stop_waiting(&obj("a")), None);
        let index = waiters.index.lock().unwrap();
        assert!(index.waiters.is_empty());
        assert!(index.by_key.is_empty(), "no empty set is left behind");
    }

    #[test]
    fn a_new_uid_or_key_is_a_new_wait() {
        let waiters = WaiterIndex::<&str>::default();
        let since = WaitStart::now();
        waiters.insert(&obj("a"), "u1", "s3://b/k", "first", since);
        assert_eq!(
            waiters.current(&obj("a"), "u1", "s3://b/k"),
            Some(("first", since))
        );
        // The object was deleted and recreated under the same name.
        assert_eq!(waiters.current(&obj("a"), "u2", "s3://b/k"), None);
        // Its key changed.
        assert_eq!(waiters.current(&obj("a"), "u1", "s3://b/other"), None);

        // Restarting the wait moves it to the new key; the old key forgets it.
        waiters.insert(&obj("a"), "u2", "s3://b/other", "second", WaitStart::now());
        assert!(waiters.waiting_on("s3://b/k", &obj("x")).is_empty());
        assert_eq!(
            waiters.waiting_on("s3://b/other", &obj("x")),
            vec![obj("a")]
        );
        assert_eq!(
            waiters
                .current(&obj("a"), "u2", "s3://b/other")
                .map(|c| c.0),
            Some("second")
        );
        assert_eq!(waiters.index.lock().unwrap().by_key.len(), 1);
    }

    #[test]
    fn the_poll_grows_to_its_bound() {
        let waiters = WaiterIndex::<()>::default();
        assert_eq!(waiters.next_poll(&obj("a")), POLL_MIN, "not waiting");
        waiters.insert(&obj("a"), "u", "k", (), WaitStart::now());
        let polls: Vec<_> = (0..12).map(|_| waiters.next_poll(&obj("a"))).collect();
        assert_eq!(polls[0], POLL_MIN);
        assert_eq!(polls[1], POLL_MIN.mul_f64(1.5));
        assert!(polls.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*polls.last().unwrap(), POLL_MAX);
        // A new wait starts from the bottom again.
        waiters.insert(&obj("a"), "u", "k", (), WaitStart::now());
        assert_eq!(waiters.next_poll(&obj("a")), POLL_MIN);
    }

    #[test]
    fn a_resumed_wait_counts_the_time_before_the_restart() {
        let started = SystemTime::now() - Duration::from_secs(90);
        let resumed = WaitStart::resumed(started);
        assert!(resumed.elapsed() >= Duration::from_secs(90));
        assert!(resumed.elapsed() < Duration::from_secs(100));
        assert_eq!(resumed.wall, started);
        // A start in the future (another controller's clock ahead): from now.
        let ahead = WaitStart::resumed(SystemTime::now() + Duration::from_secs(60));
        assert!(ahead.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn one_watch_task_per_wait_aborted_when_the_wait_ends() {
        let waiters = WaiterIndex::<()>::default();
        let spawn = || tokio::spawn(std::future::pending::<()>()).abort_handle();
        assert!(!waiters.watch(&obj("a"), spawn), "not waiting: no watch");
        waiters.insert(&obj("a"), "u", "k", (), WaitStart::now());
        assert!(waiters.watch(&obj("a"), spawn));
        assert!(!waiters.watch(&obj("a"), spawn), "already watching");
        let handle = waiters.index.lock().unwrap().waiters[&obj("a")]
            .watch
            .clone()
            .unwrap();
        waiters.stop_waiting(&obj("a"));
        tokio::time::timeout(Duration::from_secs(10), async {
            while !handle.is_finished() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the watch task is aborted with its wait");

        // A finished watch (it fired) is replaced by the next one.
        waiters.insert(&obj("a"), "u", "k", (), WaitStart::now());
        let fired = tokio::spawn(async {});
        let fired_handle = fired.abort_handle();
        fired.await.unwrap();
        assert!(waiters.watch(&obj("a"), || fired_handle));
        assert!(
            waiters.watch(&obj("a"), spawn),
            "the fired watch is replaced"
        );
        waiters.stop_waiting(&obj("a"));
    }
}

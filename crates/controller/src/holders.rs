//! One holder task per held lock. The engine's [`HeldLock`] renews on its own timer;
//! an observer in that task counts renewals and forwards *transitions* of its state
//! (Held → Expiring → Held, Lost, Released) to the controller's wake channel. A renewal changes only the version in
//! `HolderState::Held`, which is not a transition, so renewals cause no reconcile and no
//! API-server write.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use kube::runtime::reflector::ObjectRef;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc::UnboundedSender;

use super::status::Occupancy;
use lockwarden_api::{BackendKind, DistributedLock};
use lockwarden_core::history::{self, Grant};
use lockwarden_core::{
    HeldBy, HeldLock, HolderState, Lease, LockBackend, LockError, RenewPolicy, RunKey, Stored,
};

/// What status reports about an acquisition, fixed when it was made.
#[derive(Clone, Debug)]
pub struct Acquisition {
    pub holder: String,
    pub fence: u64,
    pub nonce: String,
    /// The record version our acquisition produced (status.etag).
    pub version: String,
    pub acquired_at: SystemTime,
    pub forced_from: Option<HeldBy>,
    /// How the key was held right after this acquisition (keys with more than one
    /// permit).
    pub occupancy: Option<Occupancy>,
    /// The key's holder history as our acquisition wrote it (`status.history`).
    pub history: Vec<Grant>,
}

/// A held lock, whose holder task reports its transitions.
pub struct HolderTask {
    pub uid: String,
    pub key: String,
    /// The store the lock is held in (the `backend` label of its metrics).
    pub backend: BackendKind,
    pub acquisition: Acquisition,
    held: HeldLock,
    /// Set once the reconcile releases the lock: its outcome is no transition to
    /// report.
    releasing: Arc<AtomicBool>,
}

fn kind(state: &HolderState) -> u8 {
    match state {
        HolderState::Held { .. } => 0,
        HolderState::Expiring { .. } => 1,
        HolderState::Lost(_) => 2,
        HolderState::Released => 3,
    }
}

/// Whom a holder task works for: the object (by reference and uid), its key and store,
/// where it reports transitions, and the counters of its renewals and of their failures.
pub struct Owner {
    pub obj: ObjectRef<DistributedLock>,
    pub uid: String,
    pub key: String,
    pub backend: BackendKind,
    pub wake: UnboundedSender<ObjectRef<DistributedLock>>,
    pub renewals: Counter,
    pub renew_failures: Counter,
}

impl HolderTask {
    pub fn start(
        backend: Arc<dyn LockBackend>,
        lease: Lease,
        policy: RenewPolicy,
        owner: Owner,
    ) -> HolderTask {
        let Owner {
            obj,
            uid,
            key,
            backend: held_in,
            wake,
            renewals,
            renew_failures,
        } = owner;
        let acquisition = Acquisition {
            holder: lease.holder().to_string(),
            fence: lease.fence().0,
            nonce: lease.nonce().to_string(),
            version: lease.version.0.clone(),
            acquired_at: lease.acquired_at(),
            forced_from: lease.forced_from.clone(),
            occupancy: Occupancy::of(&lease.record),
            history: history::of_record(&lease.record),
        };
        // Counted and forwarded in the holder task itself: a task of its own would
        // be woken by every renewal, on the renewal's path.
        let releasing = Arc::new(AtomicBool::new(false));
        let ours = releasing.clone();
        let mut last_seen = None;
        let observer = Box::new(move |state: &HolderState| {
            let now = kind(state);
            let Some(last) = last_seen.replace(now) else {
                return; // the first state: what the acquisition reported
            };
            // Our own release is no transition to report (the reconcile asked for it).
            if ours.load(Ordering::Relaxed) {
                return;
            }
            // Every accepted renewal publishes `Held` again (with its new version).
            if now == 0 {
                renewals.inc();
            }
            if now != last {
                // Held → Expiring or Lost: renewals failed (or were refused).
                if last == 0 && (now == 1 || now == 2) {
                    renew_failures.inc();
                }
                // The receiver gone: the controller is shutting down.
                let _ = wake.send(obj.clone());
            }
        });
        let held = HeldLock::hold_observed(backend, lease, policy, observer);
        HolderTask {
            uid,
            key,
            backend: held_in,
            acquisition,
            held,
            releasing,
        }
    }

    pub fn state(&self) -> HolderState {
        self.held.state()
    }

    /// Waits (at most `limit`) until a resumed lease's first renewal has answered, so
    /// that its not-yet-renewed `Expiring` state is not reported as a transition.
    pub async fn settled(&self, limit: std::time::Duration) {
        let mut rx = self.held.watch();
        let _ = tokio::time::timeout(
            limit,
            rx.wait_for(|s| !matches!(s, HolderState::Expiring { .. })),
        )
        .await;
    }

    /// Releases the lock and waits for the store to confirm. Returns the release as
    /// stored, where the backend hands it over to the key's other contenders in this
    /// process ([`LockBackend::last_release`]).
    pub async fn release(self) -> Result<Option<Stored>, LockError> {
        self.release_recording(None).await
    }

    /// Releases the lock; with `completed` (a run that succeeded under it, the
    /// cluster it ran in and how many runs the key keeps), the release records the run
    /// in the key's memory in the same write (docs/design.md §6.7).
    pub async fn release_recording(
        self,
        completed: Option<(&RunKey, &str, usize)>,
    ) -> Result<Option<Stored>, LockError> {
        self.releasing.store(true, Ordering::Relaxed);
        let backend = self.held.backend();
        match completed {
            Some((run, cluster, keep)) => {
                self.held
                    .release_completed(run, Some(cluster), keep)
                    .await?
            }
            None => self.held.release().await?,
        }
        Ok(backend.last_release().await)
    }
}

/// Every held lock of this controller, by object.
#[derive(Default)]
pub struct Holders {
    tasks: Mutex<HashMap<ObjectRef<DistributedLock>, HolderTask>>,
}

impl Holders {
    pub fn insert(&self, obj: ObjectRef<DistributedLock>, task: HolderTask) {
        self.tasks.lock().expect("holders").insert(obj, task);
    }

    /// The state and acquisition of the object's holder task, if it has one for this uid.
    pub fn get(
        &self,
        obj: &ObjectRef<DistributedLock>,
        uid: &str,
    ) -> Option<(HolderState, Acquisition, String)> {
        let tasks = self.tasks.lock().expect("holders");
        tasks
            .get(obj)
            .filter(|t| t.uid == uid)
            .map(|t| (t.state(), t.acquisition.clone(), t.key.clone()))
    }

    pub fn remove(&self, obj: &ObjectRef<DistributedLock>) -> Option<HolderTask> {
        self.tasks.lock().expect("holders").remove(obj)
    }

    /// Renews at once every held lock whose last confirmed write is at one of
    /// `revisions`, a guard's request (docs/design.md §6.3, "A renewal on the guard's
    /// request"); the locks asked, by object. Revisions are random per write, so a
    /// request names the locks its guard read and no other.
    pub fn renew_where_seen(&self, revisions: &[&str]) -> Vec<ObjectRef<DistributedLock>> {
        let tasks = self.tasks.lock().expect("holders");
        let mut asked = Vec::new();
        for (obj, task) in tasks.iter() {
            if let Some(revision) = revisions.iter().find(|r| task.held.is_at(r)) {
                task.held.renew_if_at(revision);
                asked.push(obj.clone());
            }
        }
        asked
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockwarden_core::memory::MemoryStore;
    use lockwarden_core::{AcquireRequest, Attempt, CasLock};
    use std::time::Duration;

    const LEASE: Duration = Duration::from_secs(60);

    async fn hold(holders: &Holders, name: &str) -> MemoryStore {
        let store = MemoryStore::new(format!("mem://holders/{name}"));
        let lock = CasLock::new(store.clone());
        let lease = match lock.try_acquire(&AcquireRequest::new(name, LEASE)).await {
            Ok(Attempt::Acquired(lease)) => lease,
            other => panic!("{other:?}"),
        };
        let obj = ObjectRef::new(name).within("ns");
        let owner = Owner {
            obj: obj.clone(),
            uid: name.into(),
            key: name.into(),
            backend: BackendKind::S3,
            wake: tokio::sync::mpsc::unbounded_channel().0,
            renewals: Counter::default(),
            renew_failures: Counter::default(),
        };
        let task = HolderTask::start(Arc::new(lock), lease, RenewPolicy::for_lease(LEASE), owner);
        holders.insert(obj, task);
        store
    }

    /// docs/design.md §6.3, "A renewal on the guard's request": the renewal comes long
    /// before the schedule's (a third of the 60 s lease), and only for the lock the
    /// request names by its revision.
    #[tokio::test]
    async fn a_guards_request_renews_at_once_only_the_lock_held_at_a_revision_it_names() {
        let holders = Holders::default();
        let (asked, other) = (hold(&holders, "asked").await, hold(&holders, "other").await);
        let (seen, untouched) = (asked.record().revision, other.record().revision);

        let renewed = holders.renew_where_seen(&[&seen, "a revision nobody holds"]);
        assert_eq!(renewed, [ObjectRef::new("asked").within("ns")]);
        let patience = Duration::from_secs(10);
        tokio::time::timeout(patience, async {
            while asked.record().revision == seen {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("renewed on request, not on the schedule 20 s away");
        assert_eq!(
            other.record().revision,
            untouched,
            "the other lock is left alone"
        );
        // The request's revision is no longer held: asking again renews nothing.
        assert!(holders.renew_where_seen(&[&seen]).is_empty());
    }

    /// The holder task's observer counts every accepted renewal, wakes the controller
    /// on a transition (Held → Expiring → Held) and on nothing else, and not for the
    /// release the reconcile itself asked for.
    #[tokio::test]
    async fn renewals_are_counted_and_only_transitions_wake_the_controller() {
        // Renewed every 0.5 s: a loaded machine's stall of a second does not expire it.
        const SHORT: Duration = Duration::from_millis(1500);
        let patience = Duration::from_secs(20);
        let store = MemoryStore::new("mem://holders/observed");
        let lock = CasLock::new(store.clone());
        let lease = match lock.try_acquire(&AcquireRequest::new("a", SHORT)).await {
            Ok(Attempt::Acquired(lease)) => lease,
            other => panic!("{other:?}"),
        };
        let obj = ObjectRef::new("observed").within("ns");
        let (wake, mut woken) = tokio::sync::mpsc::unbounded_channel();
        let (renewals, renew_failures) = (Counter::default(), Counter::default());
        let owner = Owner {
            obj: obj.clone(),
            uid: "observed".into(),
            key: "observed".into(),
            backend: BackendKind::S3,
            wake,
            renewals: renewals.clone(),
            renew_failures: renew_failures.clone(),
        };
        let task = HolderTask::start(Arc::new(lock), lease, RenewPolicy::for_lease(SHORT), owner);
        // Renewals on the schedule: counted, and no wake-up.
        let give_up = std::time::Instant::now() + patience;
        while renewals.get() < 2 {
            assert!(std::time::Instant::now() < give_up, "two renewals");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(woken.try_recv().is_err(), "a renewal woke the controller");

        // The store unreachable past the deadline: one wake-up, one failure counted.
        store.set_unreachable(true);
        let first = tokio::time::timeout(patience, woken.recv()).await;
        assert_eq!(first.expect("woken").as_ref(), Some(&obj));
        assert!(matches!(task.state(), HolderState::Expiring { .. }));
        assert_eq!(renew_failures.get(), 1);
        // Back: one more wake-up (Expiring → Held), and renewals counted again.
        store.set_unreachable(false);
        let again = tokio::time::timeout(patience, woken.recv()).await;
        assert_eq!(again.expect("woken").as_ref(), Some(&obj));
        assert!(task.state().is_held());

        // Our own release: no wake-up.
        task.release().await.expect("release");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            woken.try_recv().is_err(),
            "our own release woke the controller"
        );
        assert_eq!(renew_failures.get(), 1);
    }
}

//! One holder task per held lock. The engine's [`HeldLock`] renews on its own timer;
//! a small monitor forwards *transitions* of its state (Held → Expiring → Held, Lost,
//! Released) to the controller's wake channel. A renewal changes only the version in
//! `HolderState::Held`, which is not a transition, so renewals cause no reconcile and no
//! API-server write.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use kube::runtime::reflector::ObjectRef;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;

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

/// A held lock and the monitor that reports its transitions.
pub struct HolderTask {
    pub uid: String,
    pub key: String,
    /// The store the lock is held in (the `backend` label of its metrics).
    pub backend: BackendKind,
    pub acquisition: Acquisition,
    held: HeldLock,
    monitor: JoinHandle<()>,
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
        let held = HeldLock::hold(backend, lease, policy);
        let mut rx = held.watch();
        let monitor = tokio::spawn(async move {
            let mut last = kind(&rx.borrow_and_update());
            while rx.changed().await.is_ok() {
                let now = kind(&rx.borrow_and_update());
                // Every accepted renewal publishes `Held` again (with its new version).
                if now == 0 {
                    renewals.inc();
                }
                if now != last {
                    // Held → Expiring or Lost: renewals failed (or were refused).
                    if last == 0 && (now == 1 || now == 2) {
                        renew_failures.inc();
                    }
                    last = now;
                    if wake.send(obj.clone()).is_err() {
                        return;
                    }
                }
            }
        });
        HolderTask {
            uid,
            key,
            backend: held_in,
            acquisition,
            held,
            monitor,
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
        self.monitor.abort();
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
}

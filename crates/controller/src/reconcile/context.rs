//! What every reconcile of a DistributedLock shares: the client, the holder tasks, the
//! locks waiting per key, the wake channel, the metrics and the way to a backend.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Resource;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::config::ControllerConfig;
use crate::connect::{Connector, FromSecrets};
use crate::events::Events;
use crate::holders::Holders;
use crate::telemetry::Telemetry;
use crate::waiters::WaiterIndex;
use lockwarden_api::DistributedLock;
use lockwarden_core::{LockBackend, Stored};

/// Everything reconciles share.
pub struct Context {
    pub client: kube::Client,
    pub config: ControllerConfig,
    pub(super) events: Events,
    /// Every held lock's task; the guards' requests for a renewal reach them here too
    /// (`crate::guard_requests`).
    pub(crate) holders: Holders,
    /// Locks waiting for their key, each with the backend it keeps between attempts.
    pub(super) waiters: WaiterIndex<Arc<dyn LockBackend>>,
    pub(super) wake: UnboundedSender<ObjectRef<DistributedLock>>,
    pub telemetry: Arc<Telemetry>,
    /// Where backends come from ([`FromSecrets`] unless [`Context::with_connector`]).
    pub(super) connector: Arc<dyn Connector>,
    /// Releases waiting for the reconciles of the waiters they woke ([`Context::hand_off`]).
    reconcile_ends: ReconcileEnds,
}

/// How long a release lets the waiters it woke reconcile before its own last writes: far
/// longer than a waiter's acquisition and status write take on a store and an API
/// server that keep up (a few ms), short enough that behind a slow one it only delays
/// the releasing object's `Released` status or Event and its finalizer's removal.
pub(super) const WAITERS_FIRST: Duration = Duration::from_millis(100);

/// Who waits for the end of which lock's next reconcile.
#[derive(Default)]
struct ReconcileEnds {
    waiting: Mutex<HashMap<ObjectRef<DistributedLock>, Vec<oneshot::Sender<()>>>>,
}

impl ReconcileEnds {
    fn next_end_of(&self, obj: &ObjectRef<DistributedLock>) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        waiting.entry(obj.clone()).or_default().push(tx);
        rx
    }

    /// Drops the registrations nobody waits for any more (a release that gave up
    /// after [`WAITERS_FIRST`]), so that a waiter deleted before its next reconcile
    /// leaves nothing behind.
    fn forget_abandoned(&self, objs: &[ObjectRef<DistributedLock>]) {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        for obj in objs {
            if let Some(senders) = waiting.get_mut(obj) {
                senders.retain(|tx| !tx.is_closed());
                if senders.is_empty() {
                    waiting.remove(obj);
                }
            }
        }
    }

    fn ended(&self, obj: &ObjectRef<DistributedLock>) {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        for tx in waiting.remove(obj).into_iter().flatten() {
            let _ = tx.send(());
        }
    }
}

impl Context {
    pub fn new(
        client: kube::Client,
        config: ControllerConfig,
        wake: UnboundedSender<ObjectRef<DistributedLock>>,
        telemetry: Arc<Telemetry>,
    ) -> Self {
        Context {
            events: Events::new(client.clone(), &config),
            client,
            config,
            holders: Holders::default(),
            waiters: WaiterIndex::default(),
            wake,
            telemetry,
            connector: Arc::new(FromSecrets),
            reconcile_ends: ReconcileEnds::default(),
        }
    }

    /// This context getting its backends from `connector`.
    pub fn with_connector(self, connector: Arc<dyn Connector>) -> Self {
        Context { connector, ..self }
    }

    /// A release the store did not confirm: the lease runs out on its own. Logged with
    /// the lock and counted, never a reason to fail the reconcile.
    pub(super) fn release_failed(
        &self,
        obj: &ObjectRef<DistributedLock>,
        key: &str,
        error: &dyn std::error::Error,
    ) {
        tracing::warn!(lock = %obj, %key, %error, "release not confirmed by the store; its lease runs out on its own");
        self.telemetry.count_release_error();
    }

    /// Requeues every lock waiting on `key` (a same-cluster hand-off), after handing
    /// each the `released` record (if the backend gave one), so that its next attempt
    /// writes on it instead of reading the key first: one store round trip less
    /// between a release and the next holder.
    ///
    /// Then lets their reconciles go first, for up to [`WAITERS_FIRST`]: the caller's
    /// next writes (its `Released` status or Event, its finalizer's removal) are no step
    /// of the hand-off, and sent at the same moment as a waiter's status write they
    /// share the API server with it and make it half again as slow (docs/benchmarks.md,
    /// "Same-cluster hand-off: the reconcile queue, and the waiters' writes first").
    /// No rule of docs/design.md depends on the wait: it only orders writes.
    pub(super) async fn hand_off(
        &self,
        key: &str,
        except: &ObjectRef<DistributedLock>,
        released: Option<Stored>,
    ) {
        let (mut woken, mut ends) = (Vec::new(), Vec::new());
        for (obj, backend) in self.waiters.backends_waiting_on(key, except) {
            if let Some(released) = &released {
                backend.learn(released.clone()).await;
            }
            ends.push(self.reconcile_ends.next_end_of(&obj));
            let _ = self.wake.send(obj.clone());
            woken.push(obj);
        }
        if ends.is_empty() {
            return;
        }
        let all_ended = futures::future::join_all(ends);
        if tokio::time::timeout(WAITERS_FIRST, all_ended)
            .await
            .is_err()
        {
            self.reconcile_ends.forget_abandoned(&woken);
        }
    }

    /// A reconcile of `obj` has ended: the releases waiting for it go on.
    pub(super) fn reconciled(&self, obj: &ObjectRef<DistributedLock>) {
        self.reconcile_ends.ended(obj);
    }

    pub(super) async fn event(
        &self,
        lock: &DistributedLock,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        self.events
            .publish(&lock.object_ref(&()), type_, reason, note)
            .await;
    }

    /// Times one backend request for `lockwarden_backend_request_duration_seconds`.
    pub(super) async fn timed<T>(
        &self,
        kind: &str,
        operation: &str,
        request: impl std::future::Future<Output = T>,
    ) -> T {
        let start = Instant::now();
        let out = request.await;
        self.telemetry
            .observe_request(kind, operation, start.elapsed());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(name: &str) -> ObjectRef<DistributedLock> {
        ObjectRef::new(name).within("team")
    }

    fn registrations(ends: &ReconcileEnds) -> HashMap<String, usize> {
        let waiting = ends.waiting.lock().unwrap();
        waiting
            .iter()
            .map(|(obj, senders)| (obj.name.clone(), senders.len()))
            .collect()
    }

    /// A release that stopped waiting (its receivers dropped after WAITERS_FIRST)
    /// leaves no registration behind, and one still waited for on the same lock is
    /// kept and still told of the reconcile's end.
    #[tokio::test]
    async fn a_release_that_gave_up_leaves_no_registration() {
        let ends = ReconcileEnds::default();
        let (first, second) = (lock("first"), lock("second"));
        drop(ends.next_end_of(&first));
        let still_waiting = ends.next_end_of(&first);
        drop(ends.next_end_of(&second));
        assert_eq!(
            registrations(&ends),
            HashMap::from([("first".to_string(), 2), ("second".to_string(), 1)])
        );

        ends.forget_abandoned(&[first.clone(), second.clone()]);
        assert_eq!(
            registrations(&ends),
            HashMap::from([("first".to_string(), 1)]),
            "the abandoned registrations are dropped, the waited-for one kept"
        );

        ends.ended(&first);
        assert!(
            still_waiting.await.is_ok(),
            "the release still waiting hears of the end"
        );
        assert!(registrations(&ends).is_empty());
    }

    /// A waiter deleted before its next reconcile never ends one: the release's
    /// registration goes once the release stops waiting, as `hand_off` does it.
    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_never_reconciles_is_forgotten_after_the_wait() {
        let ends = ReconcileEnds::default();
        let gone = lock("deleted-waiter");
        let waited = futures::future::join_all([ends.next_end_of(&gone)]);
        let gave_up = tokio::time::timeout(WAITERS_FIRST, waited).await.is_err();
        assert!(gave_up, "no reconcile of a deleted waiter ends");
        ends.forget_abandoned(std::slice::from_ref(&gone));
        assert!(registrations(&ends).is_empty());
    }
}

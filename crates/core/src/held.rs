//! A held lock renewed in the background by its `HolderTask`, the way a program
//! uses a lock: acquire, work while it is held, release (explicitly or on drop), and
//! learn at once if it is lost.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout_at};

use super::admission::Admission;
use super::backend::{Lease, LockBackend};
use super::error::{LockError, LostReason};
use super::record::{FenceToken, Version};
use super::runs::{CompletedRun, RunKey};

/// When to renew.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenewPolicy {
    /// Time between successful renewals (less than half the lease).
    pub interval: Duration,
    /// Time between attempts after a failed renewal.
    pub retry: Duration,
    /// Upper bound on one renewal request; a hung request is abandoned (its outcome
    /// is resolved by the next one, rule 4).
    pub request_timeout: Duration,
}

/// The widest step of the grid renewals are brought forward onto (docs/design.md §3,
/// "Renewals share a grid").
const RENEWAL_GRID: Duration = Duration::from_millis(100);

impl RenewPolicy {
    /// When to renew a lease confirmed at `now`: one interval later, brought forward
    /// onto the process's renewal grid, whose step is a twentieth of the interval at
    /// most ([`RENEWAL_GRID`] at most). Locks held by one process then come due
    /// together, and the process wakes once per step rather than once per lock; a
    /// renewal made earlier never shortens the lease it keeps.
    pub fn next_renewal(&self, now: Instant) -> Instant {
        static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let due = now + self.interval;
        let step = (self.interval / 20).min(RENEWAL_GRID);
        if step.is_zero() {
            return due;
        }
        let epoch = Instant::from_std(*EPOCH.get_or_init(std::time::Instant::now));
        let since = due.saturating_duration_since(epoch);
        let off_grid = Duration::from_nanos((since.as_nanos() % step.as_nanos()) as u64);
        due - off_grid
    }

    /// Renew every `lease / 3`, retry quickly, never let one request eat the lease.
    pub fn for_lease(lease: Duration) -> Self {
        RenewPolicy {
            interval: lease / 3,
            retry: (lease / 10).clamp(Duration::from_millis(50), Duration::from_secs(1)),
            request_timeout: (lease / 4).max(Duration::from_millis(200)),
        }
    }

    /// This policy, tightened where it would not keep up with the lease the backend
    /// actually granted. A store may grant less than was asked (a ZooKeeper lease is
    /// its session timeout): renewing on the requested interval would then come after
    /// the holder deadline every time, and the lock would flap Held/Expiring.
    pub fn within(self, granted: Duration) -> Self {
        let fit = RenewPolicy::for_lease(granted);
        RenewPolicy {
            interval: self.interval.min(fit.interval),
            retry: self.retry.min(fit.retry),
            request_timeout: self.request_timeout.min(fit.request_timeout),
        }
    }
}

/// What the holder believes, published on a watch channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HolderState {
    /// Held, renewed in time: safe to act with this fence.
    Held { fence: FenceToken, version: Version },
    /// Renewals have been failing and the holder deadline (rule 2) passed: the lock
    /// must not be relied on, though it may come back if a renewal gets through before
    /// anyone takes over.
    Expiring {
        fence: FenceToken,
        last_error: String,
    },
    /// Someone else has it, or it is gone: final.
    Lost(LostReason),
    /// Released by us: final.
    Released,
}

impl HolderState {
    pub fn is_held(&self) -> bool {
        matches!(self, HolderState::Held { .. })
    }
}

/// Told of every state the holder task publishes, in that task, once its watchers can
/// read it: for what must not cost a task and a wake-up per renewal, such as a metric
/// counted per renewal, or a wake of whoever then reads [`HeldLock::state`] (the
/// controller's reconcile). It runs on the renewal's path, so it must not block.
pub type StateObserver = Box<dyn FnMut(&HolderState) + Send + 'static>;

/// A held lock. Dropping it releases the lock in the background.
pub struct HeldLock {
    backend: Arc<dyn LockBackend>,
    fence: FenceToken,
    nonce: String,
    holder: String,
    state: watch::Receiver<HolderState>,
    deadline: watch::Receiver<Instant>,
    /// The revision of our last confirmed write (our own entry's, on a key with several
    /// permits): what a reader of the record sees until the next one.
    revision: watch::Receiver<String>,
    /// A renewal asked for ahead of schedule, by the revision the asker saw.
    renew_request: watch::Sender<String>,
    release: Option<oneshot::Sender<ReleaseOrder>>,
    task: Option<JoinHandle<()>>,
}

impl HeldLock {
    /// Starts the holder task for a lease just acquired (or resumed).
    pub fn hold(backend: Arc<dyn LockBackend>, lease: Lease, policy: RenewPolicy) -> HeldLock {
        HeldLock::start(backend, lease, policy, None)
    }

    /// As [`HeldLock::hold`], with `observer` told of the first state and of every
    /// state the holder task publishes after it (every accepted renewal publishes
    /// `Held` again).
    pub fn hold_observed(
        backend: Arc<dyn LockBackend>,
        lease: Lease,
        policy: RenewPolicy,
        observer: StateObserver,
    ) -> HeldLock {
        HeldLock::start(backend, lease, policy, Some(observer))
    }

    fn start(
        backend: Arc<dyn LockBackend>,
        lease: Lease,
        policy: RenewPolicy,
        mut observer: Option<StateObserver>,
    ) -> HeldLock {
        let initial = if lease.is_valid() {
            HolderState::Held {
                fence: lease.fence(),
                version: lease.version.clone(),
            }
        } else {
            HolderState::Expiring {
                fence: lease.fence(),
                last_error: "not renewed yet".into(),
            }
        };
        if let Some(observer) = &mut observer {
            observer(&initial);
        }
        let (state_tx, state) = watch::channel(initial);
        let (deadline_tx, deadline) = watch::channel(lease.deadline.instant());
        let (revision_tx, revision) = watch::channel(lease.record.revision.clone());
        let (renew_request, requests) = watch::channel(String::new());
        let (release, release_rx) = oneshot::channel();
        let fence = lease.fence();
        let nonce = lease.nonce().to_string();
        let holder = lease.holder().to_string();
        let task = HolderTask {
            backend: backend.clone(),
            // The holder's own lease, not the lock-delay its record also carries.
            policy: policy.within(lease.holder_lease()),
            state: state_tx,
            deadline: deadline_tx,
            revision: revision_tx,
            observer,
        };
        let task = tokio::spawn(task.run(lease, release_rx, requests));
        HeldLock {
            backend,
            fence,
            nonce,
            holder,
            state,
            deadline,
            revision,
            renew_request,
            release: Some(release),
            task: Some(task),
        }
    }

    /// Acquires (waiting as `wait` allows) and holds the lock, renewing every third
    /// of the lease.
    pub async fn acquire(
        backend: Arc<dyn LockBackend>,
        req: &super::AcquireRequest,
        wait: super::Wait,
    ) -> Result<HeldLock, LockError> {
        let lease = super::acquire(backend.as_ref(), req, wait).await?;
        Ok(HeldLock::hold(
            backend,
            lease,
            RenewPolicy::for_lease(req.lease),
        ))
    }

    pub fn fence(&self) -> FenceToken {
        self.fence
    }

    pub fn nonce(&self) -> &str {
        &self.nonce
    }

    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The backend the lock is held on.
    pub fn backend(&self) -> Arc<dyn LockBackend> {
        self.backend.clone()
    }

    pub fn url(&self) -> &str {
        self.backend.url()
    }

    /// Whether the lock is held and renewed in time right now.
    pub fn is_held(&self) -> bool {
        self.state.borrow().is_held()
    }

    pub fn state(&self) -> HolderState {
        self.state.borrow().clone()
    }

    /// A receiver of every state change.
    pub fn watch(&self) -> watch::Receiver<HolderState> {
        self.state.clone()
    }

    /// The holder deadline (rule 2) of the last confirmed write, on this process's
    /// monotonic clock; it moves with every renewal. `run` stops its command before it
    /// (rule 7).
    pub fn deadline(&self) -> watch::Receiver<Instant> {
        self.deadline.clone()
    }

    /// The revision of our last confirmed write: our own entry's on a key with several
    /// permits. A reader that saw it has seen no renewal since.
    pub fn revision(&self) -> String {
        self.revision.borrow().clone()
    }

    /// Whether our last confirmed write is the one at `revision`.
    pub fn is_at(&self, revision: &str) -> bool {
        *self.revision.borrow() == revision
    }

    /// Renews at once, ahead of the schedule, if our last confirmed write is still the
    /// one at `revision` and no renewal is under way (docs/design.md §6.3, "A renewal on
    /// the guard's request"): a reader that saw `revision` waits to see it change. Any
    /// later request for the same revision finds it changed and does nothing, so one
    /// revision asks for one renewal at most. The schedule runs on from that renewal.
    pub fn renew_if_at(&self, revision: &str) {
        self.renew_request.send_replace(revision.to_string());
    }

    /// Resolves when the lock is lost (or can no longer be claimed: `Expiring`).
    pub fn lost(&self) -> impl Future<Output = HolderState> + Send + 'static {
        let mut rx = self.state.clone();
        async move {
            match rx.wait_for(|s| !s.is_held()).await {
                Ok(s) => s.clone(),
                Err(_) => HolderState::Lost(LostReason::NotOurs),
            }
        }
    }

    /// Releases the lock and waits for the store to confirm.
    pub async fn release(self) -> Result<(), LockError> {
        self.release_recording(None).await
    }

    /// Releases the lock after `run` succeeded under it, recording the run in the
    /// key's memory of completed runs (keeping the `keep` most recent) in the same
    /// write (docs/design.md §6.7); waits for the store to confirm.
    pub async fn release_completed(
        self,
        run: &RunKey,
        cluster: Option<&str>,
        keep: usize,
    ) -> Result<(), LockError> {
        let done = CompletedRun::now(run, self.fence, &self.holder, cluster);
        self.release_recording(Some((done, keep))).await
    }

    async fn release_recording(
        mut self,
        completed: Option<(CompletedRun, usize)>,
    ) -> Result<(), LockError> {
        let (done_tx, done_rx) = oneshot::channel();
        let Some(release) = self.release.take() else {
            return Ok(());
        };
        let order = ReleaseOrder {
            completed,
            done: done_tx,
        };
        if release.send(order).is_err() {
            return Err(self.final_error());
        }
        let result = done_rx.await.unwrap_or_else(|_| Err(self.final_error()));
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        result
    }

    fn final_error(&self) -> LockError {
        let url = self.backend.url().to_string();
        match self.state.borrow().clone() {
            HolderState::Lost(reason) => LockError::Lost { url, reason },
            _ => LockError::NotHeld { url },
        }
    }
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        // Ask the task to release; it runs on without us.
        if let Some(release) = self.release.take() {
            let (done, _) = oneshot::channel();
            let _ = release.send(ReleaseOrder {
                completed: None,
                done,
            });
        }
    }
}

/// What the holder task is asked to do when the lock is let go: record a completed
/// run with the release (§6.7) or not, and where to send the outcome.
struct ReleaseOrder {
    completed: Option<(CompletedRun, usize)>,
    done: oneshot::Sender<Result<(), LockError>>,
}

type Renewal = Pin<Box<dyn Future<Output = (Lease, Result<(), LockError>)> + Send>>;

/// A wait for a slot of the store's bound of requests in flight ([`crate::admission`]).
type Admitting = Pin<Box<dyn Future<Output = Result<Option<Admission>, LockError>> + Send>>;

/// A renewal under way, in two stages so that one waiting behind an overloaded store
/// keeps as little as possible (docs/design.md §3, "Requests in flight are bounded"):
/// first the wait for the store's bound, which holds no lease, no next record and no
/// engine or store future; then, once admitted, the renewal itself, built from a
/// clone of the lease. Both end by `ends`, the renewal's request timeout from when it
/// was due.
enum Pending {
    Admitting { admission: Admitting, ends: Instant },
    Renewing(Renewal),
}

/// What one stage of a [`Pending`] renewal came to. Lives for one `match` in the
/// holder's loop: boxing its lease would cost an allocation per renewal instead.
#[allow(clippy::large_enum_variant)]
enum Step {
    /// The store admitted the renewal (`None`: it has no bound); build it now.
    Admitted(Option<Admission>, Instant),
    /// The renewal ended: with the lease it renewed, or `None` when it was never
    /// admitted (nothing was sent, the lease is unchanged).
    Ended(Option<Lease>, Result<(), LockError>),
}

impl Pending {
    /// Runs the current stage to its end. Cancel-safe: a stage dropped unfinished by
    /// the holder's `select!` is polled again from where it was.
    async fn step(&mut self) -> Step {
        match self {
            Pending::Admitting { admission, ends } => match admission.await {
                Ok(admitted) => Step::Admitted(admitted, *ends),
                Err(e) => Step::Ended(None, Err(e)),
            },
            Pending::Renewing(renewal) => {
                let (lease, result) = renewal.await;
                Step::Ended(Some(lease), result)
            }
        }
    }
}

/// A renewal not confirmed within its request timeout: its outcome is resolved by the
/// next one (rule 4).
fn renewal_timed_out(url: &str, limit: Duration) -> LockError {
    LockError::Unavailable {
        url: url.to_string(),
        cause: format!("renewal took longer than {limit:?}").into(),
    }
}

/// Renews one lease on its own timer and publishes what the holder may believe.
struct HolderTask {
    backend: Arc<dyn LockBackend>,
    policy: RenewPolicy,
    state: watch::Sender<HolderState>,
    deadline: watch::Sender<Instant>,
    revision: watch::Sender<String>,
    observer: Option<StateObserver>,
}

impl HolderTask {
    /// Publishes the holder's state to every watcher, then tells the observer. In that
    /// order: the controller's observer wakes a reconcile that reads the state at once,
    /// and told first it could read the state before (`Held` after an `Expiring`) and,
    /// woken once per change, not look again until its resync — the Job of a lock past
    /// its deadline ran on for minutes (docs/design.md §6.3, "A holder's state is
    /// published before anyone is told of it").
    fn publish(&mut self, state: HolderState) {
        let Some(observer) = &mut self.observer else {
            self.state.send_replace(state);
            return;
        };
        // A copy for the observer (one small allocation): told through the watch's read
        // guard, an observer that reads the state itself would take that lock again on
        // the same thread, which `std::sync::RwLock` does not promise to allow.
        let told = state.clone();
        self.state.send_replace(state);
        observer(&told);
    }

    /// The first stage of a renewal due now: the wait for the store's bound, which
    /// carries nothing of the lease.
    fn admission(&self) -> Pending {
        let backend = self.backend.clone();
        let limit = self.policy.request_timeout;
        let ends = Instant::now() + limit;
        let admission = Box::pin(async move {
            match timeout_at(ends, backend.admit()).await {
                Ok(admitted) => admitted,
                Err(_) => Err(renewal_timed_out(backend.url(), limit)),
            }
        });
        Pending::Admitting { admission, ends }
    }

    /// The second stage: the renewal of `lease`, within `admission`, by `ends`.
    fn renewal(&self, mut lease: Lease, admission: Option<Admission>, ends: Instant) -> Renewal {
        let backend = self.backend.clone();
        let limit = self.policy.request_timeout;
        Box::pin(async move {
            let renew = async {
                match admission {
                    Some(admission) => admission.scope(backend.renew(&mut lease)).await,
                    None => backend.renew(&mut lease).await,
                }
            };
            let result = match timeout_at(ends, renew).await {
                Ok(r) => r,
                Err(_) => Err(renewal_timed_out(backend.url(), limit)),
            };
            (lease, result)
        })
    }

    /// Lets the lock go as `order` asks (`None`: the [`HeldLock`] was dropped) and
    /// publishes the final state.
    async fn release(&mut self, lease: &Lease, order: Option<ReleaseOrder>) {
        let (completed, done) = match order {
            Some(order) => (order.completed, Some(order.done)),
            None => (None, None),
        };
        let result = match completed {
            Some((run, keep)) => self.backend.release_completed(lease, run, keep).await,
            None => self.backend.release(lease).await,
        };
        let final_state = match &result {
            Err(LockError::Lost { reason, .. }) => HolderState::Lost(reason.clone()),
            _ => HolderState::Released,
        };
        self.publish(final_state);
        let unheard = match done {
            Some(done) => done.send(result).err(),
            None => Some(result),
        };
        // Nobody waits for the answer (the HeldLock was dropped): a failed release must
        // still be seen. The key is then free only after its lease, by rule 1 on the
        // contender's clock.
        if let Some(Err(error)) = unheard {
            tracing::warn!(url = self.backend.url(), %error, "releasing a dropped lock failed; it frees after its lease");
        }
    }

    async fn run(
        mut self,
        mut lease: Lease,
        mut release: oneshot::Receiver<ReleaseOrder>,
        mut requests: watch::Receiver<String>,
    ) {
        // A resumed lease (expired deadline) renews at once.
        let mut next = if lease.is_valid() {
            self.policy.next_renewal(Instant::now())
        } else {
            Instant::now()
        };
        let mut pending: Option<Pending> = None;
        let mut last_error = String::new();
        // Kept across turns of the loop (a backend's wait may hold a subscription);
        // made anew once it has resolved.
        // On a handle of its own, so that it does not hold `self` borrowed.
        let backend = self.backend.clone();
        let mut jeopardy = backend.in_jeopardy();
        loop {
            let claimed = self.state.borrow().is_held();
            tokio::select! {
                biased;
                order = &mut release => {
                    // Let a renewal in flight finish so the release is conditioned on
                    // the latest version. One still waiting for the store's bound has
                    // sent nothing: dropped.
                    if let Some(Pending::Renewing(renewal)) = pending.take() {
                        lease = renewal.await.0;
                    }
                    self.release(&lease, order.ok()).await;
                    return;
                }
                step = async { pending.as_mut().expect("guarded").step().await }, if pending.is_some() => {
                    let (renewed, result) = match step {
                        Step::Admitted(admission, ends) => {
                            pending = Some(Pending::Renewing(self.renewal(lease.clone(), admission, ends)));
                            continue;
                        }
                        Step::Ended(renewed, result) => (renewed, result),
                    };
                    pending = None;
                    if let Some(renewed) = renewed {
                        lease = renewed;
                    }
                    match result {
                        Ok(()) => {
                            next = self.policy.next_renewal(Instant::now());
                            self.deadline.send_replace(lease.deadline.instant());
                            self.revision.send_replace(lease.record.revision.clone());
                            self.publish(HolderState::Held { fence: lease.fence(), version: lease.version.clone() });
                        }
                        Err(LockError::Lost { reason, .. }) => {
                            tracing::warn!(url = self.backend.url(), %reason, "lock lost");
                            self.publish(HolderState::Lost(reason));
                            return;
                        }
                        Err(e) => {
                            tracing::debug!(url = self.backend.url(), error = %e, "renewal failed; retrying");
                            last_error = e.to_string();
                            next = Instant::now() + self.policy.retry;
                            if !lease.is_valid() {
                                self.publish(HolderState::Expiring { fence: lease.fence(), last_error: last_error.clone() });
                            }
                        }
                    }
                }
                // Rule 2: stop claiming at the deadline, even while a renewal hangs.
                _ = sleep_until(lease.deadline.instant()), if claimed => {
                    let last_error = if last_error.is_empty() { "renewal not confirmed in time".into() } else { last_error.clone() };
                    tracing::warn!(url = self.backend.url(), %last_error, "holder deadline passed before a renewal was confirmed: the lock is not relied on until one is");
                    self.publish(HolderState::Expiring { fence: lease.fence(), last_error });
                }
                _ = sleep_until(next), if pending.is_none() => {
                    pending = Some(self.admission());
                }
                // The store's connection says the claim may already be gone: renew now,
                // and let the renewal say whether it still stands.
                _ = &mut jeopardy, if claimed && pending.is_none() => {
                    jeopardy = backend.in_jeopardy();
                    pending = Some(self.admission());
                }
                // A request that came while a renewal was in flight is looked at once it
                // has answered: by then the revision asked about is no longer ours.
                Ok(()) = requests.changed(), if pending.is_none() => {
                    if *requests.borrow_and_update() == lease.record.revision {
                        pending = Some(self.admission());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{Fault, MemoryStore};
    use crate::{AcquireRequest, Attempt, CasLock, LockRecord, LockState, SafetyMargins};
    use tokio::time::timeout;

    const LEASE: Duration = Duration::from_millis(600);
    /// Generous: these tests wait for the holder task, which shares two cores.
    const PATIENCE: Duration = Duration::from_secs(20);

    fn margins() -> SafetyMargins {
        SafetyMargins {
            drift: 0.02,
            margin: Duration::from_millis(30),
            grace: Duration::from_millis(50),
        }
    }

    /// A lock acquired on a fresh in-memory store, held by its holder task, and the
    /// holder deadline of the acquisition.
    async fn held(store: &MemoryStore) -> (HeldLock, Instant) {
        let (lock, lease) = acquired(store).await;
        let deadline = lease.deadline.instant();
        let held = HeldLock::hold(Arc::new(lock), lease, RenewPolicy::for_lease(LEASE));
        (held, deadline)
    }

    /// A lock acquired on a fresh in-memory store, not held yet.
    async fn acquired(store: &MemoryStore) -> (CasLock<MemoryStore>, Lease) {
        let lock = CasLock::new(store.clone()).with_margins(margins());
        match lock.try_acquire(&AcquireRequest::new("a", LEASE)).await {
            Ok(Attempt::Acquired(lease)) => (lock, lease),
            other => panic!("{other:?}"),
        }
    }

    async fn until(held: &HeldLock, what: impl Fn(&HolderState) -> bool) -> HolderState {
        let mut state = held.watch();
        timeout(PATIENCE, state.wait_for(|s| what(s)))
            .await
            .expect("state reached in time")
            .expect("holder task alive")
            .clone()
    }

    #[tokio::test]
    async fn rule2_holder_stops_claiming_at_its_deadline_while_renewals_fail() {
        let store = MemoryStore::new("mem://held/failing");
        let (held, deadline) = held(&store).await;
        store.set_unreachable(true);
        let state = until(&held, |s| !s.is_held()).await;
        assert!(Instant::now() >= deadline, "gave up before its deadline");
        assert!(matches!(state, HolderState::Expiring { .. }), "{state:?}");
        // Nobody took over: a renewal that gets through makes it held again.
        store.set_unreachable(false);
        until(&held, HolderState::is_held).await;
        held.release().await.unwrap();
        assert_eq!(store.record().state, LockState::Released);
    }

    #[tokio::test]
    async fn rule2_holder_stops_claiming_at_its_deadline_while_a_renewal_hangs() {
        let store = MemoryStore::new("mem://held/hanging");
        let (held, deadline) = held(&store).await;
        // Each renewal hangs until the holder abandons it at its request timeout.
        for _ in 0..8 {
            store.next_write(Fault::Delay(Duration::from_secs(60)));
        }
        let state = until(&held, |s| !s.is_held()).await;
        assert!(Instant::now() >= deadline, "gave up before its deadline");
        assert!(matches!(state, HolderState::Expiring { .. }), "{state:?}");
        until(&held, HolderState::is_held).await;
    }

    #[tokio::test]
    async fn a_holder_learns_of_a_takeover_at_its_next_renewal() {
        let store = MemoryStore::new("mem://held/taken");
        let (held, _) = held(&store).await;
        let other = LockRecord::new_acquisition("b", FenceToken(2), LEASE, None);
        store.put(Ok(other));
        match until(&held, |s| matches!(s, HolderState::Lost(_))).await {
            HolderState::Lost(LostReason::TakenOver(by)) => assert_eq!(by.holder, "b"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(held.release().await, Err(LockError::Lost { .. })));
        assert_eq!(store.record().holder, "b", "the new holder is left alone");
    }

    #[test]
    fn renewals_come_due_on_a_shared_grid_never_later_than_one_interval() {
        let policy = RenewPolicy::for_lease(Duration::from_secs(30));
        let start = Instant::now();
        let mut due = std::collections::BTreeSet::new();
        // Renewals confirmed 1 ms apart over a second: ten grid points, not a thousand.
        for ms in 0..1000 {
            let now = start + Duration::from_millis(ms);
            let next = policy.next_renewal(now);
            assert!(next <= now + policy.interval, "later than its interval");
            assert!(
                next > now + policy.interval - RENEWAL_GRID,
                "brought forward by more than the grid's step"
            );
            due.insert(next);
        }
        assert!(due.len() <= 11, "{} distinct times", due.len());
        // A short interval gets a finer grid: a twentieth of it.
        let short = RenewPolicy::for_lease(Duration::from_millis(600));
        let now = Instant::now();
        assert!(short.next_renewal(now) > now + short.interval - short.interval / 20);
    }

    #[tokio::test]
    async fn an_observer_is_told_the_first_state_every_renewal_and_the_release_in_order() {
        let store = MemoryStore::new("mem://held/observed");
        let (lock, lease) = acquired(&store).await;
        let told = Arc::new(std::sync::Mutex::new(Vec::new()));
        let observer = {
            let told = told.clone();
            Box::new(move |s: &HolderState| told.lock().unwrap().push(s.clone()))
        };
        let held = HeldLock::hold_observed(
            Arc::new(lock),
            lease,
            RenewPolicy::for_lease(LEASE),
            observer,
        );
        let give_up = Instant::now() + PATIENCE;
        while told.lock().unwrap().len() < 3 {
            assert!(Instant::now() < give_up, "two renewals told");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        held.release().await.unwrap();
        let told = told.lock().unwrap().clone();
        let versions: Vec<_> = told
            .iter()
            .filter_map(|s| match s {
                HolderState::Held { version, .. } => Some(version.clone()),
                _ => None,
            })
            .collect();
        assert!(versions.len() >= 3, "{told:?}");
        assert!(
            versions.windows(2).all(|w| w[0] != w[1]),
            "each renewal told once, with its new version: {told:?}"
        );
        assert_eq!(told.last(), Some(&HolderState::Released));
    }

    /// docs/design.md §6.3, "A holder's state is published before anyone is told of
    /// it": whatever the observer is told, a reader of the lock's state already sees.
    #[tokio::test]
    async fn a_holders_state_is_published_before_the_observer_is_told_of_it() {
        let store = MemoryStore::new("mem://held/published-first");
        let (lock, lease) = acquired(&store).await;
        let reader = Arc::new(std::sync::OnceLock::<watch::Receiver<HolderState>>::new());
        // What the observer was told, and what a reader saw at that moment.
        let told = Arc::new(std::sync::Mutex::new(Vec::new()));
        let observer = {
            let (reader, told) = (reader.clone(), told.clone());
            Box::new(move |s: &HolderState| {
                if let Some(reader) = reader.get() {
                    let seen = reader.borrow().clone();
                    told.lock().unwrap().push((s.clone(), seen));
                }
            })
        };
        let held = HeldLock::hold_observed(
            Arc::new(lock),
            lease,
            RenewPolicy::for_lease(LEASE),
            observer,
        );
        reader.set(held.watch()).unwrap();
        let give_up = Instant::now() + PATIENCE;
        while told.lock().unwrap().len() < 2 {
            assert!(Instant::now() < give_up, "two renewals told");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Changes of kind, as the controller forwards them: renewals failing past the
        // deadline (`Expiring`), then one getting through (`Held` again).
        store.set_unreachable(true);
        until(&held, |s| !s.is_held()).await;
        store.set_unreachable(false);
        until(&held, HolderState::is_held).await;
        held.release().await.unwrap();
        let told = told.lock().unwrap().clone();
        assert!(
            told.iter()
                .any(|(s, _)| matches!(s, HolderState::Expiring { .. })),
            "{told:?}"
        );
        for (state, seen) in &told {
            assert_eq!(seen, state, "told of a state a reader could not see yet");
        }
    }

    #[tokio::test]
    async fn dropping_a_held_lock_releases_it() {
        let store = MemoryStore::new("mem://held/dropped");
        let (held, _) = held(&store).await;
        drop(held);
        let give_up = Instant::now() + PATIENCE;
        while store.record().state != LockState::Released {
            assert!(Instant::now() < give_up, "not released after drop");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// docs/design.md §6.3, "A renewal on the guard's request". On paused time, which
    /// jumps to the next timer when every task waits: a renewal on the schedule shows as
    /// a whole interval gone, one on request as none.
    #[tokio::test(start_paused = true)]
    async fn a_renewal_asked_for_by_the_revision_seen_comes_at_once_and_only_for_that_revision() {
        const LONG: Duration = Duration::from_secs(60);
        let store = MemoryStore::new("mem://held/asked");
        let lock = CasLock::new(store.clone()).with_margins(margins());
        let lease = match lock.try_acquire(&AcquireRequest::new("a", LONG)).await {
            Ok(Attempt::Acquired(lease)) => lease,
            other => panic!("{other:?}"),
        };
        let policy = RenewPolicy::for_lease(LONG);
        let held = HeldLock::hold(Arc::new(lock), lease, policy);
        let mut revisions = held.revision.clone();
        let acquired = held.revision();
        assert_eq!(store.record().revision, acquired, "what a reader sees");

        let asked = Instant::now();
        held.renew_if_at(&acquired);
        revisions.wait_for(|r| *r != acquired).await.unwrap();
        assert!(
            asked.elapsed() < policy.interval / 2,
            "renewed {:?} after the request: on the schedule, not on request",
            asked.elapsed()
        );
        let renewed = held.revision();
        assert_eq!(store.record().revision, renewed);
        assert!(held.is_held());

        // The revision asked about is no longer ours: no renewal until the schedule's.
        let since = Instant::now();
        held.renew_if_at(&acquired);
        held.renew_if_at("a revision never ours");
        revisions.wait_for(|r| *r != renewed).await.unwrap();
        assert!(
            since.elapsed() >= policy.interval - RENEWAL_GRID,
            "a stale request renewed after {:?}",
            since.elapsed()
        );
    }

    /// A lock on the in-memory store whose connection can be declared in jeopardy, as a
    /// ZooKeeper session's disconnect is; counts the renewals asked of it. Its requests
    /// are bounded as the AWS stores' are: `slots` admissions (bound 1), and each
    /// renewal notes whether it ran admitted and when its send counts from.
    struct Jeopardised {
        lock: CasLock<MemoryStore>,
        jeopardy: tokio::sync::Notify,
        renewals: std::sync::atomic::AtomicUsize,
        slots: tokio::sync::Semaphore,
        admitted_at: std::sync::Mutex<Vec<(bool, Instant)>>,
    }

    impl Jeopardised {
        fn new(store: &MemoryStore, slots: usize) -> Self {
            Jeopardised {
                lock: CasLock::new(store.clone()).with_margins(margins()),
                jeopardy: tokio::sync::Notify::new(),
                renewals: Default::default(),
                slots: tokio::sync::Semaphore::new(slots),
                admitted_at: Default::default(),
            }
        }
    }

    #[async_trait::async_trait]
    impl LockBackend for Jeopardised {
        fn url(&self) -> &str {
            LockBackend::url(&self.lock)
        }
        async fn try_acquire(&self, req: &crate::AcquireRequest) -> Result<Attempt, LockError> {
            self.lock.try_acquire(req).await
        }
        async fn renew(&self, lease: &mut Lease) -> Result<(), LockError> {
            self.renewals
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.admitted_at
                .lock()
                .unwrap()
                .push((crate::admission::holds(1), crate::admission::send_time()));
            self.lock.renew(lease).await
        }
        async fn admit(&self) -> Result<Option<crate::Admission>, LockError> {
            let asked = Instant::now();
            let slot = self.slots.acquire().await.expect("never closed");
            slot.forget();
            Ok(Some(crate::Admission::new(1, asked, Box::new(()))))
        }
        async fn release(&self, lease: &Lease) -> Result<(), LockError> {
            self.lock.release(lease).await
        }
        async fn inspect(&self) -> Result<Option<crate::Stored>, LockError> {
            self.lock.inspect().await
        }
        async fn resume(&self, holder: &str, nonce: &str) -> Result<Lease, LockError> {
            self.lock.resume(holder, nonce).await
        }
        async fn in_jeopardy(&self) {
            self.jeopardy.notified().await
        }
    }

    /// A lock on a fresh in-memory store behind [`Jeopardised`] with `slots`
    /// admissions, held with an hour's lease: no scheduled renewal within a test.
    async fn held_jeopardised(url: &str, slots: usize) -> (Arc<Jeopardised>, HeldLock) {
        let store = MemoryStore::new(url);
        let backend = Arc::new(Jeopardised::new(&store, slots));
        let lease_time = Duration::from_secs(3600);
        let lease = match backend
            .try_acquire(&AcquireRequest::new("a", lease_time))
            .await
        {
            Ok(Attempt::Acquired(lease)) => lease,
            other => panic!("{other:?}"),
        };
        let held = HeldLock::hold(backend.clone(), lease, RenewPolicy::for_lease(lease_time));
        (backend, held)
    }

    #[tokio::test]
    async fn a_connection_in_jeopardy_is_renewed_at_once_not_at_the_next_interval() {
        let (backend, held) = held_jeopardised("mem://held/jeopardy", 100).await;
        let renewals = || backend.renewals.load(std::sync::atomic::Ordering::SeqCst);
        let mut revision = held.revision.clone();
        for round in 1..=2 {
            assert_eq!(renewals(), round - 1);
            backend.jeopardy.notify_one();
            // The renewal's verdict stands: it got through, so the lock stays held, and
            // the next jeopardy is waited for afresh.
            timeout(PATIENCE, revision.changed())
                .await
                .expect("renewed at once")
                .unwrap();
            assert_eq!(renewals(), round);
            assert!(held.is_held());
        }
        held.release().await.unwrap();
    }

    /// docs/design.md §3, "Requests in flight are bounded": what a lock keeps while its
    /// renewal waits for the store's bound is the wait alone. The lease — its record
    /// and history — is cloned into the renewal only once the store admits it; behind
    /// an overloaded store every held lock has a renewal waiting.
    #[tokio::test]
    async fn a_renewal_waiting_for_the_stores_bound_holds_no_lease() {
        let store = MemoryStore::new("mem://held/admission-size");
        let backend: Arc<dyn LockBackend> = Arc::new(Jeopardised::new(&store, 0));
        let task = HolderTask {
            backend,
            policy: RenewPolicy::for_lease(Duration::from_secs(30)),
            state: watch::channel(HolderState::Released).0,
            deadline: watch::channel(Instant::now()).0,
            revision: watch::channel(String::new()).0,
            observer: None,
        };
        let Pending::Admitting { mut admission, .. } = task.admission() else {
            panic!("a renewal starts by waiting for its admission");
        };
        let polled =
            std::future::poll_fn(|cx| std::task::Poll::Ready(admission.as_mut().poll(cx))).await;
        assert!(polled.is_pending(), "the store's bound is full");
        let waiting = std::mem::size_of_val(&*admission);
        let lease = std::mem::size_of::<Lease>();
        assert!(
            waiting * 2 <= lease,
            "a waiting renewal is {waiting} bytes; a lease alone is {lease}"
        );
    }

    /// docs/design.md §3, "Requests in flight are bounded": a renewal waits for the
    /// store's bound before it builds its write, builds it once admitted, runs within
    /// the admission, and its send counts from when it asked (rule 2).
    #[tokio::test]
    async fn a_renewal_waits_for_the_stores_bound_before_it_builds_its_write() {
        let (backend, held) = held_jeopardised("mem://held/admission", 0).await;
        let renewals = || backend.renewals.load(std::sync::atomic::Ordering::SeqCst);
        let due = Instant::now();
        backend.jeopardy.notify_one();
        // Long against the holder task's wake-up, so the send time below tells the ask
        // from the admission on a loaded machine.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            renewals(),
            0,
            "nothing built while the store's bound is full"
        );
        assert!(held.is_held());
        let mut revision = held.revision.clone();
        backend.slots.add_permits(1);
        timeout(PATIENCE, revision.changed())
            .await
            .expect("renewed once admitted")
            .unwrap();
        let admitted = backend.admitted_at.lock().unwrap().clone();
        assert_eq!(admitted.len(), 1, "{admitted:?}");
        let (within, sent) = admitted[0];
        assert!(within, "the renewal ran within its admission");
        assert!(
            sent >= due && sent < due + Duration::from_millis(1500),
            "the send counts from the ask ({:?} after it was due), not from the admission",
            sent.saturating_duration_since(due)
        );
        backend.slots.add_permits(10);
        held.release().await.unwrap();
    }

    #[test]
    fn renew_policy_within_a_shorter_granted_lease_renews_in_time() {
        let asked = RenewPolicy {
            interval: Duration::from_secs(10),
            ..RenewPolicy::for_lease(Duration::from_secs(30))
        };
        let fitted = asked.within(Duration::from_secs(10));
        assert!(fitted.interval <= Duration::from_secs(10) / 3);
        assert!(fitted.request_timeout <= Duration::from_millis(2500));
        // A lease at least as long as asked changes nothing.
        let same = asked.within(Duration::from_secs(30));
        assert_eq!(same.interval, Duration::from_secs(10));
        assert_eq!(same.retry, asked.retry);
    }
}

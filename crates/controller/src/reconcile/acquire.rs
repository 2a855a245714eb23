//! Acquiring: one attempt per reconcile. `Held` (a holder task starts renewing), or
//! `Waiting` for the key — woken by a same-cluster release, by the store's watch where
//! it has one, else by a jittered poll — or `Failed` (`acquireTimeout`, a record
//! lockwarden does not own, permits that disagree).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::queue::Action;
use kube::runtime::events::EventType;

use super::{HELD_RESYNC, ReconcileError, Reconciling, WATCH_RECHECK, jitter};
use crate::status::{self, Desired, Occupancy};
use crate::waiters::WaitStart;
use lockwarden_api::LockPhase;
use lockwarden_api::conditions::reason;
use lockwarden_core::{
    AcquireRequest, Attempt, Ending, Lease, LockBackend, LockError, LockRecord, QueueView,
    RunCheck, RunKey,
};

/// What an attempt that found the lock held reported.
struct Busy<'a> {
    holder: &'a LockRecord,
    retry_in: Option<Duration>,
    queue_position: Option<u32>,
}

impl Reconciling<'_> {
    /// Phase: acquire, one attempt. A waiting lock keeps its backend between attempts.
    pub(super) async fn acquire(&self) -> Result<Action, ReconcileError> {
        let waiters = &self.ctx.waiters;
        let (backend, since) = match waiters.current(&self.obj, &self.uid, self.key()) {
            Some(waiting) => waiting,
            None => {
                waiters.stop_waiting(&self.obj);
                let backend = match self.connect().await {
                    Ok(backend) => backend,
                    Err(e) => return self.backend_error(ReconcileError::Connect(e)).await,
                };
                // Before waiting for the key: one that cannot remember runs never will.
                if self.spec.run.is_some()
                    && let Err(e) = backend.keeps_runs()
                {
                    return self.fail(reason::RUNS_NOT_KEPT, e.to_string()).await;
                }
                let since = self.wait_start();
                waiters.insert(&self.obj, &self.uid, self.key(), backend.clone(), since);
                (backend, since)
            }
        };
        let request = self.request();
        let attempt = self
            .ctx
            .timed(self.kind(), "acquire", backend.try_acquire(&request))
            .await;
        match attempt {
            Ok(Attempt::Acquired(lease)) => self.acquired(backend, lease, since).await,
            Ok(Attempt::Busy {
                holder,
                retry_in,
                queue_position,
            }) => {
                let busy = Busy {
                    holder: &holder,
                    retry_in,
                    queue_position,
                };
                self.busy(&backend, busy, since).await
            }
            Err(LockError::Foreign { found, .. }) => {
                waiters.stop_waiting(&self.obj);
                let message = format!(
                    "{} holds a record lockwarden does not own: {found} (set spec.force to overwrite)",
                    self.key()
                );
                self.fail(reason::FOREIGN, message).await
            }
            Err(e @ LockError::PermitsDisagree { .. }) => {
                // Permanent until the other locks on the key (or this spec) change.
                if let Some(backend) = waiters.stop_waiting(&self.obj) {
                    backend.abandon().await;
                }
                self.fail(reason::PERMITS_DISAGREE, e.to_string()).await
            }
            Err(e) => self.backend_error(ReconcileError::Store(e)).await,
        }
    }

    /// What this lock asks the store for, from the validated spec.
    fn request(&self) -> AcquireRequest {
        AcquireRequest {
            holder: self.spec.holder.clone(),
            lease: self.spec.lease,
            data: self.lock.spec.data.clone(),
            force: self.lock.spec.force,
            reclaim: false,
            permits: self.spec.permits,
            cluster: Some(self.ctx.config.cluster_name.clone()),
            lock_delay: self.spec.lock_delay,
            queue: self.spec.queue,
            // Not a DistributedLock field yet (docs/design.md §6.4).
            yield_to_pollers: None,
        }
    }

    /// When this lock began waiting for its key: `status.waitingSince` if the status
    /// says it is waiting for this key (written before a restart), else now.
    fn wait_start(&self) -> WaitStart {
        let kept = self.lock.status.as_ref().filter(|s| {
            matches!(s.phase, Some(LockPhase::Waiting | LockPhase::Pending))
                && s.key.as_deref() == Some(self.key())
        });
        match kept.and_then(|s| s.waiting_since.as_ref()) {
            Some(since) => WaitStart::resumed(SystemTime::from(since.0)),
            None => WaitStart::now(),
        }
    }

    /// The attempt acquired: start holding, report, and tell what happened.
    async fn acquired(
        &self,
        backend: Arc<dyn LockBackend>,
        lease: Lease,
        since: WaitStart,
    ) -> Result<Action, ReconcileError> {
        self.ctx.waiters.stop_waiting(&self.obj);
        if let Some((run, _)) = &self.spec.run {
            let runs = match backend.completed_runs(&lease).await {
                Ok(runs) => runs,
                Err(e) => {
                    // Unchecked, the run must not start: let go and try again.
                    if let Err(release) = backend.release(&lease).await {
                        self.ctx.release_failed(&self.obj, self.key(), &release);
                    }
                    return self.backend_error(ReconcileError::Store(e)).await;
                }
            };
            match runs.check(run) {
                RunCheck::New => self.warn_if_a_run_may_repeat(&lease, run).await,
                done => return self.run_already_done(&backend, &lease, run, done).await,
            }
        }
        self.ctx.telemetry.observe_acquire(since.elapsed());
        let task = self.start_holder(backend, lease);
        let acq = task.acquisition.clone();
        self.ctx.telemetry.count_acquired(
            &self.uid,
            self.namespace(),
            self.kind(),
            since.elapsed(),
            acq.forced_from.is_some(),
        );
        tracing::debug!(lock = %self.obj, key = %self.key(), fence = acq.fence, "acquired");
        self.ctx.holders.insert(self.obj.clone(), task);
        self.write(self.status().held(&acq, None)).await?;
        let key = self.key();
        if let Some(from) = &acq.forced_from {
            let mut note = format!("took {key} over by force from {from}; fence {}", acq.fence);
            if let Some(instead) = lockwarden_stores::terraform::force_unlock_instead(&from.nonce) {
                note.push_str(&format!("; {instead}"));
            }
            self.event(EventType::Warning, "Forced", note).await;
        }
        let mut note = format!("acquired {key} as {} with fence {}", acq.holder, acq.fence);
        if let Some(occupancy) = &acq.occupancy {
            note.push_str(&format!(" ({occupancy})"));
        }
        self.event(EventType::Normal, "Acquired", note).await;
        Ok(Action::requeue(HELD_RESYNC))
    }

    /// Granted for a new run, after the previous holder's lease ran out unreleased: if
    /// that holder had completed this run, its completion was never recorded (its
    /// release is the record), so this run may repeat it (docs/design.md §6.7, what
    /// is promised). Said with an Event; the run goes ahead.
    async fn warn_if_a_run_may_repeat(&self, lease: &Lease, run: &RunKey) {
        let history = &lease.record.history;
        let Some(previous) = history.len().checked_sub(2).map(|i| &history[i]) else {
            return;
        };
        if previous.ended != Ending::Expired {
            return;
        }
        let place = previous
            .cluster
            .as_deref()
            .map(|c| format!(" in cluster {c}"))
            .unwrap_or_default();
        let message = format!(
            "run {run} is not recorded as completed, but the previous holder {}{place} \
             (fence {}) let its lease run out without releasing: had it completed this \
             run, the completion was not recorded, and this run may repeat it",
            previous.holder, previous.fence
        );
        self.event(EventType::Warning, "RunMayRepeat", message)
            .await;
    }

    /// Granted for a run the key remembers as completed (or cannot vouch for: older than
    /// its memory reaches): let go at once, never started (docs/design.md §6.7). The
    /// status says so (`Released`, reason `RunCompleted`), which the gating reads to
    /// end the workload without running it.
    async fn run_already_done(
        &self,
        backend: &Arc<dyn LockBackend>,
        lease: &Lease,
        run: &RunKey,
        done: RunCheck,
    ) -> Result<Action, ReconcileError> {
        let why = match done {
            RunCheck::Completed(by) => by.describe(),
            RunCheck::BeyondMemory {
                oldest_kept,
                dropped,
            } => format!(
                "run {run} is not older than the oldest run {} still remembers ({}), and it \
                 has forgotten {dropped} earlier ones: it may have completed",
                self.key(),
                oldest_kept.run
            ),
            RunCheck::New => unreachable!("a new run is started"),
        };
        if let Err(e) = backend.release(lease).await {
            // Not renewed from here on: it frees after its lease.
            self.ctx.release_failed(&self.obj, self.key(), &e);
        }
        self.ctx
            .hand_off(self.key(), &self.obj, backend.last_release().await)
            .await;
        let message = format!(
            "{why}; released {} at once (fence {})",
            self.key(),
            lease.fence()
        );
        let released =
            self.status()
                .not_held(LockPhase::Released, reason::RUN_COMPLETED, message.clone());
        self.write(released).await?;
        self.event(EventType::Normal, reason::RUN_COMPLETED, message)
            .await;
        Ok(Action::await_change())
    }

    /// The attempt found the lock held: wait — on the store's watch where it has one,
    /// else polling — or give up after `acquireTimeout`.
    async fn busy(
        &self,
        backend: &Arc<dyn LockBackend>,
        busy: Busy<'_>,
        since: WaitStart,
    ) -> Result<Action, ReconcileError> {
        let Busy {
            holder,
            retry_in,
            queue_position,
        } = busy;
        tracing::debug!(lock = %self.obj, holder = %holder.holder, ?retry_in, "busy");
        let timeout = self.spec.acquire_timeout;
        let waited = since.elapsed();
        if let Some(limit) = timeout
            && waited >= limit
        {
            if let Some(backend) = self.ctx.waiters.stop_waiting(&self.obj) {
                backend.abandon().await;
            }
            let message = format!(
                "gave up after {}s waiting for {}, held by {} (fence {})",
                waited.as_secs(),
                self.key(),
                holder.holder,
                holder.fence
            );
            return self.fail(reason::ACQUIRE_TIMEOUT, message).await;
        }
        self.write(self.waiting(holder, queue_position, since))
            .await?;
        let mut pause = if backend.watches_changes() {
            self.watch_for_change(backend);
            WATCH_RECHECK
        } else {
            let poll = self.ctx.waiters.next_poll(&self.obj);
            jitter(retry_in.map_or(poll, |r| r.min(poll).max(Duration::from_millis(5))))
        };
        if let Some(limit) = timeout {
            pause = pause.min(limit.saturating_sub(waited).max(Duration::from_millis(5)));
        }
        Ok(Action::requeue(pause))
    }

    /// The `Waiting` status for a key `holder` holds: for whom (or how the permits are
    /// taken), this lock's place in the key's queue, since when it waits.
    fn waiting(
        &self,
        holder: &LockRecord,
        queue_position: Option<u32>,
        since: WaitStart,
    ) -> Desired {
        let waiting = match Occupancy::of(holder) {
            Some(occupancy) => self.status().waiting_for_permit(
                &holder.holder,
                holder.fence,
                queue_position,
                occupancy,
            ),
            None => self
                .status()
                .waiting(&holder.holder, holder.fence, queue_position),
        }
        .with_history_of(holder)
        .in_queue(
            holder
                .set
                .as_ref()
                .and_then(|set| QueueView::of_holder(set, &self.spec.holder, SystemTime::now())),
        )
        .since(Some(since.wall));
        // A write that would only move this waiter's place waits its turn (n waiters
        // must not mean n² writes per drain); the status keeps the place it shows.
        match self.lock.status.as_ref() {
            Some(current)
                if status::only_the_place_moved(self.lock, &waiting)
                    && !self
                        .ctx
                        .waiters
                        .may_show_place(&self.obj, waiting.queue_position == Some(0)) =>
            {
                waiting.keeping_place_of(current)
            }
            _ => waiting,
        }
    }

    /// Wakes this lock when the store reports a change to what it waits on (its
    /// predecessor in a ZooKeeper queue), once per change: no poll while the holder
    /// stays. A same-cluster release also wakes it directly.
    fn watch_for_change(&self, backend: &Arc<dyn LockBackend>) {
        let (backend, obj, wake) = (backend.clone(), self.obj.clone(), self.ctx.wake.clone());
        self.ctx.waiters.watch(&self.obj, move || {
            tokio::spawn(async move {
                backend.changed(WATCH_RECHECK).await;
                let _ = wake.send(obj);
            })
            .abort_handle()
        });
    }
}

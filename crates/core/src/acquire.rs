//! Acquisition with waiting: retries a backend's single attempt until a deadline,
//! woken early by backends that can watch the record.

use std::borrow::Cow;
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use super::backend::{AcquireRequest, Attempt, Lease, LockBackend};
use super::error::{HeldBy, LockError};
use super::record::LockRecord;

/// How long to wait for a lock held by someone else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Fail at once with [`LockError::Held`].
    No,
    /// Keep trying until this much time has passed, then [`LockError::Timeout`].
    For(Duration),
    Forever,
}

/// Poll interval bounds for stores without watches. The seed libraries poll once a
/// second; a waiter here starts fast and backs off, with jitter so many waiters do not
/// hit the store in step.
const POLL_MIN: Duration = Duration::from_millis(50);
const POLL_MAX: Duration = Duration::from_secs(1);

/// How long an acquisition keeps trying a store it cannot reach yet (still starting,
/// or a blip) before the store's first answer, also when it would not wait for a
/// holder; a longer wait extends it. ZooKeeper's own clients (and kafka-kit) keep
/// trying for their connect timeout in the same way.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Acquires the lock, waiting as `wait` allows, and for a store that cannot be reached
/// yet for up to [`CONNECT_TIMEOUT`] (or the wait, if longer). `on_busy` is told about
/// each attempt that found the lock held (holder and queue position), e.g. to show
/// progress.
pub async fn acquire_with_progress(
    backend: &dyn LockBackend,
    req: &AcquireRequest,
    wait: Wait,
    mut on_busy: impl FnMut(&LockRecord, Option<u32>) + Send,
) -> Result<Lease, LockError> {
    let req = without_yield_for_one_look(req, wait);
    let mut waiting = Waiting::new(wait);
    loop {
        let retry = match backend.try_acquire(&req).await {
            Ok(Attempt::Acquired(lease)) => return Ok(lease),
            Ok(Attempt::Busy {
                holder,
                retry_in,
                queue_position,
            }) => {
                on_busy(&holder, queue_position);
                waiting.after_busy(&holder, retry_in, backend.url())
            }
            Err(e) => waiting.after_error(e),
        };
        let pause = match retry {
            Ok(pause) => pause,
            Err(e) => {
                backend.abandon().await;
                return Err(e);
            }
        };
        let Some(sleep) = waiting.sleep_before_retry(pause) else {
            backend.abandon().await;
            return Err(waiting.out_of_time(backend.url()));
        };
        backend.changed(sleep).await;
        waiting.back_off();
    }
}

/// One look cannot wait out a yield to a polling tool (docs/design.md §6.4): without
/// a wait, a free key is taken as it is found.
fn without_yield_for_one_look(req: &AcquireRequest, wait: Wait) -> Cow<'_, AcquireRequest> {
    if wait == Wait::No && req.yield_to_pollers.is_some() {
        Cow::Owned(AcquireRequest {
            yield_to_pollers: None,
            ..req.clone()
        })
    } else {
        Cow::Borrowed(req)
    }
}

/// The state of one [`acquire_with_progress`] call between its attempts: the
/// deadline, the poll interval and what the attempts so far have shown.
struct Waiting {
    wait: Wait,
    started: Instant,
    /// `None`: no end.
    deadline: Option<Instant>,
    connecting_until: Instant,
    poll: Duration,
    last_holder: Option<HeldBy>,
    /// Until the store answers once, an unreachable store is retried (see
    /// [`CONNECT_TIMEOUT`]).
    answered: bool,
    /// The last error of a store never reached, while it has not answered.
    unreachable: Option<LockError>,
}

impl Waiting {
    fn new(wait: Wait) -> Self {
        let started = Instant::now();
        let deadline = match wait {
            Wait::No => Some(started),
            // A wait beyond what the clock can represent is a wait without end.
            Wait::For(d) => started.checked_add(d),
            Wait::Forever => None,
        };
        Waiting {
            wait,
            started,
            deadline,
            connecting_until: started + CONNECT_TIMEOUT,
            poll: POLL_MIN,
            last_holder: None,
            answered: false,
            unreachable: None,
        }
    }

    /// An attempt found the lock held: how long until the next one (before jitter
    /// and the deadline), or, without a wait, the error to give up with.
    fn after_busy(
        &mut self,
        holder: &LockRecord,
        retry_in: Option<Duration>,
        url: &str,
    ) -> Result<Duration, LockError> {
        self.answered = true;
        self.unreachable = None;
        let by = HeldBy::from_record(holder);
        if self.wait == Wait::No {
            return Err(LockError::Held {
                url: url.to_string(),
                by,
            });
        }
        self.last_holder = Some(by);
        // Wake right when the holder's lease could be observed expired, or at the next
        // poll, whichever is first.
        Ok(retry_in.map_or(self.poll, |r| {
            r.min(self.poll).max(Duration::from_millis(5))
        }))
    }

    /// An attempt failed: poll again while the error is transient and waiting is
    /// allowed (or the store has not answered yet); otherwise give up with it.
    fn after_error(&mut self, e: LockError) -> Result<Duration, LockError> {
        if e.is_transient() && (self.wait != Wait::No || !self.answered) {
            self.unreachable = (!self.answered).then_some(e);
            return Ok(self.poll);
        }
        Err(e)
    }

    /// How long to sleep before the next attempt: `pause` with jitter, cut at the
    /// deadline (the connect timeout's, while the store has not answered). `None`:
    /// the time is up.
    fn sleep_before_retry(&self, pause: Duration) -> Option<Duration> {
        let jittered = pause.mul_f64(rand::rng().random_range(0.8..1.2));
        let until = match self.deadline {
            Some(d) if !self.answered => Some(d.max(self.connecting_until)),
            other => other,
        };
        match until {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                (!left.is_zero()).then(|| jittered.min(left))
            }
            None => Some(jittered),
        }
    }

    /// The error once the time is up.
    fn out_of_time(self, url: &str) -> LockError {
        if let Some(e) = self.unreachable {
            // Never reached: say so, not that a holder kept the lock.
            return e;
        }
        LockError::Timeout {
            url: url.to_string(),
            waited: self.started.elapsed(),
            by: self.last_holder,
        }
    }

    fn back_off(&mut self) {
        self.poll = (self.poll.mul_f64(1.5)).min(POLL_MAX);
    }
}

/// Runs `request` (one look at the store, e.g. `inspect`) again while the store cannot
/// be reached yet, for up to [`CONNECT_TIMEOUT`]; the last error after that.
pub async fn when_reachable<T, F, Fut>(mut request: F) -> Result<T, LockError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, LockError>>,
{
    let until = Instant::now() + CONNECT_TIMEOUT;
    let mut pause = POLL_MIN;
    loop {
        match request().await {
            Err(e) if e.is_transient() && Instant::now() + pause < until => {
                tokio::time::sleep(pause).await;
                pause = pause.mul_f64(1.5).min(POLL_MAX);
            }
            other => return other,
        }
    }
}

/// Acquires the lock, waiting as `wait` allows.
pub async fn acquire(
    backend: &dyn LockBackend,
    req: &AcquireRequest,
    wait: Wait,
) -> Result<Lease, LockError> {
    acquire_with_progress(backend, req, wait, |_, _| {}).await
}

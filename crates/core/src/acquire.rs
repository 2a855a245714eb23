//! Acquisition with waiting: retries a backend's single attempt until a deadline,
//! woken early by backends that can watch the record.

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
    // One look cannot wait out a yield to a polling tool (docs/design.md §6.4): without
    // a wait, a free key is taken as it is found.
    let one_look;
    let req = if wait == Wait::No && req.yield_to_pollers.is_some() {
        one_look = AcquireRequest {
            yield_to_pollers: None,
            ..req.clone()
        };
        &one_look
    } else {
        req
    };
    let started = Instant::now();
    let deadline = match wait {
        Wait::No => Some(started),
        // A wait beyond what the clock can represent is a wait without end.
        Wait::For(d) => started.checked_add(d),
        Wait::Forever => None,
    };
    let connecting_until = started + CONNECT_TIMEOUT;
    let mut poll = POLL_MIN;
    let mut last_holder: Option<HeldBy> = None;
    // Until the store answers once, an unreachable store is retried (see above).
    let mut answered = false;
    let mut unreachable: Option<LockError>;
    loop {
        let pause = match backend.try_acquire(req).await {
            Ok(Attempt::Acquired(lease)) => return Ok(lease),
            Ok(Attempt::Busy {
                holder,
                retry_in,
                queue_position,
            }) => {
                answered = true;
                unreachable = None;
                on_busy(&holder, queue_position);
                let by = HeldBy::from_record(&holder);
                if wait == Wait::No {
                    backend.abandon().await;
                    return Err(LockError::Held {
                        url: backend.url().to_string(),
                        by,
                    });
                }
                last_holder = Some(by);
                // Wake right when the holder's lease could be observed expired, or at
                // the next poll, whichever is first.
                retry_in.map_or(poll, |r| r.min(poll).max(Duration::from_millis(5)))
            }
            Err(e) if e.is_transient() && (wait != Wait::No || !answered) => {
                unreachable = (!answered).then_some(e);
                poll
            }
            Err(e) => {
                backend.abandon().await;
                return Err(e);
            }
        };
        let jittered = pause.mul_f64(rand::rng().random_range(0.8..1.2));
        let until = match deadline {
            Some(d) if !answered => Some(d.max(connecting_until)),
            other => other,
        };
        let sleep = match until {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    backend.abandon().await;
                    if let Some(e) = unreachable {
                        // Never reached: say so, not that a holder kept the lock.
                        return Err(e);
                    }
                    return Err(LockError::Timeout {
                        url: backend.url().to_string(),
                        waited: started.elapsed(),
                        by: last_holder,
                    });
                }
                jittered.min(left)
            }
            None => jittered,
        };
        backend.changed(sleep).await;
        poll = (poll.mul_f64(1.5)).min(POLL_MAX);
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

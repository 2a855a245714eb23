//! The `lockwarden` command-line tool: s3lock's `lock` / `unlock` on every backend,
//! plus `run` (a command under a renewed lock) and `status`.
//!
//! - [`lock`]: acquire, write a lock file, exit. The lock is *not* renewed after
//!   that, so it carries a long lease (default [`lock::DEFAULT_LEASE`]); on ZooKeeper,
//!   where a lock lives as long as a session, a small background process keeps the
//!   session until `unlock` or the lease's end ([`keeper`]).
//! - [`unlock`]: release the lock a lock file describes, only if it is still that
//!   acquisition's (same nonce; the write is conditional on the file's version).
//! - [`run`]: hold the lock with heartbeats while a command runs; terminate it if the
//!   lock is lost.
//! - [`status`]: read the lock record without acquiring (every holder of a key with
//!   more than one permit).
//! - [`put`]: `put`, `get` and `delete`, fenced writes to the object a lock protects
//!   (an S3 object, a DynamoDB item), refused by the store itself for a stale fence.
//! - [`check_fence`]: whether a fence is still a current holder's (advisory, like
//!   Chubby's `CheckSequencer`).
//!
//! Every command returns an exit code; [`EXIT_CODES`] says what each means.
//!
//! Shared pieces: `args` (flags and value parsers), `errors` ([`CliError`], exit
//! codes), `output` (what commands print), `logging`.

mod args;
pub mod check_fence;
pub mod completions;
mod errors;
pub mod guard;
pub mod install;
mod keeper;
pub mod kubectl;
pub mod lock;
pub mod lockfile;
mod logging;
mod output;
mod progress;
pub mod put;
pub mod reference;
pub mod run;
pub mod status;
mod stop;
mod sys;
mod tree;
pub mod unlock;

use std::time::Duration;

pub use args::{
    BackendArgs, GlobalArgs, LogFormat, PermitArgs, QueueArgs, SharingArgs, ValueError,
    default_holder, parse_duration, parse_fence, parse_holder, parse_lease, parse_lock_delay,
    parse_nonce, parse_target, parse_wait,
};
pub use errors::{CliError, EXIT_CODES, ExitStatus, after_help, exit};
pub use logging::init_logging;
pub use output::{print_error, print_warning, report_parse_error};

use lockwarden_core::{
    AcquireRequest, HeldBy, HeldLock, Lease, LockBackend, LockError, Queue, Wait,
    acquire_with_progress,
};

/// Acquires the lock with progress on stderr. With `force` and a wait, waits first
/// and takes over only when the wait is over (as s3lock does).
pub async fn acquire(
    backend: &dyn LockBackend,
    req: &AcquireRequest,
    wait: Option<Duration>,
    mut on_busy: impl FnMut(&HeldBy, Option<u32>) + Send,
) -> Result<Lease, CliError> {
    let wait = match wait {
        Some(d) if !d.is_zero() => Wait::For(d),
        _ => Wait::No,
    };
    let polite = AcquireRequest {
        force: req.force && wait == Wait::No,
        ..req.clone()
    };
    let mut told_full = false;
    let result = acquire_with_progress(backend, &polite, wait, |record, queue| {
        // Only a queued request without a place looks at the set's size (a serialization).
        let unplaced = req.queue.is_some() && queue.is_none() && !told_full;
        if unplaced && record.set.as_ref().is_some_and(|s| s.queue_at_its_bound()) {
            // Not an error (it is granted once the queue empties), but no place either:
            // said once, so nobody takes the missing position for a fault.
            told_full = true;
            print_warning(&format!(
                "the queue of {} is at its bound ({} waiters or {} KiB): waiting without a \
                 place, granted only once the queue is empty",
                backend.url(),
                Queue::MAX_WAITERS,
                Queue::MAX_SET_BYTES / 1024
            ));
        }
        on_busy(&HeldBy::from_record(record), queue)
    })
    .await;
    match result {
        Err(LockError::Timeout { .. }) if req.force => {
            Ok(acquire_with_progress(backend, req, Wait::No, |_, _| {}).await?)
        }
        other => Ok(other?),
    }
}

/// Gives `held` back on a way out that ends in an error or exit status of its own
/// (`after` says which, for the log). A release that fails is logged with the lock's URL
/// and why, not printed: the command's own message stays its one line, and the lease
/// ends the lock. `within`: how long to wait for a store that may not answer.
pub(crate) async fn release_or_log(held: HeldLock, within: Option<Duration>, after: &str) {
    let url = held.url().to_string();
    let failed = match within {
        None => held.release().await.err().map(|e| e.to_string()),
        Some(limit) => match tokio::time::timeout(limit, held.release()).await {
            Ok(released) => released.err().map(|e| e.to_string()),
            Err(_) => Some(format!(
                "no answer within {}",
                humantime::format_duration(limit)
            )),
        },
    };
    if let Some(reason) = failed {
        tracing::warn!(%url, %reason, "releasing the lock {after} failed; its lease ends it");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    use lockwarden_core::{
        Attempt, FenceToken, HolderDeadline, LockRecord, RenewPolicy, SafetyMargins, Stored,
        Version,
    };

    /// A store that confirms every renewal and whose releases fail (`hangs`: never
    /// answer).
    struct ReleaseFails {
        hangs: bool,
    }

    #[async_trait::async_trait]
    impl LockBackend for ReleaseFails {
        fn url(&self) -> &str {
            "s3://locks/nightly"
        }
        async fn try_acquire(&self, _: &AcquireRequest) -> Result<Attempt, LockError> {
            unreachable!("the lock is held from the start")
        }
        async fn renew(&self, _: &mut Lease) -> Result<(), LockError> {
            Ok(())
        }
        async fn release(&self, _: &Lease) -> Result<(), LockError> {
            if self.hangs {
                std::future::pending::<()>().await;
            }
            Err(LockError::Unavailable {
                url: self.url().into(),
                cause: "the store is down".into(),
            })
        }
        async fn inspect(&self) -> Result<Option<Stored>, LockError> {
            Ok(None)
        }
        async fn resume(&self, _: &str, _: &str) -> Result<Lease, LockError> {
            unreachable!("nothing resumes")
        }
    }

    /// What was logged, as text.
    #[derive(Clone, Default)]
    struct Logged(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Logged {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What `release_or_log` logs for a store that fails the release that way.
    async fn logged_release(hangs: bool, within: Option<Duration>) -> String {
        let logged = Logged::default();
        let writer = logged.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let _default = tracing::subscriber::set_default(subscriber);
        let lease_for = Duration::from_secs(30);
        let record = LockRecord::new_acquisition("h", FenceToken(3), lease_for, None);
        let deadline = HolderDeadline::after_write(
            tokio::time::Instant::now(),
            lease_for,
            &SafetyMargins::default(),
        );
        let lease = Lease::new(record, Version("v1".into()), deadline);
        let held = HeldLock::hold(
            Arc::new(ReleaseFails { hangs }),
            lease,
            RenewPolicy::for_lease(lease_for),
        );
        release_or_log(held, within, "after the test").await;
        String::from_utf8(logged.0.lock().unwrap().clone()).unwrap()
    }

    #[tokio::test]
    async fn a_failed_release_is_logged_with_the_lock_and_why() {
        let logged = logged_release(false, None).await;
        for needle in [
            "WARN",
            "releasing the lock after the test failed",
            "url=s3://locks/nightly",
            "the store is down",
        ] {
            assert!(logged.contains(needle), "{needle:?} not in {logged:?}");
        }
        let logged = logged_release(true, Some(Duration::from_millis(50))).await;
        for needle in ["url=s3://locks/nightly", "no answer within 50ms"] {
            assert!(logged.contains(needle), "{needle:?} not in {logged:?}");
        }
    }
}

//! Checking a sequencer: is fence N still a current holder's on a key? (Chubby's
//! `CheckSequencer`, for a service that wants to know before doing work on a caller's
//! behalf.)
//!
//! **Advisory.** The answer is about the record as the store showed it at one read:
//! the holder may lose the lock the moment after. Only a write that the resource
//! itself refuses for a stale fence (a conditional write, docs/guide/fencing.md) is
//! safe; this check only saves work that would be refused anyway.
//!
//! **Expiry as this reader sees it.** A held record counts as current. A reader that
//! just started cannot know whether the holder's lease has run out: expiry is only
//! ever *observed*, by one version staying in place for `lease + grace` of the
//! observer's own clock (docs/design.md rule 1), and the record's wall-clock times are
//! informational. A holder that stopped renewing therefore stays current until a
//! contender takes the key over (a new, higher fence) or it releases — which is also
//! exactly when a newer fence can exist. On ZooKeeper the store itself decides: the
//! holder's entry is ephemeral and goes when its session expires.

use std::fmt;

use super::backend::LockBackend;
use super::error::{HeldBy, LockError};
use super::record::{FenceToken, LockRecord, LockState, Stored};

/// The answer for one fence on one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FenceCheck {
    /// A holder of the key carries `fence` (on a key with several permits, any one of
    /// them).
    Current { fence: FenceToken, holder: String },
    /// No holder carries `fence`: a newer holder has the key, or nobody holds it.
    NotCurrent {
        fence: FenceToken,
        /// The key's holders now; empty when nobody holds it (no record, or released).
        holders: Vec<HeldBy>,
        /// The newest fence the key's record names, when it names one (a released
        /// record keeps its holder's).
        newest: Option<FenceToken>,
    },
}

impl FenceCheck {
    pub fn is_current(&self) -> bool {
        matches!(self, FenceCheck::Current { .. })
    }

    /// The answer for `fence`, given the key's record as read (`None`: there is none).
    /// A record that is not lockwarden's — another tool's lock, or a value lockwarden
    /// does not recognise — carries no lockwarden fence: `LockError::NotFenced`.
    pub fn of(url: &str, fence: FenceToken, stored: Option<Stored>) -> Result<Self, LockError> {
        let Some(stored) = stored else {
            return Ok(FenceCheck::NotCurrent {
                fence,
                holders: Vec::new(),
                newest: None,
            });
        };
        let record = match stored.record {
            Ok(record) => record,
            Err(found) => return Err(not_fenced(url, fence, found.to_string())),
        };
        if let Some(found) = another_tools(&record) {
            return Err(not_fenced(url, fence, found));
        }
        let holders: Vec<HeldBy> = match &record.set {
            // A key with several permits: every holder in the set is current, with its
            // own fence; the record's own fence is the last one granted.
            Some(set) => set
                .holders
                .iter()
                .map(|h| HeldBy {
                    holder: h.holder.clone(),
                    fence: h.fence,
                    since: Some(h.acquired_at()),
                    nonce: h.nonce.clone(),
                })
                .collect(),
            None if record.state == LockState::Held => vec![HeldBy::from_record(&record)],
            None => Vec::new(),
        };
        if let Some(holder) = holders.iter().find(|h| h.fence == fence) {
            return Ok(FenceCheck::Current {
                fence,
                holder: holder.holder.clone(),
            });
        }
        let newest = holders
            .iter()
            .map(|h| h.fence)
            .chain(Some(record.fence))
            .chain(record.set.as_ref().map(|s| s.last_fence))
            .max();
        Ok(FenceCheck::NotCurrent {
            fence,
            holders,
            newest,
        })
    }
}

/// What another tool's record is, if `record` is one: its nonce says so (s3lock,
/// dynamolock, client-go), or it is a ZooKeeper queue entry lockwarden did not write
/// (no nonce; its holder is a description of what was found).
fn another_tools(record: &LockRecord) -> Option<String> {
    if record.by_another_tool() {
        return Some(format!("another tool's lock (holder {:?})", record.holder));
    }
    record.nonce.is_empty().then(|| record.holder.clone())
}

fn not_fenced(url: &str, fence: FenceToken, found: String) -> LockError {
    LockError::NotFenced {
        url: url.to_string(),
        fence,
        found,
    }
}

impl fmt::Display for FenceCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FenceCheck::Current { fence, holder } => {
                write!(f, "fence {fence} is current: held by {holder}")
            }
            FenceCheck::NotCurrent {
                fence,
                holders,
                newest,
            } => {
                write!(f, "fence {fence} is not current: ")?;
                if holders.is_empty() {
                    f.write_str("nobody holds the key")?;
                    if let Some(newest) = newest {
                        write!(f, " (released at fence {newest})")?;
                    }
                } else {
                    f.write_str("held by ")?;
                    for (i, h) in holders.iter().enumerate() {
                        let sep = if i == 0 { "" } else { ", " };
                        write!(f, "{sep}{} with fence {}", h.holder, h.fence)?;
                    }
                }
                // A fence above every one the record names was not granted by this
                // record's sequence: made up, or from before the record was deleted
                // (the sequence then restarts at 1, docs/design.md rule 3).
                if newest.is_some_and(|n| *fence > n) {
                    f.write_str(
                        "; the key has never granted so high a fence since its record was created",
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// Whether `fence` is still a current holder's on the key `backend` names, by one
/// read of its record ([`LockBackend::inspect`], as `status` reads it). Advisory: see
/// the module documentation.
pub async fn check_fence(
    backend: &dyn LockBackend,
    fence: FenceToken,
) -> Result<FenceCheck, LockError> {
    let stored = backend.inspect().await?;
    FenceCheck::of(backend.url(), fence, stored)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::memory::MemoryStore;
    use crate::{
        ANOTHER_TOOL_NONCE_PREFIX, AcquireRequest, Attempt, CasLock, ForeignRecord, HolderSet,
        Mode, Permits, SetEntry, Version,
    };

    async fn acquire(lock: &CasLock<MemoryStore>, holder: &str) -> crate::Lease {
        match lock
            .try_acquire(&AcquireRequest::new(holder, Duration::from_secs(30)))
            .await
            .unwrap()
        {
            Attempt::Acquired(lease) => lease,
            other => panic!("{holder} did not acquire: {other:?}"),
        }
    }

    /// The decision, through the real protocol on the in-memory store: nobody, the
    /// holder's fence, an older one, a higher one, and a released key.
    #[tokio::test]
    async fn only_a_holders_fence_is_current() {
        let store = MemoryStore::new("mem://k");
        let lock = CasLock::new(store.clone());
        let check = |n| check_fence(&lock, FenceToken(n));

        let absent = check(1).await.unwrap();
        assert!(!absent.is_current());
        assert_eq!(
            absent.to_string(),
            "fence 1 is not current: nobody holds the key"
        );

        let first = acquire(&lock, "a").await;
        let f1 = first.fence();
        assert_eq!(
            check(f1.0).await.unwrap(),
            FenceCheck::Current {
                fence: f1,
                holder: "a".into()
            }
        );
        lock.release(&first).await.unwrap();
        let released = check(f1.0).await.unwrap();
        assert_eq!(
            released.to_string(),
            format!("fence {f1} is not current: nobody holds the key (released at fence {f1})")
        );

        let second = acquire(&lock, "b").await;
        let f2 = second.fence();
        assert!(f2 > f1);
        assert!(check(f2.0).await.unwrap().is_current());
        let older = check(f1.0).await.unwrap();
        assert_eq!(
            older.to_string(),
            format!("fence {f1} is not current: held by b with fence {f2}")
        );
        let higher = check(f2.0 + 5).await.unwrap();
        assert!(!higher.is_current());
        assert!(higher.to_string().contains("never granted"), "{higher}");
    }

    /// Several permits: every holder's fence is current, a departed one's is not.
    #[test]
    fn any_holder_of_a_semaphore_is_current() {
        let entry = |holder: &str, fence: u64| {
            SetEntry::new(
                holder,
                FenceToken(fence),
                Duration::from_secs(30),
                Mode::Shared,
                None,
            )
        };
        let mut record =
            LockRecord::new_acquisition("a", FenceToken(8), Duration::from_secs(30), None);
        record.set = Some(HolderSet {
            permits: Permits::semaphore(3).total,
            holders: vec![entry("a", 6), entry("b", 8)],
            waiting_writer: None,
            queue: None,
            last_fence: FenceToken(8),
            unknown: Default::default(),
        });
        let stored = || {
            Some(Stored {
                record: Ok(record.clone()),
                version: Version("v1".into()),
            })
        };
        for (fence, holder) in [(6, "a"), (8, "b")] {
            assert_eq!(
                FenceCheck::of("u", FenceToken(fence), stored()).unwrap(),
                FenceCheck::Current {
                    fence: FenceToken(fence),
                    holder: holder.into()
                }
            );
        }
        let departed = FenceCheck::of("u", FenceToken(7), stored()).unwrap();
        assert_eq!(
            departed.to_string(),
            "fence 7 is not current: held by a with fence 6, b with fence 8"
        );
    }

    /// Another tool's lock and an unrecognised value carry no lockwarden fence: an
    /// error naming what was found, never "current".
    #[test]
    fn a_record_that_is_not_lockwardens_is_an_error() {
        // As a store reads another tool's lock (s3lock's, here): its nonce says so.
        let mut s3lock =
            LockRecord::new_acquisition("0d5e1f4c", FenceToken(1), Duration::MAX, None);
        s3lock.nonce = format!("{ANOTHER_TOOL_NONCE_PREFIX}s3lock:0d5e1f4c");
        let foreign = Stored {
            record: Ok(s3lock.clone()),
            version: Version("e1".into()),
        };
        let err = FenceCheck::of("s3://b/k", s3lock.fence, Some(foreign)).unwrap_err();
        assert!(matches!(err, LockError::NotFenced { .. }), "{err:?}");
        assert!(err.to_string().contains("another tool's lock"), "{err}");

        let garbage = Stored {
            record: Err(ForeignRecord::new("not JSON")),
            version: Version("e2".into()),
        };
        let err = FenceCheck::of("s3://b/k", FenceToken(1), Some(garbage)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "s3://b/k: cannot check fence 1: the key holds not JSON, not a lockwarden lock \
             record, so no lockwarden fence is current on it"
        );
    }
}

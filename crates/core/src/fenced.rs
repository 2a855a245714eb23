//! Fenced writes: the fence checked where the work lands (issue 29).
//!
//! A fencing token protects only if the resource being written checks it. A
//! [`FencedObject`] is one object in a store (an S3 object, a DynamoDB item, a
//! Kubernetes object) that remembers the highest [`Fence`] that wrote it and the lock
//! that fence belongs to, and refuses — atomically, in the store's own conditional
//! write (for a Kubernetes object, the API server's admission policy) — a write
//! carrying a lower fence or another lock's. On S3 and DynamoDB a delete leaves a
//! fenced tombstone rather than nothing, so a stale holder cannot recreate the object
//! as if it had never existed.
//!
//! This module is the store-independent part: the fence, what a read returns, the
//! errors and the trait. Each store of lockwarden-stores implements the trait in its
//! own folder (`<store>/fenced.rs`); its `registry::connect_fenced` picks one from a
//! target URL.
//!
//! Fenced writes are for exclusive holders: two holders of a key with several permits
//! both legitimately hold it, and each would refuse the other's writes (or not), so
//! callers check the lock's permits first (the CLI does).

use std::fmt;

use async_trait::async_trait;

use crate::{FenceToken, LockBackend, LockError, when_reachable};

/// A holder's fence: the token its acquisition carries and the lock it belongs to. The
/// lock is named by what is the same for every client of one lock (a lock URL's
/// `order_key`), since fences of different locks are unrelated numbers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Fence {
    pub token: FenceToken,
    pub lock: String,
}

impl Fence {
    pub fn new(token: u64, lock: impl Into<String>) -> Fence {
        Fence {
            token: FenceToken(token),
            lock: lock.into(),
        }
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fence {} of lock {}", self.token, self.lock)
    }
}

/// What a fenced object holds now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    /// The data, in the store's own representation: an S3 object's bytes; a DynamoDB
    /// item's attributes other than its key and the fence's, as DynamoDB JSON.
    Data(Vec<u8>),
    /// A fenced delete left a tombstone: the data is gone, the fence stays.
    Deleted,
}

/// An object as read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FencedRead {
    /// The highest fence that wrote it; `None` for an object no fenced write has
    /// touched yet (the first fenced write adopts it).
    pub written_by: Option<Fence>,
    pub content: Content,
}

/// A write the store acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    /// The version the store gave the write, where it has one (an S3 ETag); `None` for
    /// stores whose writes have no version (DynamoDB).
    pub version: Option<String>,
}

/// Why a fenced operation failed. Messages do not name the object: the caller does
/// (`s3://bucket/key: stale fence: …`).
#[derive(Debug, thiserror::Error)]
pub enum FencedError {
    /// A higher fence wrote (or deleted) the object: the caller is a stale holder.
    #[error("stale fence: object {} by fence {stored}, yours is {yours}", if *.deleted { "deleted" } else { "written" })]
    Stale {
        stored: FenceToken,
        yours: FenceToken,
        /// The higher fence's write was a delete (a tombstone).
        deleted: bool,
    },

    /// The object is fenced by another lock: fences of two locks are not comparable.
    #[error("fenced by lock {stored}: a write fenced by lock {yours} is refused")]
    OtherLock { stored: String, yours: String },

    /// The target is a lock's own record, not data a lock protects.
    #[error(
        "the object is a lock record ({what}): fenced writes go to the data a lock protects, never to a lock"
    )]
    LockRecord { what: String },

    /// The lock has several permits: its holders all legitimately hold it at once.
    #[error(
        "lock {lock} has {permits} permits: fenced writes need an exclusive holder (a key with one permit), since several permit holders all hold it at once"
    )]
    SeveralPermits { lock: String, permits: u32 },

    /// The fence is higher than any the lock has issued: a mistyped or invented fence,
    /// which, written, would lock the rightful holder out as stale.
    #[error(
        "fence {yours} was never issued by lock {lock}: its latest fence is {latest}, so a write with {yours} would make the rightful holder's writes look stale"
    )]
    NeverIssued {
        lock: String,
        yours: FenceToken,
        latest: FenceToken,
    },

    /// The lock's store keeps no lockwarden record that says which fences it issued:
    /// nobody holds the key through lockwarden now, so no fence of it is current.
    #[error("lock {lock} {why}: no fence of it can be checked, so none is accepted")]
    Unissued { lock: String, why: String },

    /// The lock's record could not be read, so the fence could not be checked.
    #[error("reading lock {lock} to check the fence: {source}")]
    LockUnreadable {
        lock: String,
        #[source]
        source: Box<LockError>,
    },

    /// The data given cannot be written (malformed DynamoDB JSON, a key attribute, …).
    #[error("invalid data: {0}")]
    InvalidData(String),

    /// Where the object is cannot hold fenced objects (yet), or its layout is not one
    /// this build understands (a table's key schema, …).
    #[error("{0}")]
    Unsupported(String),

    /// Other writers kept winning the conditional write with fences no higher than
    /// ours; the last reason is kept.
    #[error("gave up after {attempts} conditional writes lost to concurrent writers: {last}")]
    Contended { attempts: u32, last: String },

    /// The store refused or failed a request; `op` names the request.
    #[error("{op}: {detail}")]
    Store {
        op: String,
        detail: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl FencedError {
    /// Whether this is a refusal of a stale or foreign fence (a conflict the caller
    /// should stop on), rather than a failure to reach or use the store.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            FencedError::Stale { .. }
                | FencedError::OtherLock { .. }
                | FencedError::NeverIssued { .. }
                | FencedError::Unissued { .. }
        )
    }

    pub fn store(op: impl Into<String>, detail: impl Into<String>) -> FencedError {
        FencedError::Store {
            op: op.into(),
            detail: detail.into(),
            source: None,
        }
    }
}

/// Whether `fence` may write over an object whose highest writer is `stored`: the
/// same lock, and a fence at least as high (a holder writes many times with one
/// fence). `stored_deleted` says the stored state is a tombstone, for the message.
pub fn check(
    stored: Option<&Fence>,
    stored_deleted: bool,
    fence: &Fence,
) -> Result<(), FencedError> {
    let Some(stored) = stored else { return Ok(()) };
    if stored.lock != fence.lock {
        return Err(FencedError::OtherLock {
            stored: stored.lock.clone(),
            yours: fence.lock.clone(),
        });
    }
    if stored.token > fence.token {
        return Err(FencedError::Stale {
            stored: stored.token,
            yours: fence.token,
            deleted: stored_deleted,
        });
    }
    Ok(())
}

/// A holder's fence, checked against the lock it claims to come from with one read of
/// the lock's record (docs/design.md §6.5, "a fence the lock never issued"):
///
/// - a lock with several permits is refused ([`FencedError::SeveralPermits`]);
/// - a token above the lock's latest fence is refused ([`FencedError::NeverIssued`]);
/// - a lock with no lockwarden record (a free ZooKeeper key, a key deleted on release,
///   one never taken) or held by another tool is refused ([`FencedError::Unissued`]):
///   nothing says which fences it issued, and no lockwarden holder holds it now.
///
/// What it proves: the token was issued by this lock at some time. What it does not:
/// that its holder still holds the lock — the object's own check ([`check`]) refuses a
/// write once a higher fence has written, and nothing refuses a late write of the last
/// holder before anyone newer writes. `name` is what names the lock for every client
/// of it (a lock URL's `order_key`), as in [`Fence::lock`].
pub async fn issued_fence(
    lock: &dyn LockBackend,
    name: impl Into<String>,
    token: u64,
) -> Result<Fence, FencedError> {
    let name = name.into();
    let stored =
        when_reachable(|| lock.inspect())
            .await
            .map_err(|source| FencedError::LockUnreadable {
                lock: name.clone(),
                source: Box::new(source),
            })?;
    let record = match stored.map(|s| s.record) {
        Some(Ok(record)) => record,
        Some(Err(foreign)) => {
            return Err(FencedError::Unissued {
                lock: name,
                why: format!("is held by another tool ({})", foreign.what),
            });
        }
        None => {
            return Err(FencedError::Unissued {
                lock: name,
                why:
                    "has no record (a key never taken, deleted on release, or a free ZooKeeper key)"
                        .into(),
            });
        }
    };
    let latest = match &record.set {
        Some(set) if set.permits > 1 => {
            return Err(FencedError::SeveralPermits {
                lock: name,
                permits: set.permits,
            });
        }
        Some(set) => set.last_fence.max(record.fence),
        None => record.fence,
    };
    let yours = FenceToken(token);
    if yours > latest {
        return Err(FencedError::NeverIssued {
            lock: name,
            yours,
            latest,
        });
    }
    Ok(Fence::new(token, name))
}

/// How many conditional writes a put or delete makes before giving up, each lost to a
/// concurrent writer whose fence was no higher than ours (a higher one ends the race
/// with [`FencedError::Stale`] at once). Every loss is another writer's success.
pub const MAX_ATTEMPTS: u32 = 32;

/// One object in a store whose writes are fenced. Object-safe: the registry hands out
/// `Box<dyn FencedObject>` whatever the store.
#[async_trait]
pub trait FencedObject: Send + Sync {
    /// The object's URL (`s3://BUCKET/KEY`, …).
    fn url(&self) -> &str;

    /// Refuses data [`FencedObject::put`] could never write (malformed DynamoDB JSON, a
    /// manifest that is not YAML), without a request: callers check it before anything
    /// touches a store, the lock's read for [`issued_fence`] included.
    fn check_data(&self, _data: &[u8]) -> Result<(), FencedError> {
        Ok(())
    }

    /// Replaces the object's data, only if `fence` is of the lock that fenced it so far
    /// and no lower than its highest fence. Atomic: a conditional write on what was
    /// just read, re-read and retried when another write won in between.
    async fn put(&self, fence: &Fence, data: &[u8]) -> Result<Written, FencedError>;

    /// The object as stored, or `None` if there is nothing there at all.
    async fn get(&self) -> Result<Option<FencedRead>, FencedError>;

    /// Deletes the data under the same conditions as [`FencedObject::put`], leaving a
    /// tombstone with the fence.
    async fn delete(&self, fence: &Fence) -> Result<Written, FencedError>;
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::memory::MemoryStore;
    use crate::{AcquireRequest, Attempt, CasLock};

    /// Takes and releases `lock` `times` times: its latest fence is then `times`.
    async fn issue(lock: &CasLock<MemoryStore>, times: u32) {
        for _ in 0..times {
            let req = AcquireRequest::new("writer", Duration::from_secs(30));
            let Ok(Attempt::Acquired(lease)) = lock.try_acquire(&req).await else {
                panic!("a free key is acquired");
            };
            lock.release(&lease).await.unwrap();
        }
    }

    #[tokio::test]
    async fn rule10_a_fence_above_the_locks_latest_is_refused_naming_both() {
        let lock = CasLock::new(MemoryStore::new("mem://fenced/issued"));
        let err = issued_fence(&lock, "mem://fenced/issued", 1)
            .await
            .unwrap_err();
        assert!(matches!(err, FencedError::Unissued { .. }), "{err}");
        assert!(err.is_refusal());
        issue(&lock, 2).await;
        let err = issued_fence(&lock, "mem://fenced/issued", 12)
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "fence 12 was never issued by lock mem://fenced/issued: its latest fence is 2, \
             so a write with 12 would make the rightful holder's writes look stale"
        );
        assert!(err.is_refusal());
        for token in [1, 2] {
            let fence = issued_fence(&lock, "mem://fenced/issued", token)
                .await
                .unwrap();
            assert_eq!(fence, Fence::new(token, "mem://fenced/issued"));
        }
    }

    #[tokio::test]
    async fn rule10_a_lock_held_by_another_tool_issues_no_fence() {
        let store = MemoryStore::new("mem://fenced/foreign");
        store.put_body(br#"{"owner":"s3lock"}"#);
        let lock = CasLock::new(store);
        let err = issued_fence(&lock, "mem://fenced/foreign", 1)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("is held by another tool"), "{err}");
    }

    #[test]
    fn a_stale_fence_names_both_fences() {
        let stored = Fence::new(7, "s3://b/lock");
        let err = check(Some(&stored), false, &Fence::new(5, "s3://b/lock")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "stale fence: object written by fence 7, yours is 5"
        );
        assert!(err.is_refusal());
        let err = check(Some(&stored), true, &Fence::new(5, "s3://b/lock")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "stale fence: object deleted by fence 7, yours is 5"
        );
    }

    #[test]
    fn the_same_or_a_higher_fence_of_the_same_lock_may_write() {
        let stored = Fence::new(7, "s3://b/lock");
        check(None, false, &Fence::new(1, "s3://b/lock")).unwrap();
        check(Some(&stored), false, &Fence::new(7, "s3://b/lock")).unwrap();
        check(Some(&stored), true, &Fence::new(8, "s3://b/lock")).unwrap();
    }

    #[test]
    fn another_locks_fence_is_refused_whatever_its_number() {
        let stored = Fence::new(7, "s3://b/lock");
        let err = check(Some(&stored), false, &Fence::new(9, "s3://b/other")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "fenced by lock s3://b/lock: a write fenced by lock s3://b/other is refused"
        );
        assert!(err.is_refusal());
    }
}

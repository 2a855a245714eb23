//! An in-memory [`RecordStore`] for unit tests of the protocol (test builds only).
//!
//! - **Linearizable by construction**: every operation takes one mutex and completes
//!   inside it, so all operations have one total order and each sees every write
//!   before it.
//! - **Versions are unique per write**: every applied change gets the next `v<N>`,
//!   never reused, also not after a delete (like a DynamoDB record version number or
//!   the ETag of a body that carries a random revision).
//! - **Faults are injected per next operation** ([`MemoryStore::next_write`],
//!   [`MemoryStore::next_read`]): a conflict, a write that lands but whose reply is
//!   lost, a write that does not land and whose reply is lost, an unreachable store, a
//!   concurrent writer slipping in first, or time in flight.
//!
//! - **Optionally encoded** ([`MemoryStore::encoded`]): every record is kept as the
//!   JSON body S3 stores, so the record codec is in the loop — what a write carries is
//!   what the next read finds — and, as S3's 412, a failed condition does not return
//!   the current record. [`NewerBuild`] writes as a newer lockwarden would.
//!
//! Several [`crate::CasLock`]s on clones of one `MemoryStore` are contenders on
//! one key. The store only fakes the *network*; the protocol under test is the real
//! one. Real-server tests (tests/engine.rs) stay the proof for the real stores.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use super::backend::{RecordStore, StoreError};
use super::record::{ForeignRecord, LockRecord, Stored, Version};

/// What happens to the next read or write.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Nothing: the operation proceeds normally (to aim a fault at a later one).
    Pass,
    /// The store answers "condition failed" without applying the write.
    Conflict,
    /// The write applies (if its condition holds) but the reply is lost: the caller
    /// sees [`StoreError::Indeterminate`].
    IndeterminateApplied,
    /// The write does not apply and the caller sees [`StoreError::Indeterminate`].
    IndeterminateNotApplied,
    /// The request never reaches the store: [`StoreError::Unavailable`].
    Unavailable,
    /// Another writer's unconditional write lands just before this operation, which
    /// is then evaluated normally (its own condition decides).
    ConcurrentWrite(Box<Result<LockRecord, ForeignRecord>>),
    /// The request spends this long in flight before it reaches the store, then
    /// proceeds normally.
    Delay(Duration),
}

/// A lock record store in memory; clones share the same record.
#[derive(Clone)]
pub struct MemoryStore {
    url: String,
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    current: Option<Stored>,
    last_version: u64,
    /// Every state the record went through, one entry per applied change.
    history: Vec<Option<Stored>>,
    next_reads: VecDeque<Fault>,
    next_writes: VecDeque<Fault>,
    /// Every operation fails as unreachable while set.
    unreachable: bool,
    /// Records are kept as their JSON body (see [`MemoryStore::encoded`]).
    encoded: bool,
    reads: usize,
    writes: usize,
}

impl Inner {
    /// Applies a change and gives it a new version.
    fn set(&mut self, record: Option<Result<LockRecord, ForeignRecord>>) -> Version {
        self.last_version += 1;
        let version = Version(format!("v{}", self.last_version));
        self.current = record.map(|record| Stored {
            record,
            version: version.clone(),
        });
        self.history.push(self.current.clone());
        version
    }

    fn conflict(&self) -> StoreError {
        StoreError::Conflict {
            current: match self.encoded {
                true => None,
                false => self.current.clone().map(Box::new),
            },
        }
    }
}

/// The condition of a write.
enum Expect<'a> {
    Absent,
    Version(&'a Version),
}

impl MemoryStore {
    pub fn new(url: impl Into<String>) -> Self {
        MemoryStore {
            url: url.into(),
            inner: Arc::default(),
        }
    }

    /// A store that keeps every record as the JSON body S3 would store, and reads it
    /// back through the codec: fields a writer does not carry are gone. As S3 does, it
    /// answers a failed condition without the current record: the writer must read.
    pub fn encoded(url: impl Into<String>) -> Self {
        let store = MemoryStore::new(url);
        store.inner().encoded = true;
        store
    }

    /// Writes a body unconditionally, as another program would (test set-up).
    pub fn put_body(&self, body: &[u8]) -> Version {
        self.inner().set(Some(LockRecord::from_json(body)))
    }

    /// The stored record as the JSON body S3 would keep.
    pub fn body(&self) -> Option<serde_json::Value> {
        let record = self.stored()?.record.ok()?;
        Some(serde_json::from_slice(&record.to_json()).expect("a record is JSON"))
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        // A test that panicked while holding the lock fails on its own; later
        // assertions may still read the store.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The fault for the next read.
    pub fn next_read(&self, fault: Fault) -> &Self {
        self.inner().next_reads.push_back(fault);
        self
    }

    /// The fault for the next write (create, replace or delete).
    pub fn next_write(&self, fault: Fault) -> &Self {
        self.inner().next_writes.push_back(fault);
        self
    }

    /// Makes every operation fail as unreachable until set back.
    pub fn set_unreachable(&self, unreachable: bool) {
        self.inner().unreachable = unreachable;
    }

    /// The record as stored now.
    pub fn stored(&self) -> Option<Stored> {
        self.inner().current.clone()
    }

    /// The stored lockwarden record; panics if there is none or it is foreign.
    pub fn record(&self) -> LockRecord {
        match self.stored() {
            Some(Stored { record: Ok(r), .. }) => r,
            other => panic!("expected a lockwarden record, found {other:?}"),
        }
    }

    /// Every state the record went through, oldest first.
    pub fn history(&self) -> Vec<Option<Stored>> {
        self.inner().history.clone()
    }

    /// How many reads and how many writes were sent while the store was reachable
    /// (applied or not, injected faults included).
    pub fn requests(&self) -> (usize, usize) {
        let inner = self.inner();
        (inner.reads, inner.writes)
    }

    /// Writes unconditionally, as another program would (test set-up).
    pub fn put(&self, record: Result<LockRecord, ForeignRecord>) -> Version {
        self.inner().set(Some(record))
    }

    async fn fault(&self, queue: fn(&mut Inner) -> &mut VecDeque<Fault>) -> Option<Fault> {
        let fault = queue(&mut self.inner()).pop_front();
        if let Some(Fault::Delay(d)) = fault {
            tokio::time::sleep(d).await;
            return None;
        }
        fault
    }

    async fn write(
        &self,
        expect: Expect<'_>,
        change: Option<&LockRecord>,
    ) -> Result<Version, StoreError> {
        let fault = self.fault(|i| &mut i.next_writes).await;
        let mut inner = self.inner();
        if inner.unreachable {
            return Err(StoreError::Unavailable("store unreachable (test)".into()));
        }
        inner.writes += 1;
        let reply_lost = matches!(fault, Some(Fault::IndeterminateApplied));
        match fault {
            Some(Fault::Unavailable) => {
                return Err(StoreError::Unavailable("injected: unavailable".into()));
            }
            Some(Fault::Conflict) => return Err(inner.conflict()),
            Some(Fault::IndeterminateNotApplied) => {
                return Err(StoreError::Indeterminate(
                    "injected: not applied, reply lost".into(),
                ));
            }
            Some(Fault::ConcurrentWrite(other)) => {
                inner.set(Some(*other));
            }
            Some(Fault::IndeterminateApplied | Fault::Delay(_) | Fault::Pass) | None => {}
        }
        let holds = match (&expect, &inner.current) {
            (Expect::Absent, None) => true,
            (Expect::Version(v), Some(s)) => s.version == **v,
            _ => false,
        };
        if !holds {
            return Err(inner.conflict());
        }
        let version = if inner.encoded {
            inner.set(change.map(|r| LockRecord::from_json(&r.to_json())))
        } else {
            inner.set(change.cloned().map(Ok))
        };
        if reply_lost {
            return Err(StoreError::Indeterminate(
                "injected: applied, reply lost".into(),
            ));
        }
        Ok(version)
    }
}

#[async_trait]
impl RecordStore for MemoryStore {
    fn url(&self) -> &str {
        &self.url
    }

    async fn read(&self) -> Result<Option<Stored>, StoreError> {
        let fault = self.fault(|i| &mut i.next_reads).await;
        let mut inner = self.inner();
        if inner.unreachable {
            return Err(StoreError::Unavailable("store unreachable (test)".into()));
        }
        inner.reads += 1;
        match fault {
            Some(Fault::Unavailable) => Err(StoreError::Unavailable("injected".into())),
            Some(Fault::Conflict) => Err(inner.conflict()),
            Some(Fault::IndeterminateApplied) | Some(Fault::IndeterminateNotApplied) => {
                Err(StoreError::Indeterminate("injected".into()))
            }
            Some(Fault::ConcurrentWrite(other)) => {
                inner.set(Some(*other));
                Ok(inner.current.clone())
            }
            Some(Fault::Delay(_) | Fault::Pass) | None => Ok(inner.current.clone()),
        }
    }

    async fn create(&self, record: &LockRecord) -> Result<Version, StoreError> {
        self.write(Expect::Absent, Some(record)).await
    }

    async fn replace(
        &self,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StoreError> {
        self.write(Expect::Version(expected), Some(record)).await
    }

    async fn delete(&self, expected: &Version) -> Result<(), StoreError> {
        self.write(Expect::Version(expected), None).await.map(drop)
    }
}

/// A store as a newer lockwarden writes it: every record written through it carries
/// a field that this build does not know at each level — the record (`newerRecord`),
/// the holder set (`newerSet`) and `holder`'s own entries (`newerEntry`). Reading is
/// this build's: a newer build reads its own fields, kept here in `unknown`.
pub struct NewerBuild<S> {
    pub store: S,
    pub holder: String,
}

impl<S> NewerBuild<S> {
    pub fn new(store: S, holder: &str) -> Self {
        NewerBuild {
            store,
            holder: holder.to_string(),
        }
    }

    /// `record` with the newer build's fields added.
    pub fn with_newer_fields(&self, record: &LockRecord) -> LockRecord {
        let mut record = record.clone();
        record.unknown.insert("newerRecord".into(), "kept".into());
        if let Some(set) = record.set.as_mut() {
            set.unknown.insert("newerSet".into(), "kept".into());
            let ours = set.holders.iter_mut().chain(set.waiting_writer.iter_mut());
            for entry in ours.filter(|e| e.holder == self.holder) {
                entry.unknown.insert("newerEntry".into(), 1.into());
            }
        }
        record
    }
}

#[async_trait]
impl<S: RecordStore> RecordStore for NewerBuild<S> {
    fn url(&self) -> &str {
        self.store.url()
    }

    async fn admit(&self) -> Result<Option<crate::Admission>, StoreError> {
        self.store.admit().await
    }

    async fn read(&self) -> Result<Option<Stored>, StoreError> {
        self.store.read().await
    }

    async fn create(&self, record: &LockRecord) -> Result<Version, StoreError> {
        self.store.create(&self.with_newer_fields(record)).await
    }

    async fn replace(
        &self,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StoreError> {
        self.store
            .replace(expected, &self.with_newer_fields(record))
            .await
    }

    async fn delete(&self, expected: &Version) -> Result<(), StoreError> {
        self.store.delete(expected).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FenceToken;

    fn record() -> LockRecord {
        LockRecord::new_acquisition("h", FenceToken::FIRST, Duration::from_secs(5), None)
    }

    #[tokio::test]
    async fn writes_are_conditional_and_versions_never_repeat() {
        let store = MemoryStore::new("mem://k");
        let v1 = store.create(&record()).await.unwrap();
        assert!(matches!(
            store.create(&record()).await,
            Err(StoreError::Conflict { current: Some(_) })
        ));
        let v2 = store.replace(&v1, &record()).await.unwrap();
        assert!(matches!(
            store.replace(&v1, &record()).await,
            Err(StoreError::Conflict { .. })
        ));
        store.delete(&v2).await.unwrap();
        let v4 = store.create(&record()).await.unwrap();
        assert!(v4 != v1 && v4 != v2, "{v1} {v2} {v4}");
        assert_eq!(store.history().len(), 4);
    }

    #[tokio::test]
    async fn injected_faults_apply_to_the_next_operation_only() {
        let store = MemoryStore::new("mem://k");
        store.next_write(Fault::IndeterminateApplied);
        assert!(matches!(
            store.create(&record()).await,
            Err(StoreError::Indeterminate(_))
        ));
        let landed = store.stored().expect("an applied write is stored").version;
        store.next_write(Fault::IndeterminateNotApplied);
        assert!(matches!(
            store.replace(&landed, &record()).await,
            Err(StoreError::Indeterminate(_))
        ));
        assert_eq!(store.stored().unwrap().version, landed, "not applied");
        store.next_read(Fault::Unavailable);
        assert!(matches!(
            store.read().await,
            Err(StoreError::Unavailable(_))
        ));
        assert!(store.read().await.unwrap().is_some());
        store.replace(&landed, &record()).await.unwrap();
    }
}

//! Queue engines broken on purpose, to show the checker catches them (docs/safety.md,
//! "Fault-injection harness", rules (o) and (q)).
//!
//! The engine under test stays the real `CasLock`; what it reads is bent. A `Flawed`
//! store shows the engine every *other* contender's entry altered in one way and puts
//! the true values back into everything the engine writes, so the store only ever
//! holds what a real engine with that flaw would write:
//! - `JumpsTheQueue`: the other waiters look ranked behind us (lowest priority, later
//!   tickets), so the engine grants itself whenever its request fits — ahead of earlier
//!   arrivals, as an engine that ignores the queue's order would.
//! - `ObservesTheRecordVersion`: every other entry's revision looks like the record's
//!   version, so the engine's rule 1 per entry becomes "unchanged while the record is
//!   unchanged": any waiter's refresh makes a dead holder look alive.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use lockwarden::lock::{LockRecord, RecordStore, SetEntry, StoreError};
use lockwarden::lock::{Stored, Version};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flaw {
    JumpsTheQueue,
    ObservesTheRecordVersion,
}

/// Added to the tickets of the other waiters a `JumpsTheQueue` engine reads: far beyond
/// any ticket a schedule hands out.
const TICKET_OFFSET: u64 = 1 << 40;

pub struct Flawed<S> {
    inner: S,
    flaw: Flaw,
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    /// The true (priority, ticket, revision) of every other entry last read, by nonce.
    others: HashMap<String, (i32, u64, String)>,
    /// Entries this engine wrote first: its own, never bent.
    own: HashSet<String>,
}

impl<S: RecordStore> Flawed<S> {
    pub fn new(inner: S, flaw: Flaw) -> Self {
        Flawed {
            inner,
            flaw,
            seen: Mutex::new(Seen::default()),
        }
    }

    /// The record as this flawed engine sees it.
    fn bend(&self, mut stored: Stored) -> Stored {
        let version = stored.version.0.clone();
        let Ok(record) = stored.record.as_mut() else {
            return stored;
        };
        let Some(set) = record.set.as_mut() else {
            return stored;
        };
        let mut seen = self.seen.lock().unwrap();
        let Seen { others, own } = &mut *seen;
        others.clear();
        let entries = set
            .holders
            .iter_mut()
            .chain(set.queue.iter_mut().flat_map(|q| q.waiters.iter_mut()));
        for e in entries.filter(|e| !own.contains(&e.nonce)) {
            others.insert(e.nonce.clone(), (e.priority, e.ticket, e.revision.clone()));
            match self.flaw {
                Flaw::JumpsTheQueue => {
                    e.priority = i32::MIN;
                    e.ticket += TICKET_OFFSET;
                }
                Flaw::ObservesTheRecordVersion => e.revision = version.clone(),
            }
        }
        stored
    }

    /// A lost race that carries the current record: bent like a read.
    fn bend_conflict(&self, e: StoreError) -> StoreError {
        match e {
            StoreError::Conflict {
                current: Some(current),
            } => StoreError::Conflict {
                current: Some(Box::new(self.bend(*current))),
            },
            other => other,
        }
    }

    /// What the engine writes, with the other entries' true values put back.
    fn straighten(&self, record: &LockRecord) -> LockRecord {
        let mut record = record.clone();
        let mut seen = self.seen.lock().unwrap();
        let Seen { others, own } = &mut *seen;
        let Some(set) = record.set.as_mut() else {
            return record;
        };
        let entries: Vec<&mut SetEntry> = set
            .holders
            .iter_mut()
            .chain(set.queue.iter_mut().flat_map(|q| q.waiters.iter_mut()))
            .collect();
        for e in entries {
            match others.get(&e.nonce) {
                Some((priority, ticket, revision)) => {
                    e.priority = *priority;
                    e.ticket = *ticket;
                    e.revision = revision.clone();
                }
                None => {
                    own.insert(e.nonce.clone());
                }
            }
        }
        record
    }
}

#[async_trait::async_trait]
impl<S: RecordStore> RecordStore for Flawed<S> {
    fn url(&self) -> &str {
        self.inner.url()
    }

    async fn admit(&self) -> Result<Option<lockwarden::lock::Admission>, StoreError> {
        self.inner.admit().await
    }

    async fn read(&self) -> Result<Option<Stored>, StoreError> {
        Ok(self.inner.read().await?.map(|s| self.bend(s)))
    }

    async fn create(&self, record: &LockRecord) -> Result<Version, StoreError> {
        let written = self.inner.create(&self.straighten(record)).await;
        written.map_err(|e| self.bend_conflict(e))
    }

    async fn replace(
        &self,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StoreError> {
        let written = self.inner.replace(expected, &self.straighten(record)).await;
        written.map_err(|e| self.bend_conflict(e))
    }

    async fn delete(&self, expected: &Version) -> Result<(), StoreError> {
        self.inner.delete(expected).await
    }

    fn kept_tombstone_note(&self) -> Option<&'static str> {
        self.inner.kept_tombstone_note()
    }
}

//! The lock protocol on a store with conditional writes (S3, DynamoDB, Kubernetes
//! Lease). Every safety rule of DESIGN.md §3 for those stores is implemented here,
//! once; the stores only translate reads and conditional writes.

use async_trait::async_trait;
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::backend::{AcquireRequest, Attempt, Lease, LockBackend, RecordStore, StoreError};
use super::clock::{HolderDeadline, LeaseObserver, SafetyMargins};
use super::error::{HeldBy, LockError, LostReason};
use super::record::{FenceToken, LockRecord, LockState, Stored, Version};

/// How many times one `try_acquire` re-reads after losing a race before it reports
/// the lock busy.
const CONFLICT_RETRIES: usize = 3;

/// A lock on one key of a [`RecordStore`].
pub struct CasLock<S> {
    store: S,
    margins: SafetyMargins,
    delete_on_release: bool,
    state: Mutex<ContenderState>,
}

/// What a contender remembers between attempts.
#[derive(Default)]
struct ContenderState {
    /// The last record seen or written, so a warm acquire of a released key is one
    /// conditional write. Only ever used as the *condition* of a write.
    last_seen: Option<Stored>,
    /// Rule 1: how long the current holder's version has been seen unchanged.
    observer: LeaseObserver,
    /// Rule 4: an acquisition write whose outcome we never learned.
    pending: Option<(LockRecord, Instant)>,
}

impl<S: RecordStore> CasLock<S> {
    pub fn new(store: S) -> Self {
        CasLock {
            store,
            margins: SafetyMargins::default(),
            delete_on_release: false,
            state: Mutex::new(ContenderState::default()),
        }
    }

    pub fn with_margins(mut self, margins: SafetyMargins) -> Self {
        self.margins = margins;
        self
    }

    /// Delete the record after writing the release tombstone. This resets the fence
    /// sequence of the key to 1 for the next holder: only for stores where stale
    /// holders cannot write anymore.
    pub fn with_delete_on_release(mut self, delete: bool) -> Self {
        self.delete_on_release = delete;
        self
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    fn url(&self) -> String {
        self.store.url().to_string()
    }

    fn unavailable(&self, cause: impl std::fmt::Display) -> LockError {
        LockError::Unavailable {
            url: self.url(),
            cause: cause.to_string(),
        }
    }

    fn store_error(&self, e: StoreError) -> LockError {
        match e {
            StoreError::Rejected(message) => LockError::Backend {
                url: self.url(),
                message,
            },
            StoreError::Unavailable(cause) | StoreError::Indeterminate(cause) => {
                self.unavailable(cause)
            }
            StoreError::Conflict { .. } => self.unavailable("the record changed concurrently"),
        }
    }

    async fn read(&self) -> Result<Option<Stored>, LockError> {
        self.store.read().await.map_err(|e| self.store_error(e))
    }

    /// Rule 4: after a write with an unknown outcome, the store tells whether it
    /// landed — our nonce and revision in the record mean it did.
    async fn landed(&self, written: &LockRecord) -> Result<Option<Version>, LockError> {
        Ok(self.read().await?.and_then(|s| match s.record {
            Ok(r) if r.is_write_of(written) => Some(s.version),
            _ => None,
        }))
    }

    fn lease_from(&self, record: LockRecord, version: Version, sent: Instant) -> Lease {
        let deadline = HolderDeadline::after_write(sent, record.lease, &self.margins);
        Lease::new(record, version, deadline)
    }
}

/// What to do about the record currently stored.
enum Plan {
    Create,
    Replace {
        expected: Version,
        fence: FenceToken,
        forced_from: Option<HeldBy>,
    },
    Busy(LockRecord, std::time::Duration),
}

#[async_trait]
impl<S: RecordStore> LockBackend for CasLock<S> {
    fn url(&self) -> &str {
        self.store.url()
    }

    fn margins(&self) -> SafetyMargins {
        self.margins
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Attempt, LockError> {
        let mut st = self.state.lock().await;
        for _ in 0..CONFLICT_RETRIES {
            // A cached absent/released state is safe to act on: the write is
            // conditional, so a stale cache only costs a conflict. A held record is
            // always read afresh, since expiry must be observed.
            let current = match st.last_seen.take() {
                Some(s) if matches!(&s.record, Ok(r) if r.state == LockState::Released) => Some(s),
                _ => self.read().await?,
            };
            if let Some(lease) = self.adopt_pending(&mut st, current.as_ref()).await? {
                return Ok(Attempt::Acquired(lease));
            }
            let (expected, fence, forced_from) = match self.plan(req, current.as_ref(), &mut st)? {
                Plan::Busy(holder, remaining) => {
                    st.last_seen = current;
                    return Ok(Attempt::Busy {
                        holder,
                        retry_in: Some(remaining),
                        queue_position: None,
                    });
                }
                Plan::Create => (None, FenceToken::FIRST, None),
                Plan::Replace {
                    expected,
                    fence,
                    forced_from,
                } => (Some(expected), fence, forced_from),
            };
            let record =
                LockRecord::new_acquisition(&req.holder, fence, req.lease, req.data.clone());
            match self.write_acquisition(&mut st, expected, record).await? {
                Written::Acquired(mut lease) => {
                    lease.forced_from = forced_from;
                    return Ok(Attempt::Acquired(lease));
                }
                Written::LostRace => continue,
            }
        }
        // Every write lost a race; report whoever holds it now.
        match self.read().await? {
            Some(Stored { record: Ok(r), .. }) => Ok(Attempt::Busy {
                holder: r,
                retry_in: None,
                queue_position: None,
            }),
            _ => Err(self.unavailable("the record kept changing while acquiring")),
        }
    }

    async fn renew(&self, lease: &mut Lease) -> Result<(), LockError> {
        match self.renew_once(lease).await? {
            Renewed::Yes => Ok(()),
            // The record had moved on to a later write of ours whose reply was lost:
            // renew once more from that version.
            Renewed::AdoptedEarlierWrite => match self.renew_once(lease).await? {
                Renewed::Yes => Ok(()),
                Renewed::AdoptedEarlierWrite => {
                    Err(self.unavailable("the record kept changing while renewing"))
                }
            },
        }
    }

    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        let tombstone = lease.record.released();
        let outcome = self.store.replace(&lease.version, &tombstone).await;
        let version = match outcome {
            Ok(v) => v,
            Err(StoreError::Indeterminate(_)) | Err(StoreError::Conflict { .. }) => {
                match self.read().await? {
                    Some(Stored {
                        record: Ok(r),
                        version,
                    }) if r.is_write_of(&tombstone) => version,
                    current => {
                        // Our tombstone did not land and the record moved on: releasing
                        // someone else's lock would be wrong.
                        let reason = lost_reason(lease, current.as_ref());
                        return match reason {
                            // The record still is ours (an unconfirmed renewal landed):
                            // release from its version instead.
                            None => {
                                let mut adopted = lease.clone();
                                if let Some(Stored {
                                    record: Ok(r),
                                    version,
                                }) = current
                                {
                                    adopted.record = r;
                                    adopted.version = version;
                                }
                                Box::pin(self.release(&adopted)).await
                            }
                            Some(LostReason::ReleasedElsewhere) => {
                                Err(LockError::NotHeld { url: self.url() })
                            }
                            Some(reason) => Err(LockError::Lost {
                                url: self.url(),
                                reason,
                            }),
                        };
                    }
                }
            }
            Err(e) => return Err(self.store_error(e)),
        };
        let mut st = self.state.lock().await;
        if self.delete_on_release {
            match self.store.delete(&version).await {
                Ok(()) => st.last_seen = None,
                Err(_) => st.last_seen = None, // the tombstone stays; still released
            }
        } else {
            st.last_seen = Some(Stored {
                record: Ok(tombstone),
                version,
            });
        }
        Ok(())
    }

    async fn inspect(&self) -> Result<Option<Stored>, LockError> {
        self.read().await
    }

    fn note(&self, stored: &Stored) -> Option<String> {
        let released = matches!(&stored.record, Ok(r) if r.state == LockState::Released);
        (released && !self.delete_on_release)
            .then(|| self.store.kept_tombstone_note())
            .flatten()
            .map(String::from)
    }

    async fn resume(&self, holder: &str, nonce: &str) -> Result<Lease, LockError> {
        match self.read().await? {
            Some(Stored {
                record: Ok(r),
                version,
            }) if r.nonce == nonce && r.holder == holder && r.state == LockState::Held => {
                Ok(Lease::new(r, version, HolderDeadline::expired()))
            }
            current => {
                let reason = match current {
                    None => LostReason::Deleted,
                    Some(Stored {
                        record: Err(found), ..
                    }) => LostReason::Foreign(found),
                    Some(Stored { record: Ok(r), .. })
                        if r.nonce != nonce && r.state == LockState::Held =>
                    {
                        LostReason::TakenOver(HeldBy::from_record(&r))
                    }
                    Some(Stored { record: Ok(r), .. }) if r.state == LockState::Released => {
                        LostReason::ReleasedElsewhere
                    }
                    Some(_) => LostReason::NotOurs,
                };
                Err(LockError::Lost {
                    url: self.url(),
                    reason,
                })
            }
        }
    }
}

/// How one conditional acquisition write ended, when it did not fail outright.
enum Written {
    Acquired(Lease),
    /// The condition failed: someone else wrote first (or an SDK-level retry found
    /// our first try had landed; it stays pending so the next look adopts it).
    LostRace,
}

impl<S: RecordStore> CasLock<S> {
    /// Rule 4 across attempts: an earlier acquisition write whose reply was lost is
    /// found in the store, so it is ours.
    async fn adopt_pending(
        &self,
        st: &mut ContenderState,
        current: Option<&Stored>,
    ) -> Result<Option<Lease>, LockError> {
        let (Some(cur), Some((pending, sent))) = (current, &st.pending) else {
            return Ok(None);
        };
        if !matches!(&cur.record, Ok(r) if r.is_write_of(pending)) {
            return Ok(None);
        }
        let mut lease = self.lease_from(pending.clone(), cur.version.clone(), *sent);
        st.pending = None;
        if !lease.is_valid() {
            // Sent too long ago to claim on its own: confirm with a renewal.
            self.renew(&mut lease).await?;
        }
        Ok(Some(lease))
    }

    /// What to do about the record currently stored: rules 1 (observed expiry),
    /// 3 (the next fence), 5 (force is a conditional write) and 6 (foreign records).
    fn plan(
        &self,
        req: &AcquireRequest,
        current: Option<&Stored>,
        st: &mut ContenderState,
    ) -> Result<Plan, LockError> {
        let (record, version) = match current {
            None => return Ok(Plan::Create),
            Some(Stored { record, version }) => (record, version),
        };
        let r = match record {
            Ok(r) => r,
            Err(found) if !req.force => {
                return Err(LockError::Foreign {
                    url: self.url(),
                    found: found.clone(),
                });
            }
            // Nothing to continue from: a forced takeover of a foreign record starts
            // the fence sequence afresh.
            Err(_) => {
                return Ok(Plan::Replace {
                    expected: version.clone(),
                    fence: FenceToken::FIRST,
                    forced_from: None,
                });
            }
        };
        let takeover_after = self.margins.takeover_after(r.lease);
        let forced_from = if r.state == LockState::Released {
            None
        } else if req.force {
            Some(HeldBy::from_record(r))
        } else if st.observer.is_expired(version, takeover_after) {
            None
        } else {
            let remaining = st.observer.remaining(version, takeover_after);
            return Ok(Plan::Busy(r.clone(), remaining));
        };
        // Only a record written by hand ends the fence sequence; taking it over would
        // reuse its fence, so that is refused.
        let fence = r.fence.checked_next().ok_or_else(|| LockError::Backend {
            url: self.url(),
            message: format!(
                "the stored record has the last fence ({}): no later holder could carry a \
                 higher one; delete the record to start again",
                r.fence
            ),
        })?;
        Ok(Plan::Replace {
            expected: version.clone(),
            fence,
            forced_from,
        })
    }

    /// The acquisition's one conditional write (create if absent, else replace the
    /// version read), with rule 4 for a reply that never came.
    async fn write_acquisition(
        &self,
        st: &mut ContenderState,
        expected: Option<Version>,
        record: LockRecord,
    ) -> Result<Written, LockError> {
        let sent = Instant::now();
        let written = match &expected {
            None => self.store.create(&record).await,
            Some(v) => self.store.replace(v, &record).await,
        };
        match written {
            Ok(version) => {
                st.pending = None;
                st.observer.forget();
                Ok(Written::Acquired(self.lease_from(record, version, sent)))
            }
            Err(StoreError::Conflict { current }) => {
                st.pending = Some((record, sent));
                st.last_seen = current.map(|c| *c);
                Ok(Written::LostRace)
            }
            Err(StoreError::Indeterminate(cause)) => {
                st.pending = Some((record.clone(), sent));
                match self.landed(&record).await? {
                    Some(version) => {
                        st.pending = None;
                        st.observer.forget();
                        Ok(Written::Acquired(self.lease_from(record, version, sent)))
                    }
                    // Not there (yet): keep it pending, so a later attempt that finds
                    // it adopts it instead of waiting on itself.
                    None => Err(self.unavailable(format!("acquire outcome unknown: {cause}"))),
                }
            }
            Err(e) => Err(self.store_error(e)),
        }
    }
}

enum Renewed {
    Yes,
    AdoptedEarlierWrite,
}

/// What the store says about a renewal that failed or whose outcome is unknown.
enum Reconciled {
    /// The write in question landed.
    Landed(Version),
    /// The record is still at the lease's version: the write did not land (yet).
    NotApplied,
    /// The record is ours at another version: an earlier write whose reply was lost.
    Adopted(LockRecord, Version),
}

impl<S: RecordStore> CasLock<S> {
    async fn renew_once(&self, lease: &mut Lease) -> Result<Renewed, LockError> {
        let next = lease.record.renewed();
        let sent = Instant::now();
        let conflict = match self.store.replace(&lease.version, &next).await {
            Ok(version) => {
                lease.confirm(next, version, sent, &self.margins);
                return Ok(Renewed::Yes);
            }
            Err(StoreError::Conflict { .. }) => true,
            Err(StoreError::Indeterminate(_)) => false,
            Err(e) => return Err(self.store_error(e)),
        };
        match self.reconcile(lease, &next).await? {
            Reconciled::Landed(version) => {
                lease.confirm(next, version, sent, &self.margins);
                Ok(Renewed::Yes)
            }
            Reconciled::NotApplied if conflict => Err(self.unavailable(
                "the store refused a write conditioned on the version it still shows",
            )),
            Reconciled::NotApplied => {
                // It may still land: remember it, so the next renewal recognises it.
                lease.unconfirmed = Some((next, sent));
                Err(self.unavailable("renewal outcome unknown"))
            }
            Reconciled::Adopted(record, version) => {
                // Only a write we sent earlier could carry our nonce; if it is the one
                // we remembered, its send time extends the deadline.
                match lease.unconfirmed.take() {
                    Some((pending, pending_sent)) if record.is_write_of(&pending) => {
                        lease.confirm(record, version, pending_sent, &self.margins)
                    }
                    _ => {
                        lease.record = record;
                        lease.version = version;
                    }
                }
                Ok(Renewed::AdoptedEarlierWrite)
            }
        }
    }

    /// Rule 4 for a holder: reads the record to learn whether `written` landed, or
    /// whether the lock is still ours at all.
    async fn reconcile(
        &self,
        lease: &Lease,
        written: &LockRecord,
    ) -> Result<Reconciled, LockError> {
        let current = self.read().await?;
        match current {
            Some(Stored {
                record: Ok(r),
                version,
            }) if r.is_write_of(written) => Ok(Reconciled::Landed(version)),
            Some(s) if s.version == lease.version => Ok(Reconciled::NotApplied),
            Some(Stored {
                record: Ok(r),
                version,
            }) if r.nonce == lease.record.nonce && r.state == LockState::Held => {
                Ok(Reconciled::Adopted(r, version))
            }
            other => Err(LockError::Lost {
                url: self.url(),
                reason: lost_reason(lease, other.as_ref()).unwrap_or(LostReason::NotOurs),
            }),
        }
    }
}

/// Why `current` means `lease` is no longer held; `None` if it still is ours.
fn lost_reason(lease: &Lease, current: Option<&Stored>) -> Option<LostReason> {
    match current {
        None => Some(LostReason::Deleted),
        Some(Stored {
            record: Err(found), ..
        }) => Some(LostReason::Foreign(found.clone())),
        Some(Stored { record: Ok(r), .. }) if r.nonce == lease.record.nonce => match r.state {
            LockState::Held => None,
            LockState::Released => Some(LostReason::ReleasedElsewhere),
        },
        Some(Stored { record: Ok(r), .. }) if r.state == LockState::Held => {
            Some(LostReason::TakenOver(HeldBy::from_record(r)))
        }
        Some(_) => Some(LostReason::ReleasedElsewhere),
    }
}

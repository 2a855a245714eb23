//! Once per run on ZooKeeper (docs/design.md §6.7): the key's memory of completed runs
//! is a persistent znode beside the lock path, `<path>.runs` (never a child: every
//! client of the key reads the children as its queue), written in one `multi` with the
//! delete of the holder's entry.
//!
//! The queue entries are written once and vanish with their sessions, so the memory
//! cannot ride in them. A holder reads the memory after its grant: the grant was seen
//! on a children list without the previous holder's entry, whose delete committed in
//! the same transaction as that holder's write of the memory, and a ZooKeeper client
//! never reads older state than it has seen (also across reconnects). So every
//! completion recorded before the grant is in what the holder reads.

use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client::{Acls, CreateMode, Error as ZkError, MultiWriteError};

use super::cleanup::{Cleanup, spawn_cleanup};
use super::lock::ZkLock;
use super::queue::name_of;
use super::session::Generation;
use super::{definite, session_ended};
use lockwarden_core::{CompletedRun, Lease, LockError, LostReason, RunMemory};

/// How many times a recording release re-reads the memory after another writer of it
/// (another key's holder cannot write it; a tool or a person might) won a race.
const RUNS_RETRIES: usize = 5;

impl ZkLock {
    /// The znode of the key's memory of completed runs: beside the lock path.
    fn runs_path(&self) -> String {
        format!("{}.runs", self.path())
    }

    /// The memory as stored and the znode's data version; empty and `None` when the
    /// znode does not exist.
    async fn read_runs(
        &self,
        generation: &Generation,
    ) -> Result<(RunMemory, Option<i32>), LockError> {
        let read = Self::bounded(generation, generation.client.get_data(&self.runs_path())).await;
        match read {
            Ok((data, stat)) => {
                let text = String::from_utf8_lossy(&data);
                Ok((RunMemory::parse_text(&text), Some(stat.version)))
            }
            Err(ZkError::NoNode) => Ok((RunMemory::default(), None)),
            Err(e) => Err(self.error("reading the memory of completed runs", e)),
        }
    }

    /// The memory as stored now; after a grant, what the grant finds (see the
    /// module's note).
    pub(super) async fn stored_runs(&self) -> Result<RunMemory, LockError> {
        let generation = self.session.generation(&self.url).await?;
        Ok(self.read_runs(&generation).await?.0)
    }

    /// Deletes our entry and records `done` in the memory, in one `multi` conditioned
    /// on our entry's version and the memory's: both or neither. A race on the memory
    /// reads it again; a lost reply is resolved by looking for our entry and our run.
    pub(super) async fn release_recording(
        &self,
        lease: &Lease,
        done: CompletedRun,
        keep: usize,
    ) -> Result<(), LockError> {
        let entry = self.our_entry(lease).await?;
        let generation = entry.generation.clone();
        let path = self.node(&entry.name);
        let give_up = Instant::now() + generation.timeout;
        let mut races = 0;
        loop {
            if generation.is_gone() {
                return Err(self.lost(LostReason::SessionExpired));
            }
            let (memory, version) = self.read_runs(&generation).await?;
            let next = memory.with_completion(done.clone(), keep);
            let data = next.to_text().into_bytes();
            let mut multi = generation.client.new_multi_writer();
            let staged = multi
                .add_delete(&path, Some(entry.stat.version))
                .and_then(|()| match version {
                    Some(v) => multi.add_set_data(&self.runs_path(), &data, Some(v)),
                    None => multi.add_create(
                        &self.runs_path(),
                        &data,
                        &CreateMode::Persistent.with_acls(Acls::anyone_all()),
                    ),
                });
            staged.map_err(|e| self.error("preparing the release", e))?;
            let committed = tokio::time::timeout(generation.timeout, multi.commit()).await;
            match committed {
                Ok(Ok(_)) => return Ok(()),
                // Our entry: gone or rewritten — the release cannot record anything.
                Ok(Err(MultiWriteError::OperationFailed { index: 0, source })) => {
                    return Err(match source {
                        ZkError::NoNode => self.lost(LostReason::EntryGone),
                        ZkError::BadVersion => self.lost(LostReason::NotOurs),
                        e => self.error("deleting our queue entry", e),
                    });
                }
                // The memory changed (or appeared) since we read it: read it again.
                Ok(Err(MultiWriteError::OperationFailed { source, .. }))
                    if matches!(source, ZkError::BadVersion | ZkError::NodeExists)
                        && races < RUNS_RETRIES =>
                {
                    races += 1;
                    continue;
                }
                Ok(Err(MultiWriteError::OperationFailed { source, .. })) => {
                    return Err(self.error("recording the completed run", source));
                }
                Ok(Err(MultiWriteError::RequestFailed { source })) if session_ended(&source) => {
                    return Err(self.lost(LostReason::SessionExpired));
                }
                Ok(Err(MultiWriteError::RequestFailed { source })) if definite(&source) => {
                    return Err(self.error("releasing and recording the run", source));
                }
                // The outcome is unknown: did it land?
                Ok(Err(MultiWriteError::RequestFailed { .. })) | Err(_) => {
                    if let Some(landed) = self.landed(&generation, &path, &done).await {
                        return landed;
                    }
                }
            }
            if Instant::now() >= give_up {
                // Our entry must not outlive this release (it would block the queue
                // for as long as the shared session lives): deleted in the background,
                // the run then unrecorded (docs/design.md §6.7, what is promised).
                spawn_cleanup(generation, path, Cleanup::Node);
                return Err(self.unavailable(
                    "release with the completed run not confirmed; the queue entry is deleted \
                     in the background and the run is not recorded",
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// After a `multi` whose reply was lost: `Some(Ok)` when it landed (our entry gone
    /// and our run recorded), `Some(Err)` when our entry is gone without it (the
    /// session's end deleted it), `None` when it did not land (our entry is still
    /// there) or the store cannot tell yet.
    async fn landed(
        &self,
        generation: &Generation,
        path: &str,
        done: &CompletedRun,
    ) -> Option<Result<(), LockError>> {
        match Self::bounded(generation, generation.client.check_stat(path)).await {
            Ok(Some(_)) => None,
            Ok(None) => {
                let (memory, _) = self.read_runs(generation).await.ok()?;
                let ours = memory
                    .runs
                    .iter()
                    .any(|r| r.run == done.run && r.fence == done.fence);
                Some(if ours {
                    Ok(())
                } else {
                    Err(self.lost(LostReason::EntryGone))
                })
            }
            Err(_) => None,
        }
    }

    /// Our entry for `lease`, taken out of the contender's state (it is being let go).
    async fn our_entry(&self, lease: &Lease) -> Result<super::queue::Entry, LockError> {
        let mut st = self.state.lock().await;
        st.watched.clear();
        st.entry
            .take_if(|e| name_of(&lease.version) == Some(e.name.as_str()))
            .ok_or_else(|| self.lost(LostReason::EntryGone))
    }
}

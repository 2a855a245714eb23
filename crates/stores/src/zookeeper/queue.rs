//! The queue: its members (children of the lock path with a sequence suffix, lowest
//! first), our entry in it, joining it (also after a lost reply) and forcing it.

use std::sync::Arc;

use zookeeper_client::{Acls, CreateMode, Error as ZkError, Stat};

use super::cleanup::{Cleanup, spawn_cleanup};
use super::session::Generation;
use super::{ZkLock, definite, session_ended};
use lockwarden_core::{AcquireRequest, FenceToken, HeldBy, LockError, LockRecord, Version};

/// The lock name in Curator's protected form `_c_<uuid>-lock-<seq>`: Curator's
/// `InterProcessMutex` and kafka-kit use `lock-`, so all three queue together.
const LOCK_NAME: &str = "lock-";
const PROTECTED_PREFIX: &str = "_c_";

/// How many times one call re-reads a queue that changed under it (a holder leaving
/// between the listing and the read of its data) before giving up for now.
pub(super) const QUEUE_RETRIES: usize = 5;

/// ZooKeeper prints sequence numbers with at least ten digits (`%010d`); a child
/// without such a suffix is not a queue member.
const SEQUENCE_DIGITS: usize = 10;

/// Our znode in the queue.
pub(super) struct Entry {
    pub(super) generation: Arc<Generation>,
    /// `_c_<uuid>-lock-`: what the name looks like before the server appends the
    /// sequence number; identifies duplicates of this entry.
    pub(super) prefix: String,
    pub(super) name: String,
    pub(super) stat: Stat,
    pub(super) record: LockRecord,
}

/// A create whose outcome we have not learned yet (reply lost, timed out, or the
/// attempt was cancelled): a znode named `prefix…` may exist on `generation`.
pub(super) struct Pending {
    pub(super) generation: Arc<Generation>,
    pub(super) prefix: String,
    pub(super) record: LockRecord,
}

/// What one contender remembers between calls.
#[derive(Default)]
pub(super) struct Contender {
    pub(super) entry: Option<Entry>,
    pub(super) pending: Option<Pending>,
    /// The children whose change can let us in (the one just ahead of us, for a
    /// mutex), which `changed()` watches.
    pub(super) watched: Vec<String>,
}

impl Contender {
    /// Forgets queue state bound to a session that has ended: its ephemeral znodes are
    /// gone with it.
    pub(super) fn forget_ended_session(&mut self) {
        if self.entry.as_ref().is_some_and(|e| e.generation.is_gone()) {
            self.entry = None;
            self.watched.clear();
        }
        if self
            .pending
            .as_ref()
            .is_some_and(|p| p.generation.is_gone())
        {
            self.pending = None;
        }
    }
}

/// A queue member: a child of the lock path with a sequence suffix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Child {
    pub(super) name: String,
    pub(super) sequence: i64,
}

/// The sequence number a child's name ends with, if it is a queue member. Ordering is
/// by this suffix only: the protected prefix is random.
pub fn sequence_of(name: &str) -> Option<i64> {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits < SEQUENCE_DIGITS {
        return None;
    }
    name[name.len() - digits..].parse().ok()
}

/// The queue, lowest sequence first.
pub(super) fn queue_of(children: Vec<String>) -> Vec<Child> {
    let mut queue: Vec<Child> = children
        .into_iter()
        .filter_map(|name| sequence_of(&name).map(|sequence| Child { name, sequence }))
        .collect();
    queue.sort_by(|a, b| (a.sequence, &a.name).cmp(&(b.sequence, &b.name)));
    queue
}

/// A new entry's protected prefix (`_c_<uuid>-lock-`) and the record it carries.
fn new_entry(generation: &Generation, req: &AcquireRequest) -> (String, LockRecord) {
    (
        format!("{PROTECTED_PREFIX}{}-{LOCK_NAME}", uuid::Uuid::new_v4()),
        super::semaphore::entry_record(
            LockRecord::new_acquisition(
                &req.holder,
                FenceToken(0),
                generation.timeout,
                req.data.clone(),
            ),
            req.permits,
        ),
    )
}

/// The znode name a [`Version`] of this backend names.
pub(super) fn name_of(version: &Version) -> Option<&str> {
    version.0.rsplit_once(':').map(|(name, _)| name)
}

pub(super) fn version_of(name: &str, stat: &Stat) -> Version {
    Version(format!("{name}:{}", stat.version))
}

impl ZkLock {
    /// The queue, lowest first; empty when the lock path does not exist.
    pub(super) async fn queue(&self, generation: &Generation) -> Result<Vec<Child>, ZkError> {
        match Self::bounded(generation, generation.client.list_children(&self.dir)).await {
            Ok(children) => Ok(queue_of(children)),
            Err(ZkError::NoNode) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// A child's data and stat; `None` when it is gone.
    pub(super) async fn read(
        &self,
        generation: &Generation,
        name: &str,
    ) -> Result<Option<(Vec<u8>, Stat)>, ZkError> {
        match Self::bounded(generation, generation.client.get_data(&self.node(name))).await {
            Ok(found) => Ok(Some(found)),
            Err(ZkError::NoNode) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates the lock path: ancestors as persistent znodes, the lock path itself as
    /// a container, which the server removes once its last child is gone, so
    /// short-lived lock names do not pile up.
    async fn ensure_dir(&self, generation: &Generation) -> Result<(), ZkError> {
        let open = Acls::anyone_all();
        if let Some((parent, _)) = self.dir.rsplit_once('/')
            && !parent.is_empty()
        {
            Self::bounded(
                generation,
                generation
                    .client
                    .mkdir(parent, &CreateMode::Persistent.with_acls(open)),
            )
            .await?;
        }
        let create = |mode: CreateMode| {
            Self::bounded(
                generation,
                generation
                    .client
                    .create(&self.dir, &[], &mode.with_acls(Acls::anyone_all())),
            )
        };
        match create(CreateMode::Container).await {
            Ok(_) | Err(ZkError::NodeExists) => Ok(()),
            // Servers before 3.5 have no containers.
            Err(ZkError::Unimplemented) => match create(CreateMode::Persistent).await {
                Ok(_) | Err(ZkError::NodeExists) => Ok(()),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// Looks for the znode a create with this protected prefix may have left. Keeps
    /// the lowest and deletes any duplicate.
    async fn find_own(
        &self,
        generation: &Arc<Generation>,
        prefix: &str,
        record: &LockRecord,
    ) -> Result<Option<Entry>, ZkError> {
        // A read served by a follower may lag behind the leader, which may already
        // have applied our create: `sync` first, or we would create a second entry.
        match Self::bounded(generation, generation.client.sync(&self.dir)).await {
            Ok(()) | Err(ZkError::NoNode) => {}
            Err(e) => return Err(e),
        }
        let ours: Vec<Child> = self
            .queue(generation)
            .await?
            .into_iter()
            .filter(|c| c.name.starts_with(prefix))
            .collect();
        for child in &ours {
            let Some(stat) = Self::bounded(
                generation,
                generation.client.check_stat(&self.node(&child.name)),
            )
            .await?
            else {
                continue;
            };
            if stat.ephemeral_owner != generation.id {
                continue;
            }
            for duplicate in ours.iter().filter(|c| c.name != child.name) {
                spawn_cleanup(
                    generation.clone(),
                    self.node(&duplicate.name),
                    Cleanup::Node,
                );
            }
            return Ok(Some(Entry {
                generation: generation.clone(),
                prefix: prefix.to_string(),
                name: child.name.clone(),
                stat,
                record: record.clone(),
            }));
        }
        Ok(None)
    }

    /// Puts this contender in the queue (or finds the entry a lost reply left).
    pub(super) async fn enqueue(
        &self,
        generation: &Arc<Generation>,
        st: &mut Contender,
        req: &AcquireRequest,
    ) -> Result<Entry, LockError> {
        let (prefix, record) = match st.pending.take() {
            Some(pending) if Arc::ptr_eq(&pending.generation, generation) => {
                match self
                    .find_own(generation, &pending.prefix, &pending.record)
                    .await
                {
                    Ok(Some(entry)) => return Ok(entry),
                    Ok(None) => (pending.prefix, pending.record),
                    Err(e) => {
                        st.pending = Some(pending);
                        return Err(self.error("looking for our queue entry", e));
                    }
                }
            }
            _ => new_entry(generation, req),
        };
        self.create_entry(generation, st, prefix, record).await
    }

    /// Creates our entry (ephemeral, sequential, under its protected `prefix`). Each
    /// outcome of the create decides what `pending` must remember, next to the create.
    async fn create_entry(
        &self,
        generation: &Arc<Generation>,
        st: &mut Contender,
        prefix: String,
        record: LockRecord,
    ) -> Result<Entry, LockError> {
        let data = super::kafka_kit::entry_data(&record);
        let path = self.node(&prefix);
        let mode = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        for _ in 0..QUEUE_RETRIES {
            // Remembered *before* sending: if this future is dropped mid-request, or the
            // reply is lost, the next attempt (or abandon/drop) finds the znode.
            st.pending = Some(Pending {
                generation: generation.clone(),
                prefix: prefix.clone(),
                record: record.clone(),
            });
            let created =
                Self::bounded(generation, generation.client.create(&path, &data, &mode)).await;
            match created {
                Ok((stat, sequence)) => {
                    st.pending = None;
                    return Ok(Entry {
                        generation: generation.clone(),
                        name: format!("{prefix}{sequence}"),
                        prefix,
                        stat,
                        record,
                    });
                }
                Err(ZkError::NoNode) => {
                    st.pending = None;
                    if let Err(e) = self.ensure_dir(generation).await {
                        return Err(self.error("creating the lock path", e));
                    }
                }
                Err(e) if session_ended(&e) => {
                    // Whatever was created died with the session.
                    st.pending = None;
                    return Err(self.unavailable(format!(
                        "ZooKeeper session ended while joining the queue ({e}); a new session is opened on the next attempt"
                    )));
                }
                Err(e) if definite(&e) => {
                    st.pending = None;
                    return Err(self.error("joining the queue", e));
                }
                Err(e) => {
                    // Rule 4 the Curator way: the create may have landed; look for our
                    // protected name before creating another.
                    tracing::debug!(url = %self.url, error = %e, "queue entry create outcome unknown; looking for it");
                    match self.find_own(generation, &prefix, &record).await {
                        Ok(Some(entry)) => {
                            st.pending = None;
                            return Ok(entry);
                        }
                        Ok(None) => {}
                        Err(find) => {
                            return Err(self.unavailable(format!(
                                "joining the queue: {e}; then looking for our entry: {find}"
                            )));
                        }
                    }
                }
            }
        }
        Err(self.unavailable("could not join the queue; retrying"))
    }

    /// Force: deletes every child ahead of us, each conditioned on the version just
    /// read, and returns who held the lock.
    pub(super) async fn force_ahead(
        &self,
        generation: &Generation,
        ahead: &[Child],
    ) -> Result<Option<HeldBy>, LockError> {
        let mut forced_from = None;
        for (i, child) in ahead.iter().enumerate() {
            let Some((data, stat)) = self
                .read(generation, &child.name)
                .await
                .map_err(|e| self.error("reading a queue entry to force", e))?
            else {
                continue;
            };
            let stored = Self::stored(&child.name, &data, &stat);
            let holder = Self::holder_record(&child.name, stored, &stat, generation.timeout);
            let deleted = Self::bounded(
                generation,
                generation
                    .client
                    .delete(&self.node(&child.name), Some(stat.version)),
            )
            .await;
            match deleted {
                Ok(()) | Err(ZkError::NoNode) => {}
                // Changed since we read it: the caller lists again and retries.
                Err(ZkError::BadVersion) => continue,
                Err(e) => return Err(self.error("deleting a queue entry to force", e)),
            }
            tracing::warn!(url = %self.url, entry = %child.name, holder = %holder.holder, "forced: deleted a queue entry ahead of us");
            if i == 0 {
                forced_from = Some(HeldBy::from_record(&holder));
            }
        }
        Ok(forced_from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_orders_by_sequence_suffix_not_name() {
        let queue = queue_of(vec![
            "_c_ffff-lock-0000000003".into(),
            "_c_0000-lock-0000000010".into(),
            "config".into(),
            "lock-0000000001".into(),
            "x-12".into(),
            "_c_aaaa-lock-0000000002".into(),
        ]);
        let names: Vec<&str> = queue.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "lock-0000000001",
                "_c_aaaa-lock-0000000002",
                "_c_ffff-lock-0000000003",
                "_c_0000-lock-0000000010"
            ]
        );
        // 64-bit sequences (19 digits) still parse; overflow is not a queue member.
        assert_eq!(sequence_of("n-0000000004294967296"), Some(4294967296));
        assert_eq!(sequence_of("n-99999999999999999999"), None);
    }

    #[test]
    fn version_names_the_znode() {
        let stat = Stat {
            czxid: 7,
            mzxid: 7,
            pzxid: 7,
            ctime: 0,
            mtime: 0,
            version: 3,
            cversion: 0,
            aversion: 0,
            ephemeral_owner: 1,
            data_length: 0,
            num_children: 0,
        };
        let v = version_of("_c_x-lock-0000000001", &stat);
        assert_eq!(v.0, "_c_x-lock-0000000001:3");
        assert_eq!(name_of(&v), Some("_c_x-lock-0000000001"));
    }
}

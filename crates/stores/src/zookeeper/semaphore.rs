//! More than one holder on one queue (docs/design.md §6.2): the Curator-style grant
//! rule over the queue of sequential entries, and what a lockwarden entry says about
//! the permits and mode it asked for.
//!
//! For an entry with `ahead` entries before it in sequence order:
//! - exclusive (a writer, or a mutex): granted iff nothing is ahead;
//! - shared (a reader, or a semaphore holder): granted iff no exclusive entry is ahead
//!   and fewer than `permits` entries are ahead.
//!
//! Entries that are not lockwarden records (kafka-kit, Curator) count as exclusive. A
//! waiting writer thus blocks every reader behind it (FIFO, no writer starvation), and
//! the granted entries are always a prefix of the queue: since new entries only ever
//! join at the back, the entries ahead of ours only leave, and a grant, once seen,
//! holds until our entry goes.

use std::sync::Arc;

use zookeeper_client::{Error as ZkError, MultiReadResult, Stat};

use super::ZkLock;
use super::queue::Child;
use super::session::Generation;
use lockwarden_core::{HolderSet, LockRecord, Mode, Permits, SetEntry, Stored, holder_summary};

/// A queue member with its data, as read at one moment.
pub(super) struct Member {
    pub(super) name: String,
    pub(super) stat: Stat,
    /// Ours (fence = `czxid`), or what else was found.
    pub(super) stored: Stored,
}

impl Member {
    /// How this entry takes the key: what a lockwarden entry asked for; anything else
    /// (a mutex, another client's entry) is exclusive.
    pub(super) fn mode(&self) -> Mode {
        match &self.stored.record {
            Ok(LockRecord { set: Some(set), .. }) => {
                set.holders.first().map_or(Mode::Exclusive, |h| h.mode)
            }
            _ => Mode::Exclusive,
        }
    }

    /// The permits a lockwarden entry named (a mutex names 1); `None` for another
    /// client's entry, which names none.
    pub(super) fn permits(&self) -> Option<u32> {
        match &self.stored.record {
            Ok(record) => Some(record.set.as_ref().map_or(1, |set| set.permits)),
            Err(_) => None,
        }
    }

    /// This entry as one holder of a set (its own, with fence = `czxid`).
    fn set_entry(&self) -> Option<SetEntry> {
        let record = self.stored.record.as_ref().ok()?;
        let entry = match record.set.as_ref().and_then(|s| s.holders.first()) {
            Some(entry) => entry.clone(),
            // A lockwarden mutex entry in a semaphore's queue (it is about to leave,
            // refused for disagreeing): an exclusive holder all the same.
            None => set_entry_of(record, Mode::Exclusive),
        };
        Some(SetEntry {
            fence: record.fence,
            ..entry
        })
    }
}

/// Where an entry stands in the queue.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    Granted,
    Waiting {
        /// How many of the entries ahead must leave before ours is granted (≥ 1).
        departures: usize,
        /// Indices (into the entries ahead) of the entries to watch: ours cannot be
        /// granted before one of them changes.
        watch: Vec<usize>,
    },
}

/// The grant rule for an entry taking `permits` in `mode`, behind entries of the
/// given modes (in queue order).
pub(super) fn verdict(ahead: &[Mode], permits: Permits) -> Verdict {
    let total = permits.total.max(1) as usize;
    let exclusive = permits.is_mutex() || permits.mode == Mode::Exclusive;
    if ahead.is_empty() {
        return Verdict::Granted;
    }
    if exclusive {
        // Everyone ahead must go; the one just ahead goes last.
        return Verdict::Waiting {
            departures: ahead.len(),
            watch: vec![ahead.len() - 1],
        };
    }
    // Beyond the writers ahead, the count: fewer than `total` may be left ahead.
    let by_count = (ahead.len() + 1).saturating_sub(total);
    match ahead.iter().rposition(|m| *m == Mode::Exclusive) {
        // Every writer ahead must go, the nearest one (which waits for all the others
        // ahead of it) included.
        Some(nearest) => Verdict::Waiting {
            departures: (nearest + 1).max(by_count),
            watch: vec![nearest],
        },
        None if ahead.len() < total => Verdict::Granted,
        // Only readers ahead: the first `total` of them hold the permits, and one of
        // them must leave (the waiting ones ahead leaving is not enough).
        None => Verdict::Waiting {
            departures: by_count,
            watch: (0..total).collect(),
        },
    }
}

/// The permits named by the first lockwarden entry ahead that disagrees with ours.
pub(super) fn disagreement(ahead: &[Member], permits: Permits) -> Option<u32> {
    ahead
        .iter()
        .filter_map(Member::permits)
        .find(|theirs| *theirs != permits.total)
}

/// The record our entry carries: for a key with more than one permit, a holder set
/// with this contender alone in it, which is how other lockwarden contenders learn the
/// permits and mode it asked for. A mutex entry is today's record.
pub(super) fn entry_record(record: LockRecord, permits: Permits) -> LockRecord {
    if permits.is_mutex() {
        return record;
    }
    let entry = set_entry_of(&record, permits.mode);
    LockRecord {
        set: Some(HolderSet {
            permits: permits.total,
            holders: vec![entry],
            ..HolderSet::default()
        }),
        ..record
    }
}

/// A lockwarden record read from an entry, with the entry's `czxid` as its fence (in
/// the record and in its holder-set entry).
pub(super) fn fenced(mut record: LockRecord, stat: &Stat) -> LockRecord {
    record.fence = Generation::fence_of(stat);
    if let Some(set) = record.set.as_mut() {
        for holder in &mut set.holders {
            holder.fence = record.fence;
        }
    }
    record
}

/// The permits and mode a lockwarden record asked for.
pub(super) fn permits_of(record: &LockRecord) -> Permits {
    match &record.set {
        None => Permits::MUTEX,
        Some(set) => Permits {
            total: set.permits,
            mode: set.holders.first().map_or(Mode::Exclusive, |h| h.mode),
        },
    }
}

/// What `inspect` reports for a semaphore queue (its head names more than one
/// permit): the head's record, with every granted lockwarden entry as a holder and
/// the first waiting entry, if it is a lockwarden writer, as the waiting writer.
pub(super) fn summary(members: &[Member], permits: u32) -> Option<Stored> {
    let head = members.first()?;
    let mut record = head.stored.record.clone().ok()?;
    let modes: Vec<Mode> = members.iter().map(Member::mode).collect();
    let mut set = HolderSet {
        permits,
        ..HolderSet::default()
    };
    for (i, member) in members.iter().enumerate() {
        let asked = Permits {
            total: permits,
            mode: modes[i],
        };
        if verdict(&modes[..i], asked) == Verdict::Granted {
            set.holders.extend(member.set_entry());
        } else {
            set.waiting_writer = member.set_entry().filter(|e| e.mode == Mode::Exclusive);
            break;
        }
    }
    set.last_fence = set
        .holders
        .iter()
        .map(|h| h.fence)
        .max()
        .unwrap_or_default();
    // Named as the other stores name a set: every granted holder, not the head alone.
    if !set.holders.is_empty() {
        record.holder = holder_summary(&set);
    }
    record.set = Some(set);
    Some(Stored {
        record: Ok(record),
        version: head.stored.version.clone(),
    })
}

impl ZkLock {
    /// Reads every child's data in one round trip (a multi-read, served as one
    /// snapshot). Children gone meanwhile are left out: a queue entry never comes back.
    pub(super) async fn members(
        &self,
        generation: &Arc<Generation>,
        children: &[Child],
    ) -> Result<Vec<Member>, ZkError> {
        if children.is_empty() {
            return Ok(Vec::new());
        }
        let mut reader = generation.client.new_multi_reader();
        for child in children {
            reader.add_get_data(&self.node(&child.name))?;
        }
        let results = Self::bounded(generation, reader.commit()).await?;
        let mut members = Vec::with_capacity(children.len());
        for (child, result) in children.iter().zip(results) {
            match result {
                MultiReadResult::Data { data, stat } => members.push(Member {
                    stored: Self::stored(&child.name, &data, &stat),
                    name: child.name.clone(),
                    stat,
                }),
                MultiReadResult::Error {
                    err: ZkError::NoNode,
                } => {}
                MultiReadResult::Error { err } => return Err(err),
                _ => {
                    return Err(ZkError::UnexpectedError(
                        "a data read answered with children".into(),
                    ));
                }
            }
        }
        Ok(members)
    }
}

/// A lockwarden record as one holder of a set: the same acquisition (nonce, times).
fn set_entry_of(record: &LockRecord, mode: Mode) -> SetEntry {
    SetEntry {
        nonce: record.nonce.clone(),
        revision: record.revision.clone(),
        acquired_at_ms: unix_ms(record.acquired_at),
        renewed_at_ms: unix_ms(record.renewed_at),
        ..SetEntry::new(
            &record.holder,
            record.fence,
            record.lease,
            mode,
            record.data.clone(),
        )
    }
}

fn unix_ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Mode::{Exclusive as X, Shared as S};

    fn shared(total: u32) -> Permits {
        Permits::semaphore(total)
    }

    fn writer(total: u32) -> Permits {
        Permits {
            total,
            mode: Mode::Exclusive,
        }
    }

    fn waiting(departures: usize, watch: &[usize]) -> Verdict {
        Verdict::Waiting {
            departures,
            watch: watch.to_vec(),
        }
    }

    #[test]
    fn a_semaphore_grants_the_first_permits_entries() {
        assert_eq!(verdict(&[], shared(3)), Verdict::Granted);
        assert_eq!(verdict(&[S, S], shared(3)), Verdict::Granted);
        // Three hold; the fourth waits for one of them.
        assert_eq!(verdict(&[S, S, S], shared(3)), waiting(1, &[0, 1, 2]));
        // Two waiting readers ahead as well: three must leave, still only the holders
        // are worth watching.
        assert_eq!(verdict(&[S, S, S, S, S], shared(3)), waiting(3, &[0, 1, 2]));
    }

    fn stat(czxid: i64) -> Stat {
        Stat {
            czxid,
            mzxid: czxid,
            pzxid: czxid,
            ctime: 1_700_000_000_000,
            mtime: 1_700_000_000_000,
            version: 0,
            cversion: 0,
            aversion: 0,
            ephemeral_owner: 7,
            data_length: 0,
            num_children: 0,
        }
    }

    /// A queue member as `members` reads it, written by a contender asking `permits`.
    fn member(seq: i64, holder: &str, permits: Permits) -> Member {
        let record = LockRecord::new_acquisition(
            holder,
            lockwarden_core::FenceToken(0),
            std::time::Duration::from_secs(10),
            None,
        );
        let data = super::super::kafka_kit::entry_data(&entry_record(record, permits));
        let name = format!("_c_{holder}-lock-{seq:010}");
        let stat = stat(100 + seq);
        Member {
            stored: ZkLock::stored(&name, &data, &stat),
            name,
            stat,
        }
    }

    #[test]
    fn an_entry_says_its_permits_and_mode_and_reads_back_with_its_czxid() {
        let reader = member(1, "r", shared(3));
        let record = reader.stored.record.as_ref().expect("a lockwarden record");
        assert_eq!(record.fence, lockwarden_core::FenceToken(101));
        let set = record.set.as_ref().expect("a holder set");
        assert_eq!((set.permits, set.holders.len()), (3, 1));
        assert_eq!(set.holders[0].nonce, record.nonce, "the same acquisition");
        assert_eq!(set.holders[0].fence, record.fence);
        assert_eq!((reader.mode(), reader.permits()), (S, Some(3)));
        assert_eq!(permits_of(record), shared(3));
        let writer = member(2, "w", writer(3));
        assert_eq!((writer.mode(), writer.permits()), (X, Some(3)));
        let mutex = member(3, "m", Permits::MUTEX);
        assert_eq!(
            mutex.stored.record.as_ref().unwrap().set,
            None,
            "today's record"
        );
        assert_eq!((mutex.mode(), mutex.permits()), (X, Some(1)));
        assert_eq!(disagreement(&[reader, writer, mutex], shared(3)), Some(1));
    }

    #[test]
    fn the_summary_lists_the_granted_entries_and_the_writer_first_in_line() {
        let queue = [
            member(1, "r1", shared(3)),
            member(2, "r2", shared(3)),
            member(3, "w", writer(3)),
            member(4, "r3", shared(3)),
        ];
        let stored = summary(&queue, 3).expect("a holder");
        let record = stored.record.unwrap();
        // Every granted holder is named, as on the other stores, not only the head.
        assert_eq!(record.holder, "r1 and r2");
        assert_eq!(stored.version.0, format!("{}:0", queue[0].name));
        let set = record.set.unwrap();
        let holders: Vec<_> = set
            .holders
            .iter()
            .map(|h| (h.holder.as_str(), h.fence.0))
            .collect();
        assert_eq!(holders, [("r1", 101), ("r2", 102)]);
        assert_eq!(set.waiting_writer.map(|w| w.holder), Some("w".to_string()));
    }

    #[test]
    fn a_writer_waits_for_everyone_ahead_and_blocks_readers_behind() {
        assert_eq!(verdict(&[], writer(3)), Verdict::Granted);
        assert_eq!(verdict(&[S, S], writer(3)), waiting(2, &[1]));
        // A reader behind a waiting writer is not admitted, permits or not.
        assert_eq!(verdict(&[S, S, X], shared(3)), waiting(3, &[2]));
        assert_eq!(verdict(&[X], shared(3)), waiting(1, &[0]));
        // Behind a writer and then more readers than permits: whichever is more.
        assert_eq!(verdict(&[X, S, S, S, S], shared(3)), waiting(3, &[0]));
        // A mutex is exclusive whatever its mode says.
        assert_eq!(verdict(&[S], Permits::MUTEX), waiting(1, &[0]));
    }
}

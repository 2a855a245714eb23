//! More than one holder per key (docs/design.md §6.2): how many permits a key has,
//! how a holder takes it, and the holder set a conditional-write store keeps in the
//! key's one record.

use std::fmt;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::record::{FenceToken, ForeignRecord, UnknownFields, random_id};

/// How a holder takes a key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Alone: no other holder while it holds the key (a writer).
    #[default]
    Exclusive,
    /// One permit: holders in this mode coexist up to the key's permits (readers, or
    /// the holders of a counting semaphore).
    Shared,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
        })
    }
}

/// How many may hold a key at once, and how this contender takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Permits {
    /// The key's permits: every lock on one key must name the same number.
    pub total: u32,
    pub mode: Mode,
}

impl Default for Permits {
    fn default() -> Self {
        Permits::MUTEX
    }
}

impl Permits {
    /// A mutual-exclusion lock: today's record format, which other tools understand.
    pub const MUTEX: Permits = Permits {
        total: 1,
        mode: Mode::Exclusive,
    };

    /// The most permits a key may have: the whole holder set lives in one record, and
    /// the smallest of the stores' limits (a Kubernetes object's annotations, 256 KiB
    /// in all) must hold it.
    pub const MAX: u32 = 256;

    /// A counting semaphore: each holder takes one of `total` permits.
    pub fn semaphore(total: u32) -> Permits {
        Permits {
            total,
            mode: Mode::Shared,
        }
    }

    /// Whether this is a plain mutex (one permit): stored in today's record format.
    pub fn is_mutex(&self) -> bool {
        self.total == 1
    }

    /// Checks the values a user gave; the error says what is wrong.
    pub fn validate(&self) -> Result<(), PermitsError> {
        if self.total == 0 {
            return Err(PermitsError::Zero);
        }
        if self.total > Self::MAX {
            return Err(PermitsError::TooMany { total: self.total });
        }
        if self.mode == Mode::Shared && self.total == 1 {
            return Err(PermitsError::SharedWithOne);
        }
        Ok(())
    }
}

/// Permits a user gave that no key can have.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PermitsError {
    #[error("permits must be at least 1")]
    Zero,
    #[error(
        "permits is {total}, at most {} are supported (every holder is kept in the key's one record)",
        Permits::MAX
    )]
    TooMany { total: u32 },
    #[error(
        "shared mode needs permits of 2 or more: with one permit a shared holder excludes \
         everyone, which is an exclusive lock"
    )]
    SharedWithOne,
}

impl fmt::Display for Permits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_mutex() {
            f.write_str("exclusive")
        } else {
            write!(f, "{} of {} permits", self.mode, self.total)
        }
    }
}

/// One holder in a [`HolderSet`]: what a [`super::LockRecord`] is for a mutex.
///
/// Fields a newer build added are kept in `unknown` and written back with the entry
/// (docs/design.md §3 "Stored formats that can evolve"); they leave with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SetEntry {
    pub holder: String,
    /// Random per acquisition: proves that this entry is that acquisition's.
    pub nonce: String,
    /// Random per write of this entry: a renewal changes it, and a contender observes
    /// each entry's expiry by its revision staying the same (rule 1, per entry).
    pub revision: String,
    pub fence: FenceToken,
    pub lease_ms: u64,
    pub mode: Mode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    pub acquired_at_ms: u64,
    pub renewed_at_ms: u64,
    /// How many of the key's permits a shared entry takes (1 unless asked): weighted
    /// entries exist only in a queued set (docs/design.md §6.4).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub weight: u32,
    /// The entry's priority in a queued set: higher goes first.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub priority: i32,
    /// The arrival ticket the store handed out when the entry joined the queue (a
    /// counter in the record, never a clock); a holder keeps the one it waited with.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub ticket: u64,
    /// How many later arrivals were granted before this waiter (a higher priority):
    /// for people to see that a low priority is being passed over.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub overtaken: u32,
    /// What a newer build wrote in this entry that this one does not know.
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn is_zero_i32(n: &i32) -> bool {
    *n == 0
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

impl SetEntry {
    pub fn new(
        holder: &str,
        fence: FenceToken,
        lease: Duration,
        mode: Mode,
        data: Option<String>,
    ) -> SetEntry {
        let now = unix_ms(SystemTime::now());
        SetEntry {
            holder: holder.to_string(),
            nonce: random_id(),
            revision: random_id(),
            fence,
            lease_ms: lease.as_millis() as u64,
            mode,
            data,
            acquired_at_ms: now,
            renewed_at_ms: now,
            weight: 1,
            priority: 0,
            ticket: 0,
            overtaken: 0,
            unknown: UnknownFields::new(),
        }
    }

    /// The permits this entry takes in a set of `permits`: an exclusive entry takes
    /// them all.
    pub fn permits_taken(&self, permits: u32) -> u32 {
        match self.mode {
            Mode::Exclusive => permits,
            Mode::Shared => self.weight,
        }
    }

    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }

    pub fn acquired_at(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(self.acquired_at_ms)
    }

    pub fn renewed_at(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(self.renewed_at_ms)
    }

    /// The same acquisition, rewritten with a new revision (a renewal).
    pub fn renewed(&self) -> SetEntry {
        SetEntry {
            revision: random_id(),
            renewed_at_ms: unix_ms(SystemTime::now()),
            ..self.clone()
        }
    }
}

/// The holders of a key with more than one permit, kept in the key's one record on
/// the conditional-write stores (S3, DynamoDB, Kubernetes Lease).
///
/// Read with the fields a newer build added kept in `unknown`, and in its entries';
/// every rewrite of the set carries them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HolderSet {
    /// The key's permits, as the first holder of the current set named them.
    pub permits: u32,
    /// The last fence granted on the key (rule 3): the next grant takes the one after
    /// it, whoever has released since.
    #[serde(default)]
    pub last_fence: FenceToken,
    /// In grant order (so fences increase along it).
    pub holders: Vec<SetEntry>,
    /// An exclusive contender first in line: while it is live, no new shared holder is
    /// admitted, so writers are not starved by a stream of readers. Its revision
    /// changes with every attempt it makes; a contender that sees it unchanged for its
    /// lease ignores it (rule 1, as for a holder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_writer: Option<SetEntry>,
    /// The key's queue, when it has one (docs/design.md §6.4): waiters are granted in
    /// (priority, ticket) order. A queued set is stored in a shape a build without
    /// queues reads as foreign ([`HolderSet::to_json`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<Queue>,
    /// What a newer build wrote in the set that this one does not know.
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

/// A key's queue of waiters, kept in its holder set (docs/design.md §6.4).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Queue {
    /// The ticket the next waiter to register takes: arrival order is the order of
    /// the store's conditional writes, never a clock.
    pub next_ticket: u64,
    /// The registered waiters, in ticket order. Each is refreshed by its waiter like a
    /// lease (its revision changes) and expires by rule 1 per entry.
    #[serde(default)]
    pub waiters: Vec<SetEntry>,
    /// The key's last hold times in milliseconds, oldest first (at most
    /// [`Queue::HOLD_TIMES`]), written by releases: for the expected start that status
    /// shows; no decision reads them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hold_ms: Vec<u64>,
    /// When the last release with waiters queued was written (wall clock, ms), until
    /// the next grant adds the hand-off gap to that hold: a waiter's turn costs a hold
    /// *and* a hand-off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at_ms: Option<u64>,
    /// What a newer build wrote in the queue that this one does not know.
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

impl Queue {
    /// The most waiters a key's queue registers. A waiter beyond them, or one whose
    /// entry would take the set past [`Queue::MAX_SET_BYTES`], waits unregistered and
    /// never overtakes a registered one.
    pub const MAX_WAITERS: usize = 256;

    /// The most bytes a queued set may take: the smallest store's budget is a Lease's
    /// annotations, 256 KiB in all, which also carry the record's other fields and
    /// the key's history. 256 holders and 256 waiters with names of 60 bytes take
    /// about 160 KiB (`a_full_queue_with_every_permit_held_fits_a_lease`); long names or
    /// data lower the number of waiters, never the holders.
    pub const MAX_SET_BYTES: usize = 200 * 1024;

    /// How many hold times the queue keeps for its estimate.
    pub const HOLD_TIMES: usize = 8;

    /// The waiters in grant order: higher priority first, then earlier ticket.
    pub fn in_order(&self) -> Vec<&SetEntry> {
        let mut order: Vec<&SetEntry> = self.waiters.iter().collect();
        order.sort_by_key(|w| (std::cmp::Reverse(w.priority), w.ticket));
        order
    }

    /// A waiter's position in grant order (0 = next).
    pub fn position(&self, nonce: &str) -> Option<usize> {
        self.in_order().iter().position(|w| w.nonce == nonce)
    }

    /// Records a finished hold, released at `now`, keeping the last
    /// [`Queue::HOLD_TIMES`].
    pub fn record_hold(&mut self, held: Duration, now: SystemTime) {
        self.hold_ms.push(held.as_millis() as u64);
        let excess = self.hold_ms.len().saturating_sub(Self::HOLD_TIMES);
        self.hold_ms.drain(..excess);
        // Only a release with someone waiting hands the key over; an idle key's gap
        // is no part of a turn.
        self.released_at_ms = (!self.waiters.is_empty()).then(|| unix_ms(now));
    }

    /// A grant at `now`: the gap since the last release (when it is known and short:
    /// another writer's clock, so anything beyond a minute is not trusted) is added to
    /// that hold.
    pub fn record_grant(&mut self, now: SystemTime) {
        let Some(released) = self.released_at_ms.take() else {
            return;
        };
        let gap = unix_ms(now).saturating_sub(released);
        if let Some(last) = self.hold_ms.last_mut()
            && gap < 60_000
        {
            *last += gap;
        }
    }
}

impl HolderSet {
    /// The permits in use: an exclusive holder takes them all, a weighted one its
    /// weight.
    pub fn in_use(&self) -> u32 {
        self.holders
            .iter()
            .map(|h| h.permits_taken(self.permits))
            .sum::<u32>()
            .min(self.permits)
    }

    pub fn entry(&self, nonce: &str) -> Option<&SetEntry> {
        self.holders.iter().find(|h| h.nonce == nonce)
    }

    /// Whether the set's queue is at its bound (`Queue::MAX_WAITERS`, or within about one
    /// entry of `Queue::MAX_SET_BYTES`): a newcomer then waits without a place. For what
    /// people are told; the engine decides on the exact set it would write.
    pub fn queue_at_its_bound(&self) -> bool {
        const ONE_ENTRY: usize = 1024;
        self.queue.as_ref().is_some_and(|q| {
            q.waiters.len() >= Queue::MAX_WAITERS
                || self.to_json().len() + ONE_ENTRY > Queue::MAX_SET_BYTES
        })
    }

    /// The form every store keeps (an S3 body field, a DynamoDB attribute, a Lease
    /// annotation).
    ///
    /// A queued set names its holders `granted`, not `holders`: a build without queues
    /// requires `holders`, so it reads the key as foreign and never writes it. It would
    /// otherwise ignore the queue (unfair, but safe) and the weights — admitting
    /// holders beyond the permits (docs/design.md §6.4, "Stored format").
    pub fn to_json(&self) -> String {
        let mut value = serde_json::to_value(self).expect("holder set serialises");
        if self.queue.is_some()
            && let Some(map) = value.as_object_mut()
            && let Some(holders) = map.remove(HOLDERS)
        {
            map.insert(GRANTED.to_string(), holders);
        }
        value.to_string()
    }

    pub fn from_json(text: &str) -> Result<HolderSet, ForeignRecord> {
        let not_a_set = |e: &dyn fmt::Display| {
            ForeignRecord::from_bytes(
                &format!("not a lockwarden holder set: {e}"),
                text.as_bytes(),
            )
        };
        let mut value: serde_json::Value = serde_json::from_str(text).map_err(|e| not_a_set(&e))?;
        let queued = match value.as_object_mut() {
            Some(map) if !map.contains_key(HOLDERS) => match map.remove(GRANTED) {
                Some(granted) => {
                    map.insert(HOLDERS.to_string(), granted);
                    true
                }
                None => false,
            },
            _ => false,
        };
        let set: HolderSet = serde_json::from_value(value).map_err(|e| not_a_set(&e))?;
        if queued != set.queue.is_some() {
            return Err(ForeignRecord::new(
                "a lockwarden holder set whose queue and holder field disagree \
                 (a queued set names its holders `granted`)",
            ));
        }
        // A queue makes a one-permit key a set (a queued mutex).
        let fewest = if queued { 1 } else { 2 };
        if set.permits < fewest || set.permits > Permits::MAX {
            return Err(ForeignRecord::new(format!(
                "a lockwarden holder set with {} permits (expected {fewest} to {})",
                set.permits,
                Permits::MAX
            )));
        }
        let mut entries = set
            .holders
            .iter()
            .chain(set.queue.iter().flat_map(|q| q.waiters.iter()));
        if let Some(bad) = entries.find(|e| e.weight == 0 || e.weight > set.permits) {
            return Err(ForeignRecord::new(format!(
                "a lockwarden holder set with an entry of weight {} on {} permits",
                bad.weight, set.permits
            )));
        }
        Ok(set)
    }
}

/// The field a set's holders are stored under; a queued set's are under [`GRANTED`].
const HOLDERS: &str = "holders";
const GRANTED: &str = "granted";

pub(super) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_set_round_trips_and_rejects_nonsense() {
        let mut set = HolderSet {
            permits: 3,
            ..HolderSet::default()
        };
        set.holders.push(SetEntry::new(
            "a",
            FenceToken(4),
            Duration::from_secs(10),
            Mode::Shared,
            None,
        ));
        assert_eq!(HolderSet::from_json(&set.to_json()).unwrap(), set);
        assert_eq!(set.in_use(), 1);
        let err = HolderSet::from_json(r#"{"permits":1,"holders":[]}"#).unwrap_err();
        assert!(err.what.contains("1 permits"), "{err}");
        assert!(HolderSet::from_json("[]").is_err());
    }

    #[test]
    fn permits_validation_names_the_problem() {
        assert!(Permits::MUTEX.validate().is_ok());
        assert!(Permits::semaphore(3).validate().is_ok());
        let shared_one = Permits {
            total: 1,
            mode: Mode::Shared,
        };
        assert!(
            shared_one
                .validate()
                .unwrap_err()
                .to_string()
                .contains("shared mode")
        );
        assert!(
            Permits::semaphore(0)
                .validate()
                .unwrap_err()
                .to_string()
                .contains("at least 1")
        );
        assert!(
            Permits::semaphore(1000)
                .validate()
                .unwrap_err()
                .to_string()
                .contains("at most 256")
        );
    }
}

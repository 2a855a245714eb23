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
    pub fn validate(&self) -> Result<(), String> {
        if self.total == 0 {
            return Err("permits must be at least 1".into());
        }
        if self.total > Self::MAX {
            return Err(format!(
                "permits is {}, at most {} are supported (every holder is kept in the key's one record)",
                self.total,
                Self::MAX
            ));
        }
        if self.mode == Mode::Shared && self.total == 1 {
            return Err(
                "shared mode needs permits of 2 or more: with one permit a shared holder \
                 excludes everyone, which is an exclusive lock"
                    .into(),
            );
        }
        Ok(())
    }
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
    /// What a newer build wrote in this entry that this one does not know.
    #[serde(flatten)]
    pub unknown: UnknownFields,
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
            unknown: UnknownFields::new(),
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
    /// What a newer build wrote in the set that this one does not know.
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

impl HolderSet {
    /// The permits in use: an exclusive holder takes them all.
    pub fn in_use(&self) -> u32 {
        if self.holders.iter().any(|h| h.mode == Mode::Exclusive) {
            self.permits
        } else {
            self.holders.len() as u32
        }
    }

    pub fn entry(&self, nonce: &str) -> Option<&SetEntry> {
        self.holders.iter().find(|h| h.nonce == nonce)
    }

    /// The form every store keeps (an S3 body field, a DynamoDB attribute, a Lease
    /// annotation).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("holder set serialises")
    }

    pub fn from_json(text: &str) -> Result<HolderSet, ForeignRecord> {
        let set: HolderSet = serde_json::from_str(text).map_err(|e| {
            ForeignRecord::from_bytes(
                &format!("not a lockwarden holder set: {e}"),
                text.as_bytes(),
            )
        })?;
        if set.permits < 2 || set.permits > Permits::MAX {
            return Err(ForeignRecord::new(format!(
                "a lockwarden holder set with {} permits (expected 2 to {})",
                set.permits,
                Permits::MAX
            )));
        }
        Ok(set)
    }
}

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
        assert!(shared_one.validate().unwrap_err().contains("shared mode"));
        assert!(
            Permits::semaphore(0)
                .validate()
                .unwrap_err()
                .contains("at least 1")
        );
        assert!(
            Permits::semaphore(1000)
                .validate()
                .unwrap_err()
                .contains("at most 256")
        );
    }
}

//! The lock record every backend stores, and the identifiers around it.

use std::fmt;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::history::{self, Grant};
use super::permits::HolderSet;
use super::runs::{CompletedRun, RunMemory};

/// The fields of a stored record that this build does not know, by name, kept as read
/// so that a rewrite carries them (docs/design.md §3 "Stored formats that can evolve":
/// readers ignore unknown fields, writers keep them).
///
/// Never holds the name of a field this build knows: reading takes those out first.
/// Where each store keeps them is in docs/backends.md ("Stored formats").
pub type UnknownFields = serde_json::Map<String, serde_json::Value>;

/// A fencing token: strictly increasing per key across acquisitions.
///
/// A resource protected by a lock rejects writes carrying a fence lower than the
/// highest it has seen, so a holder that was paused past its lease cannot corrupt it.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct FenceToken(pub u64);

impl FenceToken {
    /// The fence of the first acquisition of a key.
    pub const FIRST: FenceToken = FenceToken(1);

    /// The fence the next acquisition after this one carries.
    pub fn next(self) -> FenceToken {
        FenceToken(self.0.saturating_add(1))
    }

    /// The next fence, unless this is the last one (`u64::MAX`, only ever seen in a
    /// record written by hand): then there is no fence a new holder could carry that
    /// the previous holder did not.
    pub fn checked_next(self) -> Option<FenceToken> {
        self.0.checked_add(1).map(FenceToken)
    }
}

impl fmt::Display for FenceToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The backend's version of a stored record (S3 ETag, DynamoDB record version number,
/// ZooKeeper znode name and version, Kubernetes resourceVersion). Opaque to the engine:
/// it is only compared for equality and handed back in conditional writes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Version(pub String);

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A wall-clock time as RFC 3339 (seconds), for messages and `status`.
///
/// Stored times come from other writers and can be anything; RFC 3339 ends with the
/// year 9999 and humantime's `Display` fails beyond it (which `format!` turns into a
/// panic), so such times are shown as seconds since the epoch instead.
pub fn rfc3339(t: SystemTime) -> String {
    const YEAR_10000: u64 = 253_402_300_800;
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) if d.as_secs() < YEAR_10000 => humantime::format_rfc3339_seconds(t).to_string(),
        Ok(d) => format!("{}s after the Unix epoch", d.as_secs()),
        Err(_) => "before the Unix epoch".to_string(),
    }
}

/// A random 128-bit identifier in lowercase hex.
pub fn random_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Whether a record claims the lock or is a tombstone left by a release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LockState {
    Held,
    Released,
}

/// The record a backend stores for one lock key (docs/design.md §3).
///
/// `acquired_at` / `renewed_at` are wall-clock and informational only: no safety
/// decision reads them (expiry is observed, see [`crate::LeaseObserver`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockRecord {
    pub holder: String,
    /// Random per acquisition: proves that *this* acquisition owns the record.
    pub nonce: String,
    /// Random per write: makes every write's body (and so its ETag) unique.
    pub revision: String,
    pub fence: FenceToken,
    pub lease: Duration,
    pub state: LockState,
    pub data: Option<String>,
    pub acquired_at: SystemTime,
    pub renewed_at: SystemTime,
    /// `Some` on a key with more than one permit (docs/design.md §6.2): the holders
    /// themselves. The fields above then summarise the set for other tools (the first
    /// holder's name, the last fence granted, `Held` while anyone holds a permit).
    /// Exclusive locks leave it `None`, so their stored format is unchanged.
    pub set: Option<HolderSet>,
    /// The key's last grants, oldest first ([`super::history`]): informational, never
    /// read by a safety decision. Empty in a record written by a build without it.
    pub history: Vec<Grant>,
    /// The key's memory of completed runs ([`super::runs`], docs/design.md §6.7):
    /// carried by every write of the key, appended to by the release of a holder whose
    /// run succeeded. Empty on keys never used with a run key.
    pub runs: RunMemory,
    /// What a newer build wrote that this one does not know: written back with the
    /// record, through renewals, releases and the next acquisition.
    pub unknown: UnknownFields,
}

/// How a store marks the nonce of a record that another tool wrote (s3lock,
/// dynamolock, client-go): never one of ours, and recognisable as another tool's lock,
/// whose permits are unknown (docs/design.md §6.2).
pub const ANOTHER_TOOL_NONCE_PREFIX: &str = "another-tool:";

/// The lease a store reads for another tool's lock that has none (s3lock's locks never
/// expire): long enough never to be observed expired (100 years), short enough to add
/// a grace to without overflow.
pub const NO_LEASE: Duration = Duration::from_secs(100 * 365 * 86_400);

impl LockRecord {
    /// Whether the record has no lease of its own ([`NO_LEASE`]): it never expires.
    pub fn never_expires(&self) -> bool {
        self.lease >= NO_LEASE
    }

    /// Whether another lock tool wrote this record (the store read it as that tool's
    /// lock): it holds or released the key under its own rules, with no permits.
    pub fn by_another_tool(&self) -> bool {
        self.nonce.starts_with(ANOTHER_TOOL_NONCE_PREFIX)
    }

    /// A fresh held record for a new acquisition.
    pub fn new_acquisition(
        holder: &str,
        fence: FenceToken,
        lease: Duration,
        data: Option<String>,
    ) -> LockRecord {
        let now = SystemTime::now();
        LockRecord {
            holder: holder.to_string(),
            nonce: random_id(),
            revision: random_id(),
            fence,
            lease,
            state: LockState::Held,
            data,
            acquired_at: now,
            renewed_at: now,
            set: None,
            history: Vec::new(),
            runs: RunMemory::default(),
            unknown: UnknownFields::new(),
        }
    }

    /// The same acquisition, rewritten with a new revision (a renewal).
    pub fn renewed(&self) -> LockRecord {
        LockRecord {
            revision: random_id(),
            renewed_at: SystemTime::now(),
            ..self.clone()
        }
    }

    /// The tombstone a release leaves: same nonce and fence, so the next acquisition
    /// continues the fence sequence.
    pub fn released(&self) -> LockRecord {
        let now = SystemTime::now();
        LockRecord {
            revision: random_id(),
            state: LockState::Released,
            renewed_at: now,
            // The releaser closes its own grant in the history.
            history: history::after_release(self, now),
            ..self.clone()
        }
    }

    /// The tombstone of a release whose run succeeded: [`released`](Self::released)
    /// with the run recorded in the key's memory, keeping the `keep` most recent
    /// (docs/design.md §6.7).
    pub fn released_completed(&self, done: CompletedRun, keep: usize) -> LockRecord {
        LockRecord {
            runs: self.runs.with_completion(done, keep),
            ..self.released()
        }
    }

    /// Whether this record was written by the given write (same acquisition, same write).
    pub fn is_write_of(&self, other: &LockRecord) -> bool {
        self.nonce == other.nonce && self.revision == other.revision
    }
}

/// A stored value that is not a lockwarden record (an s3lock UUID body, garbage,
/// a DynamoDB item with the wrong attribute types…). Never overwritten unless forced.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what}")]
pub struct ForeignRecord {
    /// What was found, for the error message (truncated, printable).
    pub what: String,
}

impl ForeignRecord {
    /// The longest description kept: it ends up in errors, logs and status conditions,
    /// and parts of it (a JSON field name, a Lease holder) come from the stored value,
    /// which may be arbitrarily large.
    pub const MAX_LEN: usize = 512;

    pub fn new(what: impl Into<String>) -> Self {
        let mut what = what.into();
        if what.len() > Self::MAX_LEN {
            let mut end = Self::MAX_LEN - '…'.len_utf8();
            while !what.is_char_boundary(end) {
                end -= 1;
            }
            what.truncate(end);
            what.push('…');
        }
        ForeignRecord { what }
    }

    /// Describes unrecognised bytes: their length and a printable prefix.
    pub fn from_bytes(reason: &str, bytes: &[u8]) -> Self {
        const SHOWN: usize = 48;
        let prefix: String = String::from_utf8_lossy(&bytes[..bytes.len().min(SHOWN)])
            .chars()
            .map(|c| if c.is_control() { '.' } else { c })
            .collect();
        let more = if bytes.len() > SHOWN { "…" } else { "" };
        ForeignRecord::new(format!(
            "{reason} ({} bytes: {prefix:?}{more})",
            bytes.len()
        ))
    }
}

/// A record as read from a backend, with the version a conditional write must name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub record: Result<LockRecord, ForeignRecord>,
    pub version: Version,
}

impl Stored {
    /// The fields of a lockwarden record that this build does not know (none in a
    /// foreign record): what the write replacing it carries over.
    pub fn unknown(&self) -> UnknownFields {
        self.record
            .as_ref()
            .map(|r| r.unknown.clone())
            .unwrap_or_default()
    }
}

/// The JSON document S3 stores (and the form other byte-oriented stores may reuse).
///
/// `lockwarden` is a format marker: a body without it is a foreign record, and one
/// with another number is a format this build cannot read. Fields added later in the
/// same format number are ignored when read and written back (`unknown`); a change an
/// older build must not misread takes a new number instead.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RecordDocument {
    lockwarden: u32,
    holder: String,
    nonce: String,
    revision: String,
    fence: u64,
    lease_ms: u64,
    state: LockState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    data: Option<String>,
    acquired_at_ms: u64,
    renewed_at_ms: u64,
    /// Only on keys with more than one permit; older builds read such a body as
    /// foreign, so they see the key as held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    holders: Option<HolderSet>,
    /// The key's last grants ([`super::history`]): read (leniently: a history that does
    /// not parse is empty, never a reason to call the record foreign) but never written
    /// into the body, because the previous release rejects a body with a field it does
    /// not know (it predates the compatibility rule): stores keep the history beside
    /// the body (S3: the object's user metadata).
    #[serde(default, skip_serializing, deserialize_with = "lenient_history")]
    history: Vec<Grant>,
    /// The key's memory of completed runs (docs/design.md §6.7): only on keys used
    /// with a run key, which the previous release reads as foreign — so it sees such a
    /// key as held and never takes it without force (rule 6). Read leniently: a
    /// memory that does not parse is lost, never a reason to call the record foreign.
    #[serde(
        default,
        skip_serializing_if = "RunMemory::is_empty",
        deserialize_with = "lenient_runs"
    )]
    runs: RunMemory,
    #[serde(flatten)]
    unknown: UnknownFields,
}

fn lenient_runs<'de, D: serde::Deserializer<'de>>(d: D) -> Result<RunMemory, D::Error> {
    let value = serde_json::Value::deserialize(d)?;
    Ok(RunMemory::parse(&value))
}

fn lenient_history<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Grant>, D::Error> {
    let value = serde_json::Value::deserialize(d)?;
    Ok(history::parse(&value))
}

const FORMAT_VERSION: u32 = 1;

fn to_unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn from_unix_ms(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

impl LockRecord {
    /// Encodes the record as the JSON document stored in byte-oriented backends.
    pub fn to_json(&self) -> Vec<u8> {
        let doc = RecordDocument {
            lockwarden: FORMAT_VERSION,
            holder: self.holder.clone(),
            nonce: self.nonce.clone(),
            revision: self.revision.clone(),
            fence: self.fence.0,
            lease_ms: self.lease.as_millis() as u64,
            state: self.state,
            data: self.data.clone(),
            acquired_at_ms: to_unix_ms(self.acquired_at),
            renewed_at_ms: to_unix_ms(self.renewed_at),
            holders: self.set.clone(),
            history: self.history.clone(),
            runs: self.runs.clone(),
            unknown: self.unknown.clone(),
        };
        serde_json::to_vec(&doc).expect("record serialises")
    }

    /// Decodes a stored body; anything that is not a lockwarden record of a known format
    /// version is a [`ForeignRecord`] describing what was found.
    pub fn from_json(bytes: &[u8]) -> Result<LockRecord, ForeignRecord> {
        let doc: RecordDocument = serde_json::from_slice(bytes).map_err(|e| {
            ForeignRecord::from_bytes(&format!("not a lockwarden lock record: {e}"), bytes)
        })?;
        if doc.lockwarden != FORMAT_VERSION {
            return Err(ForeignRecord::new(format!(
                "lockwarden record format {} is not supported (this build reads format {FORMAT_VERSION})",
                doc.lockwarden
            )));
        }
        if let Some(set) = &doc.holders {
            // The same bounds as a holder set read on its own.
            HolderSet::from_json(&set.to_json())?;
        }
        if doc.nonce.is_empty() || doc.lease_ms == 0 {
            return Err(ForeignRecord::from_bytes(
                "lockwarden record with an empty nonce or zero lease",
                bytes,
            ));
        }
        Ok(LockRecord {
            holder: doc.holder,
            nonce: doc.nonce,
            revision: doc.revision,
            fence: FenceToken(doc.fence),
            lease: Duration::from_millis(doc.lease_ms),
            state: doc.state,
            data: doc.data,
            acquired_at: from_unix_ms(doc.acquired_at_ms),
            renewed_at: from_unix_ms(doc.renewed_at_ms),
            set: doc.holders,
            history: doc.history,
            runs: doc.runs,
            unknown: doc.unknown,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trip() {
        let r = LockRecord::new_acquisition(
            "a/b/c",
            FenceToken(7),
            Duration::from_secs(30),
            Some("x".into()),
        );
        let back = LockRecord::from_json(&r.to_json()).unwrap();
        assert_eq!(back.nonce, r.nonce);
        assert_eq!(back.fence, FenceToken(7));
        assert_eq!(back.lease, Duration::from_secs(30));
        assert_eq!(back.data.as_deref(), Some("x"));
        assert_eq!(back.state, LockState::Held);
    }

    #[test]
    fn every_write_has_a_unique_body() {
        let r = LockRecord::new_acquisition("h", FenceToken(1), Duration::from_secs(5), None);
        let renewed = r.renewed();
        assert_ne!(
            r.to_json(),
            renewed.to_json(),
            "ABA: identical bodies give identical ETags"
        );
        assert_ne!(r.released().to_json(), renewed.released().to_json());
    }

    #[test]
    fn s3lock_uuid_body_is_foreign() {
        let err = LockRecord::from_json(b"0b3c7e4c-5a8f-4b3e-9d9a-0e3f1c2b4a5d").unwrap_err();
        assert!(err.what.contains("not a lockwarden lock record"), "{err}");
        let err = LockRecord::from_json(&[0xff, 0x00, 0x13]).unwrap_err();
        assert!(err.what.contains("3 bytes"), "{err}");
    }

    #[test]
    fn times_beyond_rfc3339_are_shown_not_panicked_on() {
        let far = SystemTime::UNIX_EPOCH + Duration::from_millis(u64::MAX);
        assert_eq!(rfc3339(far), "18446744073709551s after the Unix epoch");
        assert_eq!(
            rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
            "2023-11-14T22:13:20Z"
        );
        assert_eq!(
            rfc3339(SystemTime::UNIX_EPOCH - Duration::from_secs(1)),
            "before the Unix epoch"
        );
    }

    #[test]
    fn foreign_descriptions_are_bounded() {
        // serde quotes what it could not read in its error (here an unknown variant),
        // so a body with a huge value made a huge error message (fuzz/record_json
        // checks the bound too).
        let name = "é".repeat(100_000);
        let body = format!(r#"{{"lockwarden":1,"state":"{name}"}}"#);
        let err = LockRecord::from_json(body.as_bytes()).unwrap_err();
        assert!(
            err.what.len() <= ForeignRecord::MAX_LEN,
            "{}",
            err.what.len()
        );
        assert!(
            err.what.starts_with("not a lockwarden lock record"),
            "{err}"
        );
        assert!(err.what.ends_with('…'), "{err}");
        // A huge unknown field name is ignored, and the body still lacks the marker.
        let body = format!(r#"{{"{name}":1}}"#);
        let err = LockRecord::from_json(body.as_bytes()).unwrap_err();
        assert!(err.what.len() <= ForeignRecord::MAX_LEN, "{err}");
        assert!(err.what.contains("missing field `lockwarden`"), "{err}");
        assert_eq!(ForeignRecord::new("short").what, "short");
    }

    /// A body as a newer build writes it: today's fields, and one it added at each
    /// level (the record, the holder set, a holder's entry).
    fn newer_body() -> serde_json::Value {
        serde_json::json!({
            "lockwarden": 1, "holder": "newer", "nonce": "n1", "revision": "r1",
            "fence": 4, "leaseMs": 30000, "state": "held",
            "acquiredAtMs": 1_700_000_000_000u64, "renewedAtMs": 1_700_000_000_000u64,
            "queue": {"priority": 7},
            "holders": {
                "permits": 3, "lastFence": 4, "queued": ["w"],
                "holders": [{
                    "holder": "newer", "nonce": "n1", "revision": "r1", "fence": 4,
                    "leaseMs": 30000, "mode": "shared",
                    "acquiredAtMs": 1_700_000_000_000u64, "renewedAtMs": 1_700_000_000_000u64,
                    "terminationBoundMs": 45000
                }]
            }
        })
    }

    #[test]
    fn readers_ignore_unknown_fields_and_writers_keep_them() {
        let body = serde_json::to_vec(&newer_body()).unwrap();
        let record = LockRecord::from_json(&body).expect("a newer build's record is ours");
        assert_eq!(
            (record.holder.as_str(), record.fence),
            ("newer", FenceToken(4))
        );
        assert_eq!(record.unknown["queue"], serde_json::json!({"priority": 7}));
        let set = record.set.as_ref().unwrap();
        assert_eq!(set.unknown["queued"], serde_json::json!(["w"]));
        assert_eq!(set.holders[0].unknown["terminationBoundMs"], 45000);
        // Every rewrite this build makes carries them: the same document comes back,
        // through a renewal and a release too.
        let back: serde_json::Value = serde_json::from_slice(&record.to_json()).unwrap();
        assert_eq!(back, newer_body());
        for rewritten in [record.renewed(), record.released()] {
            let doc: serde_json::Value = serde_json::from_slice(&rewritten.to_json()).unwrap();
            assert_eq!(doc["queue"], newer_body()["queue"]);
            assert_eq!(doc["holders"], newer_body()["holders"]);
        }
        // What makes a body ours is unchanged: the marker and today's fields.
        let mut no_marker = newer_body();
        no_marker.as_object_mut().unwrap().remove("lockwarden");
        let err = LockRecord::from_json(&serde_json::to_vec(&no_marker).unwrap()).unwrap_err();
        assert!(err.what.contains("missing field `lockwarden`"), "{err}");
        let mut other_format = newer_body();
        other_format["lockwarden"] = 2.into();
        let err = LockRecord::from_json(&serde_json::to_vec(&other_format).unwrap()).unwrap_err();
        assert!(err.what.contains("format 2 is not supported"), "{err}");
        let mut no_nonce = newer_body();
        no_nonce.as_object_mut().unwrap().remove("nonce");
        assert!(LockRecord::from_json(&serde_json::to_vec(&no_nonce).unwrap()).is_err());
    }

    /// The previous release rejects a body with a field it does not know, so the
    /// history never goes into the body (S3 keeps it in the object's metadata); a body
    /// that has one (a later build's) is read.
    #[test]
    fn the_history_stays_out_of_the_body_the_previous_release_reads() {
        let mut r = LockRecord::new_acquisition("a", FenceToken(1), Duration::from_secs(5), None);
        r.history = vec![Grant::new("a", Some("east"), FenceToken(1), r.acquired_at)];
        let body: serde_json::Value = serde_json::from_slice(&r.to_json()).unwrap();
        assert!(body.get("history").is_none(), "{body}");
        let mut later = body;
        later["history"] = serde_json::to_value(&r.history).unwrap();
        let read = LockRecord::from_json(&serde_json::to_vec(&later).unwrap()).unwrap();
        assert_eq!(read.history, r.history);
        assert!(read.unknown.is_empty());
    }

    #[test]
    fn unknown_format_version_is_foreign() {
        let body = br#"{"lockwarden":9,"holder":"h","nonce":"n","revision":"r","fence":1,"leaseMs":1,"state":"held","acquiredAtMs":0,"renewedAtMs":0}"#;
        let err = LockRecord::from_json(body).unwrap_err();
        assert!(err.what.contains("format 9"), "{err}");
    }
}

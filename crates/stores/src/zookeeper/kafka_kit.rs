//! What DataDog kafka-kit's ZooKeeper lock (`cluster/zookeeper`) reads and writes in
//! the data of a queue entry, so that lockwarden and kafka-kit can share one queue.
//!
//! kafka-kit writes `{"timestamp", "ttl_deadline", "owner_id"}` into its entries (Go
//! `time.Time` values, RFC 3339; `ttl_deadline` = creation + the client's TTL). A
//! kafka-kit client configured with a TTL deletes the entry just ahead of its own once
//! that entry's `ttl_deadline` has passed — and an entry whose data lacks the field
//! decodes to Go's zero time, which has always passed. So lockwarden's entries carry
//! the three fields too, with a `ttl_deadline` that never passes: their liveness is
//! their ZooKeeper session's, as for every other ephemeral entry.
//!
//! The other way round, lockwarden keeps the queue's rule for kafka-kit entries: one
//! holds until it is deleted (by its owner, by its session's end, or by a kafka-kit
//! contender with a TTL). lockwarden never deletes an entry because its `ttl_deadline`
//! passed; it only says so where it reports the holder.

use std::borrow::Cow;
use std::time::SystemTime;

use jiff::Timestamp;
use serde_json::{Map, Value};

use lockwarden_core::LockRecord;

const TIMESTAMP: &str = "timestamp";
const TTL_DEADLINE: &str = "ttl_deadline";
const OWNER_ID: &str = "owner_id";

/// "Never" for kafka-kit: a time in the last year that both Go's `time.Time` JSON
/// encoding and this crate's time library accept.
pub const NEVER: &str = "9999-01-01T00:00:00Z";

/// The data of a lockwarden queue entry: its record, plus the fields kafka-kit reads,
/// with a `ttl_deadline` that never passes.
pub fn entry_data(record: &LockRecord) -> Vec<u8> {
    let mut doc: Map<String, Value> =
        serde_json::from_slice(&record.to_json()).expect("a record is a JSON object");
    let created = Timestamp::try_from(record.acquired_at).unwrap_or(Timestamp::UNIX_EPOCH);
    doc.insert(TIMESTAMP.into(), Value::String(created.to_string()));
    doc.insert(TTL_DEADLINE.into(), Value::String(NEVER.into()));
    doc.insert(OWNER_ID.into(), Value::String(record.holder.clone()));
    serde_json::to_vec(&doc).expect("JSON object serialises")
}

/// The lockwarden record in an entry's data, without the fields written for kafka-kit
/// (data written without them, by an older lockwarden, is returned as it is).
pub fn record_part(data: &[u8]) -> Cow<'_, [u8]> {
    let Ok(Value::Object(mut doc)) = serde_json::from_slice::<Value>(data) else {
        return Cow::Borrowed(data);
    };
    if !doc.contains_key("lockwarden") || !doc.contains_key(TTL_DEADLINE) {
        return Cow::Borrowed(data);
    }
    for field in [TIMESTAMP, TTL_DEADLINE, OWNER_ID] {
        doc.remove(field);
    }
    Cow::Owned(serde_json::to_vec(&doc).expect("JSON object serialises"))
}

/// A kafka-kit entry, described for the holder's name in errors and status: whose it
/// is and whether its `ttl_deadline` has passed at `now`. `None` when the data is not
/// kafka-kit's.
pub fn describe(data: &[u8], now: SystemTime) -> Option<String> {
    let Ok(Value::Object(doc)) = serde_json::from_slice::<Value>(data) else {
        return None;
    };
    if doc.contains_key("lockwarden")
        || !(doc.contains_key(OWNER_ID) || doc.contains_key(TTL_DEADLINE))
    {
        return None;
    }
    let owner = doc.get(OWNER_ID).and_then(Value::as_str).unwrap_or("?");
    let deadline = doc
        .get(TTL_DEADLINE)
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<Timestamp>().ok());
    let now = Timestamp::try_from(now).unwrap_or(Timestamp::UNIX_EPOCH);
    let ttl = match deadline {
        Some(deadline) if deadline > now => format!("ttl_deadline {deadline} not passed"),
        Some(deadline) => format!(
            "ttl_deadline passed at {deadline}: kafka-kit contenders with a TTL may delete it; \
             lockwarden waits until it is deleted"
        ),
        None => "no ttl_deadline: kafka-kit contenders with a TTL may delete it; \
                 lockwarden waits until it is deleted"
            .to_string(),
    };
    Some(format!("kafka-kit lock of {owner:?}, {ttl}"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use lockwarden_core::FenceToken;

    fn record() -> LockRecord {
        LockRecord::new_acquisition("c/ns/job", FenceToken(0), Duration::from_secs(10), None)
    }

    #[test]
    fn entries_carry_a_ttl_deadline_that_never_passes() {
        let data = entry_data(&record());
        let doc: Value = serde_json::from_slice(&data).unwrap();
        assert_eq!(doc[TTL_DEADLINE], NEVER);
        assert_eq!(doc[OWNER_ID], "c/ns/job");
        let created: Timestamp = doc[TIMESTAMP].as_str().unwrap().parse().unwrap();
        assert!(created <= Timestamp::now());
        // Go's encoding/json decodes `NEVER` into a time.Time: RFC 3339, year ≤ 9999.
        assert!(NEVER.parse::<Timestamp>().unwrap() > Timestamp::now());
    }

    #[test]
    fn the_record_is_read_back_with_or_without_the_kafka_kit_fields() {
        // As stored: times in whole milliseconds.
        let record = LockRecord::from_json(&record().to_json()).unwrap();
        let with = entry_data(&record);
        assert_eq!(
            LockRecord::from_json(&record_part(&with)).unwrap(),
            record,
            "written by this version"
        );
        let without = record.to_json();
        assert_eq!(
            LockRecord::from_json(&record_part(&without)).unwrap(),
            record,
            "written by an older version"
        );
        assert_eq!(record_part(b"not json").as_ref(), b"not json");
    }

    #[test]
    fn kafka_kit_entries_say_whether_their_ttl_passed() {
        let now = SystemTime::now();
        let passed = br#"{"timestamp":"2026-01-01T10:00:00.5+01:00","ttl_deadline":"2026-01-01T10:00:01+01:00","owner_id":"kk-1"}"#;
        let described = describe(passed, now).unwrap();
        assert!(described.contains("\"kk-1\""), "{described}");
        assert!(described.contains("ttl_deadline passed at"), "{described}");
        let live = format!(
            r#"{{"timestamp":"2026-01-01T10:00:00Z","ttl_deadline":"{NEVER}","owner_id":"kk-2"}}"#
        );
        let described = describe(live.as_bytes(), now).unwrap();
        assert!(described.contains("not passed"), "{described}");
        let no_deadline = describe(br#"{"owner_id":"kafka-kit"}"#, now).unwrap();
        assert!(no_deadline.contains("no ttl_deadline"), "{no_deadline}");
        // Not kafka-kit's: lockwarden's own record, other JSON, other bytes.
        assert_eq!(describe(&entry_data(&record()), now), None);
        assert_eq!(describe(br#"{"a":1}"#, now), None);
        assert_eq!(describe(b"\x00\x01", now), None);
    }
}

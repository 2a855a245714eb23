//! Terraform's and OpenTofu's state locks (docs/design.md §6.8), as both stores that
//! carry them read and write them: an S3 object `<state key>.tflock` whose body is the
//! tools' `LockInfo` JSON (`use_lockfile`), and a DynamoDB item `LockID =
//! "<bucket>/<state key>"` whose `Info` attribute is that JSON (`dynamodb_table`).
//!
//! The tools create the lock with a condition that it does not exist (`If-None-Match:
//! *`, `attribute_not_exists(LockID)`), never renew it, and delete it when they finish
//! (S3: GET, compare the ID, unconditional DELETE; DynamoDB: a DeleteItem conditioned on
//! `Info` equal to their own re-marshalled `LockInfo`). So:
//!
//! - read: their lock is another tool's lock that never expires by time (no lease can be
//!   observed); it is named from its `LockInfo`. Go's decoder is lenient (keys match
//!   case-insensitively, extra keys are ignored), and so is [`LockInfo::parse`].
//! - hold (`terraformCompatible`): lockwarden's lock at the same name is a `LockInfo`
//!   the tools parse and print, written exactly as Go's `json.Marshal` writes it
//!   ([`LockInfo::to_go_json`]): on DynamoDB `tofu force-unlock` deletes the item only
//!   if `Info` is byte-identical to that. On S3 lockwarden's own record rides along in
//!   one extra member, [`RECORD_MEMBER`], which the tools ignore.
//!
//! The probe this follows (OpenTofu v1.12.6 against moto) is in docs/design.md §6.8.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

use lockwarden_core::{
    ANOTHER_TOOL_NONCE_PREFIX, FenceToken, LockRecord, LockState, NO_LEASE, UnknownFields,
};

/// The suffix of an S3 state lock's key: `<state key>.tflock`.
pub const S3_LOCK_SUFFIX: &str = ".tflock";

/// The partition key of the tools' DynamoDB lock table.
pub const DYNAMODB_LOCK_KEY: &str = "LockID";

/// The DynamoDB attribute with the `LockInfo` JSON.
pub const DYNAMODB_INFO_ATTRIBUTE: &str = "Info";

/// The member of an S3 lock body that carries lockwarden's own record, beside the
/// `LockInfo` fields (the tools ignore members they do not know).
pub const RECORD_MEMBER: &str = "lockwardenRecord";

/// The tool's name in a nonce of a record read from one of its locks
/// (`another-tool:terraform:<ID>`).
const NONCE_TOOL: &str = "terraform";

/// The `Operation` lockwarden writes: what `tofu` prints as the lock's operation.
pub const LOCKWARDEN_OPERATION: &str = "lockwarden";

/// A state lock's description, as the tools write it (Go's `statemgr.LockInfo`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockInfo {
    /// What `force-unlock` takes.
    pub id: String,
    /// `OperationTypeApply`, `OperationTypePlan`, `init`, … or lockwarden's
    /// [`LOCKWARDEN_OPERATION`].
    pub operation: String,
    pub info: String,
    /// `user@host`.
    pub who: String,
    pub version: String,
    pub created: SystemTime,
    /// `<bucket>/<state key>` (`<bucket>/env:/<workspace>/<state key>` for a named
    /// workspace): the state this lock protects.
    pub path: String,
}

/// Why a body or an `Info` attribute is not a state lock the key may hold.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotALockInfo {
    #[error("not a Terraform/OpenTofu lock (LockInfo JSON): {0}")]
    Malformed(String),
    #[error(
        "a Terraform/OpenTofu lock of another state: its Path is {found:?}, this key's state is {expected:?}"
    )]
    OtherState { found: String, expected: String },
}

impl LockInfo {
    /// Parses `LockInfo` JSON as Go's `encoding/json` would: member names match the
    /// fields case-insensitively, the last of duplicates wins, unknown members are
    /// ignored; a field of the wrong type or a `Created` that is no RFC 3339 time is
    /// refused. `expected_path`, when given, must be the lock's `Path`.
    pub fn parse(json: &[u8], expected_path: Option<&str>) -> Result<LockInfo, NotALockInfo> {
        let malformed = |why: String| NotALockInfo::Malformed(why);
        let value: Value = serde_json::from_slice(json).map_err(|e| malformed(e.to_string()))?;
        let Value::Object(members) = value else {
            return Err(malformed("not a JSON object".into()));
        };
        let text = |name: &str| -> Result<String, NotALockInfo> {
            match member(&members, name) {
                None | Some(Value::Null) => Ok(String::new()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(other) => Err(malformed(format!("{name} is {other}, not a string"))),
            }
        };
        let created = match member(&members, "Created") {
            None | Some(Value::Null) => UNIX_EPOCH,
            Some(Value::String(s)) => humantime::parse_rfc3339(s)
                .map_err(|e| malformed(format!("Created {s:?} is not an RFC 3339 time: {e}")))?,
            Some(other) => return Err(malformed(format!("Created is {other}, not a string"))),
        };
        let info = LockInfo {
            id: text("ID")?,
            operation: text("Operation")?,
            info: text("Info")?,
            who: text("Who")?,
            version: text("Version")?,
            created,
            path: text("Path")?,
        };
        match expected_path {
            Some(expected) if info.path != expected => Err(NotALockInfo::OtherState {
                found: info.path,
                expected: expected.to_string(),
            }),
            _ => Ok(info),
        }
    }

    /// The JSON Go's `json.Marshal` writes for this `LockInfo`, byte for byte: the
    /// fields in declaration order, `Created` in RFC 3339 with nanoseconds and no
    /// trailing zeros, strings escaped as Go escapes them (`<`, `>`, `&` too).
    pub fn to_go_json(&self) -> String {
        let mut out = String::with_capacity(256);
        out.push('{');
        for (i, (name, value)) in [
            ("ID", self.id.as_str()),
            ("Operation", &self.operation),
            ("Info", &self.info),
            ("Who", &self.who),
            ("Version", &self.version),
        ]
        .into_iter()
        .enumerate()
        {
            if i > 0 {
                out.push(',');
            }
            go_string(name, &mut out);
            out.push(':');
            go_string(value, &mut out);
        }
        out.push_str(",\"Created\":");
        go_string(&go_rfc3339_nano(self.created), &mut out);
        out.push_str(",\"Path\":");
        go_string(&self.path, &mut out);
        out.push('}');
        out
    }

    /// The lock as another tool's record: held, never expiring by time (the tools keep
    /// no lease), its holder named from the `LockInfo`, its nonce naming the lock ID.
    pub fn foreign_record(&self, revision: &str) -> LockRecord {
        LockRecord {
            holder: self.holder(),
            nonce: format!("{ANOTHER_TOOL_NONCE_PREFIX}{NONCE_TOOL}:{}", self.id),
            revision: revision.to_string(),
            fence: FenceToken(0),
            lease: NO_LEASE,
            state: LockState::Held,
            data: None,
            acquired_at: self.created,
            renewed_at: self.created,
            set: None,
            history: Vec::new(),
            runs: Default::default(),
            unknown: UnknownFields::new(),
        }
    }

    /// `tofu apply by alice@laptop since 2026-12-04T12:01:07Z, ID 5b2c…`.
    pub fn holder(&self) -> String {
        let operation = self
            .operation
            .strip_prefix("OperationType")
            .map(str::to_ascii_lowercase)
            .unwrap_or_else(|| self.operation.clone());
        let who = if self.who.is_empty() {
            "someone"
        } else {
            &self.who
        };
        let mut holder = format!("tofu/terraform {operation} by {who}");
        if self.created > UNIX_EPOCH {
            holder.push_str(&format!(
                " since {}",
                lockwarden_core::rfc3339(self.created)
            ));
        }
        holder.push_str(&format!(", ID {}", self.id));
        holder
    }

    /// The `LockInfo` lockwarden writes for `record` on the state at `path`: the ID is
    /// the acquisition's nonce (as a UUID: what `force-unlock` takes), `Who` the holder,
    /// `Info` the holder and its fence, `Created` the acquisition.
    pub fn of_record(record: &LockRecord, path: &str) -> LockInfo {
        LockInfo {
            id: uuid_form(&record.nonce),
            operation: LOCKWARDEN_OPERATION.into(),
            info: format!(
                "held by lockwarden for {} (fence {}); release it with lockwarden",
                record.holder, record.fence.0
            ),
            who: record.holder.clone(),
            version: format!("lockwarden {}", env!("CARGO_PKG_VERSION")),
            created: record.acquired_at,
            path: path.to_string(),
        }
    }
}

/// A record read from a state lock: lockwarden's own (an S3 body with
/// [`RECORD_MEMBER`]), or the tool's.
pub enum StateLock {
    Ours(Box<LockRecord>),
    Theirs(LockInfo),
}

/// Reads an S3 state lock's body: lockwarden's record beside its `LockInfo`, or the
/// tool's `LockInfo` alone (for a state other than `expected_path`: refused).
pub fn parse_s3_body(bytes: &[u8], expected_path: &str) -> Result<StateLock, NotALockInfo> {
    let info = LockInfo::parse(bytes, Some(expected_path))?;
    let record = serde_json::from_slice::<Value>(bytes)
        .ok()
        .and_then(|v| v.get(RECORD_MEMBER).cloned())
        .and_then(|r| serde_json::to_vec(&r).ok())
        .and_then(|r| LockRecord::from_json(&r).ok());
    Ok(match record {
        Some(record) => StateLock::Ours(Box::new(record)),
        None => StateLock::Theirs(info),
    })
}

/// The S3 body of lockwarden's `record` on the state at `path`: its `LockInfo` with
/// the record in one more member.
pub fn s3_body(record: &LockRecord, path: &str) -> Vec<u8> {
    let mut body = LockInfo::of_record(record, path).to_go_json();
    body.pop(); // the closing brace
    body.push_str(&format!(",\"{RECORD_MEMBER}\":"));
    body.push_str(&String::from_utf8_lossy(&record.to_json()));
    body.push('}');
    body.into_bytes()
}

/// The state an S3 lock key protects (`<bucket>/<key without .tflock>`), if the key is
/// a state lock's.
pub fn s3_state_path(bucket: &str, key: &str) -> Option<String> {
    key.strip_suffix(S3_LOCK_SUFFIX)
        .filter(|state| !state.is_empty())
        .map(|state| format!("{bucket}/{state}"))
}

/// The lock ID of a record read from a state lock (its nonce names it), for the hint
/// of what frees it.
pub fn lock_id_of_nonce(nonce: &str) -> Option<&str> {
    nonce
        .strip_prefix(ANOTHER_TOOL_NONCE_PREFIX)?
        .strip_prefix(NONCE_TOOL)?
        .strip_prefix(':')
}

/// What frees a state lock whose tool is gone, said where lockwarden reports it held
/// (status, a forced takeover's warning).
pub fn force_unlock_hint(nonce: &str) -> Option<String> {
    lock_id_of_nonce(nonce).map(|id| {
        format!(
            "the tool's own unlock when its run ends; if that run died, `tofu force-unlock {id}` \
             (or `terraform force-unlock {id}`) deletes the lock"
        )
    })
}

/// What a forced takeover of a state lock did instead of the tools' own way, said in
/// its warning.
pub fn force_unlock_instead(nonce: &str) -> Option<String> {
    lock_id_of_nonce(nonce).map(|id| {
        format!(
            "`tofu force-unlock {id}` (or `terraform force-unlock {id}`) would have deleted \
             its lock instead; lockwarden replaced it with a conditional write, so a run of \
             theirs that is still alive now fails its own unlock"
        )
    })
}

/// A nonce (32 hex digits) in the UUID form the tools' IDs have; anything else as it is.
fn uuid_form(nonce: &str) -> String {
    if nonce.len() == 32 && nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
        format!(
            "{}-{}-{}-{}-{}",
            &nonce[..8],
            &nonce[8..12],
            &nonce[12..16],
            &nonce[16..20],
            &nonce[20..]
        )
    } else {
        nonce.to_string()
    }
}

/// A member of `members` by Go's rule: the exact name, else one equal to it ignoring
/// ASCII case (the last such).
fn member<'a>(members: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    members.get(name).or_else(|| {
        members
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
            .next_back()
    })
}

/// Appends `s` as a JSON string the way Go's `encoding/json` escapes it (HTML escaping
/// on, as `json.Marshal` has it).
fn go_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `t` as Go's `time.RFC3339Nano` formats a UTC time: fractional seconds without
/// trailing zeros (none at all for a whole second), `Z`.
fn go_rfc3339_nano(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let whole = UNIX_EPOCH + Duration::from_secs(since.as_secs());
    let seconds = humantime::format_rfc3339_seconds(whole).to_string();
    let nanos = since.subsec_nanos();
    if nanos == 0 {
        return seconds;
    }
    let fraction = format!("{nanos:09}");
    let fraction = fraction.trim_end_matches('0');
    format!("{}.{fraction}Z", seconds.trim_end_matches('Z'))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What OpenTofu v1.12.6 wrote (docs/design.md §6.8).
    const TOFU: &str = r#"{"ID":"7aed4713-5dfc-b69f-5003-9434f0df0baa","Operation":"OperationTypeApply","Info":"","Who":"root@vm","Version":"1.12.6","Created":"2026-12-04T14:40:50.162148573Z","Path":"tfstate-bucket/env/prod/terraform.tfstate"}"#;

    #[test]
    fn the_tools_lock_is_read_and_written_back_byte_for_byte() {
        let info = LockInfo::parse(
            TOFU.as_bytes(),
            Some("tfstate-bucket/env/prod/terraform.tfstate"),
        )
        .unwrap();
        assert_eq!(info.id, "7aed4713-5dfc-b69f-5003-9434f0df0baa");
        assert_eq!(info.to_go_json(), TOFU);
        assert_eq!(
            info.holder(),
            "tofu/terraform apply by root@vm since 2026-12-04T14:40:50Z, ID \
             7aed4713-5dfc-b69f-5003-9434f0df0baa"
        );
        let record = info.foreign_record("\"etag\"");
        assert!(record.never_expires() && record.by_another_tool());
        assert_eq!(
            lock_id_of_nonce(&record.nonce),
            Some("7aed4713-5dfc-b69f-5003-9434f0df0baa")
        );
    }

    #[test]
    fn members_match_as_go_matches_them() {
        let info = LockInfo::parse(
            br#"{"id":"lc-1","operation":"x","Extra":{"a":[1]},"ID":"exact"}"#,
            None,
        )
        .unwrap();
        assert_eq!((info.id.as_str(), info.operation.as_str()), ("exact", "x"));
        assert_eq!(LockInfo::parse(br#"{"Who":"w"}"#, None).unwrap().who, "w");
    }

    #[test]
    fn what_is_no_lock_info_or_another_states_is_refused() {
        for bad in [
            &b"not json"[..],
            b"[1]",
            br#"{"ID":12345}"#,
            br#"{"Created":"2026-12-04 14:00:00"}"#,
        ] {
            let e = LockInfo::parse(bad, None).unwrap_err();
            assert!(matches!(e, NotALockInfo::Malformed(_)), "{e}");
        }
        let e = LockInfo::parse(TOFU.as_bytes(), Some("tfstate-bucket/other.tfstate")).unwrap_err();
        assert!(e.to_string().contains("another state"), "{e}");
    }

    #[test]
    fn go_escapes_html_and_drops_trailing_zeros() {
        let info = LockInfo {
            id: "a<b>&c".into(),
            operation: "q\"\\\n\u{8}".into(),
            info: String::new(),
            who: "é".into(),
            version: String::new(),
            created: UNIX_EPOCH + Duration::new(1_764_859_320, 120_000_000),
            path: "p".into(),
        };
        assert_eq!(
            info.to_go_json(),
            r#"{"ID":"a\u003cb\u003e\u0026c","Operation":"q\"\\\n\u0008","Info":"","Who":"é","Version":"","Created":"2025-12-04T14:42:00.12Z","Path":"p"}"#
        );
        let whole = LockInfo {
            created: UNIX_EPOCH + Duration::from_secs(1_764_859_320),
            ..info
        };
        assert!(
            whole
                .to_go_json()
                .contains(r#""Created":"2025-12-04T14:42:00Z""#)
        );
    }

    #[test]
    fn lockwardens_s3_body_is_a_lock_info_carrying_its_record() {
        let record = LockRecord {
            nonce: "0123456789abcdef0123456789abcdef".into(),
            ..LockRecord::new_acquisition(
                "ops/apply@eu-1",
                FenceToken(3),
                Duration::from_secs(30),
                None,
            )
        };
        let path = "b/env/prod/terraform.tfstate";
        let body = s3_body(&record, path);
        let info = LockInfo::parse(&body, Some(path)).unwrap();
        assert_eq!(info.id, "01234567-89ab-cdef-0123-456789abcdef");
        assert_eq!(info.operation, LOCKWARDEN_OPERATION);
        match parse_s3_body(&body, path).unwrap() {
            StateLock::Ours(back) => assert_eq!(back.nonce, record.nonce),
            StateLock::Theirs(_) => panic!("lockwarden's own body read as the tool's"),
        }
        assert!(matches!(
            parse_s3_body(TOFU.as_bytes(), "tfstate-bucket/env/prod/terraform.tfstate"),
            Ok(StateLock::Theirs(_))
        ));
        assert_eq!(
            s3_state_path("b", "env/prod/terraform.tfstate.tflock").as_deref(),
            Some(path)
        );
        assert_eq!(s3_state_path("b", "x.lock"), None);
    }
}

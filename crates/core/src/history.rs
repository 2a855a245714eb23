//! The holder history of a key: its last [`HISTORY_LEN`] grants, kept in the key's own
//! record (docs/design.md §3 "The record", docs/backends.md "Holder history").
//!
//! Per-Job locks are deleted after each Job, and holders in other clusters are not
//! visible to this one, so "who held this key last night?" can only be answered by
//! the store. The history is informational: no safety decision reads it, and a
//! history that cannot be read is an empty one — never a reason to call a record
//! foreign (which would stop every lock on the key).
//!
//! Who writes what:
//!
//! - the writer that **grants** appends an entry for its own grant (`held`);
//! - the writer that **releases** closes its entry (`released`, with the time of the
//!   release), in the tombstone it writes anyway;
//! - the writer that **takes over** closes the previous holder's entry: `expired` (it
//!   observed the lease run out: only this next writer can know that, and the time is
//!   its own), `forced` or `reclaimed`.
//!
//! Writers that do not know the history (the previous release, other tools) leave it
//! as it was; the record itself still says who holds it, so [`settled`] completes the
//! history from the record: a grant whose entry is missing is added (without a
//! cluster), and an entry whose grant was replaced without a word is closed as
//! `unknown`. No write of its own is needed for that.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::record::{FenceToken, LockRecord, LockState, Stored, UnknownFields};

/// How many grants a key's history keeps: the last 8. Fixed, so a record's size stays
/// bounded (about 200 bytes an entry: well inside a Lease's 256 KiB of annotations).
pub const HISTORY_LEN: usize = 8;

/// The longest holder or cluster name an entry keeps (longer ones are cut): entries
/// stay small whatever a holder identity is.
pub const MAX_NAME_LEN: usize = 253;

/// How a grant ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum Ending {
    /// Not ended: the key's current holder.
    Held,
    /// Its holder released it.
    Released,
    /// Its lease ran out unrenewed and the next holder took the key over. Only that
    /// next writer knows; the time is its own.
    Expired,
    /// Taken over by force (`force`) while it was held.
    Forced,
    /// Taken back by a restarted run of the same holder (`reclaim`).
    Reclaimed,
    /// Replaced by a writer that keeps no history (the previous release, another
    /// tool), which did not say how.
    Unknown,
    /// A word a newer build wrote: kept as it is.
    Other(String),
}

impl Ending {
    pub fn as_str(&self) -> &str {
        match self {
            Ending::Held => "held",
            Ending::Released => "released",
            Ending::Expired => "expired",
            Ending::Forced => "forced",
            Ending::Reclaimed => "reclaimed",
            Ending::Unknown => "unknown",
            Ending::Other(word) => word,
        }
    }
}

impl From<String> for Ending {
    fn from(word: String) -> Ending {
        match word.as_str() {
            "held" => Ending::Held,
            "released" => Ending::Released,
            "expired" => Ending::Expired,
            "forced" => Ending::Forced,
            "reclaimed" => Ending::Reclaimed,
            "unknown" => Ending::Unknown,
            _ => Ending::Other(word),
        }
    }
}

impl From<Ending> for String {
    fn from(ending: Ending) -> String {
        ending.as_str().to_string()
    }
}

impl std::fmt::Display for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One grant of the key, as stored (`history` of the record, oldest first).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    pub holder: String,
    /// Where the holder ran: the controller's cluster name, the CLI's host. `None`
    /// for grants the history learned from the record alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    pub fence: FenceToken,
    /// When it was granted, by the granting writer's wall clock (0: not known).
    pub acquired_at_ms: u64,
    /// When it ended, by the wall clock of the writer that ended it (the releaser, or
    /// the next holder); `None` while held or when not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at_ms: Option<u64>,
    pub ended: Ending,
    /// Fields of an entry that a newer build wrote: kept (docs/design.md §3).
    #[serde(flatten)]
    pub unknown: UnknownFields,
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn bounded(name: &str) -> String {
    if name.len() <= MAX_NAME_LEN {
        return name.to_string();
    }
    let mut end = MAX_NAME_LEN;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_string()
}

impl Grant {
    /// A grant that has just been made (`held`).
    pub fn new(holder: &str, cluster: Option<&str>, fence: FenceToken, at: SystemTime) -> Grant {
        Grant {
            holder: bounded(holder),
            cluster: cluster.map(bounded),
            fence,
            acquired_at_ms: unix_ms(at),
            ended_at_ms: None,
            ended: Ending::Held,
            unknown: UnknownFields::new(),
        }
    }

    /// When it was granted, if known.
    pub fn acquired_at(&self) -> Option<SystemTime> {
        (self.acquired_at_ms > 0)
            .then(|| SystemTime::UNIX_EPOCH + Duration::from_millis(self.acquired_at_ms))
    }

    /// When it ended, if known.
    pub fn ended_at(&self) -> Option<SystemTime> {
        self.ended_at_ms
            .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
    }

    /// Whether this entry is the grant of `record` (the same holder and fence).
    fn is_grant_of(&self, record: &LockRecord) -> bool {
        self.fence == record.fence && self.holder == bounded(&record.holder)
    }

    /// Ends a grant that is still open.
    fn end(&mut self, how: Ending, at: Option<SystemTime>) {
        if self.ended == Ending::Held {
            self.ended = how;
            self.ended_at_ms = at.map(unix_ms);
        }
    }
}

/// Reads a stored history leniently: it is informational, so entries that do not
/// parse are left out (and so not written back) instead of making the record foreign.
pub fn parse(value: &serde_json::Value) -> Vec<Grant> {
    let Some(entries) = value.as_array() else {
        return Vec::new();
    };
    let mut grants: Vec<Grant> = entries
        .iter()
        .filter_map(|e| serde_json::from_value(e.clone()).ok())
        .collect();
    keep_last(&mut grants);
    grants
}

/// [`parse`] of the history as JSON text (a DynamoDB attribute, a Lease annotation).
pub fn parse_text(text: &str) -> Vec<Grant> {
    serde_json::from_str(text)
        .map(|v: serde_json::Value| parse(&v))
        .unwrap_or_default()
}

/// The history as JSON text.
pub fn to_text(history: &[Grant]) -> String {
    serde_json::to_string(history).expect("history serialises")
}

/// The history as JSON in ASCII only (other characters as `\uXXXX` escapes), at most
/// `max` bytes long: the oldest entries are left out until it fits (`None` when not
/// even the newest does). For stores that keep it in a size-limited header, such as
/// S3's user metadata (2 KB in all).
pub fn to_bounded_ascii(history: &[Grant], max: usize) -> Option<String> {
    (0..history.len()).find_map(|skip| {
        let text = ascii_json(&to_text(&history[skip..]));
        (text.len() <= max).then_some(text)
    })
}

/// JSON text with every non-ASCII character escaped: still the same JSON, since such
/// characters only occur inside strings.
fn ascii_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

fn keep_last(grants: &mut Vec<Grant>) {
    let extra = grants.len().saturating_sub(HISTORY_LEN);
    grants.drain(..extra);
}

/// The history of `record`, completed from the record itself (see the module
/// documentation): its last entry is always the record's own grant. Another tool's
/// record is a grant too (under the name the store reads), its fence being the one
/// it left in place.
pub fn settled(record: &LockRecord) -> Vec<Grant> {
    let mut history = record.history.clone();
    let ends = |r: &LockRecord| match r.state {
        LockState::Held => (Ending::Held, None),
        // A tombstone's renewal time is the time of the release.
        LockState::Released => (Ending::Released, Some(r.renewed_at)),
    };
    match history.last_mut() {
        Some(last) if last.is_grant_of(record) => {
            let (how, at) = ends(record);
            if how != Ending::Held {
                last.end(how, at);
            }
        }
        _ if record.holder.is_empty() && record.state == LockState::Released => {
            // A released record that names nobody (a client-go Lease let go): no grant
            // to add, but the last one certainly ended.
            if let Some(last) = history.last_mut() {
                last.end(Ending::Unknown, None);
            }
        }
        last => {
            if let Some(last) = last {
                last.end(Ending::Unknown, None);
            }
            let at = (record.acquired_at > SystemTime::UNIX_EPOCH).then_some(record.acquired_at);
            let mut grant = Grant::new(
                &record.holder,
                None,
                record.fence,
                at.unwrap_or(SystemTime::UNIX_EPOCH),
            );
            let (how, at) = ends(record);
            grant.end(how, at);
            history.push(grant);
        }
    }
    keep_last(&mut history);
    history
}

/// The history a new grant writes: that of the record it replaces (`replaced`, `None`
/// for a new key or a foreign record), with the replaced grant closed as `how` ended
/// it (at `now`), and the new grant appended.
pub fn after_grant(
    replaced: Option<&LockRecord>,
    how: Ending,
    grant: Grant,
    now: SystemTime,
) -> Vec<Grant> {
    let mut history = replaced.map(settled).unwrap_or_default();
    if let Some(last) = history.last_mut() {
        last.end(how, Some(now));
    }
    history.push(grant);
    keep_last(&mut history);
    history
}

/// The history a release writes in its tombstone: the releasing grant closed.
pub fn after_release(record: &LockRecord, now: SystemTime) -> Vec<Grant> {
    let mut history = record.history.clone();
    // Without an entry of our grant (dropped by a writer that keeps no history), the
    // tombstone itself says who released, and `settled` adds it when read.
    if let Some(last) = history.last_mut().filter(|g| g.is_grant_of(record)) {
        last.end(Ending::Released, Some(now));
    }
    history
}

/// A key's history as read: the stored entries completed by the record, and on a key
/// with more than one permit every current holder as a `held` grant. Empty for an
/// absent or foreign record.
pub fn of_stored(stored: Option<&Stored>) -> Vec<Grant> {
    match stored {
        Some(Stored {
            record: Ok(record), ..
        }) => of_record(record),
        _ => Vec::new(),
    }
}

/// [`of_stored`] of a lockwarden record (or another tool's, as the store read it).
pub fn of_record(record: &LockRecord) -> Vec<Grant> {
    let Some(set) = &record.set else {
        return settled(record);
    };
    // The record's summary fields name the first holder and the last fence, which is
    // no one grant: the set's entries are the current grants.
    let mut history = record.history.clone();
    for entry in &set.holders {
        if !history.iter().any(|g| g.fence == entry.fence) {
            history.push(Grant::new(
                &entry.holder,
                None,
                entry.fence,
                entry.acquired_at(),
            ));
        }
    }
    history.sort_by_key(|g| g.fence);
    keep_last(&mut history);
    history
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: &str, fence: u64) -> LockRecord {
        LockRecord::new_acquisition(holder, FenceToken(fence), Duration::from_secs(30), None)
    }

    fn granted(holder: &str, fence: u64, replaced: Option<&LockRecord>, how: Ending) -> LockRecord {
        let mut r = record(holder, fence);
        let grant = Grant::new(holder, Some("east"), r.fence, r.acquired_at);
        r.history = after_grant(replaced, how, grant, SystemTime::now());
        r
    }

    fn summary(history: &[Grant]) -> Vec<(String, u64, String)> {
        history
            .iter()
            .map(|g| (g.holder.clone(), g.fence.0, g.ended.to_string()))
            .collect()
    }

    fn s(holder: &str, fence: u64, ended: &str) -> (String, u64, String) {
        (holder.into(), fence, ended.into())
    }

    #[test]
    fn grants_append_and_the_next_writer_closes_the_previous_one() {
        let a = granted("a", 1, None, Ending::Released);
        let mut released = a.released();
        released.history = after_release(&a, SystemTime::now());
        let b = granted("b", 2, Some(&released), Ending::Released);
        let c = granted("c", 3, Some(&b), Ending::Expired);
        let d = granted("d", 4, Some(&c), Ending::Forced);
        assert_eq!(
            summary(&settled(&d)),
            [
                s("a", 1, "released"),
                s("b", 2, "expired"),
                s("c", 3, "forced"),
                s("d", 4, "held")
            ]
        );
        assert!(
            d.history
                .iter()
                .all(|g| g.cluster.as_deref() == Some("east"))
        );
        assert!(d.history[..3].iter().all(|g| g.ended_at_ms.is_some()));
    }

    #[test]
    fn the_history_keeps_the_last_grants_only() {
        let mut r = granted("h0", 1, None, Ending::Released);
        for fence in 2..=20 {
            r = granted(
                &format!("h{}", fence - 1),
                fence,
                Some(&r.released()),
                Ending::Released,
            );
        }
        let history = settled(&r);
        assert_eq!(history.len(), HISTORY_LEN);
        let fences: Vec<u64> = history.iter().map(|g| g.fence.0).collect();
        assert_eq!(fences, (13..=20).collect::<Vec<_>>());
    }

    #[test]
    fn grants_by_writers_that_keep_no_history_are_completed_from_the_record() {
        let a = granted("a", 1, None, Ending::Released);
        // The previous release takes the key after a's release: it keeps a's history
        // as it read it (a still "held") and writes its own record beside it.
        let mut old = record("old-build", 2);
        old.history = a.history.clone();
        assert_eq!(
            summary(&settled(&old)),
            [s("a", 1, "unknown"), s("old-build", 2, "held")]
        );
        // Released by the previous release: its tombstone says so.
        let mut tombstone = old.released();
        tombstone.history = old.history.clone();
        let history = settled(&tombstone);
        assert_eq!(history[1].ended, Ending::Released);
        assert_eq!(history[1].ended_at_ms, Some(unix_ms(tombstone.renewed_at)));
        let next = granted("c", 3, Some(&tombstone), Ending::Released);
        assert_eq!(
            summary(&next.history),
            [
                s("a", 1, "unknown"),
                s("old-build", 2, "released"),
                s("c", 3, "held")
            ]
        );
    }

    #[test]
    fn a_history_that_does_not_parse_is_empty_and_entries_keep_newer_fields() {
        assert!(parse_text("not json").is_empty());
        assert!(parse(&serde_json::json!({"holder": "x"})).is_empty());
        let text = r#"[{"holder":"a","fence":1,"acquiredAtMs":5,"ended":"lost","why":"x"},
                       {"holder":7}]"#;
        let history = parse_text(text);
        assert_eq!(history.len(), 1, "the bad entry is left out");
        assert_eq!(history[0].ended, Ending::Other("lost".into()));
        assert_eq!(history[0].unknown["why"], "x");
        let back: serde_json::Value = serde_json::from_str(&to_text(&history)).unwrap();
        assert_eq!(back[0]["ended"], "lost");
        assert_eq!(back[0]["why"], "x");
    }

    #[test]
    fn the_ascii_form_fits_its_bound_by_leaving_out_the_oldest() {
        let history: Vec<Grant> = (1..=8)
            .map(|f| {
                Grant::new(
                    &format!("höld-{f}-😀"),
                    Some("ost"),
                    FenceToken(f),
                    SystemTime::now(),
                )
            })
            .collect();
        let all = to_bounded_ascii(&history, usize::MAX).unwrap();
        assert!(all.is_ascii(), "{all}");
        assert_eq!(parse_text(&all), history, "the same JSON");
        let bound = all.len() / 2;
        let some = to_bounded_ascii(&history, bound).unwrap();
        assert!(some.len() <= bound);
        let kept = parse_text(&some);
        assert!(!kept.is_empty() && kept.len() < history.len());
        assert_eq!(kept.last(), history.last(), "the newest are kept");
        assert_eq!(to_bounded_ascii(&history, 10), None);
    }

    #[test]
    fn long_names_are_cut() {
        let long = "é".repeat(300);
        let g = Grant::new(&long, Some(&long), FenceToken(1), SystemTime::now());
        assert!(g.holder.len() <= MAX_NAME_LEN && g.cluster.unwrap().len() <= MAX_NAME_LEN);
        let mut r = record(&long, 1);
        r.history = vec![Grant::new(&long, None, FenceToken(1), r.acquired_at)];
        assert_eq!(settled(&r).len(), 1, "a cut name still names its grant");
    }
}

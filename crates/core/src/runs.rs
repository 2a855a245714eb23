//! Once per run (docs/design.md §6.7): the key's memory of completed runs, kept in
//! the key's own record and written by the release of a holder whose run succeeded.
//!
//! A *run* is one scheduled execution of some work ("the nightly billing run of
//! 2026-12-03"), named by a run key. Holders in several clusters (or hosts) that
//! queue on one key for the same run each learn, when granted, whether the run was
//! already completed by an earlier holder — from the record their grant replaced, so
//! from exactly the memory every earlier release wrote:
//!
//! - the release of a successful run appends `(run, fence, holder, cluster, finish
//!   time)` in the same conditional write as its tombstone (one write: there is no
//!   moment at which the key is free and the run unrecorded);
//! - a grant reads the memory in the record it replaces, the latest one by the CAS:
//!   a completion recorded before the grant is always seen by it;
//! - a failed, lost or abandoned run writes nothing, so the next holder runs it.
//!
//! What is promised is that **a recorded completion is never repeated**; a run that
//! ended but whose release never landed (the holder killed between the two) was not
//! recorded and may run again. The memory is bounded ([`RunMemory::DEFAULT_KEEP`]
//! entries, [`RunMemory::MAX_BYTES`] bytes) and counts what it dropped; for a run
//! older than what it still keeps, see [`RunCheck::BeyondMemory`].

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::record::{FenceToken, rfc3339};

/// The longest run key: room for `<namespace>/<cronjob>@<RFC 3339 instant>` with
/// Kubernetes' longest names, and small enough that 64 entries stay a few KiB.
pub const MAX_RUN_KEY_LEN: usize = 320;

/// The name of one run of some work, and when it was scheduled when that is known (a
/// CronJob's scheduled time; a CLI `--run-key` that is an RFC 3339 instant).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunKey {
    key: String,
    scheduled: Option<SystemTime>,
}

/// A run key that cannot name a run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RunKeyError {
    #[error("a run key must not be empty")]
    Empty,
    #[error("a run key is at most {MAX_RUN_KEY_LEN} bytes; this one has {0}")]
    TooLong(usize),
    #[error("a run key is printable text; this one has a control character at byte {0}")]
    ControlCharacter(usize),
}

impl RunKey {
    /// A run key from text; an RFC 3339 instant is also its scheduled time.
    pub fn new(key: impl Into<String>) -> Result<RunKey, RunKeyError> {
        let key = key.into();
        let scheduled = humantime::parse_rfc3339_weak(&key).ok();
        RunKey::checked(key, scheduled)
    }

    /// A run key for a run scheduled at `scheduled` (e.g. `payments/nightly@…`).
    pub fn scheduled(key: impl Into<String>, scheduled: SystemTime) -> Result<RunKey, RunKeyError> {
        RunKey::checked(key.into(), Some(scheduled))
    }

    fn checked(key: String, scheduled: Option<SystemTime>) -> Result<RunKey, RunKeyError> {
        if key.trim().is_empty() {
            return Err(RunKeyError::Empty);
        }
        if key.len() > MAX_RUN_KEY_LEN {
            return Err(RunKeyError::TooLong(key.len()));
        }
        if let Some((at, _)) = key.char_indices().find(|(_, c)| c.is_control()) {
            return Err(RunKeyError::ControlCharacter(at));
        }
        Ok(RunKey { key, scheduled })
    }

    pub fn as_str(&self) -> &str {
        &self.key
    }

    pub fn scheduled_at(&self) -> Option<SystemTime> {
        self.scheduled
    }
}

impl std::fmt::Display for RunKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.key)
    }
}

/// One completed run, as the release of its holder recorded it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompletedRun {
    pub run: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_at_ms: Option<u64>,
    pub fence: FenceToken,
    pub holder: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    pub finished_at_ms: u64,
}

impl CompletedRun {
    /// `run` completed by `holder` (of `cluster`) with `fence`, now.
    pub fn now(run: &RunKey, fence: FenceToken, holder: &str, cluster: Option<&str>) -> Self {
        CompletedRun {
            run: run.key.clone(),
            scheduled_at_ms: run.scheduled.map(unix_ms),
            fence,
            holder: cut(holder),
            cluster: cluster.map(cut),
            finished_at_ms: unix_ms(SystemTime::now()),
        }
    }

    pub fn finished_at(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(self.finished_at_ms)
    }

    fn scheduled_at(&self) -> Option<SystemTime> {
        self.scheduled_at_ms
            .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
    }

    /// `run R already completed in cluster C by fence F at T`, for events and errors.
    pub fn describe(&self) -> String {
        let place = match &self.cluster {
            Some(c) => format!(" in cluster {c}"),
            None => String::new(),
        };
        format!(
            "run {} already completed{place} by {} with fence {} at {}",
            self.run,
            self.holder,
            self.fence,
            rfc3339(self.finished_at())
        )
    }
}

/// What the memory says of a run about to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunCheck {
    /// Not recorded: run it.
    New,
    /// Recorded as completed: do not run it again.
    Completed(CompletedRun),
    /// Not recorded, but scheduled no later than the oldest run the memory still
    /// keeps while it has dropped older ones: it may have completed and been
    /// forgotten. Not run (a recorded completion is never repeated); the caller says
    /// why. Only runs with a scheduled time can be placed so; others are `New`.
    BeyondMemory {
        oldest_kept: CompletedRun,
        dropped: u64,
    },
}

/// The key's memory of completed runs: the most recent ones, oldest first, and how
/// many older ones were dropped to keep it bounded.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunMemory {
    #[serde(default)]
    pub runs: Vec<CompletedRun>,
    #[serde(default)]
    pub dropped: u64,
}

impl RunMemory {
    /// How many completed runs a key keeps unless told otherwise.
    pub const DEFAULT_KEEP: usize = 64;
    /// The most a memory may take as JSON, whatever it is told to keep: within an S3
    /// body, a DynamoDB item (400 KB) and a Lease's annotations (256 KiB) beside the
    /// key's queue and history.
    pub const MAX_BYTES: usize = 32 * 1024;

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty() && self.dropped == 0
    }

    /// What the memory says of `run`.
    pub fn check(&self, run: &RunKey) -> RunCheck {
        if let Some(done) = self.runs.iter().rev().find(|r| r.run == run.key) {
            return RunCheck::Completed(done.clone());
        }
        if self.dropped == 0 {
            return RunCheck::New;
        }
        let oldest = self
            .runs
            .iter()
            .filter_map(|r| r.scheduled_at().map(|at| (at, r)))
            .min_by_key(|(at, _)| *at);
        match (run.scheduled, oldest) {
            (Some(at), Some((oldest_at, oldest))) if at <= oldest_at => RunCheck::BeyondMemory {
                oldest_kept: oldest.clone(),
                dropped: self.dropped,
            },
            _ => RunCheck::New,
        }
    }

    /// The memory with `done` appended, keeping the `keep` most recent runs within
    /// [`MAX_BYTES`](Self::MAX_BYTES); each run dropped is counted.
    pub fn with_completion(&self, done: CompletedRun, keep: usize) -> RunMemory {
        let mut next = self.clone();
        next.runs.retain(|r| r.run != done.run);
        next.runs.push(done);
        let keep = keep.max(1);
        while next.runs.len() > keep
            || (next.runs.len() > 1 && next.to_text().len() > Self::MAX_BYTES)
        {
            next.runs.remove(0);
            next.dropped = next.dropped.saturating_add(1);
        }
        next
    }

    /// The memory as stored (JSON text).
    pub fn to_text(&self) -> String {
        serde_json::to_string(self).expect("a run memory serialises")
    }

    /// A stored memory. One that does not parse is empty: the memory is lost, never
    /// invented (a run may then repeat, and [`parse_text`] callers can tell from
    /// [`RunMemory::unreadable`]).
    pub fn parse_text(text: &str) -> RunMemory {
        serde_json::from_str(text).unwrap_or_else(|_| RunMemory::unreadable())
    }

    /// A memory read from a value in a larger document.
    pub fn parse(value: &serde_json::Value) -> RunMemory {
        serde_json::from_value(value.clone()).unwrap_or_else(|_| RunMemory::unreadable())
    }

    /// What an unreadable memory stands for: nothing kept, and one run counted as
    /// dropped so that a later look can tell it was not simply empty.
    fn unreadable() -> RunMemory {
        RunMemory {
            runs: Vec::new(),
            dropped: 1,
        }
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn cut(name: &str) -> String {
    let mut end = name.len().min(super::history::MAX_NAME_LEN);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u64) -> RunKey {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + i * 60);
        RunKey::scheduled(format!("payments/nightly@{}", rfc3339(at)), at).unwrap()
    }

    fn done(run: &RunKey, fence: u64) -> CompletedRun {
        CompletedRun::now(
            run,
            FenceToken(fence),
            "east/payments/nightly",
            Some("east"),
        )
    }

    #[test]
    fn once_a_recorded_run_is_completed_and_another_is_new() {
        let memory = RunMemory::default().with_completion(done(&key(1), 3), 64);
        match memory.check(&key(1)) {
            RunCheck::Completed(r) => assert_eq!(r.fence, FenceToken(3)),
            other => panic!("{other:?}"),
        }
        assert_eq!(memory.check(&key(2)), RunCheck::New);
        let text = memory.to_text();
        assert_eq!(RunMemory::parse_text(&text), memory);
    }

    /// Memory bound: 200 runs through one key keep the last 64 and count 136 as
    /// dropped, within the byte bound.
    #[test]
    fn once_the_memory_keeps_the_last_runs_within_its_bounds_and_counts_the_rest() {
        let mut memory = RunMemory::default();
        for i in 0..200 {
            memory = memory.with_completion(done(&key(i), i + 1), RunMemory::DEFAULT_KEEP);
        }
        assert_eq!(memory.runs.len(), 64);
        assert_eq!(memory.dropped, 136);
        assert!(memory.to_text().len() <= RunMemory::MAX_BYTES);
        assert_eq!(memory.runs[0].run, key(136).as_str());
        // Long names: the byte bound drops more than the count would.
        let long = "x".repeat(MAX_RUN_KEY_LEN - 30);
        let mut big = RunMemory::default();
        for i in 0..200u64 {
            let run = RunKey::new(format!("{long}-{i}")).unwrap();
            big = big.with_completion(done(&run, i + 1), 1000);
        }
        assert!(big.to_text().len() <= RunMemory::MAX_BYTES);
        assert_eq!(big.runs.len() as u64 + big.dropped, 200);
    }

    /// The rule for a run older than the memory reaches: scheduled no later than the
    /// oldest run kept, after some were dropped, it is not run (it may have completed
    /// and been forgotten); a later one is new; one without a scheduled time cannot be
    /// placed and is new.
    #[test]
    fn once_a_run_older_than_the_memory_reaches_is_not_run() {
        let mut memory = RunMemory::default();
        for i in 0..70 {
            memory = memory.with_completion(done(&key(i), i + 1), RunMemory::DEFAULT_KEEP);
        }
        assert_eq!(memory.dropped, 6);
        assert!(matches!(
            memory.check(&key(3)),
            RunCheck::BeyondMemory { dropped: 6, .. }
        ));
        assert_eq!(memory.check(&key(70)), RunCheck::New);
        assert_eq!(
            memory.check(&RunKey::new("backfill-7").unwrap()),
            RunCheck::New
        );
        // Nothing dropped: any run not recorded is new.
        let fresh = RunMemory::default().with_completion(done(&key(5), 1), 64);
        assert_eq!(fresh.check(&key(1)), RunCheck::New);
    }

    #[test]
    fn bad_input_run_keys_that_name_no_run_are_refused() {
        assert_eq!(RunKey::new(""), Err(RunKeyError::Empty));
        assert_eq!(RunKey::new("  "), Err(RunKeyError::Empty));
        assert_eq!(
            RunKey::new("x".repeat(MAX_RUN_KEY_LEN + 1)),
            Err(RunKeyError::TooLong(MAX_RUN_KEY_LEN + 1))
        );
        assert_eq!(RunKey::new("a\nb"), Err(RunKeyError::ControlCharacter(1)));
        let instant = RunKey::new("2026-12-03T02:00:00Z").unwrap();
        assert!(instant.scheduled_at().is_some());
    }

    /// An unreadable memory is lost, never invented: nothing is recorded as
    /// completed, and it counts as having dropped something.
    #[test]
    fn once_an_unreadable_memory_is_lost_never_invented() {
        let memory = RunMemory::parse_text("{not json");
        assert!(memory.runs.is_empty());
        assert_eq!(memory.dropped, 1);
        assert_eq!(memory.check(&RunKey::new("r").unwrap()), RunCheck::New);
    }
}

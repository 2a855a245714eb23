//! `lockwarden status URL`: the lock record as stored, without acquiring.

use std::time::{Duration, SystemTime};

use clap::{Args, ValueEnum};
use serde::Serialize;

use super::output::columns;
use super::{BackendArgs, CliError, PermitArgs, exit};
use lockwarden_core::history::{self, Grant};
use lockwarden_core::{HolderSet, LockRecord, LockState, Permits, QueueView, Stored};
use lockwarden_core::{LockBackend, LockError, RunMemory};
use lockwarden_stores::Target;
use lockwarden_stores::zookeeper::FOREIGN_QUEUE_ENTRY;

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The lock: s3://BUCKET/KEY, dynamodb://TABLE/KEY, zk://HOST:PORT[,HOST:PORT...]/PATH or k8s://NAMESPACE/LEASE-NAME
    #[arg(value_name = "URL", value_parser = super::parse_target)]
    pub url: Target,

    /// Output format [default: a table]
    #[arg(short, long, value_enum, value_name = "FORMAT")]
    pub output: Option<Format>,

    /// The permits you lock the key with (`--permits N`, `--shared`): status then
    /// says whether the key agrees and whether a permit is free
    #[command(flatten)]
    pub permits: PermitArgs,

    /// Also show the key's holder history: its last grants (holder, cluster, fence,
    /// acquired, how and when each ended), oldest first
    #[arg(long)]
    pub history: bool,

    #[command(flatten)]
    pub backend: BackendArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Json,
    Yaml,
    /// The table with more columns
    Wide,
}

/// What `status` reports; also the JSON / YAML document.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub url: String,
    /// `held`, `released`, `absent` (no record) or `foreign` (not a lockwarden record).
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
    /// Wall clock, informational.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acquired_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renewed_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// What a foreign record looks like.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub found: Option<String>,
    /// What users of other tools on this key should know (e.g. s3lock and a released
    /// record).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The key's permits, when it has more than one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
    /// How many of them are in use (an exclusive holder takes them all).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permits_in_use: Option<u32>,
    /// Every holder of a key with more than one permit, in grant order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<SetHolder>,
    /// The key's queue (docs/design.md §6.4), in grant order: position 0 is next.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<Vec<Waiter>>,
    /// The key's last grants, oldest first (`--history`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<HistoryEntry>>,
    /// The key's memory of completed runs (`run --run-key`, docs/design.md §6.7),
    /// oldest first, and how many older runs it dropped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runs: Option<CompletedRuns>,
    /// Wall clock, as seen by this observer: a held record that is not renewed cannot
    /// be taken over before this (rule 1: the stored lease — a lock-delay included,
    /// rule 8 — plus the grace, counted from this read). A contender that saw this
    /// version earlier counts from its own first sight; a renewal moves it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_takeover_before: Option<String>,
    /// What frees a key held by a tool whose locks lockwarden never takes over by time
    /// (s3lock's, whose locks never expire; another ZooKeeper client's queue entry,
    /// kafka-kit's): there is then no `noTakeoverBefore`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub freed_by: Option<String>,
    /// Another tool's lock holds (or held) the key: it names no permits.
    #[serde(skip)]
    pub by_another_tool: bool,
}

/// The key's memory of completed runs ([`lockwarden_core::runs`]).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CompletedRuns {
    pub completed: Vec<CompletedRunEntry>,
    /// Older completed runs the memory no longer keeps.
    pub dropped: u64,
}

/// One completed run: which, by whom, with which fence, when it finished.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CompletedRunEntry {
    pub run: String,
    pub fence: u64,
    pub holder: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    pub finished_at: String,
}

impl CompletedRuns {
    /// What a key's memory shows: `None` for a key that remembers no run.
    pub(crate) fn of(memory: &RunMemory) -> Option<CompletedRuns> {
        (!memory.is_empty()).then(|| CompletedRuns {
            completed: memory
                .runs
                .iter()
                .map(|r| CompletedRunEntry {
                    run: r.run.clone(),
                    fence: r.fence.0,
                    holder: r.holder.clone(),
                    cluster: r.cluster.clone(),
                    finished_at: lockwarden_core::rfc3339(r.finished_at()),
                })
                .collect(),
            dropped: memory.dropped,
        })
    }

    /// "completed runs: N" and a row per run, the most recent last.
    pub(crate) fn table(&self) -> String {
        let mut rows = vec![
            ["RUN", "FENCE", "HOLDER", "CLUSTER", "FINISHED"]
                .map(String::from)
                .to_vec(),
        ];
        for r in &self.completed {
            rows.push(vec![
                r.run.clone(),
                r.fence.to_string(),
                r.holder.clone(),
                r.cluster.clone().unwrap_or_else(|| "-".into()),
                r.finished_at.clone(),
            ]);
        }
        let dropped = match self.dropped {
            0 => String::new(),
            n => format!(" ({n} older dropped)"),
        };
        format!(
            "completed runs: {}{dropped}, oldest first\n{}",
            self.completed.len(),
            columns(&rows)
        )
    }

    /// The key's memory as its store keeps it now: beside the record (ZooKeeper) or in
    /// it (the others).
    pub(crate) async fn read(
        backend: &dyn LockBackend,
    ) -> Result<Option<CompletedRuns>, LockError> {
        if let Some(runs) = backend.runs_beside_the_record().await? {
            return Ok(CompletedRuns::of(&runs));
        }
        let stored = lockwarden_core::when_reachable(|| backend.inspect()).await?;
        Ok(stored
            .and_then(|s| s.record.ok())
            .and_then(|r| CompletedRuns::of(&r.runs)))
    }
}

/// One grant of the key's holder history ([`lockwarden_core::history`]).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEntry {
    pub holder: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    pub fence: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acquired_at: Option<String>,
    /// `held` (the current holder), `released`, `expired`, `forced`, `reclaimed` or
    /// `unknown`.
    pub ended: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
}

impl HistoryEntry {
    pub fn all(history: &[Grant]) -> Vec<HistoryEntry> {
        history
            .iter()
            .map(|g| HistoryEntry {
                holder: g.holder.clone(),
                cluster: g.cluster.clone(),
                fence: g.fence.0,
                acquired_at: g.acquired_at().and_then(rfc3339),
                ended: g.ended.to_string(),
                ended_at: g.ended_at().and_then(rfc3339),
            })
            .collect()
    }
}

/// One waiter in a key's queue.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Waiter {
    /// 0 = next.
    pub position: usize,
    pub holder: String,
    pub priority: i32,
    pub weight: u32,
    /// The arrival ticket the store handed out.
    pub ticket: u64,
    /// How many later arrivals of a higher priority were granted before it.
    pub overtaken: u32,
    /// When it registered (wall clock, informational).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_since: Option<String>,
    /// Its expected grant, from the key's recent hold times.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_start: Option<String>,
}

impl Waiter {
    fn all(set: &HolderSet, now: SystemTime) -> Vec<Waiter> {
        let Some(queue) = &set.queue else {
            return Vec::new();
        };
        queue
            .in_order()
            .into_iter()
            .enumerate()
            .map(|(position, w)| Waiter {
                position,
                holder: w.holder.clone(),
                priority: w.priority,
                weight: w.weight,
                ticket: w.ticket,
                overtaken: w.overtaken,
                waiting_since: rfc3339(w.acquired_at()),
                expected_start: QueueView::of(set, &w.nonce, now)
                    .and_then(|v| v.expected_start)
                    .and_then(rfc3339),
            })
            .collect()
    }
}

/// One holder of a key with more than one permit.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SetHolder {
    pub holder: String,
    pub fence: u64,
    /// `shared` or `exclusive`.
    pub mode: String,
    pub nonce: String,
    pub lease: String,
    pub lease_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acquired_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renewed_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
}

impl SetHolder {
    fn all(set: &HolderSet) -> Vec<SetHolder> {
        set.holders
            .iter()
            .map(|h| SetHolder {
                holder: h.holder.clone(),
                fence: h.fence.0,
                mode: h.mode.to_string(),
                nonce: h.nonce.clone(),
                lease: humantime::format_duration(h.lease()).to_string(),
                lease_ms: h.lease_ms,
                acquired_at: rfc3339(h.acquired_at()),
                renewed_at: rfc3339(h.renewed_at()),
                data: h.data.clone(),
            })
            .collect()
    }
}

/// The lease of a lock that has none (s3lock's): only its unlock, or a forced
/// takeover, ends it.
const NEVER_EXPIRES: &str = "never expires";

/// The holder as the table shows it: short. Another client's ZooKeeper queue entry
/// is named by a whole sentence (`foreign queue entry NAME: kafka-kit lock of "OWNER",
/// ttl_deadline …`), which `-o wide`, JSON and YAML show; the table names its owner
/// and entry. Other names are shown as they are.
fn short_holder(holder: &str) -> String {
    let Some((entry, found)) = holder
        .strip_prefix(FOREIGN_QUEUE_ENTRY)
        .and_then(|rest| rest.split_once(": "))
    else {
        return holder.to_string();
    };
    const KAFKA_KIT: &str = "kafka-kit lock of ";
    let what = match found.strip_prefix(KAFKA_KIT) {
        // The owner is quoted (Rust's `{:?}`): up to the closing quote.
        Some(owner) if owner.starts_with('"') => {
            let end = owner[1..].find('"').map_or(owner.len(), |i| i + 2);
            format!("kafka-kit {}", &owner[..end])
        }
        _ => "another client".to_string(),
    };
    format!("{what} (entry {entry})")
}

/// What frees a held record lockwarden never takes over by time; `None` for records
/// whose lease it observes (its own, dynamolock's, client-go's Leases).
fn freed_by(record: &LockRecord, never_expires: bool) -> Option<String> {
    if record.state != LockState::Held {
        return None;
    }
    if let Some(hint) = lockwarden_stores::terraform::force_unlock_hint(&record.nonce) {
        return Some(format!(
            "{hint} (the lock never expires; lockwarden takes it over only with --force)"
        ));
    }
    if record.holder.starts_with(FOREIGN_QUEUE_ENTRY) {
        return Some(
            "the other client deleting its queue entry, or its ZooKeeper session ending \
             (lockwarden never takes over another client's entry)"
                .into(),
        );
    }
    never_expires.then(|| {
        "its tool's unlock (the lock never expires; lockwarden takes it over only with \
         --force)"
            .into()
    })
}

fn rfc3339(t: SystemTime) -> Option<String> {
    (t > SystemTime::UNIX_EPOCH).then(|| lockwarden_core::rfc3339(t))
}

impl Status {
    pub fn new(url: &str, stored: Option<Stored>) -> Status {
        let mut s = Status {
            url: url.to_string(),
            state: "absent",
            holder: None,
            fence: None,
            version: None,
            nonce: None,
            lease: None,
            lease_ms: None,
            acquired_at: None,
            renewed_at: None,
            data: None,
            found: None,
            note: None,
            permits: None,
            permits_in_use: None,
            holders: Vec::new(),
            queue: None,
            history: None,
            runs: None,
            no_takeover_before: None,
            freed_by: None,
            by_another_tool: false,
        };
        let Some(stored) = stored else { return s };
        s.version = Some(stored.version.0);
        match stored.record {
            Err(found) => {
                s.state = "foreign";
                s.found = Some(found.to_string());
            }
            Ok(r) => {
                s.state = match r.state {
                    LockState::Held => "held",
                    LockState::Released => "released",
                };
                s.by_another_tool = r.by_another_tool();
                let never_expires = r.never_expires();
                s.freed_by = freed_by(&r, never_expires);
                s.holder = Some(r.holder).filter(|h| !h.is_empty());
                s.fence = Some(r.fence.0);
                s.nonce = Some(r.nonce).filter(|n| !n.is_empty());
                if never_expires {
                    // Another tool's lock without a lease (s3lock's): the store reads
                    // it with a placeholder that no contender ever sees run out.
                    s.lease = Some(NEVER_EXPIRES.into());
                } else {
                    s.lease = Some(humantime::format_duration(r.lease).to_string());
                    s.lease_ms = Some(r.lease.as_millis() as u64);
                }
                s.acquired_at = rfc3339(r.acquired_at);
                s.renewed_at = rfc3339(r.renewed_at);
                s.data = r.data;
                s.runs = CompletedRuns::of(&r.runs);
                if let Some(set) = &r.set {
                    s.permits = Some(set.permits);
                    s.permits_in_use = Some(set.in_use());
                    s.holders = SetHolder::all(set);
                    if set.queue.is_some() {
                        s.queue = Some(Waiter::all(set, SystemTime::now()));
                    }
                }
            }
        }
        s
    }

    /// What a holder that would lock the key with `asked` (`--permits`, `--shared`)
    /// should know: that its permits disagree with the key's, or how many are free.
    pub fn permits_note(&self, asked: Permits) -> Option<String> {
        let note = match self.permits {
            Some(total) if total != asked.total => format!(
                "the key has {total} permits: locking it with --permits {} fails \
                 (every holder of a key must give the same number)",
                asked.total
            ),
            Some(total) => {
                let free = total - self.permits_in_use.unwrap_or(0).min(total);
                format!("{free} of {total} permits free")
            }
            // No holder set: nobody holds the key, or a mutex holds it.
            None if asked.is_mutex() => return None,
            None if self.state == "held" && self.by_another_tool => format!(
                "the key is held by another tool's lock, which names no permits: locking it \
                 with --permits {} waits until that lock is released",
                asked.total
            ),
            None if self.state == "held" => format!(
                "the key is held as a mutex (one permit): locking it with --permits {} \
                 fails while it is",
                asked.total
            ),
            None => format!("all {} permits free", asked.total),
        };
        Some(note)
    }

    /// Sets [`Status::no_takeover_before`] for a record read at `read_at` by an
    /// observer whose contenders wait `grace` beyond the stored lease.
    pub fn with_takeover(mut self, read_at: SystemTime, grace: Duration) -> Self {
        if self.state == "held"
            && self.freed_by.is_none()
            && let Some(ms) = self.lease_ms
        {
            let after = Duration::from_millis(ms) + grace;
            self.no_takeover_before = read_at.checked_add(after).and_then(rfc3339);
        }
        self
    }

    fn age(&self, now: SystemTime) -> String {
        let Some(t) = self
            .acquired_at
            .as_deref()
            .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
        else {
            return "-".into();
        };
        let secs = now.duration_since(t).unwrap_or_default().as_secs();
        humantime::format_duration(Duration::from_secs(secs)).to_string()
    }

    /// A kubectl-style table: a header and one row.
    pub fn table(&self, wide: bool) -> String {
        let dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
        let mut header = vec!["URL", "STATE", "HOLDER", "FENCE", "LEASE", "AGE"];
        let holder = match &self.holder {
            Some(h) if !wide => Some(short_holder(h)),
            other => other.clone(),
        };
        let mut row = vec![
            self.url.clone(),
            self.state.to_string(),
            dash(holder),
            dash(self.fence.map(|f| f.to_string())),
            dash(self.lease.clone()),
            self.age(SystemTime::now()),
        ];
        if wide {
            header.extend(["VERSION", "ACQUIRED", "RENEWED", "DATA"]);
            row.extend([
                dash(self.version.clone()),
                dash(self.acquired_at.clone()),
                dash(self.renewed_at.clone()),
                dash(self.data.clone().or(self.found.clone())),
            ]);
        }
        let mut note = self
            .note
            .as_ref()
            .map(|n| format!("note: {n}\n"))
            .unwrap_or_default();
        if let Some(freed_by) = &self.freed_by {
            note.push_str(&format!("free only by {freed_by}\n"));
        }
        if let Some(t) = &self.no_takeover_before {
            note.push_str(&format!(
                "no takeover before {t} if it is not renewed (lease {} + grace, as seen from \
                 here)\n",
                self.lease.as_deref().unwrap_or("-")
            ));
        }
        let header = header.iter().map(|h| h.to_string()).collect();
        format!(
            "{}{note}{}{}{}{}",
            columns(&[header, row]),
            self.holders_table(wide),
            self.queue_table(),
            self.history_table(),
            self.runs_table()
        )
    }

    /// A key that remembers completed runs: "completed runs: N" and a row per run,
    /// the most recent last. Empty for a key without any.
    fn runs_table(&self) -> String {
        self.runs
            .as_ref()
            .map(CompletedRuns::table)
            .unwrap_or_default()
    }

    /// A queued key: "queue: N waiting" and a row per waiter in grant order. Empty
    /// for a key without a queue.
    fn queue_table(&self) -> String {
        let Some(queue) = &self.queue else {
            return String::new();
        };
        if queue.is_empty() {
            return "queue: empty\n".into();
        }
        let mut rows = vec![
            [
                "POSITION",
                "WAITER",
                "PRIORITY",
                "WEIGHT",
                "WAITING SINCE",
                "EXPECTED",
            ]
            .map(String::from)
            .to_vec(),
        ];
        let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        for w in queue {
            let mut priority = w.priority.to_string();
            if w.overtaken > 0 {
                priority.push_str(&format!(" (overtaken {})", w.overtaken));
            }
            rows.push(vec![
                w.position.to_string(),
                w.holder.clone(),
                priority,
                w.weight.to_string(),
                dash(&w.waiting_since),
                dash(&w.expected_start),
            ]);
        }
        format!("queue: {} waiting\n{}", queue.len(), columns(&rows))
    }

    /// With `--history`: the key's last grants, oldest first. Empty otherwise.
    fn history_table(&self) -> String {
        let Some(history) = &self.history else {
            return String::new();
        };
        if history.is_empty() {
            return "history: none\n".into();
        }
        let mut rows = vec![
            [
                "FENCE", "HOLDER", "CLUSTER", "ACQUIRED", "ENDED", "ENDED AT",
            ]
            .map(String::from)
            .to_vec(),
        ];
        let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        for g in history {
            rows.push(vec![
                g.fence.to_string(),
                g.holder.clone(),
                dash(&g.cluster),
                dash(&g.acquired_at),
                g.ended.clone(),
                dash(&g.ended_at),
            ]);
        }
        format!(
            "history: last {} grant{}, oldest first\n{}",
            history.len(),
            if history.len() == 1 { "" } else { "s" },
            columns(&rows)
        )
    }

    /// For a key with more than one permit: "N of M permits in use" and a row per
    /// holder. Empty otherwise.
    fn holders_table(&self, wide: bool) -> String {
        let (Some(total), Some(in_use)) = (self.permits, self.permits_in_use) else {
            return String::new();
        };
        let mut rows = vec![vec![
            "HOLDER".to_string(),
            "FENCE".into(),
            "MODE".into(),
            "LEASE".into(),
            "RENEWED".into(),
        ]];
        if wide {
            rows[0].extend(["ACQUIRED".to_string(), "NONCE".into(), "DATA".into()]);
        }
        for h in &self.holders {
            let mut row = vec![
                h.holder.clone(),
                h.fence.to_string(),
                h.mode.clone(),
                h.lease.clone(),
                h.renewed_at.clone().unwrap_or_else(|| "-".into()),
            ];
            if wide {
                row.extend([
                    h.acquired_at.clone().unwrap_or_else(|| "-".into()),
                    h.nonce.clone(),
                    h.data.clone().unwrap_or_else(|| "-".into()),
                ]);
            }
            rows.push(row);
        }
        let holders = self.holders.len();
        let mut out = format!(
            "{in_use} of {total} permits in use, {holders} holder{}\n",
            if holders == 1 { "" } else { "s" }
        );
        if holders > 0 {
            out.push_str(&columns(&rows));
        }
        out
    }
}

pub async fn run(args: StatusArgs) -> Result<u8, CliError> {
    // Only when asked: without permit flags, the holder table says it all.
    let asked = (args.permits != PermitArgs::default())
        .then(|| args.permits.permits())
        .transpose()?;
    let backend = args.url.connect(&args.backend.options(None)).await?;
    // A store that is still starting is retried for the connect timeout, as `lock` does.
    let stored = lockwarden_core::when_reachable(|| backend.inspect()).await?;
    let read_at = SystemTime::now();
    let note = stored.as_ref().and_then(|s| backend.note(s));
    // From the record just read: the same as `LockBackend::history`, without a second
    // read.
    let history = args
        .history
        .then(|| HistoryEntry::all(&history::of_stored(stored.as_ref())));
    let mut status = Status {
        note,
        history,
        ..Status::new(backend.url(), stored)
    };
    // The memory of completed runs of a store that keeps it beside the record.
    if let Some(runs) = backend.runs_beside_the_record().await? {
        status.runs = CompletedRuns::of(&runs);
    }
    let mut status = status.with_takeover(read_at, backend.margins().grace);
    if let Some(permits) = asked.and_then(|asked| status.permits_note(asked)) {
        status.note = Some(match status.note.take() {
            Some(note) => format!("{note}; {permits}"),
            None => permits,
        });
    }
    let text = match args.output {
        Some(Format::Json) => {
            serde_json::to_string_pretty(&status).expect("status serialises") + "\n"
        }
        Some(Format::Yaml) => serde_yaml_ng::to_string(&status).expect("status serialises"),
        Some(Format::Wide) => status.table(true),
        None => status.table(false),
    };
    print!("{text}");
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use lockwarden_core::{FenceToken, LockRecord, Mode, SetEntry, Version};

    fn semaphore_record() -> Stored {
        let entry = |holder: &str, fence: u64| {
            SetEntry::new(
                holder,
                FenceToken(fence),
                Duration::from_secs(30),
                Mode::Shared,
                None,
            )
        };
        let mut record =
            LockRecord::new_acquisition("a", FenceToken(8), Duration::from_secs(30), None);
        record.set = Some(HolderSet {
            permits: 3,
            holders: vec![entry("a", 7), entry("b", 8)],
            waiting_writer: None,
            queue: None,
            last_fence: FenceToken(8),
            unknown: Default::default(),
        });
        Stored {
            record: Ok(record),
            version: Version("v1".into()),
        }
    }

    #[test]
    fn a_queued_key_lists_its_waiters_in_grant_order() {
        use lockwarden_core::Queue;
        let waiter = |holder: &str, ticket, priority| {
            let mut w = SetEntry::new(
                holder,
                FenceToken(0),
                Duration::from_secs(10),
                Mode::Exclusive,
                None,
            );
            (w.ticket, w.priority) = (ticket, priority);
            w
        };
        let mut low = waiter("low", 2, 0);
        low.overtaken = 1;
        let mut record =
            LockRecord::new_acquisition("h", FenceToken(3), Duration::from_secs(30), None);
        record.set = Some(HolderSet {
            permits: 1,
            last_fence: FenceToken(3),
            holders: vec![waiter("h", 1, 0)],
            queue: Some(Queue {
                next_ticket: 4,
                waiters: vec![low, waiter("high", 3, 5)],
                hold_ms: vec![10_000],
                ..Queue::default()
            }),
            ..HolderSet::default()
        });
        let status = Status::new(
            "s3://b/k",
            Some(Stored {
                record: Ok(record),
                version: Version("v".into()),
            }),
        );
        let table = status.table(false);
        let lines: Vec<&str> = table.lines().collect();
        let at = lines
            .iter()
            .position(|l| *l == "queue: 2 waiting")
            .expect(&table);
        assert!(lines[at + 1].starts_with("POSITION"), "{table}");
        assert!(
            lines[at + 2].starts_with("0 ") && lines[at + 2].contains("high"),
            "{table}"
        );
        assert!(
            lines[at + 3].contains("low") && lines[at + 3].contains("0 (overtaken 1)"),
            "{table}"
        );
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["queue"][0]["holder"], "high");
        assert_eq!(json["queue"][1]["position"], 1);
        assert_eq!(json["queue"][1]["overtaken"], 1);
        assert!(json["queue"][1]["expectedStart"].is_string(), "{json}");
    }

    #[test]
    fn every_holder_of_a_semaphore_is_listed() {
        let status = Status::new("s3://b/k", Some(semaphore_record()));
        assert_eq!((status.permits, status.permits_in_use), (Some(3), Some(2)));
        let table = status.table(false);
        assert!(
            table.contains("2 of 3 permits in use, 2 holders"),
            "{table}"
        );
        let rows: Vec<&str> = table.lines().collect();
        let header = rows.iter().position(|l| l.starts_with("HOLDER")).unwrap();
        for (row, (holder, fence)) in rows[header + 1..].iter().zip([("a", "7"), ("b", "8")]) {
            let cells: Vec<&str> = row.split_whitespace().collect();
            assert_eq!(&cells[..4], [holder, fence, "shared", "30s"], "{table}");
        }
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["holders"][1]["fence"], 8);
        assert_eq!(json["permitsInUse"], 2);

        // A mutex's record: no holder lines at all (the output is as before).
        let mutex = Stored {
            record: Ok(LockRecord::new_acquisition(
                "a",
                FenceToken(1),
                Duration::from_secs(30),
                None,
            )),
            version: Version("v1".into()),
        };
        let status = Status::new("s3://b/k", Some(mutex));
        assert_eq!(status.table(false).lines().count(), 2);
        assert!(
            serde_json::to_value(&status)
                .unwrap()
                .get("holders")
                .is_none()
        );
    }

    #[test]
    fn an_s3lock_lease_never_expires_and_a_kafka_kit_holder_is_short_in_the_table() {
        let s3lock =
            lockwarden_stores::s3::parse_body(b"0d5e1f4c-3b1a-4c57-9d34-0c6a2f0e9a11", "e1")
                .expect("an s3lock body");
        let status = Status::new(
            "s3://b/k",
            Some(Stored {
                record: Ok(s3lock),
                version: Version("e1".into()),
            }),
        );
        assert_eq!(status.lease.as_deref(), Some("never expires"));
        let note = status.permits_note(Permits::semaphore(3)).unwrap();
        assert!(note.contains("waits until that lock is released"), "{note}");
        assert_eq!(status.lease_ms, None);
        let table = status.table(false);
        assert!(table.contains("never expires"), "{table}");
        assert!(!table.contains("years"), "{table}");

        let sentence = "foreign queue entry _c_9f-lock-0000000002: kafka-kit lock of \"kk, 1\", \
                        ttl_deadline passed at 2026-01-01T09:00:01Z: kafka-kit contenders with \
                        a TTL may delete it; lockwarden waits until it is deleted";
        assert_eq!(
            short_holder(sentence),
            "kafka-kit \"kk, 1\" (entry _c_9f-lock-0000000002)"
        );
        assert_eq!(
            short_holder("foreign queue entry x-0000000001: not a lockwarden lock record: …"),
            "another client (entry x-0000000001)"
        );
        assert_eq!(short_holder("alice@vm:1"), "alice@vm:1");
        let mut record =
            LockRecord::new_acquisition("h", FenceToken(3), Duration::from_secs(10), None);
        record.holder = sentence.into();
        let status = Status::new(
            "zk://127.0.0.1:2181/l",
            Some(Stored {
                record: Ok(record),
                version: Version("v".into()),
            }),
        );
        let status = status.with_takeover(SystemTime::now(), Duration::from_secs(1));
        let table = status.table(false);
        assert!(table.contains("kafka-kit \"kk, 1\" (entry "), "{table}");
        assert!(!table.contains("ttl_deadline"), "{table}");
        // lockwarden never takes over a kafka-kit entry: no time is promised.
        assert_eq!(status.no_takeover_before, None);
        assert!(!table.contains("no takeover before"), "{table}");
        assert!(
            table.contains("free only by the other client deleting its queue entry"),
            "{table}"
        );
        assert!(status.table(true).contains(sentence));
        assert_eq!(
            status.holder.as_deref(),
            Some(sentence),
            "JSON/YAML: the sentence"
        );
    }

    #[test]
    fn history_lists_the_grants_oldest_first_only_when_asked() {
        use lockwarden_core::history::{after_grant, of_stored};
        use lockwarden_core::{Ending, Grant};
        let first = LockRecord::new_acquisition("a", FenceToken(1), Duration::from_secs(30), None);
        let mut first = first;
        first.history = vec![Grant::new(
            "a",
            Some("east"),
            FenceToken(1),
            first.acquired_at,
        )];
        let mut second =
            LockRecord::new_acquisition("b", FenceToken(2), Duration::from_secs(30), None);
        let grant = Grant::new("b", Some("west"), FenceToken(2), second.acquired_at);
        second.history = after_grant(
            Some(&first.released()),
            Ending::Released,
            grant,
            SystemTime::now(),
        );
        let stored = Stored {
            record: Ok(second),
            version: Version("v2".into()),
        };
        let plain = Status::new("s3://b/k", Some(stored.clone()));
        assert_eq!(
            plain.table(false).lines().count(),
            2,
            "as before without --history"
        );
        assert!(
            serde_json::to_value(&plain)
                .unwrap()
                .get("history")
                .is_none()
        );
        let status = Status {
            history: Some(HistoryEntry::all(&of_stored(Some(&stored)))),
            ..Status::new("s3://b/k", Some(stored))
        };
        let table = status.table(false);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[2], "history: last 2 grants, oldest first", "{table}");
        let cells = |l: &str| l.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert_eq!(cells(lines[3])[..3], ["FENCE", "HOLDER", "CLUSTER"]);
        let (a, b) = (cells(lines[4]), cells(lines[5]));
        assert_eq!([&a[0], &a[1], &a[2], &a[4]], ["1", "a", "east", "released"]);
        assert_eq!([&b[0], &b[1], &b[2], &b[4]], ["2", "b", "west", "held"]);
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["history"][0]["ended"], "released");
        assert_eq!(json["history"][1]["cluster"], "west");
        assert!(json["history"][1].get("endedAt").is_none());
    }

    #[test]
    fn the_permits_note_answers_the_flags() {
        let status = Status::new("s3://b/k", Some(semaphore_record()));
        assert_eq!(
            status.permits_note(Permits::semaphore(3)).as_deref(),
            Some("1 of 3 permits free")
        );
        let other = status.permits_note(Permits::semaphore(2)).unwrap();
        assert!(other.contains("the key has 3 permits"), "{other}");
        let absent = Status::new("s3://b/k", None);
        assert_eq!(absent.permits_note(Permits::MUTEX), None);
        assert_eq!(
            absent.permits_note(Permits::semaphore(2)).as_deref(),
            Some("all 2 permits free")
        );
    }

    #[test]
    fn rule8_status_shows_when_a_held_record_could_be_taken_over_from_here() {
        // A holder of a 2 s lease with a 3 s lock-delay stores 5 s.
        let held = LockRecord::new_acquisition("a", FenceToken(1), Duration::from_secs(5), None);
        let read_at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let grace = Duration::from_millis(250);
        let stored = |record: LockRecord| Stored {
            record: Ok(record),
            version: Version("v1".into()),
        };
        let status =
            Status::new("s3://b/k", Some(stored(held.clone()))).with_takeover(read_at, grace);
        let expected = lockwarden_core::rfc3339(read_at + Duration::from_millis(5_250));
        assert_eq!(
            status.no_takeover_before.as_deref(),
            Some(expected.as_str())
        );
        let table = status.table(false);
        assert!(
            table.contains(&format!(
                "no takeover before {expected} if it is not renewed"
            )),
            "{table}"
        );
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["noTakeoverBefore"], expected.as_str());
        // A release is free at once: nothing to wait for.
        let released =
            Status::new("s3://b/k", Some(stored(held.released()))).with_takeover(read_at, grace);
        assert_eq!(released.no_takeover_before, None);
        assert!(!released.table(false).contains("no takeover"));
    }
}

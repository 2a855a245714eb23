//! Options and results: what the parts measure, collected in one [`Report`].

use super::*;

// ---------------------------------------------------------------------------------
// Options and results

#[derive(Clone, Debug)]
pub(crate) struct Opts {
    pub(crate) quick: bool,
    pub(crate) only: Option<String>,
}

impl Opts {
    pub(crate) fn runs(&self, part: &str) -> bool {
        self.only
            .as_deref()
            .is_none_or(|o| o.split(',').any(|p| p == part))
    }
    /// Full count, or a fifth of it (at least 3) with --quick.
    pub(crate) fn n(&self, full: usize) -> usize {
        if self.quick { (full / 5).max(3) } else { full }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Floor {
    pub(crate) n: usize,
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) create_p50: f64,
    pub(crate) ops_per_s: f64,
    pub(crate) writers: usize,
}

#[derive(Clone, Debug)]
pub(crate) struct Row {
    pub(crate) part: &'static str,
    pub(crate) kind: Kind,
    pub(crate) what: String,
    pub(crate) n: usize,
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) round_trips: Option<f64>,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct ScaleRow {
    pub(crate) kind: String,
    pub(crate) path: String,
    pub(crate) locks: usize,
    pub(crate) interval_s: f64,
    pub(crate) hold_s: f64,
    pub(crate) acquire_all_s: f64,
    pub(crate) renewals: f64,
    pub(crate) renewals_expected: f64,
    pub(crate) missed: f64,
    pub(crate) cpu_per_1k_renewals_per_s: f64,
    pub(crate) peak_rss_mb: f64,
    pub(crate) rss_per_1k_mb: f64,
    pub(crate) status_writes_per_renewal: Option<f64>,
    pub(crate) note: String,
}

/// Part 6: one lock + unlock cycle of the CLI against the Go baseline, p50 of
/// (lockwarden, Go) for wall ms, CPU ms and peak RSS MiB.
#[derive(Clone, Debug)]
pub(crate) struct CliRow {
    pub(crate) kind: Kind,
    pub(crate) n: usize,
    pub(crate) wall: (f64, f64),
    pub(crate) cpu: (f64, f64),
    pub(crate) rss: (f64, f64),
}

/// Part 7: one series of the node part, in ms.
#[derive(Clone, Debug)]
pub(crate) struct NodeRow {
    pub(crate) what: String,
    pub(crate) n: usize,
    pub(crate) p50: f64,
    pub(crate) p90: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

/// Part 7: the Job-to-Job hand-off on a real node, the ungated Job's start (its floor)
/// and the hand-off's stages.
#[derive(Clone, Debug)]
pub(crate) struct NodePart {
    pub(crate) handoff: NodeRow,
    /// The hand-off's part from the lock released to the second Job started.
    pub(crate) lockwarden: NodeRow,
    /// The hand-off's part from the second Job started to its container's first line.
    pub(crate) start: NodeRow,
    pub(crate) floor: NodeRow,
    pub(crate) stages: Vec<NodeRow>,
}

#[derive(Default)]
pub(crate) struct Report {
    pub(crate) floors: BTreeMap<Kind, Floor>,
    pub(crate) rows: Vec<Row>,
    pub(crate) throughput: Vec<(Kind, f64, f64, usize)>, // engine ops/s, raw ops/s, writers
    /// The engine's writes through the store layer alone, writes/s (same writers).
    pub(crate) store_throughput: BTreeMap<Kind, f64>,
    /// p50 ms of one lockwarden record write through the store layer alone.
    pub(crate) store_write_p50: BTreeMap<Kind, f64>,
    /// Same-cluster hand-off: p50 ms from the delete request to the holder's object
    /// gone (its finalizer done), and to the waiter's `Acquired`.
    pub(crate) handoff_stages: BTreeMap<Kind, (f64, f64)>,
    /// p50 ms of the status write on the hand-off path: server-side apply (what the
    /// controller sends) and a JSON merge patch of the same status.
    pub(crate) status_write: Option<(f64, f64)>,
    /// p50 ms from the holder's `DELETE` request to a watch seeing its deletion
    /// timestamp: the hand-off's first step.
    pub(crate) delete_seen: BTreeMap<Kind, f64>,
    /// p50 ms from the waiter's status write (server-side apply) to a watch seeing it:
    /// the hand-off's last step.
    pub(crate) status_write_seen: Option<f64>,
    /// p50 ms (and n) of the waiter's `Acquired` status write on the hand-off's path,
    /// sent → answered at the in-process controller's client.
    pub(crate) status_write_on_path: BTreeMap<Kind, (f64, usize)>,
    /// p50 ms (and n) of the release's and the acquisition's store writes together on
    /// the hand-off's path, where the store is the API server (Leases): sent → answered
    /// at the in-process controller's client.
    pub(crate) store_writes_on_path: BTreeMap<Kind, (f64, usize)>,
    pub(crate) takeover: Vec<(Kind, f64, f64, f64, usize)>, // p50, max, bound, n
    pub(crate) scale: Vec<ScaleRow>,
    pub(crate) cli: Vec<CliRow>,
    pub(crate) node: Option<NodePart>,
    pub(crate) plots: Vec<(Kind, String, Vec<f64>)>,
    pub(crate) notes: Vec<String>,
    /// The S3 server's name and its measured conditional writes/s (8 writers).
    pub(crate) s3_capacity: Option<(&'static str, f64)>,
    /// Which servers played S3 and DynamoDB (`support::stores`).
    pub(crate) aws_servers: Option<(&'static str, &'static str)>,
}

pub(crate) type Shared = Arc<Mutex<Report>>;

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Nearest-rank percentile of unsorted samples.
pub(crate) fn pct(samples: &[f64], q: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut v = samples.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

pub(crate) fn add_row(
    report: &Shared,
    part: &'static str,
    kind: Kind,
    what: &str,
    samples: &[f64],
    round_trips: Option<f64>,
) {
    let mut r = report.lock().unwrap();
    r.rows.push(Row {
        part,
        kind,
        what: what.to_string(),
        n: samples.len(),
        p50: pct(samples, 0.5),
        p99: pct(samples, 0.99),
        round_trips,
    });
    r.plots
        .push((kind, format!("{part}: {what}"), samples.to_vec()));
    eprintln!(
        "[bench] {part} {} {what}: n={} p50={:.2} ms p99={:.2} ms rt={round_trips:?}",
        kind.name(),
        samples.len(),
        pct(samples, 0.5),
        pct(samples, 0.99)
    );
}

pub(crate) fn note(report: &Shared, text: String) {
    eprintln!("[bench] note: {text}");
    report.lock().unwrap().notes.push(text);
}

//! `lockwarden status URL`: the lock record as stored, without acquiring.

use std::time::{Duration, SystemTime};

use clap::{Args, ValueEnum};
use serde::Serialize;

use super::{BackendArgs, CliError, exit};
use crate::backend::Target;
use crate::lock::{LockState, Stored};

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The lock: s3://BUCKET/KEY, dynamodb://TABLE/KEY, zk://HOST:PORT[,HOST:PORT...]/PATH or k8s://NAMESPACE/LEASE-NAME
    #[arg(value_name = "URL", value_parser = super::parse_target)]
    pub url: Target,

    /// Output format [default: a table]
    #[arg(short, long, value_enum, value_name = "FORMAT")]
    pub output: Option<Format>,

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
}

fn rfc3339(t: SystemTime) -> Option<String> {
    (t > SystemTime::UNIX_EPOCH).then(|| crate::lock::rfc3339(t))
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
                s.holder = Some(r.holder).filter(|h| !h.is_empty());
                s.fence = Some(r.fence.0);
                s.nonce = Some(r.nonce).filter(|n| !n.is_empty());
                s.lease = Some(humantime::format_duration(r.lease).to_string());
                s.lease_ms = Some(r.lease.as_millis() as u64);
                s.acquired_at = rfc3339(r.acquired_at);
                s.renewed_at = rfc3339(r.renewed_at);
                s.data = r.data;
            }
        }
        s
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
        let mut row = vec![
            self.url.clone(),
            self.state.to_string(),
            dash(self.holder.clone()),
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
        let widths: Vec<usize> = header
            .iter()
            .zip(&row)
            .map(|(h, v)| h.chars().count().max(v.chars().count()))
            .collect();
        let line = |cells: Vec<String>| {
            let last = cells.len() - 1;
            cells
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    if i == last {
                        c.clone()
                    } else {
                        format!("{c:<w$}", w = widths[i])
                    }
                })
                .collect::<Vec<_>>()
                .join("   ")
        };
        let note = self
            .note
            .as_ref()
            .map(|n| format!("note: {n}\n"))
            .unwrap_or_default();
        format!(
            "{}\n{}\n{note}",
            line(header.iter().map(|h| h.to_string()).collect()),
            line(row)
        )
    }
}

pub async fn run(args: StatusArgs) -> Result<u8, CliError> {
    let backend = args.url.connect(&args.backend.options(None)).await?;
    // A store that is still starting is retried for the connect timeout, as `lock` does.
    let stored = crate::lock::when_reachable(|| backend.inspect()).await?;
    let note = stored.as_ref().and_then(|s| backend.note(s));
    let status = Status {
        note,
        ..Status::new(backend.url(), stored)
    };
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

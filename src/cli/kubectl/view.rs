//! `kubectl lockwarden status` and `history`: a DistributedLock as its status, the
//! other locks of this cluster on the same key, and its Events say it.

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde::Serialize;

use super::{Cluster, Output, api_error, render};
use crate::cli::CliError;
use crate::cli::output::columns;
use crate::cli::status::CompletedRuns;
use lockwarden_api::conditions::{self, ACQUIRED};
use lockwarden_api::{DistributedLock, HistoryEntry, LockPhase};
use lockwarden_controller::gating::CLAIM_ANNOTATION;

/// How many of an object's Events `status` and `why` show: the last ones.
const EVENTS_SHOWN: usize = 10;

/// One DistributedLock as `status` shows it; also the JSON / YAML document.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LockView {
    pub namespace: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The key's holder as this lock last saw it: itself when Held, the one it waits
    /// for when Waiting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// That holder's fence (status.fence when Held; when Waiting, the fence the key's
    /// history gives the current grant).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder_since: Option<String>,
    pub permits: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permits_in_use: Option<u32>,
    pub lease_duration: String,
    pub renew_interval: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acquired_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renewed_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_expires_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_since: Option<String>,
    /// The workload that claims it (`Job x`, `Pod y`), or owns it (a template's copy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_by: Option<String>,
    pub queue: Queue,
    /// The locks of this cluster holding the same key (every namespace the caller may
    /// list).
    pub holders_here: Vec<Peer>,
    /// The locks of this cluster waiting for the same key.
    pub waiting_here: Vec<Peer>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub condition: Option<ConditionView>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<EventView>,
}

/// The lock's place in its store's queue.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Queue {
    /// 0 = next; `None` when not known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<i32>,
    /// What the position means, or why it is not known.
    pub note: String,
}

/// Another lock of this cluster on the same key.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Peer {
    /// `namespace/name`.
    pub lock: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_expires_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_by: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ConditionView {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventView {
    #[serde(rename = "type")]
    pub type_: String,
    pub reason: String,
    pub message: String,
    pub count: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<String>,
}

fn time(t: &Option<Time>) -> Option<String> {
    t.as_ref().map(|t| t.0.to_string())
}

/// `5m ago` for an RFC 3339 time; empty when it does not parse.
pub(super) fn ago(t: &str) -> String {
    let Ok(then) = t.parse::<k8s_openapi::jiff::Timestamp>() else {
        return String::new();
    };
    let secs = k8s_openapi::jiff::Timestamp::now().as_second() - then.as_second();
    let secs = u64::try_from(secs).unwrap_or(0);
    format!(
        "{} ago",
        humantime::format_duration(std::time::Duration::from_secs(secs))
    )
}

/// Who uses a lock: its claimant (`Job x`, `Pod y`), else the workload owning it (a
/// template's copy).
pub(super) fn used_by(lock: &DistributedLock) -> Option<String> {
    let kinds = lockwarden_controller::gated_kinds();
    if let Some(claim) = lock.annotations().get(CLAIM_ANNOTATION) {
        return Some(match kinds.claimant(claim) {
            Some(c) => format!("{} {}", c.kind.as_str(), c.name),
            None => claim.clone(),
        });
    }
    lock.owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| format!("{} {}", o.kind, o.name))
}

/// The current grant in the key's history (`ended: held`): its fence and when it was
/// granted. A waiting lock's status names the holder but not its fence.
fn current_grant(history: &[HistoryEntry], holder: &str) -> Option<(i64, Option<String>)> {
    history
        .iter()
        .rev()
        .find(|g| g.ended == "held" && g.holder == holder)
        .map(|g| (g.fence, time(&g.acquired_at)))
}

/// Every lock of this cluster on `key` except `except` (namespace, name): every
/// namespace when the caller may list them all, else `namespace` alone.
pub(super) async fn same_key(
    client: &Client,
    namespace: &str,
    key: &str,
    except: (&str, &str),
) -> Result<Vec<DistributedLock>, CliError> {
    let everywhere = Api::<DistributedLock>::all(client.clone());
    let all = match everywhere.list(&ListParams::default()).await {
        Ok(list) => list.items,
        // Forbidden across namespaces (a namespaced Role): this namespace's locks.
        Err(kube::Error::Api(s)) if s.code == 403 => {
            Api::<DistributedLock>::namespaced(client.clone(), namespace)
                .list(&ListParams::default())
                .await
                .map_err(api_error(format!(
                    "cannot list the DistributedLocks of namespace {namespace}"
                )))?
                .items
        }
        Err(e) => return Err(api_error("cannot list DistributedLocks")(e)),
    };
    Ok(all
        .into_iter()
        .filter(|l| l.status.as_ref().and_then(|s| s.key.as_deref()) == Some(key))
        .filter(|l| {
            (
                l.namespace().as_deref().unwrap_or_default(),
                l.name_any().as_str(),
            ) != except
        })
        .collect())
}

fn peer(lock: &DistributedLock) -> Peer {
    let status = lock.status.clone().unwrap_or_default();
    Peer {
        lock: format!(
            "{}/{}",
            lock.namespace().unwrap_or_default(),
            lock.name_any()
        ),
        holder: status.holder,
        fence: status.fence,
        lease_expires_at: time(&status.lease_expires_at),
        queue_position: status.queue_position,
        used_by: used_by(lock),
    }
}

/// The last Events about the object with this uid (core/v1, oldest first).
pub(super) async fn events(
    client: &Client,
    namespace: &str,
    uid: &str,
) -> Result<Vec<EventView>, CliError> {
    let api = Api::<Event>::namespaced(client.clone(), namespace);
    let mut list = api
        .list(&ListParams::default().fields(&format!("involvedObject.uid={uid}")))
        .await
        .map_err(api_error(format!(
            "cannot list the Events of namespace {namespace}"
        )))?
        .items;
    let when = |e: &Event| {
        e.series
            .as_ref()
            .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0))
            .or(e.last_timestamp.as_ref().map(|t| t.0))
            .or(e.event_time.as_ref().map(|t| t.0))
            .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0))
    };
    list.sort_by_key(when);
    let skip = list.len().saturating_sub(EVENTS_SHOWN);
    Ok(list
        .into_iter()
        .skip(skip)
        .map(|e| EventView {
            last_seen: when(&e).map(|t| t.to_string()),
            type_: e.type_.unwrap_or_default(),
            reason: e.reason.unwrap_or_default(),
            message: e.message.unwrap_or_default(),
            count: e.series.and_then(|s| s.count).or(e.count).unwrap_or(1),
        })
        .collect())
}

/// The lock named, or a one-line "not found" naming the namespace.
pub(super) async fn get_lock(cluster: &Cluster, name: &str) -> Result<DistributedLock, CliError> {
    Api::<DistributedLock>::namespaced(cluster.client.clone(), &cluster.namespace)
        .get_opt(name)
        .await
        .map_err(api_error(format!("cannot read DistributedLock {name}")))?
        .ok_or_else(|| {
            CliError::NotFound(format!(
                "DistributedLock {name} not found in namespace {}",
                cluster.namespace
            ))
        })
}

/// The key's history and its memory of completed runs as its store keeps them now: the
/// same reads as `lockwarden status --history`, with the same credentials (this
/// process's environment).
async fn store_history(key: &str) -> Result<(Vec<HistoryEntry>, Option<CompletedRuns>), CliError> {
    let target = lockwarden_stores::Target::parse(key)?;
    let backend = target
        .connect(&crate::cli::BackendArgs::default().options(None))
        .await?;
    let grants = lockwarden_core::when_reachable(|| backend.history()).await?;
    let runs = CompletedRuns::read(backend.as_ref()).await?;
    Ok((
        lockwarden_controller::status::history_entries(&grants),
        runs,
    ))
}

/// What a lock's status says, without the cluster's other locks or Events.
pub(super) fn lock_view(lock: &DistributedLock) -> LockView {
    let status = lock.status.clone().unwrap_or_default();
    let history = status.history.clone().unwrap_or_default();
    let waiting = status.phase == Some(LockPhase::Waiting);
    let (fence, holder_since) = match (&status.holder, status.fence) {
        (_, Some(fence)) => (Some(fence), time(&status.acquired_at)),
        (Some(holder), None) => current_grant(&history, holder)
            .map(|(f, at)| (Some(f), at))
            .unwrap_or((None, None)),
        (None, None) => (None, None),
    };
    let backend = status.backend.clone();
    let queue = match (status.queue_position, waiting) {
        (Some(p), _) => Queue {
            position: Some(p),
            note: "in the store's queue; 0 is next".into(),
        },
        (None, true) => Queue {
            position: None,
            note: format!(
                "not known: this lock does not wait in the {} key's queue (no \
                 spec.queue); whichever waiter tries first after the key is free takes it",
                backend.as_deref().unwrap_or("lock's")
            ),
        },
        (None, false) => Queue {
            position: None,
            note: "not waiting".into(),
        },
    };
    let condition =
        conditions::find_condition(&status.conditions, ACQUIRED).map(|c| ConditionView {
            type_: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
        });
    LockView {
        namespace: lock.namespace().unwrap_or_default(),
        name: lock.name_any(),
        backend,
        key: status.key.clone(),
        phase: status.phase.map(|p| p.to_string()),
        holder: status.holder.clone(),
        fence,
        holder_since,
        permits: lock.spec.permits,
        permits_in_use: status.permits_in_use,
        lease_duration: lock.spec.lease_duration.clone(),
        renew_interval: lock.spec.renew_interval.clone(),
        acquired_at: time(&status.acquired_at),
        renewed_at: time(&status.renewed_at),
        lease_expires_at: time(&status.lease_expires_at),
        waiting_since: time(&status.waiting_since),
        used_by: used_by(lock),
        queue,
        holders_here: Vec::new(),
        waiting_here: Vec::new(),
        condition,
        events: Vec::new(),
    }
}

/// [`lock_view`] with the cluster's other locks on the key.
pub(super) async fn lock_view_with_peers(
    cluster: &Cluster,
    lock: &DistributedLock,
) -> Result<LockView, CliError> {
    let mut view = lock_view(lock);
    if let Some(key) = &view.key {
        let peers = same_key(
            &cluster.client,
            &view.namespace,
            key,
            (&view.namespace, &view.name),
        )
        .await?;
        let phase = |l: &DistributedLock| l.status.as_ref().and_then(|s| s.phase);
        view.holders_here = peers
            .iter()
            .filter(|l| phase(l) == Some(LockPhase::Held))
            .map(peer)
            .collect();
        view.waiting_here = peers
            .iter()
            .filter(|l| phase(l) == Some(LockPhase::Waiting))
            .map(peer)
            .collect();
    }
    Ok(view)
}

pub async fn status(
    cluster: &Cluster,
    name: &str,
    output: Option<Output>,
) -> Result<String, CliError> {
    let lock = get_lock(cluster, name).await?;
    let mut view = lock_view_with_peers(cluster, &lock).await?;
    let uid = lock.uid().unwrap_or_default();
    view.events = events(&cluster.client, &view.namespace, &uid).await?;
    Ok(match output {
        Some(o) => render(&view, o),
        None => status_text(&view),
    })
}

fn dash(v: &Option<String>) -> String {
    v.clone().unwrap_or_else(|| "-".into())
}

fn with_ago(t: &Option<String>) -> String {
    match t {
        Some(t) => format!("{t} ({})", ago(t)),
        None => "-".into(),
    }
}

fn peer_line(p: &Peer) -> String {
    let mut line = p.lock.clone();
    if let Some(h) = &p.holder {
        line.push_str(&format!(" holder {h}"));
    }
    if let Some(f) = p.fence {
        line.push_str(&format!(" fence {f}"));
    }
    if let Some(q) = p.queue_position {
        line.push_str(&format!(" position {q}"));
    }
    if let Some(u) = &p.used_by {
        line.push_str(&format!(" (used by {u})"));
    }
    line
}

/// The text of `status dlock/NAME`: one `Label: value` a line, like `kubectl describe`.
fn status_text(v: &LockView) -> String {
    let mut out = String::new();
    let mut line = |label: &str, value: String| out.push_str(&format!("{label:<14}{value}\n"));
    line("Name:", v.name.clone());
    line("Namespace:", v.namespace.clone());
    line("Key:", format!("{} ({})", dash(&v.key), dash(&v.backend)));
    line("Phase:", dash(&v.phase));
    let holder = match (&v.holder, v.fence) {
        (Some(h), Some(f)) => format!("{h}, fence {f}"),
        (Some(h), None) => format!("{h}, fence not known"),
        _ => "-".into(),
    };
    line("Holder:", holder);
    if v.holder_since.is_some() {
        line("Held since:", with_ago(&v.holder_since));
    }
    line(
        "Lease:",
        format!(
            "{}, renewed every {}{}",
            v.lease_duration,
            v.renew_interval,
            v.lease_expires_at
                .as_ref()
                .map(|t| format!("; expires without renewal at {t}"))
                .unwrap_or_default()
        ),
    );
    if v.permits > 1 {
        line(
            "Permits:",
            format!(
                "{} ({} in use as last seen)",
                v.permits,
                v.permits_in_use.map_or("-".to_string(), |n| n.to_string())
            ),
        );
    }
    if v.waiting_since.is_some() {
        line("Waiting since:", with_ago(&v.waiting_since));
    }
    line("Queue:", v.queue.note.clone());
    line("Used by:", dash(&v.used_by));
    if let Some(c) = &v.condition {
        line(
            "Acquired:",
            format!("{} ({}): {}", c.status, c.reason, c.message),
        );
    }
    let peers = |list: &[Peer]| -> String {
        if list.is_empty() {
            "none".into()
        } else {
            list.iter().map(peer_line).collect::<Vec<_>>().join("; ")
        }
    };
    line("Held here by:", peers(&v.holders_here));
    line("Waiting here:", peers(&v.waiting_here));
    out.push_str(&events_text(&v.events));
    out
}

/// `Events:` and a kubectl-describe-like table, or `Events: none`.
pub(super) fn events_text(events: &[EventView]) -> String {
    if events.is_empty() {
        return "Events:       none\n".into();
    }
    let mut rows = vec![vec![
        "TYPE".to_string(),
        "REASON".into(),
        "AGE".into(),
        "COUNT".into(),
        "MESSAGE".into(),
    ]];
    for e in events {
        rows.push(vec![
            e.type_.clone(),
            e.reason.clone(),
            e.last_seen
                .as_deref()
                .map(|t| ago(t).trim_end_matches(" ago").to_string())
                .unwrap_or_else(|| "-".into()),
            e.count.to_string(),
            e.message.clone(),
        ]);
    }
    let mut out = String::from("Events:\n");
    for l in columns(&rows).lines() {
        out.push_str(&format!("  {l}\n"));
    }
    out
}

/// `status` without a name: every lock of `namespace` (`None`: of every namespace).
pub async fn list(
    client: &Client,
    namespace: Option<&str>,
    output: Option<Output>,
) -> Result<String, CliError> {
    let api = match namespace {
        Some(ns) => Api::<DistributedLock>::namespaced(client.clone(), ns),
        None => Api::<DistributedLock>::all(client.clone()),
    };
    let locks = api
        .list(&ListParams::default())
        .await
        .map_err(api_error("cannot list DistributedLocks"))?
        .items;
    let views: Vec<LockView> = locks.iter().map(lock_view).collect();
    if let Some(o) = output {
        return Ok(render(&views, o));
    }
    if views.is_empty() {
        return Ok(match namespace {
            Some(ns) => format!("No DistributedLocks in namespace {ns}.\n"),
            None => "No DistributedLocks.\n".into(),
        });
    }
    let mut header = vec![
        "NAME", "PHASE", "HOLDER", "FENCE", "QUEUE", "USED BY", "KEY",
    ];
    if namespace.is_none() {
        header.insert(0, "NAMESPACE");
    }
    let mut rows = vec![header.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    for v in &views {
        let mut row = vec![
            v.name.clone(),
            dash(&v.phase),
            dash(&v.holder),
            v.fence.map_or("-".into(), |f| f.to_string()),
            v.queue.position.map_or("-".into(), |p| p.to_string()),
            dash(&v.used_by),
            dash(&v.key),
        ];
        if namespace.is_none() {
            row.insert(0, v.namespace.clone());
        }
        rows.push(row);
    }
    Ok(columns(&rows))
}

/// `history dlock/NAME`: the JSON / YAML document.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryView {
    pub namespace: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Where the grants come from, and how fresh they are.
    pub source: String,
    /// Oldest first.
    pub history: Vec<HistoryEntry>,
    /// With `--store`: the key's memory of completed runs (docs/design.md §6.7), when
    /// it remembers any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runs: Option<CompletedRuns>,
}

/// Where `history` reads the grants, in words.
const FROM_STATUS: &str = "status.history: the store's holder history of the key as this \
     lock's controller last mirrored it (on the status writes it makes anyway: acquired, \
     waiting for another holder); it needs no store credentials";
const FROM_STORE: &str = "the store: the key's holder history as stored now, read with this \
     environment's credentials for the store";

pub async fn history(
    cluster: &Cluster,
    name: &str,
    from_store: bool,
    output: Option<Output>,
) -> Result<String, CliError> {
    let lock = get_lock(cluster, name).await?;
    let status = lock.status.clone().unwrap_or_default();
    let (history, runs) = if from_store {
        let key = status.key.clone().ok_or_else(|| {
            CliError::Usage(format!(
                "DistributedLock {name} names no key in its status yet (the controller has \
                 not reported on it): its store cannot be read"
            ))
        })?;
        store_history(&key).await?
    } else {
        (status.history.clone().unwrap_or_default(), None)
    };
    let view = HistoryView {
        namespace: cluster.namespace.clone(),
        name: name.to_string(),
        key: status.key.clone(),
        source: if from_store { FROM_STORE } else { FROM_STATUS }.into(),
        history,
        runs,
    };
    if let Some(o) = output {
        return Ok(render(&view, o));
    }
    let key = dash(&view.key);
    let mut out = format!("Key {key} of DistributedLock {}/{name}\n", view.namespace);
    out.push_str(&if from_store {
        "Source: the store, as stored now\n".to_string()
    } else {
        format!(
            "Source: status.history, as last mirrored by the controller (the store's own \
             copy: --store, or lockwarden status --history {key})\n"
        )
    });
    let runs = view.runs.as_ref().map(CompletedRuns::table);
    if view.history.is_empty() {
        out.push_str("No grants recorded yet.\n");
        out.push_str(&runs.unwrap_or_default());
        return Ok(out);
    }
    let mut rows = vec![
        [
            "FENCE", "HOLDER", "CLUSTER", "ACQUIRED", "ENDED", "ENDED AT",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for g in &view.history {
        rows.push(vec![
            g.fence.to_string(),
            g.holder.clone(),
            dash(&g.cluster),
            dash(&time(&g.acquired_at)),
            g.ended.clone(),
            dash(&time(&g.ended_at)),
        ]);
    }
    out.push_str(&columns(&rows));
    out.push_str(&runs.unwrap_or_default());
    Ok(out)
}

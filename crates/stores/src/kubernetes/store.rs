//! The Lease [`RecordStore`]: one lock key, one Lease (see the module above).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::Lease as KubeLease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::{Api, Client};

use lockwarden_core::RunMemory;
use lockwarden_core::history::{self, Grant};
use lockwarden_core::{
    ANOTHER_TOOL_NONCE_PREFIX, FenceToken, ForeignRecord, HolderSet, LockRecord, LockState,
    RecordStore, StoreError, Stored, UnknownFields, Version,
};

const NONCE: &str = "lockwarden.io/nonce";
const REVISION: &str = "lockwarden.io/revision";
const LEASE_MS: &str = "lockwarden.io/lease-ms";
const STATE: &str = "lockwarden.io/state";
const DATA: &str = "lockwarden.io/data";
const HOLDER: &str = "lockwarden.io/holder";
/// The holder set of a key with more than one permit (JSON); absent on mutexes.
const HOLDERS: &str = "lockwarden.io/holders";
/// The key's holder history (JSON, `lockwarden_core::history`); absent when empty.
const HISTORY: &str = "lockwarden.io/history";
/// The key's memory of completed runs (JSON, `lockwarden_core::runs`, docs/design.md
/// §6.7); absent on keys never used with a run key.
const RUNS: &str = "lockwarden.io/runs";
/// Every annotation this build writes.
const OURS: [&str; 9] = [
    NONCE, REVISION, LEASE_MS, STATE, DATA, HOLDER, HOLDERS, HISTORY, RUNS,
];
/// The prefix of lockwarden's annotations: those this build does not know are a newer
/// build's, read into [`LockRecord::unknown`].
const PREFIX: &str = "lockwarden.io/";
/// Annotations of ours that a record may leave out (then removed from the Lease).
const OPTIONAL: [&str; 4] = [DATA, HOLDERS, HISTORY, RUNS];

/// What a written Lease's reply is read for.
#[derive(serde::Deserialize)]
struct Written {
    metadata: WrittenMetadata,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WrittenMetadata {
    resource_version: String,
}

/// One lock as a Lease in a namespace.
pub struct LeaseStore {
    api: Api<KubeLease>,
    /// The client of `api`, for the update whose reply is read for its version only.
    client: Client,
    name: String,
    url: String,
    /// The Lease as this store last read or wrote it: the base of the next update.
    last: std::sync::Mutex<Option<KubeLease>>,
}

impl LeaseStore {
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        LeaseStore {
            api: Api::namespaced(client.clone(), namespace),
            client,
            name: name.to_string(),
            url: format!("k8s://{namespace}/{name}"),
            last: std::sync::Mutex::new(None),
        }
    }

    /// `record` as a Lease. `base`: the Lease it replaces, as read, whose annotations,
    /// labels and spec fields other than lockwarden's are carried over (an update
    /// replaces the whole object); `None` for a new Lease.
    fn to_lease(&self, record: &LockRecord, base: Option<KubeLease>) -> KubeLease {
        let released = record.state == LockState::Released;
        let mut lease = base.unwrap_or_default();
        lease.metadata.name = Some(self.name.clone());
        // The server keeps its own record of field managers when none is sent.
        lease.metadata.managed_fields = None;
        let annotations = lease.metadata.annotations.get_or_insert_default();
        for optional in OPTIONAL {
            annotations.remove(optional);
        }
        // A newer build's annotations first, so that none can take the name of ours.
        annotations.extend(
            record
                .unknown
                .iter()
                .map(|(name, value)| (name.clone(), annotation_text(value))),
        );
        annotations.extend([
            (NONCE.to_string(), record.nonce.clone()),
            (REVISION.to_string(), record.revision.clone()),
            (LEASE_MS.to_string(), record.lease.as_millis().to_string()),
            (
                STATE.to_string(),
                if released { "released" } else { "held" }.to_string(),
            ),
            (HOLDER.to_string(), record.holder.clone()),
        ]);
        if let Some(d) = &record.data {
            annotations.insert(DATA.to_string(), d.clone());
        }
        if let Some(set) = &record.set {
            annotations.insert(HOLDERS.to_string(), set.to_json());
        }
        if !record.history.is_empty() {
            annotations.insert(HISTORY.to_string(), history::to_text(&record.history));
        }
        if !record.runs.is_empty() {
            annotations.insert(RUNS.to_string(), record.runs.to_text());
        }
        lease.metadata.labels.get_or_insert_default().insert(
            "app.kubernetes.io/managed-by".to_string(),
            "lockwarden".to_string(),
        );
        let spec = lease.spec.get_or_insert_default();
        // client-go treats an empty holder as free.
        spec.holder_identity = Some(if released {
            String::new()
        } else {
            record.holder.clone()
        });
        spec.lease_duration_seconds = Some(lease_seconds(record.lease));
        spec.lease_transitions = Some(i32::try_from(record.fence.0).unwrap_or(i32::MAX));
        spec.acquire_time = Some(micro_time(record.acquired_at));
        spec.renew_time = Some(micro_time(record.renewed_at));
        lease
    }

    /// `PUT`s `lease` (whose `resourceVersion` is the condition) and returns the new
    /// version. Of the reply only the version is read: the Lease it echoes is mostly
    /// managed fields, whose parse cost more than the rest of a renewal's own work.
    async fn put(&self, lease: &KubeLease) -> Result<String, kube::Error> {
        let body = serde_json::to_vec(lease).map_err(kube::Error::SerdeError)?;
        let mut request = kube::core::Request::new(self.api.resource_url())
            .replace(&self.name, &PostParams::default(), body)
            .map_err(kube::Error::BuildRequest)?;
        // As `Api::replace` marks it, for the client's tracing and metrics layers.
        request.extensions_mut().insert("replace");
        let written: Written = self.client.request(request).await?;
        Ok(written.metadata.resource_version)
    }

    /// Remembers the Lease as read or written: the base of the next update. Without
    /// its managed fields, which an update does not send back (and which are most of
    /// a Lease's size).
    fn remember(&self, lease: &KubeLease) {
        let mut lease = lease.clone();
        lease.metadata.managed_fields = None;
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(lease);
    }

    /// The Lease at `expected`, to carry over into an update: the one last read or
    /// written if it is at that version, else read now. A Lease at another version
    /// (or none) means the update's condition fails: a conflict, certainly not applied.
    async fn base_at(&self, expected: &Version) -> Result<KubeLease, StoreError> {
        let at_expected =
            |l: &KubeLease| l.metadata.resource_version.as_deref() == Some(expected.0.as_str());
        // Taken, not cloned (a renewal's hot path): a write that succeeds puts the
        // Lease it wrote back; after a failed one the next update reads it again.
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(lease) = last.filter(at_expected) {
            return Ok(lease);
        }
        match self.api.get_opt(&self.name).await {
            Ok(Some(lease)) => {
                self.remember(&lease);
                if at_expected(&lease) {
                    Ok(lease)
                } else {
                    Err(StoreError::Conflict {
                        current: Some(Box::new(stored(&lease))),
                    })
                }
            }
            Ok(None) => Err(StoreError::Conflict { current: None }),
            Err(e) => Err(self.classify(e, "GET").for_read()),
        }
    }

    /// The fence is `leaseTransitions`, an int32: a fence beyond it cannot be stored,
    /// and storing a smaller one would hand the same fence to two holders.
    fn check_fence(record: &LockRecord) -> Result<(), StoreError> {
        if i32::try_from(record.fence.0).is_err() {
            return Err(StoreError::Rejected(format!(
                "fence {} does not fit leaseTransitions (an int32): the fence sequence of \
                 this Lease is exhausted; delete the Lease to start it again",
                record.fence
            )));
        }
        Ok(())
    }

    fn classify(&self, err: kube::Error, op: &str) -> StoreError {
        match &err {
            kube::Error::Api(status) => match status.code {
                404 | 409 => StoreError::Conflict { current: None },
                429 => StoreError::Unavailable(format!("{op} {}: {}", self.url, status.message)),
                c if c >= 500 => {
                    StoreError::Indeterminate(format!("{op} {}: {}", self.url, status.message))
                }
                _ => StoreError::Rejected(format!(
                    "{op} {}: {} ({})",
                    self.url, status.message, status.reason
                )),
            },
            _ => StoreError::Indeterminate(format!("{op} {}: {err}", self.url)),
        }
    }
}

/// client-go counts whole seconds; round up so its view never expires before ours.
fn lease_seconds(lease: Duration) -> i32 {
    i32::try_from(lease.as_millis().div_ceil(1000))
        .unwrap_or(i32::MAX)
        .max(1)
}

/// An unknown field as an annotation's text: a string as itself, anything else as JSON.
fn annotation_text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn micro_time(t: SystemTime) -> MicroTime {
    MicroTime(Timestamp::try_from(t).unwrap_or(Timestamp::UNIX_EPOCH))
}

fn system_time(t: &Option<MicroTime>) -> SystemTime {
    t.as_ref()
        .map(|t| SystemTime::from(t.0))
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Reads a Lease as a lock record. Public for the fuzzers (`fuzz/`).
pub fn parse_lease(lease: &KubeLease) -> Result<LockRecord, ForeignRecord> {
    let annotations = lease.metadata.annotations.clone().unwrap_or_default();
    let spec = SpecFields::of(lease, &annotations);
    let Some(nonce) = annotations.get(NONCE) else {
        // A Lease written by another client (client-go leader election).
        if spec.seconds <= 0 && !spec.holder_identity.is_empty() {
            return Err(ForeignRecord::new(format!(
                "Lease held by {:?} has leaseDurationSeconds {}",
                spec.holder_identity, spec.seconds
            )));
        }
        return Ok(spec.into_client_go_record());
    };
    let lease_ms = lease_ms(&annotations)?;
    let state = state(&annotations)?;
    // Another client may have written holderIdentity since (client-go takeover):
    // then it is that client's lock, whatever our annotations say.
    let recorded_holder = annotations.get(HOLDER).cloned().unwrap_or_default();
    if state == LockState::Held && spec.holder_identity != recorded_holder
        || state == LockState::Released && !spec.holder_identity.is_empty()
    {
        return Ok(spec.into_client_go_record());
    }
    Ok(LockRecord {
        holder: recorded_holder,
        nonce: nonce.clone(),
        revision: annotations.get(REVISION).cloned().unwrap_or_default(),
        fence: spec.fence,
        lease: Duration::from_millis(lease_ms),
        state,
        data: annotations.get(DATA).cloned(),
        acquired_at: spec.acquired_at,
        renewed_at: spec.renewed_at,
        set: annotations
            .get(HOLDERS)
            .map(|json| HolderSet::from_json(json))
            .transpose()?,
        history: spec.history,
        runs: spec.runs,
        unknown: annotations
            .iter()
            .filter(|(name, _)| name.starts_with(PREFIX) && !OURS.contains(&name.as_str()))
            .map(|(name, value)| (name.clone(), value.clone().into()))
            .collect(),
    })
}

/// What a Lease says whoever wrote it last: its spec, and the key's history.
struct SpecFields {
    holder_identity: String,
    fence: FenceToken,
    seconds: i32,
    acquired_at: SystemTime,
    renewed_at: SystemTime,
    history: Vec<Grant>,
    runs: RunMemory,
}

impl SpecFields {
    fn of(lease: &KubeLease, annotations: &BTreeMap<String, String>) -> SpecFields {
        let spec = lease.spec.clone().unwrap_or_default();
        SpecFields {
            holder_identity: spec.holder_identity.clone().unwrap_or_default(),
            fence: FenceToken(u64::try_from(spec.lease_transitions.unwrap_or(0)).unwrap_or(0)),
            seconds: spec.lease_duration_seconds.unwrap_or(0),
            acquired_at: system_time(&spec.acquire_time),
            renewed_at: system_time(&spec.renew_time),
            // The key's history, whoever wrote the Lease last: client-go carries
            // annotations it does not know through its updates.
            history: annotations
                .get(HISTORY)
                .map(|text| history::parse_text(text))
                .unwrap_or_default(),
            // The same for the memory of completed runs: lost by a writer that drops
            // it, never invented.
            runs: annotations
                .get(RUNS)
                .map(|text| RunMemory::parse_text(text))
                .unwrap_or_default(),
        }
    }

    /// The Lease as client-go reads it: held by `holderIdentity` unless that is empty,
    /// with a nonce that can never be ours.
    fn into_client_go_record(self) -> LockRecord {
        LockRecord {
            state: if self.holder_identity.is_empty() {
                LockState::Released
            } else {
                LockState::Held
            },
            holder: self.holder_identity,
            nonce: format!("{ANOTHER_TOOL_NONCE_PREFIX}client-go"),
            revision: String::new(),
            fence: self.fence,
            lease: Duration::from_secs(self.seconds.max(1) as u64),
            data: None,
            acquired_at: self.acquired_at,
            renewed_at: self.renewed_at,
            set: None,
            history: self.history,
            runs: self.runs,
            unknown: UnknownFields::new(),
        }
    }
}

/// Our lease annotation: a positive number of milliseconds.
fn lease_ms(annotations: &BTreeMap<String, String>) -> Result<u64, ForeignRecord> {
    annotations
        .get(LEASE_MS)
        .and_then(|v| v.parse().ok())
        .filter(|ms| *ms > 0)
        .ok_or_else(|| {
            ForeignRecord::new(format!(
                "annotation {LEASE_MS} is missing or not a positive integer"
            ))
        })
}

/// Our state annotation: held or released.
fn state(annotations: &BTreeMap<String, String>) -> Result<LockState, ForeignRecord> {
    match annotations.get(STATE).map(String::as_str) {
        Some("held") => Ok(LockState::Held),
        Some("released") => Ok(LockState::Released),
        other => Err(ForeignRecord::new(format!(
            "annotation {STATE} is {other:?}, expected \"held\" or \"released\""
        ))),
    }
}

fn stored(lease: &KubeLease) -> Stored {
    Stored {
        record: parse_lease(lease),
        version: Version(lease.metadata.resource_version.clone().unwrap_or_default()),
    }
}

#[async_trait]
impl RecordStore for LeaseStore {
    fn url(&self) -> &str {
        &self.url
    }

    async fn read(&self) -> Result<Option<Stored>, StoreError> {
        match self.api.get_opt(&self.name).await {
            Ok(lease) => {
                if let Some(lease) = &lease {
                    self.remember(lease);
                }
                Ok(lease.as_ref().map(stored))
            }
            Err(e) => Err(self.classify(e, "GET").for_read()),
        }
    }

    async fn create(&self, record: &LockRecord) -> Result<Version, StoreError> {
        Self::check_fence(record)?;
        let lease = self.to_lease(record, None);
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(l) => {
                self.remember(&l);
                Ok(Version(l.metadata.resource_version.unwrap_or_default()))
            }
            Err(e) => Err(self.classify(e, "CREATE")),
        }
    }

    async fn replace(
        &self,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StoreError> {
        Self::check_fence(record)?;
        // PUT with metadata.resourceVersion: the API server's compare-and-swap, of the
        // Lease as read with lockwarden's fields rewritten (see the module docs).
        let mut lease = self.to_lease(record, Some(self.base_at(expected).await?));
        match self.put(&lease).await {
            Ok(version) => {
                // The Lease as written is the next update's base: the server changed
                // only its version and its managed fields, which are not sent back.
                lease.metadata.resource_version = Some(version.clone());
                *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(lease);
                Ok(Version(version))
            }
            Err(e) => Err(self.classify(e, "UPDATE")),
        }
    }

    async fn delete(&self, expected: &Version) -> Result<(), StoreError> {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(expected.0.clone()),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        match self.api.delete(&self.name, &dp).await {
            Ok(_) => Ok(()),
            Err(e) => Err(self.classify(e, "DELETE")),
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    #[test]
    fn client_go_lease_reads_as_held_by_its_identity() {
        let lease = KubeLease {
            metadata: ObjectMeta {
                resource_version: Some("5".into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("controller-manager-1".into()),
                lease_duration_seconds: Some(15),
                lease_transitions: Some(3),
                ..Default::default()
            }),
        };
        let s = stored(&lease);
        let r = s.record.unwrap();
        assert_eq!(r.holder, "controller-manager-1");
        assert_eq!(r.state, LockState::Held);
        assert_eq!(r.fence, FenceToken(3));
        assert_eq!(r.lease, Duration::from_secs(15));
        assert_eq!(s.version, Version("5".into()));
    }

    /// docs/design.md §3 "Stored formats that can evolve", on a Lease: an update keeps
    /// what it does not write, and a newer build's `lockwarden.io/*` annotations are
    /// read and written back.
    #[tokio::test]
    async fn an_update_carries_over_what_other_writers_added() {
        let store = LeaseStore::new(
            Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap())).unwrap(),
            "ns",
            "lock",
        );
        let record = LockRecord::new_acquisition(
            "a",
            FenceToken(3),
            Duration::from_secs(30),
            Some("d".into()),
        );
        let mut first = store.to_lease(&record, None);
        first.metadata.resource_version = Some("7".into());
        let annotations = first.metadata.annotations.as_mut().unwrap();
        annotations.insert("example.com/owner".into(), "team-a".into());
        annotations.insert("lockwarden.io/newer".into(), "kept".into());
        first
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("team".into(), "a".into());
        first.spec.as_mut().unwrap().preferred_holder = Some("b".into());

        let read = parse_lease(&first).expect("ours");
        assert_eq!(read.unknown["lockwarden.io/newer"], "kept");
        assert_eq!(
            read.unknown.len(),
            1,
            "only lockwarden.io/ annotations: {:?}",
            read.unknown
        );

        let next = store.to_lease(&read.released(), Some(first));
        assert_eq!(
            next.metadata.resource_version.as_deref(),
            Some("7"),
            "conditional"
        );
        let annotations = next.metadata.annotations.unwrap();
        assert_eq!(annotations["example.com/owner"], "team-a");
        assert_eq!(annotations["lockwarden.io/newer"], "kept");
        assert_eq!(annotations[STATE], "released");
        assert_eq!(next.metadata.labels.unwrap()["team"], "a");
        let spec = next.spec.unwrap();
        assert_eq!(spec.preferred_holder.as_deref(), Some("b"));
        assert_eq!(spec.holder_identity.as_deref(), Some(""));
        // Ours that the record leaves out are removed, not carried over.
        let mut without_data = read.clone();
        without_data.data = None;
        let mut base = store.to_lease(&read, None);
        base.metadata.resource_version = Some("8".into());
        let next = store.to_lease(&without_data, Some(base));
        assert!(!next.metadata.annotations.unwrap().contains_key(DATA));
    }

    /// The history is an annotation of ours (never an unknown one), read also when
    /// client-go wrote the Lease last (it keeps annotations), and removed when empty.
    #[tokio::test]
    async fn the_history_annotation_is_ours_and_survives_a_client_go_write() {
        let store = LeaseStore::new(
            Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap())).unwrap(),
            "ns",
            "lock",
        );
        let mut record =
            LockRecord::new_acquisition("a", FenceToken(3), Duration::from_secs(30), None);
        record.history = vec![lockwarden_core::Grant::new(
            "a",
            Some("east"),
            FenceToken(3),
            record.acquired_at,
        )];
        let mut lease = store.to_lease(&record, None);
        let read = parse_lease(&lease).expect("ours");
        assert_eq!(read.history, record.history);
        assert!(read.unknown.is_empty(), "{:?}", read.unknown);
        // client-go takes the Lease over: its update keeps our annotations.
        lease.spec.as_mut().unwrap().holder_identity = Some("client-go-leader".into());
        let theirs = parse_lease(&lease).expect("client-go's");
        assert!(theirs.by_another_tool());
        assert_eq!(theirs.history, record.history);
        let mut without = read.clone();
        without.history.clear();
        let next = store.to_lease(&without, Some(lease));
        assert!(!next.metadata.annotations.unwrap().contains_key(HISTORY));
    }

    #[test]
    fn lease_seconds_round_up() {
        assert_eq!(lease_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(lease_seconds(Duration::from_millis(100)), 1);
        assert_eq!(lease_seconds(Duration::from_secs(30)), 30);
    }
}

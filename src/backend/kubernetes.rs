//! Kubernetes: a `coordination.k8s.io/v1` Lease per lock (docs/design.md §3 "Kubernetes
//! Lease"), compatible with client-go leader election.
//!
//! - `holderIdentity`, `leaseDurationSeconds`, `acquireTime`, `renewTime` are the
//!   fields client-go reads, so a lock held here holds off a leader-elected component
//!   and vice versa. A release empties `holderIdentity`, as client-go's does.
//! - `leaseTransitions` is the fence: every acquisition increments it.
//! - `metadata.resourceVersion` is the version every write is conditioned on.
//! - lockwarden's own fields (nonce, revision, exact lease, data, state) are
//!   annotations. A Lease without them (written by client-go) is read as held by its
//!   `holderIdentity`, with a nonce that can never be ours.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::{Lease as KubeLease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::{Api, Client};

use crate::lock::{
    ANOTHER_TOOL_NONCE_PREFIX, FenceToken, ForeignRecord, HolderSet, LockRecord, LockState,
    RecordStore, StoreError, Stored, Version,
};

const NONCE: &str = "lockwarden.io/nonce";
const REVISION: &str = "lockwarden.io/revision";
const LEASE_MS: &str = "lockwarden.io/lease-ms";
const STATE: &str = "lockwarden.io/state";
const DATA: &str = "lockwarden.io/data";
const HOLDER: &str = "lockwarden.io/holder";
/// The holder set of a key with more than one permit (JSON); absent on mutexes.
const HOLDERS: &str = "lockwarden.io/holders";

/// One lock as a Lease in a namespace.
pub struct LeaseStore {
    api: Api<KubeLease>,
    name: String,
    url: String,
}

impl LeaseStore {
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        LeaseStore {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            url: format!("k8s://{namespace}/{name}"),
        }
    }

    fn to_lease(&self, record: &LockRecord, resource_version: Option<&Version>) -> KubeLease {
        let released = record.state == LockState::Released;
        let mut annotations = BTreeMap::from([
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
        KubeLease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                resource_version: resource_version.map(|v| v.0.clone()),
                annotations: Some(annotations),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/managed-by".to_string(),
                    "lockwarden".to_string(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                // client-go treats an empty holder as free.
                holder_identity: Some(if released {
                    String::new()
                } else {
                    record.holder.clone()
                }),
                lease_duration_seconds: Some(lease_seconds(record.lease)),
                lease_transitions: Some(i32::try_from(record.fence.0).unwrap_or(i32::MAX)),
                acquire_time: Some(micro_time(record.acquired_at)),
                renew_time: Some(micro_time(record.renewed_at)),
                ..LeaseSpec::default()
            }),
        }
    }

    /// The fence is `leaseTransitions`, an int32: a fence beyond it cannot be stored,
    /// and storing a smaller one would hand the same fence to two holders.
    fn check_fence(record: &LockRecord) -> Result<(), String> {
        if i32::try_from(record.fence.0).is_err() {
            return Err(format!(
                "fence {} does not fit leaseTransitions (an int32): the fence sequence of \
                 this Lease is exhausted; delete the Lease to start it again",
                record.fence
            ));
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
    let spec = lease.spec.clone().unwrap_or_default();
    let annotations = lease.metadata.annotations.clone().unwrap_or_default();
    let holder_identity = spec.holder_identity.clone().unwrap_or_default();
    let fence = FenceToken(u64::try_from(spec.lease_transitions.unwrap_or(0)).unwrap_or(0));
    let seconds = spec.lease_duration_seconds.unwrap_or(0);
    let acquired_at = system_time(&spec.acquire_time);
    let renewed_at = system_time(&spec.renew_time);
    // The Lease as client-go reads it: held by `holderIdentity` unless that is empty,
    // with a nonce that can never be ours.
    let other_client = LockRecord {
        holder: holder_identity.clone(),
        nonce: format!("{ANOTHER_TOOL_NONCE_PREFIX}client-go"),
        revision: String::new(),
        fence,
        lease: Duration::from_secs(seconds.max(1) as u64),
        state: if holder_identity.is_empty() {
            LockState::Released
        } else {
            LockState::Held
        },
        data: None,
        acquired_at,
        renewed_at,
        set: None,
    };
    let Some(nonce) = annotations.get(NONCE) else {
        // A Lease written by another client (client-go leader election).
        if seconds <= 0 && !holder_identity.is_empty() {
            return Err(ForeignRecord::new(format!(
                "Lease held by {holder_identity:?} has leaseDurationSeconds {seconds}"
            )));
        }
        return Ok(other_client);
    };
    let lease_ms: u64 = annotations
        .get(LEASE_MS)
        .and_then(|v| v.parse().ok())
        .filter(|ms| *ms > 0)
        .ok_or_else(|| {
            ForeignRecord::new(format!(
                "annotation {LEASE_MS} is missing or not a positive integer"
            ))
        })?;
    let state = match annotations.get(STATE).map(String::as_str) {
        Some("held") => LockState::Held,
        Some("released") => LockState::Released,
        other => {
            return Err(ForeignRecord::new(format!(
                "annotation {STATE} is {other:?}, expected \"held\" or \"released\""
            )));
        }
    };
    // Another client may have written holderIdentity since (client-go takeover):
    // then it is that client's lock, whatever our annotations say.
    let recorded_holder = annotations.get(HOLDER).cloned().unwrap_or_default();
    if state == LockState::Held && holder_identity != recorded_holder
        || state == LockState::Released && !holder_identity.is_empty()
    {
        return Ok(other_client);
    }
    Ok(LockRecord {
        holder: recorded_holder,
        nonce: nonce.clone(),
        revision: annotations.get(REVISION).cloned().unwrap_or_default(),
        fence,
        lease: Duration::from_millis(lease_ms),
        state,
        data: annotations.get(DATA).cloned(),
        acquired_at,
        renewed_at,
        set: annotations
            .get(HOLDERS)
            .map(|json| HolderSet::from_json(json))
            .transpose()?,
    })
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
            Ok(lease) => Ok(lease.as_ref().map(stored)),
            Err(e) => Err(self.classify(e, "GET").for_read()),
        }
    }

    async fn create(&self, record: &LockRecord) -> Result<Version, StoreError> {
        Self::check_fence(record).map_err(StoreError::Rejected)?;
        let lease = self.to_lease(record, None);
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(l) => Ok(Version(l.metadata.resource_version.unwrap_or_default())),
            Err(e) => Err(self.classify(e, "CREATE")),
        }
    }

    async fn replace(
        &self,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StoreError> {
        Self::check_fence(record).map_err(StoreError::Rejected)?;
        // PUT with metadata.resourceVersion: the API server's compare-and-swap.
        let lease = self.to_lease(record, Some(expected));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(l) => Ok(Version(l.metadata.resource_version.unwrap_or_default())),
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

    #[test]
    fn lease_seconds_round_up() {
        assert_eq!(lease_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(lease_seconds(Duration::from_millis(100)), 1);
        assert_eq!(lease_seconds(Duration::from_secs(30)), 30);
    }
}

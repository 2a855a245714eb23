//! Stored formats that can evolve (docs/design.md §3): two builds on one key, on every
//! store. "Today" is this build; the "newer build" writes every record with fields
//! today's rules do not know, at each level a later version may add them — the record
//! (an S3 body field, a DynamoDB attribute, a `lockwarden.io/` Lease annotation, a
//! field of a ZooKeeper entry's data), the holder set, and its own holder entries.
//!
//! On S3, DynamoDB and Leases the newer build is a real `CasLock` whose store adds
//! those fields to every record it writes ([`NewerBuild`]); on ZooKeeper, whose
//! entries are written once and never rewritten, it is an entry created with such data
//! by a client of its own, held while its session lives. Each test shows that a record
//! carrying a field today's rules do not know is read (as a holder, never as foreign),
//! renewed and released by both builds, neither loses the lock, and the newer build's
//! fields survive every write today's build makes — a mutex and a key with 3 permits.

use lockwarden_testsupport as support;

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;
use k8s_openapi::api::coordination::v1::Lease as KubeLease;
use kube::Api;
use kube::api::{Patch, PatchParams};
use lockwarden::backend::{DynamoStore, LeaseStore, S3Store, TableLayout, ZkSessions};
use lockwarden::lock::{
    AcquireRequest, Admission, Attempt, CasLock, FenceToken, HolderSet, LockBackend, LockRecord,
    Mode, Permits, RecordStore, SetEntry, StoreError, Stored, Version,
};
use serde_json::{Value, json};
use zookeeper_client::{Acls, CreateMode};

use support::cli::Cli;
use support::keys::Key;
use support::kube::{ControlPlane, client_from_kubeconfig};
use support::locks::acquire_now as acquired;
use support::moto::{dynamodb_client_for, s3_client_for};
use support::zookeeper::ZooKeeper;
use support::{eventually, unique};

/// Long enough that nothing expires while a test runs on a loaded machine: every
/// hand-over here is a release.
const LEASE: Duration = Duration::from_secs(60);

const PROMPTLY: Duration = Duration::from_secs(60);

/// The newer build's holder name: its entries in a holder set are the ones it marks.
const NEWER: &str = "newer-build";
const TODAY: &str = "today";

/// The holder set's field and a holder entry's field the newer build adds.
const SET_FIELD: &str = "newerSet";
const ENTRY_FIELD: &str = "newerEntry";

/// Any of the three record stores, so one scenario runs on each.
enum AnyStore {
    S3(S3Store),
    Dynamo(DynamoStore),
    /// Boxed: it keeps the Lease it last saw.
    Lease(Box<LeaseStore>),
}

impl AnyStore {
    fn inner(&self) -> &dyn RecordStore {
        match self {
            AnyStore::S3(s) => s,
            AnyStore::Dynamo(s) => s,
            AnyStore::Lease(s) => s.as_ref(),
        }
    }
}

#[async_trait]
impl RecordStore for AnyStore {
    fn url(&self) -> &str {
        self.inner().url()
    }
    async fn read(&self) -> Result<Option<Stored>, StoreError> {
        self.inner().read().await
    }
    async fn create(&self, record: &LockRecord) -> Result<Version, StoreError> {
        self.inner().create(record).await
    }
    async fn replace(
        &self,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StoreError> {
        self.inner().replace(expected, record).await
    }
    async fn delete(&self, expected: &Version) -> Result<(), StoreError> {
        self.inner().delete(expected).await
    }
    // The store's bound and notes as the store itself gives them: these tests run the
    // engine as built, admission included.
    async fn admit(&self) -> Result<Option<Admission>, StoreError> {
        self.inner().admit().await
    }
    fn kept_tombstone_note(&self) -> Option<&'static str> {
        self.inner().kept_tombstone_note()
    }
}

/// The store as the newer build writes it: each record it writes carries its record
/// field, the set field and, in its own entries, the entry field.
struct NewerBuild {
    store: AnyStore,
    record_field: &'static str,
}

impl NewerBuild {
    fn with_newer_fields(&self, record: &LockRecord) -> LockRecord {
        let mut record = record.clone();
        record
            .unknown
            .insert(self.record_field.into(), "kept".into());
        if let Some(set) = record.set.as_mut() {
            set.unknown.insert(SET_FIELD.into(), json!({"kept": true}));
            let entries = set.holders.iter_mut().chain(set.waiting_writer.iter_mut());
            for entry in entries.filter(|e| e.holder == NEWER) {
                entry.unknown.insert(ENTRY_FIELD.into(), 1.into());
            }
        }
        record
    }
}

#[async_trait]
impl RecordStore for NewerBuild {
    fn url(&self) -> &str {
        self.store.url()
    }
    async fn read(&self) -> Result<Option<Stored>, StoreError> {
        self.store.read().await
    }
    async fn create(&self, record: &LockRecord) -> Result<Version, StoreError> {
        self.store.create(&self.with_newer_fields(record)).await
    }
    async fn replace(
        &self,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StoreError> {
        self.store
            .replace(expected, &self.with_newer_fields(record))
            .await
    }
    async fn delete(&self, expected: &Version) -> Result<(), StoreError> {
        self.store.delete(expected).await
    }
    async fn admit(&self) -> Result<Option<Admission>, StoreError> {
        self.store.admit().await
    }
    fn kept_tombstone_note(&self) -> Option<&'static str> {
        self.store.kept_tombstone_note()
    }
}

/// What the store holds of the newer build's fields, read past both builds' codecs.
#[derive(Debug)]
struct Found {
    /// The record-level field, as text.
    record: Option<String>,
    /// The holder set's JSON, if the key has one.
    set: Option<Value>,
}

/// What this test does with a key on each store (the keys are the shared
/// [`support::keys::Key`]; ZooKeeper's scenario has entries of its own, no record store).
trait FormatsKey {
    fn record_field(&self) -> &'static str;
    async fn store(&self) -> AnyStore;
    async fn today(&self) -> CasLock<AnyStore>;
    async fn newer(&self) -> CasLock<NewerBuild>;
    async fn found(&self) -> Found;
    async fn lease_now(&self, namespace: &str, name: &str) -> KubeLease;
}

impl FormatsKey for Key {
    /// Where the newer build keeps a record-level field on this store.
    fn record_field(&self) -> &'static str {
        match self {
            Key::S3 { .. } | Key::Dynamo { .. } => "newerRecord",
            Key::Lease { .. } => "lockwarden.io/newer-record",
            Key::ZooKeeper { .. } => unreachable!("ZooKeeper entries have no record fields"),
        }
    }

    async fn store(&self) -> AnyStore {
        match self {
            Key::S3 {
                endpoint,
                bucket,
                key,
            } => AnyStore::S3(S3Store::new(s3_client_for(endpoint).await, bucket, key)),
            Key::Dynamo {
                endpoint,
                table,
                key,
            } => AnyStore::Dynamo(DynamoStore::new(
                dynamodb_client_for(endpoint).await,
                TableLayout::new(table),
                key,
            )),
            Key::Lease {
                namespace, name, ..
            } => AnyStore::Lease(Box::new(LeaseStore::new(
                kube_client().await,
                namespace,
                name,
            ))),
            Key::ZooKeeper { .. } => unreachable!("ZooKeeper is not a record store"),
        }
    }

    async fn today(&self) -> CasLock<AnyStore> {
        CasLock::new(self.store().await)
    }

    async fn newer(&self) -> CasLock<NewerBuild> {
        CasLock::new(NewerBuild {
            store: self.store().await,
            record_field: self.record_field(),
        })
    }

    /// The newer build's fields as stored now, read with the store's own client.
    async fn found(&self) -> Found {
        let field = self.record_field();
        match self {
            Key::S3 {
                endpoint,
                bucket,
                key,
            } => {
                let out = s3_client_for(endpoint)
                    .await
                    .get_object()
                    .bucket(bucket)
                    .key(key)
                    .send()
                    .await
                    .expect("the record object");
                let bytes = out.body.collect().await.unwrap().into_bytes();
                let body: Value = serde_json::from_slice(&bytes).expect("a JSON body");
                Found {
                    record: body[field].as_str().map(String::from),
                    set: body.get("holders").cloned(),
                }
            }
            Key::Dynamo {
                endpoint,
                table,
                key,
            } => {
                let out = dynamodb_client_for(endpoint)
                    .await
                    .get_item()
                    .table_name(table)
                    .key("key", AttributeValue::S(key.clone()))
                    .consistent_read(true)
                    .send()
                    .await
                    .expect("the record item");
                let item = out.item().expect("an item");
                let text = |name: &str| item.get(name).and_then(|v| v.as_s().ok()).cloned();
                Found {
                    record: text(field),
                    set: text("holders").map(|j| serde_json::from_str(&j).unwrap()),
                }
            }
            Key::Lease {
                namespace, name, ..
            } => {
                let lease = self.lease_now(namespace, name).await;
                let annotations = lease.metadata.annotations.unwrap_or_default();
                Found {
                    record: annotations.get(field).cloned(),
                    set: annotations
                        .get("lockwarden.io/holders")
                        .map(|j| serde_json::from_str(j).unwrap()),
                }
            }
            Key::ZooKeeper { .. } => unreachable!("ZooKeeper is not a record store"),
        }
    }

    async fn lease_now(&self, namespace: &str, name: &str) -> KubeLease {
        let api: Api<KubeLease> = Api::namespaced(kube_client().await, namespace);
        api.get(name).await.expect("the Lease")
    }
}

async fn kube_client() -> kube::Client {
    client_from_kubeconfig(ControlPlane::shared().kubeconfig_path()).await
}

fn request(holder: &str, permits: Permits) -> AcquireRequest {
    AcquireRequest {
        permits,
        ..AcquireRequest::new(holder, LEASE)
    }
}

/// The holder a busy attempt names; panics on anything else (a foreign record too).
async fn busy_with(lock: &dyn LockBackend, req: &AcquireRequest) -> String {
    match lock.try_acquire(req).await {
        Ok(Attempt::Busy { holder, .. }) => holder.holder,
        other => panic!(
            "{} should have found {} held: {other:?}",
            req.holder,
            lock.url()
        ),
    }
}

/// The newer build's set field, and its entry field in each of its entries.
fn assert_set_fields_kept(found: &Found, when: &str) {
    let set = found
        .set
        .as_ref()
        .unwrap_or_else(|| panic!("{when}: no holder set: {found:?}"));
    assert_eq!(set[SET_FIELD], json!({"kept": true}), "{when}: {set}");
    for entry in set["holders"].as_array().expect("holders") {
        let expected = if entry["holder"] == NEWER {
            json!(1)
        } else {
            Value::Null
        };
        assert_eq!(entry[ENTRY_FIELD], expected, "{when}: {set}");
    }
}

/// A mutex: each build holds it in turn, the other reads it as held by its holder;
/// today's acquisition, renewal and release keep the newer build's field.
async fn two_builds_share_a_mutex(key: Key) {
    let (today, newer) = (key.today().await, key.newer().await);
    let (today_req, newer_req) = (
        request(TODAY, Permits::MUTEX),
        request(NEWER, Permits::MUTEX),
    );

    let mut held = acquired(&newer, &newer_req).await;
    assert_eq!(key.found().await.record.as_deref(), Some("kept"));
    assert_eq!(busy_with(&today, &today_req).await, NEWER);
    newer
        .renew(&mut held)
        .await
        .expect("the newer build renews");
    assert_eq!(busy_with(&today, &today_req).await, NEWER);
    newer
        .release(&held)
        .await
        .expect("the newer build releases");

    if let Key::Lease {
        namespace, name, ..
    } = &key
    {
        // Another tool's annotation and label on the Lease: today's writes keep them.
        let api: Api<KubeLease> = Api::namespaced(kube_client().await, namespace);
        let theirs = json!({"metadata": {
            "annotations": {"example.com/owner": "team-a"},
            "labels": {"example.com/team": "a"},
        }});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&theirs))
            .await
            .expect("another tool's annotation");
    }

    let mut held = acquired(&today, &today_req).await;
    assert_eq!(
        key.found().await.record.as_deref(),
        Some("kept"),
        "after today's acquisition"
    );
    today.renew(&mut held).await.expect("today's build renews");
    assert_eq!(
        key.found().await.record.as_deref(),
        Some("kept"),
        "after today's renewal"
    );
    assert_eq!(busy_with(&newer, &newer_req).await, TODAY);
    today.release(&held).await.expect("today's build releases");
    assert_eq!(
        key.found().await.record.as_deref(),
        Some("kept"),
        "after today's release"
    );
    if let Key::Lease {
        namespace, name, ..
    } = &key
    {
        let lease = key.lease_now(namespace, name).await;
        let annotations = lease.metadata.annotations.unwrap_or_default();
        let labels = lease.metadata.labels.unwrap_or_default();
        assert_eq!(
            annotations.get("example.com/owner").map(String::as_str),
            Some("team-a"),
            "{annotations:?}"
        );
        assert_eq!(
            labels.get("example.com/team").map(String::as_str),
            Some("a"),
            "{labels:?}"
        );
    }

    // And back to the newer build, whose fence continues today's.
    let fence = held.fence();
    let mut again = acquired(&newer, &newer_req).await;
    assert!(again.fence() > fence);
    newer
        .renew(&mut again)
        .await
        .expect("the newer build renews");
    newer
        .release(&again)
        .await
        .expect("the newer build releases");
}

/// Three permits, one held by each build at once: every write of today's build —
/// its grant, renewals that lost the race to the newer build's, its release — carries
/// the newer build's set, entry and record fields.
async fn two_builds_share_permits(key: Key) {
    let (today, newer) = (key.today().await, key.newer().await);
    let permits = Permits::semaphore(3);
    let (today_req, newer_req) = (request(TODAY, permits), request(NEWER, permits));

    let mut newer_held = acquired(&newer, &newer_req).await;
    let mut today_held = acquired(&today, &today_req).await;
    let found = key.found().await;
    assert_eq!(found.record.as_deref(), Some("kept"), "after today's grant");
    assert_set_fields_kept(&found, "after today's grant");
    assert_eq!(found.set.unwrap()["holders"].as_array().unwrap().len(), 2);

    for round in 0..3 {
        newer
            .renew(&mut newer_held)
            .await
            .unwrap_or_else(|e| panic!("round {round}: the newer build renews: {e}"));
        today
            .renew(&mut today_held)
            .await
            .unwrap_or_else(|e| panic!("round {round}: today's build renews: {e}"));
        let found = key.found().await;
        let when = format!("after today's renewal {round}");
        assert_eq!(found.record.as_deref(), Some("kept"), "{when}");
        assert_set_fields_kept(&found, &when);
    }

    today
        .release(&today_held)
        .await
        .expect("today's build releases");
    let found = key.found().await;
    assert_eq!(
        found.record.as_deref(),
        Some("kept"),
        "after today's release"
    );
    assert_set_fields_kept(&found, "after today's release");
    let holders = found.set.unwrap()["holders"].clone();
    assert_eq!(holders.as_array().unwrap().len(), 1, "{holders}");
    assert_eq!(holders[0]["holder"], NEWER);

    newer
        .renew(&mut newer_held)
        .await
        .expect("the newer build still holds its permit");
    newer
        .release(&newer_held)
        .await
        .expect("the newer build releases");
    let after = today.inspect().await.unwrap().expect("the released record");
    let set = after.record.expect("ours").set.expect("a holder set");
    assert!(set.holders.is_empty(), "{set:?}");
}

/// The previous release (`LOCKWARDEN_PREVIOUS_RELEASE`, built by scripts/testenv) has
/// no holder history and predates the compatibility rule: it rejects a record body
/// with a field it does not know, and rewrites a whole Lease. So this build keeps the
/// history where the previous release still reads the key as lockwarden's: the
/// DynamoDB attribute `history` (which its `UpdateItem` never touches, so the history
/// survives), the S3 object's user metadata and the `lockwarden.io/history` Lease
/// annotation (which its PUTs drop: the history then starts again from the record).
/// Either way it takes and releases the key (`lockwarden run`), and this build then
/// completes the history with the previous release's grant from the record itself.
async fn the_previous_release_holds_a_key_with_history(key: Key, history_survives: bool) {
    let (url, cli) = match &key {
        Key::S3 { bucket, key, .. } => (format!("s3://{bucket}/{key}"), Cli::aws()),
        Key::Dynamo { table, key, .. } => (format!("dynamodb://{table}/{key}"), Cli::aws()),
        Key::Lease {
            namespace, name, ..
        } => (format!("k8s://{namespace}/{name}"), Cli::kube()),
        Key::ZooKeeper { .. } => unreachable!("ZooKeeper keeps no history"),
    };
    let today = key.handle().await;
    let with_cluster = AcquireRequest {
        cluster: Some("east".into()),
        ..request(TODAY, Permits::MUTEX)
    };
    let first = acquired(today.as_ref(), &with_cluster).await;
    today.release(&first).await.expect("today's build releases");

    cli.previous_release()
        .run(&[
            "run",
            &url,
            "--holder",
            "previous-release",
            "--wait",
            "60s",
            "--",
            "true",
        ])
        .await
        .ok();

    let f = first.fence().0;
    let seen = |history: Vec<lockwarden::lock::Grant>| -> Vec<(String, String, u64, String)> {
        history
            .iter()
            .map(|g| {
                let cluster = g.cluster.clone().unwrap_or_default();
                (g.holder.clone(), cluster, g.fence.0, g.ended.to_string())
            })
            .collect()
    };
    let g = |holder: &str, cluster: &str, fence: u64, ended: &str| {
        (
            holder.to_string(),
            cluster.to_string(),
            fence,
            ended.to_string(),
        )
    };
    let mut expected = Vec::new();
    if history_survives {
        expected.push(g(TODAY, "east", f, "released"));
    }
    expected.push(g("previous-release", "", f + 1, "released"));
    assert_eq!(
        seen(today.history().await.expect("the key's history")),
        expected,
        "after the previous release's acquisition and release"
    );
    let again = acquired(today.as_ref(), &with_cluster).await;
    assert_eq!(again.fence().0, f + 2);
    expected.push(g(TODAY, "east", f + 2, "held"));
    assert_eq!(
        seen(today.history().await.expect("the key's history")),
        expected
    );
    today.release(&again).await.expect("today's build releases");
}

// Each scenario on S3, DynamoDB and a Lease, one test per store.
support::on_each_store! {
    s3_the_previous_release_holds_a_key_with_history: the_previous_release_holds_a_key_with_history(s3, false);
    dynamodb_the_previous_release_holds_a_key_with_history_and_keeps_it: the_previous_release_holds_a_key_with_history(dynamo, true);
    lease_the_previous_release_holds_a_key_with_history: the_previous_release_holds_a_key_with_history(lease, false);
    s3_two_builds_share_a_mutex: two_builds_share_a_mutex(s3);
    s3_two_builds_share_permits: two_builds_share_permits(s3);
    dynamodb_two_builds_share_a_mutex: two_builds_share_a_mutex(dynamo);
    dynamodb_two_builds_share_permits: two_builds_share_permits(dynamo);
    lease_two_builds_share_a_mutex: two_builds_share_a_mutex(lease);
    lease_two_builds_share_permits: two_builds_share_permits(lease);
}

// ZooKeeper: every contender writes its own queue entry once; nobody rewrites another's.

/// The data a newer build's ZooKeeper entry carries: today's entry fields (the record,
/// with a holder set of itself alone for a key with permits, and kafka-kit's three
/// fields), plus fields today's rules do not know at each level.
fn newer_entry_data(permits: Permits) -> Vec<u8> {
    let mut record = LockRecord::new_acquisition(NEWER, FenceToken(0), LEASE, None);
    record.unknown.insert("newerRecord".into(), "kept".into());
    if !permits.is_mutex() {
        let mut entry = SetEntry::new(NEWER, FenceToken(0), LEASE, permits.mode, None);
        entry.nonce = record.nonce.clone();
        entry.unknown.insert(ENTRY_FIELD.into(), 1.into());
        let mut set = HolderSet {
            permits: permits.total,
            holders: vec![entry],
            ..HolderSet::default()
        };
        set.unknown.insert(SET_FIELD.into(), json!({"kept": true}));
        record.set = Some(set);
    }
    let mut doc: Value = serde_json::from_slice(&record.to_json()).unwrap();
    doc["timestamp"] = "2026-01-01T00:00:00Z".into();
    doc["ttl_deadline"] = "9999-01-01T00:00:00Z".into();
    doc["owner_id"] = NEWER.into();
    serde_json::to_vec(&doc).unwrap()
}

/// A newer build's queue entry on `path`, held by a session of its own; returns the
/// client (its session) and the entry's path.
async fn newer_entry(path: &str, permits: Permits) -> (zookeeper_client::Client, String) {
    let client = ZooKeeper::shared().connect().await;
    let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
    client.mkdir(path, &persistent).await.ok();
    let prefix = format!("{path}/_c_{}-lock-", uuid::Uuid::new_v4());
    let data = newer_entry_data(permits);
    let ephemeral = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let (_, sequence) = client
        .create(&prefix, &data, &ephemeral)
        .await
        .expect("the newer build's entry");
    (client, format!("{prefix}{sequence}"))
}

fn zk_lock(path: &str) -> lockwarden::backend::ZkLock {
    ZkSessions::new()
        .lock(&ZooKeeper::shared().connect_string(), path)
        .expect("a valid lock path")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_two_builds_share_a_mutex() {
    let path = format!("/lockwarden-test/{}", unique("formats"));
    let req = request(TODAY, Permits::MUTEX);
    let (newer, entry) = newer_entry(&path, Permits::MUTEX).await;
    let today = zk_lock(&path);
    assert_eq!(
        busy_with(&today, &req).await,
        NEWER,
        "read as the newer holder"
    );
    let inspected = today.inspect().await.unwrap().expect("the newer holder");
    let record = inspected.record.expect("a lockwarden record, not foreign");
    assert_eq!(record.unknown["newerRecord"], "kept");

    // The newer build releases (deletes its entry): today's contender is next.
    newer.delete(&entry, None).await.unwrap();
    let mut held = eventually("today's grant", PROMPTLY, || async {
        match today.try_acquire(&req).await {
            Ok(Attempt::Acquired(lease)) => Some(lease),
            _ => None,
        }
    })
    .await;
    // A newer build queues behind today's holder, which renews and releases as usual.
    let (newer, entry) = newer_entry(&path, Permits::MUTEX).await;
    let (data, _) = newer.get_data(&entry).await.unwrap();
    today.renew(&mut held).await.expect("today's build renews");
    today.release(&held).await.expect("today's build releases");
    let (after, _) = newer.get_data(&entry).await.unwrap();
    assert_eq!(after, data, "nobody rewrites the newer build's entry");
    let other = zk_lock(&path);
    assert_eq!(
        busy_with(&other, &req).await,
        NEWER,
        "the newer build holds"
    );
    other.abandon().await;
    newer.delete(&entry, None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_two_builds_share_permits() {
    let path = format!("/lockwarden-test/{}", unique("formats"));
    let permits = Permits::semaphore(3);
    let (newer, entry) = newer_entry(&path, permits).await;
    let (data, _) = newer.get_data(&entry).await.unwrap();

    // Today's contender takes a permit beside the newer build's (today's rules saw
    // an unknown field as foreign, an exclusive entry it waited behind).
    let today = zk_lock(&path);
    let mut held = acquired(&today, &request(TODAY, permits)).await;
    let inspected = today.inspect().await.unwrap().expect("the holders");
    let set = inspected.record.expect("ours").set.expect("a holder set");
    let names: Vec<&str> = set.holders.iter().map(|h| h.holder.as_str()).collect();
    assert_eq!(names, [NEWER, TODAY]);
    assert_eq!(set.holders[0].unknown[ENTRY_FIELD], 1);
    // And a writer of today's build waits for both.
    let writer = zk_lock(&path);
    let exclusive = request(
        "today-writer",
        Permits {
            total: 3,
            mode: Mode::Exclusive,
        },
    );
    busy_with(&writer, &exclusive).await;
    writer.abandon().await;

    today.renew(&mut held).await.expect("today's build renews");
    today.release(&held).await.expect("today's build releases");
    let (after, _) = newer.get_data(&entry).await.unwrap();
    assert_eq!(after, data, "nobody rewrites the newer build's entry");
    newer.delete(&entry, None).await.unwrap();
}

//! The status subresource, its selectable fields and printer columns.

use super::*;
use lockwarden::api::HistoryEntry;

#[tokio::test]
async fn status_is_written_through_the_status_subresource() {
    let (client, namespace) = setup("crd-status").await;
    let locks = Api::<DistributedLock>::namespaced(client.clone(), &namespace);
    let spec: DistributedLockSpec =
        serde_json::from_value(json!({ "backend": s3("locks", "team/job") })).unwrap();
    let created = locks
        .create(&PostParams::default(), &DistributedLock::new("job", spec))
        .await
        .expect("create");
    let generation = created.metadata.generation;
    assert!(created.status.is_none());

    // Status sent to the main resource is ignored.
    let ignored = locks
        .patch(
            "job",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "phase": "Held" } })),
        )
        .await
        .expect("patch main resource");
    assert!(
        ignored.status.is_none(),
        "status written through the main resource"
    );

    // Server-side apply on /status, as the controller does.
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let mut conds = Vec::new();
    conditions::set_condition(
        &mut conds,
        conditions::condition(
            conditions::ACQUIRED,
            true,
            reason::LEASE_HELD,
            "held",
            generation,
            now.clone(),
        ),
    );
    // A history entry of `cluster`'s job, acquired now.
    let entry = |cluster: &str, fence: i64, ended: &str, ended_at: Option<Time>| HistoryEntry {
        holder: format!("{cluster}/ns/job"),
        cluster: Some(cluster.into()),
        fence,
        acquired_at: Some(now.clone()),
        ended: ended.into(),
        ended_at,
    };
    let status = DistributedLockStatus {
        phase: Some(LockPhase::Held),
        backend: Some(created.backend_kind().unwrap().to_string()),
        key: Some(created.lock_key().unwrap()),
        holder: Some("cluster-a/ns/job".into()),
        etag: Some("\"5d41402abc4b2a76b9719d911017c592\"".into()),
        fence: Some(42),
        nonce: Some("7f1c".into()),
        acquired_at: Some(now.clone()),
        renewed_at: Some(now.clone()),
        lease_expires_at: Some(now.clone()),
        queue_position: Some(0),
        queue_length: Some(3),
        expected_start: Some("2026-12-02T15:00:00Z".into()),
        overtaken: Some(1),
        waiting_since: Some(now.clone()),
        observed_generation: generation,
        holders: Some(2),
        permits_in_use: Some(2),
        history: Some(vec![
            entry("cluster-b", 41, "released", Some(now.clone())),
            entry("cluster-a", 42, "held", None),
        ]),
        conditions: conds,
    };
    let apply = json!({
        "apiVersion": "lockwarden.io/v1alpha1",
        "kind": "DistributedLock",
        "status": status,
    });
    let written = locks
        .patch_status(
            "job",
            &PatchParams::apply("lockwarden-controller").force(),
            &Patch::Apply(&apply),
        )
        .await
        .expect("server-side apply status");
    let got = written.status.clone().expect("status set");
    assert_eq!(got.phase, Some(LockPhase::Held));
    assert_eq!(got.fence, Some(42));
    assert_eq!((got.holders, got.permits_in_use), (Some(2), Some(2)));
    assert!(got.waiting_since.is_some(), "waitingSince is kept");
    let history = got
        .history
        .as_deref()
        .expect("status.history is in the schema");
    let fences: Vec<i64> = history.iter().map(|g| g.fence).collect();
    assert_eq!(fences, [41, 42]);
    assert_eq!(history[0].cluster.as_deref(), Some("cluster-b"));
    assert_eq!(got.key.as_deref(), Some("s3://locks/team/job"));
    assert_eq!(got.backend.as_deref(), Some("s3"));
    assert_eq!(
        written.metadata.generation, generation,
        "status write bumped generation"
    );
    let acquired = written.acquired_condition().expect("Acquired condition");
    assert_eq!(acquired.status, "True");
    assert_eq!(acquired.observed_generation, generation);

    // Conditions are a list-map keyed by type: another manager's condition type is
    // merged in, not replacing ours.
    let other = json!({
        "apiVersion": "lockwarden.io/v1alpha1",
        "kind": "DistributedLock",
        "status": { "conditions": [{
            "type": "Audited", "status": "True", "reason": "Checked", "message": "",
            "lastTransitionTime": now,
        }]},
    });
    let merged = locks
        .patch_status("job", &PatchParams::apply("auditor"), &Patch::Apply(&other))
        .await
        .expect("second manager applies its condition");
    let types: Vec<String> = merged
        .status
        .unwrap()
        .conditions
        .into_iter()
        .map(|c| c.type_)
        .collect();
    assert_eq!(types, ["Acquired", "Audited"]);

    // The status is selectable by key and phase, for indexing and kubectl.
    let by_key = locks
        .list(&ListParams::default().fields("status.key=s3://locks/team/job,status.phase=Held"))
        .await
        .expect("field selector on status.key");
    assert_eq!(by_key.items.len(), 1);

    // Printer columns, via kubectl and the short name.
    let out = support::kubectl::kubectl(&["get", "dlock", "-n", &namespace], None).await;
    let stdout = support::kubectl::stdout_ok(&out, "get dlock");
    let mut lines = stdout.lines();
    // Columns are separated by at least two spaces ("IN USE" has one inside).
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        header,
        [
            "NAME", "BACKEND", "KEY", "PHASE", "HOLDER", "FENCE", "PERMITS", "IN USE", "POSITION",
            "EXPECTED", "AGE"
        ]
    );
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        &row[..10],
        [
            "job",
            "s3",
            "s3://locks/team/job",
            "Held",
            "cluster-a/ns/job",
            "42",
            "1",
            "2",
            "0",
            // A string column: a `date` column prints a future time as `<invalid>`.
            "2026-12-02T15:00:00Z"
        ],
        "kubectl get dlock:\n{stdout}"
    );
}

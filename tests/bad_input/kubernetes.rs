//! Kubernetes Leases with odd fields.

use super::*;

// ----- Kubernetes Lease -----------------------------------------------------------

/// Leases with odd fields (written by hand or by another client): reported as held or
/// foreign, never rewritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_leases_with_odd_fields_are_reported_and_left_alone() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let namespace = cp.namespace(&client, "bad-lease").await;
    let api: Api<KubeLease> = Api::namespaced(client.clone(), &namespace);
    let kubeconfig = cp.kubeconfig_path().display().to_string();
    let cli = cli().with("KUBECONFIG", kubeconfig);

    let ours = |extra: Value| {
        let mut annotations = json!({
            "lockwarden.io/nonce": "0123456789abcdef",
            "lockwarden.io/revision": "r1",
            "lockwarden.io/lease-ms": "30000",
            "lockwarden.io/state": "held",
            "lockwarden.io/holder": "someone",
        });
        for (k, v) in extra.as_object().unwrap() {
            annotations[k] = v.clone();
        }
        annotations
    };
    let cases: Vec<(&str, Value, Value, &str)> = vec![
        // (A leaseDurationSeconds of 0 or less is refused by the API server itself.)
        (
            "holder-mismatch-released",
            ours(json!({"lockwarden.io/state": "released", "lockwarden.io/lease-ms": "0"})),
            json!({"holderIdentity": "", "leaseDurationSeconds": 30}),
            "lease-ms is missing or not a positive integer",
        ),
        (
            "lease-ms-garbage",
            ours(json!({"lockwarden.io/lease-ms": "soon"})),
            json!({"holderIdentity": "someone", "leaseDurationSeconds": 30}),
            "lease-ms is missing or not a positive integer",
        ),
        (
            "lease-ms-huge",
            ours(json!({"lockwarden.io/lease-ms": "99999999999999999999999"})),
            json!({"holderIdentity": "someone", "leaseDurationSeconds": 30}),
            "lease-ms is missing or not a positive integer",
        ),
        (
            "state-odd",
            ours(json!({"lockwarden.io/state": "stolen"})),
            json!({"holderIdentity": "someone", "leaseDurationSeconds": 30}),
            "\"stolen\"",
        ),
    ];
    for (name, annotations, spec, fragment) in cases {
        let lease: KubeLease = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": spec,
        }))
        .unwrap();
        let created = api
            .create(&PostParams::default(), &lease)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let lock = CasLock::new(LeaseStore::new(client.clone(), &namespace, name));
        match lock.try_acquire(&request("me")).await {
            Err(LockError::Foreign { found, .. }) => {
                assert!(found.what.contains(fragment), "{name}: {found}");
                assert_bounded(&found);
            }
            other => panic!("{name}: expected a foreign record, got {other:?}"),
        }
        let url = format!("k8s://{namespace}/{name}");
        let out = cli.run(&["lock", &url, "-o", "x.lock"]).await;
        out.expect(3, &[&url, "not a lockwarden lock"], name);
        let after = api.get(name).await.unwrap();
        assert_eq!(
            after.metadata.resource_version, created.metadata.resource_version,
            "{name}: the Lease was rewritten"
        );
    }

    // A client-go Lease at the last fence a Lease can carry (leaseTransitions is an
    // int32), expired: taking it over would need fence 2^31, which the Lease cannot
    // store, so the takeover is refused instead of reusing a fence.
    let name = "last-transition";
    let lease: KubeLease = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "holderIdentity": "other",
            "leaseDurationSeconds": 1,
            "leaseTransitions": i32::MAX,
        },
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &lease).await.unwrap();
    let lock: Arc<dyn LockBackend> = Arc::new(CasLock::new(LeaseStore::new(
        client.clone(),
        &namespace,
        name,
    )));
    match acquire(&*lock, &request("me"), Wait::For(Duration::from_secs(60))).await {
        Err(LockError::Backend { message, .. }) => {
            assert!(message.contains("fence"), "{message}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let after = api.get(name).await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        created.metadata.resource_version
    );
}

//! Fenced writes to Kubernetes objects: the chart's ValidatingAdmissionPolicy
//! (`fencing.admissionPolicy.enabled`) and its plain-manifest copy, on the real API
//! server. The API server itself refuses a stale holder's write to an object labelled
//! `lockwarden.io/fenced: "true"`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::*;

/// The plain manifest users `kubectl apply` without the chart.
const MANIFEST: &str = "manifests/fencing-admission-policy.yaml";
const POLICY: &str = "lockwarden-fenced-writes";
const FENCE: &str = "lockwarden.io/fence";
const FENCE_LOCK: &str = "lockwarden.io/fence-lock";

fn manifest() -> String {
    std::fs::read_to_string(repo_root().join(MANIFEST)).expect("the fencing manifest")
}

/// The objects without their Helm labels (the plain manifest has none).
pub(super) fn unlabelled(mut objs: Vec<Value>) -> Vec<Value> {
    for obj in &mut objs {
        if let Some(meta) = obj["metadata"].as_object_mut() {
            meta.remove("labels");
        }
    }
    objs
}

#[test]
fn fencing_manifest_is_the_chart_rendered_with_its_defaults() {
    let rendered = render(
        "lockwarden",
        "lockwarden-system",
        None,
        &["fencing.admissionPolicy.enabled=true".into()],
    );
    let policy_objects: Vec<Value> = objects(&rendered)
        .into_iter()
        .filter(|o| {
            o["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.ends_with("-fenced-writes"))
        })
        .collect();
    assert_eq!(policy_objects.len(), 2, "the policy and its binding");
    assert_eq!(
        unlabelled(policy_objects),
        objects(&manifest()),
        "{MANIFEST} differs from the chart's render: regenerate it from templates/fencing-admission-policy.yaml"
    );
    // Off by default.
    let default = objects(&render("lockwarden", "lockwarden-system", None, &[]));
    assert!(
        !default.iter().any(|o| o["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.ends_with("-fenced-writes"))),
        "the policy is opt-in"
    );
}

fn config_map(name: &str, fenced: bool, annotations: &[(&str, &str)]) -> ConfigMap {
    let mut cm: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": name },
        "data": { "v": "0" },
    }))
    .expect("config map");
    if fenced {
        cm.metadata.labels = Some(BTreeMap::from([(
            "lockwarden.io/fenced".to_string(),
            "true".to_string(),
        )]));
    }
    cm.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    cm
}

/// A merge patch that writes data `v` with these annotations.
async fn write(
    api: &Api<ConfigMap>,
    name: &str,
    v: &str,
    annotations: Value,
) -> Result<ConfigMap, kube::Error> {
    let patch = json!({ "metadata": { "annotations": annotations }, "data": { "v": v } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

/// The API server's refusal message; panics if the write was admitted.
pub(super) fn refusal<T: std::fmt::Debug>(result: Result<T, kube::Error>, what: &str) -> String {
    match result {
        Err(kube::Error::Api(status)) if status.code == 403 || status.code == 422 => status.message,
        other => panic!("{what}: expected the policy to refuse it, got {other:?}"),
    }
}

/// Admission policies take effect asynchronously: waits until a probe in the test's
/// namespace is refused.
async fn policy_in_force(api: &Api<ConfigMap>) {
    api.create(
        &PostParams::default(),
        &config_map("probe", true, &[(FENCE, "10")]),
    )
    .await
    .expect("probe");
    // A dry run goes through admission without writing, so the probe keeps fence 10.
    eventually("the policy in force", Duration::from_secs(60), || async {
        let stale = json!({ "metadata": { "annotations": { FENCE: "1" } } });
        api.patch(
            "probe",
            &PatchParams::default().dry_run(),
            &Patch::Merge(&stale),
        )
        .await
        .err()
        .map(|_| ())
    })
    .await;
}

/// The object `name` as it is now, PUT back with `fence` in its annotation: what a
/// holder does that read it and writes it back as its own.
async fn put_back_with_fence(
    api: &Api<ConfigMap>,
    name: &str,
    fence: &str,
) -> Result<ConfigMap, kube::Error> {
    let mut read_back = api.get(name).await.expect("get");
    read_back
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(FENCE.into(), fence.into());
    api.replace(name, &PostParams::default(), &read_back).await
}

#[tokio::test]
async fn the_api_server_refuses_a_write_with_a_stale_fence() {
    let (client, namespaces) = setup(&["fencing"]).await;
    let ns = &namespaces[0];
    apply(&manifest(), MANIFEST).await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);

    // The policy type-checks without warnings once its status caught up.
    type_checked_without_warnings(&client, POLICY, Duration::from_secs(60)).await;

    policy_in_force(&api).await;

    api.create(
        &PostParams::default(),
        &config_map("ledger", true, &[(FENCE, "6")]),
    )
    .await
    .expect("create with fence 6");

    // A stale holder's write is refused, naming both fences.
    let message = refusal(
        write(&api, "ledger", "stale", json!({ FENCE: "5" })).await,
        "fence 5 after 6",
    );
    assert!(
        message.contains("object written by fence 6, yours is 5"),
        "{message}"
    );
    // Also when it read the object first and PUTs it back with its own fence.
    let message = refusal(
        put_back_with_fence(&api, "ledger", "5").await,
        "read, then PUT with fence 5",
    );
    assert!(message.contains("yours is 5"), "{message}");
    // A full PUT that drops the annotation is no way around it.
    let mut bare = api.get("ledger").await.expect("get");
    bare.metadata.annotations = None;
    let message = refusal(
        api.replace("ledger", &PostParams::default(), &bare).await,
        "PUT without a fence",
    );
    assert!(
        message.contains("carries no lockwarden.io/fence"),
        "{message}"
    );

    // The same fence and higher ones are admitted; they compare as integers (9 < 10).
    for fence in ["6", "7", "9", "10", "18446744073709551615"] {
        write(&api, "ledger", fence, json!({ FENCE: fence }))
            .await
            .unwrap_or_else(|e| panic!("fence {fence}: {e}"));
    }
    let message = refusal(
        write(
            &api,
            "ledger",
            "x",
            json!({ FENCE: "18446744073709551616" }),
        )
        .await,
        "beyond u64",
    );
    assert!(message.contains("decimal fencing token"), "{message}");
    // A merge patch that does not set the annotation keeps the stored fence: admitted.
    api.patch(
        "ledger",
        &PatchParams::default(),
        &Patch::Merge(json!({ "data": { "v": "same holder" } })),
    )
    .await
    .expect("a patch that leaves the fence alone");

    // Fences belong to one lock: a write fenced by another lock is refused.
    api.create(
        &PostParams::default(),
        &config_map(
            "owned",
            true,
            &[(FENCE, "3"), (FENCE_LOCK, "k8s://ns-a/db")],
        ),
    )
    .await
    .expect("create fenced by a lock");
    let message = refusal(
        write(
            &api,
            "owned",
            "x",
            json!({ FENCE: "4", FENCE_LOCK: "k8s://ns-b/other" }),
        )
        .await,
        "another lock's fence",
    );
    assert!(
        message.contains("fenced by lock k8s://ns-a/db"),
        "{message}"
    );
    write(
        &api,
        "owned",
        "y",
        json!({ FENCE: "4", FENCE_LOCK: "k8s://ns-a/db" }),
    )
    .await
    .expect("the same lock's next fence");

    // An object without the label is never looked at.
    api.create(
        &PostParams::default(),
        &config_map("plain", false, &[(FENCE, "6")]),
    )
    .await
    .expect("create unlabelled");
    write(&api, "plain", "x", json!({ FENCE: "1" }))
        .await
        .expect("unlabelled objects are untouched");
}

/// `lockwarden::backend::FencedKubernetesObject`, the helper that always sets the
/// fence: 8 holders with fences 1..8 race on one ConfigMap, round after round, each
/// with a fence 8 higher than in the last round. The stored fence never goes down,
/// every refusal is of a fence below the stored one, and the round's highest fence is
/// what stays. Then `lockwarden put`/`get` with a lock really taken: a fence the lock
/// never issued refused, exit 5 naming both fences for a stale one, another lock's
/// write refused, a manifest of another kind refused, deletes not offered.
#[tokio::test]
async fn fenced_puts_racing_on_one_object_never_lower_its_fence() {
    use lockwarden::backend::{FencedKubernetesObject, FencedTarget};
    use lockwarden::fenced::{Content, Fence, FencedError, FencedObject};

    const WRITERS: u64 = 8;
    const ROUNDS: u64 = 20;
    let (client, namespaces) = setup(&["fenced-put"]).await;
    let ns = &namespaces[0];
    apply(&manifest(), MANIFEST).await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    policy_in_force(&api).await;

    let url = format!("k8s://{ns}/configmaps/ledger");
    let FencedTarget::KubernetesObject(target) = FencedTarget::parse(&url).unwrap() else {
        panic!("{url} is an object target")
    };
    let object = FencedKubernetesObject::new(client.clone(), target);
    let lock = format!("k8s://{ns}/ledger-lock");
    let (mut written, mut refused) = (0, 0);
    let mut highest = 0;
    for round in 0..ROUNDS {
        let writes = (1..=WRITERS).map(|w| {
            let (object, lock) = (&object, lock.clone());
            let fence = round * WRITERS + w;
            async move {
                let manifest =
                    format!("apiVersion: v1\nkind: ConfigMap\ndata:\n  fence: \"{fence}\"\n");
                (
                    fence,
                    object
                        .put(&Fence::new(fence, lock), manifest.as_bytes())
                        .await,
                )
            }
        });
        for (fence, result) in futures::future::join_all(writes).await {
            match result {
                Ok(_) => written += 1,
                Err(FencedError::Stale { stored, yours, .. }) => {
                    assert_eq!(yours.0, fence);
                    assert!(stored.0 > fence, "fence {fence} refused by stored {stored}");
                    refused += 1;
                }
                Err(e) => panic!("fence {fence}: {e}"),
            }
        }
        let stored = object.get().await.unwrap().expect("the object");
        let by = stored.written_by.expect("a fenced object");
        let fence = by.token.0;
        assert!(
            fence >= highest,
            "stored fence went down: {highest} -> {fence}"
        );
        assert_eq!(
            fence,
            (round + 1) * WRITERS,
            "round {round}: the highest fence wins"
        );
        assert_eq!(by.lock, lock);
        let Content::Data(yaml) = stored.content else {
            panic!("data")
        };
        let yaml = String::from_utf8(yaml).unwrap();
        assert!(
            yaml.contains(&format!("fence: '{fence}'"))
                || yaml.contains(&format!("fence: \"{fence}\"")),
            "{yaml}"
        );
        highest = fence;
    }
    println!(
        "[fenced put] {ROUNDS} rounds x {WRITERS} writers: {written} written, {refused} refused"
    );
    assert!(
        refused > 0,
        "the race refused nobody: the writers did not overlap"
    );

    // The command line, as a holder under `lockwarden run` uses it, on an object of
    // its own: `put` takes only fences the lock issued (rule 10), so the lock is
    // really taken, twice (fence 2), and another lock once.
    let kube = support::cli::Cli::kube();
    api.create(&PostParams::default(), &config_map("ledger-cli", true, &[]))
        .await
        .expect("create ledger-cli");
    let url = format!("k8s://{ns}/configmaps/ledger-cli");
    let lock = format!("k8s://{ns}/ledger-cli-lock");
    let other = format!("k8s://{ns}/other");
    for taken in [&lock, &lock, &other] {
        kube.run(&["lock", taken, "-o", "taken.lock"]).await.ok();
        kube.run(&["unlock", "taken.lock"]).await.ok();
    }
    let file = kube.path("ledger.yaml");
    std::fs::write(&file, "apiVersion: v1\nkind: ConfigMap\ndata:\n  v: cli\n").unwrap();
    let file = file.to_str().unwrap();
    kube.run(&["put", "--fence", "3", "--lock", &lock, &url, file])
        .await
        .code(5)
        .one_line_error(&[&lock, "fence 3 was never issued", "its latest fence is 2"]);
    kube.run(&["put", "--fence", "2", "--lock", &lock, &url, file])
        .await
        .ok();
    let out = kube.run(&["get", &url]).await;
    out.ok();
    assert!(out.stdout.contains("v: cli"), "{}", out.stdout);
    assert!(
        out.stderr.contains(&format!("fence 2 of lock {lock}")),
        "{}",
        out.stderr
    );
    kube.run(&["put", "--fence", "1", "--lock", &lock, &url, file])
        .await
        .code(5)
        .one_line_error(&[&url, "stale fence: object written by fence 2, yours is 1"]);
    kube.run(&["put", "--fence", "1", "--lock", &other, &url, file])
        .await
        .code(5)
        .one_line_error(&[&format!("fenced by lock {lock}")]);
    std::fs::write(kube.path("secret.yaml"), "apiVersion: v1\nkind: Secret\n").unwrap();
    kube.run(&[
        "put",
        "--fence",
        "2",
        "--lock",
        &lock,
        &url,
        kube.path("secret.yaml").to_str().unwrap(),
    ])
    .await
    .code(2)
    .one_line_error(&["is a v1 Secret, not one of configmaps"]);
    kube.run(&["delete", "--fence", "2", "--lock", &lock, &url])
        .await
        .code(2)
        .one_line_error(&["deletes of Kubernetes objects are not fenced"]);
    // A stale holder that bypasses `put` is still refused, by the API server.
    let message = refusal(
        put_back_with_fence(&api, "ledger-cli", "1").await,
        "a PUT with fence 1",
    );
    assert!(
        message.contains("object written by fence 2, yours is 1"),
        "{message}"
    );
}

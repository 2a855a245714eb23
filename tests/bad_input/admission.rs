//! Misuse of Job and Pod gating: one table of Jobs and Pods run through both the
//! controller's own checks (`lockwarden::controller::admission`, over the parsers the
//! controller uses) and the real API server with `manifests/admission-rules.yaml` (the
//! chart's rules in CEL) installed. Row by row the two agree: refused by both — each
//! message naming the same fragment — or admitted by both.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use lockwarden::controller::admission::{job_misuse, pod_misuse};
use lockwarden::controller::jobs::JOB;
use lockwarden::controller::pods::POD;
use support::kubectl::kubectl;

use super::*;

const MANIFEST: &str = "manifests/admission-rules.yaml";

/// One object and what both sides must make of it: `None` admitted, `Some(fragment)`
/// refused with a message containing `fragment`.
struct Row {
    name: String,
    object: Value,
    refused: Option<&'static str>,
}

fn row(name: &str, object: Value, refused: Option<&'static str>) -> Row {
    Row {
        name: name.to_string(),
        object,
        refused,
    }
}

fn job(annotations: Value, suspend: bool) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": { "annotations": annotations },
        "spec": {
            "suspend": suspend,
            "template": { "spec": {
                "restartPolicy": "Never",
                "containers": [{ "name": "c", "image": "busybox" }],
            }},
        },
    })
}

/// A Pod with the label `lockwarden.io/gated` set to `label` (none if `None`) and the
/// scheduling gate if `gated`.
fn pod(label: Option<&str>, gated: bool, annotations: Value) -> Value {
    let labels = match label {
        Some(v) => json!({ "lockwarden.io/gated": v }),
        None => json!({}),
    };
    let gates = if gated {
        json!([{ "name": "lockwarden.io/lock" }])
    } else {
        json!([])
    };
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "labels": labels, "annotations": annotations },
        "spec": {
            "schedulingGates": gates,
            "containers": [{ "name": "c", "image": "busybox" }],
        },
    })
}

/// A labelled, gated Pod: the controller sees it, so its annotations count.
fn gated_pod(annotations: Value) -> Value {
    pod(Some("true"), true, annotations)
}

/// Annotation values the controller's parsers refuse (or accept), as rows of both
/// kinds: what a Job and a Pod name their locks with is parsed by the same code.
fn annotation_rows() -> Vec<(&'static str, Value, Option<&'static str>)> {
    let long = "a".repeat(254);
    #[rustfmt::skip]
    let rows = vec![
        // Refused.
        ("empty-lock", json!({"lockwarden.io/lock": ""}), Some("\"\"")),
        ("upper-case-lock", json!({"lockwarden.io/lock": "DB"}), Some("\"DB\"")),
        ("underscore-template", json!({"lockwarden.io/lock-template": "a_b"}), Some("\"a_b\"")),
        ("double-dot", json!({"lockwarden.io/lock": "a..b"}), Some("\"a..b\"")),
        ("leading-hyphen", json!({"lockwarden.io/lock": "-a"}), Some("\"-a\"")),
        ("other-namespace", json!({"lockwarden.io/lock": "ns/db"}), Some("\"ns/db\"")),
        ("name-over-253", json!({"lockwarden.io/lock": long}), Some("lockwarden.io/lock: ")),
        ("empty-list", json!({"lockwarden.io/locks": ""}), Some("empty entry")),
        ("blank-list", json!({"lockwarden.io/locks": " , "}), Some("empty entry")),
        ("empty-entry", json!({"lockwarden.io/locks": "a,,b"}), Some("empty entry")),
        ("trailing-comma", json!({"lockwarden.io/lock-templates": "a,"}), Some("empty entry")),
        ("repeated-entry", json!({"lockwarden.io/locks": "a, b ,a"}), Some("\"a\" is named twice")),
        ("repeated-across-lists", json!({"lockwarden.io/locks": "a", "lockwarden.io/lock-templates": "a"}), Some("\"a\" is named twice")),
        ("bad-list-entry", json!({"lockwarden.io/locks": "a, B"}), Some("\"B\"")),
        ("list-entry-in-namespace", json!({"lockwarden.io/lock-templates": "x/t"}), Some("\"x/t\"")),
        ("lock-and-template", json!({"lockwarden.io/lock": "a", "lockwarden.io/lock-template": "t"}), Some("both lockwarden.io/lock and lockwarden.io/lock-template are set")),
        ("single-and-list", json!({"lockwarden.io/lock-template": "t", "lockwarden.io/locks": "a"}), Some("both lockwarden.io/lock-template and lockwarden.io/locks are set")),
        ("on-lock-lost-empty", json!({"lockwarden.io/lock": "db", "lockwarden.io/on-lock-lost": ""}), Some("lockwarden.io/on-lock-lost: \"\" is not one of")),
        ("on-lock-lost-capitalised", json!({"lockwarden.io/lock": "db", "lockwarden.io/on-lock-lost": "Ignore"}), Some("lockwarden.io/on-lock-lost: \"Ignore\" is not one of")),
        // Admitted.
        ("one-lock", json!({"lockwarden.io/lock": "db"}), None),
        ("dotted-lock", json!({"lockwarden.io/lock": "db.eu-1.x"}), None),
        ("name-of-253", json!({"lockwarden.io/lock": "a".repeat(253)}), None),
        ("one-template", json!({"lockwarden.io/lock-template": "per-run"}), None),
        ("list-with-spaces", json!({"lockwarden.io/locks": " a , b"}), None),
        ("both-lists", json!({"lockwarden.io/locks": "a", "lockwarden.io/lock-templates": "t1,t2"}), None),
        // lost-grace stays with the controller (its maximum depends on the safety
        // margins): admitted here, refused later by the controller with an Event.
        ("lost-grace-over-the-maximum", json!({"lockwarden.io/lock": "db", "lockwarden.io/lost-grace": "1h"}), None),
    ];
    rows
}

fn rows() -> Vec<Row> {
    let mut rows = Vec::new();
    for (name, annotations, refused) in annotation_rows() {
        rows.push(row(
            &format!("job-{name}"),
            job(annotations.clone(), true),
            refused,
        ));
        rows.push(row(&format!("pod-{name}"), gated_pod(annotations), refused));
    }
    // Every on-lock-lost value each kind takes (from the kinds themselves), and one
    // only the other kind takes.
    for (value, _) in JOB.on_lock_lost {
        let annotations = json!({"lockwarden.io/lock": "db", "lockwarden.io/on-lock-lost": value});
        rows.push(row(
            &format!("job-on-lock-lost-{value}"),
            job(annotations, true),
            None,
        ));
    }
    for (value, _) in POD.on_lock_lost {
        let annotations = json!({"lockwarden.io/lock": "db", "lockwarden.io/on-lock-lost": value});
        rows.push(row(
            &format!("pod-on-lock-lost-{value}"),
            gated_pod(annotations),
            None,
        ));
    }
    let lock_lost = |v: &str| json!({"lockwarden.io/lock": "db", "lockwarden.io/on-lock-lost": v});
    rows.push(row(
        "job-on-lock-lost-delete",
        job(lock_lost("delete"), true),
        Some("\"delete\" is not one of suspend, fail, ignore (for a Job)"),
    ));
    rows.push(row(
        "pod-on-lock-lost-suspend",
        gated_pod(lock_lost("suspend")),
        Some("\"suspend\" is not one of delete, ignore (for a Pod)"),
    ));

    // How a Job is held back.
    let one = || json!({"lockwarden.io/lock": "db"});
    // The controller reads on-lock-lost only of a workload that names a lock (a gated
    // Pod naming none is refused for that: see pod-gate-without-lock).
    let bad_policy_only = || json!({"lockwarden.io/on-lock-lost": "x"});
    #[rustfmt::skip]
    let held_back = [
        row("job-not-suspended", job(one(), false), Some("is not suspended")),
        row("job-template-list-not-suspended", job(json!({"lockwarden.io/lock-templates": "t"}), false), Some("is not suspended")),
        row("job-plain", job(json!({}), false), None),
        row("job-on-lock-lost-without-lock", job(bad_policy_only(), false), None),
        row("pod-on-lock-lost-without-lock", pod(Some("true"), false, bad_policy_only()), None),
        row("job-fence-annotation-only", job(json!({"lockwarden.io/fence": "3"}), false), None),
        // How a Pod is held back and seen.
        row("pod-gate-without-label", pod(None, true, one()), Some("stay gated forever")),
        row("pod-gate-without-label-or-lock", pod(None, true, json!({})), Some("stay gated forever")),
        row("pod-gate-label-false", pod(Some("false"), true, one()), Some("stay gated forever")),
        row("pod-gate-without-lock", pod(Some("true"), true, json!({})), Some("names no lock")),
        row("pod-label-without-gate", pod(Some("true"), false, one()), Some("no scheduling gate lockwarden.io/lock")),
        row("pod-label-only", pod(Some("true"), false, json!({})), None),
        row("pod-plain", pod(None, false, json!({})), None),
        // Not seen by the controller (no label, no gate): none of lockwarden's business,
        // whatever its annotations say.
        row("pod-unwatched-with-bad-annotations", pod(None, false, json!({"lockwarden.io/locks": "a,,a"})), None),
    ];
    rows.extend(held_back);
    rows.extend(example_rows());
    rows
}

/// Every Job in examples/, and every Deployment's pod template as a Pod: what the
/// README tells users to apply is admitted by both.
fn example_rows() -> Vec<Row> {
    use serde::Deserialize;
    let dir = support::repo_root().join("examples");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut rows = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let file = file.file_name().unwrap().to_string_lossy().into_owned();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let object = Value::deserialize(doc).unwrap();
            let name = format!("example {file} {}", object["metadata"]["name"]);
            match object["kind"].as_str() {
                Some("Job") => rows.push(row(&name, object, None)),
                Some("Deployment") => {
                    let template = &object["spec"]["template"];
                    let pod = json!({
                        "apiVersion": "v1", "kind": "Pod",
                        "metadata": template["metadata"], "spec": template["spec"],
                    });
                    rows.push(row(&name, pod, None));
                }
                _ => {}
            }
        }
    }
    assert!(
        rows.len() >= 9,
        "examples/ has fewer workloads than expected: {}",
        rows.len()
    );
    rows
}

/// The controller's verdict: `Err(message)` if it refuses the object.
fn controller_verdict(object: &Value) -> Result<(), String> {
    let verdict = match object["kind"].as_str() {
        Some("Job") => job_misuse(&serde_json::from_value::<Job>(object.clone()).unwrap()),
        Some("Pod") => pod_misuse(&serde_json::from_value::<Pod>(object.clone()).unwrap()),
        other => panic!("a row of kind {other:?}"),
    };
    verdict.map_err(|misuse| misuse.to_string())
}

/// The API server's verdict on creating `object` as `name` (a dry run: admission runs,
/// nothing is stored).
async fn server_verdict(
    client: &kube::Client,
    ns: &str,
    name: &str,
    object: &Value,
) -> Result<(), String> {
    let mut object = object.clone();
    object["metadata"]["name"] = json!(name);
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let result = match object["kind"].as_str() {
        Some("Job") => Api::<Job>::namespaced(client.clone(), ns)
            .create(&dry, &serde_json::from_value(object).unwrap())
            .await
            .map(|_| ()),
        _ => Api::<Pod>::namespaced(client.clone(), ns)
            .create(&dry, &serde_json::from_value(object).unwrap())
            .await
            .map(|_| ()),
    };
    match result {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 422 || status.code == 403 => {
            Err(status.message)
        }
        Err(e) => panic!("{name}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_rules_and_the_controller_agree_on_every_row() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let ns = cp.namespace(&client, "admission").await;
    let path = support::repo_root().join(MANIFEST);
    let out = kubectl(
        &["apply", "--server-side", "-f", path.to_str().unwrap()],
        None,
    )
    .await;
    assert!(
        out.status.success(),
        "apply {MANIFEST}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Policies take effect asynchronously: wait until both the Pod and the Job policy
    // refuse a probe.
    let probes = [
        ("probe-pod", pod(None, true, json!({}))),
        ("probe-job", job(json!({"lockwarden.io/lock": "db"}), false)),
    ];
    for (name, object) in &probes {
        support::eventually(
            "the admission rules in force",
            Duration::from_secs(90),
            || async {
                server_verdict(&client, &ns, name, object)
                    .await
                    .err()
                    .map(|_| ())
            },
        )
        .await;
    }

    let rows = rows();
    let mut disagreements = Vec::new();
    for (
        i,
        Row {
            name,
            object,
            refused,
        },
    ) in rows.iter().enumerate()
    {
        let rust = controller_verdict(object);
        let server = server_verdict(&client, &ns, &format!("row-{i}"), object).await;
        let agree = match (refused, &rust, &server) {
            (None, Ok(()), Ok(())) => true,
            (Some(fragment), Err(r), Err(s)) => r.contains(fragment) && s.contains(fragment),
            _ => false,
        };
        if !agree {
            disagreements.push(format!(
                "{name}: expected {refused:?}\n  controller: {rust:?}\n  API server: {server:?}"
            ));
        }
    }
    println!("[admission] {} rows", rows.len());
    assert!(
        disagreements.is_empty(),
        "{} of {} rows disagree:\n{}",
        disagreements.len(),
        rows.len(),
        disagreements.join("\n")
    );
}

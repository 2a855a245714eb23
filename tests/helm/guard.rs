//! Guard injection (`guard.*`, templates/guard-injection.yaml) and its plain-manifest
//! copy: the render (where MutatingAdmissionPolicy v1 is served only), then on the real
//! API server — a Job and a Pod annotated `lockwarden.io/guard: "true"` come back with
//! the guard exactly as designed, one without the annotation or already guarded is left
//! alone, a container without `command` is refused — and each result judged by the
//! controller's own checks (`decide::guard_missing`, `admission::guard_misuse`).

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use lockwarden::controller::admission::guard_misuse;
use lockwarden::controller::gating::GatedWorkload;
use lockwarden::controller::gating::decide::guard_missing;

use super::admission::{admitted, create, refused};
use super::fencing::unlabelled;
use super::*;

/// The plain manifest users `kubectl apply` without the chart.
const MANIFEST: &str = "manifests/guard-injection.yaml";
/// Where the guard is mounted by default (`guard.injection.dir`).
const DIR: &str = "/lockwarden-guard";

fn guard_objects(rendered: &str) -> Vec<Value> {
    objects(rendered)
        .into_iter()
        .filter(|o| {
            o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .contains("-guard-")
        })
        .collect()
}

#[test]
fn guard_injection_manifest_is_the_chart_rendered_with_its_defaults() {
    let objs = guard_objects(&render("lockwarden", "lockwarden-system", None, &[]));
    let mut kinds: Vec<&str> = objs.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "MutatingAdmissionPolicy",
            "MutatingAdmissionPolicy",
            "MutatingAdmissionPolicyBinding",
            "MutatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicyBinding",
        ],
        "pods and jobs, on by default where served"
    );
    let manifest = std::fs::read_to_string(repo_root().join(MANIFEST)).expect(MANIFEST);
    assert_eq!(
        unlabelled(objs.clone()),
        objects(&manifest),
        "{MANIFEST} differs from the chart's render: regenerate it from templates/guard-injection.yaml"
    );
    for obj in &objs {
        let ops = &obj["spec"]["matchConstraints"]["resourceRules"];
        if !ops.is_null() {
            assert_eq!(ops[0]["operations"], json!(["CREATE"]), "{obj}");
        }
    }
    // The init container's image is the chart's unless guard.image says otherwise.
    let mutation = |objs: &[Value]| {
        of_kind(objs, "MutatingAdmissionPolicy")[0]["spec"]["mutations"][0]["jsonPatch"]
            ["expression"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(mutation(&objs).contains("image: 'ghcr.io/lockwarden/lockwarden:0.1.0'"));
    let other = guard_objects(&render_lw(&["guard.image=registry.local/lw:static"]));
    assert!(mutation(&other).contains("image: 'registry.local/lw:static'"));

    // Off when disabled, and in namespace-scoped mode (policies are cluster-scoped).
    let off = guard_objects(&render_lw(&["guard.injection.enabled=false"]));
    assert!(off.is_empty(), "{off:#?}");
    let scoped = guard_objects(&render_namespace_scoped("lw", "lockwarden-system", "apps"));
    assert!(scoped.is_empty(), "{scoped:#?}");

    // Not served before 1.36 (offline render: the version decides)...
    let chart = chart_dir();
    let chart = chart.to_str().unwrap();
    let out = helm(&["template", "lw", chart, "--kube-version", "v1.35.0"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(guard_objects(&text(&out.stdout)).is_empty());
    // ...and against a cluster, what it serves decides: discovery lists kinds.
    let out = helm(&[
        "template",
        "lw",
        chart,
        "--kube-version",
        "v1.36.0",
        "--api-versions",
        "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",
    ]);
    assert!(
        guard_objects(&text(&out.stdout)).is_empty(),
        "API turned off"
    );
    let out = helm(&[
        "template",
        "lw",
        chart,
        "--kube-version",
        "v1.35.0",
        "--api-versions",
        "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",
        "--api-versions",
        "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy",
    ]);
    assert_eq!(guard_objects(&text(&out.stdout)).len(), 8, "served");
}

fn annotated(guard: bool) -> Value {
    if guard {
        json!({ "lockwarden.io/guard": "true" })
    } else {
        json!({})
    }
}

fn pod(name: &str, guard: bool, containers: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "annotations": annotated(guard) },
        "spec": { "containers": containers, "restartPolicy": "Never" },
    })
}

fn job(name: &str, guard: bool, containers: Value) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": { "name": name, "annotations": annotated(guard) },
        "spec": {
            "suspend": true,
            "template": { "spec": { "containers": containers, "restartPolicy": "Never" } },
        },
    })
}

/// Two containers: one with command and args, one with a command only.
fn two_containers() -> Value {
    json!([
        { "name": "work", "image": "debian:bookworm-slim",
          "command": ["sh", "-c"], "args": ["echo $LOCKWARDEN_FENCE"] },
        { "name": "side", "image": "debian:bookworm-slim", "command": ["sleep", "60"] },
    ])
}

/// Asserts the pod spec `spec` carries the guard exactly as designed around
/// `two_containers()`.
fn assert_guarded(spec: &Value) {
    let what = spec.to_string();
    assert_eq!(
        spec["volumes"],
        json!([{ "name": "lockwarden-guard", "emptyDir": {} }]),
        "{what}"
    );
    let init = &spec["initContainers"];
    assert_eq!(init.as_array().map(Vec::len), Some(1), "{what}");
    assert_eq!(init[0]["name"], "lockwarden-guard");
    assert_eq!(init[0]["image"], "ghcr.io/lockwarden/lockwarden:0.1.0");
    assert_eq!(
        init[0]["command"],
        json!(["/usr/local/bin/lockwarden", "install", DIR])
    );
    assert_eq!(
        init[0]["volumeMounts"],
        json!([{ "name": "lockwarden-guard", "mountPath": DIR }])
    );
    assert_eq!(init[0]["securityContext"]["runAsNonRoot"], true);
    let guard = format!("{DIR}/lockwarden");
    let containers = spec["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 2);
    assert_eq!(
        containers[0]["command"],
        json!([guard, "guard", "--", "sh", "-c"])
    );
    assert_eq!(containers[0]["args"], json!(["echo $LOCKWARDEN_FENCE"]));
    assert_eq!(
        containers[1]["command"],
        json!([guard, "guard", "--", "sleep", "60"])
    );
    assert!(containers[1]["args"].is_null());
    for c in containers {
        assert_eq!(
            c["volumeMounts"],
            json!([{ "name": "lockwarden-guard", "mountPath": DIR, "readOnly": true }]),
            "{c}"
        );
        let mut env: Vec<(String, String)> = c["env"]
            .as_array()
            .unwrap_or_else(|| panic!("env of {c}"))
            .iter()
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_string(),
                    e["valueFrom"]["fieldRef"]["fieldPath"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                )
            })
            .collect();
        env.sort();
        let field = |a: &str| format!("metadata.annotations['lockwarden.io/{a}']");
        assert_eq!(
            env,
            [
                ("LOCKWARDEN_FENCE".to_string(), field("fence")),
                ("LOCKWARDEN_FENCES".to_string(), field("fences")),
                ("LOCKWARDEN_NONCE".to_string(), field("nonce")),
                ("LOCKWARDEN_NONCES".to_string(), field("nonces")),
                ("LOCKWARDEN_URL".to_string(), field("url")),
                ("LOCKWARDEN_URLS".to_string(), field("urls")),
            ],
            "{c}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_injection_adds_the_guard_to_annotated_jobs_and_pods_at_creation() {
    let (client, namespaces) = setup(&["guard"]).await;
    let ns = &namespaces[0];
    let release = unique("grd");
    let only_here = format!(
        "guard.injection.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name={ns}"
    );
    let objs = guard_objects(&render(&release, ns, None, &[only_here]));
    let stream: Vec<String> = objs.iter().map(|o| o.to_string()).collect();
    apply(&stream.join("\n---\n"), "the guard injection").await;
    // The CEL type-checks without warnings.
    for policy in of_kind(&objs, "ValidatingAdmissionPolicy") {
        let name = policy["metadata"]["name"].as_str().unwrap();
        type_checked_without_warnings(&client, name, TIMEOUT).await;
    }
    // In force once dry runs come back guarded and the command-less one refused.
    let probe = pod("probe", true, two_containers());
    eventually("the Pod injection in force", TIMEOUT, || async {
        let out: Value = serde_json::from_str(&create(ns, &probe, true).await.ok()?).ok()?;
        out["spec"]["initContainers"].is_array().then_some(())
    })
    .await;
    let probe = job("probe", true, two_containers());
    eventually("the Job injection in force", TIMEOUT, || async {
        let out: Value = serde_json::from_str(&create(ns, &probe, true).await.ok()?).ok()?;
        out["spec"]["template"]["spec"]["initContainers"]
            .is_array()
            .then_some(())
    })
    .await;
    let no_command = json!([
        { "name": "work", "image": "debian:bookworm-slim", "command": ["sh"] },
        { "name": "entry", "image": "debian:bookworm-slim", "args": ["run"] },
    ]);
    let probe = pod("probe", true, no_command.clone());
    eventually("the command rule in force", TIMEOUT, || async {
        create(ns, &probe, true).await.err().map(|_| ())
    })
    .await;

    // Annotated: the guard, exactly as designed; the controller would start them.
    let guarded_pod = admitted(ns, &pod("guarded", true, two_containers())).await;
    assert_guarded(&guarded_pod["spec"]);
    let typed: Pod = serde_json::from_value(guarded_pod.clone()).unwrap();
    assert_eq!(guard_missing(typed.annotations(), typed.pod_spec()), None);
    let guarded_job = admitted(ns, &job("guarded", true, two_containers())).await;
    assert_guarded(&guarded_job["spec"]["template"]["spec"]);
    let typed: Job = serde_json::from_value(guarded_job).unwrap();
    assert_eq!(guard_missing(typed.annotations(), typed.pod_spec()), None);

    // Not annotated: untouched.
    for (object, spec_at) in [
        (pod("plain", false, two_containers()), "/spec"),
        (job("plain", false, two_containers()), "/spec/template/spec"),
    ] {
        let created = admitted(ns, &object).await;
        let spec = created.pointer(spec_at).unwrap();
        assert!(spec["initContainers"].is_null(), "{spec}");
        assert!(spec["volumes"].is_null(), "{spec}");
        assert_eq!(spec["containers"][0]["command"], json!(["sh", "-c"]));
    }

    // Already guarded by hand (the README's lines): left alone.
    let by_hand = json!([{
        "name": "work", "image": "debian:bookworm-slim",
        "command": ["/guard/lockwarden", "guard", "--", "sh", "-c", "work"],
    }]);
    let created = admitted(ns, &pod("by-hand", true, by_hand.clone())).await;
    assert!(created["spec"]["initContainers"].is_null(), "{created}");
    assert_eq!(
        created["spec"]["containers"][0]["command"],
        by_hand[0]["command"]
    );
    // A guarded object created again (what a re-invocation would see) is not wrapped
    // twice.
    let mut again = guarded_pod.clone();
    for key in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "managedFields",
    ] {
        again["metadata"].as_object_mut().unwrap().remove(key);
    }
    again["metadata"]["name"] = json!("again");
    again.as_object_mut().unwrap().remove("status");
    let created = admitted(ns, &again).await;
    assert_guarded(&created["spec"]);

    // A container without command: refused, naming it; the controller's rule agrees.
    let message = "lockwarden.io/guard: \"true\" but container entry has no command";
    refused(ns, &pod("no-command", true, no_command.clone()), message).await;
    refused(
        ns,
        &job("no-command", true, no_command.clone()),
        &format!("spec.template: {message}"),
    )
    .await;
    let typed: Pod = serde_json::from_value(pod("no-command", true, no_command)).unwrap();
    let rust = guard_misuse(&typed).unwrap_err().to_string();
    assert!(rust.contains(message), "{rust}");
    assert!(
        guard_missing(typed.annotations(), typed.pod_spec())
            .is_some_and(|m| m.contains("entry has no command")),
        "the controller would not start it either"
    );
    // Without the annotation a command-less container is none of the guard's business.
    admitted(
        ns,
        &pod(
            "entrypoint",
            false,
            json!([{ "name": "entry", "image": "debian:bookworm-slim" }]),
        ),
    )
    .await;
}

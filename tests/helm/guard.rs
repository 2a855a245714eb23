//! Guard injection (`guard.*`, templates/guard-injection.yaml) and its plain-manifest
//! copy: the render (where MutatingAdmissionPolicy v1 is served only), then on the real
//! API server — a Job and a Pod annotated `lockwarden.io/guard: "true"` come back with
//! the guard exactly as designed, one without the annotation or already guarded is left
//! alone, a container without `command` is refused — and each result judged by the
//! controller's own checks (`decide::guard_missing`, `admission::guard_misuse`). Then
//! the guard's report on its own Pod (templates/guard-report.yaml): written with a
//! token bound to that Pod, and by nothing else.

use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenRequest};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use lockwarden::controller::admission::guard_misuse;
use lockwarden::controller::gating::GatedWorkload;
use lockwarden::controller::gating::decide::guard_missing;

use super::admission::{admitted, create, refused};
use super::fencing::{refusal, unlabelled};
use super::*;

/// The plain manifest users `kubectl apply` without the chart.
const MANIFEST: &str = "manifests/guard-injection.yaml";
/// Where the guard is mounted by default (`guard.injection.dir`).
const DIR: &str = "/lockwarden-guard";
/// The report's ClusterRole and policy in the manifest (release `lockwarden`).
const REPORT: &str = "lockwarden-guard-report";

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
            "ClusterRole",
            "MutatingAdmissionPolicy",
            "MutatingAdmissionPolicy",
            "MutatingAdmissionPolicyBinding",
            "MutatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicyBinding",
        ],
        "pods and jobs, and the guard's report (Pods, Jobs' templates), on by default where served"
    );
    let manifest = std::fs::read_to_string(repo_root().join(MANIFEST)).expect(MANIFEST);
    assert_eq!(
        unlabelled(objs.clone()),
        objects(&manifest),
        "{MANIFEST} differs from the chart's render: regenerate it from templates/guard-injection.yaml"
    );
    // The injection at creation; the report on a Pod's updates (its status too), its
    // creation and its binding, and on every write of a Job (its pod template).
    let report_jobs = format!("{REPORT}-jobs");
    for obj in &objs {
        let rules = &obj["spec"]["matchConstraints"]["resourceRules"];
        if rules.is_null() {
            continue;
        }
        let ops: Vec<(&Value, &Value)> = rules
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (&r["resources"], &r["operations"]))
            .collect();
        let name = &obj["metadata"]["name"];
        if name == REPORT {
            assert_eq!(
                ops,
                [
                    (&json!(["pods", "pods/status"]), &json!(["UPDATE"])),
                    (&json!(["pods", "pods/binding"]), &json!(["CREATE"])),
                ],
                "{obj}"
            );
        } else if *name == *report_jobs {
            assert_eq!(
                ops,
                [(&json!(["jobs"]), &json!(["CREATE", "UPDATE"]))],
                "{obj}"
            );
        } else {
            assert_eq!(ops.len(), 1, "{obj}");
            assert_eq!(ops[0].1, &json!(["CREATE"]), "{obj}");
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
    assert_eq!(guard_objects(&text(&out.stdout)).len(), 13, "served");
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

/// `object` (a [`pod`] or [`job`]) with `lockwarden.io/guard-path: path`: the guard is
/// already in its image.
fn with_guard_path(mut object: Value, path: &str) -> Value {
    object["metadata"]["annotations"]["lockwarden.io/guard-path"] = json!(path);
    object
}

/// Asserts the pod spec `spec` carries the guard exactly as designed around
/// `two_containers()`, copied in by the init container.
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
    let mounts = json!([{ "name": "lockwarden-guard", "mountPath": DIR, "readOnly": true }]);
    assert_wrapped(spec, &format!("{DIR}/lockwarden"), &mounts);
}

/// Asserts the pod spec `spec` carries the guard exactly as designed around
/// `two_containers()`, from `path` in the workload's image: no volume, no init
/// container, no mount.
fn assert_guarded_from_image(spec: &Value, path: &str) {
    let what = spec.to_string();
    assert!(spec["volumes"].is_null(), "{what}");
    assert!(spec["initContainers"].is_null(), "{what}");
    assert_wrapped(spec, path, &Value::Null);
}

/// Asserts `two_containers()` in `spec` run under `guard` with the guard's
/// environment, and have `mounts` as their volume mounts.
fn assert_wrapped(spec: &Value, guard: &str, mounts: &Value) {
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
        assert_eq!(&c["volumeMounts"], mounts, "{c}");
        // (name, the downward API's field or `value=` the literal value)
        let mut env: Vec<(String, String)> = c["env"]
            .as_array()
            .unwrap_or_else(|| panic!("env of {c}"))
            .iter()
            .map(|e| {
                let from = match e["value"].as_str() {
                    Some(value) => format!("value={value}"),
                    None => e["valueFrom"]["fieldRef"]["fieldPath"]
                        .as_str()
                        .unwrap_or_else(|| panic!("{e}"))
                        .to_string(),
                };
                (e["name"].as_str().unwrap().to_string(), from)
            })
            .collect();
        env.sort();
        let field = |a: &str| format!("metadata.annotations['lockwarden.io/{a}']");
        let own_name = format!("value={}", c["name"].as_str().unwrap());
        assert_eq!(
            env,
            [
                ("LOCKWARDEN_CONTAINER_NAME", own_name),
                ("LOCKWARDEN_FENCE", field("fence")),
                ("LOCKWARDEN_FENCES", field("fences")),
                ("LOCKWARDEN_NONCE", field("nonce")),
                ("LOCKWARDEN_NONCES", field("nonces")),
                ("LOCKWARDEN_POD_NAME", "metadata.name".to_string()),
                ("LOCKWARDEN_POD_NAMESPACE", "metadata.namespace".to_string()),
                ("LOCKWARDEN_POD_UID", "metadata.uid".to_string()),
                ("LOCKWARDEN_URL", field("url")),
                ("LOCKWARDEN_URLS", field("urls")),
            ]
            .map(|(name, from)| (name.to_string(), from)),
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

    // The guard already in the image (lockwarden.io/guard-path): the commands wrapped
    // with it, the same environment, and no volume, init container or mount; the
    // controller would start them.
    let in_image = "/usr/local/bin/lockwarden";
    let from_image = admitted(
        ns,
        &with_guard_path(pod("from-image", true, two_containers()), in_image),
    )
    .await;
    assert_guarded_from_image(&from_image["spec"], in_image);
    let typed: Pod = serde_json::from_value(from_image).unwrap();
    assert_eq!(guard_missing(typed.annotations(), typed.pod_spec()), None);
    let from_image = admitted(
        ns,
        &with_guard_path(job("from-image", true, two_containers()), in_image),
    )
    .await;
    assert_guarded_from_image(&from_image["spec"]["template"]["spec"], in_image);
    let typed: Job = serde_json::from_value(from_image).unwrap();
    assert_eq!(guard_missing(typed.annotations(), typed.pod_spec()), None);
    // A path the controller would not know for the guard, or one without the guard
    // asked for: refused, naming it; the Rust specification agrees.
    let unusable = [
        (
            with_guard_path(pod("relative", true, two_containers()), "lockwarden"),
            "lockwarden.io/guard-path \"lockwarden\" is not an absolute path ending in /lockwarden",
        ),
        (
            with_guard_path(job("renamed", true, two_containers()), "/usr/bin/guard"),
            "spec.template: lockwarden.io/guard-path \"/usr/bin/guard\" is not an absolute path",
        ),
        (
            with_guard_path(pod("unasked", false, two_containers()), in_image),
            "lockwarden.io/guard-path is set but lockwarden.io/guard is not \"true\"",
        ),
    ];
    for (object, message) in unusable {
        refused(ns, &object, message).await;
        let rust = match object["kind"].as_str() {
            Some("Job") => guard_misuse(&serde_json::from_value::<Job>(object).unwrap()),
            _ => guard_misuse(&serde_json::from_value::<Pod>(object).unwrap()),
        };
        let rust = rust.unwrap_err().to_string();
        let message = message.trim_start_matches("spec.template: ");
        assert!(rust.starts_with(message), "{rust}");
    }

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

// ---------------------------------------------------------------------------
// The guard's report

/// The guide page whose RoleBinding the report's test applies (its `<!-- runs:
/// tests/helm/guard.rs -->` block; tests/cli/docs_markdown.rs checks this file names it).
const GUIDE: &str = "docs/guide/guard.md";
/// The report of container `main`.
const MAIN: &str = "guard-ended.lockwarden.io/main";
/// The request for a renewal of container `main`'s guard, before its command starts.
const WAITING: &str = "guard-waiting.lockwarden.io/main";

/// docs/guide/guard.md's RoleBinding ("The guard's report") of the ClusterRole `role`
/// to ServiceAccount `sa`, in `ns`.
fn guide_role_binding(role: &str, ns: &str, sa: &str) -> Value {
    let page = std::fs::read_to_string(repo_root().join(GUIDE)).expect(GUIDE);
    let block = page
        .split_once("<!-- runs: tests/helm/guard.rs -->\n```yaml\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(block, _)| block)
        .expect("docs/guide/guard.md has the RoleBinding block");
    let mut binding: Value = serde_yaml_ng::from_str(block).expect("the guide's RoleBinding");
    assert_eq!(binding["kind"], "RoleBinding", "{binding}");
    assert_eq!(
        binding["roleRef"]["name"], REPORT,
        "the default release's role"
    );
    binding["metadata"]["namespace"] = json!(ns);
    binding["roleRef"]["name"] = json!(role);
    binding["subjects"][0]["name"] = json!(sa);
    binding["subjects"][0]["namespace"] = json!(ns);
    binding
}

/// Creates a Pod `name` running as `sa` (never scheduled: there is no node) and
/// returns its uid.
async fn bare_pod(pods: &Api<Pod>, name: &str, sa: &str) -> String {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "serviceAccountName": sa,
            "restartPolicy": "Never",
            "containers": [
                { "name": "main", "image": "debian:bookworm-slim", "command": ["true"] },
            ],
        },
    }))
    .unwrap();
    let created = pods
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("create Pod {name}: {e}"));
    created.uid().expect("a created Pod has a uid")
}

/// A token of ServiceAccount `sa`, bound to the Pod (name, uid) if given — what the
/// kubelet mounts into a Pod — or to nothing.
async fn token(accounts: &Api<ServiceAccount>, sa: &str, pod: Option<(&str, &str)>) -> String {
    let bound = pod
        .map(|(name, uid)| json!({ "apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid }));
    let request: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": { "audiences": [], "boundObjectRef": bound },
    }))
    .unwrap();
    accounts
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("a token for {sa} bound to {pod:?}: {e}"))
        .status
        .expect("a TokenRequest's status")
        .token
        .expect("the token")
}

/// A client of the test API server (its address and CA from the admin kubeconfig) that
/// authenticates with `token` alone.
async fn client_with_token(token: &str) -> Client {
    let path = ControlPlane::shared().kubeconfig_path();
    let kubeconfig = Kubeconfig::read_from(path).expect("the admin kubeconfig");
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("the admin kubeconfig");
    // Replaces the admin's client certificate: the token is the only credential.
    config.auth_info = serde_json::from_value(json!({ "token": token })).unwrap();
    Client::try_from(config).expect("a client with a bearer token")
}

/// The report of container `main` set to `value` (`None`: removed), with the Pod's
/// uid as the guard sends it.
fn report(uid: &str, value: Option<&str>) -> Value {
    json!({ "metadata": { "uid": uid, "annotations": { MAIN: value } } })
}

/// The request for a renewal of container `main` set to `value` (`None`: removed), with
/// the Pod's uid, as the report.
fn waiting(uid: &str, value: Option<&str>) -> Value {
    json!({ "metadata": { "uid": uid, "annotations": { WAITING: value } } })
}

async fn merge(api: &Api<Pod>, name: &str, patch: &Value) -> Result<Pod, kube::Error> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

/// `merge` through pods/status, as the kubelet and the controllers write.
async fn merge_status(api: &Api<Pod>, name: &str, patch: &Value) -> Result<Pod, kube::Error> {
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

/// Asserts the policy refused `result` (`what`) with a message containing `message`.
fn refused_with<T: std::fmt::Debug>(result: Result<T, kube::Error>, what: &str, message: &str) {
    let got = refusal(result, what);
    assert!(got.contains(message), "{what}: {got}\nexpected: {message}");
}

/// A suspended Job `name` whose pod template carries `annotations`.
fn job_with_template_annotations(name: &str, annotations: Value) -> Job {
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "suspend": true,
            "template": {
                "metadata": { "annotations": annotations },
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        { "name": "main", "image": "debian:bookworm-slim", "command": ["true"] },
                    ],
                },
            },
        },
    }))
    .unwrap()
}

/// The guard's report (templates/guard-report.yaml) on the real API server: a
/// ServiceAccount bound to the chart's role as docs/guide/guard.md says, and a token of
/// it bound to Pod A, as the kubelet mounts one (its pod-uid claim checked first). A's
/// token adds, changes and removes its request for a renewal
/// (`guard-waiting.lockwarden.io/main`) on A, alone or beside a report, and adds
/// `guard-ended.lockwarden.io/main` to A; it may not change or remove the report
/// afterwards, touch anything else of A (beside a report or a request for a renewal), or
/// write on Pod B, a request for a renewal included, nor may a token of the
/// ServiceAccount bound to no Pod; nobody else writes a report, the admin included, not
/// through pods/status either (which keeps metadata changes). No report comes with a
/// Pod's creation, its binding to a node, or a Job's pod template (created or updated).
/// RBAC alone allows every one of these writes, so each refusal is the policy's, with
/// its message. Ordinary updates are untouched: the admin's (a request for a renewal
/// included: a forged one costs only a renewal), those of a Pod whose ServiceAccount
/// holds cluster-admin's wildcard (which grants the role's marker too), status updates
/// (the admin's, and a holder of the role's with a right to pods/status of its own: the
/// role's confinement is for its `patch` on Pods), a Pod created and a binding with a
/// request for a renewal but no report, and a Job's template annotations as the
/// lockwarden controller writes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_report_is_written_only_by_the_pod_itself_and_only_its_annotations() {
    let (admin, namespaces) = setup(&["guard-report"]).await;
    let ns = &namespaces[0];
    let release = unique("grr");
    let name = format!("{release}-lockwarden-guard-report");
    // The report's objects only (the injection is not needed for a report).
    let jobs_policy = format!("{name}-jobs");
    let objs: Vec<Value> = guard_objects(&render(&release, ns, None, &[]))
        .into_iter()
        .filter(|o| {
            o["metadata"]["name"] == name.as_str() || o["metadata"]["name"] == jobs_policy.as_str()
        })
        .collect();
    let mut kinds: Vec<&str> = objs.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicyBinding",
        ]
    );
    let stream: Vec<String> = objs.iter().map(|o| o.to_string()).collect();
    apply(&stream.join("\n---\n"), "the guard's report").await;
    type_checked_without_warnings(&admin, &name, TIMEOUT).await;
    type_checked_without_warnings(&admin, &jobs_policy, TIMEOUT).await;

    // The workloads' ServiceAccount, bound to the role as the guide says; Pods A and B
    // run as it, C as a ServiceAccount that may do anything in the namespace.
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    for sa in ["guarded", "operator"] {
        let account = serde_json::from_value(json!({ "metadata": { "name": sa } })).unwrap();
        accounts
            .create(&PostParams::default(), &account)
            .await
            .unwrap_or_else(|e| panic!("ServiceAccount {sa}: {e}"));
    }
    let binding = guide_role_binding(&name, ns, "guarded");
    apply(&binding.to_string(), "the guide's RoleBinding").await;
    let operator = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": { "name": "operator", "namespace": ns },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "cluster-admin" },
        "subjects": [{ "kind": "ServiceAccount", "name": "operator", "namespace": ns }],
    });
    apply(&operator.to_string(), "cluster-admin in the namespace").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let a = bare_pod(&pods, "a", "guarded").await;
    let b = bare_pod(&pods, "b", "guarded").await;
    let c = bare_pod(&pods, "c", "operator").await;

    // RBAC alone lets the ServiceAccount patch every Pod of the namespace (and the admin
    // anything): each refusal below is the policy's.
    let sa = format!("system:serviceaccount:{ns}:guarded");
    let out = kubectl(
        &[
            "auth",
            "can-i",
            "patch",
            "pods",
            "--namespace",
            ns.as_str(),
            "--as",
            sa.as_str(),
        ],
        None,
    )
    .await;
    assert_eq!(text(&out.stdout).trim(), "yes", "{}", text(&out.stderr));

    // A's token carries A's uid, as the API server hands it to admission.
    let as_a = client_with_token(&token(&accounts, "guarded", Some(("a", &a))).await).await;
    let review = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
    }))
    .unwrap();
    let me: SelfSubjectReview = Api::all(as_a.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("A's SelfSubjectReview");
    let me = me.status.and_then(|s| s.user_info).expect("user info");
    assert_eq!(me.username.as_deref(), Some(sa.as_str()));
    assert_eq!(
        me.extra
            .unwrap_or_default()
            .get("authentication.kubernetes.io/pod-uid"),
        Some(&vec![a.clone()]),
        "the pod-uid claim of a token bound to A"
    );
    let a_pods: Api<Pod> = Api::namespaced(as_a, ns);
    let unbound = client_with_token(&token(&accounts, "guarded", None).await).await;
    let unbound_pods: Api<Pod> = Api::namespaced(unbound, ns);
    let as_c = client_with_token(&token(&accounts, "operator", Some(("c", &c))).await).await;
    let c_pods: Api<Pod> = Api::namespaced(as_c, ns);

    // In force once the admin's dry run of a report on B is refused.
    eventually("the report policy in force", TIMEOUT, || async {
        let dry_run = PatchParams::default().dry_run();
        let patch = report(&b, Some("succeeded"));
        pods.patch("b", &dry_run, &Patch::Merge(&patch))
            .await
            .err()
            .map(|_| ())
    })
    .await;

    let own_only = "may only be written by that Pod's own guard (a ServiceAccount token bound \
                    to the Pod), and never changed or removed";
    let confined = format!(
        "{sa} holds the guard's report role (lockwarden.io guardreports: report), which lets \
         it change nothing but guard-ended.lockwarden.io/* and guard-waiting.lockwarden.io/* on \
         its own Pod"
    );
    // Before its command starts, A's guard asks for a renewal on A, asks again with other
    // revisions, and takes the request back: a request is not a report, the role's
    // holder may write it as it likes on its own Pod.
    let a_annotation = |key: &'static str| {
        let pods = pods.clone();
        async move {
            let a = pods.get("a").await.expect("A");
            a.annotations().get(key).cloned()
        }
    };
    for (value, what) in [
        (Some("rev-1"), "adding"),
        (Some("rev-2"), "changing"),
        (None, "removing"),
    ] {
        merge(&a_pods, "a", &waiting(&a, value))
            .await
            .unwrap_or_else(|e| panic!("A's token {what} its request for a renewal on A: {e}"));
        assert_eq!(
            a_annotation(WAITING).await.as_deref(),
            value,
            "A after {what} its request for a renewal"
        );
    }
    // Beside a report too (container `side`'s, its request and its report in one patch).
    let side = [
        ("guard-waiting.lockwarden.io/side", "rev-1"),
        ("guard-ended.lockwarden.io/side", "succeeded"),
    ];
    let annotations: serde_json::Map<String, Value> = side
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let both = json!({ "metadata": { "uid": a, "annotations": annotations } });
    merge(&a_pods, "a", &both)
        .await
        .expect("A's token writing a request for a renewal beside a report on A");
    for (key, value) in side {
        assert_eq!(
            a_annotation(key).await.as_deref(),
            Some(value),
            "{key} on A"
        );
    }

    // A's guard writes its report on A.
    let written = merge(&a_pods, "a", &report(&a, Some("succeeded")))
        .await
        .expect("A's own report on A");
    assert_eq!(
        written.annotations().get(MAIN).map(String::as_str),
        Some("succeeded")
    );

    // Once written, a report stays: A's token may neither change nor remove it, nor may
    // the admin.
    let already = format!("Pod a {own_only}: {MAIN} already written");
    for value in [Some("failed"), None] {
        let patch = report(&a, value);
        let what = format!("A's token setting its report to {value:?}");
        refused_with(merge(&a_pods, "a", &patch).await, &what, &already);
    }
    refused_with(
        merge(&pods, "a", &report(&a, None)).await,
        "the admin removing A's report",
        &format!("Pod a {own_only}: admin is not that Pod, and its request changes {MAIN}"),
    );

    // A's token changes nothing else of A, even beside a report or a request for a
    // renewal.
    for (patch, changes) in [
        (json!({ "metadata": { "labels": { "x": "y" } } }), "labels"),
        (
            json!({ "metadata": { "annotations": { "example.com/note": "x" } } }),
            "annotation example.com/note",
        ),
        (
            json!({ "metadata": { "uid": a, "labels": { "x": "y" },
                    "annotations": { "guard-ended.lockwarden.io/other": "succeeded" } } }),
            "labels",
        ),
        (
            json!({ "metadata": { "uid": a, "labels": { "x": "y" },
                    "annotations": { WAITING: "rev-3" } } }),
            "labels",
        ),
        (json!({ "spec": { "activeDeadlineSeconds": 60 } }), "spec"),
    ] {
        let what = format!("A's token writing {patch} on A");
        let message = format!("{confined}: this request also changes {changes} of Pod a");
        refused_with(merge(&a_pods, "a", &patch).await, &what, &message);
    }

    // Nothing on another Pod: not B's report, not B's labels, not a request for a
    // renewal on B. Nobody else writes a report either: the admin on B. A token of the
    // ServiceAccount bound to no Pod holds the role too, and may do nothing with it.
    let label = json!({ "metadata": { "labels": { "x": "y" } } });
    let not_bound_to_b = format!("{confined}: Pod b is not the Pod its token is bound to");
    for (api, pod, patch, what, message) in [
        (
            &a_pods,
            "b",
            report(&b, Some("succeeded")),
            "A's token writing B's report",
            format!("Pod b {own_only}: {sa} is not that Pod, and its request changes {MAIN}"),
        ),
        (
            &a_pods,
            "b",
            label.clone(),
            "A's token labelling B",
            not_bound_to_b.clone(),
        ),
        (
            &a_pods,
            "b",
            waiting(&b, Some("rev-1")),
            "A's token asking for a renewal on B",
            not_bound_to_b,
        ),
        (
            &pods,
            "b",
            report(&b, Some("succeeded")),
            "the admin writing B's report",
            format!("Pod b {own_only}: admin is not that Pod, and its request changes {MAIN}"),
        ),
        (
            &unbound_pods,
            "a",
            label,
            "an unbound token labelling A",
            format!("{confined}: its token is bound to no Pod"),
        ),
    ] {
        refused_with(merge(api, pod, &patch).await, what, &message);
    }

    // Everything else is untouched: the admin, and a Pod whose ServiceAccount holds
    // cluster-admin's wildcard (which grants the marker too), update Pods as before.
    merge(
        &pods,
        "b",
        &json!({ "metadata": { "labels": { "x": "admin" } } }),
    )
    .await
    .expect("the admin labels B");
    merge(
        &c_pods,
        "b",
        &json!({ "metadata": { "labels": { "x": "c" } } }),
    )
    .await
    .expect("cluster-admin's Pod C labels B");
    // A request for a renewal is nobody's to guard: the admin writes one on B.
    let b_now = merge(&pods, "b", &waiting(&b, Some("rev-1")))
        .await
        .expect("the admin asks for a renewal on B");
    assert_eq!(
        b_now.annotations().get(WAITING).map(String::as_str),
        Some("rev-1")
    );
    let a_now = pods.get("a").await.expect("A");
    assert_eq!(
        a_now.annotations().get(MAIN).map(String::as_str),
        Some("succeeded")
    );
    assert!(a_now.labels().get("x").is_none(), "{:?}", a_now.labels());

    // pods/status keeps metadata changes (its strategy resets the spec, ownerReferences
    // and the deletion timestamp only), so a report could come in that way: the same
    // rule holds there. The admin neither writes B's report nor removes A's through it.
    refused_with(
        merge_status(&pods, "b", &report(&b, Some("succeeded"))).await,
        "the admin writing B's report through pods/status",
        &format!("Pod b {own_only}: admin is not that Pod, and its request changes {MAIN}"),
    );
    refused_with(
        merge_status(&pods, "a", &report(&a, None)).await,
        "the admin removing A's report through pods/status",
        &format!("Pod a {own_only}: admin is not that Pod, and its request changes {MAIN}"),
    );
    // Status updates as the kubelet and the controllers make them pass: the admin's
    // condition on B...
    let condition =
        |kind: &str| json!({ "status": { "conditions": [{ "type": kind, "status": "True" }] } });
    let has_condition = |pod: &Pod, kind: &str| {
        pod.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == kind))
    };
    let checked = merge_status(&pods, "b", &condition("example.com/Checked"))
        .await
        .expect("the admin's condition on B's status");
    assert!(
        has_condition(&checked, "example.com/Checked"),
        "{checked:?}"
    );
    // ...and, on another Pod, a holder of the role that may write pods/status of its own
    // (the role grants none): its confinement is for the role's `patch` on Pods, and
    // status updates ask the authorizer nothing. A report it still may not write there.
    let status_writer = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": { "name": "status-writer", "namespace": ns },
        "rules": [{ "apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"] }],
    });
    apply(&status_writer.to_string(), "a Role writing pods/status").await;
    let status_binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": { "name": "status-writer", "namespace": ns },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "status-writer" },
        "subjects": [{ "kind": "ServiceAccount", "name": "guarded", "namespace": ns }],
    });
    apply(
        &status_binding.to_string(),
        "pods/status for the guarded ServiceAccount",
    )
    .await;
    eventually("RBAC to grant pods/status", TIMEOUT, || async {
        let out = kubectl(
            &[
                "auth",
                "can-i",
                "patch",
                "pods",
                "--subresource",
                "status",
                "--namespace",
                ns.as_str(),
                "--as",
                sa.as_str(),
            ],
            None,
        )
        .await;
        (text(&out.stdout).trim() == "yes").then_some(())
    })
    .await;
    let checked = merge_status(&a_pods, "b", &condition("example.com/Seen"))
        .await
        .expect("A's token, with pods/status of its own, sets a condition on B");
    assert!(has_condition(&checked, "example.com/Seen"), "{checked:?}");
    refused_with(
        merge_status(&a_pods, "b", &report(&b, Some("succeeded"))).await,
        "A's token writing B's report through pods/status",
        &format!("Pod b {own_only}: {sa} is not that Pod, and its request changes {MAIN}"),
    );

    // No report at creation: no guard can have written it yet. Not on a Pod...
    let created_with = "guard-ended.lockwarden.io/* is the guard's report that its \
                        container's command ended in success, written by that Pod's own guard \
                        once it has run; none can exist before";
    let d: Pod = serde_json::from_value(json!({
        "metadata": { "name": "d", "annotations": { MAIN: "succeeded" } },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                { "name": "main", "image": "debian:bookworm-slim", "command": ["true"] },
            ],
        },
    }))
    .unwrap();
    refused_with(
        pods.create(&PostParams::default(), &d).await,
        "the admin creating a Pod with a report",
        &format!("Pod d would be created with {MAIN}: {created_with}"),
    );
    // (A request for a renewal, which nothing guards, may come with a Pod; with a
    // binding too, below.)
    let mut asking = d.clone();
    asking.metadata.name = Some("asking".into());
    asking.metadata.annotations = Some([(WAITING.to_string(), "rev-1".to_string())].into());
    let asking = pods
        .create(&PostParams::default(), &asking)
        .await
        .expect("the admin creating a Pod with a request for a renewal");
    assert_eq!(
        asking.annotations().get(WAITING).map(String::as_str),
        Some("rev-1")
    );
    // ...nor in the Binding that puts a Pod on a node (the API server copies its
    // annotations onto the Pod); one without a report (a request for a renewal is none)
    // binds as the scheduler's does.
    bare_pod(&pods, "e", "guarded").await;
    let binding = |annotations: Value| {
        json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": { "name": "e", "annotations": annotations },
            "target": { "apiVersion": "v1", "kind": "Node", "name": "node-1" },
        })
    };
    let bind = |body: Value| {
        let pods = pods.clone();
        async move {
            pods.create_subresource::<_, Value>("binding", "e", &PostParams::default(), &body)
                .await
        }
    };
    refused_with(
        bind(binding(json!({ MAIN: "succeeded" }))).await,
        "the admin binding Pod E with a report",
        &format!("Pod e would be bound to a node with {MAIN}: {created_with}"),
    );
    bind(binding(
        json!({ "example.com/note": "x", WAITING: "rev-1" }),
    ))
    .await
    .expect("a binding without a report (with a request for a renewal)");
    let e = pods.get("e").await.expect("E");
    assert_eq!(
        e.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("node-1")
    );
    assert!(e.annotations().get(MAIN).is_none(), "{:?}", e.annotations());
    assert_eq!(
        e.annotations().get(WAITING).map(String::as_str),
        Some("rev-1")
    );

    // ...nor in a Job's pod template, where it would give every Pod of the Job a report
    // no guard wrote: not at creation, not by an update. The lockwarden controller's own
    // template annotations pass.
    let jobs: Api<Job> = Api::namespaced(admin.clone(), ns);
    let report_in_template = json!({ MAIN: "succeeded" });
    eventually("the Job template policy in force", TIMEOUT, || async {
        let probe = job_with_template_annotations("probe", report_in_template.clone());
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        jobs.create(&dry_run, &probe).await.err().map(|_| ())
    })
    .await;
    let in_template = |job: &str| {
        format!(
            "Job {job}: spec.template.metadata.annotations may not carry {MAIN}: \
             guard-ended.lockwarden.io/* is the guard's report"
        )
    };
    refused_with(
        jobs.create(
            &PostParams::default(),
            &job_with_template_annotations("j", report_in_template.clone()),
        )
        .await,
        "the admin creating a Job with a report in its template",
        &in_template("j"),
    );
    jobs.create(
        &PostParams::default(),
        &job_with_template_annotations("k", json!({ "lockwarden.io/fence": "1" })),
    )
    .await
    .expect("a Job whose template carries the controller's fence");
    let template = |annotations: Value| json!({ "spec": { "template": { "metadata": { "annotations": annotations } } } });
    jobs.patch(
        "k",
        &PatchParams::default(),
        &Patch::Merge(&template(json!({ "lockwarden.io/fence": "2" }))),
    )
    .await
    .expect("the fence in the template updated, as the controller does");
    refused_with(
        jobs.patch(
            "k",
            &PatchParams::default(),
            &Patch::Merge(&template(report_in_template.clone())),
        )
        .await,
        "the admin adding a report to a Job's template",
        &in_template("k"),
    );
}

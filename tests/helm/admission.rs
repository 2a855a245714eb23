//! Admission rules for misuse of Job and Pod gating (`admissionRules.*`,
//! templates/admission-rules.yaml and admission-fixes.yaml) and their plain-manifest
//! copy: the render, then each rule on the real API server — the bad object refused at
//! its creation with the stated message, the good one admitted, every template kind
//! refused at *its* creation, an UPDATE only warned about — and the
//! MutatingAdmissionPolicy alternative that fixes instead of refusing.
//!
//! Other tests of this binary apply the chart's default render (cluster-wide rules) to
//! the same API server; these tests bind their own release's rules to their own
//! namespace (`admissionRules.namespaceSelector`), and assert only what holds whichever
//! other release's rules are installed too.

use lockwarden::controller::jobs::JOB;
use lockwarden::controller::pods::POD;

use super::fencing::unlabelled;
use super::*;

/// The plain manifest users `kubectl apply` without the chart.
const MANIFEST: &str = "manifests/admission-rules.yaml";

fn manifest() -> String {
    std::fs::read_to_string(repo_root().join(MANIFEST)).expect("the admission rules manifest")
}

/// The rendered objects of the admission rules (and fixes) only.
fn admission_objects(rendered: &str) -> Vec<Value> {
    objects(rendered)
        .into_iter()
        .filter(|o| {
            let name = o["metadata"]["name"].as_str().unwrap_or_default();
            name.contains("-misuse-") || name.contains("-fix-")
        })
        .collect()
}

/// The release's rules bound to namespace `ns` only.
fn only_in(ns: &str) -> String {
    format!("admissionRules.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name={ns}")
}

fn validations(policy: &Value) -> String {
    serde_json::to_string(&policy["spec"]["validations"]).unwrap()
}

#[test]
fn admission_rules_manifest_is_the_chart_rendered_with_its_defaults() {
    let rules = admission_objects(&render("lockwarden", "lockwarden-system", None, &[]));
    assert_eq!(
        of_kind(&rules, "ValidatingAdmissionPolicy").len(),
        4,
        "pods, pod templates, jobs, cronjobs: {rules:#?}"
    );
    assert_eq!(
        unlabelled(rules.clone()),
        objects(&manifest()),
        "{MANIFEST} differs from the chart's render: regenerate it from templates/admission-rules.yaml"
    );
    // Each policy: Deny on CREATE, Warn on UPDATE, nothing else.
    for policy in of_kind(&rules, "ValidatingAdmissionPolicy") {
        let name = &policy["metadata"]["name"];
        let mut bindings: Vec<(String, Value)> =
            of_kind(&rules, "ValidatingAdmissionPolicyBinding")
                .into_iter()
                .filter(|b| &b["spec"]["policyName"] == name)
                .map(|b| {
                    let ops: Vec<Value> = b["spec"]["matchResources"]["resourceRules"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|r| r["operations"].clone())
                        .collect();
                    (b["spec"]["validationActions"].to_string(), json!(ops))
                })
                .collect();
        bindings.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            bindings,
            vec![
                ("[\"Deny\"]".to_string(), json!([["CREATE"]])),
                ("[\"Warn\"]".to_string(), json!([["UPDATE"]])),
            ],
            "bindings of {name}"
        );
        assert_eq!(policy["spec"]["failurePolicy"], "Ignore", "{name}");
    }
    // The on-lock-lost values in the CEL are the kinds' own (jobs.rs JOB, pods.rs POD),
    // in every policy checking that kind, and nowhere else.
    let cel_list = |kind: &lockwarden::controller::gating::Kind| {
        let names: Vec<String> = kind
            .on_lock_lost
            .iter()
            .map(|(n, _)| format!("'{n}'"))
            .collect();
        format!(
            "variables.{}Annotations['lockwarden.io/on-lock-lost'] in [{}]",
            kind.name.to_lowercase(),
            names.join(",")
        )
    };
    let (job_list, pod_list) = (cel_list(&JOB), cel_list(&POD));
    for policy in of_kind(&rules, "ValidatingAdmissionPolicy") {
        let name = policy["metadata"]["name"].as_str().unwrap();
        let v = validations(policy);
        let checks_jobs = name.ends_with("-jobs") || name.ends_with("-cronjobs");
        assert_eq!(
            v.matches("on-lock-lost'] in [").count(),
            1 + usize::from(checks_jobs),
            "{name}: {v}"
        );
        assert_eq!(
            v.contains(&job_list),
            checks_jobs,
            "{name}: {job_list} in {v}"
        );
        assert!(v.contains(&pod_list), "{name}: {pod_list} in {v}");
    }
    // No fixing by default.
    assert!(of_kind(&rules, "MutatingAdmissionPolicy").is_empty());

    // Off when disabled, and in namespace-scoped mode (policies are cluster-scoped).
    let off = admission_objects(&render_lw(&["admissionRules.enabled=false"]));
    assert!(off.is_empty(), "{off:#?}");
    let scoped = admission_objects(&render_namespace_scoped("lw", "lockwarden-system", "apps"));
    assert!(scoped.is_empty(), "{scoped:#?}");

    // Fixing: two MutatingAdmissionPolicies (Pods, Jobs) on CREATE; the templates'
    // held-back rules go (their Pods and Jobs are fixed), the others stay.
    let fixing = admission_objects(&render_lw(&["admissionRules.fix=true"]));
    let fixes = of_kind(&fixing, "MutatingAdmissionPolicy");
    assert_eq!(fixes.len(), 2, "{fixes:#?}");
    assert_eq!(of_kind(&fixing, "MutatingAdmissionPolicyBinding").len(), 2);
    for fix in &fixes {
        assert_eq!(
            fix["spec"]["matchConstraints"]["resourceRules"][0]["operations"],
            json!(["CREATE"])
        );
    }
    let policy = |suffix: &str| {
        fixing
            .iter()
            .find(|o| {
                o["kind"] == "ValidatingAdmissionPolicy"
                    && o["metadata"]["name"].as_str().unwrap().ends_with(suffix)
            })
            .unwrap_or_else(|| panic!("policy {suffix}"))
    };
    for template in ["-misuse-pod-templates", "-misuse-cronjobs"] {
        let v = validations(policy(template));
        assert!(!v.contains("stay gated forever"), "{template}: {v}");
        assert!(!v.contains("is not suspended"), "{template}: {v}");
        assert!(v.contains("on-lock-lost"), "{template}: {v}");
    }
    assert!(validations(policy("-misuse-pods")).contains("stay gated forever"));
    assert!(validations(policy("-misuse-jobs")).contains("is not suspended"));

    // Before 1.36 MutatingAdmissionPolicy v1 is not served: refused at render time.
    let chart = chart_dir();
    let out = helm(&[
        "template",
        "lw",
        chart.to_str().unwrap(),
        "--kube-version",
        "v1.35.0",
        "--set",
        "admissionRules.fix=true",
    ]);
    assert!(!out.status.success(), "fix rendered for 1.35");
    assert!(
        text(&out.stderr).contains("admissionRules.fix needs"),
        "{}",
        text(&out.stderr)
    );
}

/// Applies the release's admission objects (nothing else of the chart) and waits until
/// every ValidatingAdmissionPolicy type-checked without warnings.
async fn install_rules(client: &Client, rendered: &str) {
    let objs = admission_objects(rendered);
    let stream: Vec<String> = objs.iter().map(|o| o.to_string()).collect();
    apply(&stream.join("\n---\n"), "the admission rules").await;
    for policy in of_kind(&objs, "ValidatingAdmissionPolicy") {
        let name = policy["metadata"]["name"].as_str().unwrap();
        type_checked_without_warnings(client, name, Duration::from_secs(90)).await;
    }
}

/// `kubectl create` (or with `dry_run`, a server-side dry run) of `object` in `ns`:
/// `Ok(stdout)` or `Err(stderr)`.
pub(super) async fn create(ns: &str, object: &Value, dry_run: bool) -> Result<String, String> {
    let mut args = vec!["create", "--namespace", ns, "-o", "json", "-f", "-"];
    if dry_run {
        args.push("--dry-run=server");
    }
    let out = kubectl(&args, Some(&object.to_string())).await;
    if out.status.success() {
        Ok(text(&out.stdout))
    } else {
        Err(text(&out.stderr))
    }
}

/// `kubectl ARGS` in `ns` that must succeed; returns its stderr (warnings).
async fn update(ns: &str, args: &[&str]) -> String {
    let mut all = vec!["--namespace", ns];
    all.extend(args);
    let out = kubectl(&all, None).await;
    assert!(
        out.status.success(),
        "kubectl {args:?} was refused: {}",
        text(&out.stderr)
    );
    text(&out.stderr)
}

fn container() -> Value {
    json!([{ "name": "c", "image": "busybox" }])
}

/// A pod template (or Pod body): `lockwarden.io/lock: db`, the gate, and the label if
/// `labelled`.
fn pod_template(labelled: bool, extra_labels: Value) -> Value {
    let mut labels = extra_labels;
    if labelled {
        labels["lockwarden.io/gated"] = json!("true");
    }
    json!({
        "metadata": { "labels": labels, "annotations": { "lockwarden.io/lock": "db" } },
        "spec": {
            "schedulingGates": [{ "name": "lockwarden.io/lock" }],
            "containers": container(),
            "restartPolicy": "Never",
        },
    })
}

fn pod(name: &str, labelled: bool) -> Value {
    let mut pod = pod_template(labelled, json!({}));
    pod["apiVersion"] = json!("v1");
    pod["kind"] = json!("Pod");
    pod["metadata"]["name"] = json!(name);
    pod["spec"]["restartPolicy"] = json!("Always");
    pod
}

fn job_spec(suspend: bool, template: Value) -> Value {
    json!({ "suspend": suspend, "template": template })
}

fn plain_pod_template() -> Value {
    json!({ "spec": { "containers": container(), "restartPolicy": "Never" } })
}

fn job(name: &str, annotations: Value, suspend: bool) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": { "name": name, "annotations": annotations },
        "spec": job_spec(suspend, plain_pod_template()),
    })
}

/// An apps/v1 workload of `kind` whose pod template is `template` (selector `app: NAME`).
fn workload(kind: &str, name: &str, labelled: bool) -> Value {
    let mut template = pod_template(labelled, json!({ "app": name }));
    template["spec"]["restartPolicy"] = json!("Always");
    let mut spec = json!({
        "selector": { "matchLabels": { "app": name } },
        "template": template,
    });
    if kind == "StatefulSet" {
        spec["serviceName"] = json!(name);
    }
    json!({ "apiVersion": "apps/v1", "kind": kind, "metadata": { "name": name }, "spec": spec })
}

fn cron_job(name: &str, job_annotations: Value, suspend: bool, template: Value) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": { "name": name },
        "spec": {
            "schedule": "0 0 1 1 *",
            "jobTemplate": {
                "metadata": { "annotations": job_annotations },
                "spec": job_spec(suspend, template),
            },
        },
    })
}

/// Asserts `object` is refused at creation with a message containing `fragment`.
pub(super) async fn refused(ns: &str, object: &Value, fragment: &str) {
    let what = format!("{} {}", object["kind"], object["metadata"]["name"]);
    match create(ns, object, false).await {
        Ok(_) => panic!("{what} was admitted; expected: {fragment}"),
        Err(message) => assert!(
            message.contains(fragment) && message.contains("denied request"),
            "{what}: expected {fragment:?}, got {message}"
        ),
    }
}

pub(super) async fn admitted(ns: &str, object: &Value) -> Value {
    let what = format!("{} {}", object["kind"], object["metadata"]["name"]);
    let out = create(ns, object, false)
        .await
        .unwrap_or_else(|e| panic!("{what} was refused: {e}"));
    serde_json::from_str(&out).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_rule_refuses_at_creation_and_only_warns_on_update() {
    let (client, namespaces) = setup(&["admission"]).await;
    let ns = &namespaces[0];
    let release = unique("adm");
    install_rules(&client, &render(&release, ns, None, &[only_in(ns)])).await;
    // Policies take effect asynchronously: wait until each policy refuses a probe.
    let probes = [
        pod("probe", false),
        job("probe", json!({"lockwarden.io/lock": "db"}), false),
        workload("Deployment", "probe", false),
        cron_job(
            "probe",
            json!({"lockwarden.io/lock": "db"}),
            false,
            plain_pod_template(),
        ),
    ];
    for probe in &probes {
        eventually(
            "the admission rules in force",
            Duration::from_secs(90),
            || async { create(ns, probe, true).await.err().map(|_| ()) },
        )
        .await;
    }

    // A Pod with the gate but without the label; with it, admitted.
    refused(
        ns,
        &pod("unlabelled", false),
        "it would stay gated forever: add the label",
    )
    .await;
    admitted(ns, &pod("labelled", true)).await;
    // A Job naming a lock, not suspended; suspended, admitted.
    let lock = || json!({"lockwarden.io/lock": "db"});
    refused(
        ns,
        &job("running", lock(), false),
        "the Job names a lock but is not suspended",
    )
    .await;
    admitted(ns, &job("suspended", lock(), true)).await;
    // Annotation values the controller refuses.
    refused(
        ns,
        &job(
            "bad-policy",
            json!({"lockwarden.io/lock": "db", "lockwarden.io/on-lock-lost": "delete"}),
            true,
        ),
        "lockwarden.io/on-lock-lost: \"delete\" is not one of suspend, fail, ignore (for a Job)",
    )
    .await;
    let mut empty_entry = pod("empty-entry", true);
    empty_entry["metadata"]["annotations"] = json!({"lockwarden.io/locks": "db,,bucket"});
    refused(ns, &empty_entry, "has an empty entry").await;
    let empty_list = job("empty-list", json!({"lockwarden.io/locks": ""}), true);
    refused(ns, &empty_list, "has an empty entry").await;

    // Templates, refused at their own creation.
    for kind in ["Deployment", "StatefulSet", "ReplicaSet", "DaemonSet"] {
        let name = kind.to_lowercase();
        refused(
            ns,
            &workload(kind, &format!("{name}-bad"), false),
            "spec.template: the Pod has the scheduling gate lockwarden.io/lock but not the label",
        )
        .await;
        admitted(ns, &workload(kind, &format!("{name}-good"), true)).await;
    }
    let mut job_with_gated_pods = job("gated-pods", json!({}), false);
    job_with_gated_pods["spec"]["template"] = pod_template(false, json!({}));
    refused(
        ns,
        &job_with_gated_pods,
        "spec.template: the Pod has the scheduling gate lockwarden.io/lock but not the label",
    )
    .await;
    refused(
        ns,
        &cron_job("cron-running", lock(), false, plain_pod_template()),
        "spec.jobTemplate: the Job names a lock but is not suspended",
    )
    .await;
    refused(
        ns,
        &cron_job(
            "cron-gated-pods",
            json!({}),
            false,
            pod_template(false, json!({})),
        ),
        "spec.jobTemplate.spec.template: the Pod has the scheduling gate",
    )
    .await;
    refused(
        ns,
        &cron_job(
            "cron-bad-policy",
            json!({"lockwarden.io/lock": "db", "lockwarden.io/on-lock-lost": "never"}),
            true,
            plain_pod_template(),
        ),
        "spec.jobTemplate: lockwarden.io/on-lock-lost: \"never\" is not one of",
    )
    .await;
    admitted(
        ns,
        &cron_job("cron-good", lock(), true, plain_pod_template()),
    )
    .await;

    // UPDATE: a bad value written into an existing object is admitted with a warning,
    // and the object is not locked out: later updates are admitted (and warned about).
    let warned = update(
        ns,
        &[
            "annotate",
            "pod",
            "labelled",
            "lockwarden.io/on-lock-lost=bogus",
        ],
    )
    .await;
    assert!(
        warned.contains("Warning:")
            && warned.contains(
                "lockwarden.io/on-lock-lost: \"bogus\" is not one of delete, ignore (for a Pod)"
            ),
        "{warned}"
    );
    let warned = update(ns, &["label", "pod", "labelled", "lockwarden.io/gated-"]).await;
    assert!(warned.contains("it would stay gated forever"), "{warned}");
    let warned = update(ns, &["label", "pod", "labelled", "touched=yes"]).await;
    assert!(warned.contains("it would stay gated forever"), "{warned}");
    // Unsuspending a gated Job is what lockwarden itself does: no warning.
    let quiet = update(
        ns,
        &[
            "patch",
            "job",
            "suspended",
            "-p",
            r#"{"spec":{"suspend":false}}"#,
        ],
    )
    .await;
    assert!(!quiet.contains("Warning:"), "{quiet}");
    let warned = update(
        ns,
        &[
            "annotate",
            "job",
            "suspended",
            "lockwarden.io/on-lock-lost=never",
        ],
    )
    .await;
    assert!(
        warned
            .contains("lockwarden.io/on-lock-lost: \"never\" is not one of suspend, fail, ignore"),
        "{warned}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fix_the_api_server_labels_gated_pods_and_suspends_jobs() {
    let (client, namespaces) = setup(&["admission-fix"]).await;
    let ns = &namespaces[0];
    let group = "--api-group=admissionregistration.k8s.io";
    let out = kubectl(&["api-resources", group, "-o", "wide"], None).await;
    let resources = text(&out.stdout);
    assert!(
        resources
            .lines()
            .any(|l| l.starts_with("mutatingadmissionpolicies ")
                && l.contains("admissionregistration.k8s.io/v1 ")),
        "MutatingAdmissionPolicy v1 is not served by the test API server {}:\n{resources}",
        kube_version()
    );
    let release = unique("fix");
    install_rules(
        &client,
        &render(
            &release,
            ns,
            None,
            &[only_in(ns), "admissionRules.fix=true".into()],
        ),
    )
    .await;
    // In force once a dry run comes back fixed (until then the rules refuse it).
    let probe = pod("probe", false);
    eventually("the fixes in force", Duration::from_secs(90), || async {
        let out = create(ns, &probe, true).await.ok()?;
        let pod: Value = serde_json::from_str(&out).ok()?;
        (pod["metadata"]["labels"]["lockwarden.io/gated"] == "true").then_some(())
    })
    .await;
    let probe = job("probe", json!({"lockwarden.io/lock": "db"}), false);
    eventually("the Job fix in force", Duration::from_secs(90), || async {
        let out = create(ns, &probe, true).await.ok()?;
        let job: Value = serde_json::from_str(&out).ok()?;
        (job["spec"]["suspend"] == true).then_some(())
    })
    .await;
    // The fixing and the refusing policies come into force independently: wait for
    // the Pod rule's refusal too before asserting what it refuses.
    let mut probe = pod("probe", false);
    probe["metadata"]["annotations"]["lockwarden.io/on-lock-lost"] = json!("probe");
    eventually("the Pod rule in force", Duration::from_secs(90), || async {
        create(ns, &probe, true).await.err().map(|_| ())
    })
    .await;

    let fixed = admitted(ns, &pod("forgot-label", false)).await;
    assert_eq!(fixed["metadata"]["labels"]["lockwarden.io/gated"], "true");
    let fixed = admitted(
        ns,
        &job(
            "forgot-suspend",
            json!({"lockwarden.io/locks": "a,b"}),
            false,
        ),
    )
    .await;
    assert_eq!(fixed["spec"]["suspend"], true);
    // Objects that need no fix are left alone.
    let plain = admitted(ns, &job("plain", json!({}), false)).await;
    assert_eq!(plain["spec"]["suspend"], false);
    // What has no right value to guess is still refused.
    let mut bad = pod("bad-policy", false);
    bad["metadata"]["annotations"]["lockwarden.io/on-lock-lost"] = json!("suspend");
    refused(
        ns,
        &bad,
        "lockwarden.io/on-lock-lost: \"suspend\" is not one of delete, ignore",
    )
    .await;
}

//! The Helm chart `charts/lockwarden` against the real tools and a real API server:
//! `helm lint` / `helm template` for the default values and every `ci/*.yaml`; the
//! rendered manifests applied with `kubectl apply --server-side`; the controller's
//! RBAC checked row by row with `kubectl auth can-i --as=<its ServiceAccount>`; the
//! Deployment's pod template admitted under Pod Security "restricted"; and the
//! controller itself run with nothing but the chart's RBAC (a client certificate for
//! the chart's ServiceAccount) and the chart's own arguments.
//!
//! The ServiceMonitor CRD of the Prometheus Operator is not part of the test API
//! server: `install_servicemonitor_crd` installs a minimal one (group, kind, an open
//! schema), so the chart's ServiceMonitor is really applied, not just dry-run; its
//! fields are checked on the rendered object.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;
use std::time::Duration;

use clap::Parser;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use lockwarden::api::DistributedLock;
use lockwarden::api::conditions::{self, ACQUIRED, reason};
use lockwarden::controller::{ControllerConfig, LeaderElectionArgs};
use serde_json::{Value, json};
use support::kube::{ControlPlane, client_from_kubeconfig, install_lockwarden_crd};
use support::kubectl::{kubectl, kubectl_on};
use support::locks::{aws_secret, lease_lock, s3_lock};
use support::{eventually, repo_root, tool, unique, work_dir};

/// Generous: the test machine is a loaded 2-core box.
const TIMEOUT: Duration = Duration::from_secs(90);

const CHART: &str = "charts/lockwarden";
const CRD_FILE: &str = "distributedlocks.lockwarden.io.yaml";

// ---------------------------------------------------------------------------
// helm

fn chart_dir() -> PathBuf {
    repo_root().join(CHART)
}

/// `v1.36.3`: the version of the test API server, given to `helm --kube-version` (the
/// test helm binary is built without a default one, and the chart needs >= 1.32).
fn kube_version() -> &'static str {
    static VERSION: OnceLock<String> = OnceLock::new();
    VERSION.get_or_init(|| {
        let out = std::process::Command::new(tool("KUBE_APISERVER"))
            .arg("--version")
            .output()
            .expect("run kube-apiserver --version");
        let text = String::from_utf8_lossy(&out.stdout);
        text.trim()
            .rsplit(' ')
            .next()
            .expect("kube-apiserver --version prints a version")
            .to_string()
    })
}

/// Runs helm with its cache/config/data homes in the test's work directory.
fn helm(args: &[&str]) -> Output {
    let home = work_dir("helm-home");
    std::process::Command::new(tool("HELM"))
        .args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run helm {args:?}: {e}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The non-default values files the chart is tested with (chart-testing's `ci/`).
fn ci_values_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart_dir().join("ci"))
        .expect("charts/lockwarden/ci exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 4,
        "expected at least 4 ci values files, got {files:?}"
    );
    files
}

fn ci_values(name: &str) -> PathBuf {
    let path = chart_dir().join("ci").join(name);
    assert!(path.exists(), "{} is missing", path.display());
    path
}

/// `helm template` of the chart as release `release` in `namespace`; panics with
/// helm's message if it fails.
fn render(release: &str, namespace: &str, values: Option<&Path>, sets: &[String]) -> String {
    let out = try_render(release, namespace, values, sets);
    assert!(
        out.status.success(),
        "helm template {release} (values {values:?}, --set {sets:?}) failed:\n{}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn try_render(release: &str, namespace: &str, values: Option<&Path>, sets: &[String]) -> Output {
    let chart = chart_dir();
    let mut args: Vec<String> = vec![
        "template".into(),
        release.into(),
        chart.display().to_string(),
        "--namespace".into(),
        namespace.into(),
        "--kube-version".into(),
        kube_version().into(),
    ];
    if let Some(values) = values {
        args.push("--values".into());
        args.push(values.display().to_string());
    }
    for set in sets {
        args.push("--set".into());
        args.push(set.clone());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    helm(&args)
}

/// Every object of a multi-document YAML stream, as JSON values.
fn objects(yaml: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).expect("rendered YAML parses"))
        .filter(|v| !v.is_null())
        .collect()
}

fn of_kind<'a>(objs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objs.iter().filter(|o| o["kind"] == kind).collect()
}

fn one<'a>(objs: &'a [Value], kind: &str) -> &'a Value {
    let found = of_kind(objs, kind);
    assert_eq!(
        found.len(),
        1,
        "expected exactly one {kind}, got {found:#?}"
    );
    found[0]
}

fn container(deployment: &Value) -> &Value {
    &deployment["spec"]["template"]["spec"]["containers"][0]
}

fn args(deployment: &Value) -> Vec<String> {
    container(deployment)["args"]
        .as_array()
        .expect("container args")
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

// ---------------------------------------------------------------------------
// CRDs

/// The chart ships the CRD in `crds/` (installed by `helm install` before the
/// templates); it must be byte for byte the generated top-level one.
#[test]
fn chart_crds_are_the_top_level_crds() {
    let names = |dir: &Path| -> BTreeSet<String> {
        std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    let top = repo_root().join("crds");
    let chart = chart_dir().join("crds");
    assert_eq!(
        names(&chart),
        names(&top),
        "{CHART}/crds/ and crds/ hold different files; copy them: `cp crds/* {CHART}/crds/` \
         (`LOCKWARDEN_UPDATE_CRDS=1 cargo test --test crd crd_file_is_up_to_date` writes both)"
    );
    for name in names(&top) {
        let a = std::fs::read(top.join(&name)).unwrap();
        let b = std::fs::read(chart.join(&name)).unwrap();
        assert!(
            a == b,
            "{CHART}/crds/{name} differs from crds/{name}; copy it: `cp crds/{name} {CHART}/crds/` \
             or regenerate both with `LOCKWARDEN_UPDATE_CRDS=1 cargo test --test crd crd_file_is_up_to_date`"
        );
    }
}

// ---------------------------------------------------------------------------
// lint and template

#[test]
fn helm_lint_passes_for_default_and_every_ci_values_file() {
    let chart = chart_dir().display().to_string();
    let mut runs: Vec<Option<PathBuf>> = vec![None];
    runs.extend(ci_values_files().into_iter().map(Some));
    for values in runs {
        let mut args = vec!["lint", "--strict", &chart, "--kube-version", kube_version()];
        let file;
        if let Some(v) = &values {
            file = v.display().to_string();
            args.extend(["--values", &file]);
        }
        let out = helm(&args);
        let stdout = text(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 chart(s) linted, 0 chart(s) failed"),
            "helm lint with values {values:?} failed:\n{stdout}\n{}",
            text(&out.stderr)
        );
        // And it renders.
        let rendered = render("lint", "lockwarden-system", values.as_deref(), &[]);
        assert!(
            of_kind(&objects(&rendered), "Deployment").len() == 1,
            "values {values:?}: no Deployment rendered"
        );
    }
}

/// Values that would make a broken install are refused at render time, with a message
/// naming the value.
#[test]
fn inconsistent_values_are_refused_with_a_message_naming_them() {
    let cases: [(&[&str], &str); 5] = [
        (
            &["replicaCount=2", "leaderElection.enabled=false"],
            "leaderElection.enabled",
        ),
        (
            &["watchNamespace=team-a", "rbac.secretNamespaces={team-b}"],
            "rbac.secretNamespaces",
        ),
        (
            &["serviceMonitor.enabled=true", "service.enabled=false"],
            "service.enabled",
        ),
        (&["logFormat=yaml"], "logFormat"),
        (&["replicas=3"], "replicas"),
    ];
    for (sets, named) in cases {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let out = try_render("bad", "lockwarden-system", None, &sets);
        let stderr = text(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(named),
            "--set {sets:?}: expected a refusal naming {named}, got status {:?}:\n{stderr}",
            out.status
        );
    }
}

/// Defaults: two replicas with leader election, restricted securityContext, probes,
/// metrics Service on 8080, no ServiceMonitor or PDB, no Secret access, no wildcard.
#[test]
fn default_render_is_leader_elected_restricted_and_least_privilege() {
    let objs = objects(&render("lw", "lockwarden-system", None, &[]));
    let deployment = one(&objs, "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let args = args(deployment);
    for want in [
        "--leader-elect",
        "--leader-election-namespace=lockwarden-system",
        "--leader-election-lease=lw-lockwarden-leader",
        "--metrics-address=0.0.0.0:8080",
        "--log-format=json",
        "--cluster-name=local",
    ] {
        assert!(args.iter().any(|a| a == want), "{want} not in {args:?}");
    }
    assert!(
        !args.iter().any(|a| a.starts_with("--watch-namespace")),
        "{args:?}"
    );
    let c = container(deployment);
    assert_eq!(c["image"], "ghcr.io/lockwarden/lockwarden:0.1.0");
    assert_eq!(
        c["command"],
        json!(["/usr/local/bin/lockwarden", "controller"])
    );
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["ports"][0]["containerPort"], 8080);
    assert!(c["resources"]["requests"].is_object(), "{c:#}");
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(pod["serviceAccountName"], "lw-lockwarden");

    let service = one(&objs, "Service");
    assert_eq!(service["spec"]["ports"][0]["port"], 8080);
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "metrics");
    assert!(of_kind(&objs, "ServiceMonitor").is_empty());
    assert!(of_kind(&objs, "PodDisruptionBudget").is_empty());
    // Cluster-wide mode without secretNamespaces: no Role at all, and no Secret in any rule.
    assert!(of_kind(&objs, "Role").is_empty(), "{objs:#?}");
    assert_no_wildcards_or_secrets_beyond_get(&objs);
    let rendered = serde_json::to_string(&of_kind(&objs, "ClusterRole")).unwrap();
    assert!(!rendered.contains("secrets"), "a ClusterRole names secrets");
}

/// No rule uses `*`, and Secrets only ever get `get`.
fn assert_no_wildcards_or_secrets_beyond_get(objs: &[Value]) {
    for role in objs
        .iter()
        .filter(|o| o["kind"] == "Role" || o["kind"] == "ClusterRole")
    {
        for rule in role["rules"].as_array().unwrap() {
            let s = rule.to_string();
            assert!(
                !s.contains("\"*\""),
                "wildcard in {}: {rule}",
                role["metadata"]["name"]
            );
            if rule["resources"]
                .as_array()
                .unwrap()
                .contains(&json!("secrets"))
            {
                assert_eq!(rule["verbs"], json!(["get"]), "secrets rule {rule}");
            }
        }
    }
}

#[test]
fn non_default_values_render_what_they_say() {
    // Namespace-scoped: --watch-namespace, Roles only (no ClusterRole at all with the
    // aggregated user roles off), leader election in the release namespace.
    let objs = objects(&render(
        "lw",
        "lockwarden-system",
        Some(&ci_values("namespace-scoped-values.yaml")),
        &[],
    ));
    let deployment = one(&objs, "Deployment");
    assert!(args(deployment).contains(&"--watch-namespace=team-locks".to_string()));
    assert!(args(deployment).contains(&"--cluster-name=prod-eu-1".to_string()));
    assert!(of_kind(&objs, "ClusterRole").is_empty(), "{objs:#?}");
    assert!(of_kind(&objs, "ClusterRoleBinding").is_empty());
    let role_namespaces: BTreeSet<&str> = of_kind(&objs, "Role")
        .iter()
        .map(|r| r["metadata"]["namespace"].as_str().unwrap())
        .collect();
    assert_eq!(
        role_namespaces,
        BTreeSet::from(["lockwarden-system", "team-locks"])
    );
    assert_no_wildcards_or_secrets_beyond_get(&objs);

    // One replica, no leader election, no Service; scheduling values pass through.
    let objs = objects(&render(
        "lw",
        "lockwarden-system",
        Some(&ci_values("single-replica-values.yaml")),
        &[],
    ));
    let deployment = one(&objs, "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert!(!args(deployment).iter().any(|a| a.starts_with("--leader")));
    assert!(args(deployment).contains(&"--log-format=text".to_string()));
    assert!(of_kind(&objs, "Service").is_empty());
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"]["kubernetes.io/os"], "linux");
    assert_eq!(pod["tolerations"][0]["key"], "dedicated");
    assert!(pod["affinity"]["podAntiAffinity"].is_object());
    assert_eq!(
        container(deployment)["image"],
        "ghcr.io/lockwarden/lockwarden:dev"
    );
    assert_eq!(container(deployment)["imagePullPolicy"], "Always");
    let pod_meta = &deployment["spec"]["template"]["metadata"];
    assert_eq!(pod_meta["labels"]["team"], "payments");
    assert_eq!(pod_meta["labels"]["app.kubernetes.io/name"], "lockwarden");
    assert_eq!(pod_meta["annotations"]["example.com/owner"], "payments");

    // ServiceMonitor and PDB.
    let objs = objects(&render(
        "lw",
        "lockwarden-system",
        Some(&ci_values("servicemonitor-values.yaml")),
        &[],
    ));
    let monitor = one(&objs, "ServiceMonitor");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], "metrics");
    assert_eq!(endpoint["path"], "/metrics");
    assert_eq!(endpoint["interval"], "15s");
    let service = one(&objs, "Service");
    for (k, v) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(
            &service["metadata"]["labels"][k], v,
            "ServiceMonitor selects the Service"
        );
    }
    assert_eq!(one(&objs, "PodDisruptionBudget")["spec"]["minAvailable"], 2);
    assert_eq!(one(&objs, "Deployment")["spec"]["replicas"], 3);

    // Secrets: a get-only Role in each listed namespace, nothing else.
    let objs = objects(&render(
        "lw",
        "lockwarden-system",
        Some(&ci_values("secret-namespaces-values.yaml")),
        &[],
    ));
    let secret_roles: BTreeSet<&str> = of_kind(&objs, "Role")
        .iter()
        .map(|r| r["metadata"]["namespace"].as_str().unwrap())
        .collect();
    assert_eq!(secret_roles, BTreeSet::from(["payments", "reporting"]));
    assert_no_wildcards_or_secrets_beyond_get(&objs);
    assert_eq!(
        one(&objs, "ServiceAccount")["metadata"]["annotations"]["eks.amazonaws.com/role-arn"],
        "arn:aws:iam::123456789012:role/lockwarden"
    );
}

// ---------------------------------------------------------------------------
// kubectl against the test API server

/// `kubectl apply --server-side` of a manifest stream; returns kubectl's stderr
/// (warnings). Panics with kubectl's message if it fails.
async fn apply(manifests: &str, what: &str) -> String {
    let out = kubectl(
        &[
            "apply",
            "--server-side",
            "--field-manager=helm-test",
            "-f",
            "-",
        ],
        Some(manifests),
    )
    .await;
    assert!(
        out.status.success(),
        "kubectl apply of {what} failed:\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stderr)
}

/// The CRD from the chart's `crds/` applied with kubectl (as `helm install` would).
async fn install_crd_from_chart(client: &Client) {
    let path = chart_dir().join("crds").join(CRD_FILE);
    let out = kubectl(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            path.to_str().unwrap(),
        ],
        None,
    )
    .await;
    assert!(
        out.status.success(),
        "apply chart CRD: {}",
        text(&out.stderr)
    );
    // Waits until it is Established and listable.
    install_lockwarden_crd(client).await;
}

/// A minimal stand-in for the Prometheus Operator's ServiceMonitor CRD (same group,
/// version, kind; an open schema), so the chart's ServiceMonitor can be applied.
async fn install_servicemonitor_crd() {
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": "servicemonitors.monitoring.coreos.com" },
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": { "plural": "servicemonitors", "singular": "servicemonitor",
                       "kind": "ServiceMonitor", "listKind": "ServiceMonitorList" },
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": true,
                }},
            }],
        },
    });
    apply(&crd.to_string(), "the ServiceMonitor CRD").await;
    let out = kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=90s",
            "crd/servicemonitors.monitoring.coreos.com",
        ],
        None,
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// Where a `kubectl auth can-i` question is asked.
#[derive(Clone, Debug)]
enum Scope {
    Namespace(String),
    AllNamespaces,
}

/// One row: may `verb` be done on `resource` (optionally its `subresource`, or the
/// object `name`) in `scope`? `want` is the answer the chart must give.
#[derive(Clone, Debug)]
struct Row {
    verb: &'static str,
    resource: &'static str,
    subresource: Option<&'static str>,
    name: Option<String>,
    scope: Scope,
    want: bool,
}

fn row(verb: &'static str, resource: &'static str, scope: &Scope, want: bool) -> Row {
    Row {
        verb,
        resource,
        subresource: None,
        name: None,
        scope: scope.clone(),
        want,
    }
}

fn ns(name: &str) -> Scope {
    Scope::Namespace(name.to_string())
}

/// What the controller needs wherever it handles locks (its Role/ClusterRole rules).
fn needed_rows(scope: &Scope) -> Vec<Row> {
    let mut rows = Vec::new();
    for verb in [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ] {
        rows.push(row(verb, "distributedlocks.lockwarden.io", scope, true));
        rows.push(row(verb, "leases.coordination.k8s.io", scope, true));
    }
    for verb in ["get", "update", "patch"] {
        rows.push(Row {
            subresource: Some("status"),
            ..row(verb, "distributedlocks.lockwarden.io", scope, true)
        });
    }
    rows.push(Row {
        subresource: Some("finalizers"),
        ..row("update", "distributedlocks.lockwarden.io", scope, true)
    });
    for verb in ["get", "list", "watch", "update", "patch"] {
        rows.push(row(verb, "jobs.batch", scope, true));
    }
    rows.push(Row {
        subresource: Some("finalizers"),
        ..row("update", "jobs.batch", scope, true)
    });
    for verb in ["create", "patch"] {
        rows.push(row(verb, "events.events.k8s.io", scope, true));
        rows.push(row(verb, "events", scope, true));
    }
    rows
}

/// What the controller must never be able to do anywhere (`scope`).
fn forbidden_rows(scope: &Scope) -> Vec<Row> {
    let mut rows = vec![
        row("list", "secrets", scope, false),
        row("watch", "secrets", scope, false),
        row("create", "secrets", scope, false),
        row("update", "secrets", scope, false),
        row("delete", "secrets", scope, false),
        row("get", "pods", scope, false),
        row("create", "pods", scope, false),
        row("list", "configmaps", scope, false),
        row("create", "deployments.apps", scope, false),
        row("list", "deployments.apps", scope, false),
        // Jobs are only read and unsuspended, never created or deleted.
        row("create", "jobs.batch", scope, false),
        row("delete", "jobs.batch", scope, false),
        row("create", "serviceaccounts", scope, false),
        row("create", "roles.rbac.authorization.k8s.io", scope, false),
        row(
            "create",
            "rolebindings.rbac.authorization.k8s.io",
            scope,
            false,
        ),
        row("delete", "events.events.k8s.io", scope, false),
        row("list", "events", scope, false),
    ];
    rows.push(Row {
        subresource: Some("token"),
        ..row("create", "serviceaccounts", scope, false)
    });
    rows
}

/// Cluster-scoped things the controller must never have.
fn cluster_forbidden_rows() -> Vec<Row> {
    let cluster = Scope::AllNamespaces;
    vec![
        row(
            "create",
            "customresourcedefinitions.apiextensions.k8s.io",
            &cluster,
            false,
        ),
        row(
            "update",
            "customresourcedefinitions.apiextensions.k8s.io",
            &cluster,
            false,
        ),
        row(
            "create",
            "clusterroles.rbac.authorization.k8s.io",
            &cluster,
            false,
        ),
        row(
            "create",
            "clusterrolebindings.rbac.authorization.k8s.io",
            &cluster,
            false,
        ),
        row("list", "nodes", &cluster, false),
        row("create", "namespaces", &cluster, false),
        row("impersonate", "users", &cluster, false),
        row("impersonate", "serviceaccounts", &cluster, false),
    ]
}

/// Asks every row with `kubectl auth can-i --as=<user>` and fails listing every row
/// whose answer is not the expected one.
async fn check_rows(user: &str, rows: &[Row]) {
    let mut wrong = Vec::new();
    for r in rows {
        let resource = match &r.name {
            Some(name) => format!("{}/{name}", r.resource),
            None => r.resource.to_string(),
        };
        let mut args = vec![
            "auth".to_string(),
            "can-i".into(),
            r.verb.into(),
            resource,
            format!("--as={user}"),
        ];
        if let Some(sub) = r.subresource {
            args.push(format!("--subresource={sub}"));
        }
        match &r.scope {
            Scope::Namespace(n) => {
                args.push("--namespace".into());
                args.push(n.clone());
            }
            Scope::AllNamespaces => args.push("--all-namespaces".into()),
        }
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = kubectl(&argv, None).await;
        let answer = text(&out.stdout).trim().to_string();
        // can-i exits 0 for yes, 1 for no; anything else is a broken question.
        let got = match (out.status.code(), answer.as_str()) {
            (Some(0), "yes") => true,
            (Some(1), "no") => false,
            _ => panic!(
                "kubectl {argv:?}: status {:?}, stdout {answer:?}, stderr {}",
                out.status,
                text(&out.stderr)
            ),
        };
        if got != r.want {
            wrong.push(format!(
                "  {} {}{} in {:?}{}: got {}, want {}",
                r.verb,
                r.resource,
                r.subresource.map(|s| format!("/{s}")).unwrap_or_default(),
                r.scope,
                r.name
                    .as_ref()
                    .map(|n| format!(" (name {n})"))
                    .unwrap_or_default(),
                if got { "yes" } else { "no" },
                if r.want { "yes" } else { "no" },
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} `kubectl auth can-i --as={user}` rows are wrong:\n{}",
        wrong.len(),
        rows.len(),
        wrong.join("\n")
    );
    eprintln!("{} can-i rows as {user}: all as expected", rows.len());
}

fn sa_user(namespace: &str, release: &str) -> String {
    format!("system:serviceaccount:{namespace}:{release}-lockwarden")
}

/// Fresh namespaces and the CRD from the chart; returns (client, namespaces).
async fn setup(prefixes: &[&str]) -> (Client, Vec<String>) {
    let plane = ControlPlane::shared();
    let client = plane.client().await;
    install_crd_from_chart(&client).await;
    let mut names = Vec::new();
    for p in prefixes {
        names.push(plane.namespace(&client, p).await);
    }
    (client, names)
}

/// Default values plus `rbac.secretNamespaces`: a ClusterRole for the controller,
/// Secrets readable (get only) exactly in the listed namespaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_wide_install_grants_exactly_what_the_controller_needs() {
    let (_client, nss) =
        setup(&["helm-cw-rel", "helm-cw-pay", "helm-cw-rep", "helm-cw-other"]).await;
    let (release_ns, pay, rep, other) = (&nss[0], &nss[1], &nss[2], &nss[3]);
    // Release names are cluster-wide here (ClusterRoles): unique per test.
    let release = unique("cw");
    let manifests = render(
        &release,
        release_ns,
        Some(&ci_values("secret-namespaces-values.yaml")),
        &[format!("rbac.secretNamespaces={{{pay},{rep}}}")],
    );
    apply(&manifests, "the cluster-wide chart").await;
    let user = sa_user(release_ns, &release);

    let mut rows = needed_rows(&Scope::AllNamespaces);
    rows.extend(needed_rows(&ns(other)));
    for secret_ns in [pay, rep] {
        rows.push(row("get", "secrets", &ns(secret_ns), true));
        rows.extend(forbidden_rows(&ns(secret_ns)));
    }
    // No Secret where no lock's credentials live, and never across namespaces.
    rows.push(row("get", "secrets", &ns(other), false));
    rows.push(row("get", "secrets", &ns(release_ns), false));
    rows.push(row("get", "secrets", &Scope::AllNamespaces, false));
    rows.extend(forbidden_rows(&ns(other)));
    rows.extend(forbidden_rows(&Scope::AllNamespaces));
    rows.extend(cluster_forbidden_rows());
    check_rows(&user, &rows).await;
}

/// `watchNamespace`: everything in that namespace only, plus the leader-election
/// Lease (by name) in the release namespace; nothing cluster-wide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_scoped_install_is_confined_to_its_namespace() {
    let (_client, nss) = setup(&["helm-ns-rel", "helm-ns-watch", "helm-ns-other"]).await;
    let (release_ns, watch, other) = (&nss[0], &nss[1], &nss[2]);
    let release = "scoped";
    let manifests = render(
        release,
        release_ns,
        Some(&ci_values("namespace-scoped-values.yaml")),
        &[format!("watchNamespace={watch}")],
    );
    let objs = objects(&manifests);
    assert!(of_kind(&objs, "ClusterRole").is_empty());
    apply(&manifests, "the namespace-scoped chart").await;
    let user = sa_user(release_ns, release);

    let mut rows = needed_rows(&ns(watch));
    rows.push(row("get", "secrets", &ns(watch), true));
    rows.extend(forbidden_rows(&ns(watch)));
    // Leader election in the release namespace: create, and only its own Lease.
    let leader = Some(format!("{release}-lockwarden-leader"));
    rows.push(row(
        "create",
        "leases.coordination.k8s.io",
        &ns(release_ns),
        true,
    ));
    for verb in ["get", "update", "patch"] {
        rows.push(Row {
            name: leader.clone(),
            ..row(verb, "leases.coordination.k8s.io", &ns(release_ns), true)
        });
        rows.push(Row {
            name: Some("someone-elses-lease".into()),
            ..row(verb, "leases.coordination.k8s.io", &ns(release_ns), false)
        });
    }
    rows.push(Row {
        name: leader.clone(),
        ..row(
            "delete",
            "leases.coordination.k8s.io",
            &ns(release_ns),
            false,
        )
    });
    rows.push(row(
        "list",
        "leases.coordination.k8s.io",
        &ns(release_ns),
        false,
    ));
    rows.push(row("get", "secrets", &ns(release_ns), false));
    rows.push(row(
        "list",
        "distributedlocks.lockwarden.io",
        &ns(release_ns),
        false,
    ));
    // Nothing in any other namespace, nothing across namespaces.
    for scope in [ns(other), Scope::AllNamespaces] {
        for verb in ["get", "list", "watch", "update", "patch"] {
            rows.push(row(verb, "distributedlocks.lockwarden.io", &scope, false));
            rows.push(row(verb, "jobs.batch", &scope, false));
            rows.push(row(verb, "leases.coordination.k8s.io", &scope, false));
        }
        rows.push(Row {
            subresource: Some("status"),
            ..row("patch", "distributedlocks.lockwarden.io", &scope, false)
        });
        rows.push(row("create", "events.events.k8s.io", &scope, false));
        rows.push(row("get", "secrets", &scope, false));
        rows.extend(forbidden_rows(&scope));
    }
    rows.extend(cluster_forbidden_rows());
    check_rows(&user, &rows).await;
}

/// Every ci values file (and the defaults) applies to the API server with
/// `kubectl apply --server-side`, in fresh namespaces; the ServiceMonitor against the
/// minimal CRD above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_values_file_applies_to_the_api_server() {
    let (client, _) = setup(&[]).await;
    install_servicemonitor_crd().await;
    let plane = ControlPlane::shared();
    let mut runs: Vec<Option<PathBuf>> = vec![None];
    runs.extend(ci_values_files().into_iter().map(Some));
    for values in runs {
        let release_ns = plane.namespace(&client, "helm-apply").await;
        let extra = plane.namespace(&client, "helm-apply-x").await;
        let extra2 = plane.namespace(&client, "helm-apply-y").await;
        let release = unique("ap");
        // Point every namespace a values file names at a fresh one.
        let mut sets = Vec::new();
        if values_names(&values, "watchNamespace") {
            sets.push(format!("watchNamespace={extra}"));
        }
        if values_names(&values, "secretNamespaces") {
            sets.push(format!("rbac.secretNamespaces={{{extra},{extra2}}}"));
        }
        let manifests = render(&release, &release_ns, values.as_deref(), &sets);
        apply(&manifests, &format!("values {values:?}")).await;
        // Read every rendered object back from the server.
        for obj in objects(&manifests) {
            let kind = obj["kind"].as_str().unwrap();
            let name = obj["metadata"]["name"].as_str().unwrap();
            let mut args = vec!["get", kind, name, "-o", "name"];
            if let Some(n) = obj["metadata"]["namespace"].as_str() {
                args.extend(["--namespace", n]);
            }
            let out = kubectl(&args, None).await;
            assert!(
                out.status.success(),
                "values {values:?}: {kind} {name} not on the server: {}",
                text(&out.stderr)
            );
        }
    }
}

fn values_names(values: &Option<PathBuf>, key: &str) -> bool {
    values
        .as_ref()
        .is_some_and(|v| std::fs::read_to_string(v).unwrap().contains(key))
}

/// The Deployment's pod template is admitted by the API server's PodSecurity
/// admission in a namespace enforcing "restricted"; the same pod without the chart's
/// securityContext is not (so the check is live).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_template_is_admitted_under_pod_security_restricted() {
    let (_client, nss) = setup(&["helm-psa"]).await;
    let namespace = &nss[0];
    let out = kubectl(
        &[
            "label",
            "namespace",
            namespace,
            "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/enforce-version=latest",
        ],
        None,
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));

    let objs = objects(&render("psa", namespace, None, &[]));
    let template = &one(&objs, "Deployment")["spec"]["template"];
    let pod = |spec: &Value| {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": "lockwarden-psa", "namespace": namespace,
                          "labels": template["metadata"]["labels"] },
            "spec": spec,
        })
        .to_string()
    };
    let dry_run = ["create", "--dry-run=server", "-f", "-"];
    let out = kubectl(&dry_run, Some(&pod(&template["spec"]))).await;
    assert!(
        out.status.success(),
        "the chart's pod is refused under restricted:\n{}",
        text(&out.stderr)
    );

    let mut loose = template["spec"].clone();
    loose["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("securityContext");
    loose.as_object_mut().unwrap().remove("securityContext");
    let out = kubectl(&dry_run, Some(&pod(&loose))).await;
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("violates PodSecurity"),
        "a pod without securityContext was not refused (is PodSecurity admission on?): {stderr}"
    );
}

/// `helm install` into a fresh cluster (an API server of this test's own, without the
/// CRD): helm installs the CRD from the chart's `crds/`, creates every object, prints
/// the NOTES; `helm uninstall` removes the objects and, as Helm does, keeps the CRD.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_into_a_fresh_cluster_installs_the_crd_and_prints_notes() {
    let plane = tokio::task::spawn_blocking(ControlPlane::start)
        .await
        .unwrap();
    let kubeconfig = plane.kubeconfig_path().display().to_string();
    let chart = chart_dir().display().to_string();
    let helm_on = move |args: Vec<String>| {
        let kubeconfig = kubeconfig.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
                all.extend(["--kubeconfig", &kubeconfig]);
                helm(&all)
            })
            .await
            .unwrap()
        }
    };
    let install = helm_on(
        [
            "install",
            "lockwarden",
            &chart,
            "--namespace",
            "lockwarden-system",
            "--create-namespace",
            "--set",
            "clusterName=fresh",
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    let stdout = text(&install.stdout);
    assert!(
        install.status.success(),
        "helm install failed:\n{stdout}\n{}",
        text(&install.stderr)
    );
    eprintln!("helm install printed:\n{stdout}");
    for want in [
        "STATUS: deployed",
        "Mode: cluster-wide",
        "Holder identities: fresh/<namespace>/<lock name>",
        "kubectl -n default wait --for=condition=Acquired dlock/db-migration",
    ] {
        assert!(stdout.contains(want), "NOTES lack {want:?}:\n{stdout}");
    }
    let crd = format!("crd/{}", lockwarden::api::CRD_NAME);
    let established = [
        "wait",
        "--for=condition=Established",
        "--timeout=90s",
        crd.as_str(),
    ];
    let out = kubectl_on(&plane, &established, None).await;
    assert!(
        out.status.success(),
        "helm did not install the CRD: {}",
        text(&out.stderr)
    );
    // The NOTES' example lock applies as printed.
    let example = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("echo '"))
        .and_then(|l| l.split_once('\'').map(|(yaml, _)| yaml.to_string()))
        .expect("NOTES show an example lock");
    let out = kubectl_on(
        &plane,
        &["-n", "default", "apply", "-f", "-"],
        Some(&example),
    )
    .await;
    assert!(
        out.status.success(),
        "the NOTES' example lock does not apply: {}",
        text(&out.stderr)
    );
    let out = kubectl_on(
        &plane,
        &[
            "get",
            "deploy/lockwarden",
            "-n",
            "lockwarden-system",
            "-o",
            "jsonpath={.spec.replicas}",
        ],
        None,
    )
    .await;
    assert_eq!(text(&out.stdout), "2", "{}", text(&out.stderr));
    // The CRD from the chart is the one the binary generates.
    let out = kubectl_on(&plane, &["get", crd.as_str(), "-o", "json"], None).await;
    let served: Value = serde_json::from_slice(&out.stdout).expect("CRD as JSON");
    let generated = serde_json::to_value(lockwarden::api::crd()).unwrap();
    assert_eq!(
        served["spec"]["versions"][0]["schema"],
        generated["spec"]["versions"][0]["schema"]
    );

    let uninstall = helm_on(
        [
            "uninstall",
            "lockwarden",
            "--namespace",
            "lockwarden-system",
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    assert!(uninstall.status.success(), "{}", text(&uninstall.stderr));
    let gone = kubectl_on(&plane, &["get", "clusterrole/lockwarden"], None).await;
    assert!(!gone.status.success(), "ClusterRole left after uninstall");
    let kept = kubectl_on(&plane, &["get", crd.as_str()], None).await;
    assert!(kept.status.success(), "helm uninstall deleted the CRD");
}

// ---------------------------------------------------------------------------
// The controller on the chart's RBAC alone

/// `lockwarden controller`'s command line: the rendered Deployment's `args` are
/// parsed by the binary's own option types.
#[derive(Parser, Debug)]
#[command(name = "lockwarden-controller")]
struct ControllerArgs {
    #[command(flatten)]
    global: lockwarden::cli::GlobalArgs,
    #[command(flatten)]
    config: ControllerConfig,
    #[command(flatten)]
    election: LeaderElectionArgs,
}

fn parse_deployment_args(manifests: &str) -> ControllerArgs {
    let objs = objects(manifests);
    let deployment = one(&objs, "Deployment");
    let args = args(deployment);
    let mut config = ControllerArgs::try_parse_from(
        std::iter::once("lockwarden-controller".to_string()).chain(args.clone()),
    )
    .unwrap_or_else(|e| panic!("the chart's args {args:?} are not accepted: {e}"));
    // In-process: no HTTP server on the pod's port.
    config.config.metrics_address = None;
    config
}

/// Controllers in this binary take turns: a cluster-wide one would also reconcile the
/// locks of another test running at the same time.
static CONTROLLER_TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Starts the controller as the chart's ServiceAccount (a client certificate for
/// `system:serviceaccount:NS:SA`: RBAC grants it exactly what the chart bound).
async fn start_controller_as(user: &str, args: ControllerArgs) -> tokio::task::JoinHandle<()> {
    let kubeconfig = ControlPlane::shared().user_kubeconfig(user, None);
    let client = client_from_kubeconfig(&kubeconfig).await;
    tokio::spawn(async move {
        if let Err(e) =
            lockwarden::controller::run_elected(client, args.config, args.election).await
        {
            panic!("controller with the chart's RBAC failed: {e}");
        }
    })
}

/// Waits for the Acquired condition to be `status` with `reason`; returns the lock.
async fn wait_acquired(
    client: &Client,
    namespace: &str,
    name: &str,
    status: &str,
    why: &str,
) -> DistributedLock {
    let locks = Api::<DistributedLock>::namespaced(client.clone(), namespace);
    eventually(
        &format!("{namespace}/{name}: Acquired={status} ({why})"),
        TIMEOUT,
        || async {
            let lock = locks.get(name).await.ok()?;
            let c = conditions::find_condition(&lock.status.as_ref()?.conditions, ACQUIRED)?;
            (c.status == status && c.reason == why).then_some(lock.clone())
        },
    )
    .await
}

async fn create(client: &Client, namespace: &str, lock: &DistributedLock) {
    Api::<DistributedLock>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), lock)
        .await
        .unwrap_or_else(|e| panic!("create {namespace}/{}: {e}", lock.name_any()));
}

/// Cluster-wide install: the controller, run with the chart's arguments and only its
/// RBAC, leader-elected, acquires a Lease lock anywhere and an S3 lock whose Secret is
/// in a `secretNamespaces` namespace; an S3 lock whose Secret is elsewhere fails
/// with the API server's "forbidden" in its condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_runs_cluster_wide_on_the_charts_rbac_alone() {
    let _turn = CONTROLLER_TURN.lock().await;
    let (client, nss) = setup(&["helm-run-rel", "helm-run-sec", "helm-run-other"]).await;
    let (release_ns, secret_ns, other) = (&nss[0], &nss[1], &nss[2]);
    let moto = tokio::task::spawn_blocking(support::moto::Moto::shared)
        .await
        .unwrap();
    let bucket = moto.new_bucket("helm").await;

    let release = unique("run");
    let manifests = render(
        &release,
        release_ns,
        Some(&ci_values("secret-namespaces-values.yaml")),
        &[
            format!("rbac.secretNamespaces={{{secret_ns}}}"),
            "clusterName=helm-test".into(),
        ],
    );
    apply(&manifests, "the cluster-wide chart").await;
    let args = parse_deployment_args(&manifests);
    assert!(args.election.leader_elect);
    assert_eq!(args.config.namespace, None);
    let lease_name = args.election.leader_election_lease.clone();
    let controller = start_controller_as(&sa_user(release_ns, &release), args).await;

    create(&client, other, &lease_lock("on-lease", "on-lease-lease")).await;
    let held = wait_acquired(&client, other, "on-lease", "True", reason::LEASE_HELD).await;
    assert_eq!(
        held.status.unwrap().holder.as_deref(),
        Some(format!("helm-test/{other}/on-lease").as_str())
    );
    // The election Lease is where the chart said.
    let leases =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), release_ns);
    assert!(
        leases.get(&lease_name).await.is_ok(),
        "no election Lease {lease_name}"
    );

    let readable = aws_secret(&client, secret_ns).await;
    create(
        &client,
        secret_ns,
        &s3_lock(
            "on-s3",
            &bucket,
            "locks/on-s3",
            moto.endpoint(),
            &readable.name,
        ),
    )
    .await;
    wait_acquired(&client, secret_ns, "on-s3", "True", reason::LEASE_HELD).await;

    let unreadable = aws_secret(&client, other).await;
    create(
        &client,
        other,
        &s3_lock(
            "on-s3",
            &bucket,
            "locks/on-s3",
            moto.endpoint(),
            &unreadable.name,
        ),
    )
    .await;
    let refused = wait_acquired(&client, other, "on-s3", "False", reason::BACKEND_ERROR).await;
    let message = conditions::find_condition(&refused.status.unwrap().conditions, ACQUIRED)
        .unwrap()
        .message
        .clone();
    assert!(
        message.contains("forbidden") && message.contains("aws"),
        "expected the Secret read to be forbidden, got {message:?}"
    );
    controller.abort();
}

/// Namespace-scoped install: the controller with `--watch-namespace` and only the
/// chart's Roles acquires a lock in its namespace, leader-elected in the release
/// namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_runs_namespace_scoped_on_the_charts_rbac_alone() {
    let _turn = CONTROLLER_TURN.lock().await;
    let (client, nss) = setup(&["helm-runns-rel", "helm-runns-watch"]).await;
    let (release_ns, watch) = (&nss[0], &nss[1]);
    let release = "scoped";
    let manifests = render(
        release,
        release_ns,
        Some(&ci_values("namespace-scoped-values.yaml")),
        &[format!("watchNamespace={watch}")],
    );
    apply(&manifests, "the namespace-scoped chart").await;
    let args = parse_deployment_args(&manifests);
    assert_eq!(args.config.namespace.as_deref(), Some(watch.as_str()));
    assert!(args.election.leader_elect);
    let controller = start_controller_as(&sa_user(release_ns, release), args).await;

    create(
        &client,
        watch,
        &lease_lock("scoped-lock", "scoped-lock-lease"),
    )
    .await;
    let held = wait_acquired(&client, watch, "scoped-lock", "True", reason::LEASE_HELD).await;
    assert_eq!(
        held.status.unwrap().holder.as_deref(),
        Some(format!("prod-eu-1/{watch}/scoped-lock").as_str())
    );
    // Released through the finalizer when deleted (patch + status on the chart's RBAC).
    Api::<DistributedLock>::namespaced(client.clone(), watch)
        .delete("scoped-lock", &Default::default())
        .await
        .unwrap();
    let locks = Api::<DistributedLock>::namespaced(client.clone(), watch);
    eventually("the lock to be released and gone", TIMEOUT, || async {
        match locks.get_opt("scoped-lock").await {
            Ok(None) => Some(()),
            _ => None,
        }
    })
    .await;
    controller.abort();
}

//! The Helm chart `charts/lockwarden` against the real tools and a real API server:
//! `helm lint` / `helm template` for the default values and every `ci/*.yaml`; the
//! rendered manifests applied with `kubectl apply --server-side`; the controller's
//! RBAC checked row by row with `kubectl auth can-i --as=<its ServiceAccount>`; the
//! Deployment's pod template admitted under Pod Security "restricted"; and the
//! controller itself run with nothing but the chart's RBAC (a client certificate for
//! the chart's ServiceAccount) and the chart's own arguments.
//!
//! The ServiceMonitor and PrometheusRule CRDs of the Prometheus Operator are not part
//! of the test API server: `install_servicemonitor_crd` installs minimal ones (group,
//! kind, an open schema), so the chart's ServiceMonitor and alerts are really applied,
//! not just dry-run; their fields are checked on the rendered objects (and the alerts
//! by promtool in tests/telemetry).

mod admission;
mod controller;
mod fencing;
mod guard;
mod install;
mod rbac;
mod render;
use lockwarden_testsupport as support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;
use std::time::Duration;

use clap::Parser;
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use lockwarden::api::DistributedLock;
use lockwarden::api::conditions::{self, ACQUIRED, reason};
use lockwarden::controller::{ControllerConfig, LeaderElectionArgs, OnLostLeadership};
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

/// The chart as release `lw` in `lockwarden-system`, its default values but `--set
/// SETS`.
fn render_lw(sets: &[&str]) -> String {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    render("lw", "lockwarden-system", None, &sets)
}

/// The chart with `ci/namespace-scoped-values.yaml`, watching `watch` only.
fn render_namespace_scoped(release: &str, namespace: &str, watch: &str) -> String {
    render(
        release,
        namespace,
        Some(&ci_values("namespace-scoped-values.yaml")),
        &[format!("watchNamespace={watch}")],
    )
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

/// Minimal stand-ins for the Prometheus Operator's ServiceMonitor and PrometheusRule
/// CRDs (same group, version, kind; an open schema), so the chart's ServiceMonitor and
/// alerts can be applied.
async fn install_servicemonitor_crd() {
    for (plural, kind) in [
        ("servicemonitors", "ServiceMonitor"),
        ("prometheusrules", "PrometheusRule"),
    ] {
        install_stand_in_crd("monitoring.coreos.com", "v1", plural, kind).await;
    }
}

/// A minimal stand-in for Kueue's Workload CRD (same group, version, kind; an open
/// schema): `kubectl auth can-i` resolves only resources the API server serves.
async fn install_kueue_workload_crd() {
    install_stand_in_crd("kueue.x-k8s.io", "v1beta2", "workloads", "Workload").await;
}

/// A namespaced CRD of `group`/`version`/`kind` with an open schema, Established.
async fn install_stand_in_crd(group: &str, version: &str, plural: &str, kind: &str) {
    let name = format!("{plural}.{group}");
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": name },
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": { "plural": plural, "singular": kind.to_lowercase(),
                       "kind": kind, "listKind": format!("{kind}List") },
            "versions": [{
                "name": version, "served": true, "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": true,
                }},
            }],
        },
    });
    apply(&crd.to_string(), &format!("the {kind} CRD")).await;
    let crd_ref = format!("crd/{name}");
    let out = kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=90s",
            &crd_ref,
        ],
        None,
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
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

/// Waits (at most `within`) until the ValidatingAdmissionPolicy `name` has type-checked
/// its CEL as it stands (its status caught up with its generation); fails on any
/// type-checking warning.
async fn type_checked_without_warnings(client: &Client, name: &str, within: Duration) {
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    eventually(&format!("type checking of {name}"), within, || async {
        let policy = policies.get(name).await.ok()?;
        let status = policy.status?;
        (status.observed_generation == policy.metadata.generation).then_some(())?;
        let warnings = status
            .type_checking?
            .expression_warnings
            .unwrap_or_default();
        assert!(
            warnings.is_empty(),
            "{name}: type-checking warnings: {warnings:?}"
        );
        Some(())
    })
    .await;
}

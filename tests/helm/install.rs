//! Rendered manifests applied to the API server: every values file, Pod Security
//! `restricted`, and `helm install` into a fresh cluster.

use super::*;

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
        same_numbers(served["spec"]["versions"][0]["schema"].clone()),
        same_numbers(generated["spec"]["versions"][0]["schema"].clone())
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

/// JSON numbers as the API server keeps them: the schema generator writes integer
/// bounds as floats (`minimum: 1.0`), which the server stores as `1`; the same value.
fn same_numbers(v: Value) -> Value {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
            _ => Value::Number(n),
        },
        Value::Array(items) => Value::Array(items.into_iter().map(same_numbers).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, same_numbers(v))).collect())
        }
        other => other,
    }
}

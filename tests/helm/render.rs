//! `helm lint` and `helm template`: the chart's CRDs, default and non-default values,
//! and values it must refuse.

use super::*;

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
    let cases: [(&[&str], &str); 8] = [
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
        (
            &["kueue.admissionCheck=true", "watchNamespace=team-a"],
            "kueue.admissionCheck needs the cluster-wide mode",
        ),
        (&["replicas=3"], "replicas"),
        (&["requestsInFlight.store=0"], "requestsInFlight/store"),
        (
            &["requestsInFlight.reconciles=0"],
            "requestsInFlight/reconciles",
        ),
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
    // Unset bounds leave the binary's defaults, so that an older image (the upgrade
    // tests' previous release) is not handed flags it does not know.
    assert!(
        !args.iter().any(|a| a.contains("-requests-in-flight")),
        "{args:?}"
    );
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

/// The chart's objects as release `lw` in `lockwarden-system`, with `ci/VALUES`.
fn objects_with(values: &str) -> Vec<Value> {
    objects(&render(
        "lw",
        "lockwarden-system",
        Some(&ci_values(values)),
        &[],
    ))
}

#[test]
fn non_default_values_render_what_they_say() {
    // Namespace-scoped: --watch-namespace, Roles only (no ClusterRole at all with the
    // aggregated user roles off), leader election in the release namespace.
    let objs = objects_with("namespace-scoped-values.yaml");
    let deployment = one(&objs, "Deployment");
    assert!(args(deployment).contains(&"--watch-namespace=team-locks".to_string()));
    assert!(args(deployment).contains(&"--cluster-name=prod-eu-1".to_string()));
    assert!(args(deployment).contains(&"--store-requests-in-flight=256".to_string()));
    assert!(args(deployment).contains(&"--reconciles-in-flight=1024".to_string()));
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
    let objs = objects_with("single-replica-values.yaml");
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

    // Kueue: both flags, and the AdmissionCheck controller's rules (read checks,
    // ClusterQueues and our parameters; write only check and Workload status and
    // Workload metadata). Without the value, no rule names them but `list workloads`.
    let objs = objects_with("kueue-values.yaml");
    let deployment = one(&objs, "Deployment");
    for flag in [
        "--kueue-admission-check",
        "--kueue-manages-jobs-without-queue-name",
    ] {
        assert!(args(deployment).contains(&flag.to_string()), "{flag}");
    }
    // The controller's ClusterRole (the chart has others, e.g. for its admission rules).
    let controller_rules = |objs: &[Value]| {
        of_kind(objs, "ClusterRole")
            .into_iter()
            .map(|r| r["rules"].to_string())
            .find(|r| r.contains("distributedlocks/status"))
            .expect("the controller's ClusterRole")
    };
    let rules = controller_rules(&objs);
    for resource in [
        "admissionchecks/status",
        "workloads/status",
        "lockadmissionconfigs",
    ] {
        assert!(rules.contains(resource), "no rule for {resource}: {rules}");
    }
    assert_no_wildcards_or_secrets_beyond_get(&objs);
    let default = objects(&render("lw", "lockwarden-system", None, &[]));
    let rules = controller_rules(&default);
    assert!(!rules.contains("admissionchecks"), "{rules}");
    assert!(
        !args(one(&default, "Deployment"))
            .iter()
            .any(|a| a.starts_with("--kueue"))
    );

    // ServiceMonitor and PDB.
    let objs = objects_with("servicemonitor-values.yaml");
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
    // The alerts and the dashboard (tests/telemetry evaluates and checks them).
    let rule = one(&objs, "PrometheusRule");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["metadata"]["labels"]["release"], "prometheus");
    let dashboard = one(&objs, "ConfigMap");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");

    // Secrets: a get-only Role in each listed namespace, nothing else.
    let objs = objects_with("secret-namespaces-values.yaml");
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

/// The guard's report (templates/guard-report.yaml) comes with the guard injection, and
/// only with it: the ClusterRole users bind to their workloads' ServiceAccounts
/// (`patch` on Pods, and the `report` marker the policy asks the authorizer about), the
/// policy confining it on every Pod update (pods/status too) and refusing it at a Pod's
/// creation and binding, the policy refusing it in a Job's pod template, both bound
/// everywhere, and the controller told to trust reports — by an environment variable,
/// which an older image (the upgrade tests run the previous release's) ignores where it
/// would refuse an unknown flag.
#[test]
fn guard_report_renders_with_the_guard_injection_only() {
    const NAME: &str = "lw-lockwarden-guard-report";
    const JOBS: &str = "lw-lockwarden-guard-report-jobs";
    let report = |objs: &[Value]| -> Vec<String> {
        let mut kinds: Vec<String> = objs
            .iter()
            .filter(|o| o["metadata"]["name"] == NAME || o["metadata"]["name"] == JOBS)
            .map(|o| {
                let (kind, name) = (&o["kind"], &o["metadata"]["name"]);
                format!("{} {}", kind.as_str().unwrap(), name.as_str().unwrap())
            })
            .collect();
        kinds.sort();
        kinds
    };
    let trust = |objs: &[Value]| -> Vec<Value> {
        container(one(objs, "Deployment"))["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "LOCKWARDEN_TRUST_GUARD_REPORTS")
            .cloned()
            .collect()
    };
    let named = |objs: &[Value], kind: &str, name: &str| -> Value {
        objs.iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
            .clone()
    };

    // Default, and with the injection limited to some namespaces: the report is
    // confined everywhere, since the controller trusts it on any workload's Pod.
    for sets in [
        &[][..],
        &["guard.injection.namespaceSelector.matchLabels.team=a"][..],
    ] {
        let objs = objects(&render_lw(sets));
        assert_eq!(
            report(&objs),
            [
                format!("ClusterRole {NAME}"),
                format!("ValidatingAdmissionPolicy {NAME}"),
                format!("ValidatingAdmissionPolicy {JOBS}"),
                format!("ValidatingAdmissionPolicyBinding {NAME}"),
                format!("ValidatingAdmissionPolicyBinding {JOBS}"),
            ],
            "{sets:?}"
        );
        let role = named(&objs, "ClusterRole", NAME);
        assert_eq!(
            role["rules"],
            json!([
                { "apiGroups": [""], "resources": ["pods"], "verbs": ["patch"] },
                { "apiGroups": ["lockwarden.io"], "resources": ["guardreports"],
                  "verbs": ["report"] },
            ])
        );
        assert_eq!(
            role["metadata"]["labels"]["app.kubernetes.io/instance"],
            "lw"
        );
        let policy = named(&objs, "ValidatingAdmissionPolicy", NAME);
        assert_eq!(policy["spec"]["failurePolicy"], "Fail");
        assert_eq!(
            policy["spec"]["matchConstraints"]["resourceRules"],
            json!([
                { "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods", "pods/status"],
                  "operations": ["UPDATE"] },
                { "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods", "pods/binding"],
                  "operations": ["CREATE"] },
            ]),
            "Pods and their status (which keeps metadata changes) updated, Pods created or bound"
        );
        let cel = policy["spec"].to_string();
        assert!(
            cel.contains("authorizer.group('lockwarden.io').resource('guardreports')"),
            "{cel}"
        );
        assert!(
            cel.contains("authentication.kubernetes.io/pod-uid"),
            "{cel}"
        );
        let jobs = named(&objs, "ValidatingAdmissionPolicy", JOBS);
        assert_eq!(jobs["spec"]["failurePolicy"], "Fail");
        assert_eq!(
            jobs["spec"]["matchConstraints"]["resourceRules"],
            json!([{ "apiGroups": ["batch"], "apiVersions": ["v1"], "resources": ["jobs"],
                     "operations": ["CREATE", "UPDATE"] }]),
            "Jobs written, for their pod template"
        );
        for name in [NAME, JOBS] {
            let binding = named(&objs, "ValidatingAdmissionPolicyBinding", name);
            assert_eq!(binding["spec"]["policyName"], name);
            assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
            assert!(binding["spec"]["matchResources"].is_null(), "{binding}");
        }
        assert_eq!(
            trust(&objs),
            [json!({ "name": "LOCKWARDEN_TRUST_GUARD_REPORTS", "value": "true" })]
        );
        assert!(
            !args(one(&objs, "Deployment"))
                .iter()
                .any(|a| a.contains("trust-guard-reports")),
            "the variable, not the flag"
        );
    }

    // Without the injection, or without its API (before 1.36), or in namespace-scoped
    // mode, or turned off: neither the policy nor the trust.
    let chart = chart_dir();
    let before_1_36 = helm(&[
        "template",
        "lw",
        chart.to_str().unwrap(),
        "--kube-version",
        "v1.35.0",
    ]);
    assert!(
        before_1_36.status.success(),
        "{}",
        text(&before_1_36.stderr)
    );
    for (what, rendered) in [
        (
            "guard.injection.enabled=false",
            render_lw(&["guard.injection.enabled=false"]),
        ),
        (
            "guard.reports.enabled=false",
            render_lw(&["guard.reports.enabled=false"]),
        ),
        (
            "namespace-scoped",
            render_namespace_scoped("lw", "lockwarden-system", "apps"),
        ),
        ("Kubernetes 1.35", text(&before_1_36.stdout)),
    ] {
        let objs = objects(&rendered);
        assert!(report(&objs).is_empty(), "{what}: {:?}", report(&objs));
        assert!(trust(&objs).is_empty(), "{what}");
    }
    // Turned off alone, the injection stays.
    let objs = objects(&render_lw(&["guard.reports.enabled=false"]));
    assert_eq!(of_kind(&objs, "MutatingAdmissionPolicy").len(), 2);
}

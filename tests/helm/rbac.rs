//! The rendered RBAC, checked row by row with `kubectl auth can-i --as=<the controller's
//! ServiceAccount>`, cluster-wide and namespace-scoped.

use super::*;

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
    // Jobs are gated (read, unsuspended) and, once per run, deleted unrun when their
    // run is already completed elsewhere (docs/guide/once.md).
    for verb in ["get", "list", "watch", "update", "patch", "delete"] {
        rows.push(row(verb, "jobs.batch", scope, true));
    }
    rows.push(Row {
        subresource: Some("finalizers"),
        ..row("update", "jobs.batch", scope, true)
    });
    // Whether Kueue admits a Job (a Workload names it): listed, never written.
    rows.push(row("list", "workloads.kueue.x-k8s.io", scope, true));
    rows.push(row("patch", "workloads.kueue.x-k8s.io", scope, false));
    // Pod gating: gated Pods are watched, patched (fence in, gate out) and deleted
    // after a loss; a claimant Pod is looked up by name.
    for verb in ["get", "list", "watch", "patch", "delete"] {
        rows.push(row(verb, "pods", scope, true));
    }
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
        // Pods are only gated: never created or replaced, their status never written,
        // never exec'd into.
        row("create", "pods", scope, false),
        row("update", "pods", scope, false),
        row("deletecollection", "pods", scope, false),
        row("list", "configmaps", scope, false),
        row("create", "deployments.apps", scope, false),
        row("list", "deployments.apps", scope, false),
        // Jobs are never created (deleted only once per run, see above).
        row("create", "jobs.batch", scope, false),
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
    // Subresources: (verb, resource, subresource).
    for (verb, resource, subresource) in [
        ("create", "serviceaccounts", "token"),
        ("patch", "pods", "status"),
        ("create", "pods", "exec"),
        ("update", "pods", "finalizers"),
    ] {
        rows.push(Row {
            subresource: Some(subresource),
            ..row(verb, resource, scope, false)
        });
    }
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

/// Default values plus `rbac.secretNamespaces`: a ClusterRole for the controller,
/// Secrets readable (get only) exactly in the listed namespaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_wide_install_grants_exactly_what_the_controller_needs() {
    let (_client, nss) =
        setup(&["helm-cw-rel", "helm-cw-pay", "helm-cw-rep", "helm-cw-other"]).await;
    install_kueue_workload_crd().await;
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
    // The start-up CRD revision check: this one CRD, read only.
    let crd = |verb, name: &str, want| Row {
        name: Some(name.to_string()),
        ..row(
            verb,
            "customresourcedefinitions.apiextensions.k8s.io",
            &Scope::AllNamespaces,
            want,
        )
    };
    rows.push(crd("get", "distributedlocks.lockwarden.io", true));
    // A gated workload's queue priority from its PriorityClass: read only.
    rows.push(row(
        "get",
        "priorityclasses.scheduling.k8s.io",
        &Scope::AllNamespaces,
        true,
    ));
    rows.push(row(
        "update",
        "priorityclasses.scheduling.k8s.io",
        &Scope::AllNamespaces,
        false,
    ));
    rows.push(crd("get", "jobs.batch.example.com", false));
    rows.push(crd("update", "distributedlocks.lockwarden.io", false));
    rows.push(crd("delete", "distributedlocks.lockwarden.io", false));
    check_rows(&user, &rows).await;
}

/// `watchNamespace`: everything in that namespace only, plus the leader-election
/// Lease (by name) in the release namespace; nothing cluster-wide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_scoped_install_is_confined_to_its_namespace() {
    let (_client, nss) = setup(&["helm-ns-rel", "helm-ns-watch", "helm-ns-other"]).await;
    install_kueue_workload_crd().await;
    let (release_ns, watch, other) = (&nss[0], &nss[1], &nss[2]);
    let release = "scoped";
    let manifests = render_namespace_scoped(release, release_ns, watch);
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
            rows.push(row(verb, "pods", &scope, false));
            rows.push(row(verb, "leases.coordination.k8s.io", &scope, false));
        }
        rows.push(row("delete", "pods", &scope, false));
        rows.push(row("delete", "jobs.batch", &scope, false));
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

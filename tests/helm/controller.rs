//! The controller run with the chart's arguments and only the chart's RBAC.

use super::*;

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
    let mut election = args.election;
    // The chart's 15s claim, renewed 5s before it runs out, is what a Deployment gets;
    // in this binary the renewals share two cores with helm, kubectl and the API
    // server, and a missed one would stop the controller mid-test. The chart's value
    // is checked on the rendered args before this.
    assert_eq!(
        election.leader_election_lease_duration,
        Duration::from_secs(15)
    );
    election.leader_election_lease_duration = Duration::from_secs(60);
    tokio::spawn(async move {
        // Not `run_elected`: losing leadership would exit this whole test binary.
        if let Err(e) = lockwarden::controller::run_elected_with(
            client,
            args.config,
            election,
            OnLostLeadership::Return,
        )
        .await
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

/// Pod gating on the chart's RBAC: a gated Pod with a per-Pod lock (created from a
/// template) is ungated with its lock's fence, and deleted once that lock is lost.
async fn gated_pod_runs_and_stops(client: &Client, namespace: &str) {
    use k8s_openapi::api::core::v1::Pod;
    use lockwarden::controller::gating::{FENCE_ANNOTATION, TEMPLATE_ANNOTATION};
    use lockwarden::controller::pods::has_gate;
    let mut template = lease_lock("pod-template", "pod-key");
    template.spec.release = true;
    create(client, namespace, &template).await;
    let pods = Api::<Pod>::namespaced(client.clone(), namespace);
    let pod = support::kube::gated_pod(
        "gated",
        &[(TEMPLATE_ANNOTATION, "pod-template")],
        true,
        true,
    );
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let pod = eventually("the gated Pod to be ungated", TIMEOUT, || async {
        let pod = pods.get("gated").await.ok()?;
        (!has_gate(&pod) && pod.annotations().contains_key(FENCE_ANNOTATION)).then_some(pod)
    })
    .await;
    let mut forcer = lease_lock("pod-forcer", "pod-key");
    forcer.spec.force = true;
    create(client, namespace, &forcer).await;
    let uid = pod.uid();
    eventually(
        "the Pod deleted after its lock was lost",
        TIMEOUT,
        || async {
            let now = pods.get_opt("gated").await.ok()?;
            (now.is_none_or(|p| p.uid() != uid)).then_some(())
        },
    )
    .await;
}

/// Cluster-wide install: the controller, run with the chart's arguments and only its
/// RBAC, leader-elected, acquires a Lease lock anywhere and an S3 lock whose Secret is
/// in a `secretNamespaces` namespace; an S3 lock whose Secret is elsewhere fails
/// with the API server's "forbidden" in its condition; it gates a Pod.
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
    gated_pod_runs_and_stops(&client, other).await;
    controller.abort();
}

/// Namespace-scoped install: the controller with `--watch-namespace` and only the
/// chart's Roles acquires a lock in its namespace, leader-elected in the release
/// namespace, and gates a Pod there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_runs_namespace_scoped_on_the_charts_rbac_alone() {
    let _turn = CONTROLLER_TURN.lock().await;
    let (client, nss) = setup(&["helm-runns-rel", "helm-runns-watch"]).await;
    let (release_ns, watch) = (&nss[0], &nss[1]);
    let release = "scoped";
    let manifests = render_namespace_scoped(release, release_ns, watch);
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
    gated_pod_runs_and_stops(&client, watch).await;
    controller.abort();
}

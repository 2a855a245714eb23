//! Smoke tests of the Kubernetes test control plane (`support::kube`): the API server
//! is a real kube-apiserver of the pinned version, serving CRDs, RBAC and kubectl.

use lockwarden_testsupport as support;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenReview};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, ObjectMeta, Patch, PatchParams,
    PostParams,
};
use serde_json::json;
use std::time::Duration;
use support::kube::{ControlPlane, client_from_kubeconfig};
use support::{eventually, tool, unique};

/// Generous: the test machine is a loaded 2-core box.
const TIMEOUT: Duration = Duration::from_secs(60);

/// The number a version component starts with: `36` for `36`, `36+` or `36-rc.1`.
fn leading_number(component: &str) -> u32 {
    let digits: String = component.chars().take_while(char::is_ascii_digit).collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("bad version component {component:?}"))
}

/// `(major, minor)` from `v1.36.3` or `Kubernetes v1.36.3`.
fn major_minor(version: &str) -> (u32, u32) {
    let v = version
        .trim()
        .rsplit(' ')
        .next()
        .unwrap_or_default()
        .trim_start_matches('v');
    let mut parts = v.split('.');
    let mut next = || leading_number(parts.next().unwrap_or_default());
    (next(), next())
}

/// Whether `result` is an API error with HTTP status `code`.
fn is_api_error<T>(result: &Result<T, kube::Error>, code: u16) -> bool {
    matches!(result, Err(kube::Error::Api(status)) if status.code == code)
}

#[test]
fn kube_apiserver_binary_is_v1_36_or_newer() {
    let out = std::process::Command::new(tool("KUBE_APISERVER"))
        .arg("--version")
        .output()
        .expect("run kube-apiserver --version");
    assert!(
        out.status.success(),
        "kube-apiserver --version failed: {out:?}"
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("Kubernetes v"),
        "unexpected --version output {text:?}"
    );
    let (major, minor) = major_minor(&text);
    assert!(
        (major, minor) >= (1, 36),
        "kube-apiserver is {text:?}, need v1.36 or newer"
    );
}

/// The shared control plane, an admin client of it, and a new namespace `prefix-…`.
async fn plane_with_namespace(prefix: &str) -> (&'static ControlPlane, kube::Client, String) {
    let plane = ControlPlane::shared();
    let client = plane.client().await;
    let namespace = plane.namespace(&client, prefix).await;
    (plane, client, namespace)
}

#[tokio::test]
async fn running_server_reports_v1_36_or_newer() {
    let client = ControlPlane::shared().client().await;
    let info = client.apiserver_version().await.expect("GET /version");
    let (major, minor) = (leading_number(&info.major), leading_number(&info.minor));
    assert!(
        (major, minor) >= (1, 36),
        "server is {}, need v1.36 or newer",
        info.git_version
    );
}

#[tokio::test]
async fn custom_resource_round_trips_through_the_api_server() {
    let plane = ControlPlane::shared();
    let client = plane.client().await;

    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": "widgets.smoke.lockwarden.io" },
        "spec": {
            "group": "smoke.lockwarden.io",
            "scope": "Namespaced",
            "names": { "plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList" },
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": { "spec": {
                        "type": "object",
                        "required": ["size"],
                        "properties": {
                            "size": { "type": "integer", "minimum": 1 },
                            "color": { "type": "string" },
                        },
                    }},
                }},
            }],
        },
    }))
    .expect("valid CRD");
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    crds.patch(
        "widgets.smoke.lockwarden.io",
        &PatchParams::apply("lockwarden-smoke").force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("apply CRD");
    eventually("the Widget CRD to be Established", TIMEOUT, || async {
        let crd = crds.get("widgets.smoke.lockwarden.io").await.ok()?;
        let conditions = crd.status?.conditions?;
        conditions
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
            .then_some(())
    })
    .await;

    let namespace = plane.namespace(&client, "smoke-crd").await;
    let gvk = GroupVersionKind::gvk("smoke.lockwarden.io", "v1", "Widget");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "widgets");
    let widgets = Api::<DynamicObject>::namespaced_with(client.clone(), &namespace, &resource);

    let widget = DynamicObject::new("w1", &resource)
        .within(&namespace)
        .data(json!({
            // `notInSchema` must be pruned by the server (structural schema).
            "spec": { "size": 3, "color": "blue", "notInSchema": true },
        }));
    widgets
        .create(&PostParams::default(), &widget)
        .await
        .expect("create Widget");

    let read = widgets.get("w1").await.expect("read Widget back");
    assert_eq!(read.data["spec"]["size"], json!(3));
    assert_eq!(read.data["spec"]["color"], json!("blue"));
    assert!(
        read.data["spec"].get("notInSchema").is_none(),
        "unknown field not pruned: {read:?}"
    );
    assert_eq!(read.metadata.namespace.as_deref(), Some(namespace.as_str()));
    // Server-populated metadata: this went through a real API server and etcd.
    assert!(read.metadata.uid.is_some(), "no uid: {read:?}");
    assert!(
        read.metadata.resource_version.is_some(),
        "no resourceVersion: {read:?}"
    );
    assert!(
        read.metadata.creation_timestamp.is_some(),
        "no creationTimestamp: {read:?}"
    );

    let listed = widgets
        .list(&ListParams::default())
        .await
        .expect("list Widgets");
    let names: Vec<_> = listed
        .items
        .iter()
        .filter_map(|w| w.metadata.name.clone())
        .collect();
    assert_eq!(names, ["w1"]);

    // The CRD's schema is enforced: size must be an integer >= 1.
    let invalid = DynamicObject::new("w2", &resource)
        .within(&namespace)
        .data(json!({ "spec": { "size": 0 } }));
    let rejected = widgets.create(&PostParams::default(), &invalid).await;
    assert!(
        is_api_error(&rejected, 422),
        "expected 422 Invalid, got {rejected:?}"
    );
}

#[tokio::test]
async fn kubectl_lists_namespaces() {
    let (plane, _, namespace) = plane_with_namespace("smoke-kubectl").await;

    let out = support::kubectl::kubectl_on(plane, &["get", "namespaces", "-o", "name"], None).await;
    let stdout = support::kubectl::stdout_ok(&out, "get namespaces");
    let names: Vec<&str> = stdout.lines().collect();
    assert!(
        names.contains(&"namespace/default"),
        "no default namespace in {names:?}"
    );
    assert!(
        names.contains(&format!("namespace/{namespace}").as_str()),
        "{namespace} missing in {names:?}"
    );
}

#[tokio::test]
async fn pods_can_be_created_without_a_controller_manager() {
    // Proves the admission configuration: with the ServiceAccount plugin on, this is
    // rejected because no token controller creates the `default` ServiceAccount.
    let (_, client, namespace) = plane_with_namespace("smoke-pod").await;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "p1" },
        "spec": { "containers": [{ "name": "c", "image": "registry.invalid/none:1" }] },
    }))
    .expect("valid Pod");
    let created = Api::<Pod>::namespaced(client, &namespace)
        .create(&PostParams::default(), &pod)
        .await
        .expect("create Pod");
    assert!(created.metadata.uid.is_some());
}

#[tokio::test]
async fn rbac_is_enforced_for_non_admin_users() {
    let (plane, admin, namespace) = plane_with_namespace("smoke-rbac").await;
    let user = unique("smoke-user");
    let user_client = client_from_kubeconfig(&plane.user_kubeconfig(&user, None)).await;
    let config_maps = Api::<ConfigMap>::namespaced(user_client, &namespace);

    let denied = config_maps.list(&ListParams::default()).await;
    assert!(
        is_api_error(&denied, 403),
        "expected 403 Forbidden, got {denied:?}"
    );

    let role = Role {
        metadata: ObjectMeta {
            name: Some("read-config-maps".into()),
            ..Default::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            verbs: vec!["list".into()],
            ..Default::default()
        }]),
    };
    Api::<Role>::namespaced(admin.clone(), &namespace)
        .create(&PostParams::default(), &role)
        .await
        .expect("create Role");
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some("read-config-maps".into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "read-config-maps".into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: user.clone(),
            namespace: None,
        }]),
    };
    Api::<RoleBinding>::namespaced(admin, &namespace)
        .create(&PostParams::default(), &binding)
        .await
        .expect("create RoleBinding");

    // The RBAC authorizer reads bindings from an informer cache, so allow it to catch up.
    eventually(
        "the RoleBinding to allow listing ConfigMaps",
        TIMEOUT,
        || async { config_maps.list(&ListParams::default()).await.ok() },
    )
    .await;
}

#[tokio::test]
async fn service_account_tokens_are_issued_and_verified() {
    // Proves the service-account signing and verification keys are wired up: the
    // server issues a token (TokenRequest) and then accepts it (TokenReview).
    let (_, client, namespace) = plane_with_namespace("smoke-sa").await;
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), &namespace);
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("robot".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    accounts
        .create(&PostParams::default(), &account)
        .await
        .expect("create ServiceAccount");

    let issued = accounts
        .create_token_request("robot", &PostParams::default(), &TokenRequest::default())
        .await
        .expect("TokenRequest");
    let token = issued.status.expect("TokenRequest status").token;

    let review: TokenReview =
        serde_json::from_value(json!({ "spec": { "token": token } })).expect("valid TokenReview");
    let reviewed = Api::<TokenReview>::all(client)
        .create(&PostParams::default(), &review)
        .await
        .expect("TokenReview");
    let status = reviewed.status.expect("TokenReview status");
    assert_eq!(
        status.authenticated,
        Some(true),
        "token rejected: {status:?}"
    );
    let user = status.user.expect("authenticated user").username;
    assert_eq!(
        user,
        Some(format!("system:serviceaccount:{namespace}:robot"))
    );
}

#[tokio::test]
async fn a_second_control_plane_is_independent_and_stops_on_drop() {
    let shared = ControlPlane::shared();
    let second = ControlPlane::start();
    assert_ne!(shared.url(), second.url());

    let second_client = second.client().await;
    let namespace = second.namespace(&second_client, "smoke-second").await;
    Api::<Namespace>::all(second_client)
        .get(&namespace)
        .await
        .expect("namespace exists in the cluster that created it");
    let in_shared = Api::<Namespace>::all(shared.client().await)
        .get(&namespace)
        .await;
    assert!(
        is_api_error(&in_shared, 404),
        "expected 404 in the other cluster, got {in_shared:?}"
    );

    // Drop kills and reaps both processes, so the port is closed right after.
    let port = second.port();
    drop(second);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the dropped API server still accepts connections on {port}"
    );
}

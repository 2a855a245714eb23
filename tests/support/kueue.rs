//! Kueue (sigs.k8s.io/kueue, `KUEUE` from `scripts/testenv`) against a real control
//! plane: its CRDs and webhook configurations installed, its manager a child process on
//! loopback, every webhook and conversion call from the API server going to
//! `https://127.0.0.1:<port>` (there is no Service routing, no cert-manager).
//!
//! `Kueue::shared()` starts one per test binary against `Node::shared().plane()` (so the
//! Jobs it admits really run on the node); `Kueue::start(plane)` starts one against any
//! control plane. Either may run at most once per API server: the CRDs and the
//! cluster-scoped webhook configurations (`kueue-mutating-webhook-configuration`,
//! `kueue-validating-webhook-configuration`, the names Kueue's release manifests give
//! them) are the cluster's, and a second Kueue would take them over.
//!
//! Certificates: a CA made here (rcgen, as `kube.rs` does for the API server; its own
//! `Pki` cannot sign a serving certificate and is private to it) signs a serving
//! certificate for IP 127.0.0.1, the only address the API server dials. The CA is every
//! `caBundle`.
//!
//! The configuration (`config.kueue.x-k8s.io/v1beta2`, the version v0.17 serves; its
//! default is `config/components/manager/controller_manager_config.yaml`), and why:
//! - `internalCertManagement.enable: false`: Kueue's own rotator would make a
//!   certificate for `kueue-webhook-service.<namespace>.svc` and write the CA into the
//!   CRDs and webhook configurations, which name 127.0.0.1 here;
//! - `webhook`: host 127.0.0.1, a free port, `certDir` holding the harness's `tls.crt` /
//!   `tls.key`;
//! - `metrics.bindAddress` and `health.healthProbeBindAddress`: 127.0.0.1 on free ports
//!   (defaults `:8443`/`:8081` would listen on every address and clash between
//!   binaries); `/readyz` on the health port is ready once the webhook server listens;
//! - `leaderElection.leaderElect: false`: one manager per API server, nothing to elect;
//! - `integrations.frameworks: ["batch/job"]`: the tests queue Jobs only. Kueue still
//!   answers the webhook paths of the other frameworks (no-op webhooks), so the
//!   configurations from its manifests can be installed whole;
//! - `featureGates: {VisibilityOnDemand: false}`: that (beta, on by default) feature
//!   serves an aggregated API on its own port (8082) that the API server would reach
//!   through a Service (APIService); nothing here uses it. v0.17 takes feature gates
//!   in the configuration or as `--feature-gates`, not both: the configuration has them;
//! - `manageJobsWithoutQueueName: false` (the default, written out): only Jobs labelled
//!   `kueue.x-k8s.io/queue-name` are Kueue's, so the node's other Pods and Jobs in
//!   the same cluster are left alone.
//!
//! One thing the configuration cannot move: with `internalCertManagement` off, v0.17's
//! `cmd/kueue` loads the metrics server's certificate from the hard-coded
//! `/etc/kueue/metrics/certs/tls.{crt,key}` and exits if it is missing. The manager
//! therefore runs in a mount namespace of its own (`unshare --mount`) where a read-only
//! overlay puts the harness's certificate at that path over `/etc`; the host's `/etc`
//! is not touched. (As root, which the node needs anyway; otherwise in a user namespace
//! mapping the caller to root.)
//!
//! The CRDs are Kueue's bases with the conversion webhooks its kustomization enables
//! (`scripts/testenv` merges them in: ClusterQueue, Cohort, LocalQueue, MultiKueueCluster,
//! Workload, at `/convert`); their `clientConfig` is rewritten to a URL here. The
//! webhook configurations' `clientConfig.service` becomes `url:
//! https://127.0.0.1:<port><service.path>`. Kueue is ready when its `/readyz` answers
//! 200, a dry-run create of a ResourceFlavor passes its validating webhook (with
//! `failurePolicy: Fail`, an unreachable webhook fails the create) and a dry-run create
//! of a `v1beta1` ClusterQueue passes the conversion webhook (its webhooks take v1beta2).

use super::kube::{ControlPlane, client_from_kubeconfig};
use super::node::Node;
use super::{ServerProcess, free_port, tool, unique, wait_until, work_dir};

use kube::Client;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Kueue's API group.
pub const GROUP: &str = "kueue.x-k8s.io";
/// The version the tests use (v0.17's storage version).
pub const VERSION: &str = "v1beta2";
/// The label that puts a Job in a LocalQueue.
pub const QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";

/// How long Kueue may take to serve: about 10 s idle, but the test machine is a loaded
/// 2-core box.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(180);
/// One readiness probe must not hang the loop.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Where v0.17's `cmd/kueue` reads the metrics certificate from (not configurable).
const METRICS_CERT_DIR: &str = "kueue/metrics/certs";

/// A running Kueue manager. Dropping it kills the manager (the CRDs and webhook
/// configurations stay: drop the control plane with it).
pub struct Kueue {
    manager: ServerProcess,
    dir: PathBuf,
    webhook_port: u16,
    health_port: u16,
    metrics_port: u16,
    ca_pem: String,
}

impl Kueue {
    /// The Kueue of this test binary, on the shared node's control plane, started on
    /// first use (blocking the calling thread; the node too, if it is not up yet). A
    /// failed start fails every test that asks, with the same message.
    pub fn shared() -> &'static Kueue {
        static SHARED: OnceLock<Result<Kueue, String>> = OnceLock::new();
        let plane = Node::shared().plane();
        match SHARED.get_or_init(|| start_on_own_thread(plane)) {
            Ok(kueue) => kueue,
            Err(msg) => panic!("Kueue did not start:\n{msg}"),
        }
    }

    /// Installs Kueue's CRDs and webhook configurations on `plane` and starts its manager
    /// against it; returns once the webhooks serve. At most once per API server (see the
    /// module documentation). Blocks the calling thread (also inside a tokio runtime).
    pub fn start(plane: &ControlPlane) -> Kueue {
        start_on_own_thread(plane).unwrap_or_else(|msg| panic!("{msg}"))
    }

    /// The directory with Kueue's configuration, certificates and log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The manager process (its log: `manager().log`).
    pub fn manager(&self) -> &ServerProcess {
        &self.manager
    }

    /// The last `lines` lines of the manager's log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        self.manager.log_tail(lines)
    }

    /// The webhook server's port on 127.0.0.1 (HTTPS, [`Kueue::ca_pem`]'s certificate).
    pub fn webhook_port(&self) -> u16 {
        self.webhook_port
    }

    /// The health probes' port on 127.0.0.1 (`/healthz`, `/readyz`; plain HTTP).
    pub fn health_port(&self) -> u16 {
        self.health_port
    }

    /// The metrics port on 127.0.0.1 (HTTPS; clients authenticated by the API server).
    pub fn metrics_port(&self) -> u16 {
        self.metrics_port
    }

    /// The CA (PEM) that signed the webhook server's certificate: the `caBundle`s.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    fn launch(plane: &ControlPlane) -> Kueue {
        let started = Instant::now();
        let dir = work_dir(&unique("kueue"));
        let (webhook_port, health_port, metrics_port) = distinct_ports();

        let certs = dir.join("certs");
        std::fs::create_dir_all(&certs).expect("create Kueue's certificate directory");
        let ca_pem = serving_certificate(&certs);
        // The lower layer of the overlay over /etc (see the module documentation).
        let etc = dir.join("etc");
        let metrics_certs = etc.join(METRICS_CERT_DIR);
        std::fs::create_dir_all(&metrics_certs).expect("create the metrics certificate dir");
        for file in ["tls.crt", "tls.key"] {
            std::fs::copy(certs.join(file), metrics_certs.join(file))
                .expect("copy the metrics certificate");
        }

        let config = dir.join("config.yaml");
        let configuration = json!({
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "manageJobsWithoutQueueName": false,
            "internalCertManagement": { "enable": false },
            "webhook": { "host": "127.0.0.1", "port": webhook_port, "certDir": certs },
            "health": { "healthProbeBindAddress": format!("127.0.0.1:{health_port}") },
            "metrics": { "bindAddress": format!("127.0.0.1:{metrics_port}") },
            "leaderElection": { "leaderElect": false },
            "integrations": { "frameworks": ["batch/job"] },
            "featureGates": { "VisibilityOnDemand": false },
        });
        std::fs::write(
            &config,
            serde_yaml_ng::to_string(&configuration).expect("serialize Kueue's configuration"),
        )
        .expect("write Kueue's configuration");

        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime for Kueue's start");
        let client = rt.block_on(client_from_kubeconfig(plane.kubeconfig_path()));
        let url = format!("https://127.0.0.1:{webhook_port}");
        rt.block_on(install_crds(&client, &url, &ca_pem));

        let mut manager =
            ServerProcess::start("kueue", manager_command(&etc, &config, plane), &dir);
        wait_until(
            &mut manager,
            STARTUP_TIMEOUT,
            &format!("/readyz on 127.0.0.1:{health_port}"),
            || http_ok(health_port, "/readyz"),
        );
        rt.block_on(install_webhooks(&client, &url, &ca_pem));
        let mut last = String::new();
        wait_until(
            &mut manager,
            STARTUP_TIMEOUT,
            "its webhooks (dry-run creates through them)",
            || {
                let probed = rt
                    .block_on(async { tokio::time::timeout(PROBE_TIMEOUT, probe(&client)).await });
                let status = match probed {
                    Ok(Ok(())) => return true,
                    Ok(Err(status)) => status,
                    Err(_) => format!("no answer within {PROBE_TIMEOUT:?}"),
                };
                if status != last {
                    eprintln!("[support] kueue not ready yet: {status}");
                    last = status;
                }
                false
            },
        );
        eprintln!(
            "[support] kueue ready after {:.1?} (webhooks on {url})",
            started.elapsed()
        );
        Kueue {
            manager,
            dir,
            webhook_port,
            health_port,
            metrics_port,
            ca_pem,
        }
    }
}

/// The `ApiResource` of Kueue kind `kind` (plural `plural`), for `Api<DynamicObject>`.
pub fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, kind), plural)
}

/// Runs [`Kueue::launch`] on a plain thread (it drives a tokio runtime of its own, which
/// would panic inside a `#[tokio::test]`'s). A panic there becomes the `Err` message.
fn start_on_own_thread(plane: &ControlPlane) -> Result<Kueue, String> {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("kueue".into())
            .spawn_scoped(scope, || Kueue::launch(plane))
            .expect("spawn the Kueue thread")
            .join()
            .map_err(|payload| {
                payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "Kueue's start panicked".to_string())
            })
    })
}

/// Three distinct free ports: webhook, health probes, metrics.
fn distinct_ports() -> (u16, u16, u16) {
    let webhook = free_port();
    let health = loop {
        let p = free_port();
        if p != webhook {
            break p;
        }
    };
    let metrics = loop {
        let p = free_port();
        if p != webhook && p != health {
            break p;
        }
    };
    (webhook, health, metrics)
}

/// Makes a CA and a serving certificate for IP 127.0.0.1 signed by it, writes
/// `tls.crt` / `tls.key` (controller-runtime's file names) and `ca.crt` into `dir`, and
/// returns the CA's PEM.
fn serving_certificate(dir: &Path) -> String {
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = common_name("lockwarden-test-kueue-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().expect("generate Kueue's CA key");
    let ca = ca_params
        .self_signed(&ca_key)
        .expect("self-sign Kueue's CA");

    let mut params = CertificateParams::default();
    params.distinguished_name = common_name("kueue-webhook");
    params.subject_alt_names = vec![SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST))];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().expect("generate Kueue's serving key");
    let cert = params
        .signed_by(&key, &Issuer::from_params(&ca_params, &ca_key))
        .expect("sign Kueue's serving certificate");

    for (file, pem) in [
        ("ca.crt", ca.pem()),
        ("tls.crt", cert.pem()),
        ("tls.key", key.serialize_pem()),
    ] {
        let path = dir.join(file);
        std::fs::write(&path, pem).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
    ca.pem()
}

fn common_name(name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    dn
}

/// `kueue --config CONFIG --kubeconfig ADMIN` in a mount namespace of its own where a
/// read-only overlay adds `etc` (the metrics certificate) over `/etc`.
fn manager_command(etc: &Path, config: &Path, plane: &ControlPlane) -> Command {
    let lower = etc.display().to_string();
    // overlayfs separates layers with ':' and options with ','.
    assert!(
        !lower.contains([':', ',']),
        "the overlay's layer path {lower:?} must not contain ':' or ','"
    );
    let mut cmd = Command::new("unshare");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        cmd.args(["--user", "--map-root-user"]);
    }
    cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(r#"mount -t overlay lockwarden-kueue-etc -o "lowerdir=$1:/etc" /etc && shift && exec "$@""#)
        .arg("kueue-etc")
        .arg(&lower)
        .arg(tool("KUEUE"))
        .arg(format!("--config={}", config.display()))
        .arg(format!("--kubeconfig={}", plane.kubeconfig_path().display()))
        .arg("--zap-log-level=info");
    cmd
}

/// Whether `GET path` on 127.0.0.1:`port` answers 200.
fn http_ok(port: u16, path: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(PROBE_TIMEOUT));
    let _ = stream.set_write_timeout(Some(PROBE_TIMEOUT));
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.") && &head[9..12] == b"200"
}

/// Every YAML document of `path` (skipping empty ones) as JSON values.
fn yaml_documents(path: &Path) -> Vec<Value> {
    use serde::Deserialize;
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| {
            Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("bad YAML in {}: {e}", path.display()))
        })
        .filter(|doc| !doc.is_null())
        .collect()
}

/// `bytes` base64-encoded, as a `caBundle` is (k8s-openapi's `ByteString` encodes so).
fn base64(bytes: &[u8]) -> Value {
    serde_json::to_value(k8s_openapi::ByteString(bytes.to_vec())).expect("encode base64")
}

fn apiextensions() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
        "customresourcedefinitions",
    )
}

/// Applies every CRD in `KUEUE_CRDS`, each conversion webhook pointed at `url` +
/// its `service.path` with `ca` as its bundle, and waits until all are Established.
async fn install_crds(client: &Client, url: &str, ca: &str) {
    let crds = Api::<DynamicObject>::all_with(client.clone(), &apiextensions());
    let dir = tool("KUEUE_CRDS");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.expect("a CRD file").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut names = Vec::new();
    for file in &files {
        for mut crd in yaml_documents(file) {
            if let Some(config) = crd.pointer_mut("/spec/conversion/webhook/clientConfig") {
                *config = client_config(config, url, ca, file);
            }
            let name = crd["metadata"]["name"]
                .as_str()
                .unwrap_or_else(|| panic!("a CRD without a name in {}", file.display()))
                .to_string();
            crds.patch(
                &name,
                &PatchParams::apply("lockwarden-test-kueue").force(),
                &Patch::Apply(&crd),
            )
            .await
            .unwrap_or_else(|e| panic!("apply CRD {name}: {e}"));
            names.push(name);
        }
    }
    assert!(!names.is_empty(), "no CRDs in {}", dir.display());
    for name in &names {
        super::eventually(
            &format!("CRD {name} to be Established"),
            STARTUP_TIMEOUT,
            || async {
                let crd = crds.get(name).await.ok()?;
                crd.data["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .any(|c| c["type"] == "Established" && c["status"] == "True")
                    .then_some(())
            },
        )
        .await;
    }
}

/// `{url: <url><service.path>, caBundle}` for a `clientConfig` naming a Service.
fn client_config(config: &Value, url: &str, ca: &str, file: &Path) -> Value {
    let path = config
        .pointer("/service/path")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("a clientConfig without service.path in {}", file.display()));
    json!({ "url": format!("{url}{path}"), "caBundle": base64(ca.as_bytes()) })
}

/// Applies the Mutating/ValidatingWebhookConfigurations of `KUEUE_WEBHOOKS`, named
/// `kueue-<name>` (as Kueue's release manifests name them), every webhook's
/// `clientConfig.service` replaced by `url` + its path and `ca` as its bundle.
async fn install_webhooks(client: &Client, url: &str, ca: &str) {
    let file = tool("KUEUE_WEBHOOKS");
    let mut applied = 0;
    for mut config in yaml_documents(&file) {
        let kind = config["kind"].as_str().unwrap_or_default().to_string();
        let plural = match kind.as_str() {
            "MutatingWebhookConfiguration" => "mutatingwebhookconfigurations",
            "ValidatingWebhookConfiguration" => "validatingwebhookconfigurations",
            other => panic!("unexpected kind {other:?} in {}", file.display()),
        };
        let name = format!(
            "kueue-{}",
            config["metadata"]["name"].as_str().unwrap_or_default()
        );
        config["metadata"]["name"] = json!(name);
        for webhook in config["webhooks"].as_array_mut().into_iter().flatten() {
            webhook["clientConfig"] = client_config(&webhook["clientConfig"], url, ca, &file);
        }
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", &kind),
            plural,
        );
        Api::<DynamicObject>::all_with(client.clone(), &resource)
            .patch(
                &name,
                &PatchParams::apply("lockwarden-test-kueue").force(),
                &Patch::Apply(&config),
            )
            .await
            .unwrap_or_else(|e| panic!("apply {kind} {name}: {e}"));
        applied += 1;
    }
    assert_eq!(
        applied,
        2,
        "expected 2 webhook configurations in {}",
        file.display()
    );
}

/// One readiness check of the webhooks; `Err` says what failed.
async fn probe(client: &Client) -> Result<(), String> {
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    // The validating (and mutating) webhooks of ResourceFlavor: `failurePolicy: Fail`.
    let flavors = resource("ResourceFlavor", "resourceflavors");
    let flavor = DynamicObject::new("kueue-readiness-probe", &flavors).data(json!({ "spec": {} }));
    Api::<DynamicObject>::all_with(client.clone(), &flavors)
        .create(&dry_run, &flavor)
        .await
        .map_err(|e| format!("dry-run ResourceFlavor: {e}"))?;
    // The conversion webhook: the ClusterQueue webhooks take v1beta2, so the API server
    // converts a v1beta1 ClusterQueue to call them, and their answer back.
    let v1beta1 = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, "v1beta1", "ClusterQueue"),
        "clusterqueues",
    );
    let queue = DynamicObject::new("kueue-readiness-probe", &v1beta1)
        .data(json!({ "spec": { "namespaceSelector": {} } }));
    Api::<DynamicObject>::all_with(client.clone(), &v1beta1)
        .create(&dry_run, &queue)
        .await
        .map_err(|e| format!("dry-run v1beta1 ClusterQueue: {e}"))?;
    Ok(())
}

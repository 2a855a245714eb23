//! A real Kubernetes control plane for integration tests: etcd, kube-apiserver and
//! kube-controller-manager as child processes on free loopback ports (no kubelet or
//! scheduler).
//!
//! `ControlPlane::shared()` starts one per test binary; every test then asks it for
//! its own `kube::Client` (`client()`, because a client is bound to the tokio runtime
//! that built it and each `#[tokio::test]` has its own runtime) and its own namespace
//! (`namespace()`). Tests that need a second, independent cluster call
//! `ControlPlane::start()` and get one that stops when dropped.
//!
//! Certificates are generated here with rcgen: a CA, the API server's serving
//! certificate, client certificates (an admin in `system:masters`, plus any user a
//! test asks for) and a service-account signing key, so TokenRequest works too.
//! Authorization is RBAC only, as in a real cluster, so a test can check the
//! permissions a component really needs.
//!
//! kube-controller-manager runs the Job, garbage-collector, namespace, service-account
//! (and its token), ReplicaSet and Deployment controllers, so a Job creates real Pods
//! and suspending it deletes them; ownerReferences cascade; a deleted namespace goes
//! away. What is still missing, and what that means for tests:
//! - no scheduler or kubelet: Pods stay `Pending` and never run; a test that needs a
//!   Pod (and so its Job) to finish writes the Pod's status as a kubelet would
//!   (`finish_pods`). An unscheduled Pod is deleted at once (no kubelet to wait for).
//! - the `ServiceAccount` admission plugin stays disabled: it would reject a fresh
//!   namespace's Pods until the service-account controller has created its `default`
//!   ServiceAccount (a race every test would have to wait out).
//!
//! A cluster with a real node (tests/support/node.rs) starts its own control plane
//! with [`ControlPlaneOptions::for_node`], which turns on what a kubelet needs.

use super::{ServerProcess, free_port, tool, unique, wait_for_port, wait_until, work_dir};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, GetParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long the API server may take to become ready. About 5 s on an idle machine, but
/// the test machine is a loaded 2-core box that may be compiling or running other servers.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(120);

/// One readiness probe must not hang the startup loop when the server accepted the
/// connection but is too busy to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// A running etcd + kube-apiserver pair. Dropping it kills both; the shared one lives
/// in a `static` and dies with the test binary (PR_SET_PDEATHSIG, see `ServerProcess`).
pub struct ControlPlane {
    // Field order is drop order: the controller-manager, then the API server, then the
    // etcd it uses, so none logs a burst of connection errors on the way down.
    controller_manager: ServerProcess,
    apiserver: ServerProcess,
    etcd: ServerProcess,
    dir: PathBuf,
    url: String,
    port: u16,
    kubeconfig: PathBuf,
    pki: Pki,
    /// How the API server was started, to start it again (`restart_apiserver`).
    apiserver_args: Vec<std::ffi::OsString>,
    apiserver_starts: u32,
}

impl ControlPlane {
    /// The control plane shared by every test in this binary, started on first use.
    ///
    /// Blocks the calling thread during that first start (also inside a
    /// `#[tokio::test]`: it only stalls that test's own runtime). If the start fails,
    /// every test that asks for it fails with the same message instead of each one
    /// retrying a two-minute start.
    pub fn shared() -> &'static ControlPlane {
        static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
        match SHARED.get_or_init(|| start_on_own_thread(ControlPlaneOptions::default())) {
            Ok(plane) => plane,
            Err(msg) => panic!("the shared Kubernetes control plane did not start:\n{msg}"),
        }
    }

    /// A new, independent control plane (its own etcd and certificates), e.g. for a
    /// second cluster. Stopped when dropped. Blocks the calling thread until ready.
    pub fn start() -> ControlPlane {
        Self::start_with(ControlPlaneOptions::default())
    }

    /// [`ControlPlane::start`] with `options`.
    pub fn start_with(options: ControlPlaneOptions) -> ControlPlane {
        start_on_own_thread(options).unwrap_or_else(|msg| panic!("{msg}"))
    }

    /// `https://127.0.0.1:<port>` of the API server.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The API server's secure port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The API server's audit events so far (writes to Jobs, with their request and
    /// response bodies), one JSON object each, oldest first.
    pub fn audit_events(&self) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(self.dir.join(AUDIT_LOG)).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// An admin (`system:masters`) kubeconfig, for kubectl and for subprocesses such
    /// as the controller binary. Certificates are referenced by absolute path.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The directory with this control plane's certificates, kubeconfigs, etcd data
    /// and server logs (kept after the run).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The API server process, e.g. to read its log or SIGSTOP it for a fault test
    /// (only on a control plane of your own: the shared one serves other tests).
    pub fn apiserver(&self) -> &ServerProcess {
        &self.apiserver
    }

    /// Kills the API server (SIGKILL) and starts it again with the same flags on the
    /// same port; etcd keeps the cluster's state. Waits until it is ready. Only on a
    /// control plane of your own (`start()`); must not run inside a tokio runtime.
    pub fn restart_apiserver(&mut self) {
        self.apiserver.kill();
        self.apiserver_starts += 1;
        let mut cmd = Command::new(tool("KUBE_APISERVER"));
        cmd.args(&self.apiserver_args);
        self.apiserver = ServerProcess::start(
            &format!("kube-apiserver-{}", self.apiserver_starts),
            cmd,
            &self.dir,
        );
        wait_until_ready(&mut self.apiserver, &mut self.etcd, &self.kubeconfig);
    }

    /// The kube-controller-manager process (Job, garbage-collector, namespace, …
    /// controllers).
    pub fn controller_manager(&self) -> &ServerProcess {
        &self.controller_manager
    }

    /// The etcd process behind the API server.
    pub fn etcd(&self) -> &ServerProcess {
        &self.etcd
    }

    /// An admin client bound to the calling test's tokio runtime.
    pub async fn client(&self) -> Client {
        client_from_kubeconfig(&self.kubeconfig).await
    }

    /// Creates a fresh namespace `<prefix>-<random>` and returns its name. `prefix`
    /// must be a lowercase DNS label of at most 52 characters (the suffix takes 11).
    pub async fn namespace(&self, client: &Client, prefix: &str) -> String {
        let name = unique(prefix);
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap_or_else(|e| panic!("cannot create namespace {name:?} on {}: {e}", self.url));
        name
    }

    /// Writes a kubeconfig that authenticates with a client certificate as `user`,
    /// optionally in `group`, and returns its path. Such a user has no permissions
    /// until a test binds some with RBAC. (One group at most: rcgen's distinguished
    /// names hold one value per attribute type, and a group is an `O` attribute.)
    ///
    /// A certificate whose user is `system:serviceaccount:<ns>:<name>` is matched by
    /// RBAC bindings to that ServiceAccount, which lets a test run a component with
    /// exactly the RBAC its manifests grant.
    pub fn user_kubeconfig(&self, user: &str, group: Option<&str>) -> PathBuf {
        // The file name must not depend on `user`, which may contain ':' and '/'.
        let stem = unique("user");
        let (cert, key) = self.pki.client_cert(&self.dir, &stem, user, group);
        let path = self.dir.join(format!("{stem}.kubeconfig"));
        write_kubeconfig(&path, &self.url, &self.pki.ca_cert, &cert, &key, user);
        path
    }

    /// Starts etcd and kube-apiserver and waits until the API server is ready. Must not
    /// run on a thread inside a tokio runtime (it runs one of its own to probe).
    fn launch(options: ControlPlaneOptions) -> ControlPlane {
        let started = Instant::now();
        let dir = work_dir(&unique("kube"));
        let pki = Pki::generate(&dir);

        let ports = distinct_free_ports(4);
        let (etcd_port, peer_port, port, kcm_port) = (ports[0], ports[1], ports[2], ports[3]);

        // etcd: single member, plain HTTP on loopback (nothing else can reach it), and
        // as cheap as possible: no fsync (the data is throwaway), warnings-only log.
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut cmd = Command::new(tool("ETCD"));
        cmd.arg("--name=lockwarden-test")
            .arg(format!("--data-dir={}", dir.join("etcd-data").display()))
            .arg(format!("--listen-client-urls={etcd_url}"))
            .arg(format!("--advertise-client-urls={etcd_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=lockwarden-test={peer_url}"))
            // Caps the disk a long benchmark run can fill (etcd's default is 2 GiB).
            .arg("--quota-backend-bytes=1073741824")
            .arg("--unsafe-no-fsync")
            .arg("--log-level=warn");
        let mut etcd = ServerProcess::start("etcd", cmd, &dir);
        wait_for_port(&mut etcd, etcd_port, STARTUP_TIMEOUT);

        let url = format!("https://127.0.0.1:{port}");
        let mut cmd = Command::new(tool("KUBE_APISERVER"));
        cmd.arg(format!("--etcd-servers={etcd_url}"))
            .arg("--bind-address=127.0.0.1")
            .arg("--advertise-address=127.0.0.1")
            .arg(format!("--secure-port={port}"))
            .arg(format!("--tls-cert-file={}", pki.serving_cert.display()))
            .arg(format!(
                "--tls-private-key-file={}",
                pki.serving_key.display()
            ))
            .arg(format!("--client-ca-file={}", pki.ca_cert.display()))
            // Unused while the serving certificate is given; set anyway so nothing can
            // ever be written to the default, /var/run/kubernetes.
            .arg(format!(
                "--cert-dir={}",
                dir.join("apiserver-certs").display()
            ))
            .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
            .arg(format!(
                "--service-account-key-file={}",
                pki.sa_public_key.display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                pki.sa_private_key.display()
            ))
            // Only a configuration value: no Service traffic goes anywhere.
            .arg("--service-cluster-ip-range=10.0.0.0/24")
            .arg("--allow-privileged=true")
            // Lighter: no priority-and-fairness queueing (the plain max-in-flight limits
            // apply), no endpoint reconciler (periodic lease and `kubernetes` Endpoints
            // writes, for kubelets and in-cluster clients that do not exist here), no
            // pprof handlers.
            .arg("--enable-priority-and-fairness=false")
            .arg("--endpoint-reconciler-type=none")
            .arg("--profiling=false")
            // Every write to a Job, with its request and response, in `audit.log`:
            // who wrote a Job's `spec.suspend` is proof only there (managedFields keep
            // just the current owner of a field).
            .arg(format!(
                "--audit-policy-file={}",
                write_audit_policy(&dir).display()
            ))
            .arg(format!(
                "--audit-log-path={}",
                dir.join(AUDIT_LOG).display()
            ))
            .arg("--audit-log-format=json")
            .arg("--audit-log-maxbackup=0");
        if options.node {
            // A kubelet's identity (system:node:<name>) is authorized by the Node
            // authorizer and restricted to its own Node and Pods; Pods get their
            // ServiceAccount's token mounted (the harness waits for the ServiceAccount).
            // The API server reaches the kubelet (logs, exec) at its Hostname address,
            // "localhost": the node's InternalIP is not loopback.
            cmd.arg("--authorization-mode=Node,RBAC")
                .arg("--enable-admission-plugins=NodeRestriction")
                .arg("--kubelet-preferred-address-types=Hostname,InternalIP");
        } else {
            // No kubelets, so no Node authorizer; RBAC as in a real cluster.
            cmd.arg("--authorization-mode=RBAC")
                // Rejects every Pod until the token controller has created the
                // namespace's `default` ServiceAccount (a race every test would wait out).
                .arg("--disable-admission-plugins=ServiceAccount");
        }
        if let Some(gates) = feature_gates() {
            cmd.arg(format!("--feature-gates={gates}"));
        }
        let apiserver_args: Vec<std::ffi::OsString> =
            cmd.get_args().map(|a| a.to_owned()).collect();
        let mut apiserver = ServerProcess::start("kube-apiserver", cmd, &dir);

        let kubeconfig = dir.join("admin.kubeconfig");
        let (cert, key) = pki.client_cert(&dir, "admin", "admin", Some("system:masters"));
        write_kubeconfig(&kubeconfig, &url, &pki.ca_cert, &cert, &key, "admin");

        wait_until_ready(&mut apiserver, &mut etcd, &kubeconfig);
        eprintln!(
            "[support] kube-apiserver ready at {url} after {:.1?}",
            started.elapsed()
        );
        let controllers = if options.node {
            format!("{CONTROLLERS},{NODE_CONTROLLERS}")
        } else {
            CONTROLLERS.to_string()
        };
        let controller_manager =
            start_controller_manager(&dir, &pki, &kubeconfig, kcm_port, &controllers);

        ControlPlane {
            controller_manager,
            apiserver_args,
            apiserver_starts: 1,
            apiserver,
            etcd,
            dir,
            url,
            port,
            kubeconfig,
            pki,
        }
    }
}

/// The controllers the tests rely on: Jobs create and delete Pods; the garbage
/// collector cascades ownerReferences; namespaces can be deleted; every namespace gets
/// its `default` ServiceAccount (and legacy token controller, which needs the signing
/// key); ReplicaSets and Deployments run Pods for tests of workloads other than Jobs;
/// admission policies get their type-checking status (the fencing policy's test reads it);
/// CronJobs create their Jobs (once per run, tests/once.rs).
const CONTROLLERS: &str = "job,cronjob,garbagecollector,namespace,serviceaccount,serviceaccount-token,\
                           replicaset,deployment,validatingadmissionpolicy-status-controller";

/// What a cluster with a kubelet needs besides: every namespace's `kube-root-ca.crt`
/// (the CA in projected ServiceAccount tokens) and the node lifecycle (it removes the
/// not-ready taint once the node reports Ready).
const NODE_CONTROLLERS: &str = "root-ca-cert-publisher,nodelifecycle";

/// The API server's audit log in its directory ([`ControlPlane::audit_events`]).
const AUDIT_LOG: &str = "audit.log";

/// The audit policy: writes to Jobs at RequestResponse, nothing else.
fn write_audit_policy(dir: &Path) -> PathBuf {
    let path = dir.join("audit-policy.yaml");
    std::fs::write(
        &path,
        "apiVersion: audit.k8s.io/v1\n\
         kind: Policy\n\
         omitStages: [RequestReceived]\n\
         rules:\n\
         - level: RequestResponse\n  \
           verbs: [create, update, patch, delete]\n  \
           resources:\n  \
           - group: batch\n    \
             resources: [jobs, jobs/status]\n\
         - level: None\n",
    )
    .expect("write the audit policy");
    path
}

/// How a control plane is started; the default is the shared one's.
#[derive(Clone, Copy, Debug, Default)]
pub struct ControlPlaneOptions {
    /// For a cluster with a real kubelet: the Node authorizer and NodeRestriction, the
    /// ServiceAccount admission plugin, the kubelet reached by hostname, and the
    /// controllers in `NODE_CONTROLLERS`.
    pub node: bool,
}

impl ControlPlaneOptions {
    pub fn for_node() -> Self {
        ControlPlaneOptions { node: true }
    }
}

/// `LOCKWARDEN_KUBE_FEATURE_GATES`, passed to kube-apiserver and kube-controller-manager
/// as `--feature-gates`: to run a test binary against the behaviour of an older release
/// (e.g. `MutableSchedulingDirectivesForSuspendedJobs=false`, as before 1.36).
fn feature_gates() -> Option<String> {
    std::env::var("LOCKWARDEN_KUBE_FEATURE_GATES")
        .ok()
        .filter(|g| !g.is_empty())
}

/// Starts kube-controller-manager against the API server (admin kubeconfig) and waits
/// until its port accepts connections. No leader election (one per control plane);
/// it serves only on 127.0.0.1:`port`. Its informers may still be syncing when this
/// returns: a Job created meanwhile is picked up once they are.
fn start_controller_manager(
    dir: &Path,
    pki: &Pki,
    kubeconfig: &Path,
    port: u16,
    controllers: &str,
) -> ServerProcess {
    let started = Instant::now();
    let mut cmd = Command::new(tool("KUBE_CONTROLLER_MANAGER"));
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--controllers={controllers}"))
        .arg("--leader-elect=false")
        .arg("--bind-address=127.0.0.1")
        .arg(format!("--secure-port={port}"))
        // Its self-signed serving certificate goes here, not to /var/run/kubernetes.
        .arg(format!("--cert-dir={}", dir.join("kcm-certs").display()))
        // The token controller signs with the key the API server verifies with.
        .arg(format!(
            "--service-account-private-key-file={}",
            pki.sa_private_key.display()
        ))
        .arg(format!("--root-ca-file={}", pki.ca_cert.display()))
        // Each controller uses the admin identity of --kubeconfig (no per-controller
        // ServiceAccounts to wait for).
        .arg("--use-service-account-credentials=false")
        // Quicker reaction in tests; a real cluster's defaults only add latency here.
        .arg("--concurrent-job-syncs=10")
        .arg("--profiling=false")
        .arg("--v=1");
    if let Some(gates) = feature_gates() {
        cmd.arg(format!("--feature-gates={gates}"));
    }
    let mut kcm = ServerProcess::start("kube-controller-manager", cmd, dir);
    wait_for_port(&mut kcm, port, STARTUP_TIMEOUT);
    eprintln!(
        "[support] kube-controller-manager serving on 127.0.0.1:{port} after {:.1?}",
        started.elapsed()
    );
    kcm
}

/// A client for any kubeconfig (e.g. one from `ControlPlane::user_kubeconfig`), bound
/// to the calling tokio runtime.
pub async fn client_from_kubeconfig(path: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(path)
        .unwrap_or_else(|e| panic!("cannot read kubeconfig {}: {e}", path.display()));
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("bad kubeconfig {}: {e}", path.display()));
    Client::try_from(config)
        .unwrap_or_else(|e| panic!("cannot build a client from {}: {e}", path.display()))
}

/// Runs `ControlPlane::launch` on a plain thread: it drives a tokio runtime of its own
/// for the readiness probe, which would panic on a thread that is already inside one
/// (any `#[tokio::test]`). A panic there becomes the `Err` message.
fn start_on_own_thread(options: ControlPlaneOptions) -> Result<ControlPlane, String> {
    std::thread::Builder::new()
        .name("kube-control-plane".into())
        .spawn(move || ControlPlane::launch(options))
        .expect("spawn control-plane thread")
        .join()
        .map_err(|payload| {
            payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "control-plane start panicked".to_string())
        })
}

/// `n` distinct free ports (`free_port` alone could, rarely, return one port twice).
fn distinct_free_ports(n: usize) -> Vec<u16> {
    let mut ports = Vec::with_capacity(n);
    while ports.len() < n {
        let port = free_port();
        if !ports.contains(&port) {
            ports.push(port);
        }
    }
    ports
}

/// Polls until `/readyz` says `ok` and the `default` namespace exists (created by an
/// API-server controller shortly after start; tests may use it straight away).
/// Fails with the API server's log tail, or etcd's if etcd died.
fn wait_until_ready(apiserver: &mut ServerProcess, etcd: &mut ServerProcess, kubeconfig: &Path) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime for the readiness probe");
    let client = rt.block_on(client_from_kubeconfig(kubeconfig));
    // Printed when it changes, so a slow start shows what the server was waiting for.
    let mut last_status = String::new();
    wait_until(
        apiserver,
        STARTUP_TIMEOUT,
        "/readyz and namespace default",
        || {
            if !etcd.is_running() {
                panic!(
                    "etcd exited while kube-apiserver was starting; log {}:\n{}",
                    etcd.log.display(),
                    etcd.log_tail(40)
                );
            }
            // `timeout` needs the runtime's timer when it is created, hence the async block.
            let probed =
                rt.block_on(async { tokio::time::timeout(PROBE_TIMEOUT, probe(&client)).await });
            let status = match probed {
                Ok(Ok(())) => return true,
                Ok(Err(status)) => status,
                Err(_) => format!("no answer within {PROBE_TIMEOUT:?}"),
            };
            if status != last_status {
                eprintln!("[support] kube-apiserver not ready yet: {status}");
                last_status = status;
            }
            false
        },
    );
}

/// One readiness check; `Err` says what is still missing.
async fn probe(client: &Client) -> Result<(), String> {
    // kube has no raw-GET helper and `http` is not a dependency of the tests, so build
    // `GET /readyz` as a "get object `readyz` under the empty path".
    let request = kube::core::Request::new("")
        .get("readyz", &GetParams::default())
        .map_err(|e| e.to_string())?;
    match client.request_text(request).await {
        Ok(body) if body.trim() == "ok" => {}
        Ok(body) => return Err(format!("/readyz answered {body:?}")),
        Err(e) => {
            // A failing /readyz lists every check as `[+]name ok` / `[-]name failed`;
            // name only the failing ones.
            let text = e.to_string();
            let failing: Vec<&str> = text
                .lines()
                .filter_map(|l| l.trim().strip_prefix("[-]"))
                .filter_map(|l| l.split_whitespace().next())
                .collect();
            return Err(if failing.is_empty() {
                text
            } else {
                format!("/readyz failing: {}", failing.join(", "))
            });
        }
    }
    Api::<Namespace>::all(client.clone())
        .get("default")
        .await
        .map(drop)
        .map_err(|e| format!("namespace default: {e}"))
}

/// Writes a single-context kubeconfig for a client-certificate user.
fn write_kubeconfig(path: &Path, url: &str, ca: &Path, cert: &Path, key: &Path, user: &str) {
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": "lockwarden-test",
            "cluster": { "server": url, "certificate-authority": ca },
        }],
        "users": [{
            "name": user,
            "user": { "client-certificate": cert, "client-key": key },
        }],
        "contexts": [{
            "name": "lockwarden-test",
            "context": { "cluster": "lockwarden-test", "user": user, "namespace": "default" },
        }],
        "current-context": "lockwarden-test",
    });
    let yaml = serde_yaml_ng::to_string(&config).expect("serialize kubeconfig");
    std::fs::write(path, yaml)
        .unwrap_or_else(|e| panic!("cannot write kubeconfig {}: {e}", path.display()));
}

/// The control plane's certificates and keys (ECDSA P-256, rcgen's default), written
/// as PEM files in its directory. The CA is kept to sign client certificates later.
struct Pki {
    ca_params: CertificateParams,
    ca_key: KeyPair,
    ca_cert: PathBuf,
    serving_cert: PathBuf,
    serving_key: PathBuf,
    sa_public_key: PathBuf,
    sa_private_key: PathBuf,
}

impl Pki {
    fn generate(dir: &Path) -> Pki {
        let mut ca_params = CertificateParams::default();
        ca_params.distinguished_name = distinguished_name("lockwarden-test-ca", None);
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().expect("generate CA key");
        let ca = ca_params.self_signed(&ca_key).expect("self-sign CA");
        let ca_cert = write_pem(dir, "ca.crt", &ca.pem());

        // The in-cluster names too, so a client using them (or a future in-cluster
        // component behind a proxy) verifies; only 127.0.0.1 is dialled today.
        let mut params = CertificateParams::new(vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
            "10.0.0.1".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default".to_string(),
            "kubernetes.default.svc".to_string(),
            "kubernetes.default.svc.cluster.local".to_string(),
        ])
        .expect("serving certificate names");
        params.distinguished_name = distinguished_name("kube-apiserver", None);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().expect("generate serving key");
        let cert = params
            .signed_by(&key, &Issuer::from_params(&ca_params, &ca_key))
            .expect("sign serving certificate");
        let serving_cert = write_pem(dir, "apiserver.crt", &cert.pem());
        let serving_key = write_pem(dir, "apiserver.key", &key.serialize_pem());

        // The API server signs service-account tokens with the private key and verifies
        // them with the public one (ES256).
        let sa_key = KeyPair::generate().expect("generate service-account key");
        let sa_public_key = write_pem(dir, "sa.pub", &sa_key.public_key_pem());
        let sa_private_key = write_pem(dir, "sa.key", &sa_key.serialize_pem());

        Pki {
            ca_params,
            ca_key,
            ca_cert,
            serving_cert,
            serving_key,
            sa_public_key,
            sa_private_key,
        }
    }

    /// Signs a client certificate: the API server takes the user from CN and the group
    /// from O. Returns the (certificate, key) paths `<stem>.crt` / `<stem>.key`.
    fn client_cert(
        &self,
        dir: &Path,
        stem: &str,
        user: &str,
        group: Option<&str>,
    ) -> (PathBuf, PathBuf) {
        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name(user, group);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().expect("generate client key");
        let cert = params
            .signed_by(&key, &Issuer::from_params(&self.ca_params, &self.ca_key))
            .unwrap_or_else(|e| panic!("sign client certificate for {user:?}: {e}"));
        (
            write_pem(dir, &format!("{stem}.crt"), &cert.pem()),
            write_pem(dir, &format!("{stem}.key"), &key.serialize_pem()),
        )
    }
}

fn distinguished_name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    if let Some(organization) = organization {
        name.push(DnType::OrganizationName, organization);
    }
    name
}

fn write_pem(dir: &Path, file: &str, pem: &str) -> PathBuf {
    let path = dir.join(file);
    std::fs::write(&path, pem).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    path
}

/// Applies `crd` (server-side apply: idempotent, so every test may call it) and waits
/// until it is Established.
pub async fn install_crd(
    client: &Client,
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Patch, PatchParams};

    let name = crd.metadata.name.clone().expect("a CRD has a name");
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    crds.patch(
        &name,
        &PatchParams::apply("lockwarden-test-crd").force(),
        &Patch::Apply(crd),
    )
    .await
    .unwrap_or_else(|e| panic!("apply the CRD {name}: {e}"));
    super::eventually(
        &format!("the CRD {name} to be Established"),
        Duration::from_secs(90),
        || async {
            let crd = crds.get(&name).await.ok()?;
            crd.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        },
    )
    .await;
}

/// Applies lockwarden's `DistributedLock` CRD (server-side apply: idempotent, so every
/// test may call it) and waits until it is Established and its objects can be listed.
pub async fn install_lockwarden_crd(client: &Client) {
    use kube::api::ListParams;
    use lockwarden::api::{DistributedLock, crd};

    // Generous: the test machine is a loaded 2-core box.
    const TIMEOUT: Duration = Duration::from_secs(90);
    install_crd(client, &crd()).await;
    // Established means served, but give a just-created endpoint a moment on a busy box.
    let locks = Api::<DistributedLock>::all(client.clone());
    super::eventually("DistributedLocks to be listable", TIMEOUT, || async {
        locks
            .list(&ListParams::default().limit(1))
            .await
            .ok()
            .map(drop)
    })
    .await;
}

/// A client, the CRD, a fresh namespace on the shared control plane, and an in-process
/// controller (cluster name `cluster`) watching only that namespace; test logs follow
/// `RUST_LOG`.
pub async fn namespace_with_controller(prefix: &str, cluster: &str) -> (Client, String) {
    let (client, namespace, _) = namespace_with_observed_controller(prefix, cluster).await;
    (client, namespace)
}

/// Creates `object` through `api` (any kind, in `api`'s namespace); panics naming it.
pub async fn create<K>(api: &Api<K>, object: &K) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.create(&PostParams::default(), object)
        .await
        .unwrap_or_else(|e| panic!("create {:?}: {e}", object.meta().name))
}

/// Deletes `name` through `api` (default propagation); panics naming it.
pub async fn delete<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.delete(name, &kube::api::DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete {name}: {e}"));
}

/// Namespaces for two controllers ("clusters") `cluster-a` and `cluster-b`, each
/// serving its own (`<prefix>-a`, `<prefix>-b`), and one more (`<prefix>-keys`) for
/// the Leases they share. Returns a client and the three namespaces.
pub async fn two_clusters(prefix: &str) -> (Client, String, String, String) {
    let (client, a) = namespace_with_controller(&format!("{prefix}-a"), "cluster-a").await;
    let (_, b) = namespace_with_controller(&format!("{prefix}-b"), "cluster-b").await;
    let keys = ControlPlane::shared()
        .namespace(&client, &format!("{prefix}-keys"))
        .await;
    (client, a, b, keys)
}

/// A controller of cluster `cluster` watching `namespace` (every one when `None`),
/// serving /metrics, /healthz and /readyz on 127.0.0.1:`port`.
pub fn metrics_config(
    cluster: &str,
    namespace: Option<String>,
    port: u16,
) -> lockwarden::controller::ControllerConfig {
    lockwarden::controller::ControllerConfig {
        cluster_name: cluster.into(),
        namespace,
        metrics_address: Some(([127, 0, 0, 1], port).into()),
        ..Default::default()
    }
}

/// Runs the controller in-process with `client` and `config` until the test ends; an
/// error fails the test (the task panics).
pub fn spawn_controller(client: Client, config: lockwarden::controller::ControllerConfig) {
    tokio::spawn(async move {
        if let Err(e) = lockwarden::controller::run(client, config).await {
            panic!("controller failed: {e}");
        }
    });
}

/// A fresh namespace and a controller (cluster name `cluster`) serving it as a user
/// whose only permissions are `rules`, in a Role there — to check the documented RBAC
/// is enough. Returns an admin client and the namespace.
pub async fn namespace_with_controller_as(
    rules: serde_json::Value,
    prefix: &str,
    cluster: &str,
) -> (Client, String) {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let plane = ControlPlane::shared();
    let admin = plane.client().await;
    install_lockwarden_crd(&admin).await;
    let ns = plane.namespace(&admin, prefix).await;
    let user = format!("lockwarden-controller-{ns}");
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "lockwarden"},
        "rules": rules,
    }))
    .expect("a Role");
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "lockwarden"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "lockwarden"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }))
    .expect("a RoleBinding");
    create(&Api::namespaced(admin.clone(), &ns), &role).await;
    create(&Api::namespaced(admin.clone(), &ns), &binding).await;
    let restricted = client_from_kubeconfig(&plane.user_kubeconfig(&user, None)).await;
    // The API server's RBAC authorizer reads Roles and bindings through its own
    // informers: a binding just created may not be in effect yet, and the controller's
    // start-up check (it lists DistributedLocks) would then fail as forbidden. A pods
    // run once did so; wait until the identity may list them.
    let locks = Api::<lockwarden::api::DistributedLock>::namespaced(restricted.clone(), &ns);
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Err(e) = locks.list(&kube::api::ListParams::default().limit(1)).await {
        assert!(
            Instant::now() < deadline,
            "the Role bound to {user} did not take effect within 60 s: {e}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let config = lockwarden::controller::ControllerConfig {
        cluster_name: cluster.into(),
        namespace: Some(ns.clone()),
        ..Default::default()
    };
    spawn_controller(restricted, config);
    (admin, ns)
}

/// A Role `name` of `rules` in `ns`, bound to the namespace's `default` ServiceAccount
/// (what its Pods run as unless they name another): what a guard there needs of the
/// API server, say.
pub async fn grant_default_service_account(
    client: &Client,
    ns: &str,
    name: &str,
    rules: serde_json::Value,
) {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "rules": rules,
    }))
    .expect("a Role");
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
        "subjects": [{ "kind": "ServiceAccount", "name": "default", "namespace": ns }],
    }))
    .expect("a RoleBinding");
    create(&Api::namespaced(client.clone(), ns), &role).await;
    create(&Api::namespaced(client.clone(), ns), &binding).await;
}

/// A client of the shared control plane, the lockwarden CRD installed, and a fresh
/// namespace (no controller: for tests that run their own).
pub async fn namespace_with_crd(prefix: &str) -> (Client, String) {
    let plane = ControlPlane::shared();
    let client = plane.client().await;
    install_lockwarden_crd(&client).await;
    let namespace = plane.namespace(&client, prefix).await;
    (client, namespace)
}

/// The in-process controllers' logs in the test output, filtered by `RUST_LOG` (without
/// it, lockwarden's warnings: libtest shows them only for a test that failed, where
/// they are often the reason); once per test binary.
pub fn test_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("lockwarden=warn,kube_lease_manager=warn")
            }),
        )
        .with_test_writer()
        .try_init();
}

/// [`namespace_with_controller`], also returning the controller's metrics.
pub async fn namespace_with_observed_controller(
    prefix: &str,
    cluster: &str,
) -> (
    Client,
    String,
    std::sync::Arc<lockwarden::telemetry::Telemetry>,
) {
    test_logs();
    let (client, namespace) = namespace_with_crd(prefix).await;
    let config = lockwarden::controller::ControllerConfig {
        cluster_name: cluster.into(),
        namespace: Some(namespace.clone()),
        ..Default::default()
    };
    let telemetry = std::sync::Arc::new(lockwarden::telemetry::Telemetry::new());
    let (controller_client, observed) = (client.clone(), telemetry.clone());
    tokio::spawn(async move {
        if let Err(e) = lockwarden::controller::run_with(controller_client, config, observed).await
        {
            panic!("controller failed: {e}");
        }
    });
    (client, namespace, telemetry)
}

/// Plays the kubelet for a Job's Pods (there is none): every Pod of Job `job` that is
/// not terminal gets `phase: Succeeded` (or `Failed`) through the status subresource,
/// so the real Job controller counts them and marks the Job `Complete` (or `Failed`).
/// Waits until the Job has at least one Pod first. Returns how many Pods it finished.
pub async fn finish_pods(client: &Client, ns: &str, job: &str, succeeded: bool) -> usize {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{ListParams, Patch, PatchParams};
    const TIMEOUT: Duration = Duration::from_secs(90);
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let selector = format!("batch.kubernetes.io/job-name={job}");
    let running: Vec<String> =
        super::eventually(&format!("Job {job} to have Pods"), TIMEOUT, || async {
            let list = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .ok()?;
            let names: Vec<String> = list
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter(|p| {
                    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                    !matches!(phase, Some("Succeeded" | "Failed"))
                })
                .map(|p| p.metadata.name.clone().unwrap_or_default())
                .collect();
            (!names.is_empty()).then_some(names)
        })
        .await;
    // The phase is all the Job controller reads (no podFailurePolicy in the tests).
    let phase = if succeeded { "Succeeded" } else { "Failed" };
    for name in &running {
        let status = serde_json::json!({ "status": { "phase": phase } });
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap_or_else(|e| panic!("set Pod {name} of Job {job} to {phase}: {e}"));
    }
    running.len()
}

/// The Pods of Job `job` (the Job controller's label), terminating ones included.
pub async fn job_pods(
    client: &Client,
    ns: &str,
    job: &str,
) -> Vec<k8s_openapi::api::core::v1::Pod> {
    use kube::api::ListParams;
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), ns);
    pods.list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}")))
        .await
        .unwrap_or_else(|e| panic!("list the Pods of Job {job}: {e}"))
        .items
}

/// Whether every Pod of Job `job` the API server still has is terminal (Succeeded or
/// Failed): nothing of it runs.
pub async fn job_pods_ended(client: &Client, ns: &str, job: &str) -> bool {
    job_pods(client, ns, job).await.iter().all(|p| {
        p.status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|phase| matches!(phase, "Succeeded" | "Failed"))
    })
}

/// Waits until Job `job` has Pods (made by the real Job controller), every one not
/// terminating carrying `lockwarden.io/fence: fence` — what the workload reads through
/// the downward API — and returns them.
pub async fn wait_pods_with_fence(
    client: &Client,
    ns: &str,
    job: &str,
    fence: i64,
) -> Vec<k8s_openapi::api::core::v1::Pod> {
    const TIMEOUT: Duration = Duration::from_secs(90);
    let want = fence.to_string();
    super::eventually(
        &format!("Pods of Job {job} with fence {fence}"),
        TIMEOUT,
        || async {
            let live: Vec<_> = job_pods(client, ns, job)
                .await
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            let all_fenced = live.iter().all(|p| {
                p.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("lockwarden.io/fence"))
                    == Some(&want)
            });
            (!live.is_empty() && all_fenced).then_some(live)
        },
    )
    .await
}

/// A Job of one Pod that exits at once, with `annotations`, created suspended (the way a
/// gated Job is) or not.
pub fn job(
    name: &str,
    annotations: &[(&str, &str)],
    suspend: bool,
) -> k8s_openapi::api::batch::v1::Job {
    let annotations: std::collections::BTreeMap<&str, &str> = annotations.iter().copied().collect();
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "annotations": annotations },
        "spec": {
            "suspend": suspend,
            "backoffLimit": 0,
            "template": { "spec": {
                "restartPolicy": "Never",
                "containers": [{ "name": "work", "image": "busybox:1.36", "command": ["true"] }],
            }},
        },
    }))
    .expect("a Job")
}

/// A Pod of one container with `annotations`, created with lockwarden's scheduling gate
/// (`gated`) and its watch label (`labelled`), or without.
pub fn gated_pod(
    name: &str,
    annotations: &[(&str, &str)],
    gated: bool,
    labelled: bool,
) -> k8s_openapi::api::core::v1::Pod {
    let annotations: std::collections::BTreeMap<&str, &str> = annotations.iter().copied().collect();
    let labels = if labelled {
        serde_json::json!({ "lockwarden.io/gated": "true" })
    } else {
        serde_json::json!({})
    };
    let gates = if gated {
        serde_json::json!([{ "name": "lockwarden.io/lock" }])
    } else {
        serde_json::json!([])
    };
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "annotations": annotations, "labels": labels },
        "spec": {
            "schedulingGates": gates,
            "containers": [{ "name": "work", "image": "busybox:1.36", "command": ["true"] }],
        },
    }))
    .expect("a Pod")
}

/// Waits (up to 90 s) for an Event in `ns` about object `name` with this `type_` and
/// `reason` whose note contains `words` (a workload may report several reasons in
/// turn); returns its note.
pub async fn wait_event(
    client: &Client,
    ns: &str,
    name: &str,
    type_: &str,
    reason: &str,
    words: &str,
) -> String {
    use k8s_openapi::api::events::v1::Event;
    use kube::api::ListParams;
    let events = Api::<Event>::namespaced(client.clone(), ns);
    super::eventually(
        &format!("a {type_} {reason} Event on {name} saying {words:?}"),
        Duration::from_secs(90),
        || async {
            let matches = |e: &Event| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.type_.as_deref() == Some(type_)
                    && e.reason.as_deref() == Some(reason)
                    && e.note.as_deref().is_some_and(|n| n.contains(words))
            };
            let all = events.list(&ListParams::default()).await.ok()?.items;
            all.into_iter().find(matches)?.note
        },
    )
    .await
}

/// A `lockwarden controller` process of cluster `cluster` watching `namespace`, killed
/// (SIGKILL) on drop: for tests that kill a controller as a machine loss would.
pub struct ControllerProcess(std::process::Child);

impl ControllerProcess {
    pub fn start(
        kubeconfig: &Path,
        cluster: &str,
        namespace: &str,
        extra: &[&str],
    ) -> ControllerProcess {
        let child = Command::new(super::cli::bin())
            .args([
                "controller",
                "--cluster-name",
                cluster,
                "--watch-namespace",
                namespace,
            ])
            // Each process its own free port: several run side by side.
            .args(["--metrics-address", "127.0.0.1:0"])
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start lockwarden controller");
        ControllerProcess(child)
    }

    /// SIGKILL: nothing is released, nothing is flushed.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

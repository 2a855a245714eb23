//! How the controller runs, and the names it writes under: shared by the lock
//! controller and the gating machine (a file of its own, so that neither depends on
//! the module that starts them both).

/// Field manager of every status write.
pub const FIELD_MANAGER: &str = "lockwarden";
/// Finalizer that releases the lock before the object goes away.
pub const FINALIZER: &str = "lockwarden.io/release";

// `.map` on the `--…-requests-in-flight` parsers.
use clap::builder::TypedValueParser as _;

/// How the controller runs. Also a set of command-line options (`--cluster-name`,
/// `--watch-namespace`, `--event-reporter`) for `#[command(flatten)]`.
#[derive(Clone, Debug, clap::Args)]
pub struct ControllerConfig {
    /// First part of the default holder identity `<clusterName>/<namespace>/<name>`;
    /// must differ between clusters that share lock keys.
    #[arg(long, env = "LOCKWARDEN_CLUSTER_NAME", default_value = "local")]
    pub cluster_name: String,
    /// Watch only this namespace; all namespaces when unset.
    #[arg(long = "watch-namespace", env = "LOCKWARDEN_WATCH_NAMESPACE")]
    pub namespace: Option<String>,
    /// Name of the reporting controller in Events.
    #[arg(long = "event-reporter", default_value = "lockwarden")]
    pub reporter: String,
    /// Serve /metrics, /healthz and /readyz on this address (port 0: any free port)
    // `ControllerConfig::default()` (in-process use) leaves it unset: no server.
    #[arg(
        long,
        env = "LOCKWARDEN_METRICS_ADDRESS",
        value_name = "ADDR",
        default_value = "0.0.0.0:8080"
    )]
    pub metrics_address: Option<std::net::SocketAddr>,
    /// Kueue here manages every Job, also those without a queue name
    /// (`manageJobsWithoutQueueName`): Job gating leaves every Job to Kueue
    #[arg(long, env = "LOCKWARDEN_KUEUE_MANAGES_JOBS_WITHOUT_QUEUE_NAME")]
    pub kueue_manages_jobs_without_queue_name: bool,
    /// Run Kueue's AdmissionCheck controller for checks of controllerName
    /// lockwarden.io/lock: Kueue admits their Workloads once their locks are held
    #[arg(long, env = "LOCKWARDEN_KUEUE_ADMISSION_CHECK")]
    pub kueue_admission_check: bool,
    /// Take a guard's report on its own Pod (annotation guard-ended.lockwarden.io/<container>)
    /// as its container's successful exit, and hand the lock on before the kubelet
    /// reports it; and renew at once a lock a guard waits to see renewed
    /// (guard-waiting.lockwarden.io/<container>, watching the Pods' metadata). Only where
    /// an admission policy lets a Pod alone write its report, as the chart's does
    #[arg(long, env = "LOCKWARDEN_TRUST_GUARD_REPORTS")]
    pub trust_guard_reports: bool,
    /// Requests one S3 or DynamoDB client (one endpoint, region and credentials) keeps
    /// in flight at most; beyond it requests wait in the controller instead of opening
    /// more connections to a store that is already slow
    #[arg(
        long,
        env = "LOCKWARDEN_STORE_REQUESTS_IN_FLIGHT",
        value_name = "N",
        default_value_t = lockwarden_stores::DEFAULT_REQUESTS_IN_FLIGHT,
        value_parser = clap::value_parser!(u16).range(1..).map(usize::from)
    )]
    pub store_requests_in_flight: usize,
    /// Requests the controller keeps in flight to the Kubernetes API server at most,
    /// watches aside; beyond it requests wait in the controller instead of opening more
    /// connections to a busy API server
    #[arg(
        long,
        env = "LOCKWARDEN_API_REQUESTS_IN_FLIGHT",
        value_name = "N",
        default_value_t = crate::api_client::DEFAULT_API_REQUESTS_IN_FLIGHT,
        value_parser = clap::value_parser!(u16).range(1..).map(usize::from)
    )]
    pub api_requests_in_flight: usize,
    /// DistributedLock reconciles the controller runs at once at most; beyond it a lock
    /// waits in the controller's queue as its name alone, instead of as a reconcile
    /// waiting for a slow store or API server
    #[arg(
        long,
        env = "LOCKWARDEN_RECONCILES_IN_FLIGHT",
        value_name = "N",
        default_value_t = DEFAULT_RECONCILES_IN_FLIGHT,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub reconciles_in_flight: u16,
}

/// The default of `--reconciles-in-flight`: four times the default bounds of requests
/// in flight to a store and to the API server, so that a lock's reconcile rarely waits
/// for a slot while those bounds have room (docs/design.md §3, "Requests in flight are
/// bounded").
pub const DEFAULT_RECONCILES_IN_FLIGHT: u16 = 256;

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            cluster_name: "local".to_string(),
            namespace: None,
            reporter: "lockwarden".to_string(),
            metrics_address: None,
            kueue_manages_jobs_without_queue_name: false,
            kueue_admission_check: false,
            trust_guard_reports: false,
            store_requests_in_flight: lockwarden_stores::DEFAULT_REQUESTS_IN_FLIGHT,
            api_requests_in_flight: crate::api_client::DEFAULT_API_REQUESTS_IN_FLIGHT,
            reconciles_in_flight: DEFAULT_RECONCILES_IN_FLIGHT,
        }
    }
}

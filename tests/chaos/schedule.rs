//! One schedule: a plan drawn from a seed (backend, keys, contenders, faults), run
//! against the world's servers, recorded and checked.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use lockwarden::api::conditions::{self, ACQUIRED};
use lockwarden::api::{
    BackendSpec, DistributedLock, DistributedLockSpec, DynamoDbBackend, KubernetesBackend,
    S3Backend, SecretRef, ZooKeeperBackend,
};
use lockwarden::backend::{
    AwsOptions, ConnectOptions, Credentials, LeaseStore, S3Options, Target, ZkSessions,
};
use lockwarden::lock::{
    AcquireRequest, Attempt, CasLock, HeldLock, HolderState, LockBackend, LockState,
    Mode as LockMode, Permits, Queueing, SetEntry, Wait,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::task::JoinHandle;

use super::cli::{CliSpec, CliTarget};
use super::flaws::{Flaw, Flawed};
use super::history::{Claim, History, Kind, QueuedEntry, Report};
use super::world::{CLI_SLOTS, ENGINE_PATHS, ENGINE_SLOTS, SECRET_NAME, world};
use crate::support::moto::{ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY};
use crate::support::proxy::Mode;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Backend {
    Lease,
    S3,
    DynamoDb,
    ZooKeeper,
}

pub const BACKENDS: [Backend; 4] = [
    Backend::Lease,
    Backend::S3,
    Backend::DynamoDb,
    Backend::ZooKeeper,
];

/// The stores a semaphore plan is drawn on (`seed % 4`).
pub const SEMAPHORE_BACKENDS: [Backend; 4] = BACKENDS;

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Lease => "lease",
            Backend::S3 => "s3",
            Backend::DynamoDb => "dynamodb",
            Backend::ZooKeeper => "zookeeper",
        }
    }

    pub fn parse(s: &str) -> Option<Backend> {
        BACKENDS.iter().copied().find(|b| b.name() == s)
    }
}

/// Lease of every contender (and the ZooKeeper session timeout of engine clients).
/// Controllers' ZooKeeper sessions use the process default, 10 s: the controller does
/// not apply `spec.backend.zookeeper.sessionTimeout` (reported in docs/safety.md).
pub const LEASE: Duration = Duration::from_secs(3);
/// How often a CLI round on S3, DynamoDB or a Lease is a guarded one
/// (`tests/chaos/cli.rs`, `guarded`).
pub const GUARDED_SHARE: f64 = 0.35;
const CONTROLLER_ZK_SESSION: Duration = Duration::from_secs(10);

/// A fault and its parameters. Durations are how long the fault lasts.
#[derive(Clone, Debug)]
pub enum Fault {
    ControllerKill {
        controller: usize,
        down: Duration,
    },
    ControllerPause {
        controller: usize,
        pause: Duration,
    },
    /// A network fault on every path of one contender (engine slot or controller).
    Network {
        target: Contender,
        mode: Mode,
        lasts: Duration,
    },
    /// The contender's ZooKeeper paths blackholed past its session timeout.
    SessionExpiry {
        target: Contender,
        lasts: Duration,
    },
    MotoPause {
        lasts: Duration,
    },
    /// moto killed and started again, its state restored (see `restart_moto`).
    MotoRestart,
    /// The west kube-apiserver killed and started again (etcd keeps the state).
    ApiServerRestart,
    ZkNodeRestart {
        node: usize,
        down: Duration,
    },
    ZkQuorumLoss {
        down: Duration,
    },
    ApiServerPause {
        lasts: Duration,
    },
    /// Every command of one CLI slot SIGKILLed with its process group (a `run` and
    /// its command die together, as on a machine that dies).
    CliKill {
        slot: usize,
    },
    /// The holders (`run`) of one CLI slot's guarded rounds SIGSTOPped, the process
    /// alone, for `lasts`, past the 3 s lease (not always past a lock-delay); every
    /// holder that starts meanwhile is stopped too. Their commands, the guards, are
    /// not: only a guard can stop the guarded writer then, by its own deadline
    /// (docs/design.md §3 rule 9).
    HolderPause {
        slot: usize,
        lasts: Duration,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contender {
    Engine(usize),
    Controller(usize),
    Cli(usize),
    /// The guard of a CLI slot's guarded rounds (its own proxies).
    Guard(usize),
}

impl Fault {
    pub fn kind(&self) -> String {
        match self {
            Fault::ControllerKill { .. } => "controller-sigkill-restart".into(),
            Fault::ControllerPause { .. } => "controller-sigstop-past-lease".into(),
            Fault::Network { mode, .. } => format!(
                "network-{}",
                match mode {
                    Mode::Blackhole => "blackhole",
                    Mode::Delay(_) => "delay",
                    Mode::LoseRequests => "one-way-loss-requests",
                    Mode::LoseReplies => "one-way-loss-replies",
                    Mode::DropReplies => "forward-then-drop-reply",
                    Mode::Refuse => "refuse",
                    Mode::Pass => "pass",
                }
            ),
            Fault::SessionExpiry { .. } => "zookeeper-session-expiry".into(),
            Fault::MotoPause { .. } => "moto-sigstop".into(),
            Fault::MotoRestart => "moto-restart".into(),
            Fault::ApiServerRestart => "apiserver-restart".into(),
            Fault::ZkNodeRestart { .. } => "zookeeper-node-restart".into(),
            Fault::ZkQuorumLoss { .. } => "zookeeper-quorum-loss".into(),
            Fault::ApiServerPause { .. } => "apiserver-sigstop".into(),
            Fault::CliKill { .. } => "cli-sigkill".into(),
            Fault::HolderPause { .. } => "cli-holder-sigstop".into(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct EngineSpec {
    /// Its network paths (`world().engines[slot]`): a network fault on the slot hits
    /// every contender in it, as on one machine.
    pub slot: usize,
    /// `None`: contends on every key of the plan (a mutex plan); `Some(k)`: on key `k`
    /// only, as contender number `contender` of that key (a semaphore plan).
    pub key: Option<usize>,
    pub contender: usize,
    /// The key's permits and how this contender takes them.
    pub permits: Permits,
    /// Broken on purpose: keeps claiming (and writing) while its holder task says
    /// `Expiring`, i.e. ignores the holder deadline of rule 2.
    pub ignores_deadline: bool,
    pub start_after: Duration,
    /// How long each hold lasts (then it releases and tries again).
    pub hold: (Duration, Duration),
    /// Waits in the key's queue with this priority and weight (queue schedules).
    pub queue: Option<Queueing>,
    /// Broken on purpose: its engine reads the store through this flaw (Leases only;
    /// tests/chaos/flaws.rs).
    pub flaw: Option<Flaw>,
    /// Dies holding: acquires once and never renews nor releases, as a process that
    /// crashed (the waiters must drop its entry by rule 1).
    pub crashes_holding: bool,
}

impl EngineSpec {
    /// A correct contender (no flaw, not queued, never dies holding).
    pub fn new(
        slot: usize,
        key: Option<usize>,
        contender: usize,
        permits: Permits,
        start_after: Duration,
        hold: (Duration, Duration),
    ) -> EngineSpec {
        EngineSpec {
            slot,
            key,
            contender,
            permits,
            ignores_deadline: false,
            start_after,
            hold,
            queue: None,
            flaw: None,
            crashes_holding: false,
        }
    }

    /// A correct contender as the random plans draw them: it starts within 0.5 s and
    /// holds 0.2–1.5 s at a time.
    fn drawn(
        rng: &mut StdRng,
        slot: usize,
        key: Option<usize>,
        contender: usize,
        permits: Permits,
    ) -> EngineSpec {
        let start_after = ms(rng.random_range(0..500));
        EngineSpec::new(
            slot,
            key,
            contender,
            permits,
            start_after,
            (ms(200), ms(1500)),
        )
    }
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub seed: u64,
    pub backend: Backend,
    pub keys: usize,
    /// Per key: its permits (1: a mutex; more: a semaphore plan, engine contenders only).
    pub permits: Vec<u32>,
    /// Which controllers contend (indexes into `world().controllers`), one
    /// DistributedLock each per key.
    pub controllers: Vec<usize>,
    pub engines: Vec<EngineSpec>,
    pub clis: Vec<CliSpec>,
    pub faults: Vec<(Duration, Fault)>,
    /// How long after healing a lock may stay unclaimed before it is a liveness
    /// failure, and so how long a plan whose waiters stall runs on: [`LIVENESS_LIMIT`]
    /// unless a proof knows its broken plan stalls and needs less to show its flaw.
    pub liveness_limit: Duration,
}

impl Plan {
    /// A random plan for `seed`; the backend is `seed % 4` unless given.
    pub fn from_seed(seed: u64, backend: Option<Backend>) -> Plan {
        let mut rng = StdRng::seed_from_u64(seed);
        let backend = backend.unwrap_or(BACKENDS[(seed % 4) as usize]);
        let keys = rng.random_range(1..=3);
        let controllers = match backend {
            // A Lease lives in one cluster: two controllers on the west API server.
            Backend::Lease => vec![1, 2],
            _ => vec![0, 1],
        };
        let engines: Vec<EngineSpec> = (0..rng.random_range(1..=ENGINE_SLOTS))
            .map(|slot| EngineSpec::drawn(&mut rng, slot, None, 0, Permits::MUTEX))
            .collect();
        let ctl_lease = if backend == Backend::ZooKeeper {
            CONTROLLER_ZK_SESSION
        } else {
            LEASE
        };
        let mut kinds: Vec<u8> = vec![0, 1, 2, 2, 2];
        match backend {
            Backend::S3 | Backend::DynamoDb => kinds.push(4),
            Backend::ZooKeeper => kinds.extend([3, 5, 6]),
            Backend::Lease => kinds.push(7),
        }
        let n = rng.random_range(1..=3);
        let mut faults = Vec::new();
        let mut used_global = false;
        let mut used_controller = [false; 3];
        let mut used_paths: Vec<Contender> = Vec::new();
        for _ in 0..n {
            let kind = kinds[rng.random_range(0..kinds.len())];
            let at = ms(rng.random_range(300..2000));
            let contender = |rng: &mut StdRng| {
                if rng.random_bool(0.5) {
                    Contender::Controller(controllers[rng.random_range(0..controllers.len())])
                } else {
                    // Only slots that run in this schedule.
                    Contender::Engine(rng.random_range(0..engines.len()))
                }
            };
            let fault = match kind {
                0 | 1 => {
                    let c = controllers[rng.random_range(0..controllers.len())];
                    if used_controller[c] {
                        continue;
                    }
                    used_controller[c] = true;
                    if kind == 0 {
                        Fault::ControllerKill {
                            controller: c,
                            down: ms(rng.random_range(100..3000)),
                        }
                    } else {
                        Fault::ControllerPause {
                            controller: c,
                            pause: ctl_lease + ms(rng.random_range(500..2000)),
                        }
                    }
                }
                2 => {
                    let mode = network_mode(&mut rng);
                    let target = contender(&mut rng);
                    let lasts = ms(rng.random_range(500..5000));
                    // One network fault per contender at a time: a fault's healing
                    // would cut another one short.
                    if used_paths.contains(&target) {
                        continue;
                    }
                    used_paths.push(target);
                    Fault::Network {
                        target,
                        mode,
                        lasts,
                    }
                }
                3 => {
                    let target = contender(&mut rng);
                    if used_paths.contains(&target) {
                        continue;
                    }
                    used_paths.push(target);
                    let session = match target {
                        Contender::Engine(_) | Contender::Cli(_) | Contender::Guard(_) => LEASE,
                        Contender::Controller(_) => CONTROLLER_ZK_SESSION,
                    };
                    Fault::SessionExpiry {
                        target,
                        lasts: session + ms(rng.random_range(1000..2000)),
                    }
                }
                _ if used_global => continue,
                global => {
                    used_global = true;
                    match global {
                        4 => pause_or_restart(
                            &mut rng,
                            seed ^ 0x5eed_0001,
                            |lasts| Fault::MotoPause { lasts },
                            Fault::MotoRestart,
                        ),
                        5 => Fault::ZkNodeRestart {
                            node: rng.random_range(0..3),
                            down: ms(rng.random_range(200..3000)),
                        },
                        6 => Fault::ZkQuorumLoss {
                            down: ms(rng.random_range(500..4000)),
                        },
                        _ => pause_or_restart(
                            &mut rng,
                            seed ^ 0x5eed_0002,
                            |lasts| Fault::ApiServerPause { lasts },
                            Fault::ApiServerRestart,
                        ),
                    }
                }
            };
            faults.push((at, fault));
        }
        // Command-line contenders and their faults from a side stream, so that adding
        // them left the other draws of older seeds unchanged.
        let mut side = StdRng::seed_from_u64(seed ^ 0x5eed_0003);
        let clis: Vec<CliSpec> = (0..side.random_range(1..=CLI_SLOTS))
            .map(|slot| CliSpec {
                slot,
                start_after: ms(side.random_range(0..500)),
                lock_unlock_share: 0.3,
                hold: (ms(200), ms(1500)),
                guarded_share: 0.0,
                hands_writes_to_a_daemon: false,
            })
            .collect();
        if side.random_bool(0.6) {
            let slot = side.random_range(0..clis.len());
            let at = ms(side.random_range(300..2000));
            let fault = match side.random_range(0..3) {
                0 => Some(Fault::CliKill { slot }),
                1 if backend == Backend::ZooKeeper => Some(Fault::SessionExpiry {
                    target: Contender::Cli(slot),
                    lasts: LEASE + ms(side.random_range(1000..2000)),
                }),
                _ => Some(Fault::Network {
                    target: Contender::Cli(slot),
                    mode: network_mode(&mut side),
                    lasts: ms(side.random_range(500..5000)),
                }),
            };
            faults.extend(fault.map(|f| (at, f)));
        }
        // Guarded rounds and their faults, from a side stream of their own, for the
        // same reason. Not on ZooKeeper: the guard refuses it (rule 9).
        let mut clis = clis;
        let mut guarded = StdRng::seed_from_u64(seed ^ 0x5eed_0004);
        if backend != Backend::ZooKeeper {
            for spec in &mut clis {
                spec.guarded_share = GUARDED_SHARE;
            }
            if guarded.random_bool(0.5) {
                let slot = guarded.random_range(0..clis.len());
                // A little later than the other faults: a guarded round must be under way.
                let at = ms(guarded.random_range(1000..2500));
                let fault = if guarded.random_bool(0.6) {
                    // Every round of the slot guarded, so the pause finds a holder.
                    clis[slot].guarded_share = 1.0;
                    // Past a holder's lease: a takeover, unless its lock-delay (rule 8)
                    // holds contenders back longer. Either way only the guard stops the
                    // guarded command, by its deadline.
                    Fault::HolderPause {
                        slot,
                        lasts: LEASE + ms(guarded.random_range(500..2000)),
                    }
                } else {
                    Fault::Network {
                        target: Contender::Guard(slot),
                        mode: network_mode(&mut guarded),
                        lasts: ms(guarded.random_range(500..5000)),
                    }
                };
                faults.push((at, fault));
            }
        }
        Plan {
            seed,
            backend,
            keys,
            permits: vec![1; keys],
            controllers,
            engines,
            clis,
            faults,
            liveness_limit: LIVENESS_LIMIT,
        }
    }

    /// A random semaphore plan for `seed` (docs/safety.md, "Semaphore schedules"): 1–2
    /// keys, each with 2–4 permits and twice to three times as many engine contenders,
    /// on one in three keys one or two of them exclusive (taking every permit); no
    /// controllers and no command-line contenders (neither takes permits yet). The
    /// backend is `seed % 4` of [`SEMAPHORE_BACKENDS`] unless given. The faults are
    /// those of a mutex plan that reach engine contenders: network faults per slot,
    /// moto SIGSTOP / restart, API-server SIGSTOP / restart, and on ZooKeeper session
    /// expiry per slot, node restart and quorum loss.
    pub fn semaphore_from_seed(seed: u64, backend: Option<Backend>) -> Plan {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5e4a_5e4a);
        let backend = backend
            .unwrap_or(SEMAPHORE_BACKENDS[(seed % SEMAPHORE_BACKENDS.len() as u64) as usize]);
        assert!(
            SEMAPHORE_BACKENDS.contains(&backend),
            "no semaphore schedules on {} in this build",
            backend.name()
        );
        let keys = rng.random_range(1..=2);
        let permits: Vec<u32> = (0..keys).map(|_| rng.random_range(2..=4)).collect();
        let mut engines = Vec::new();
        for (k, &n) in permits.iter().enumerate() {
            let contenders = rng.random_range(2 * n..=3 * n) as usize;
            let exclusive = if rng.random_bool(1.0 / 3.0) {
                rng.random_range(1..=2)
            } else {
                0
            };
            for contender in 0..contenders {
                let mode = if contender < exclusive {
                    LockMode::Exclusive
                } else {
                    LockMode::Shared
                };
                let slot = (contender + k) % ENGINE_PATHS;
                let permits = Permits { total: n, mode };
                engines.push(EngineSpec::drawn(
                    &mut rng,
                    slot,
                    Some(k),
                    contender,
                    permits,
                ));
            }
        }
        let slots = engines.len().min(ENGINE_PATHS);
        let mut faults = Vec::new();
        let mut used_global = false;
        let mut used_paths: Vec<Contender> = Vec::new();
        for _ in 0..rng.random_range(1..=3) {
            let at = ms(rng.random_range(300..2000));
            if rng.random_bool(0.75) {
                let target = Contender::Engine(rng.random_range(0..slots));
                if used_paths.contains(&target) {
                    continue;
                }
                used_paths.push(target);
                let mode = network_mode(&mut rng);
                let lasts = ms(rng.random_range(500..5000));
                // (A draw of its own on ZooKeeper only: the other stores' plans keep
                // the draws they had before ZooKeeper had semaphores.)
                if backend == Backend::ZooKeeper && rng.random_bool(0.3) {
                    let lasts = LEASE + ms(rng.random_range(1000..2000));
                    faults.push((at, Fault::SessionExpiry { target, lasts }));
                    continue;
                }
                faults.push((
                    at,
                    Fault::Network {
                        target,
                        mode,
                        lasts,
                    },
                ));
                continue;
            }
            if used_global {
                continue;
            }
            used_global = true;
            let lasts = ms(rng.random_range(500..5000));
            let restart = rng.random_bool(0.5);
            faults.push((
                at,
                match (backend, restart) {
                    (Backend::Lease, true) => Fault::ApiServerRestart,
                    (Backend::Lease, false) => Fault::ApiServerPause { lasts },
                    (Backend::ZooKeeper, true) => Fault::ZkNodeRestart {
                        node: rng.random_range(0..3),
                        down: ms(rng.random_range(200..3000)),
                    },
                    (Backend::ZooKeeper, false) => Fault::ZkQuorumLoss {
                        down: ms(rng.random_range(500..4000)),
                    },
                    (_, true) => Fault::MotoRestart,
                    (_, false) => Fault::MotoPause { lasts },
                },
            ));
        }
        Plan {
            seed,
            backend,
            keys,
            permits,
            controllers: vec![],
            engines,
            clis: vec![],
            faults,
            liveness_limit: LIVENESS_LIMIT,
        }
    }
}

impl Plan {
    /// A queue schedule (docs/design.md §6.4): a semaphore schedule of its own seed
    /// whose contenders all wait in the key's queue, with priorities 0–2 and, for
    /// shared ones, weights up to the permits (at most 3) — on ZooKeeper without
    /// either (its queue is the entries' order). The checker's permit rules then count
    /// each write with its weight.
    pub fn queue_from_seed(seed: u64, backend: Option<Backend>) -> Plan {
        let mut plan = Plan::semaphore_from_seed(seed ^ 0x9ae_9ae, backend);
        plan.seed = seed;
        let mut rng = StdRng::seed_from_u64(seed ^ 0x9ae_51de);
        let ranked = plan.backend != Backend::ZooKeeper;
        for e in &mut plan.engines {
            let weight = match e.permits.mode {
                LockMode::Shared if ranked => rng.random_range(1..=e.permits.total.min(3)),
                _ => 1,
            };
            let priority = if ranked { rng.random_range(0..=2) } else { 0 };
            e.queue = Some(Queueing { priority, weight });
        }
        plan
    }
}

/// A network fault's kind, drawn from `rng` (one draw, two for a delay: schedules of a
/// given seed stay as they were).
fn network_mode(rng: &mut StdRng) -> Mode {
    match rng.random_range(0..5) {
        0 => Mode::Blackhole,
        1 => Mode::Delay(ms(rng.random_range(100..800))),
        2 => Mode::LoseRequests,
        3 => Mode::LoseReplies,
        _ => Mode::DropReplies,
    }
}

/// A server outage drawn from `rng`: a pause of 0.5–5 s, or a restart, as a side
/// stream (`side`) of the seed says, so that adding restarts left the other draws of
/// older seeds unchanged.
fn pause_or_restart(
    rng: &mut StdRng,
    side: u64,
    pause: fn(Duration) -> Fault,
    restart: Fault,
) -> Fault {
    let lasts = ms(rng.random_range(500..5000));
    if StdRng::seed_from_u64(side).random_bool(0.5) {
        restart
    } else {
        pause(lasts)
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Names of this schedule's keys in the store.
struct Keys {
    /// The lock URL per key (the checker's key).
    urls: Vec<String>,
    /// Store-specific names per key.
    names: Vec<String>,
    bucket: String,
    table: String,
}

/// The bucket and table every S3 / DynamoDB schedule uses.
async fn bucket_and_table() -> (String, String) {
    static NAMES: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    if let Some(n) = NAMES.get() {
        return n.clone();
    }
    let moto = world().moto();
    let bucket = moto.new_bucket("chaos").await;
    let table = moto.new_table("chaos", "key").await;
    NAMES.get_or_init(|| (bucket, table)).clone()
}

/// What the schedule runner returns for the summary.
pub struct Outcome {
    pub plan: Plan,
    pub report: Report,
    pub history_path: std::path::PathBuf,
    pub wall: Duration,
}

/// How long after healing a lock may stay unclaimed before it is a liveness failure.
/// Generous on purpose (a loaded box); the measured numbers are reported.
pub const LIVENESS_LIMIT: Duration = Duration::from_secs(60);

/// Runs `plan` and checks its history.
pub async fn run(plan: Plan) -> Outcome {
    let started = std::time::Instant::now();
    let w = tokio::task::spawn_blocking(world).await.unwrap();
    // Start the servers this backend needs, and the proxies to them, off the runtime.
    let backend = plan.backend;
    tokio::task::spawn_blocking(move || {
        let w = world();
        for paths in w
            .engines
            .iter()
            .chain(w.controllers.iter().map(|c| &c.paths))
            .chain(w.clis.iter().flat_map(|c| [&c.paths, &c.guard_paths]))
        {
            match backend {
                Backend::S3 | Backend::DynamoDb => {
                    paths.moto();
                }
                Backend::ZooKeeper => {
                    paths.zk();
                }
                Backend::Lease => {}
            }
        }
        w.heal();
    })
    .await
    .unwrap();
    let (bucket, table) = match backend {
        Backend::S3 | Backend::DynamoDb => bucket_and_table().await,
        _ => (String::new(), String::new()),
    };
    let tag = format!("s{}-{}", plan.seed, crate::support::unique_suffix());
    let west_ns = w.controllers[1].namespace.clone();
    let keys = Keys {
        names: (0..plan.keys).map(|k| format!("{tag}-k{k}")).collect(),
        urls: Vec::new(),
        bucket,
        table,
    };
    let names = keys.names.clone();
    let urls: Vec<String> = names
        .iter()
        .map(|n| match backend {
            Backend::Lease => format!("k8s://{west_ns}/{n}"),
            Backend::S3 => format!("s3://{}/chaos/{n}", keys.bucket),
            Backend::DynamoDb => format!("dynamodb://{}/{n}", keys.table),
            Backend::ZooKeeper => format!("zk:///chaos/{n}"),
        })
        .collect();
    let keys = Keys { urls, ..keys };
    let history = Arc::new(History::new(plan.seed, backend == Backend::ZooKeeper));
    if backend == Backend::S3 {
        // Rule (f): S3 itself refuses what the register refuses. Keys with several
        // permits are not mirrored: fenced writes are for exclusive holders.
        let mutexes: Vec<String> = keys
            .urls
            .iter()
            .zip(&plan.permits)
            .filter(|(_, n)| **n <= 1)
            .map(|(url, _)| url.clone())
            .collect();
        history.mirror_to(crate::mirror::S3Mirror::new(&mutexes).await);
    }
    for (url, &n) in keys.urls.iter().zip(&plan.permits) {
        if n > 1 {
            history.set_permits(url, n);
        }
    }
    eprintln!(
        "[chaos] schedule seed {} backend {} keys {} permits {:?} engines {} CLI slots {} faults {:?}",
        plan.seed,
        backend.name(),
        plan.keys,
        plan.permits,
        plan.engines.len(),
        plan.clis.len(),
        plan.faults
    );
    history.record(
        json!({"op": "plan", "backend": backend.name(), "keys": keys.urls,
        "permits": plan.permits,
        "faults": format!("{:?}", plan.faults), "engines": format!("{:?}", plan.engines),
        "clis": format!("{:?}", plan.clis)}),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks: Vec<JoinHandle<()>> = Vec::new();

    // Observer: reads each record directly (no proxy) every 50 ms; on a key with more
    // than one permit, its holder set.
    for k in 0..plan.keys {
        let backend_obj = direct_backend(backend, &keys, k).await;
        let (history, stop, key) = (history.clone(), stop.clone(), keys.urls[k].clone());
        let semaphore = plan.permits[k] > 1;
        // The highest fence seen on the key. On ZooKeeper a set's last fence is the
        // highest of its present holders and drops when that holder leaves; grants are
        // in fence order there too (a prefix of the queue), so the highest fence seen
        // so far stands for "the last fence granted" (docs/safety.md).
        let mut highest = 0;
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let invoke = history.now();
                if let Ok(Ok(found)) =
                    tokio::time::timeout(Duration::from_secs(1), backend_obj.inspect()).await
                {
                    if semaphore {
                        // No record (yet, or while a moto restart restores it): nothing
                        // to check, and not a holder set without holders.
                        if let Some(record) = found.and_then(|s| s.record.ok()) {
                            let set = record.set.clone().unwrap_or_default();
                            let mut last = set.last_fence.0.max(record.fence.0);
                            if backend == Backend::ZooKeeper {
                                highest = highest.max(last);
                                last = highest;
                            }
                            let entries = set.holders.iter().map(|h| (h.nonce.clone(), h.fence.0));
                            history.set_poll(&key, invoke, last, entries.collect());
                            if let Some(queue) = &set.queue {
                                let queued =
                                    |es: &[SetEntry]| es.iter().map(queued_entry).collect();
                                history.queue_poll(
                                    &key,
                                    queued(&set.holders),
                                    queued(&queue.waiters),
                                );
                            }
                        }
                    } else {
                        let record = found.and_then(|s| {
                            let r = s.record.ok()?;
                            Some((r.nonce, r.fence.0, s.version.0, r.state == LockState::Held))
                        });
                        history.poll(&key, invoke, record);
                    }
                }
                tokio::time::sleep(ms(50)).await;
            }
        }));
    }

    // DistributedLocks: one per controller per key; watched, and written for.
    let latest: Arc<Mutex<HashMap<String, (bool, u64)>>> = Arc::default();
    let mut lock_apis = Vec::new();
    for &c in &plan.controllers {
        let ctl = &w.controllers[c];
        let client = w.direct_client(ctl.plane).await;
        let api = Api::<DistributedLock>::namespaced(client, &ctl.namespace);
        let label = format!("chaos-schedule={tag}");
        // Watch first, so no transition is missed.
        {
            let (api, history, latest, stop) =
                (api.clone(), history.clone(), latest.clone(), stop.clone());
            let urls = keys.urls.clone();
            let names = keys.names.clone();
            let cluster = ctl.cluster.clone();
            tasks.push(tokio::spawn(async move {
                let stream = watcher(api, watcher::Config::default().labels(&label));
                futures::pin_mut!(stream);
                while !stop.load(Ordering::SeqCst) {
                    let Ok(Some(event)) = tokio::time::timeout(ms(200), stream.next()).await else {
                        continue;
                    };
                    let Ok(event) = event else { continue };
                    let (lock, deleted) = match event {
                        watcher::Event::Apply(l) | watcher::Event::InitApply(l) => (l, false),
                        watcher::Event::Delete(l) => (l, true),
                        _ => continue,
                    };
                    let name = lock.metadata.name.clone().unwrap_or_default();
                    let Some(k) = names.iter().position(|n| name.contains(&format!("{n}-g")))
                    else {
                        continue;
                    };
                    let status = lock.status.clone().unwrap_or_default();
                    let acquired = !deleted && conditions::is_true(&status.conditions, ACQUIRED);
                    let fence = status.fence.unwrap_or(0) as u64;
                    let id = format!("{cluster}/{name}");
                    latest.lock().unwrap().insert(id.clone(), (acquired, fence));
                    history.status_at(
                        history.now(),
                        &id,
                        &urls[k],
                        acquired,
                        fence,
                        status.nonce.as_deref().unwrap_or(""),
                        status.holder.as_deref().unwrap_or(""),
                        serde_json::to_value(&status).unwrap_or_default(),
                    );
                }
            }));
        }
        for k in 0..plan.keys {
            history.set_controller_lease(
                &keys.urls[k],
                if backend == Backend::ZooKeeper {
                    CONTROLLER_ZK_SESSION
                } else {
                    LEASE
                },
            );
            let spec = DistributedLockSpec {
                backend: lock_backend(backend, &keys, k, c, &west_ns),
                lease_duration: "3s".into(),
                renew_interval: "1s".into(),
                ..Default::default()
            };
            // Generations of DistributedLocks on this key: each is created, held for a
            // while once Acquired, and deleted (the finalizer releases it), so that the
            // controllers' locks change hands too.
            let prefix = format!("{}-{}-g", ctl.cluster, keys.names[k]);
            let mut rng = StdRng::seed_from_u64(plan.seed ^ ((c as u64) << 40) ^ (k as u64) << 8);
            {
                let (api, latest, stop, tag, prefix, cluster, history) = (
                    api.clone(),
                    latest.clone(),
                    stop.clone(),
                    tag.clone(),
                    prefix.clone(),
                    ctl.cluster.clone(),
                    history.clone(),
                );
                let seed = plan.seed;
                tasks.push(tokio::spawn(async move {
                    let mut generation = 0;
                    while !stop.load(Ordering::SeqCst) {
                        let name = format!("{prefix}{generation}");
                        let mut lock = DistributedLock::new(&name, spec.clone());
                        lock.metadata.labels =
                            Some([("chaos-schedule".to_string(), tag.clone())].into());
                        if let Err(e) = api.create(&PostParams::default(), &lock).await {
                            eprintln!("[chaos] seed {seed}: cannot create {name} (retrying): {e}");
                            tokio::time::sleep(ms(500)).await;
                            continue;
                        }
                        let id = format!("{cluster}/{name}");
                        // Held for a while once Acquired, then deleted.
                        while !stop.load(Ordering::SeqCst)
                            && !latest.lock().unwrap().get(&id).is_some_and(|s| s.0)
                        {
                            tokio::time::sleep(ms(50)).await;
                        }
                        let hold = ms(rng.random_range(300..2500));
                        let until = tokio::time::Instant::now() + hold;
                        while !stop.load(Ordering::SeqCst) && tokio::time::Instant::now() < until {
                            tokio::time::sleep(ms(50)).await;
                        }
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        history.let_go(&id);
                        // The Job is done: the object must go (an API server that is
                        // restarting refuses the request; ask until it is taken).
                        while let Err(e) = api.delete(&name, &DeleteParams::default()).await {
                            if matches!(&e, kube::Error::Api(r) if r.code == 404) {
                                break;
                            }
                            tokio::time::sleep(ms(200)).await;
                        }
                        generation += 1;
                    }
                }));
            }
            // The write a gated Job would make: with the status fence, while its
            // DistributedLock says Acquired (every generation, stale ones included).
            let (history, latest, stop) = (history.clone(), latest.clone(), stop.clone());
            let id_prefix = format!("{}/{prefix}", ctl.cluster);
            let key = keys.urls[k].clone();
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let acquired: Vec<(String, u64)> = latest
                        .lock()
                        .unwrap()
                        .iter()
                        .filter(|(id, s)| {
                            id.starts_with(&id_prefix) && s.0 && !history.has_let_go(id)
                        })
                        .map(|(id, s)| (id.clone(), s.1))
                        .collect();
                    for (id, fence) in acquired {
                        history
                            .write_fenced(&key, &id, Kind::Controller, fence)
                            .await;
                    }
                    tokio::time::sleep(ms(100)).await;
                }
            }));
        }
        lock_apis.push((c, api));
    }

    // Engine contenders.
    let mut contender_tasks = Vec::new();
    for spec in &plan.engines {
        let sessions = Arc::new(ZkSessions::with_session_timeout(LEASE));
        for k in (0..plan.keys).filter(|k| spec.key.is_none_or(|only| only == *k)) {
            let lock = engine_backend(backend, &keys, k, spec.slot, &sessions, spec.flaw).await;
            let (history, stop) = (history.clone(), stop.clone());
            let key = keys.urls[k].clone();
            let spec = spec.clone();
            let seed = plan.seed
                ^ ((spec.slot as u64) << 32)
                ^ (k as u64)
                ^ ((spec.contender as u64) << 48);
            contender_tasks.push(tokio::spawn(engine(lock, key, spec, history, stop, seed)));
        }
    }

    // Command-line contenders, writing through the register's door.
    let register_stop = Arc::new(AtomicBool::new(false));
    let (register, register_task) =
        super::cli::serve_register(keys.urls.clone(), history.clone(), register_stop.clone()).await;
    for spec in &plan.clis {
        for k in 0..plan.keys {
            let target = CliTarget::new(
                backend,
                spec.slot,
                &keys.urls[k],
                &format!("/chaos/{}", keys.names[k]),
            );
            let seed = plan.seed ^ (((spec.slot + 8) as u64) << 32) ^ (k as u64);
            contender_tasks.push(tokio::spawn(super::cli::contender(
                spec.clone(),
                target,
                k,
                register,
                history.clone(),
                stop.clone(),
                seed,
            )));
        }
    }

    // Faults.
    let mut fault_tasks = Vec::new();
    for (at, fault) in plan.faults.clone() {
        let history = history.clone();
        let (object_keys, bucket, table) = (
            keys.names
                .iter()
                .map(|n| format!("chaos/{n}"))
                .collect::<Vec<_>>(),
            keys.bucket.clone(),
            keys.table.clone(),
        );
        let item_keys = keys.names.clone();
        fault_tasks.push(tokio::spawn(async move {
            tokio::time::sleep(at).await;
            if let Fault::HolderPause { slot, .. } = fault {
                // Meant for a holder whose guard runs the writer: wait (at most 5 s) until
                // one of the slot's guarded writers has just written.
                let prefix = format!("cli-{slot}-guard-");
                let until = history.now() + 5.0;
                while history.now() < until
                    && !history
                        .last_write_by(&prefix)
                        .is_some_and(|t| history.now() - t < 0.3)
                {
                    tokio::time::sleep(ms(50)).await;
                }
            }
            let t0 = history.now();
            history.record(
                json!({"process": "nemesis", "op": "fault-start", "fault": fault.kind(),
                "detail": format!("{fault:?}"), "invoke": t0}),
            );
            if matches!(fault, Fault::MotoRestart) {
                restart_moto(&bucket, &object_keys, &table, &item_keys).await;
            } else {
                inject(&fault).await;
            }
            history.record(
                json!({"process": "nemesis", "op": "fault-end", "fault": fault.kind(),
                "invoke": t0, "complete": history.now()}),
            );
            history.fault_window(t0, history.now());
        }));
    }
    // Activity continues a little past the last fault's start even with no faults.
    tokio::time::sleep(ms(2000)).await;
    for t in fault_tasks {
        t.await.unwrap();
    }
    tokio::task::spawn_blocking(|| world().heal())
        .await
        .unwrap();
    let healed_at = history.now();
    history.record(json!({"process": "nemesis", "op": "healed", "invoke": healed_at}));

    // Liveness: run on until every key was claimed after healing (bounded).
    let limit = healed_at + plan.liveness_limit.as_secs_f64();
    let settle = if backend == Backend::ZooKeeper {
        CONTROLLER_ZK_SESSION
    } else {
        LEASE
    };
    loop {
        if history.claimed_after(healed_at, &keys.urls) || history.now() > limit {
            break;
        }
        tokio::time::sleep(ms(100)).await;
    }
    // A little more activity on the healed network.
    tokio::time::sleep(settle.min(ms(1000))).await;
    stop.store(true, Ordering::SeqCst);
    for t in contender_tasks {
        let _ = tokio::time::timeout(Duration::from_secs(30), t).await;
    }
    // Nothing of the CLI slots outlives the schedule.
    for slot in &w.clis {
        slot.kill_all();
    }
    register_stop.store(true, Ordering::SeqCst);
    let _ = tokio::time::timeout(Duration::from_secs(30), register_task).await;
    let end = history.now();

    // (e) After healing, each DistributedLock's status agrees with the store.
    agreement(
        &history,
        &plan,
        &keys,
        &lock_apis,
        &format!("chaos-schedule={tag}"),
    )
    .await;

    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    // Clean up: deleting releases (finalizer); fresh keys next time either way.
    for (_, api) in &lock_apis {
        let _ = api
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&format!("chaos-schedule={tag}")),
            )
            .await;
    }

    let report = history.check(
        healed_at,
        end,
        &keys.urls,
        plan.liveness_limit.as_secs_f64(),
    );
    let history_path = w.dir.join("history.jsonl");
    {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&history_path)
            .unwrap();
        history.write_jsonl(&mut f);
    }
    Outcome {
        plan,
        report,
        history_path,
        wall: started.elapsed(),
    }
}

/// The backend spec of controller `c`'s lock on key `k`, through its own proxies.
fn lock_backend(backend: Backend, keys: &Keys, k: usize, c: usize, west_ns: &str) -> BackendSpec {
    let paths = &world().controllers[c].paths;
    let secret = Some(SecretRef {
        name: SECRET_NAME.into(),
    });
    match backend {
        Backend::Lease => BackendSpec {
            kubernetes: Some(KubernetesBackend {
                lease_name: keys.names[k].clone(),
                namespace: Some(west_ns.to_string()),
            }),
            ..Default::default()
        },
        Backend::S3 => BackendSpec {
            s3: Some(S3Backend {
                bucket: keys.bucket.clone(),
                key: format!("chaos/{}", keys.names[k]),
                region: Some(REGION.into()),
                endpoint: Some(paths.moto().endpoint()),
                force_path_style: Some(true),
                s3lock_compatible: None,
                terraform_compatible: None,
                credentials_secret_ref: secret,
            }),
            ..Default::default()
        },
        Backend::DynamoDb => BackendSpec {
            dynamodb: Some(DynamoDbBackend {
                table: keys.table.clone(),
                key: keys.names[k].clone(),
                region: Some(REGION.into()),
                endpoint: Some(paths.moto().endpoint()),
                credentials_secret_ref: secret,
                partition_key_name: "key".into(),
                ..Default::default()
            }),
            ..Default::default()
        },
        Backend::ZooKeeper => BackendSpec {
            zookeeper: Some(ZooKeeperBackend {
                servers: paths.zk().iter().map(|p| p.address()).collect(),
                path: format!("/chaos/{}", keys.names[k]),
                chroot: None,
                session_timeout: None,
            }),
            ..Default::default()
        },
    }
}

/// An S3 or DynamoDB key's engine, through the moto at `endpoint`.
async fn aws_backend(url: &str, endpoint: String) -> Arc<dyn LockBackend> {
    let target = Target::parse(url).unwrap();
    target.connect(&aws_options(endpoint)).await.unwrap()
}

fn aws_options(endpoint: String) -> ConnectOptions {
    ConnectOptions {
        aws: AwsOptions {
            endpoint: Some(endpoint),
            region: Some(REGION.into()),
            credentials: Some(Credentials::new(ACCESS_KEY_ID, SECRET_ACCESS_KEY, None)),
            request_timeout: Some(Duration::from_secs(1)),
        },
        s3: S3Options {
            force_path_style: Some(true),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The lock on key `k` as engine slot `slot` reaches it (through its proxies).
async fn engine_backend(
    backend: Backend,
    keys: &Keys,
    k: usize,
    slot: usize,
    sessions: &ZkSessions,
    flaw: Option<Flaw>,
) -> Arc<dyn LockBackend> {
    let w = world();
    let paths = &w.engines[slot];
    assert!(
        flaw.is_none() || backend == Backend::Lease,
        "flawed engines are built on Leases"
    );
    match backend {
        Backend::Lease => {
            let client = w.engine_kube_client(slot).await;
            let ns = &w.controllers[1].namespace;
            let store = LeaseStore::new(client, ns, &keys.names[k]);
            match flaw {
                Some(flaw) => Arc::new(CasLock::new(Flawed::new(store, flaw))),
                None => Arc::new(CasLock::new(store)),
            }
        }
        Backend::S3 | Backend::DynamoDb => {
            aws_backend(&keys.urls[k], paths.moto().endpoint()).await
        }
        Backend::ZooKeeper => Arc::new(
            sessions
                .lock(&paths.zk_connect(), &format!("/chaos/{}", keys.names[k]))
                .unwrap(),
        ),
    }
}

/// The harness's own view of key `k`: direct, no proxy.
async fn direct_backend(backend: Backend, keys: &Keys, k: usize) -> Arc<dyn LockBackend> {
    let w = world();
    match backend {
        Backend::Lease => {
            let client = w.direct_client(1).await;
            let ns = &w.controllers[1].namespace;
            Arc::new(CasLock::new(LeaseStore::new(client, ns, &keys.names[k])))
        }
        Backend::S3 | Backend::DynamoDb => aws_backend(&keys.urls[k], w.moto().endpoint()).await,
        Backend::ZooKeeper => {
            // A session of its own, per key (and per schedule): never shared with a
            // contender. The lock keeps the session; it closes when the lock is dropped.
            Arc::new(
                ZkSessions::new()
                    .lock(
                        &w.zookeeper().connect_string(),
                        &format!("/chaos/{}", keys.names[k]),
                    )
                    .unwrap(),
            )
        }
    }
}

/// An engine contender: acquire, write to the register while held, release, again.
async fn engine(
    lock: Arc<dyn LockBackend>,
    key: String,
    spec: EngineSpec,
    history: Arc<History>,
    stop: Arc<AtomicBool>,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let permits = spec.permits;
    let who = format!(
        "engine-{}{}{}{}",
        spec.slot,
        if spec.key.is_some() {
            format!("-c{}", spec.contender)
        } else {
            String::new()
        },
        if !permits.is_mutex() && permits.mode == LockMode::Exclusive {
            "-exclusive"
        } else {
            ""
        },
        if spec.ignores_deadline || spec.flaw.is_some() {
            "-broken"
        } else if spec.crashes_holding {
            "-crashes"
        } else {
            ""
        }
    );
    // The permits each write of a holder takes on a key with more than one.
    let weight = match permits.mode {
        _ if permits.is_mutex() => 0,
        LockMode::Exclusive => permits.total,
        LockMode::Shared => spec.queue.map_or(1, |q| q.weight),
    };
    tokio::time::sleep(spec.start_after).await;
    let req = AcquireRequest {
        permits,
        queue: spec.queue,
        ..AcquireRequest::new(format!("{who}/{key}"), LEASE)
    };
    // When this contender began asking for its next permit: an attempt cut short may
    // leave a grant that a later attempt adopts (rule 4), so the grant came after the
    // first attempt since the last acquisition, not necessarily after the last one.
    if spec.crashes_holding {
        crash_holding(lock.as_ref(), &req, &key, &who, &history).await;
        return;
    }
    let mut asking_since = None;
    while !stop.load(Ordering::SeqCst) {
        let invoke = history.now();
        let asked = *asking_since.get_or_insert(invoke);
        let acquired = tokio::time::timeout(
            Duration::from_secs(10),
            HeldLock::acquire(lock.clone(), &req, Wait::For(Duration::from_secs(2))),
        )
        .await;
        let held = match acquired {
            Ok(Ok(h)) => h,
            Ok(Err(e)) => {
                let result = if e.is_transient() { "unknown" } else { "fail" };
                history.failed(&key, &who, "acquire", invoke, result, &e.to_string());
                tokio::time::sleep(ms(rng.random_range(20..200))).await;
                continue;
            }
            Err(_) => {
                history.failed(&key, &who, "acquire", invoke, "unknown", "timed out");
                continue;
            }
        };
        let fence = held.fence().0;
        let nonce = held.nonce().to_string();
        let version = match held.state() {
            HolderState::Held { version, .. } => version.0,
            _ => String::new(),
        };
        asking_since = None;
        let invoke = if permits.is_mutex() { invoke } else { asked };
        history.acquired(&key, &who, invoke, &nonce, fence, &version);
        let start = history.now();
        let mut last_claimed = None;
        let hold_for =
            ms(rng.random_range(spec.hold.0.as_millis() as u64..=spec.hold.1.as_millis() as u64));
        let until = tokio::time::Instant::now() + hold_for;
        loop {
            let state = held.state();
            let claiming = if spec.ignores_deadline {
                matches!(
                    state,
                    HolderState::Held { .. } | HolderState::Expiring { .. }
                )
            } else {
                state.is_held()
            };
            if !claiming {
                break;
            }
            let t = history.now();
            last_claimed = Some(t);
            if permits.is_mutex() {
                history.write_fenced(&key, &who, Kind::Engine, fence).await;
            } else {
                history.write_permit(&key, &who, fence, weight);
            }
            if tokio::time::Instant::now() >= until || stop.load(Ordering::SeqCst) {
                break;
            }
            tokio::time::sleep(ms(100)).await;
        }
        if let Some(end) = last_claimed {
            history.claim(Claim {
                key: key.clone(),
                who: format!("{who} ({})", req.holder),
                nonce: nonce.clone(),
                fence,
                start,
                end,
            });
        }
        let invoke = history.now();
        match tokio::time::timeout(Duration::from_secs(10), held.release()).await {
            Ok(Ok(())) => history.record(json!({"process": who, "op": "release", "key": key,
                "invoke": invoke, "complete": history.now(), "result": "ok", "fence": fence})),
            Ok(Err(e)) => history.failed(&key, &who, "release", invoke, "fail", &e.to_string()),
            Err(_) => history.failed(&key, &who, "release", invoke, "unknown", "timed out"),
        }
        tokio::time::sleep(ms(rng.random_range(50..600))).await;
    }
}

/// A contender that dies holding: one grant (with as many attempts as it takes), then
/// nothing — no renewal, no release, no claim.
async fn crash_holding(
    lock: &dyn LockBackend,
    req: &AcquireRequest,
    key: &str,
    who: &str,
    history: &History,
) {
    let invoke = history.now();
    loop {
        match lock.try_acquire(req).await {
            Ok(Attempt::Acquired(lease)) => {
                let fence = lease.fence().0;
                history.acquired(key, who, invoke, lease.nonce(), fence, "");
                return;
            }
            Ok(Attempt::Busy { .. }) | Err(_) => tokio::time::sleep(ms(50)).await,
        }
    }
}

/// An entry of a queued set as the checker sees it.
fn queued_entry(e: &SetEntry) -> QueuedEntry {
    QueuedEntry {
        nonce: e.nonce.clone(),
        holder: e.holder.clone(),
        ticket: e.ticket,
        priority: e.priority,
        revision: e.revision.clone(),
        lease: e.lease(),
    }
}

/// Held while proxy modes change, and for the whole of a moto restart (whose
/// blackhole of every path must not be healed by a network fault ending meanwhile).
static NETWORK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Injects `fault`, waits its duration, heals it.
async fn inject(fault: &Fault) {
    let fault = fault.clone();
    let paths_of = |c: Contender| match c {
        Contender::Engine(s) => &world().engines[s],
        Contender::Controller(c) => &world().controllers[c].paths,
        Contender::Cli(s) => &world().clis[s].paths,
        Contender::Guard(s) => &world().clis[s].guard_paths,
    };
    match fault {
        Fault::ControllerKill { controller, down } => {
            tokio::task::spawn_blocking(move || world().controllers[controller].kill())
                .await
                .unwrap();
            tokio::time::sleep(down).await;
            tokio::task::spawn_blocking(move || world().controllers[controller].ensure_running())
                .await
                .unwrap();
        }
        Fault::ControllerPause { controller, pause } => {
            world().controllers[controller].signal(libc::SIGSTOP);
            tokio::time::sleep(pause).await;
            world().controllers[controller].signal(libc::SIGCONT);
        }
        Fault::Network {
            target,
            mode,
            lasts,
        } => {
            let paths = paths_of(target);
            {
                let _net = NETWORK.lock().await;
                for p in paths.all() {
                    p.set_mode(mode);
                }
            }
            tokio::time::sleep(lasts).await;
            let _net = NETWORK.lock().await;
            paths.heal();
        }
        Fault::SessionExpiry { target, lasts } => {
            let paths = paths_of(target);
            {
                let _net = NETWORK.lock().await;
                for p in paths.zk() {
                    p.set_mode(Mode::Blackhole);
                }
            }
            tokio::time::sleep(lasts).await;
            let _net = NETWORK.lock().await;
            for p in paths.zk() {
                p.set_mode(Mode::Pass);
            }
        }
        Fault::MotoPause { lasts } => {
            world().moto().pause();
            tokio::time::sleep(lasts).await;
            world().moto().resume();
        }
        Fault::ZkNodeRestart { node, down } => {
            tokio::task::spawn_blocking(move || world().zookeeper().stop_node(node))
                .await
                .unwrap();
            tokio::time::sleep(down).await;
            tokio::task::spawn_blocking(move || world().zookeeper().start_node(node))
                .await
                .unwrap();
        }
        Fault::ZkQuorumLoss { down } => {
            tokio::task::spawn_blocking(|| {
                world().zookeeper().stop_node(0);
                world().zookeeper().stop_node(1);
            })
            .await
            .unwrap();
            tokio::time::sleep(down).await;
            tokio::task::spawn_blocking(|| {
                let zk = world().zookeeper();
                zk.start_node(0);
                zk.start_node(1);
                zk.wait_ready();
            })
            .await
            .unwrap();
        }
        Fault::MotoRestart => unreachable!("needs the schedule's keys: restart_moto"),
        Fault::ApiServerRestart => {
            tokio::task::spawn_blocking(|| world().restart_west_apiserver())
                .await
                .unwrap();
        }
        Fault::ApiServerPause { lasts } => {
            world().signal_west_apiserver(libc::SIGSTOP);
            tokio::time::sleep(lasts).await;
            world().signal_west_apiserver(libc::SIGCONT);
        }
        Fault::CliKill { slot } => {
            world().clis[slot].kill_all();
        }
        Fault::HolderPause { slot, lasts } => {
            let until = tokio::time::Instant::now() + lasts;
            while tokio::time::Instant::now() < until {
                world().clis[slot].stop_holders();
                tokio::time::sleep(ms(50)).await;
            }
            world().clis[slot].continue_holders();
        }
    }
}

/// A durable store restarting: moto keeps everything in memory, so the harness
/// cuts every contender off (blackholes their proxies: no reply of a request that
/// lands from now on can reach them), reads this schedule's records, kills moto,
/// starts it again and writes the records back byte for byte (S3 ETags are the MD5
/// of the body, so they come back the same; DynamoDB items keep every attribute).
/// What a contender saw acknowledged survives, as on a real S3 or DynamoDB.
async fn restart_moto(bucket: &str, objects: &[String], table: &str, items: &[String]) {
    // No network fault may heal a path while the store is being restored.
    let _net = NETWORK.lock().await;
    let w = world();
    let proxies: Vec<&crate::support::proxy::Proxy> = w
        .engines
        .iter()
        .chain(w.controllers.iter().map(|c| &c.paths))
        .chain(w.clis.iter().flat_map(|c| [&c.paths, &c.guard_paths]))
        .map(|p| p.moto())
        .collect();
    let modes: Vec<Mode> = proxies.iter().map(|p| p.mode()).collect();
    for p in &proxies {
        p.set_mode(Mode::Blackhole);
    }
    tokio::time::sleep(ms(200)).await;
    let s3 = w.moto().s3_client().await;
    let dynamo = w.moto().dynamodb_client().await;
    let mut bodies = Vec::new();
    for key in objects {
        let got = s3.get_object().bucket(bucket).key(key).send().await;
        if let Ok(got) = got {
            let body = got.body.collect().await.expect("read S3 body").into_bytes();
            bodies.push((key.clone(), body));
        }
    }
    let mut saved_items = Vec::new();
    for key in items {
        let got = dynamo
            .get_item()
            .table_name(table)
            .key(
                "key",
                aws_sdk_dynamodb::types::AttributeValue::S(key.clone()),
            )
            .consistent_read(true)
            .send()
            .await
            .expect("read DynamoDB item");
        if let Some(item) = got.item {
            saved_items.push(item);
        }
    }
    tokio::task::spawn_blocking(|| world().moto().restart())
        .await
        .unwrap();
    let s3 = w.moto().s3_client().await;
    let dynamo = w.moto().dynamodb_client().await;
    s3.create_bucket()
        .bucket(bucket)
        .send()
        .await
        .expect("recreate the bucket");
    create_table(&dynamo, table).await;
    for (key, body) in bodies {
        s3.put_object()
            .bucket(bucket)
            .key(&key)
            .body(body.into())
            .send()
            .await
            .expect("restore an S3 record");
    }
    for item in saved_items {
        dynamo
            .put_item()
            .table_name(table)
            .set_item(Some(item))
            .send()
            .await
            .expect("restore a DynamoDB item");
    }
    for (p, m) in proxies.iter().zip(modes) {
        p.set_mode(m);
    }
}

/// Creates the on-demand table `table` with the string partition key `key`.
async fn create_table(client: &aws_sdk_dynamodb::Client, table: &str) {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    };
    client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("key")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("key")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .expect("recreate the table");
}

/// (e): once healed and the engine clients gone, every DistributedLock that says
/// Acquired=True names the record in the store (nonce and fence), and a record held
/// by a DistributedLock's identity is reported by that lock. Waits up to 40 s for the
/// controllers to converge; a disagreement that outlasts that is a violation.
async fn agreement(
    history: &History,
    plan: &Plan,
    keys: &Keys,
    lock_apis: &[(usize, Api<DistributedLock>)],
    label: &str,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    let mut direct = Vec::new();
    for k in 0..plan.keys {
        direct.push(direct_backend(plan.backend, keys, k).await);
    }
    loop {
        let mut problems = Vec::new();
        for (k, backend) in direct.iter().enumerate() {
            let record = match tokio::time::timeout(Duration::from_secs(2), backend.inspect()).await
            {
                Ok(Ok(r)) => r.and_then(|s| s.record.ok()),
                _ => {
                    problems.push(format!("cannot read {}", keys.urls[k]));
                    continue;
                }
            };
            for (c, api) in lock_apis {
                let prefix = format!("{}-{}-g", world().controllers[*c].cluster, keys.names[k]);
                let Ok(list) = api.list(&ListParams::default().labels(label)).await else {
                    problems.push(format!("cannot list locks of {}", keys.urls[k]));
                    continue;
                };
                for lock in list.items.iter().filter(|l| {
                    l.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.starts_with(&prefix))
                }) {
                    let name = lock.metadata.name.clone().unwrap_or_default();
                    if lock.metadata.deletion_timestamp.is_some() {
                        problems.push(format!("{name} is still being deleted"));
                        continue;
                    }
                    let status = lock.status.clone().unwrap_or_default();
                    let acquired = conditions::is_true(&status.conditions, ACQUIRED);
                    let holder = world().controllers[*c].holder(&name);
                    let in_store = record
                        .as_ref()
                        .filter(|r| r.state == LockState::Held && r.holder == holder);
                    match (acquired, in_store) {
                        (true, Some(r))
                            if status.nonce.as_deref() == Some(r.nonce.as_str())
                                && status.fence == Some(r.fence.0 as i64) => {}
                        (false, None) => {}
                        _ => problems.push(format!(
                            "{name}: status Acquired={acquired} fence {:?} nonce {:?}, store {} has {:?}",
                            status.fence,
                            status.nonce,
                            keys.urls[k],
                            record.as_ref().map(|r| (&r.holder, r.fence.0, &r.nonce, r.state))
                        )),
                    }
                }
            }
        }
        if problems.is_empty() {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            for p in problems {
                history.violation(format!(
                    "seed {}: (e) status disagrees with the store after healing: {p}",
                    plan.seed
                ));
            }
            return;
        }
        tokio::time::sleep(ms(100)).await;
    }
}

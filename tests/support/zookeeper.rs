//! Apache ZooKeeper: a single node, or a 3-node ensemble, on free loopback ports.
//!
//! `ZooKeeper::shared()` / `ZooKeeper::ensemble_shared()` are started once per test
//! binary (tests isolate themselves under unique paths); `ZooKeeper::start()` /
//! `ZooKeeper::start_ensemble()` give a private server for tests that stop, pause or
//! restart nodes. Data directories survive a node's stop/start, so a restarted node
//! rejoins with its state, like a real crash and restart.
//!
//! Timing is scaled down so session-expiry tests are quick: `tickTime` 250 ms,
//! `minSessionTimeout` 500 ms (a client may ask for more, up to 60 s). The ensemble's
//! `initLimit` / `syncLimit` stay generous in wall-clock terms (20 s / 5 s) because a
//! JVM on a loaded 2-core machine stalls for seconds at a time.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::{
    ServerProcess, claim_slot, free_port, slot_is_running, slot_log_tail, tool, unique_suffix,
    wait_until, work_dir,
};

pub const TICK_TIME: Duration = Duration::from_millis(250);
/// The smallest session timeout the servers grant.
pub const MIN_SESSION_TIMEOUT: Duration = Duration::from_millis(500);
/// Session timeout of [`ZooKeeper::connect`]: long enough that a busy machine does
/// not expire a session by accident, for tests that are not about expiry.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// JVM start plus (for an ensemble) leader election, on a loaded 2-core machine.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(180);

/// A ZooKeeper deployment: one standalone node or a quorum ensemble.
pub struct ZooKeeper {
    nodes: Vec<ZkNode>,
}

/// One ZooKeeper server process with its own config, data directory and ports.
pub struct ZkNode {
    /// `myid`, 1-based.
    id: u32,
    client_port: u16,
    dir: PathBuf,
    config: PathBuf,
    /// `None` while stopped.
    process: Mutex<Option<ServerProcess>>,
    /// SIGSTOPped: alive but cannot answer, so readiness checks skip it.
    paused: AtomicBool,
    starts: AtomicU32,
}

impl ZooKeeper {
    /// The single-node server shared by every test in this binary.
    pub fn shared() -> &'static ZooKeeper {
        static SHARED: OnceLock<ZooKeeper> = OnceLock::new();
        SHARED.get_or_init(|| ZooKeeper::launch("zk-shared", 1))
    }

    /// The 3-node ensemble shared by every test in this binary.
    pub fn ensemble_shared() -> &'static ZooKeeper {
        static SHARED: OnceLock<ZooKeeper> = OnceLock::new();
        SHARED.get_or_init(|| ZooKeeper::launch("zk-ensemble-shared", 3))
    }

    /// A private single-node server, killed on drop.
    pub fn start() -> ZooKeeper {
        ZooKeeper::launch(&format!("zk-{}", unique_suffix()), 1)
    }

    /// A private 3-node ensemble, killed on drop.
    pub fn start_ensemble() -> ZooKeeper {
        ZooKeeper::launch(&format!("zk-ensemble-{}", unique_suffix()), 3)
    }

    fn launch(name: &str, size: usize) -> ZooKeeper {
        let began = Instant::now();
        // (client, quorum, election) port per node, all chosen before any config is
        // written because every node's config lists every peer.
        let ports: Vec<(u16, u16, u16)> = (0..size)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        let peers: String = ports
            .iter()
            .enumerate()
            .map(|(i, (_, quorum, election))| {
                format!("server.{}=127.0.0.1:{quorum}:{election}\n", i + 1)
            })
            .collect();
        let nodes = ports
            .iter()
            .enumerate()
            .map(|(i, &(client_port, _, _))| {
                let id = i as u32 + 1;
                let dir = work_dir(&format!("{name}/node-{id}"));
                let data = dir.join("data");
                std::fs::create_dir_all(&data).expect("create zookeeper data dir");
                std::fs::write(data.join("myid"), format!("{id}\n")).expect("write myid");
                let config = dir.join("zoo.cfg");
                let quorum = if size > 1 { peers.as_str() } else { "" };
                std::fs::write(&config, node_config(&data, client_port, quorum))
                    .expect("write zoo.cfg");
                ZkNode {
                    id,
                    client_port,
                    dir,
                    config,
                    process: Mutex::new(None),
                    paused: AtomicBool::new(false),
                    starts: AtomicU32::new(0),
                }
            })
            .collect();
        let zk = ZooKeeper { nodes };
        // Launch every JVM before waiting on any: an ensemble node cannot serve until
        // a majority of its peers is up.
        for node in &zk.nodes {
            node.spawn();
        }
        zk.wait_ready();
        eprintln!(
            "[support] {name} ({size} node{}) ready at {} after {:?}",
            if size == 1 { "" } else { "s" },
            zk.connect_string(),
            began.elapsed()
        );
        zk
    }

    /// `127.0.0.1:P1,127.0.0.1:P2,...` for a client's connect string.
    pub fn connect_string(&self) -> String {
        self.nodes
            .iter()
            .map(ZkNode::address)
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn nodes(&self) -> &[ZkNode] {
        &self.nodes
    }

    /// Node by 0-based index (its `myid` is `index + 1`).
    pub fn node(&self, index: usize) -> &ZkNode {
        &self.nodes[index]
    }

    /// The node that currently reports `Mode: leader` (`standalone` for one node).
    pub fn leader(&self) -> Option<&ZkNode> {
        self.nodes
            .iter()
            .find(|n| matches!(n.mode().as_deref(), Some("leader") | Some("standalone")))
    }

    /// A node that currently reports `Mode: follower`.
    pub fn follower(&self) -> Option<&ZkNode> {
        self.nodes
            .iter()
            .find(|n| n.mode().as_deref() == Some("follower"))
    }

    /// Waits until every running, unpaused node serves clients and, for an ensemble,
    /// exactly one of them is the leader. Call after stopping or restarting nodes when
    /// the test needs the quorum back. Panics if a majority is not running.
    pub fn wait_ready(&self) {
        let live: Vec<&ZkNode> = self.nodes.iter().filter(|n| n.is_live()).collect();
        assert!(
            live.len() * 2 > self.nodes.len(),
            "only {} of {} ZooKeeper nodes are running; no quorum to wait for",
            live.len(),
            self.nodes.len()
        );
        for node in &live {
            node.wait_serving();
        }
        if self.nodes.len() > 1 {
            // Each node answered leader/follower, but during an election one may still
            // report a stale role; wait until they agree on a single leader.
            let deadline = Instant::now() + STARTUP_TIMEOUT;
            loop {
                let modes: Vec<Option<String>> = live.iter().map(|n| n.mode()).collect();
                let leaders = modes
                    .iter()
                    .filter(|m| m.as_deref() == Some("leader"))
                    .count();
                let followers = modes
                    .iter()
                    .filter(|m| m.as_deref() == Some("follower"))
                    .count();
                if leaders == 1 && leaders + followers == live.len() {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "ZooKeeper ensemble has no single leader after {STARTUP_TIMEOUT:?}: modes {modes:?}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Starts stopped node `index` again with the same config and data. Waits until it
    /// serves clients when a majority of the deployment is then running; otherwise it
    /// cannot serve yet, and this returns once it is launched.
    pub fn start_node(&self, index: usize) {
        let node = &self.nodes[index];
        node.spawn();
        let live = self.nodes.iter().filter(|n| n.is_live()).count();
        if live * 2 > self.nodes.len() {
            node.wait_serving();
        }
    }

    /// Kills node `index` (SIGKILL, like a crash); its data directory is kept.
    pub fn stop_node(&self, index: usize) {
        self.nodes[index].stop();
    }

    /// [`ZooKeeper::stop_node`] then [`ZooKeeper::start_node`].
    pub fn restart_node(&self, index: usize) {
        self.stop_node(index);
        self.start_node(index);
    }

    /// Freezes node `index` (SIGSTOP); see [`ZkNode::pause`].
    pub fn pause_node(&self, index: usize) {
        self.nodes[index].pause();
    }

    /// Resumes node `index` (SIGCONT).
    pub fn resume_node(&self, index: usize) {
        self.nodes[index].resume();
    }

    /// A client session on the whole deployment with [`DEFAULT_SESSION_TIMEOUT`].
    pub async fn connect(&self) -> zookeeper_client::Client {
        self.connect_with_session_timeout(DEFAULT_SESSION_TIMEOUT)
            .await
    }

    /// A client session with the given session timeout (the server clamps it to
    /// [`MIN_SESSION_TIMEOUT`] ..= 60 s).
    pub async fn connect_with_session_timeout(
        &self,
        timeout: Duration,
    ) -> zookeeper_client::Client {
        connect_to(&self.connect_string(), timeout).await
    }
}

/// Connects a client to an arbitrary connect string (e.g. a fault proxy's address).
pub async fn connect_to(
    connect_string: &str,
    session_timeout: Duration,
) -> zookeeper_client::Client {
    use futures::FutureExt;
    let connecting = zookeeper_client::Client::connector()
        .with_session_timeout(session_timeout)
        .connect(connect_string);
    // zookeeper-client spawns its session task through `asyncs`, which panics with a
    // bare "no spawner" unless the crate's `tokio` feature is enabled; say so.
    match std::panic::AssertUnwindSafe(connecting)
        .catch_unwind()
        .await
    {
        Ok(Ok(client)) => client,
        Ok(Err(e)) => panic!("cannot connect to ZooKeeper at {connect_string}: {e}"),
        Err(panic) => match panic
            .downcast_ref::<&str>()
            .copied()
            .or(panic.downcast_ref::<String>().map(String::as_str))
        {
            Some("no spawner") => panic!(
                "zookeeper-client has no task spawner: Cargo.toml must enable its `tokio` \
                 feature (zookeeper-client = {{ version = \"0.11\", features = [\"tokio\"] }})"
            ),
            _ => std::panic::resume_unwind(panic),
        },
    }
}

impl ZkNode {
    /// `myid`, 1-based.
    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn port(&self) -> u16 {
        self.client_port
    }

    /// `127.0.0.1:PORT` of this node's client port.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// Kills the node (SIGKILL, like a crash). Its data directory is kept; start it
    /// again with [`ZooKeeper::start_node`].
    pub fn stop(&self) {
        if let Some(mut server) = self.process.lock().unwrap().take() {
            server.kill();
        }
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Freezes the JVM (SIGSTOP): connections stay open but nothing is answered, and
    /// its peers stop hearing from it (a leader loses leadership after `syncLimit`).
    pub fn pause(&self) {
        if let Some(server) = self.process.lock().unwrap().as_ref() {
            server.signal(libc::SIGSTOP);
            self.paused.store(true, Ordering::SeqCst);
        }
    }

    /// Resumes a paused node (SIGCONT).
    pub fn resume(&self) {
        if let Some(server) = self.process.lock().unwrap().as_ref() {
            server.signal(libc::SIGCONT);
            self.paused.store(false, Ordering::SeqCst);
        }
    }

    pub fn is_running(&self) -> bool {
        slot_is_running(&self.process)
    }

    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    fn is_live(&self) -> bool {
        self.is_running() && !self.is_paused()
    }

    /// The `Mode:` line of `srvr` (`standalone`, `leader`, `follower`, ...), or `None`
    /// when the node does not answer or is not serving clients.
    pub fn mode(&self) -> Option<String> {
        let out = self.four_letter("srvr").ok()?;
        out.lines()
            .find_map(|l| l.strip_prefix("Mode: "))
            .map(|m| m.trim().to_string())
    }

    /// Sends a four-letter-word command (`ruok`, `srvr`, `stat`, `cons`, `dump`, ...)
    /// and returns the reply. All commands are allowed by `zk-server`.
    pub fn four_letter(&self, cmd: &str) -> io::Result<String> {
        four_letter(self.client_port, cmd)
    }

    pub fn log_tail(&self, lines: usize) -> String {
        slot_log_tail(&self.process, lines)
    }

    fn spawn(&self) {
        let (mut slot, n) = claim_slot(
            &self.process,
            &self.starts,
            &format!("ZooKeeper node {}", self.id),
        );
        let mut cmd = Command::new(tool("ZOOKEEPER_SERVER"));
        cmd.arg(&self.config);
        *slot = Some(ServerProcess::start(
            &format!("zookeeper-{n}"),
            cmd,
            &self.dir,
        ));
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Waits until `srvr` reports a serving mode.
    fn wait_serving(&self) {
        let mut slot = self.process.lock().unwrap();
        let server = slot
            .as_mut()
            .unwrap_or_else(|| panic!("ZooKeeper node {} is stopped", self.id));
        let port = self.client_port;
        wait_until(
            server,
            STARTUP_TIMEOUT,
            "ZooKeeper to serve clients (srvr Mode:)",
            || {
                four_letter(port, "srvr").is_ok_and(|out| {
                    out.lines().any(|l| {
                        matches!(
                            l.strip_prefix("Mode: ").map(str::trim),
                            Some("standalone" | "leader" | "follower")
                        )
                    })
                })
            },
        );
    }
}

/// One four-letter-word exchange: the server writes its answer and closes.
fn four_letter(port: u16, cmd: &str) -> io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(cmd.as_bytes())?;
    let mut out = String::new();
    stream.read_to_string(&mut out)?;
    Ok(out)
}

fn node_config(data: &std::path::Path, client_port: u16, peers: &str) -> String {
    format!(
        "\
tickTime={tick}
minSessionTimeout={min}
maxSessionTimeout=60000
initLimit=80
syncLimit=20
dataDir={data}
clientPort={client_port}
clientPortAddress=127.0.0.1
# Every test connects from 127.0.0.1; the default cap of 60 per address is too low.
maxClientCnxns=0
# Every four-letter command: tests look for watches (wchp), the benchmarks count
# requests (mntr: zk_packets_received), readiness uses srvr.
4lw.commands.whitelist=*
# 4 MB transaction-log preallocation instead of 64 MB per node.
preAllocSize=4096
# Kill -9 keeps the page cache, so skipping fsync loses nothing a test can observe
# and keeps write latency sane next to a cargo build.
forceSync=no
{peers}",
        tick = TICK_TIME.as_millis(),
        min = MIN_SESSION_TIMEOUT.as_millis(),
        data = data.display(),
    )
}

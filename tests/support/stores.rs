//! Which server plays S3 and which plays DynamoDB.
//!
//! Tests reach moto, versitygw and dynalite the same way, through their endpoint and
//! the client helpers of `support::moto`. [`AwsServer`] names what a test needs of any
//! of them; [`s3_shared`] and [`dynamodb_shared`] pick the shared server by
//! environment variable, so the engine's semantics tests can be run against another
//! store without changing the suite's default (moto):
//!
//! - `LOCKWARDEN_S3_SERVER`: `moto` (default) or `versitygw`;
//! - `LOCKWARDEN_DYNAMODB_SERVER`: `moto` (default) or `dynalite`.
//!
//! `benches/lockwarden` reads the same two variables for its S3 and DynamoDB servers.

use std::any::Any;
use std::marker::PhantomData;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::dynalite::Dynalite;
use super::moto::Moto;
use super::versitygw::VersityGw;
use super::{ServerProcess, free_port, http_answers, unique_suffix, wait_until, work_dir};

/// A server speaking the S3 and/or the DynamoDB API on a loopback port.
pub trait AwsServer: Send + Sync {
    /// What reports call it.
    fn name(&self) -> &'static str;
    fn port(&self) -> u16;
    /// The server's process id while it runs (benchmarks read its CPU time).
    fn pid(&self) -> Option<u32>;
    /// `http://127.0.0.1:PORT`.
    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port())
    }
}

impl AwsServer for Moto {
    fn name(&self) -> &'static str {
        "moto-atomic"
    }
    fn port(&self) -> u16 {
        Moto::port(self)
    }
    fn pid(&self) -> Option<u32> {
        Moto::pid(self)
    }
}

// ---------------------------------------------------------------------------------
// versitygw and dynalite: one process, started once, that needs nothing but its
// command line (moto, which tests stop and restart, has its own `Moto`).

/// How to start one kind of [`LoopbackServer`].
pub trait Launch: Send + Sync + 'static {
    /// What logs and reports call it; also its work directories' prefix.
    const NAME: &'static str;
    /// The command that serves HTTP on `127.0.0.1:port` with its data under `dir`.
    fn command(port: u16, dir: &Path) -> Command;
}

/// Generous for a loaded 2-core machine: either server answers within a second or two
/// when the machine is quiet.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// One server process on a loopback port, ready once it answers HTTP on `/`; killed
/// when dropped.
pub struct LoopbackServer<L: Launch> {
    port: u16,
    server: ServerProcess,
    launch: PhantomData<L>,
}

impl<L: Launch> LoopbackServer<L> {
    /// The server shared by every test in this binary, started on first use.
    pub fn shared() -> &'static Self {
        // One static for every kind (a static in a generic fn is not one per kind):
        // each kind's server, leaked so that it lives as long as the binary.
        static SHARED: Mutex<Vec<&'static (dyn Any + Send + Sync)>> = Mutex::new(Vec::new());
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(server) = shared.iter().find_map(|s| s.downcast_ref::<Self>()) {
            return server;
        }
        let server: &'static Self =
            Box::leak(Box::new(Self::start_named(&format!("{}-shared", L::NAME))));
        shared.push(server);
        server
    }

    /// A private server with its own data directory.
    pub fn start() -> Self {
        Self::start_named(&format!("{}-{}", L::NAME, unique_suffix()))
    }

    fn start_named(name: &str) -> Self {
        let port = free_port();
        let dir = work_dir(name);
        let began = Instant::now();
        let mut server = ServerProcess::start(name, L::command(port, &dir), &dir);
        wait_until(
            &mut server,
            STARTUP_TIMEOUT,
            &format!("{} to answer HTTP", L::NAME),
            || http_answers(port, "/"),
        );
        eprintln!(
            "[support] {} ready on port {port} after {:?}",
            L::NAME,
            began.elapsed()
        );
        LoopbackServer {
            port,
            server,
            launch: PhantomData,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT`, for `endpoint_url`.
    pub fn endpoint(&self) -> String {
        AwsServer::endpoint(self)
    }

    /// The server's log (for failure messages).
    pub fn log_tail(&self, lines: usize) -> String {
        self.server.log_tail(lines)
    }
}

impl<L: Launch> AwsServer for LoopbackServer<L> {
    fn name(&self) -> &'static str {
        L::NAME
    }
    fn port(&self) -> u16 {
        self.port
    }
    fn pid(&self) -> Option<u32> {
        Some(self.server.pid())
    }
}

/// One of the servers, named but not started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    Moto,
    VersityGw,
    Dynalite,
}

impl Choice {
    fn named(variable: &str, allowed: &[(&str, Choice)]) -> Choice {
        let name = std::env::var(variable).unwrap_or_else(|_| "moto".into());
        allowed
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, c)| *c)
            .unwrap_or_else(|| {
                let names: Vec<&str> = allowed.iter().map(|(n, _)| *n).collect();
                panic!("{variable}={name:?}: expected one of {names:?}")
            })
    }

    /// The server shared by this test binary, started on first use.
    pub fn shared(self) -> &'static dyn AwsServer {
        match self {
            Choice::Moto => Moto::shared(),
            Choice::VersityGw => VersityGw::shared(),
            Choice::Dynalite => Dynalite::shared(),
        }
    }

    /// A private server, stopped when dropped.
    pub fn start(self) -> Box<dyn AwsServer> {
        match self {
            Choice::Moto => Box::new(Moto::start()),
            Choice::VersityGw => Box::new(VersityGw::start()),
            Choice::Dynalite => Box::new(Dynalite::start()),
        }
    }

    /// Whether it answers one request at a time (moto-atomic), so that a test that
    /// loads it should have a private one.
    pub fn serializes_requests(self) -> bool {
        self == Choice::Moto
    }
}

/// How many rounds a race of writers against one of these servers runs (the canary's,
/// the fenced objects'): `variable`, 100 unless it says.
pub fn race_rounds<T: std::str::FromStr + From<u8>>(variable: &str) -> T {
    std::env::var(variable)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| T::from(100))
}

/// The S3 server (`LOCKWARDEN_S3_SERVER`), not started yet.
pub fn s3_choice() -> Choice {
    Choice::named(
        "LOCKWARDEN_S3_SERVER",
        &[("moto", Choice::Moto), ("versitygw", Choice::VersityGw)],
    )
}

/// The DynamoDB server (`LOCKWARDEN_DYNAMODB_SERVER`), not started yet.
pub fn dynamodb_choice() -> Choice {
    Choice::named(
        "LOCKWARDEN_DYNAMODB_SERVER",
        &[("moto", Choice::Moto), ("dynalite", Choice::Dynalite)],
    )
}

/// The S3 server for tests that load one key with many contenders: versitygw unless
/// `LOCKWARDEN_S3_SERVER` names another. moto-atomic answers one request at a time and
/// takes minutes for what versitygw does in seconds; both pass the canary.
pub fn s3_choice_for_load() -> Choice {
    if std::env::var_os("LOCKWARDEN_S3_SERVER").is_some() {
        s3_choice()
    } else {
        Choice::VersityGw
    }
}

/// The DynamoDB server for tests that load one key: dynalite unless
/// `LOCKWARDEN_DYNAMODB_SERVER` names another (see [`s3_choice_for_load`]).
pub fn dynamodb_choice_for_load() -> Choice {
    if std::env::var_os("LOCKWARDEN_DYNAMODB_SERVER").is_some() {
        dynamodb_choice()
    } else {
        Choice::Dynalite
    }
}

/// The shared S3 server of this test binary (`LOCKWARDEN_S3_SERVER`).
pub fn s3_shared() -> &'static dyn AwsServer {
    s3_choice().shared()
}

/// The shared DynamoDB server of this test binary (`LOCKWARDEN_DYNAMODB_SERVER`).
pub fn dynamodb_shared() -> &'static dyn AwsServer {
    dynamodb_choice().shared()
}

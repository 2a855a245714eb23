//! dynalite: the DynamoDB API on LevelDB (Node.js).
//!
//! dynalite ignores credentials and signatures, so every DynamoDB client helper of
//! `support::moto` (`dynamodb_client_for`, `new_table_at`, …) works against
//! [`Dynalite::endpoint`] unchanged. It applies a conditional write under a per-item
//! lock (read, check the condition, write), so it needs no serializing launcher:
//! `tests/canary.rs` races it like moto.
//!
//! What it does not do (4.0.0): `ReturnValuesOnConditionCheckFailure` is ignored, so a
//! failed condition carries no item (lockwarden's DynamoDB store then reads the record
//! on its next attempt instead of using the returned one).
//!
//! Data lives in `<work dir>/data` (LevelDB). Tables stay CREATING/DELETING for 0 ms
//! instead of dynalite's default 500 ms.

use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{ServerProcess, free_port, http_answers, tool, unique_suffix, wait_until, work_dir};

/// Node starts in about a second when the machine is quiet.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// One dynalite process on a loopback port; killed when dropped.
pub struct Dynalite {
    port: u16,
    pub(super) server: ServerProcess,
}

impl Dynalite {
    /// The server shared by every test in this binary, started on first use.
    pub fn shared() -> &'static Dynalite {
        static SHARED: OnceLock<Dynalite> = OnceLock::new();
        SHARED.get_or_init(|| Dynalite::start_named("dynalite-shared"))
    }

    /// A private server with its own data directory.
    pub fn start() -> Dynalite {
        Dynalite::start_named(&format!("dynalite-{}", unique_suffix()))
    }

    fn start_named(name: &str) -> Dynalite {
        let port = free_port();
        let dir = work_dir(name);
        let mut cmd = Command::new(tool("DYNALITE"));
        cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .arg("--path")
            .arg(dir.join("data"))
            .args(["--createTableMs", "0", "--deleteTableMs", "0"])
            .args(["--updateTableMs", "0"]);
        let began = Instant::now();
        let mut server = ServerProcess::start(name, cmd, &dir);
        wait_until(
            &mut server,
            STARTUP_TIMEOUT,
            "dynalite to answer HTTP",
            || http_answers(port, "/"),
        );
        eprintln!(
            "[support] dynalite ready on port {port} after {:?}",
            began.elapsed()
        );
        Dynalite { port, server }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT`, for `endpoint_url`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The server's log (for failure messages).
    pub fn log_tail(&self, lines: usize) -> String {
        self.server.log_tail(lines)
    }
}

//! versitygw: an S3 gateway storing objects as files in a POSIX directory.
//!
//! Started with the root credentials the moto clients already send
//! ([`moto::ACCESS_KEY_ID`](super::moto::ACCESS_KEY_ID)), region
//! [`moto::REGION`](super::moto::REGION), so every S3 client helper of
//! `support::moto` (`s3_client_for`, `new_bucket_at`, …) works against
//! [`VersityGw::endpoint`] unchanged. Unlike moto it checks SigV4 signatures, and it
//! evaluates `If-Match`/`If-None-Match` again under a per-object lock when it publishes
//! the write (backend/posix in v1.8.0), so it needs no serializing launcher:
//! `tests/canary.rs` races it like moto.
//!
//! Objects live in `<work dir>/root` (one directory per bucket; ETags and metadata in
//! extended attributes, which the filesystem must support).

use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::moto::{ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY};
use super::{ServerProcess, free_port, http_answers, tool, unique_suffix, wait_until, work_dir};

/// A Go binary: it answers within a second when the machine is quiet.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// One versitygw process on a loopback port; killed when dropped.
pub struct VersityGw {
    port: u16,
    pub(super) server: ServerProcess,
}

impl VersityGw {
    /// The gateway shared by every test in this binary, started on first use.
    pub fn shared() -> &'static VersityGw {
        static SHARED: OnceLock<VersityGw> = OnceLock::new();
        SHARED.get_or_init(|| VersityGw::start_named("versitygw-shared"))
    }

    /// A private gateway with its own directory.
    pub fn start() -> VersityGw {
        VersityGw::start_named(&format!("versitygw-{}", unique_suffix()))
    }

    fn start_named(name: &str) -> VersityGw {
        let port = free_port();
        let dir = work_dir(name);
        let root = dir.join("root");
        std::fs::create_dir_all(&root).expect("create versitygw root directory");
        let mut cmd = Command::new(tool("VERSITYGW"));
        cmd.args(["--access", ACCESS_KEY_ID, "--secret", SECRET_ACCESS_KEY])
            .args(["--region", REGION, "--port", &format!("127.0.0.1:{port}")])
            .arg("posix")
            .arg(&root);
        let began = Instant::now();
        let mut server = ServerProcess::start(name, cmd, &dir);
        wait_until(
            &mut server,
            STARTUP_TIMEOUT,
            "versitygw to answer HTTP",
            || http_answers(port, "/"),
        );
        eprintln!(
            "[support] versitygw ready on port {port} after {:?}",
            began.elapsed()
        );
        VersityGw { port, server }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT`, for `endpoint_url` (path-style addressing).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The server's log (for failure messages).
    pub fn log_tail(&self, lines: usize) -> String {
        self.server.log_tail(lines)
    }
}

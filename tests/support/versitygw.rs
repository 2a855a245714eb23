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

use std::path::Path;
use std::process::Command;

use super::moto::{ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY};
use super::stores::{Launch, LoopbackServer};
use super::tool;

/// One versitygw process on a loopback port (path-style addressing); killed when
/// dropped.
pub type VersityGw = LoopbackServer<VersityGwCommand>;

/// How versitygw is started (a Go binary: it answers within a second on a quiet
/// machine).
pub struct VersityGwCommand;

impl Launch for VersityGwCommand {
    const NAME: &'static str = "versitygw";

    fn command(port: u16, dir: &Path) -> Command {
        let root = dir.join("root");
        std::fs::create_dir_all(&root).expect("create versitygw root directory");
        let mut cmd = Command::new(tool("VERSITYGW"));
        // Keep-alive on, as on S3 itself: without it versitygw closes the connection after
        // every response, and each request (each renewal) paid a TCP handshake — a third
        // of a renewal's CPU in the scale benchmark was the connect and the close.
        cmd.arg("--keep-alive")
            .args(["--access", ACCESS_KEY_ID, "--secret", SECRET_ACCESS_KEY])
            .args(["--region", REGION, "--port", &format!("127.0.0.1:{port}")])
            .arg("posix")
            .arg(&root);
        cmd
    }
}

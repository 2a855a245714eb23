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

use std::path::Path;
use std::process::Command;

use super::stores::{Launch, LoopbackServer};
use super::tool;

/// One dynalite process on a loopback port; killed when dropped.
pub type Dynalite = LoopbackServer<DynaliteCommand>;

/// How dynalite is started (Node: it answers in about a second on a quiet machine).
pub struct DynaliteCommand;

impl Launch for DynaliteCommand {
    const NAME: &'static str = "dynalite";

    fn command(port: u16, dir: &Path) -> Command {
        let mut cmd = Command::new(tool("DYNALITE"));
        cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .arg("--path")
            .arg(dir.join("data"))
            .args(["--createTableMs", "0", "--deleteTableMs", "0"])
            .args(["--updateTableMs", "0"]);
        cmd
    }
}

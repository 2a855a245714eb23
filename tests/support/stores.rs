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

use super::dynalite::Dynalite;
use super::moto::Moto;
use super::versitygw::VersityGw;

/// A server speaking the S3 and/or the DynamoDB API on a loopback port.
pub trait AwsServer: Send + Sync {
    /// What reports call it.
    fn name(&self) -> &'static str;
    /// `http://127.0.0.1:PORT`.
    fn endpoint(&self) -> String;
    fn port(&self) -> u16;
    /// The server's process id while it runs (benchmarks read its CPU time).
    fn pid(&self) -> Option<u32>;
}

impl AwsServer for Moto {
    fn name(&self) -> &'static str {
        "moto-atomic"
    }
    fn endpoint(&self) -> String {
        Moto::endpoint(self)
    }
    fn port(&self) -> u16 {
        Moto::port(self)
    }
    fn pid(&self) -> Option<u32> {
        Moto::pid(self)
    }
}

impl AwsServer for VersityGw {
    fn name(&self) -> &'static str {
        "versitygw"
    }
    fn endpoint(&self) -> String {
        VersityGw::endpoint(self)
    }
    fn port(&self) -> u16 {
        VersityGw::port(self)
    }
    fn pid(&self) -> Option<u32> {
        Some(self.server.pid())
    }
}

impl AwsServer for Dynalite {
    fn name(&self) -> &'static str {
        "dynalite"
    }
    fn endpoint(&self) -> String {
        Dynalite::endpoint(self)
    }
    fn port(&self) -> u16 {
        Dynalite::port(self)
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

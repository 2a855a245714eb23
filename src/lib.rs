//! lockwarden: distributed locks with fencing tokens in S3, DynamoDB, ZooKeeper and
//! Kubernetes Leases, as a Kubernetes operator and a command-line tool.
//!
//! See `docs/architecture.md` for how the pieces fit together.

pub mod api;
pub mod backend;
pub mod cli;
pub mod controller;
pub mod duration;
pub mod fenced;
pub mod lock;
mod schema;
pub mod telemetry;

//! lockwarden-stores: one module per store (`s3`, `dynamodb`, `zookeeper`,
//! `kubernetes`), each with its lock key and URL grammar, its connection options and
//! its store, the store behind a Cargo feature of the same name (`all` for every one).
//! Each knows its store and nothing about DistributedLock objects (the Lease store
//! knows Leases, the fenced writes of `kubernetes` the object they are given); the
//! engine in lockwarden-core runs the protocol on top. A store's part of the
//! DistributedLock spec is lockwarden-api's.
//!
//! - [`registry`]: the one list of stores — [`BackendKind`], the lock URL grammar
//!   ([`Target`]), [`ConnectOptions`] and [`connect`], the only place that builds a
//!   store's backend.
//! - [`store`]: what every store's key declares and the errors they share; no store
//!   named.
//! - [`aws`]: what the two AWS stores share (options, credentials, clients).
//! - [`pollers`]: the other tools whose clients poll a shared key, per store.
//! - [`terraform`]: Terraform's and OpenTofu's state locks, which S3 and DynamoDB
//!   carry (read as another tool's lock; held as theirs with `terraformCompatible`).
//!
//! Features: `s3`, `dynamodb`, `zookeeper`, `kubernetes` (each store's client and
//! backend), `all`, and `cli` (each store's command-line flags, with clap).

// Functions over clippy.toml's threshold are split into named steps (issue 41);
// unit tests are not held to it.
#![warn(clippy::too_many_lines)]
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod aws;
pub mod dynamodb;
pub mod kubernetes;
pub mod pollers;
pub mod registry;
pub mod s3;
pub mod store;
pub mod terraform;
pub mod zookeeper;

pub use aws::{AwsOptions, Credentials, DEFAULT_REQUESTS_IN_FLIGHT};
pub use dynamodb::DynamoDbOptions;
#[cfg(feature = "dynamodb")]
pub use dynamodb::{DynamoStore, FencedDynamoItem, TableLayout};
pub use kubernetes::{KubernetesOptions, ObjectTarget};
#[cfg(feature = "kubernetes")]
pub use kubernetes::{LeaseStore, fenced::FencedKubernetesObject};
pub use pollers::{PollingTool, SharedWith};
#[cfg(feature = "cli")]
pub use registry::StoreFlags;
#[cfg(feature = "aws")]
pub use registry::requests_in_flight_stats;
pub use registry::{
    BackendKind, ConnectOptions, FencedTarget, NotAStateLock, POLLING_TOOLS, Target, connect,
    connect_fenced, release_recorded, set_requests_in_flight,
};
pub use s3::S3Options;
#[cfg(feature = "s3")]
pub use s3::{FencedS3Object, S3Store};
pub use store::{
    ConnectError, LockFileFields, LockFileMismatch, RecordedAcquisition, StoreKey, TargetError,
};
pub use zookeeper::ZooKeeperOptions;
#[cfg(feature = "zookeeper")]
pub use zookeeper::{ZkLock, ZkSessions};

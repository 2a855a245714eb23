//! One folder per store (`s3/`, `dynamodb/`, `zookeeper/`, `kubernetes/`), each with
//! its lock key and URL grammar, its part of the DistributedLock spec, its connection
//! options and its store. Each knows its store and nothing about Kubernetes objects
//! (the Lease store knows Leases); the engine in [`crate::lock`] runs the protocol on
//! top.
//!
//! - [`registry`]: the one list of stores — [`BackendKind`], the lock URL grammar
//!   ([`Target`]), [`ConnectOptions`] and [`connect`], the only place that builds a
//!   store's backend.
//! - [`store`] and [`spec`]: what every store declares (its key, its spec) and the
//!   errors they share; no store named.
//! - [`aws`]: what the two AWS stores share (options, credentials, clients).
//! - [`pollers`]: the other tools whose clients poll a shared key, per store.

pub mod aws;
pub mod dynamodb;
pub mod kubernetes;
pub mod pollers;
pub mod registry;
pub mod s3;
pub mod spec;
pub mod store;
pub mod zookeeper;

pub use aws::{AwsOptions, Credentials};
pub use dynamodb::{DynamoDbOptions, DynamoStore, FencedDynamoItem, TableLayout};
pub use kubernetes::fenced::{FencedKubernetesObject, ObjectTarget};
pub use kubernetes::{KubernetesOptions, LeaseStore};
pub use pollers::{PollingTool, SharedWith};
pub use registry::{
    BackendKind, ConnectOptions, FencedTarget, POLLING_TOOLS, SelectedSpec, StoreFlags, Target,
    connect, connect_fenced, release_recorded,
};
pub use s3::{FencedS3Object, S3Options, S3Store};
pub use spec::{SecretRef, SpecFieldError, StoreSpec};
pub use store::{ConnectError, LockFileFields, RecordedAcquisition, StoreKey, TargetError};
pub use zookeeper::{ZkLock, ZkSessions, ZooKeeperOptions};

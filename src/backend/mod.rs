//! One module per store. Each knows its store and nothing about Kubernetes objects;
//! the engine in [`crate::lock`] runs the protocol on top.
//!
//! - [`url`]: the lock URL grammar ([`Target`]), offline.
//! - [`connect`](mod@connect): [`Target`] + [`ConnectOptions`] → a [`LockBackend`](crate::lock::LockBackend),
//!   the only place that names a store to build one.

mod aws;
pub mod connect;
pub mod dynamodb;
pub mod kubernetes;
pub mod s3;
pub mod url;
pub mod zookeeper;

pub use connect::{ConnectError, ConnectOptions, RecordedAcquisition, connect, release_recorded};
pub use dynamodb::{DynamoStore, TableLayout};
pub use kubernetes::LeaseStore;
pub use s3::S3Store;
pub use url::{Target, TargetError};
pub use zookeeper::{ZkLock, ZkSessions};

//! One module per store. Each knows its store and nothing about Kubernetes objects;
//! the engine in [`crate::lock`] runs the protocol on top.

mod aws;
pub mod dynamodb;
mod kafka_kit;
pub mod kubernetes;
pub mod s3;
pub mod target;
pub mod zookeeper;

pub use dynamodb::{DynamoStore, TableLayout};
pub use kubernetes::LeaseStore;
pub use s3::S3Store;
pub use target::{ConnectError, ConnectOptions, Target, TargetError};
pub use zookeeper::{ZkLock, ZkSessions};

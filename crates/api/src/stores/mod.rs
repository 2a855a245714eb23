//! Each store's part of `spec.backend`, one file per store: its fields, its CEL rules
//! and their Rust twin, and how it becomes the store's key and connection options
//! (lockwarden-stores' types, which are plain data without the stores' features).

pub mod dynamodb;
pub mod kubernetes;
pub mod s3;
pub mod zookeeper;

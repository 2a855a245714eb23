//! lockwarden: distributed locks with fencing tokens in S3, DynamoDB, ZooKeeper and
//! Kubernetes Leases, as a Kubernetes operator and a command-line tool.
//!
//! This crate is the binary's (the CLI and `kubectl lockwarden`, in [`cli`]) and a
//! façade over the layers, each a crate of its own (docs/architecture.md), under the
//! paths they had when they were modules of this one:
//!
//! | path | crate | what |
//! |---|---|---|
//! | [`lock`] (and [`fenced`], [`duration`]) | lockwarden-core | the lock engine: no store, no Kubernetes |
//! | [`backend`] | lockwarden-stores | the stores, each behind a feature |
//! | [`api`] | lockwarden-api | the CRD types and every store's spec |
//! | [`controller`] (and [`telemetry`]) | lockwarden-controller | the operator |
//!
//! A program that embeds one store depends on lockwarden-core and lockwarden-stores
//! with that store's feature alone (examples/dynamodb-only).

#![warn(clippy::too_many_lines)]
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod allocator;
pub mod cli;

pub use lockwarden_api as api;
pub use lockwarden_controller as controller;
pub use lockwarden_controller::telemetry;
pub use lockwarden_core as lock;
pub use lockwarden_core::{duration, fenced};
pub use lockwarden_stores as backend;

//! Bad input of every kind gets a clear error naming what is wrong — never a panic,
//! never a write:
//!
//! - command-line arguments and lock files (the built binary, a table of cases);
//! - stored values that are not lockwarden records, put into the real stores (moto
//!   S3 and DynamoDB, ZooKeeper, kube-apiserver Leases): garbage, wrong types, huge
//!   and absurd values. Acquire, inspect and `lockwarden lock` / `status` report them
//!   (a foreign record is "held", docs/design.md §3 rule 6) and leave them byte for byte;
//! - HTTP answers no real server gives on demand (500, 503, 403, 301, bytes that are
//!   not HTTP, a 200 with a garbage body), from a canned server: the error is
//!   classified as the engine defines (unavailable vs refused) and no lock is
//!   reported acquired;
//! - misuse of Job and Pod gating (a gated Pod without the label, a Job naming a lock
//!   but not suspended, every bad lock annotation): one table through both the
//!   controller's checks and the chart's admission rules on kube-apiserver, agreeing
//!   row by row.
//!
//! (`tests/cli/input.rs` has the common malformed-input cases; this binary has the rest.)

mod admission;
mod answers;
mod canned;
mod command_line;
mod stores;
use lockwarden_testsupport as support;

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_s3::primitives::ByteStream;
use canned::Canned;
use k8s_openapi::api::coordination::v1::Lease as KubeLease;
use kube::api::{Api, PostParams};
use lockwarden::backend::{DynamoStore, LeaseStore, S3Store, TableLayout, ZkSessions};
use lockwarden::lock::{
    AcquireRequest, Attempt, CasLock, ForeignRecord, LockBackend, LockError, Wait, acquire,
};
use serde_json::{Value, json};
use support::cli::Cli;
use support::kube::ControlPlane;
use support::moto::Moto;
use support::zookeeper::ZooKeeper;

/// The binary with moto as the AWS endpoint and nothing else from the environment.
fn cli() -> Cli {
    Cli::aws().clearing_env()
}

fn request(holder: &str) -> AcquireRequest {
    AcquireRequest::new(holder, Duration::from_secs(30))
}

fn assert_bounded(found: &ForeignRecord) {
    assert!(
        found.what.len() <= ForeignRecord::MAX_LEN,
        "a {} byte description",
        found.what.len()
    );
}

fn record_json(overrides: Value) -> Vec<u8> {
    let mut doc = json!({
        "lockwarden": 1,
        "holder": "someone",
        "nonce": "0123456789abcdef0123456789abcdef",
        "revision": "fedcba9876543210fedcba9876543210",
        "fence": 3,
        "leaseMs": 30000,
        "state": "held",
        "acquiredAtMs": 1_700_000_000_000u64,
        "renewedAtMs": 1_700_000_000_000u64,
    });
    for (k, v) in overrides.as_object().unwrap() {
        doc[k] = v.clone();
    }
    serde_json::to_vec(&doc).unwrap()
}

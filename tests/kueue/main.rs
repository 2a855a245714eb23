//! Kueue (tests/support/kueue.rs) on a real node (tests/support/node.rs): the proof that
//! the environment a later test makes lockwarden an AdmissionCheck controller in works.
//! Kueue v0.17's manager runs against the node's API server with its CRDs (conversion
//! webhooks included) and webhook configurations pointed at 127.0.0.1; env.rs checks
//! that its Job webhook suspends a queued Job and makes its Workload, and that a queued
//! Job is admitted against a ClusterQueue's quota and runs to completion on the node.

mod env;
#[path = "../support/mod.rs"]
mod support;

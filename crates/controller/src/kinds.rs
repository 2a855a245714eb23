//! The one registry of the kinds of workload lockwarden gates: a new kind is one file
//! implementing `gating::GatedWorkload` and one `.with::<K>()` here. (A module of its
//! own, not the crate root, so that the phases that judge a claim — reconcile/ — use it
//! without depending on the root that runs them.)

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;

use crate::gating::Kinds;
use crate::kueue::Workload;

/// Every kind of workload lockwarden gates: the one registry of them.
pub fn gated_kinds() -> Kinds {
    Kinds::default()
        .with::<Job>()
        .with::<Pod>()
        .with::<Workload>()
}

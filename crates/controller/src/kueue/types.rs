//! The parts of Kueue's API (`kueue.x-k8s.io/v1beta2`) lockwarden reads and writes:
//! Workloads and AdmissionChecks. Only the fields used here are typed; the controller
//! writes patches of exactly the fields it sets, so fields it does not know are never
//! dropped on the server.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use kube::Resource;
use serde::{Deserialize, Serialize};

use lockwarden_api::LockAdmissionConfigSpec;

/// Kueue's API group.
pub const GROUP: &str = "kueue.x-k8s.io";
/// The version lockwarden speaks (ClusterQueues name checks under
/// `admissionChecksStrategy` there).
pub const VERSION: &str = "v1beta2";
/// The `controllerName` of lockwarden's AdmissionChecks.
pub const CONTROLLER_NAME: &str = "lockwarden.io/lock";

/// A Kueue Workload: the unit Kueue admits (one per Job).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Workload {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: WorkloadSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<WorkloadStatus>,
    /// Which of its checks is lockwarden's and what its parameters say, looked up
    /// afresh at the start of every reconcile (`gate_annotations`); never serialized.
    #[serde(skip)]
    pub(super) check: CheckCell,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSpec {
    #[serde(default)]
    pub pod_sets: Vec<PodSet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_name: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSet {
    pub name: String,
    #[serde(default)]
    pub template: PodTemplateSpec,
    #[serde(default)]
    pub count: i32,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default)]
    pub admission_checks: Vec<AdmissionCheckState>,
}

/// One entry of `status.admissionChecks`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionCheckState {
    pub name: String,
    /// `Pending`, `Ready`, `Retry` or `Rejected`.
    pub state: String,
    #[serde(default)]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeue_after_seconds: Option<i32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_set_updates: Vec<PodSetUpdate>,
}

/// What a check asks Kueue to add to a Pod set's Pods when the Workload is admitted.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSetUpdate {
    pub name: String,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub annotations: std::collections::BTreeMap<String, String>,
}

/// The states of an admission check.
pub mod state {
    pub const PENDING: &str = "Pending";
    pub const READY: &str = "Ready";
    pub const RETRY: &str = "Retry";
    pub const REJECTED: &str = "Rejected";
}

/// Workload condition types lockwarden reads.
pub mod condition {
    pub const QUOTA_RESERVED: &str = "QuotaReserved";
    pub const ADMITTED: &str = "Admitted";
    pub const FINISHED: &str = "Finished";
}

impl Workload {
    /// Whether condition `type_` is True.
    pub fn condition_true(&self, type_: &str) -> bool {
        self.condition(type_).is_some_and(|c| c.status == "True")
    }

    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
    }

    /// The state of check `name`, if the Workload has it.
    pub fn check_state(&self, name: &str) -> Option<&AdmissionCheckState> {
        self.status
            .as_ref()?
            .admission_checks
            .iter()
            .find(|c| c.name == name)
    }
}

impl Resource for Workload {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Workload".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "workloads".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A Kueue AdmissionCheck (cluster-scoped).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AdmissionCheck {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: AdmissionCheckSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<AdmissionCheckStatus>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionCheckSpec {
    #[serde(default)]
    pub controller_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<ParametersReference>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParametersReference {
    #[serde(default)]
    pub api_group: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AdmissionCheckStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

impl Resource for AdmissionCheck {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "AdmissionCheck".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "admissionchecks".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A Kueue ClusterQueue: only the checks it names.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ClusterQueue {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ClusterQueueSpec,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterQueueSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission_checks_strategy: Option<AdmissionChecksStrategy>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionChecksStrategy {
    #[serde(default)]
    pub admission_checks: Vec<AdmissionCheckStrategyRule>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AdmissionCheckStrategyRule {
    pub name: String,
}

impl ClusterQueue {
    /// The names of the checks it asks of every Workload.
    pub fn check_names(&self) -> impl Iterator<Item = &str> {
        self.spec
            .admission_checks_strategy
            .iter()
            .flat_map(|s| s.admission_checks.iter().map(|c| c.name.as_str()))
    }
}

impl Resource for ClusterQueue {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "ClusterQueue".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "clusterqueues".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Which of a Workload's checks is lockwarden's, and what its parameters say.
#[derive(Clone, Debug, PartialEq)]
pub enum OurCheck {
    /// None of its checks is lockwarden's.
    None,
    /// Check `name` is lockwarden's, with these parameters.
    Ours {
        name: String,
        spec: LockAdmissionConfigSpec,
    },
    /// Check `name` is lockwarden's, but its parameters cannot be used (the
    /// AdmissionCheck says why in its `Active` condition).
    Unusable { name: String },
}

/// Where a Workload keeps its [`OurCheck`] between the machine's questions of one
/// reconcile. Set afresh by every `gate_annotations` (the cache hands the same object
/// to reconciles that follow no change of it, while its check's parameters may have
/// changed).
#[derive(Debug, Default)]
pub struct CheckCell(std::sync::RwLock<Option<OurCheck>>);

impl CheckCell {
    pub(super) fn get(&self) -> OurCheck {
        self.0
            .read()
            .map(|c| c.clone().unwrap_or(OurCheck::None))
            .unwrap_or(OurCheck::None)
    }

    pub(super) fn set(&self, check: OurCheck) {
        if let Ok(mut cell) = self.0.write() {
            *cell = Some(check);
        }
    }
}

impl Clone for CheckCell {
    fn clone(&self) -> Self {
        CheckCell(std::sync::RwLock::new(Some(self.get())))
    }
}

impl OurCheck {
    pub(super) fn name(&self) -> Option<&str> {
        match self {
            OurCheck::None => None,
            OurCheck::Ours { name, .. } | OurCheck::Unusable { name } => Some(name),
        }
    }
}

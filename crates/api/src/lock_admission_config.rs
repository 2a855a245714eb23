//! The `LockAdmissionConfig` custom resource (`lockwarden.io/v1alpha1`, cluster-scoped):
//! the parameters of a Kueue AdmissionCheck whose `controllerName` is
//! `lockwarden.io/lock` (docs/design.md §6.6). It names the DistributedLock templates a
//! Workload admitted through that check takes its locks from, and how long a Workload
//! may keep its ClusterQueue's quota while it waits for them.

use std::time::Duration;

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::schema::{MAX_DURATION_LEN, positive_duration};
use lockwarden_core::duration::{DurationError, parse_positive_duration};
use lockwarden_core::names::NameError;

/// How long a Workload waits for its locks while holding quota, when unset.
pub const DEFAULT_PENDING_TIMEOUT: &str = "5m";
/// How long Kueue waits before it requeues a Workload sent back after that, when unset.
pub const DEFAULT_RETRY_AFTER: &str = "1m";

/// The locks a Kueue AdmissionCheck of lockwarden's takes for each Workload.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "lockwarden.io",
    version = "v1alpha1",
    kind = "LockAdmissionConfig",
    category = "lockwarden",
    derive = "PartialEq",
    doc = "Parameters of a Kueue AdmissionCheck of lockwarden's: the DistributedLock templates each admitted Workload takes a lock from.",
    printcolumn = r#"{"name":"Templates","type":"string","jsonPath":".spec.templates[*].name"}"#,
    printcolumn = r#"{"name":"Pending Timeout","type":"string","jsonPath":".spec.pendingTimeout"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::strip_nullable)]
#[schemars(transform = crate::schema::kubernetes_integer_formats)]
pub struct LockAdmissionConfigSpec {
    /// The DistributedLock templates (`spec.release: true`) each Workload takes a lock
    /// of its own from, in its own namespace, owned by the Workload; several are taken
    /// in the global key order. Keep them in a namespace only administrators write.
    #[schemars(length(min = 1, max = 8))]
    pub templates: Vec<TemplateRef>,
    /// How long a Workload may wait for its locks while it holds its ClusterQueue's
    /// quota; then the check says Retry (Kueue gives the quota back and requeues it
    /// after `retryAfter`) and the Workload keeps its place in the lock's queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_DURATION_LEN))]
    #[x_kube(validation = positive_duration("pendingTimeout"))]
    pub pending_timeout: Option<String>,
    /// Each Workload's own locks take as many permits as it has Pods (the sum of its
    /// Pod sets' counts) instead of the templates' weight: "at most N Pods of these at
    /// once". The templates must be queued (`queue: true`); a Workload with more Pods
    /// than a template has permits is Rejected.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub weight_from_pod_count: bool,
    /// How long Kueue waits before it requeues a Workload the check sent back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_DURATION_LEN))]
    #[x_kube(validation = positive_duration("retryAfter"))]
    pub retry_after: Option<String>,
}

/// A DistributedLock template by namespace and name.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TemplateRef {
    /// Its namespace; the Workload's own when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

impl TemplateRef {
    /// As the gating machine names a template: `NAME` or `NAMESPACE/NAME`.
    pub fn reference(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}/{}", self.name),
            None => self.name.clone(),
        }
    }
}

impl LockAdmissionConfigSpec {
    /// `pendingTimeout`, or its default.
    pub fn pending_timeout(&self) -> Result<Duration, AdmissionConfigError> {
        duration_field(
            "pendingTimeout",
            &self.pending_timeout,
            DEFAULT_PENDING_TIMEOUT,
        )
    }

    /// `retryAfter`, or its default.
    pub fn retry_after(&self) -> Result<Duration, AdmissionConfigError> {
        duration_field("retryAfter", &self.retry_after, DEFAULT_RETRY_AFTER)
    }

    /// What makes these parameters unusable, for the AdmissionCheck's `Active`
    /// condition: no template, a template named twice or not a valid name, a bad
    /// duration.
    pub fn validate(&self) -> Result<(), AdmissionConfigError> {
        if self.templates.is_empty() {
            return Err(AdmissionConfigError::NoTemplates);
        }
        let mut seen = std::collections::BTreeSet::new();
        for t in &self.templates {
            lockwarden_core::names::kubernetes_name(&t.name)
                .map_err(|e| AdmissionConfigError::Template(e.named("template name")))?;
            if let Some(ns) = &t.namespace {
                lockwarden_core::names::kubernetes_namespace(ns)
                    .map_err(|e| AdmissionConfigError::Template(e.named("namespace")))?;
            }
            if !seen.insert(t.reference()) {
                return Err(AdmissionConfigError::NamedTwice(t.reference()));
            }
        }
        self.pending_timeout()?;
        self.retry_after()?;
        Ok(())
    }
}

/// Why `LockAdmissionConfig` parameters cannot be used, for the AdmissionCheck's
/// `Active` condition; each names the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionConfigError {
    #[error("spec.templates is empty: name at least one DistributedLock template")]
    NoTemplates,
    /// A template's name or namespace is no Kubernetes name.
    #[error("spec.templates: {0}")]
    Template(#[source] NameError),
    /// `NAME` or `NAMESPACE/NAME`, as the gating machine names a template.
    #[error("spec.templates: {0} is named twice")]
    NamedTwice(String),
    #[error("spec.{field}: {source}")]
    Duration {
        field: &'static str,
        #[source]
        source: DurationError,
    },
}

fn duration_field(
    field: &'static str,
    value: &Option<String>,
    default: &str,
) -> Result<Duration, AdmissionConfigError> {
    let text = value.as_deref().unwrap_or(default);
    parse_positive_duration(text).map_err(|source| AdmissionConfigError::Duration { field, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(templates: &[(&str, Option<&str>)]) -> LockAdmissionConfigSpec {
        LockAdmissionConfigSpec {
            templates: templates
                .iter()
                .map(|(name, namespace)| TemplateRef {
                    namespace: namespace.map(str::to_string),
                    name: name.to_string(),
                })
                .collect(),
            pending_timeout: None,
            retry_after: None,
            weight_from_pod_count: false,
        }
    }

    #[test]
    fn parameters_default_their_timeouts_and_name_templates_by_namespace() {
        let s = spec(&[("gpu", Some("lockwarden-system")), ("db", None)]);
        s.validate().unwrap();
        assert_eq!(s.pending_timeout(), Ok(Duration::from_secs(300)));
        assert_eq!(s.retry_after(), Ok(Duration::from_secs(60)));
        assert_eq!(s.templates[0].reference(), "lockwarden-system/gpu");
        assert_eq!(s.templates[1].reference(), "db");
    }

    #[test]
    fn bad_input_parameters_that_cannot_be_used_say_why() {
        assert!(
            spec(&[])
                .validate()
                .unwrap_err()
                .to_string()
                .contains("empty")
        );
        let twice = spec(&[("db", Some("a")), ("db", Some("a"))]);
        assert!(
            twice
                .validate()
                .unwrap_err()
                .to_string()
                .contains("named twice")
        );
        let bad_name = spec(&[("Not_A_Name", None)]);
        assert!(
            bad_name
                .validate()
                .unwrap_err()
                .to_string()
                .contains("template name")
        );
        let mut bad_timeout = spec(&[("db", None)]);
        bad_timeout.pending_timeout = Some("soon".into());
        assert!(
            bad_timeout
                .validate()
                .unwrap_err()
                .to_string()
                .contains("pendingTimeout")
        );
    }
}

//! Kubernetes Events, for both controllers. An Event is a courtesy to the reader of
//! `kubectl describe`, never a reason to fail a reconcile: a failure to publish one is
//! logged and dropped.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use super::config::ControllerConfig;

/// Publishes Events as this controller (`config.reporter`, instance `$POD_NAME`).
pub struct Events {
    recorder: Recorder,
}

impl Events {
    pub fn new(client: kube::Client, config: &ControllerConfig) -> Self {
        let reporter = Reporter {
            controller: config.reporter.clone(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Events {
            recorder: Recorder::new(client, reporter),
        }
    }

    /// One Event about `regarding`, its action named after its reason.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        self.publish_related(regarding, None, type_, reason, note)
            .await
    }

    /// [`Events::publish`], naming `related` too. The recorder folds an Event into an
    /// earlier one of the same type, reason, regarding and related object (a series:
    /// its count grows, its note stays the first one's): Events about one object that
    /// each concern another (a CronJob's, one per Job) name that other one, so that
    /// each keeps its own note.
    pub async fn publish_related(
        &self,
        regarding: &ObjectReference,
        related: Option<&ObjectReference>,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: reason.to_string(),
            secondary: related.cloned(),
        };
        if let Err(e) = self.recorder.publish(&event, regarding).await {
            tracing::debug!(error = %e, "cannot publish event");
        }
    }
}

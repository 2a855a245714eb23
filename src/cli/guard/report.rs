//! What the guard writes on its own Pod, with the Pod's ServiceAccount token: its
//! request for a renewal before COMMAND starts (docs/design.md §6.3, "A renewal on the
//! guard's request"), and its report that its container's processes ended in success
//! (§6.3, "Early hand-off: the guard's report").
//!
//! The request: rule 9 starts COMMAND only once a read has shown the lock renewed after
//! the first, up to a renewal interval later on the holder's schedule. The guard
//! annotates its Pod with the revisions its first reads showed
//! (`guard-waiting.lockwarden.io/<container>`); the controller, which watches the Pods'
//! metadata, renews each lock still at one of them at once.
//!
//! The report: the kubelet reports a container's exit
//! at its next relist, up to a second later; the guard, PID 1 of the container's own
//! PID namespace, knows at once. Once COMMAND exited 0 and nothing but the guard is
//! left in the namespace, it annotates its own Pod
//! (`guard-ended.lockwarden.io/<container>: succeeded`) with the Pod's ServiceAccount
//! token, and the controller, which watches the Pod, lets the lock go.
//!
//! Both are optimisations, never conditions: when one cannot be written (no token, no
//! RoleBinding, the API server unreachable) the guard says why and goes on as before:
//! it waits for the scheduled renewal, or exits with COMMAND's code and the hand-off
//! waits for the kubelet's report.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use lockwarden_controller::gating::{
    GUARD_REPORT_PREFIX, GUARD_REPORT_SUCCEEDED, GUARD_WAITING_PREFIX,
};
use tokio::time::{Instant, sleep, timeout};

use crate::cli::{sys, tree};

/// How long the other processes of the namespace get to be gone after SIGKILL (a
/// process in uninterruptible sleep ends when its I/O does), and how long the API
/// server gets to take the report: the container's exit waits for both.
const SETTLE: Duration = Duration::from_secs(2);
const WRITE: Duration = Duration::from_secs(5);

/// The Pod and container the guard runs in, from the environment the chart's injection
/// policy (or the guide's template lines) sets: the downward API's name, namespace and
/// uid, and the container's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct OwnPod {
    namespace: String,
    name: String,
    uid: String,
    container: String,
}

impl OwnPod {
    /// `None` unless all four are set and non-empty: a guard set up by hand without
    /// them writes no report.
    pub(super) fn from_env(var: impl Fn(&str) -> Option<String>) -> Option<OwnPod> {
        let get = |name: &str| var(name).filter(|v| !v.is_empty());
        Some(OwnPod {
            namespace: get("LOCKWARDEN_POD_NAMESPACE")?,
            name: get("LOCKWARDEN_POD_NAME")?,
            uid: get("LOCKWARDEN_POD_UID")?,
            container: get("LOCKWARDEN_CONTAINER_NAME")?,
        })
    }

    /// The merge patch of the report: conditioned on the Pod's uid (a Pod of the same
    /// name made since is not this one), adding only the container's annotation.
    fn patch(&self) -> serde_json::Value {
        self.annotation(GUARD_REPORT_PREFIX, GUARD_REPORT_SUCCEEDED)
    }

    /// The merge patch of the request for a renewal of the locks at `revisions`, as the
    /// report's: the container's own annotation, on this Pod only.
    fn request(&self, revisions: &[String]) -> serde_json::Value {
        self.annotation(GUARD_WAITING_PREFIX, &revisions.join(","))
    }

    fn annotation(&self, prefix: &str, value: &str) -> serde_json::Value {
        serde_json::json!({ "metadata": {
            "uid": self.uid,
            "annotations": { format!("{prefix}{}", self.container): value },
        }})
    }

    /// Writes `patch` on the Pod with the Pod's ServiceAccount token, within [`WRITE`].
    async fn annotate(&self, patch: serde_json::Value) -> Result<(), ReportError> {
        let config = kube::Config::incluster().map_err(ReportError::Credentials)?;
        let client = kube::Client::try_from(config).map_err(ReportError::Client)?;
        let pods = Api::<Pod>::namespaced(client, &self.namespace);
        let (params, patch) = (PatchParams::default(), Patch::Merge(patch));
        match timeout(WRITE, pods.patch(&self.name, &params, &patch)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(ReportError::Write(e)),
            Err(_) => Err(ReportError::Timeout),
        }
    }
}

/// Why no request or report was written.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReportError {
    #[error(
        "the guard is not PID 1 of its container, so it cannot tell that every process of it ended"
    )]
    NotPidOne,
    #[error("processes {0:?} were still running in the container {SETTLE:?} after SIGKILL")]
    NotAlone(Vec<u32>),
    #[error("no in-cluster credentials (the Pod's ServiceAccount token): {0}")]
    Credentials(#[source] kube::config::InClusterError),
    #[error("the Kubernetes client could not be built: {0}")]
    Client(#[source] kube::Error),
    #[error("the API server refused or failed the write: {0}")]
    Write(#[source] kube::Error),
    #[error("the API server did not answer within {WRITE:?}")]
    Timeout,
}

/// COMMAND exited 0 and its leftovers are stopped: every other process of the
/// container is ended, then the report written on `pod`.
pub(super) async fn ended_in_success(pod: &OwnPod) -> Result<(), ReportError> {
    if std::process::id() != 1 {
        return Err(ReportError::NotPidOne);
    }
    alone_in_the_namespace(Path::new("/proc")).await?;
    pod.annotate(pod.patch()).await
}

/// Asks the controller for a renewal of the locks whose records showed `revisions`.
pub(super) async fn ask_for_renewal(pod: &OwnPod, revisions: &[String]) -> Result<(), ReportError> {
    pod.annotate(pod.request(revisions)).await
}

/// As PID 1: SIGKILL to every other process of the namespace (a `kubectl exec` is not
/// of COMMAND's tree, yet would run under the lock), reaping those that were ours,
/// until `/proc` lists none but ourselves.
async fn alone_in_the_namespace(proc: &Path) -> Result<(), ReportError> {
    let until = Instant::now() + SETTLE;
    loop {
        let others = other_processes(proc, 1);
        if others.is_empty() {
            return Ok(());
        }
        if Instant::now() >= until {
            return Err(ReportError::NotAlone(others));
        }
        sys::kill_every_other_process();
        tree::reap_adopted(1, None);
        sleep(Duration::from_millis(10)).await;
    }
}

/// The processes `proc` lists other than `me`, zombies included (a zombie not yet
/// reaped is a process whose end is not yet reported either).
fn other_processes(proc: &Path, me: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&pid| pid != me)
        .collect();
    pids.sort_unstable();
    pids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    const ALL: [(&str, &str); 4] = [
        ("LOCKWARDEN_POD_NAMESPACE", "jobs"),
        ("LOCKWARDEN_POD_NAME", "nightly-x7k2p"),
        ("LOCKWARDEN_POD_UID", "0b6f1c1e-5d2a-4c55-9b0e-3a1d2c4e5f60"),
        ("LOCKWARDEN_CONTAINER_NAME", "main"),
    ];

    #[test]
    fn the_report_names_the_container_and_is_conditioned_on_the_pods_uid() {
        let pod = OwnPod::from_env(env(&ALL)).expect("all four set");
        assert_eq!(
            pod.patch(),
            serde_json::json!({ "metadata": {
                "uid": "0b6f1c1e-5d2a-4c55-9b0e-3a1d2c4e5f60",
                "annotations": { "guard-ended.lockwarden.io/main": "succeeded" },
            }})
        );
    }

    #[test]
    fn the_request_names_the_container_and_the_revisions_read_on_this_pod_only() {
        let pod = OwnPod::from_env(env(&ALL)).expect("all four set");
        let revisions = ["r1".to_string(), "r2".to_string()];
        assert_eq!(
            pod.request(&revisions),
            serde_json::json!({ "metadata": {
                "uid": "0b6f1c1e-5d2a-4c55-9b0e-3a1d2c4e5f60",
                "annotations": { "guard-waiting.lockwarden.io/main": "r1,r2" },
            }})
        );
    }

    #[test]
    fn no_report_without_every_variable_of_the_pod() {
        for missing in 0..ALL.len() {
            let mut vars = ALL.to_vec();
            vars.remove(missing);
            assert_eq!(
                OwnPod::from_env(env(&vars)),
                None,
                "without {}",
                ALL[missing].0
            );
            let mut empty = ALL.to_vec();
            empty[missing].1 = "";
            assert_eq!(
                OwnPod::from_env(env(&empty)),
                None,
                "{} empty",
                ALL[missing].0
            );
        }
    }

    #[test]
    fn processes_are_the_numeric_entries_of_proc_other_than_ourselves() {
        let dir = tempfile::tempdir().unwrap();
        for entry in ["1", "17", "4242", "self", "sys", "cpuinfo"] {
            std::fs::create_dir(dir.path().join(entry)).unwrap();
        }
        assert_eq!(other_processes(dir.path(), 1), vec![17, 4242]);
        assert_eq!(other_processes(dir.path(), 17), vec![1, 4242]);
    }

    #[tokio::test]
    async fn a_guard_that_is_not_pid_one_writes_no_report() {
        let pod = OwnPod::from_env(env(&ALL)).unwrap();
        // The test runner is not PID 1: the guard cannot know its namespace is empty.
        assert!(matches!(
            ended_in_success(&pod).await,
            Err(ReportError::NotPidOne)
        ));
    }
}

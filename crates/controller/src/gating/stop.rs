//! How long a workload's processes may outlive its lock's holder deadline, and the
//! lock-delay that covers it (docs/design.md §6.3, rule 8).
//!
//! With `P` the longest time the processes may run on after the holder deadline, a
//! contender's earliest takeover after an expiry comes `(D + grace)(1 − δ) + margin`
//! after that deadline, so the delay must be `D ≥ (P − margin)/(1 − δ) − grace`.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodSpec};

use super::lockset::RanWith;
use super::{GUARD_REPORT_PREFIX, GUARD_REPORT_SUCCEEDED};
use lockwarden_api::distributed_lock::MAX_LOCK_DELAY;
use lockwarden_core::SafetyMargins;

/// W: from the holder deadline until lockwarden's stop (the suspend patch and its own
/// delete of the Pods) is accepted by the API server and seen by the kubelet. A stated
/// bound: beyond it only the node-side guard protects.
pub const STOP_SEEN_WITHIN: Duration = Duration::from_secs(5);
/// The kubelet's one-time extension of the grace period for a preStop hook still
/// running when the grace period ends.
pub const PRE_STOP_EXTENSION: Duration = Duration::from_secs(2);
/// k: SIGKILL sent by the container runtime and the container's processes gone, on a
/// loaded node.
pub const KILL_TIME: Duration = Duration::from_secs(1);

/// Kubernetes' default `terminationGracePeriodSeconds`.
const DEFAULT_GRACE_SECONDS: i64 = 30;

/// The delay a workload needs is above what a lock may carry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "terminationGracePeriodSeconds {grace_seconds} needs a lock-delay of {}s, above the \
     maximum of {}s; shorten the grace period (below about {}s)",
    needed.as_secs(),
    MAX_LOCK_DELAY.as_secs(),
    max_grace_seconds(&SafetyMargins::default())
)]
pub struct DelayTooLong {
    pub grace_seconds: i64,
    pub needed: Duration,
}

/// P: the longest time the processes of a Pod with `spec` may run on after the holder
/// deadline, on the controller's clock: `W + G × (1 + δ) + 2 s (preStop) + k`.
pub fn outlive_bound(spec: Option<&PodSpec>, margins: &SafetyMargins) -> Duration {
    let grace = Duration::from_secs(grace_seconds(spec).max(0) as u64);
    let pre_stop = if spec.is_some_and(has_pre_stop) {
        PRE_STOP_EXTENSION
    } else {
        Duration::ZERO
    };
    STOP_SEEN_WITHIN + grace.mul_f64(1.0 + margins.drift) + pre_stop + KILL_TIME
}

/// The lock-delay a workload whose Pods have `spec` needs so that its processes are
/// gone before anyone may take its lock over after an expiry:
/// `D ≥ (P − margin)/(1 − δ) − grace`, rounded up to whole seconds. An error when that
/// is above [`MAX_LOCK_DELAY`].
pub fn needed_lock_delay(
    spec: Option<&PodSpec>,
    margins: &SafetyMargins,
) -> Result<Duration, DelayTooLong> {
    let p = outlive_bound(spec, margins).as_secs_f64();
    let needed =
        (p - margins.margin.as_secs_f64()) / (1.0 - margins.drift) - margins.grace.as_secs_f64();
    let needed = Duration::from_secs(needed.max(0.0).ceil() as u64);
    if needed > MAX_LOCK_DELAY {
        return Err(DelayTooLong {
            grace_seconds: grace_seconds(spec),
            needed,
        });
    }
    Ok(needed)
}

/// The longest grace period (without preStop hooks) whose delay fits the cap, for the
/// error message.
fn max_grace_seconds(margins: &SafetyMargins) -> u64 {
    let max = ((MAX_LOCK_DELAY.as_secs_f64() + margins.grace.as_secs_f64())
        * (1.0 - margins.drift)
        + margins.margin.as_secs_f64()
        - (STOP_SEEN_WITHIN + KILL_TIME).as_secs_f64())
        / (1.0 + margins.drift);
    max.floor().max(0.0) as u64
}

/// Whether none of a Pod's containers can run any more: it is `Succeeded` or `Failed`
/// (the kubelet reports a terminal phase once they have stopped, for a deleted Pod too
/// since Kubernetes 1.27), or it is not bound to a node and never will be (being
/// deleted, or held by a scheduling gate): it ran nothing.
pub fn pod_processes_ended(pod: &Pod) -> bool {
    let terminal = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|phase| matches!(phase, "Succeeded" | "Failed"));
    let spec = pod.spec.as_ref();
    let bound = spec.is_some_and(|s| s.node_name.is_some());
    let unschedulable = pod.metadata.deletion_timestamp.is_some()
        || spec.is_some_and(|s| s.scheduling_gates.as_ref().is_some_and(|g| !g.is_empty()));
    terminal || (!bound && unschedulable)
}

/// Whether a Pod of `spec` has ended for good once every container of it has exited:
/// no container can be restarted (`restartPolicy: Never`, no container-level restart
/// policy or rules; sidecars, restartable init containers, are stopped by the kubelet
/// as the Pod ends) and each container has a PID namespace of its own (no
/// `shareProcessNamespace`, no `hostPID`), so a container's exit ends every process of
/// it (docs/design.md §6.3, "Early hand-off").
pub fn ends_when_its_containers_exit(spec: &PodSpec) -> bool {
    let no_rules = |c: &Container| c.restart_policy_rules.as_ref().is_none_or(Vec::is_empty);
    spec.restart_policy.as_deref() == Some("Never")
        && spec.share_process_namespace != Some(true)
        && spec.host_pid != Some(true)
        && spec
            .containers
            .iter()
            .all(|c| c.restart_policy.is_none() && no_rules(c))
        && spec.init_containers.iter().flatten().all(no_rules)
}

/// Whose word that a container's processes ended in success the early hand-off takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExitReports {
    /// The kubelet's `terminated` with code 0 only.
    #[default]
    Kubelet,
    /// That, or for a container running the guard, the guard's report on the Pod
    /// ([`GUARD_REPORT_PREFIX`]): `--trust-guard-reports`, where the chart's admission
    /// policy lets only the Pod itself write it (docs/design.md §6.3, "Early hand-off:
    /// the guard's report").
    KubeletAndGuard,
}

/// Whether every container of `pod` — init, sidecar, regular and ephemeral — is
/// reported exited with code 0, in a Pod that [ends when its containers
/// exit](ends_when_its_containers_exit): every process of it has ended, and it
/// succeeded. A container's exit is reported once its runtime has reaped the
/// container's first process, and the kernel reaps that one only after every other
/// process of its PID namespace has exited. The kubelet reports the exits a relist
/// before it reports the Pod `Succeeded` (docs/design.md §6.3, "Early hand-off"). With
/// [`ExitReports::KubeletAndGuard`] a regular container that runs the guard may be
/// reported by its guard instead, which writes its report once it is the last process
/// of the container and COMMAND exited 0; init, sidecar and ephemeral containers run no
/// guard and always need the kubelet's word.
pub fn pod_ended_in_success(pod: &Pod, reports: ExitReports) -> bool {
    let (Some(spec), Some(status)) = (&pod.spec, &pod.status) else {
        return false;
    };
    let all_exited_zero = |statuses: &Option<Vec<ContainerStatus>>, declared: usize| {
        let statuses = statuses.as_deref().unwrap_or_default();
        statuses.len() == declared && statuses.iter().all(exited_zero)
    };
    let reported = pod.metadata.annotations.as_ref();
    let statuses = status.container_statuses.as_deref().unwrap_or_default();
    let container_ended = |c: &Container| {
        let kubelet = statuses.iter().find(|s| s.name == c.name);
        if kubelet.is_some_and(exited_zero) {
            return true;
        }
        // The guard reports before its own exit: a container the kubelet already
        // reports ended otherwise (killed after the report) did not succeed.
        let ended_otherwise = kubelet
            .and_then(|s| s.state.as_ref())
            .is_some_and(|s| s.terminated.is_some());
        reports == ExitReports::KubeletAndGuard
            && !ended_otherwise
            && super::decide::runs_guard(c)
            && reported
                .and_then(|a| a.get(&format!("{GUARD_REPORT_PREFIX}{}", c.name)))
                .is_some_and(|v| v == GUARD_REPORT_SUCCEEDED)
    };
    ends_when_its_containers_exit(spec)
        && status.phase.as_deref() != Some("Failed")
        && spec.containers.iter().all(container_ended)
        && all_exited_zero(
            &status.init_container_statuses,
            spec.init_containers.as_ref().map_or(0, Vec::len),
        )
        && all_exited_zero(
            &status.ephemeral_container_statuses,
            spec.ephemeral_containers.as_ref().map_or(0, Vec::len),
        )
}

/// The container's last state the kubelet reports: terminated, with exit code 0.
fn exited_zero(status: &ContainerStatus) -> bool {
    status
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .is_some_and(|t| t.exit_code == 0)
}

/// One warning per lock the workload runs with whose `lockDelay` is shorter than
/// `needed`, on a store that can carry one: the workload runs anyway.
pub fn too_short(ran: &RanWith, needed: Duration) -> Vec<String> {
    ran.0
        .iter()
        .filter(|r| r.supports_lock_delay && r.lock_delay < needed)
        .map(|r| {
            format!(
                "lock {} has a lockDelay of {}s, below the {}s its Pods need: after an \
                 expiry a contender may start while they still run; the fence and the \
                 node-side guard remain",
                r.name,
                r.lock_delay.as_secs(),
                needed.as_secs()
            )
        })
        .collect()
}

fn grace_seconds(spec: Option<&PodSpec>) -> i64 {
    spec.and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(DEFAULT_GRACE_SECONDS)
}

/// Whether any container (init containers too: a sidecar's preStop runs on stop) has a
/// preStop hook.
fn has_pre_stop(spec: &PodSpec) -> bool {
    let hooked = |c: &Container| c.lifecycle.as_ref().is_some_and(|l| l.pre_stop.is_some());
    spec.containers.iter().any(hooked) || spec.init_containers.iter().flatten().any(hooked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gating::lockset::Ran;
    use serde_json::json;

    fn spec(value: serde_json::Value) -> PodSpec {
        serde_json::from_value(value).unwrap()
    }

    /// A Pod of `spec` whose kubelet reports `statuses` (`containerStatuses`, …).
    fn pod(spec: serde_json::Value, statuses: serde_json::Value) -> Pod {
        serde_json::from_value(json!({ "spec": spec, "status": statuses })).unwrap()
    }

    fn exited(name: &str, code: i32) -> serde_json::Value {
        json!({ "name": name, "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": { "terminated": { "exitCode": code } } })
    }

    #[test]
    fn early_hand_off_a_pod_ended_in_success_only_when_every_container_exited_zero_for_good() {
        let never = json!({ "restartPolicy": "Never", "containers": [{ "name": "c" }] });
        let ok = json!({ "phase": "Running", "containerStatuses": [exited("c", 0)] });
        assert!(pod_ended_in_success(
            &pod(never.clone(), ok.clone()),
            ExitReports::Kubelet
        ));
        // A container still running, or one that failed.
        let running = json!({ "containerStatuses": [{ "name": "c", "image": "i",
            "imageID": "", "ready": true, "restartCount": 0, "state": { "running": {} } }] });
        assert!(!pod_ended_in_success(
            &pod(never.clone(), running),
            ExitReports::Kubelet
        ));
        let failed = json!({ "containerStatuses": [exited("c", 1)] });
        assert!(!pod_ended_in_success(
            &pod(never.clone(), failed),
            ExitReports::Kubelet
        ));
        // Not every declared container reported yet.
        let two = json!({ "restartPolicy": "Never",
                          "containers": [{ "name": "c" }, { "name": "d" }] });
        assert!(!pod_ended_in_success(
            &pod(two, ok.clone()),
            ExitReports::Kubelet
        ));
        // An init container (a sidecar too) and an ephemeral container count.
        let with_init = json!({ "restartPolicy": "Never", "containers": [{ "name": "c" }],
            "initContainers": [{ "name": "side", "restartPolicy": "Always" }] });
        let init_killed = json!({ "containerStatuses": [exited("c", 0)],
            "initContainerStatuses": [exited("side", 143)] });
        assert!(!pod_ended_in_success(
            &pod(with_init.clone(), init_killed),
            ExitReports::Kubelet
        ));
        let init_ok = json!({ "containerStatuses": [exited("c", 0)],
            "initContainerStatuses": [exited("side", 0)] });
        assert!(pod_ended_in_success(
            &pod(with_init, init_ok),
            ExitReports::Kubelet
        ));
        let debugged = json!({ "restartPolicy": "Never", "containers": [{ "name": "c" }],
            "ephemeralContainers": [{ "name": "debug" }] });
        assert!(!pod_ended_in_success(
            &pod(debugged, ok.clone()),
            ExitReports::Kubelet
        ));
        // Containers that may restart, or processes that may outlive their container.
        for spec in [
            json!({ "restartPolicy": "OnFailure", "containers": [{ "name": "c" }] }),
            json!({ "restartPolicy": "Never", "containers": [{ "name": "c", "restartPolicy": "Always" }] }),
            json!({ "restartPolicy": "Never", "shareProcessNamespace": true, "containers": [{ "name": "c" }] }),
            json!({ "restartPolicy": "Never", "hostPID": true, "containers": [{ "name": "c" }] }),
        ] {
            assert!(
                !pod_ended_in_success(&pod(spec.clone(), ok.clone()), ExitReports::Kubelet),
                "{spec}"
            );
        }
    }

    /// A Pod of `spec` whose kubelet reports `statuses`, annotated `annotations`.
    fn annotated_pod(
        spec: serde_json::Value,
        statuses: serde_json::Value,
        annotations: serde_json::Value,
    ) -> Pod {
        serde_json::from_value(json!({ "metadata": { "annotations": annotations },
                                       "spec": spec, "status": statuses }))
        .unwrap()
    }

    fn running(name: &str) -> serde_json::Value {
        json!({ "name": name, "image": "i", "imageID": "", "ready": true,
                "restartCount": 0, "state": { "running": {} } })
    }

    #[test]
    fn early_hand_off_on_the_guards_report_stands_for_its_guarded_container_when_trusted() {
        let guarded = |name: &str| {
            json!({ "name": name,
            "command": ["/lockwarden-guard/lockwarden", "guard", "--", "sh", "-c", "work"] })
        };
        let one = json!({ "restartPolicy": "Never", "containers": [guarded("c")] });
        let still_running = json!({ "phase": "Running", "containerStatuses": [running("c")] });
        let report = json!({ "guard-ended.lockwarden.io/c": "succeeded" });
        let reported = annotated_pod(one.clone(), still_running.clone(), report.clone());
        let trusted = ExitReports::KubeletAndGuard;
        assert!(pod_ended_in_success(&reported, trusted));
        // Untrusted (no policy confines who writes it): only the kubelet's word counts.
        assert!(!pod_ended_in_success(&reported, ExitReports::Kubelet));
        // No report, another value, another container's report.
        for annotations in [
            json!({}),
            json!({ "guard-ended.lockwarden.io/c": "failed" }),
            json!({ "guard-ended.lockwarden.io/d": "succeeded" }),
        ] {
            let pod = annotated_pod(one.clone(), still_running.clone(), annotations.clone());
            assert!(!pod_ended_in_success(&pod, trusted), "{annotations}");
        }
        // A container that does not run the guard: nobody there could know.
        let unguarded = json!({ "restartPolicy": "Never",
            "containers": [{ "name": "c", "command": ["sh", "-c", "work"] }] });
        let pod = annotated_pod(unguarded, still_running.clone(), report.clone());
        assert!(!pod_ended_in_success(&pod, trusted));
        // Killed after its report (its grace ran out, the OOM killer): it failed.
        let killed = json!({ "containerStatuses": [exited("c", 137)] });
        let pod = annotated_pod(one.clone(), killed, report.clone());
        assert!(!pod_ended_in_success(&pod, trusted));
        // Every container needs its word: the other one's report, or its exit.
        let two = json!({ "restartPolicy": "Never", "containers": [guarded("c"), guarded("d")] });
        let both_running = json!({ "containerStatuses": [running("c"), running("d")] });
        let pod = annotated_pod(two.clone(), both_running, report.clone());
        assert!(!pod_ended_in_success(&pod, trusted));
        let d_exited = json!({ "containerStatuses": [running("c"), exited("d", 0)] });
        let pod = annotated_pod(two, d_exited, report.clone());
        assert!(pod_ended_in_success(&pod, trusted));
        // A sidecar still runs while the main container's guard reports: the kubelet's
        // word for it is needed. And the Pod-level conditions stay.
        let with_sidecar = json!({ "restartPolicy": "Never", "containers": [guarded("c")],
            "initContainers": [{ "name": "side", "restartPolicy": "Always" }] });
        let sidecar_running = json!({ "containerStatuses": [running("c")],
            "initContainerStatuses": [running("side")] });
        let pod = annotated_pod(with_sidecar, sidecar_running, report.clone());
        assert!(!pod_ended_in_success(&pod, trusted));
        let shared = json!({ "restartPolicy": "Never", "shareProcessNamespace": true,
            "containers": [guarded("c")] });
        let pod = annotated_pod(shared, still_running, report.clone());
        assert!(!pod_ended_in_success(&pod, trusted));
        let failed = json!({ "phase": "Failed", "containerStatuses": [running("c")] });
        let pod = annotated_pod(one, failed, report);
        assert!(!pod_ended_in_success(&pod, trusted));
    }

    fn needed(value: serde_json::Value) -> Result<Duration, DelayTooLong> {
        needed_lock_delay(Some(&spec(value)), &SafetyMargins::default())
    }

    /// The inequality of docs/design.md §6.3 holds for the delay found, and not for one
    /// second less (it is the smallest whole number of seconds).
    fn covers(p: Duration, d: Duration, m: &SafetyMargins) -> bool {
        p.as_secs_f64() < (d + m.grace).as_secs_f64() * (1.0 - m.drift) + m.margin.as_secs_f64()
    }

    #[test]
    fn rule8_the_default_grace_of_30s_needs_a_37s_delay() {
        let margins = SafetyMargins::default();
        let pod = spec(json!({ "containers": [{ "name": "c" }] }));
        let d = needed_lock_delay(Some(&pod), &margins).unwrap();
        assert_eq!(d, Duration::from_secs(37));
        let p = outlive_bound(Some(&pod), &margins);
        assert!(covers(p, d, &margins), "P {p:?} covered by D {d:?}");
        assert!(!covers(p, d - Duration::from_secs(1), &margins));
        // No Pod spec known: the default grace too.
        assert_eq!(needed_lock_delay(None, &margins), Ok(d));
    }

    #[test]
    fn rule8_an_explicit_grace_sets_the_delay() {
        let one =
            needed(json!({ "terminationGracePeriodSeconds": 1, "containers": [{ "name": "c" }] }));
        assert_eq!(one, Ok(Duration::from_secs(7)));
        let zero =
            needed(json!({ "terminationGracePeriodSeconds": 0, "containers": [{ "name": "c" }] }));
        assert_eq!(zero, Ok(Duration::from_secs(6)));
        let long = needed(
            json!({ "terminationGracePeriodSeconds": 120, "containers": [{ "name": "c" }] }),
        );
        assert_eq!(long, Ok(Duration::from_secs(131)));
    }

    #[test]
    fn rule8_a_prestop_hook_adds_the_kubelets_2s_extension() {
        let hook = json!({ "preStop": { "exec": { "command": ["sleep", "1"] } } });
        let plain = needed(json!({ "containers": [{ "name": "c" }] })).unwrap();
        let main = needed(json!({ "containers": [{ "name": "c", "lifecycle": hook }] })).unwrap();
        let sidecar = needed(json!({
            "containers": [{ "name": "c" }],
            "initContainers": [{ "name": "s", "restartPolicy": "Always", "lifecycle": hook }],
        }))
        .unwrap();
        assert_eq!(plain, Duration::from_secs(37));
        assert_eq!(main, Duration::from_secs(39));
        assert_eq!(sidecar, main);
    }

    #[test]
    fn stop_a_lock_delay_below_the_needed_one_is_warned_about_naming_both() {
        let ran = |name: &str, delay: u64, supports: bool| Ran {
            name: name.into(),
            lock_delay: Duration::from_secs(delay),
            supports_lock_delay: supports,
            ..Ran::default()
        };
        let locks = RanWith(vec![
            ran("short", 10, true),
            ran("enough", 37, true),
            ran("zookeeper", 0, false),
        ]);
        let warnings = too_short(&locks, Duration::from_secs(37));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].starts_with("lock short has a lockDelay of 10s, below the 37s"),
            "{warnings:?}"
        );
    }

    #[test]
    fn stop_a_grace_too_long_for_the_cap_is_refused_naming_grace_needed_and_maximum() {
        let err = needed(
            json!({ "terminationGracePeriodSeconds": 3600, "containers": [{ "name": "c" }] }),
        )
        .unwrap_err();
        assert_eq!(err.grace_seconds, 3600);
        assert!(err.needed > MAX_LOCK_DELAY);
        let text = err.to_string();
        assert!(
            text.contains("terminationGracePeriodSeconds 3600"),
            "{text}"
        );
        assert!(
            text.contains(&format!("{}s", err.needed.as_secs())),
            "{text}"
        );
        assert!(text.contains("maximum of 600s"), "{text}");
        // The largest grace the message names fits; one more second does not.
        let max = max_grace_seconds(&SafetyMargins::default()) as i64;
        let fits = needed(
            json!({ "terminationGracePeriodSeconds": max, "containers": [{ "name": "c" }] }),
        );
        assert!(fits.is_ok_and(|d| d <= MAX_LOCK_DELAY));
        let over = needed(
            json!({ "terminationGracePeriodSeconds": max + 2, "containers": [{ "name": "c" }] }),
        );
        assert!(over.is_err());
    }
}

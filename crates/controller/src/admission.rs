//! Misuse of Job and Pod gating that the controller would refuse or never see, judged
//! the controller's way for an object about to be created: the specification of the
//! chart's admission rules (charts/lockwarden/templates/admission-rules.yaml, the same
//! rules in CEL, run by the API server). tests/bad_input/admission.rs runs one table
//! of objects through both and asserts they agree row by row.
//!
//! Each check is the controller's own: the annotations through
//! [`decide::locks_and_on_lock_lost`] (what [`Settings::of`] refuses with a Warning
//! Event), how the object is held back through its [`GatedWorkload`] methods, and the
//! Pod watch's label selector ([`GATED_SELECTOR`]). Not here: `lockwarden.io/lost-grace`,
//! whose maximum depends on the safety margins ([`decide::lost_grace`]).
//!
//! [`Settings::of`]: super::gating::Settings::of
//! [`GATED_SELECTOR`]: super::pods::GATED_SELECTOR

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::gating::decide::AnnotationError;
use super::gating::{GUARD_ANNOTATION, GUARD_PATH_ANNOTATION, GatedWorkload, decide};
use super::jobs::JOB;
use super::pods::{GATED_LABEL, POD, SCHEDULING_GATE};

/// Why a workload created like this is misuse: the message the admission rules give.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Misuse {
    /// Annotations the controller refuses.
    #[error(transparent)]
    Annotations(#[from] AnnotationError),
    /// A lock named, but the workload is not held back: it would run unguarded (the
    /// kind's message, as its Warning says it).
    #[error("{0}")]
    NotHeldBack(String),
    /// A Pod with the scheduling gate but not the label: never watched.
    #[error(
        "the Pod has the scheduling gate {SCHEDULING_GATE} but not the label \
         {GATED_LABEL}: \"true\"; lockwarden watches labelled Pods only, so it would \
         stay gated forever"
    )]
    GateWithoutLabel,
    /// Held back by lockwarden's gate without a lock named (the kind's message).
    #[error("{0}")]
    GateWithoutLock(String),
    /// `lockwarden.io/guard: "true"` on containers without a command to wrap.
    #[error(
        "{GUARD_ANNOTATION}: \"true\" but container {} has no command, so the guard cannot \
         wrap it",
        .containers.join(", ")
    )]
    NoCommand { containers: Vec<String> },
    /// `lockwarden.io/guard-path` that is not an absolute path ending in `/lockwarden`:
    /// the controller would not know the wrapped commands for the guard.
    #[error(
        "{GUARD_PATH_ANNOTATION} \"{path}\" is not an absolute path ending in /lockwarden: \
         name the lockwarden binary in the workload image, such as /usr/local/bin/lockwarden"
    )]
    GuardPath { path: String },
    /// `lockwarden.io/guard-path` without `lockwarden.io/guard: "true"`: nothing would
    /// run the guard, though its path says the owner meant it to.
    #[error(
        "{GUARD_PATH_ANNOTATION} is set but {GUARD_ANNOTATION} is not \"true\": add \
         {GUARD_ANNOTATION}: \"true\" to run the workload under the guard, or remove guard-path"
    )]
    GuardPathWithoutGuard,
}

/// Why a Job created like this is misuse, if it is: annotations the controller
/// refuses, or a lock named on a Job that is not suspended (it would run unguarded).
pub fn job_misuse(job: &Job) -> Result<(), Misuse> {
    match decide::locks_and_on_lock_lost(job.annotations(), &JOB)? {
        Some(_) if !job.held_back() => Err(Misuse::NotHeldBack(job.not_held_back("a lock").1)),
        _ => Ok(()),
    }
}

/// Why a Pod created like this is misuse, if it is: the gate without the label (the
/// controller never sees it: it would stay gated forever); or, on a Pod the controller
/// sees (labelled), annotations it refuses, the gate with no lock named, or a lock
/// named without the gate (it would run unguarded). A Pod with neither the label nor
/// the gate is none of lockwarden's business.
pub fn pod_misuse(pod: &Pod) -> Result<(), Misuse> {
    let labelled = pod.labels().get(GATED_LABEL).map(String::as_str) == Some("true");
    let gated = pod.held_back();
    if gated && !labelled {
        return Err(Misuse::GateWithoutLabel);
    }
    if !labelled {
        return Ok(());
    }
    match decide::locks_and_on_lock_lost(pod.annotations(), &POD)? {
        None => pod
            .gate_without_lock()
            .map_or(Ok(()), |message| Err(Misuse::GateWithoutLock(message))),
        Some(_) if !gated => Err(Misuse::NotHeldBack(pod.not_held_back("a lock").1)),
        Some(_) => Ok(()),
    }
}

/// Why a workload of any gated kind, created like this with the guard's annotations,
/// is misuse, if it is (charts/lockwarden/templates/guard-injection.yaml, the same rules
/// in CEL and in this order): annotated `lockwarden.io/guard: "true"` with a container
/// without `command`, which the injection cannot wrap, since admission does not know its
/// image's ENTRYPOINT (the controller refuses it too, [`decide::guard_missing`]: it does
/// not run the guard); a `lockwarden.io/guard-path` the controller would not know for
/// the guard; or one without `lockwarden.io/guard: "true"`.
pub fn guard_misuse<W: GatedWorkload>(workload: &W) -> Result<(), Misuse> {
    let annotations = workload.annotations();
    let asked = annotations.get(GUARD_ANNOTATION).map(String::as_str) == Some("true");
    let path = annotations
        .get(GUARD_PATH_ANNOTATION)
        .filter(|p| !p.is_empty());
    if asked {
        no_command(workload)?;
    }
    match path {
        Some(path) if !(path.starts_with('/') && path.ends_with("/lockwarden")) => {
            Err(Misuse::GuardPath { path: path.clone() })
        }
        Some(_) if !asked => Err(Misuse::GuardPathWithoutGuard),
        _ => Ok(()),
    }
}

/// [`Misuse::NoCommand`], naming the containers without a command.
fn no_command<W: GatedWorkload>(workload: &W) -> Result<(), Misuse> {
    let containers: Vec<String> = workload
        .pod_spec()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .filter(|c| c.command.as_ref().is_none_or(Vec::is_empty))
        .map(|c| c.name.clone())
        .collect();
    if containers.is_empty() {
        return Ok(());
    }
    Err(Misuse::NoCommand { containers })
}

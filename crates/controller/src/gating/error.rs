//! Why a reconcile of a gated workload failed: the step of the gating machine that
//! failed, for which workload, and for which lock where it was about one. Every one is
//! retried soon (mostly a lost race on a resourceVersion precondition); the texts go
//! to the log only.

/// A request about one of a workload's DistributedLocks (or about what its claim
/// names) that the API server refused or did not answer.
#[derive(Debug, thiserror::Error)]
#[error("lock {lock}: {source}")]
pub struct LockRequestFailed {
    /// The DistributedLock (or lock template) the request was about.
    pub lock: String,
    #[source]
    pub source: kube::Error,
}

impl LockRequestFailed {
    /// The failure of a request about `lock`.
    pub fn about(lock: &str) -> impl FnOnce(kube::Error) -> LockRequestFailed + '_ {
        move |source| LockRequestFailed {
            lock: lock.to_string(),
            source,
        }
    }
}

/// The step of the gating machine that failed; the first field names the workload
/// (`Job ns/name`).
#[derive(Debug, thiserror::Error)]
pub enum GatingError {
    /// Reading what its gate names (its annotations, or its Kueue check's parameters).
    #[error("{0}: cannot read what its gate names: {1}")]
    Gate(String, #[source] kube::Error),
    /// Asking whether another controller admits it.
    #[error("{0}: cannot tell whether another controller admits it: {1}")]
    ManagedElsewhere(String, #[source] kube::Error),
    /// Adding or removing our finalizer.
    #[error("{0}: cannot write its finalizer: {1}")]
    Finalizer(String, #[source] kube::Error),
    /// Writing why it waits or what was done (its status annotation, or where its
    /// kind shows a waiting workload).
    #[error("{0}: cannot report on it: {1}")]
    Report(String, #[source] kube::Error),
    /// Observing whether its processes have ended.
    #[error("{0}: cannot tell whether its processes have ended: {1}")]
    ProcessesEnded(String, #[source] kube::Error),
    /// Deleting its Pods, once it is deleted.
    #[error("{0}: cannot delete its Pods: {1}")]
    DeletePods(String, #[source] kube::Error),
    /// Reading its locks to order them.
    #[error("{0}: cannot order its locks: {1}")]
    Order(String, #[source] LockRequestFailed),
    /// Claiming, creating or letting go of a lock while taking them in order.
    #[error("{0}: cannot take its locks: {1}")]
    Take(String, #[source] LockRequestFailed),
    /// Reading the locks a running workload runs with.
    #[error("{0}: cannot check the locks it runs with: {1}")]
    Standing(String, #[source] LockRequestFailed),
    /// Letting its locks go.
    #[error("{0}: cannot let its locks go: {1}")]
    LetGo(String, #[source] LockRequestFailed),
    /// Telling its owner it can never start (the kind's way).
    #[error("{0}: cannot refuse it: {1}")]
    Refuse(String, #[source] kube::Error),
    /// Asking its kind whether it may start now that its locks are held.
    #[error("{0}: cannot tell whether it may start: {1}")]
    ReadyToStart(String, #[source] kube::Error),
    /// The one write that starts it with its fences.
    #[error("{0}: cannot start it: {1}")]
    Start(String, #[source] kube::Error),
    /// Stopping it after a loss of its lock.
    #[error("{0}: cannot stop it: {1}")]
    Stop(String, #[source] kube::Error),
}

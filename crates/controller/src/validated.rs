//! A `DistributedLock` spec checked once and parsed into the values the controller
//! works with, so that nothing after validation parses (or `expect`s) again.

use std::time::Duration;

use lockwarden_api::{BackendKind, DistributedLock, SecretRef, SelectedSpec, SpecError};
use lockwarden_core::{Permits, Queueing, RunKey};
use lockwarden_stores::{ConnectOptions, Target};

/// Where a lock lives and how to reach it (everything but the credentials themselves).
///
/// It needs only a usable `spec.backend`, not a fully valid spec, so that a lock whose
/// spec was made invalid while the controller was away can still be released.
#[derive(Clone, Debug)]
pub struct LockAddress {
    /// `status.backend`.
    pub kind: BackendKind,
    /// `status.key`: the lock's key as a URL (the same forms as the CLI's); it also
    /// indexes the locks waiting on one key.
    pub key: String,
    /// The typed key the backend is built for.
    pub target: Target,
    /// How to reach the store; `credentials` and `kube_client` are left unset.
    pub connect_options: ConnectOptions,
    /// The Secret (in the lock's own namespace) holding the store's credentials.
    pub credentials_secret: Option<SecretRef>,
    /// Held as another tool's lock at that tool's name (a Terraform/OpenTofu state
    /// lock, `terraformCompatible`; docs/design.md §6.8): unfenced across releases and
    /// unqueued, which status says.
    pub as_a_tools_lock: bool,
}

impl LockAddress {
    /// The address of `lock`, from its one store part: checked against that store's
    /// rules (a target is never built from names a store refuses) and nothing else.
    pub fn of(lock: &DistributedLock) -> Result<LockAddress, SpecError> {
        let selected = lock.spec.backend.selected()?;
        selected.validate()?;
        Ok(LockAddress::of_selected(selected, lock_namespace(lock)))
    }

    /// The address of the store part `selected` names, for a lock in `lock_namespace`
    /// (a Lease's namespace when the spec names none).
    fn of_selected(selected: SelectedSpec<'_>, lock_namespace: &str) -> LockAddress {
        let target = selected.target(lock_namespace);
        LockAddress {
            kind: selected.kind(),
            key: target.to_string(),
            target,
            connect_options: selected.connect_options(),
            credentials_secret: selected.credentials_secret().cloned(),
            as_a_tools_lock: selected.holds_a_tools_lock(),
        }
    }
}

/// A spec that passed [`DistributedLockSpec::validate`], with every duration parsed and
/// the holder identity decided: made once per reconcile, and what its phases read.
///
/// [`DistributedLockSpec::validate`]: lockwarden_api::DistributedLockSpec::validate
#[derive(Clone, Debug)]
pub struct ValidatedSpec {
    pub address: LockAddress,
    pub lease: Duration,
    /// Less than half of `lease` (checked).
    pub renew_interval: Duration,
    /// `None`: wait forever.
    pub acquire_timeout: Option<Duration>,
    /// `spec.holderIdentity`, or `<clusterName>/<namespace>/<name>`.
    pub holder: String,
    /// `spec.permits` and `spec.mode` (its default applied; checked).
    pub permits: Permits,
    /// `spec.lockDelay` (at most `MAX_LOCK_DELAY`); zero when unset.
    pub lock_delay: Duration,
    /// `spec.queue`, `spec.priority`, `spec.weight` (checked); `None`: no queue.
    pub queue: Option<Queueing>,
    /// `spec.runKey` and `spec.runsKept` (checked): once per run (§6.7).
    pub run: Option<(RunKey, usize)>,
}

impl ValidatedSpec {
    /// Validates `lock.spec`; `cluster_name` is the first part of the default holder
    /// identity.
    pub fn of(lock: &DistributedLock, cluster_name: &str) -> Result<ValidatedSpec, SpecError> {
        let spec = &lock.spec;
        // Every rule of the CRD, the store's included: the address needs no check of
        // its own after it.
        spec.validate()?;
        let address = LockAddress::of_selected(spec.backend.selected()?, lock_namespace(lock));
        Ok(ValidatedSpec {
            address,
            lease: spec.lease_duration()?,
            renew_interval: spec.renew_interval()?,
            acquire_timeout: spec.acquire_timeout()?,
            holder: lock.holder_identity(cluster_name),
            permits: spec.permits(),
            lock_delay: spec.lock_delay()?.unwrap_or_default(),
            queue: spec.queueing()?,
            run: spec.run()?,
        })
    }
}

/// The DistributedLock's namespace (`default` when unset, as for `lock_key`).
pub(crate) fn lock_namespace(lock: &DistributedLock) -> &str {
    lock.metadata.namespace.as_deref().unwrap_or("default")
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockwarden_api::{DistributedLockSpec, KubernetesBackend, ZooKeeperBackend};

    fn lock(spec: DistributedLockSpec) -> DistributedLock {
        let mut lock = DistributedLock::new("db", spec);
        lock.metadata.namespace = Some("team".into());
        lock
    }

    #[test]
    fn parses_everything_once() {
        let mut spec = DistributedLockSpec {
            lease_duration: "30s".into(),
            renew_interval: "5s".into(),
            acquire_timeout: Some("2m".into()),
            ..Default::default()
        };
        spec.backend.zookeeper = Some(ZooKeeperBackend {
            servers: vec!["127.0.0.1:2181".into()],
            path: "/locks/db".into(),
            session_timeout: Some("4s".into()),
            ..Default::default()
        });
        let v = ValidatedSpec::of(&lock(spec), "east").expect("valid");
        assert_eq!(v.lease, Duration::from_secs(30));
        assert_eq!(v.renew_interval, Duration::from_secs(5));
        assert_eq!(v.acquire_timeout, Some(Duration::from_secs(120)));
        assert_eq!(
            v.address.connect_options.zookeeper.session_timeout,
            Some(Duration::from_secs(4))
        );
        assert_eq!(v.holder, "east/team/db");
        assert_eq!(v.permits, lockwarden_core::Permits::MUTEX);
        assert_eq!(v.address.kind, BackendKind::ZooKeeper);
        assert_eq!(v.address.key, "zk://127.0.0.1:2181/locks/db");
        assert_eq!(
            v.address.target,
            Target::parse("zk://127.0.0.1:2181/locks/db").unwrap()
        );
    }

    #[test]
    fn kubernetes_key_defaults_to_the_lock_namespace() {
        let mut spec = DistributedLockSpec::default();
        spec.backend.kubernetes = Some(KubernetesBackend {
            lease_name: "db".into(),
            namespace: None,
        });
        let v = ValidatedSpec::of(&lock(spec), "east").expect("valid");
        assert_eq!(v.address.key, "k8s://team/db");
        assert_eq!(v.address.target, Target::parse("k8s://team/db").unwrap());
        assert!(v.address.credentials_secret.is_none());
    }

    #[test]
    fn an_invalid_spec_is_refused() {
        let mut spec = DistributedLockSpec {
            lease_duration: "10s".into(),
            renew_interval: "5s".into(),
            ..Default::default()
        };
        spec.backend.kubernetes = Some(KubernetesBackend {
            lease_name: "db".into(),
            namespace: None,
        });
        assert!(matches!(
            ValidatedSpec::of(&lock(spec), "east"),
            Err(SpecError::RenewTooLong { .. })
        ));
        // No backend at all.
        assert!(matches!(
            ValidatedSpec::of(&lock(DistributedLockSpec::default()), "east"),
            Err(SpecError::Backend { .. })
        ));
    }
}

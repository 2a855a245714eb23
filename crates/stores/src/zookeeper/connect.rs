//! Contenders on the process's sessions, and the errors of the ZooKeeper client
//! (feature `zookeeper`).

use zookeeper_client::Error as ZkError;

use lockwarden_core::LockError;

use super::{ZkKey, ZkLock, ZkSessions, ZooKeeperOptions};
use crate::store::{ConnectError, RecordedAcquisition};

/// A contender for the lock at `key`, on the process-wide session of its ensemble that
/// asks for `options.session_timeout`.
pub fn connect(key: &ZkKey, options: &ZooKeeperOptions) -> Result<ZkLock, LockError> {
    ZkSessions::global().lock_with_timeout(
        &key.connect_string(),
        &key.path,
        options.session_timeout,
    )
}

/// Releases `recorded` from a process that did not acquire it: the lock is a queue
/// entry of another process's session (the keeper's); it is deleted, conditioned on
/// the recorded version ([`ZkLock::release_entry`]).
pub async fn release_recorded(
    key: &ZkKey,
    options: &ZooKeeperOptions,
    recorded: &RecordedAcquisition,
) -> Result<(), ConnectError> {
    let lock = connect(key, options)?;
    Ok(lock
        .release_entry(&recorded.version, &recorded.nonce)
        .await?)
}

/// The session is gone: nothing on it will ever succeed again.
pub(super) fn session_ended(e: &ZkError) -> bool {
    matches!(
        e,
        ZkError::SessionExpired | ZkError::ClientClosed | ZkError::AuthFailed
    )
}

/// A refusal that retrying will not change.
pub(super) fn permanent(e: &ZkError) -> bool {
    matches!(
        e,
        ZkError::NoAuth
            | ZkError::InvalidAcl
            | ZkError::BadArguments(_)
            | ZkError::NoChildrenForEphemerals
            | ZkError::Unimplemented
            | ZkError::QuotaExceeded
            | ZkError::MarshallingError
    )
}

/// The server answered a write with a definite "did not apply". Anything else that is
/// not success (connection loss, timeout, I/O errors…) may have applied.
pub(super) fn definite(e: &ZkError) -> bool {
    permanent(e)
        || matches!(
            e,
            ZkError::NoNode | ZkError::NodeExists | ZkError::BadVersion | ZkError::NotEmpty
        )
}

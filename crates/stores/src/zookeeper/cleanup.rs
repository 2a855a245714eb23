//! Deleting our own znodes in the background: a queue entry must not outlive the
//! contender that made it (a dropped or cancelled acquisition, an unconfirmed
//! release), or it would block the queue for as long as the shared session lives.

use std::sync::Arc;
use std::time::Duration;

use zookeeper_client::Error as ZkError;

use super::session::Generation;
use super::{ZkLock, session_ended};

/// What a background cleanup deletes.
#[derive(Clone, Copy, Debug)]
pub(super) enum Cleanup {
    /// The znode at the path.
    Node,
    /// Every child whose name starts with the path's last segment (a protected
    /// prefix `_c_<uuid>-lock-`).
    Prefix,
}

/// Deletes a znode of ours in the background, retrying until it is gone or its
/// session ends (which deletes it anyway). Only znodes our session owns are deleted.
pub(super) fn spawn_cleanup(generation: Arc<Generation>, path: String, what: Cleanup) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        // No runtime (dropped outside one): the znode goes with the session.
        return;
    };
    runtime.spawn(async move {
        let mut pause = Duration::from_millis(100);
        loop {
            if generation.is_gone() {
                return;
            }
            let done = match what {
                Cleanup::Node => delete_own(&generation, &path).await,
                Cleanup::Prefix => delete_own_prefixed(&generation, &path).await,
            };
            match done {
                Ok(()) => return,
                Err(e) if session_ended(&e) => return,
                Err(e) => {
                    tracing::debug!(%path, error = %e, "background cleanup of a queue entry failed; retrying");
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    });
}

/// Deletes the znode at `path` if our session owns it. `Ok` when it is gone.
async fn delete_own(generation: &Generation, path: &str) -> Result<(), ZkError> {
    let stat = ZkLock::bounded(generation, generation.client.check_stat(path)).await?;
    match stat {
        Some(stat) if stat.ephemeral_owner == generation.id => {
            match ZkLock::bounded(
                generation,
                generation.client.delete(path, Some(stat.version)),
            )
            .await
            {
                Ok(()) | Err(ZkError::NoNode) => Ok(()),
                // Rewritten meanwhile: look again.
                Err(ZkError::BadVersion) => Err(ZkError::BadVersion),
                Err(e) => Err(e),
            }
        }
        _ => Ok(()),
    }
}

/// Deletes every child of ours whose name starts with the last segment of `prefix`.
async fn delete_own_prefixed(generation: &Generation, prefix: &str) -> Result<(), ZkError> {
    let Some((dir, name)) = prefix.rsplit_once('/') else {
        return Ok(());
    };
    let children = match ZkLock::bounded(generation, generation.client.list_children(dir)).await {
        Ok(children) => children,
        Err(ZkError::NoNode) => return Ok(()),
        Err(e) => return Err(e),
    };
    for child in children.iter().filter(|c| c.starts_with(name)) {
        delete_own(generation, &format!("{dir}/{child}")).await?;
    }
    Ok(())
}

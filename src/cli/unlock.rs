//! `lockwarden unlock FILE`: release the lock a lock file describes (s3lock's `unlock`).
//!
//! The release happens only if the stored record is still this acquisition's (same
//! nonce), with a write conditioned on the version in the file. Otherwise:
//! - `already unlocked`: the record is released, gone, or expired and released;
//! - `lock mismatch`: someone else holds it now (a takeover) — their lock is left alone.
//!
//! `--force` ignores those two errors and removes the lock file; it never releases
//! anyone else's lock.

use std::path::PathBuf;

use clap::Args;

use super::lockfile::LockFile;
use super::{BackendArgs, CliError, exit, print_warning};
use crate::backend::target::Target;
use crate::backend::zookeeper::ZkSessions;
use crate::lock::{LockBackend, LockError, LockState, LostReason, Stored, Version};

#[derive(Args, Debug)]
pub struct UnlockArgs {
    /// Lock file written by `lockwarden lock`
    #[arg(value_name = "FILE")]
    pub file: PathBuf,

    /// Ignore "already unlocked" and "lock mismatch" errors and remove the lock file
    /// (never releases a lock someone else holds)
    #[arg(short, long)]
    pub force: bool,

    #[command(flatten)]
    pub backend: BackendArgs,
}

pub async fn run(args: UnlockArgs) -> Result<u8, CliError> {
    let file = LockFile::read(&args.file)?;
    let target = file.target();
    let backend = target
        .connect(&args.backend.options(Some(&file.backend)))
        .await?;
    let result = match &target {
        Target::ZooKeeper { .. } => unlock_zookeeper(&target, backend.as_ref(), &file).await,
        _ => unlock_record(backend.as_ref(), &file).await,
    };
    match result {
        Ok(()) => {
            LockFile::remove(&args.file)?;
            println!("{target} has been unlocked");
            println!("delete {}", args.file.display());
            Ok(exit::OK)
        }
        Err(e @ (CliError::AlreadyUnlocked { .. } | CliError::Mismatch { .. })) if args.force => {
            print_warning(&format!("{e}; removing the lock file anyway (--force)"));
            LockFile::remove(&args.file)?;
            println!("delete {}", args.file.display());
            Ok(exit::OK)
        }
        Err(e) => Err(e),
    }
}

/// Stores with one record (S3, DynamoDB, Kubernetes Lease): re-attach by nonce, then
/// release with a write conditioned on the file's version.
async fn unlock_record(backend: &dyn LockBackend, file: &LockFile) -> Result<(), CliError> {
    let url = backend.url().to_string();
    let mut lease = match backend.resume(&file.holder, &file.nonce).await {
        Ok(lease) => lease,
        Err(LockError::Lost { reason, .. }) => return Err(not_ours(&url, reason)),
        Err(e) => return Err(e.into()),
    };
    // The first write is conditioned on what the file says; should the record have
    // moved on within this same acquisition, the engine re-reads and follows it.
    lease.version = Version(file.version.clone());
    match backend.release(&lease).await {
        Ok(()) => Ok(()),
        Err(LockError::Lost { reason, .. }) => Err(not_ours(&url, reason)),
        Err(LockError::NotHeld { .. }) => Err(CliError::AlreadyUnlocked {
            url,
            detail: Some("released elsewhere".into()),
        }),
        Err(e) => Err(e.into()),
    }
}

/// Maps "this acquisition no longer holds the lock" to s3lock's two errors.
fn not_ours(url: &str, reason: LostReason) -> CliError {
    let url = url.to_string();
    match reason {
        LostReason::Deleted => CliError::AlreadyUnlocked {
            url,
            detail: Some("the lock record is gone".into()),
        },
        LostReason::ReleasedElsewhere | LostReason::SessionExpired | LostReason::EntryGone => {
            CliError::AlreadyUnlocked { url, detail: None }
        }
        LostReason::TakenOver(by) => CliError::Mismatch {
            url,
            detail: format!(
                "the lock was taken over and is now held by {} (fence {}); left it alone",
                by.holder, by.fence
            ),
        },
        LostReason::Foreign(found) => CliError::Mismatch {
            url,
            detail: format!(
                "the record was replaced by one that is not a lockwarden lock: {found}"
            ),
        },
        LostReason::NotOurs => CliError::Mismatch {
            url,
            detail: "the stored record belongs to another acquisition".into(),
        },
    }
}

/// ZooKeeper: the lock is the keeper's znode; delete it, conditioned on the version
/// in the file. The keeper notices at its next heartbeat and exits.
async fn unlock_zookeeper(
    target: &Target,
    backend: &dyn LockBackend,
    file: &LockFile,
) -> Result<(), CliError> {
    use zookeeper_client::Error as ZkError;
    let Target::ZooKeeper {
        servers,
        chroot,
        path,
    } = target
    else {
        unreachable!("called for zk:// targets only");
    };
    let url = backend.url().to_string();
    let (name, version) = file
        .version
        .rsplit_once(':')
        .expect("checked by LockFile::read");
    let version: i32 = version.parse().map_err(|_| CliError::Reported {
        code: exit::ERROR,
        message: format!(
            "{url}: lock file version {:?} is not NAME:NUMBER",
            file.version
        ),
    })?;
    let node = format!("{}{path}/{name}", chroot.as_deref().unwrap_or(""));
    let unavailable = |cause: String| {
        CliError::Lock(LockError::Unavailable {
            url: url.clone(),
            cause,
        })
    };
    let client = ZkSessions::global()
        .get(&servers.join(","))?
        .client()
        .await?;
    let mut uncertain = false;
    for _ in 0..3 {
        match client.delete(&node, Some(version)).await {
            Ok(()) => return Ok(()),
            Err(ZkError::NoNode) if uncertain => return Ok(()),
            Err(ZkError::NoNode) => return Err(zk_gone(backend, &url, file).await),
            Err(ZkError::BadVersion) => {
                return Err(CliError::Mismatch {
                    url,
                    detail: format!("queue entry {name} was rewritten since it was locked"),
                });
            }
            Err(e @ (ZkError::ConnectionLoss | ZkError::Timeout)) => {
                tracing::debug!(url = %url, error = %e, "unlock outcome unknown; retrying");
                uncertain = true;
            }
            Err(e) => return Err(unavailable(format!("deleting queue entry {name}: {e}"))),
        }
    }
    Err(unavailable(format!(
        "deleting queue entry {name}: no answer from ZooKeeper"
    )))
}

/// Our entry is gone: released (already unlocked) or taken over (mismatch)?
async fn zk_gone(backend: &dyn LockBackend, url: &str, file: &LockFile) -> CliError {
    match backend.inspect().await {
        Ok(Some(Stored { record: Ok(r), .. }))
            if r.state == LockState::Held && r.nonce != file.nonce =>
        {
            CliError::Mismatch {
                url: url.to_string(),
                detail: format!(
                    "the lock is now held by {} (fence {}); left it alone",
                    r.holder, r.fence
                ),
            }
        }
        _ => CliError::AlreadyUnlocked {
            url: url.to_string(),
            detail: None,
        },
    }
}

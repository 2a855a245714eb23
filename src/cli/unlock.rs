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
use lockwarden_core::{LockError, LostReason, Version, when_reachable};
use lockwarden_stores::{
    ConnectError, ConnectOptions, RecordedAcquisition, Target, release_recorded,
};

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
    let recorded = RecordedAcquisition {
        holder: file.holder.clone(),
        nonce: file.nonce.clone(),
        version: Version(file.version.clone()),
    };
    let options = args.backend.options(Some(&file.backend));
    let result = match release_when_reachable(&target, &options, &recorded).await {
        Ok(()) => Ok(()),
        Err(ConnectError::Lock(LockError::Lost { url, reason })) => Err(not_ours(&url, reason)),
        Err(ConnectError::Lock(LockError::NotHeld { url, .. })) => Err(CliError::AlreadyUnlocked {
            url,
            detail: Some("released elsewhere".into()),
        }),
        Err(ConnectError::Lock(e)) => Err(e.into()),
        Err(e) => Err(e.into()),
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

/// [`release_recorded`], asked again while the store cannot be reached yet, for the
/// connect timeout (as `lock` and `status` do): a store that is starting, or a
/// ZooKeeper ensemble electing a leader, is not yet a reason to give up. The release
/// is conditional on the recorded version, so asking again cannot release anyone
/// else's lock.
async fn release_when_reachable(
    target: &Target,
    options: &ConnectOptions,
    recorded: &RecordedAcquisition,
) -> Result<(), ConnectError> {
    let attempt = || async {
        match release_recorded(target, options, recorded).await {
            Err(ConnectError::Lock(e)) if e.is_transient() => Err(e),
            other => Ok(other),
        }
    };
    when_reachable(attempt)
        .await
        .unwrap_or_else(|unreachable| Err(unreachable.into()))
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

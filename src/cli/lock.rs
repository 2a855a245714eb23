//! `lockwarden lock URL`: acquire, write a lock file, exit (s3lock's `lock`).

use super::lockfile::{LockFile, check_writable};
use super::output::report_locked;
use super::progress::Progress;
use super::{CliError, exit, keeper};

pub use super::args::{DEFAULT_LEASE, LockArgs};

pub async fn run(args: LockArgs) -> Result<u8, CliError> {
    if args.keeper {
        return keeper::keep(args).await;
    }
    // Before anything is started (the ZooKeeper keeper gets the same flags).
    let request = args.request()?;
    let path = args.output_path();
    check_writable(&path)?;
    if args.url.is_session_bound() {
        return keeper::lock_via_keeper(&args, &path).await;
    }

    let backend = args.url.connect(&args.backend.options(None)).await?;
    let mut progress = Progress::new(backend.url(), args.wait);
    let lease = super::acquire(backend.as_ref(), &request, args.wait, |by, q| {
        progress.busy(by, q)
    })
    .await;
    progress.finish();
    let lease = lease?;

    let file = LockFile::new(&args.url, &lease, args.lease, args.backend.saved());
    if let Err(e) = file.create(&path) {
        // Without its file nobody could unlock it: let go at once.
        let undo = match backend.release(&lease).await {
            Ok(()) => "the lock was released again".to_string(),
            // The stored lease, a lock-delay included (rule 8): what contenders wait.
            Err(r) => format!(
                "releasing the lock again failed too ({r}); it expires after {}",
                humantime::format_duration(lease.record.lease)
            ),
        };
        return Err(CliError::Reported {
            code: exit::ERROR,
            message: format!("{}: {e}; {undo}", args.url),
        });
    }
    report_locked(&args.url, &lease, &path);
    Ok(exit::OK)
}

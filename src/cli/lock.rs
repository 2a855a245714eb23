//! `lockwarden lock URL`: acquire, write a lock file, exit (s3lock's `lock`).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::lockfile::{LockFile, check_writable};
use super::progress::Progress;
use super::{BackendArgs, CliError, default_holder, exit, keeper, print_warning};
use crate::backend::target::Target;
use crate::lock::{AcquireRequest, Lease};

/// Lease of a lock taken by `lock`. Nothing renews it once the command has exited, so
/// it is long; `unlock` ends it earlier, `--lease` changes it.
pub const DEFAULT_LEASE: &str = "1h";

#[derive(Args, Debug)]
#[command(after_help = "\
The lock is not renewed once `lock` has exited: it stays held until `unlock` or until its \
lease runs out (default 1h, unlike s3lock's locks, which never expire), after which another \
`lock` may take it over. On ZooKeeper (zk://) a lock lives as long as a session, so `lock` \
leaves a background process holding the session until `unlock` or the end of the lease.")]
pub struct LockArgs {
    /// The lock: s3://BUCKET/KEY, dynamodb://TABLE/KEY, zk://HOST:PORT[,HOST:PORT...]/PATH or k8s://NAMESPACE/LEASE-NAME
    #[arg(value_name = "URL", value_parser = super::parse_target)]
    pub url: Target,

    /// Wait up to this long for the lock (seconds, or a duration such as 5m); 0 = do not wait
    #[arg(short, long, value_name = "SECS", value_parser = super::parse_wait)]
    pub wait: Option<Duration>,

    /// Lock file to write [default: <last path segment>.lock]
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Take the lock over from its holder (a write conditioned on the version just read,
    /// never a blind overwrite); with --wait, only once the wait has run out
    #[arg(short, long)]
    pub force: bool,

    /// How long the lock stays held without `unlock`
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_LEASE, value_parser = super::parse_lease)]
    pub lease: Duration,

    /// Holder identity stored with the lock [default: user@host:pid]
    #[arg(long, value_name = "ID", value_parser = super::parse_holder)]
    pub holder: Option<String>,

    /// Free text stored with the lock (shown by `status`)
    #[arg(long, value_name = "TEXT")]
    pub data: Option<String>,

    #[command(flatten)]
    pub backend: BackendArgs,

    /// Internal: be the process that keeps a ZooKeeper lock's session.
    #[arg(long, hide = true)]
    pub keeper: bool,
}

impl LockArgs {
    pub(super) fn output_path(&self) -> PathBuf {
        self.output
            .clone()
            .unwrap_or_else(|| LockFile::default_path(&self.url))
    }

    pub(super) fn request(&self) -> AcquireRequest {
        AcquireRequest {
            holder: self.holder.clone().unwrap_or_else(default_holder),
            lease: self.lease,
            data: self.data.clone(),
            force: self.force,
        }
    }
}

pub async fn run(args: LockArgs) -> Result<u8, CliError> {
    if args.keeper {
        return keeper::keep(args).await;
    }
    let path = args.output_path();
    check_writable(&path)?;
    if args.url.is_session_bound() {
        return keeper::lock_via_keeper(&args, &path).await;
    }

    let backend = args.url.connect(&args.backend.options(None)).await?;
    let mut progress = Progress::new(backend.url(), args.wait);
    let lease = super::acquire(backend.as_ref(), &args.request(), args.wait, |by, q| {
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
            Err(r) => format!(
                "releasing the lock again failed too ({r}); it expires after {}",
                file.lease
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

/// Prints s3lock's two lines, and a warning after a takeover.
pub(super) fn report_locked(target: &Target, lease: &Lease, path: &std::path::Path) {
    if let Some(from) = &lease.forced_from {
        print_warning(&format!(
            "{target}: took the lock over from {} (fence {})",
            from.holder, from.fence
        ));
    }
    report_locked_lines(target, path);
}

pub(super) fn report_locked_lines(target: &Target, path: &std::path::Path) {
    println!("{target} has been locked");
    println!("create {}", path.display());
}

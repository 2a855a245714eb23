//! `lockwarden run URL -- COMMAND…`: hold the lock, renewed in the background, while
//! COMMAND runs; release it when COMMAND exits and exit with its status.
//!
//! COMMAND gets `LOCKWARDEN_FENCE` (pass it to whatever the lock protects, which
//! should reject writes carrying a lower fence), `LOCKWARDEN_HOLDER`, `LOCKWARDEN_URL`
//! and `LOCKWARDEN_NONCE`. If the lock is lost while COMMAND runs (taken over, record
//! deleted, or not renewed in time), COMMAND gets SIGTERM, then SIGKILL after
//! `--grace`, and `run` exits with [`exit::LOST`].

use std::ffi::OsString;
use std::process::ExitStatus;
use std::time::Duration;

use clap::Args;
use tokio::process::Child;
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::output::display_command;
use super::progress::Progress;
use super::{BackendArgs, CliError, PermitArgs, default_holder, exit, print_warning, sys};
use crate::backend::Target;
use crate::lock::{
    AcquireRequest, FenceToken, HeldLock, HolderState, Lease, LockBackend, LockState, LostReason,
    Permits, RenewPolicy, Stored,
};

/// Lease of a lock held by `run`: renewed every third of it, so a `run` that dies
/// (SIGKILL, machine loss) holds others off for about this long.
pub const DEFAULT_LEASE: &str = "30s";

#[derive(Args, Debug)]
#[command(after_help = "\
COMMAND gets LOCKWARDEN_FENCE, LOCKWARDEN_HOLDER, LOCKWARDEN_URL and LOCKWARDEN_NONCE in its \
environment. SIGTERM and SIGHUP sent to lockwarden are passed on to COMMAND; Ctrl-C reaches it \
from the terminal. run exits with COMMAND's status (128+N if signal N killed it), 3 if the lock \
is held elsewhere, 4 if the lock was lost while COMMAND ran (COMMAND got SIGTERM, then SIGKILL \
after --grace). On ZooKeeper the lease is the session timeout (10s).

More than one holder: `lockwarden run --permits 3 s3://locks/warehouse -- ./load.sh` runs at \
most 3 loads at once (a semaphore; each gets its own LOCKWARDEN_FENCE). Readers and a writer: \
`run --permits 16 --shared URL -- ./read.sh` and `run --permits 16 --exclusive URL -- \
./rewrite.sh`; the writer runs alone, and once it waits no new reader starts.")]
pub struct RunArgs {
    /// The lock: s3://BUCKET/KEY, dynamodb://TABLE/KEY, zk://HOST:PORT[,HOST:PORT...]/PATH or k8s://NAMESPACE/LEASE-NAME
    #[arg(value_name = "URL", value_parser = super::parse_target)]
    pub url: Target,

    /// Wait up to this long for the lock (seconds, or a duration such as 5m); 0 = do not wait
    #[arg(short, long, value_name = "SECS", value_parser = super::parse_wait)]
    pub wait: Option<Duration>,

    /// Lease: how long the lock outlives its last renewal (renewed every third of it)
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_LEASE, value_parser = super::parse_lease)]
    pub lease: Duration,

    /// Holder identity stored with the lock [default: user@host:pid]
    #[arg(long, value_name = "ID", value_parser = super::parse_holder)]
    pub holder: Option<String>,

    /// Take back at once a lock that this --holder still holds from an earlier run that
    /// never released it (a restart), instead of waiting out its lease: only if the
    /// stored holder is this one, by a write conditioned on the version read, with a new
    /// fence. Unsafe if two live processes share the holder name
    #[arg(long, requires = "holder")]
    pub reclaim: bool,

    /// Free text stored with the lock (shown by `status`)
    #[arg(long, value_name = "TEXT")]
    pub data: Option<String>,

    /// After the lock is lost: how long COMMAND has between SIGTERM and SIGKILL
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = super::parse_duration)]
    pub grace: Duration,

    /// The command to run while the lock is held (after `--`)
    #[arg(value_name = "COMMAND", required = true, num_args = 1.., trailing_var_arg = true)]
    pub command: Vec<OsString>,

    #[command(flatten)]
    pub permits: PermitArgs,

    #[command(flatten)]
    pub backend: BackendArgs,
}

pub async fn run(args: RunArgs) -> Result<u8, CliError> {
    let permits = args
        .permits
        .permits()
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let backend = args.url.connect(&args.backend.options(None)).await?;
    let url = backend.url().to_string();
    let lease = acquire(&args, permits, backend.as_ref()).await?;
    super::output::warn_if_taken_over(&url, &lease);

    let policy = RenewPolicy::for_lease(lease.record.lease);
    let (fence, holder, nonce) = (
        lease.fence(),
        lease.holder().to_string(),
        lease.nonce().to_string(),
    );
    let held = HeldLock::hold(backend.clone(), lease, policy);
    tracing::info!(%url, %fence, %holder, "lock held; starting the command");

    // Handle signals before COMMAND exists, so none can kill us and orphan it.
    let (mut term, mut hup, mut int) = match signals() {
        Ok(signals) => signals,
        Err(source) => {
            let _ = held.release().await;
            return Err(CliError::Io {
                context: format!("{url}: cannot handle signals"),
                source,
            });
        }
    };

    let shown = display_command(&args.command);
    let mut child = match spawn(&args.command, fence, &holder, &url, &nonce) {
        Ok(child) => child,
        Err(source) => {
            if let Err(e) = held.release().await {
                print_warning(&format!("releasing the lock failed: {e}"));
            }
            return Err(CliError::Spawn {
                url,
                command: shown,
                source,
            });
        }
    };
    let pid = child.id();

    let forward = |sig: i32| {
        if let Some(pid) = pid {
            let _ = sys::signal(pid, sig);
        }
    };
    let lost = held.lost();
    tokio::pin!(lost);
    let outcome = loop {
        tokio::select! {
            status = child.wait() => break Ok(status),
            state = &mut lost => break Err(state),
            _ = term.recv() => forward(sys::SIGTERM),
            _ = hup.recv() => forward(sys::SIGHUP),
            // The terminal sends Ctrl-C to COMMAND too; we wait for it to exit.
            _ = int.recv() => {}
        }
    };

    match outcome {
        Ok(waited) => finish(waited, held, &url, &shown, args.lease).await,
        Err(state) => {
            let action = terminate(&mut child, &shown, args.grace).await;
            // A lock in jeopardy (not renewed in time) may still be ours: give it back,
            // without waiting long for a backend that is not answering.
            let _ = tokio::time::timeout(Duration::from_secs(10), held.release()).await;
            Err(CliError::Lost {
                url,
                reason: loss_reason(&state, backend.as_ref(), &nonce).await,
                action,
            })
        }
    }
}

/// Starts COMMAND with the lock's fence, holder, URL and nonce in its environment.
fn spawn(
    command: &[OsString],
    fence: FenceToken,
    holder: &str,
    url: &str,
    nonce: &str,
) -> std::io::Result<Child> {
    tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .env("LOCKWARDEN_FENCE", fence.to_string())
        .env("LOCKWARDEN_HOLDER", holder)
        .env("LOCKWARDEN_URL", url)
        .env("LOCKWARDEN_NONCE", nonce)
        .spawn()
}

/// COMMAND ended while the lock was held: release it, and pass COMMAND's status on.
async fn finish(
    waited: std::io::Result<ExitStatus>,
    held: HeldLock,
    url: &str,
    shown: &str,
    lease: Duration,
) -> Result<u8, CliError> {
    match waited {
        Ok(status) => {
            tracing::info!(%url, %status, "command exited; releasing");
            if let Err(e) = held.release().await {
                print_warning(&format!(
                    "{e} (releasing after the command exited; the lease ends it in {})",
                    humantime::format_duration(lease)
                ));
            }
            Ok(exit_code(status))
        }
        Err(source) => {
            let _ = held.release().await;
            Err(CliError::Io {
                context: format!("{url}: waiting for {shown:?}"),
                source,
            })
        }
    }
}

/// Acquires the lock with progress on stderr.
async fn acquire(
    args: &RunArgs,
    permits: Permits,
    backend: &dyn LockBackend,
) -> Result<Lease, CliError> {
    let req = AcquireRequest {
        holder: args.holder.clone().unwrap_or_else(default_holder),
        lease: args.lease,
        data: args.data.clone(),
        force: false,
        reclaim: args.reclaim,
        permits,
        cluster: Some(sys::hostname()),
    };
    let mut progress = Progress::new(backend.url(), args.wait);
    let lease = super::acquire(backend, &req, args.wait, |by, q| progress.busy(by, q)).await;
    progress.finish();
    lease
}

/// SIGTERM, SIGHUP and SIGINT, handled by us from now on.
fn signals() -> std::io::Result<(Signal, Signal, Signal)> {
    Ok((
        signal(SignalKind::terminate())?,
        signal(SignalKind::hangup())?,
        signal(SignalKind::interrupt())?,
    ))
}

/// Ends COMMAND after the lock was lost: SIGTERM, then SIGKILL after `grace`. Says
/// what was done.
async fn terminate(child: &mut Child, shown: &str, grace: Duration) -> String {
    let pid = child.id();
    let forward = |sig: i32| {
        if let Some(pid) = pid {
            let _ = sys::signal(pid, sig);
        }
    };
    let mut action = match pid {
        Some(pid) => format!("sent SIGTERM to {shown:?} (pid {pid})"),
        None => format!("{shown:?} had already exited"),
    };
    forward(sys::SIGTERM);
    let status = match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            forward(sys::SIGKILL);
            action.push_str(&format!(
                ", then SIGKILL after {}",
                humantime::format_duration(grace)
            ));
            child.wait().await
        }
    };
    if let Ok(status) = status {
        action.push_str(&format!("; it exited with {}", describe(status)));
    }
    action
}

/// Why the lock was lost, and who has it now when the loss itself does not say
/// (ZooKeeper: our entry was deleted).
async fn loss_reason(state: &HolderState, backend: &dyn LockBackend, nonce: &str) -> String {
    let mut reason = match state {
        HolderState::Lost(reason) => reason.to_string(),
        HolderState::Expiring { last_error, .. } => {
            format!("not renewed in time ({last_error})")
        }
        HolderState::Released => "released".to_string(),
        HolderState::Held { .. } => "lost".to_string(),
    };
    if !matches!(state, HolderState::Lost(LostReason::TakenOver(_)))
        && let Ok(Ok(Some(Stored { record: Ok(r), .. }))) =
            tokio::time::timeout(Duration::from_secs(5), backend.inspect()).await
        && r.state == LockState::Held
        && r.nonce != nonce
        // On a key with more than one permit the record names one holder of several.
        && r.set.as_ref().is_none_or(|set| set.entry(nonce).is_none())
    {
        reason.push_str(&format!(" (now held by {} (fence {}))", r.holder, r.fence));
    }
    reason
}

/// The shell's convention: the exit status, or 128 + the signal that killed it.
fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => (code & 0xff) as u8,
        (None, Some(sig)) => (128 + sig).clamp(0, 255) as u8,
        (None, None) => exit::ERROR,
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("status {code}"),
        (None, Some(sig)) => format!("signal {sig}"),
        _ => status.to_string(),
    }
}

//! `lock` on ZooKeeper. A ZooKeeper lock is an ephemeral znode: it lives exactly as
//! long as the session that created it, so a `lock` that exits would let go at once.
//! Instead, `lock zk://…` starts a copy of itself (`lock … --keeper`, hidden) that
//! acquires the lock, reports back over a pipe, detaches from the terminal, and keeps
//! the session (and the lock) alive until:
//!
//! - `unlock` deletes its queue entry (conditioned on the entry's version), which the
//!   keeper notices at its next heartbeat and exits;
//! - the lease (`--lease`, default 1h) runs out: it releases and exits, as a lock on
//!   the other backends would expire;
//! - it gets SIGTERM or SIGINT: it releases and exits;
//! - the session expires: the server has already deleted the entry.
//!
//! The lock file records the keeper's pid and host.

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Notify;

use super::args::LockArgs;
use super::lockfile::{Keeper, LockFile};
use super::output::report_locked_lines;
use super::progress::Progress;
use super::{CliError, exit, print_warning, release_or_log, sys};
use lockwarden_core::{HeldLock, HolderState, Lease, LockBackend, RenewPolicy};

/// What the keeper tells the `lock` that started it, one JSON object per line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "camelCase")]
enum Message {
    Busy {
        holder: String,
        fence: u64,
        queue: Option<u32>,
    },
    Acquired {
        file: Box<LockFile>,
        /// What a takeover (`--force`) or a reclaim did, in words.
        forced_from: Option<String>,
    },
    Failed {
        code: u8,
        message: String,
    },
}

/// Environment variable naming a file for the keeper's log (it has no terminal).
const KEEPER_LOG: &str = "LOCKWARDEN_KEEPER_LOG";

/// The `lock` side: starts the keeper, relays its progress, writes the lock file.
pub async fn lock_via_keeper(args: &LockArgs, path: &Path) -> Result<u8, CliError> {
    let url = args.url.url();
    let io_error = |context: String| move |source| CliError::Io { context, source };
    let exe = std::env::current_exe().map_err(io_error(format!(
        "{url}: cannot find the lockwarden executable to keep the ZooKeeper session"
    )))?;
    let stderr = match std::env::var_os(KEEPER_LOG) {
        Some(log) => Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .map_err(io_error(format!("{KEEPER_LOG}={}", log.to_string_lossy())))?,
        ),
        None => Stdio::null(),
    };
    let mut child = tokio::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .arg("--keeper")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .map_err(io_error(format!(
            "{url}: cannot start the process that keeps the ZooKeeper session"
        )))?;
    let stdout = child.stdout.take().expect("piped");
    let mut lines = BufReader::new(stdout).lines();
    let mut progress = Progress::new(&url, args.wait);
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(message) = serde_json::from_str::<Message>(&line) else {
            continue;
        };
        match message {
            Message::Busy {
                holder,
                fence,
                queue,
            } => progress.busy_parts(&holder, fence, queue),
            Message::Failed { code, message } => {
                progress.finish();
                let _ = child.wait().await;
                return Err(CliError::Reported { code, message });
            }
            Message::Acquired { file, forced_from } => {
                progress.finish();
                if let Err(e) = file.create(path) {
                    // Without its file nobody could unlock it: the keeper lets go.
                    if let Some(pid) = child.id() {
                        let _ = sys::signal(pid, sys::SIGTERM);
                    }
                    let _ = child.wait().await;
                    return Err(CliError::Reported {
                        code: exit::ERROR,
                        message: format!("{url}: {e}; the lock was released again"),
                    });
                }
                if let Some(what) = forced_from {
                    print_warning(&format!("{url}: {what}"));
                }
                report_locked_lines(&args.url, path);
                // The keeper runs on, detached; nothing waits for it.
                return Ok(exit::OK);
            }
        }
    }
    let status = child.wait().await;
    Err(CliError::Reported {
        code: exit::ERROR,
        message: format!(
            "{url}: the process keeping the ZooKeeper session exited ({}) before taking the lock (set {KEEPER_LOG}=FILE to see its log)",
            status.map_or_else(|e| e.to_string(), |s| s.to_string())
        ),
    })
}

/// Writes one message to the `lock` process; false once it has gone away.
fn send(message: &Message) -> bool {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, message).is_ok()
        && out.write_all(b"\n").is_ok()
        && out.flush().is_ok()
}

/// The keeper side: acquire, report, hold until unlocked, the lease's end or a signal.
pub async fn keep(args: LockArgs) -> Result<u8, CliError> {
    let parent_gone = Arc::new(AtomicBool::new(false));
    let (backend, lease) = match acquire_reporting_progress(&args, &parent_gone).await {
        Ok(Some(acquired)) => acquired,
        // `lock` was interrupted: nobody to hand the lock to.
        Ok(None) => return Ok(exit::ERROR),
        Err(e) => {
            send(&Message::Failed {
                code: e.exit_code(),
                message: e.to_string(),
            });
            return Ok(e.exit_code());
        }
    };

    // From here on, a Ctrl-C at the terminal or its closing must not end the lock.
    if let Err(e) = sys::detach() {
        tracing::debug!(error = %e, "setsid failed");
    }
    let mut file = LockFile::new(&args.url, &lease, args.lease, args.backend.saved());
    file.keeper = Some(Keeper {
        pid: std::process::id(),
        host: sys::hostname(),
    });
    let forced_from = super::output::takeover(&lease);
    let session_timeout = lease.record.lease;
    let policy = RenewPolicy::for_lease(session_timeout);
    let held = HeldLock::hold(backend, lease, policy);
    let reported = !parent_gone.load(Ordering::SeqCst)
        && send(&Message::Acquired {
            file: Box::new(file),
            forced_from,
        });
    if !reported {
        release_or_log(held, None, "after the lock process went away").await;
        return Ok(exit::ERROR);
    }
    Ok(hold(&args, held, session_timeout).await)
}

/// Acquires, telling the `lock` process about the queue as it goes; `None` when that
/// process went away before the lock was ours (the queue entry is then abandoned).
async fn acquire_reporting_progress(
    args: &LockArgs,
    parent_gone: &Arc<AtomicBool>,
) -> Result<Option<(Arc<dyn LockBackend>, Lease)>, CliError> {
    let gone = Arc::new(Notify::new());
    let backend = args.url.connect(&args.backend.options(None)).await?;
    let on_busy = {
        let (parent_gone, gone) = (parent_gone.clone(), gone.clone());
        move |by: &lockwarden_core::HeldBy, queue: Option<u32>| {
            let busy = Message::Busy {
                holder: by.holder.clone(),
                fence: by.fence.0,
                queue,
            };
            if !send(&busy) && !parent_gone.swap(true, Ordering::SeqCst) {
                gone.notify_one();
            }
        }
    };
    let request = args.request()?;
    let acquiring = super::acquire(backend.as_ref(), &request, args.wait, on_busy);
    let outcome = tokio::select! {
        lease = acquiring => Some(lease?),
        _ = gone.notified() => None,
    };
    match outcome {
        Some(lease) => Ok(Some((backend, lease))),
        None => {
            backend.abandon().await;
            Ok(None)
        }
    }
}

/// Holds the lock until unlocked (our entry deleted), taken over, the session ends,
/// the lease runs out or a signal says stop; releases it in the last two cases.
async fn hold(args: &LockArgs, held: HeldLock, session_timeout: Duration) -> u8 {
    let signals = [
        SignalKind::terminate(),
        SignalKind::interrupt(),
        SignalKind::hangup(),
    ]
    .map(signal);
    let [Ok(mut term), Ok(mut int), Ok(mut hup)] = signals else {
        release_or_log(held, None, "after failing to handle signals").await;
        return exit::ERROR;
    };
    let until = tokio::time::sleep(args.lease);
    tokio::pin!(until);
    let mut state = held.watch();
    // Since when renewals have been failing (session disconnected). The server expires
    // a session it has not heard from for the session timeout, so after twice that the
    // entry is certainly gone even if we never hear it from the server.
    let mut jeopardy: Option<tokio::time::Instant> = None;
    let give_up_after = session_timeout * 2;
    loop {
        let give_up = jeopardy.map(|since| since + give_up_after);
        tokio::select! {
            _ = &mut until => break,
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = hup.recv() => continue,
            changed = state.changed() => {
                let now = state.borrow_and_update().clone();
                match now {
                    // Unlocked (our entry deleted), taken over, or the session expired.
                    HolderState::Lost(_) | HolderState::Released => {
                        tracing::info!(url = %args.url, state = ?now, "the lock is gone; exiting");
                        return exit::OK;
                    }
                    _ if changed.is_err() => return exit::OK,
                    // Disconnected: the session may still come back.
                    HolderState::Expiring { .. } => {
                        jeopardy.get_or_insert_with(tokio::time::Instant::now);
                    }
                    HolderState::Held { .. } => jeopardy = None,
                }
            }
            _ = tokio::time::sleep_until(give_up.unwrap_or_else(tokio::time::Instant::now)), if give_up.is_some() => {
                tracing::warn!(url = %args.url, "ZooKeeper unreachable for twice the session timeout; the lock is gone");
                return exit::OK;
            }
        }
    }
    release_or_log(held, None, "at the lease's end or on SIGTERM or SIGINT").await;
    exit::OK
}

//! The guard as a container's entrypoint (PID 1, exec form): the signals it handles
//! itself (passed on to COMMAND, or before COMMAND starts, its own exit) and the
//! orphans it adopts and reaps.

use tokio::signal::unix::SignalKind;

use crate::cli::stop::take_signals;
use crate::cli::{CliError, sys, tree};

/// The signals the guard handles itself, taken before anything else runs; orphans are
/// adopted too (PID 1 adopts them anyway; elsewhere the subreaper keeps them in the
/// tree).
pub(super) struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    chld: tokio::signal::unix::Signal,
}

impl Signals {
    pub(super) fn take(url: &str) -> Result<Signals, CliError> {
        let kinds = [
            SignalKind::terminate(),
            SignalKind::interrupt(),
            SignalKind::hangup(),
            SignalKind::child(),
        ];
        let [term, int, hup, chld] = take_signals(kinds, url)?;
        Ok(Signals {
            term,
            int,
            hup,
            chld,
        })
    }

    /// SIGTERM or SIGINT before COMMAND has started: the guard's exit code for it
    /// (128 + N).
    pub(super) async fn told_to_stop(&mut self) -> u8 {
        tokio::select! {
            _ = self.term.recv() => 128 + sys::SIGTERM as u8,
            _ = self.int.recv() => 128 + libc::SIGINT as u8,
        }
    }

    /// Waits for the next signal while COMMAND (pid `command`) runs and does what it
    /// asks: SIGTERM, SIGINT and SIGHUP are passed on to COMMAND.
    pub(super) async fn pass_on(&mut self, command: Option<u32>) {
        let forward = |sig: i32| {
            if let Some(pid) = command {
                let _ = sys::signal(pid, sig);
            }
        };
        tokio::select! {
            _ = self.term.recv() => forward(sys::SIGTERM),
            _ = self.int.recv() => forward(libc::SIGINT),
            _ = self.hup.recv() => forward(sys::SIGHUP),
            // PID 1's duty: orphans that ended are reaped (COMMAND is tokio's to reap).
            _ = self.chld.recv() => { tree::reap_adopted(std::process::id(), command); }
        }
    }
}

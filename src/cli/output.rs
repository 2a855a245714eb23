//! What commands print: one-line errors and warnings on stderr, s3lock's "has been
//! locked" lines on stdout.

use std::ffi::OsString;
use std::io::Write;
use std::path::Path;

use super::exit;
use lockwarden_core::Lease;
use lockwarden_stores::Target;

/// Prints `lockwarden: error: …` on one line (a message with line breaks is joined).
pub fn print_error(message: &str) {
    let line = one_line(message);
    let _ = writeln!(std::io::stderr(), "lockwarden: error: {line}");
}

/// Prints `lockwarden: warning: …`.
pub fn print_warning(message: &str) {
    let _ = writeln!(
        std::io::stderr(),
        "lockwarden: warning: {}",
        one_line(message)
    );
}

fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Renders a command-line parsing error as one line and returns its exit code. Help
/// and version requests print as usual and succeed.
pub fn report_parse_error(err: clap::Error) -> u8 {
    use clap::error::ErrorKind;
    match err.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = err.print();
            if err.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                exit::USAGE
            } else {
                exit::OK
            }
        }
        _ => {
            // clap renders "error: MESSAGE\n  details…\n\nUsage: …\n\nFor more information…".
            let rendered = err.render().to_string();
            let mut message = Vec::new();
            let mut usage = None;
            for line in rendered.lines() {
                let line = line.trim();
                if let Some(u) = line.strip_prefix("Usage: ") {
                    usage = Some(u.to_string());
                } else if line.is_empty() || line.starts_with("For more information") {
                    continue;
                } else if usage.is_none() {
                    message.push(line.strip_prefix("error: ").unwrap_or(line).to_string());
                }
            }
            let mut line = message.join(" ").replace(" tip: ", "; tip: ");
            if let Some(usage) = usage {
                line.push_str(&format!(" (usage: {usage})"));
            }
            print_error(&line);
            exit::USAGE
        }
    }
}

/// The command line of `run`'s child, for messages.
pub(super) fn display_command(command: &[OsString]) -> String {
    const SHOWN: usize = 60;
    let full = command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    if full.chars().count() <= SHOWN {
        full
    } else {
        full.chars().take(SHOWN).chain(['…']).collect()
    }
}

/// Prints s3lock's two lines, and a warning after a takeover.
pub(super) fn report_locked(target: &Target, lease: &Lease, path: &Path) {
    warn_if_taken_over(&target.to_string(), lease);
    report_locked_lines(target, path);
}

/// The warning line after an acquisition that overwrote a live lock: `--force`'s
/// takeover, or `--reclaim` taking back this holder's own.
pub(super) fn warn_if_taken_over(url: &str, lease: &Lease) {
    if let Some(what) = takeover(lease) {
        print_warning(&format!("{url}: {what}"));
    }
}

/// What a takeover did, in words (the ZooKeeper keeper sends it to `lock`).
pub(super) fn takeover(lease: &Lease) -> Option<String> {
    let from = lease.forced_from.as_ref()?;
    Some(if from.holder == lease.holder() {
        format!(
            "reclaimed the lock {} still held from an earlier run (fence {}, now fence {}); \
             that run, if still alive, has lost it",
            from.holder,
            from.fence,
            lease.fence()
        )
    } else {
        let mut what = format!(
            "took the lock over from {} (fence {})",
            from.holder, from.fence
        );
        // Another tool's lock that lockwarden never takes over by time: what that tool
        // would have done instead.
        if let Some(instead) = lockwarden_stores::terraform::force_unlock_instead(&from.nonce) {
            what.push_str(&format!("; {instead}"));
        }
        what
    })
}

/// s3lock's `… has been locked` and `create FILE`.
pub(super) fn report_locked_lines(target: &Target, path: &Path) {
    println!("{target} has been locked");
    println!("create {}", path.display());
}

/// Rows of cells (the first row the header), left-aligned in columns three spaces
/// apart, one line each, as `status` and `kubectl lockwarden` print tables.
pub fn columns(rows: &[Vec<String>]) -> String {
    let width = |i: usize| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..rows[0].len()).map(width).collect();
    let mut out = String::new();
    for row in rows {
        let last = row.len() - 1;
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i == last {
                    c.clone()
                } else {
                    format!("{c:<w$}", w = widths[i])
                }
            })
            .collect();
        // An empty last cell leaves no padding behind.
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_become_one_line() {
        assert_eq!(one_line("a\n  b\n\nc"), "a b c");
    }
}

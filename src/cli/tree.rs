//! The processes `run`'s command started, wherever they went (docs/design.md §3 rule
//! 7): `run` is their child subreaper, finds them by parent pid in `/proc`, and signals
//! each through a pidfd so that a recycled pid is never hit.

use std::collections::HashMap;
use std::io;

/// One process of the tree, as `/proc/PID/stat` showed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    pub parent: u32,
    /// Clock ticks after boot when it started: with the pid, names one process for good.
    start_time: u64,
    /// Dead, waiting to be reaped: writes nothing any more.
    pub zombie: bool,
}

/// Makes this process the reaper of its orphaned descendants: a process whose parent
/// exits (a double fork, `setsid`, `( … ) &` in a shell that ends) is re-parented to
/// us instead of init, so it stays in our tree.
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl(2) with PR_SET_CHILD_SUBREAPER takes an integer and touches no memory.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Every process below `root` (not `root` itself), zombies included.
pub fn descendants(root: u32) -> Vec<Process> {
    let mut children: HashMap<u32, Vec<Process>> = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        // A process that ended between the listing and the read is simply not there.
        if let Some(process) = read(pid) {
            children.entry(process.parent).or_default().push(process);
        }
    }
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for child in children.remove(&parent).unwrap_or_default() {
            frontier.push(child.pid);
            found.push(child);
        }
    }
    found
}

/// The live processes below `root`.
pub fn live_descendants(root: u32) -> Vec<Process> {
    descendants(root)
        .into_iter()
        .filter(|p| !p.zombie)
        .collect()
}

fn read(pid: u32) -> Option<Process> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// `pid (comm) state ppid … starttime …` (proc(5)); comm may hold spaces and
/// parentheses, so the fields are counted from the last `)`.
fn parse_stat(stat: &str) -> Option<Process> {
    let (head, tail) = stat.rsplit_once(')')?;
    let pid = head.split_once(" (")?.0.trim().parse().ok()?;
    let fields: Vec<&str> = tail.split_whitespace().collect();
    Some(Process {
        pid,
        zombie: matches!(*fields.first()?, "Z" | "X"),
        parent: fields.get(1)?.parse().ok()?,
        // Field 22 of the line; the first after `)` is field 3.
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// Sends `sig` to `process` if it is still the process that was read: the pidfd pins
/// one process, and its start time, read again after opening it, proves which.
pub fn signal(process: &Process, sig: i32) -> io::Result<()> {
    let pid = libc::pid_t::try_from(process.pid)
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        let error = io::Error::last_os_error();
        return match error.raw_os_error() {
            // A kernel before 5.3: plain kill(2), with the small race it always had.
            Some(libc::ENOSYS) => super::sys::signal(process.pid, sig),
            _ => Err(error),
        };
    }
    let fd = fd as libc::c_int;
    let same = read(process.pid).is_some_and(|now| now.start_time == process.start_time);
    let result = if !same {
        Err(io::Error::from(io::ErrorKind::NotFound))
    } else {
        // SAFETY: pidfd_send_signal(2) on a descriptor we own, no siginfo, no flags.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd,
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    // SAFETY: closing the descriptor pidfd_open gave us, once.
    unsafe { libc::close(fd) };
    result
}

/// Reaps the zombies among our own children except `keep` (COMMAND itself, which
/// tokio waits for): orphans adopted as subreaper. Returns how many.
pub fn reap_adopted(me: u32, keep: Option<u32>) -> usize {
    let mut reaped = 0;
    for zombie in descendants(me)
        .into_iter()
        .filter(|p| p.zombie && p.parent == me && Some(p.pid) != keep)
    {
        let mut status = 0;
        // SAFETY: waitpid(2) on a child of ours that is a zombie; never blocks.
        if unsafe { libc::waitpid(zombie.pid as libc::pid_t, &mut status, libc::WNOHANG) } > 0 {
            reaped += 1;
        }
    }
    reaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_awkward_command_names_parse() {
        let line = "4242 (a (b) c) S 17 4242 4242 0 -1 4194304 100 0 0 0 1 2 0 0 20 0 1 0 98765 \
                    1000 10 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let p = parse_stat(line).unwrap();
        assert_eq!(
            (p.pid, p.parent, p.start_time, p.zombie),
            (4242, 17, 98765, false)
        );
        let zombie = line.replacen(") S ", ") Z ", 1);
        assert!(parse_stat(&zombie).unwrap().zombie);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_sleeping_child_is_a_descendant_and_a_signal_ends_it() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let me = std::process::id();
        let found = live_descendants(me);
        let process = found
            .iter()
            .find(|p| p.pid == child.id())
            .expect("the child is found");
        assert_eq!(process.parent, me);
        signal(process, libc::SIGKILL).unwrap();
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        // Reaped: the pid may be anyone's now, and the pidfd check refuses it.
        assert!(signal(process, libc::SIGKILL).is_err());
    }
}

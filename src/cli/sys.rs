//! The few POSIX calls the command-line tool needs (signals, detaching, host and user
//! names).

use std::io;

pub const SIGHUP: i32 = 1;
pub const SIGKILL: i32 = 9;
pub const SIGTERM: i32 = 15;

/// Sends `sig` to process `pid`.
pub fn signal(pid: u32, sig: i32) -> io::Result<()> {
    let pid = i32::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    if pid <= 0 {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    if unsafe { libc::kill(pid, sig) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// SIGKILL to every process this one may signal except itself: `kill(-1, SIGKILL)`.
/// Only for PID 1 of a PID namespace, where that is every other process of the
/// namespace (a container's), never the host's.
pub fn kill_every_other_process() {
    debug_assert_eq!(std::process::id(), 1);
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    unsafe { libc::kill(-1, SIGKILL) };
}

/// Leaves the terminal's session and process group, so that a Ctrl-C or a closed
/// terminal does not reach this process.
pub fn detach() -> io::Result<()> {
    // SAFETY: setsid(2) has no arguments; it fails harmlessly if we already lead a group.
    if unsafe { libc::setsid() } >= 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// This machine's host name.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for `buf.len()` bytes; gethostname writes at most that.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast::<libc::c_char>(), buf.len()) };
    if rc == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        let name = String::from_utf8_lossy(&buf[..end]).trim().to_string();
        if !name.is_empty() {
            return name;
        }
    }
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// The user running this process: `$USER` / `$LOGNAME`, else the numeric uid.
pub fn username() -> String {
    ["USER", "LOGNAME"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .find(|u| !u.is_empty() && !u.chars().any(char::is_control))
        .unwrap_or_else(|| {
            // SAFETY: getuid(2) cannot fail and touches no memory.
            let uid = unsafe { libc::getuid() };
            user_of(uid).unwrap_or_else(|| format!("uid{uid}"))
        })
}

/// The name `/etc/passwd` gives `uid`.
fn user_of(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let id = fields.nth(1)?.parse::<u32>().ok()?;
        (id == uid && !name.is_empty()).then(|| name.to_string())
    })
}

/// `t` as seconds of CLOCK_MONOTONIC, the clock tokio's and std's instants read on
/// Linux, so that another process of this machine (a test) can compare it with its own
/// readings of the same clock.
pub fn monotonic_seconds(t: tokio::time::Instant) -> f64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let reference = tokio::time::Instant::now();
    // SAFETY: clock_gettime(2) writes one timespec into the one we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let now = now.tv_sec as f64 + now.tv_nsec as f64 / 1e9;
    if t >= reference {
        now + (t - reference).as_secs_f64()
    } else {
        now - (reference - t).as_secs_f64()
    }
}

//! The guarded resource of the stop-before-next tests (tests/cli run.rs and guard.rs,
//! the node and Kueue trials): writers send it one line per write (`WRITER N`) over
//! loopback TCP, and it records when each line *arrived*.
//!
//! An arrival is after its write, so "arrived before the deadline" proves "written
//! before it", and a margin (the contender's first arrival minus the workload's last)
//! bounds the real one. The arrival is the kernel's receive timestamp of the segment
//! (`SO_TIMESTAMPNS`), taken when loopback delivers it, not when this process gets to
//! read it: on a loaded two-core machine a test process can be off the CPU for half a
//! second, and a stamp taken by the reader then names its own lateness as the writer's
//! (a guard that killed in time was once reported 480 ms late that way). A read with no
//! kernel stamp (one received before the kernel's timestamping switched on) is stamped
//! when read: later than the arrival, which errs towards a failure, never a pass.

use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

/// CLOCK_MONOTONIC in seconds: the register's clock, the one `run` and `guard` log
/// their deadlines on.
pub fn monotonic_now() -> f64 {
    seconds(now(libc::CLOCK_MONOTONIC))
}

fn now(clock: libc::clockid_t) -> libc::timespec {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes one timespec into the one we pass.
    unsafe { libc::clock_gettime(clock, &mut now) };
    now
}

fn seconds(t: libc::timespec) -> f64 {
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

/// Every line that arrived, stamped, and how many writers' connections have closed.
#[derive(Default)]
pub struct Register {
    writes: Mutex<Vec<(f64, String)>>,
    closed: AtomicUsize,
}

impl Register {
    /// A register on a free loopback port, serving until the test binary ends: the
    /// port and the register.
    pub async fn serve() -> (u16, Arc<Register>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        // Accepted connections inherit the option, and the kernel's timestamping is on
        // before any writer can connect.
        receive_timestamps(listener.as_raw_fd()).expect("SO_TIMESTAMPNS on the register");
        let port = listener.local_addr().unwrap().port();
        let register = Arc::new(Register::default());
        let serving = register.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let register = serving.clone();
                // A thread per writer: blocked in recvmsg, it costs nothing, and no
                // writer's lines wait behind another's.
                std::thread::spawn(move || register.record(stream));
            }
        });
        (port, register)
    }

    /// One writer's connection: each line with its arrival, then that it closed.
    fn record(&self, stream: TcpStream) {
        let mut pending = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(Some((n, arrived))) = receive(&stream, &mut buf) {
            pending.extend_from_slice(&buf[..n]);
            // A read's stamp is its last segment's: every line completed in it arrived
            // by then.
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                let line = String::from_utf8_lossy(&line[..end]).into_owned();
                self.writes.lock().unwrap().push((arrived, line));
            }
        }
        self.closed.fetch_add(1, SeqCst);
    }

    /// Every line with its arrival, in the order recorded.
    pub fn writes(&self) -> Vec<(f64, String)> {
        self.writes.lock().unwrap().clone()
    }

    /// The writers that have written: each line's first word.
    pub fn writers(&self) -> std::collections::BTreeSet<String> {
        self.writes()
            .iter()
            .filter_map(|(_, line)| line.split(' ').next().map(str::to_string))
            .collect()
    }

    /// How many writers' connections have closed.
    pub fn closed(&self) -> usize {
        self.closed.load(SeqCst)
    }

    /// `writer`'s lines, in their order of arrival.
    pub fn lines_of(&self, writer: &str) -> Vec<String> {
        self.of_writer(writer).into_iter().map(|(_, l)| l).collect()
    }

    /// Arrival times of `writer`'s lines.
    pub fn of(&self, writer: &str) -> Vec<f64> {
        self.of_writer(writer).into_iter().map(|(t, _)| t).collect()
    }

    fn of_writer(&self, writer: &str) -> Vec<(f64, String)> {
        self.writes()
            .into_iter()
            .filter(|(_, line)| line.split(' ').next() == Some(writer))
            .collect()
    }
}

/// Asks the kernel to stamp each segment `fd` receives.
fn receive_timestamps(fd: i32) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: setsockopt(2) reads one c_int from a live local.
    let set = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if set == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// One blocking read: how many bytes, and when the last of them arrived on
/// CLOCK_MONOTONIC; `None` at the end of the stream.
fn receive(stream: &TcpStream, buf: &mut [u8]) -> io::Result<Option<(usize, f64)>> {
    // u64s, so the control buffer is aligned for a cmsghdr.
    let mut control = [0u64; 16];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is valid; its pointers are set below to live locals.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    let n = loop {
        // SAFETY: recvmsg(2) writes at most iov_len bytes and msg_controllen bytes into
        // the buffers msg points to, which outlive the call.
        let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, 0) };
        if n >= 0 {
            break n as usize;
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    };
    if n == 0 {
        return Ok(None);
    }
    // The realtime clock first: the offset comes out a hair large, the stamp a hair late.
    let realtime = seconds(now(libc::CLOCK_REALTIME));
    let monotonic = monotonic_now();
    let arrived = kernel_stamp(&msg)
        .map(|stamped| monotonic - (realtime - seconds(stamped)).max(0.0))
        .unwrap_or(monotonic);
    Ok(Some((n, arrived)))
}

/// The `SCM_TIMESTAMPNS` of a received message (CLOCK_REALTIME), if it has one.
fn kernel_stamp(msg: &libc::msghdr) -> Option<libc::timespec> {
    // SAFETY: the CMSG macros walk the control buffer recvmsg filled, within
    // msg_controllen; a timestamp's data is one timespec, read unaligned.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_TIMESTAMPNS
            {
                let data = libc::CMSG_DATA(cmsg).cast::<libc::timespec>();
                return Some(data.read_unaligned());
            }
            cmsg = libc::CMSG_NXTHDR(msg, cmsg);
        }
    }
    None
}

//! Progress while waiting for a lock (`--wait`): a one-line spinner redrawn in place on
//! a terminal, plain lines otherwise (a log, CI output) — one when the holder changes
//! and one every [`PLAIN_EVERY`] while nothing changes.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use lockwarden_core::HeldBy;

const PLAIN_EVERY: Duration = Duration::from_secs(30);
const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

pub struct Progress {
    url: String,
    wait: Option<Duration>,
    tty: bool,
    started: Instant,
    last: Option<(String, u64, Option<u32>)>,
    last_line: Option<Instant>,
    frame: usize,
    drawn: bool,
}

impl Progress {
    /// Progress for waiting up to `wait` (nothing is shown without a wait: the first
    /// busy answer is the final one).
    pub fn new(url: &str, wait: Option<Duration>) -> Progress {
        Progress {
            url: url.to_string(),
            wait: wait.filter(|w| !w.is_zero()),
            tty: std::io::stderr().is_terminal(),
            started: Instant::now(),
            last: None,
            last_line: None,
            frame: 0,
            drawn: false,
        }
    }

    /// Reports that the lock was found held by `by` (at `queue` position, if known).
    pub fn busy(&mut self, by: &HeldBy, queue: Option<u32>) {
        self.busy_parts(&by.holder, by.fence.0, queue);
    }

    pub fn busy_parts(&mut self, holder: &str, fence: u64, queue: Option<u32>) {
        let Some(wait) = self.wait else { return };
        let now = (holder.to_string(), fence, queue);
        let changed = self.last.as_ref() != Some(&now);
        self.last = Some(now);
        let elapsed = self.started.elapsed();
        let queue = queue
            .map(|q| format!(", {q} ahead of us in the queue"))
            .unwrap_or_default();
        let mut err = std::io::stderr().lock();
        if self.tty {
            self.frame = (self.frame + 1) % FRAMES.len();
            let _ = write!(
                err,
                "\r\x1b[2K{} waiting for {}: held by {holder} (fence {fence}){queue} [{}s/{}s]",
                FRAMES[self.frame],
                self.url,
                elapsed.as_secs(),
                wait.as_secs()
            );
            let _ = err.flush();
            self.drawn = true;
        } else if changed || self.last_line.is_none_or(|t| t.elapsed() >= PLAIN_EVERY) {
            let _ = writeln!(
                err,
                "lockwarden: waiting for {}: held by {holder} (fence {fence}){queue}, {}s of {}s",
                self.url,
                elapsed.as_secs(),
                wait.as_secs()
            );
            self.last_line = Some(Instant::now());
        }
    }

    /// Clears the spinner line, if one was drawn.
    pub fn finish(&mut self) {
        if self.drawn {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
            self.drawn = false;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

//! A fault-injecting TCP proxy for network-failure tests.
//!
//! `Proxy::start(upstream_port)` listens on its own loopback port and forwards to
//! `127.0.0.1:upstream_port`. Point a client at [`Proxy::endpoint`] (HTTP) or
//! [`Proxy::address`] (ZooKeeper connect string) and switch [`Mode`] at any time.
//!
//! The proxy runs on its own thread and tokio runtime, so it outlives the runtime of
//! the `#[tokio::test]` that created it and keeps working while that runtime is
//! blocked. Mode changes apply to connections that are already open, not only to new
//! ones: HTTP clients keep pooled keep-alive connections, so a fault that only hit new
//! connections would never be seen.

use std::io;
use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What the proxy does with traffic. Applies to open connections at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward both directions untouched.
    Pass,
    /// Forward, but hold every chunk of data for this long, in both directions (a
    /// request/response round trip gains about twice the delay). Order is kept.
    Delay(Duration),
    /// A network partition: new connections are accepted, and everything received
    /// from either side is read and discarded; nothing is ever answered. A connection
    /// that lost bytes this way is reset when the mode changes again (its byte stream
    /// is no longer coherent); one that carried nothing meanwhile just continues.
    Blackhole,
    /// The server is gone: open connections are reset, new ones are accepted and
    /// reset at once (the client sees "connection reset", not "refused").
    Refuse,
    /// Lost replies: client-to-server bytes are forwarded, and as soon as the server
    /// answers, the answer is discarded and both connections are reset. The request
    /// took effect but the client cannot know — an indeterminate outcome.
    DropReplies,
    /// One-way loss, client to server: requests are read and discarded, replies (to
    /// requests sent before) still arrive. Nothing is reset while the mode lasts; a
    /// connection that lost bytes is reset when the mode changes (like `Blackhole`).
    LoseRequests,
    /// One-way loss, server to client: requests reach the server and take effect,
    /// every reply is silently discarded (no reset: the client waits until its own
    /// timeout). Reset when the mode changes, like `LoseRequests`.
    LoseReplies,
}

impl Mode {
    /// Whether bytes travelling in `direction` are discarded in this mode.
    fn discards(self, direction: Direction) -> bool {
        match self {
            Mode::Blackhole => true,
            Mode::LoseRequests => direction == Direction::Up,
            Mode::LoseReplies => direction == Direction::Down,
            _ => false,
        }
    }

    /// Whether this mode discards bytes in some direction (a connection poisoned by
    /// it may live on until the mode changes).
    fn loses_bytes(self) -> bool {
        matches!(
            self,
            Mode::Blackhole | Mode::LoseRequests | Mode::LoseReplies
        )
    }
}

/// Mode plus a counter whose change resets every connection opened before it.
#[derive(Clone, Copy, Debug)]
struct Control {
    mode: Mode,
    reset_epoch: u64,
}

#[derive(Default)]
struct Stats {
    accepted: AtomicU64,
    active: AtomicU64,
    dropped_replies: AtomicU64,
}

/// A running proxy; stopped (all its connections closed) on drop.
pub struct Proxy {
    port: u16,
    upstream: SocketAddr,
    control: Option<watch::Sender<Control>>,
    stats: Arc<Stats>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    /// A proxy in [`Mode::Pass`] in front of `127.0.0.1:upstream_port`.
    pub fn start(upstream_port: u16) -> Proxy {
        Proxy::start_to(SocketAddr::from(([127, 0, 0, 1], upstream_port)))
    }

    /// A proxy in [`Mode::Pass`] in front of `upstream`.
    pub fn start_to(upstream: SocketAddr) -> Proxy {
        // Bound here, synchronously, so the port is known and accepting (into the
        // backlog) before `start` returns.
        let listener = StdTcpListener::bind("127.0.0.1:0").expect("bind proxy port");
        listener
            .set_nonblocking(true)
            .expect("nonblocking proxy listener");
        let port = listener.local_addr().expect("proxy address").port();
        let (control, control_rx) = watch::channel(Control {
            mode: Mode::Pass,
            reset_epoch: 0,
        });
        let stats = Arc::new(Stats::default());
        let thread_stats = stats.clone();
        let thread = std::thread::Builder::new()
            .name(format!("proxy-{port}"))
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("proxy runtime");
                runtime.block_on(accept_loop(listener, upstream, control_rx, thread_stats));
                // Dropping the runtime drops every connection task and its sockets.
            })
            .expect("spawn proxy thread");
        Proxy {
            port,
            upstream,
            control: Some(control),
            stats,
            thread: Some(thread),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`, e.g. for a ZooKeeper connect string.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `http://127.0.0.1:PORT`, for an HTTP client's endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    pub fn set_mode(&self, mode: Mode) {
        self.control().send_modify(|c| c.mode = mode);
    }

    pub fn mode(&self) -> Mode {
        self.control().borrow().mode
    }

    /// Resets (TCP RST) every connection open now; later ones are unaffected.
    pub fn reset_connections(&self) {
        self.control().send_modify(|c| c.reset_epoch += 1);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.stats.accepted.load(Ordering::SeqCst)
    }

    /// Connections open now.
    pub fn active(&self) -> u64 {
        self.stats.active.load(Ordering::SeqCst)
    }

    /// Server answers discarded in [`Mode::DropReplies`] so far: each one means a
    /// request reached the server and was answered. Poll it to know a dropped
    /// request has landed.
    pub fn dropped_replies(&self) -> u64 {
        self.stats.dropped_replies.load(Ordering::SeqCst)
    }

    fn control(&self) -> &watch::Sender<Control> {
        self.control.as_ref().expect("proxy is running")
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Closing the control channel ends the accept loop; the thread then drops
        // its runtime and with it every connection.
        self.control.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(
    listener: StdTcpListener,
    upstream: SocketAddr,
    mut control: watch::Receiver<Control>,
    stats: Arc<Stats>,
) {
    let listener = TcpListener::from_std(listener).expect("proxy listener");
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else {
                    // Out of file descriptors or similar: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                stats.accepted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(connection(client, upstream, control.clone(), stats.clone()));
            }
            changed = control.changed() => {
                if changed.is_err() {
                    return; // the Proxy was dropped
                }
            }
        }
    }
}

/// Why a connection's pumps stopped early: it must be reset on both sides.
struct Kill;

impl From<io::Error> for Kill {
    fn from(_: io::Error) -> Kill {
        Kill
    }
}

enum Chunk {
    Data(Vec<u8>),
    Eof,
}

/// A chunk and the instant it may be delivered (later than now in Delay mode).
type Queued = (Instant, Chunk);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// client -> upstream (requests)
    Up,
    /// upstream -> client (replies)
    Down,
}

struct Conn {
    client: TcpStream,
    /// `None` when the upstream could not be reached while in Blackhole mode (nothing
    /// would have been forwarded anyway).
    upstream: Option<TcpStream>,
    /// Bytes were discarded, so the stream is broken once traffic flows again.
    poisoned: AtomicBool,
}

async fn connection(
    client: TcpStream,
    upstream_addr: SocketAddr,
    mut control: watch::Receiver<Control>,
    stats: Arc<Stats>,
) {
    let born = *control.borrow_and_update();
    if born.mode == Mode::Refuse {
        reset(&client);
        return;
    }
    let upstream = match TcpStream::connect(upstream_addr).await {
        Ok(s) => Some(s),
        // A partitioned client cannot tell that the server is down either.
        Err(_) if control.borrow().mode == Mode::Blackhole => None,
        Err(_) => {
            reset(&client);
            return;
        }
    };
    let _ = client.set_nodelay(true);
    if let Some(u) = &upstream {
        let _ = u.set_nodelay(true);
    }
    let conn = Conn {
        poisoned: AtomicBool::new(upstream.is_none()),
        client,
        upstream,
    };
    stats.active.fetch_add(1, Ordering::SeqCst);

    let (up_tx, up_rx) = mpsc::unbounded_channel();
    let (down_tx, down_rx) = mpsc::unbounded_channel();
    let pumps = async {
        tokio::try_join!(
            read_side(Some(&conn.client), up_tx, &control),
            write_side(&conn, Direction::Up, up_rx, &control, &stats),
            read_side(conn.upstream.as_ref(), down_tx, &control),
            write_side(&conn, Direction::Down, down_rx, &control, &stats),
        )
    };
    let killed = tokio::select! {
        done = pumps => done.is_err(),
        () = supervise(&conn, born.reset_epoch, control.clone()) => true,
    };
    if killed {
        reset(&conn.client);
        if let Some(u) = &conn.upstream {
            reset(u);
        }
    }
    stats.active.fetch_sub(1, Ordering::SeqCst);
    // Dropping `conn` closes both sockets: RST after `reset`, else a normal close
    // (both directions have already seen EOF).
}

/// Returns when the connection must be reset because of a mode change.
async fn supervise(conn: &Conn, born_epoch: u64, mut control: watch::Receiver<Control>) {
    loop {
        {
            let c = *control.borrow_and_update();
            if c.mode == Mode::Refuse
                || c.reset_epoch != born_epoch
                || (!c.mode.loses_bytes() && conn.poisoned.load(Ordering::SeqCst))
            {
                return;
            }
        }
        if control.changed().await.is_err() {
            return; // proxy shutting down
        }
    }
}

/// Reads from `from` into the queue, stamping each chunk with its delivery time.
async fn read_side(
    from: Option<&TcpStream>,
    queue: mpsc::UnboundedSender<Queued>,
    control: &watch::Receiver<Control>,
) -> Result<(), Kill> {
    let Some(from) = from else {
        return Ok(()); // no upstream: nothing will ever come from it
    };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = read_some(from, &mut buf).await?;
        let deliver_at = match control.borrow().mode {
            Mode::Delay(d) => Instant::now() + d,
            _ => Instant::now(),
        };
        let chunk = if n == 0 {
            Chunk::Eof
        } else {
            Chunk::Data(buf[..n].to_vec())
        };
        if queue.send((deliver_at, chunk)).is_err() {
            return Ok(());
        }
        if n == 0 {
            return Ok(());
        }
    }
}

/// Delivers queued chunks to the other side, applying the mode in force at delivery
/// time (so bytes in flight when a partition starts are lost, as on a real network).
async fn write_side(
    conn: &Conn,
    direction: Direction,
    mut queue: mpsc::UnboundedReceiver<Queued>,
    control: &watch::Receiver<Control>,
    stats: &Stats,
) -> Result<(), Kill> {
    let to = match direction {
        Direction::Up => conn.upstream.as_ref(),
        Direction::Down => Some(&conn.client),
    };
    while let Some((deliver_at, chunk)) = queue.recv().await {
        tokio::time::sleep_until(deliver_at).await;
        let mode = control.borrow().mode;
        match mode {
            m if m.discards(direction) => {
                conn.poisoned.store(true, Ordering::SeqCst);
                // The supervisor may have looked at the flag just before it was set,
                // after the mode changed; re-check so a broken stream is never resumed.
                if !control.borrow().mode.discards(direction) {
                    return Err(Kill);
                }
                continue;
            }
            Mode::Refuse => return Err(Kill),
            Mode::DropReplies if direction == Direction::Down => {
                if matches!(chunk, Chunk::Data(_)) {
                    stats.dropped_replies.fetch_add(1, Ordering::SeqCst);
                }
                return Err(Kill);
            }
            Mode::Pass
            | Mode::Delay(_)
            | Mode::DropReplies
            | Mode::Blackhole
            | Mode::LoseRequests
            | Mode::LoseReplies => {}
        }
        let Some(to) = to else {
            return Err(Kill); // no upstream and traffic should flow: like a dead server
        };
        match chunk {
            Chunk::Data(bytes) => write_all(to, &bytes).await?,
            Chunk::Eof => {
                // Half-close: the peer sees EOF after every byte queued before it.
                unsafe {
                    libc::shutdown(to.as_raw_fd(), libc::SHUT_WR);
                }
                return Ok(());
            }
        }
    }
    Ok(())
}

async fn read_some(s: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        s.readable().await?;
        match s.try_read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

async fn write_all(s: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        s.writable().await?;
        match s.try_write(data) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Makes the socket's close send RST instead of FIN (SO_LINGER with zero timeout).
/// tokio's own `set_linger` is deprecated because a non-zero linger blocks on close;
/// zero never blocks.
fn reset(s: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

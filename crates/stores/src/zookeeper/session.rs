//! ZooKeeper sessions: one per (ensemble, requested timeout) in a process, shared by
//! every lock on it, and replaced by a new one after it expires.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex, OnceLock};
use std::time::Duration;

use tokio::sync::{Mutex, watch};
use zookeeper_client::{Client, Error as ZkError, SessionState, Stat, StateWatcher};

use super::{DEFAULT_SESSION_TIMEOUT, ZkLock};
use lockwarden_core::error::While;
use lockwarden_core::{FenceToken, LockError};

/// Process-wide registry of ZooKeeper sessions: one per ensemble (server list) and
/// requested session timeout, shared by every lock that asks for both.
pub struct ZkSessions {
    default_timeout: Duration,
    sessions: StdMutex<HashMap<(String, Duration), Arc<ZkSession>>>,
}

impl Default for ZkSessions {
    fn default() -> Self {
        ZkSessions::new()
    }
}

impl ZkSessions {
    /// A registry whose sessions ask for [`DEFAULT_SESSION_TIMEOUT`] unless told
    /// otherwise.
    pub fn new() -> Self {
        ZkSessions::with_session_timeout(DEFAULT_SESSION_TIMEOUT)
    }

    /// A registry whose sessions ask for `timeout` unless told otherwise (the servers
    /// clamp it to their `minSessionTimeout ..= maxSessionTimeout`; the negotiated
    /// value is what counts).
    pub fn with_session_timeout(timeout: Duration) -> Self {
        ZkSessions {
            default_timeout: timeout,
            sessions: StdMutex::new(HashMap::new()),
        }
    }

    /// The registry of this process, with the default session timeout.
    pub fn global() -> &'static ZkSessions {
        static GLOBAL: OnceLock<ZkSessions> = OnceLock::new();
        GLOBAL.get_or_init(ZkSessions::new)
    }

    /// The session timeout asked for when a caller does not name one.
    pub fn session_timeout(&self) -> Duration {
        self.default_timeout
    }

    /// The session for the ensemble of `connect` (`host:port[,host:port…][/chroot]`,
    /// optionally prefixed with `zk://`), asking for the default timeout. See
    /// [`ZkSessions::session`].
    pub fn get(&self, connect: &str) -> Result<Arc<ZkSession>, LockError> {
        self.session(connect, None)
    }

    /// The session for the ensemble of `connect` that asks for `timeout` (the default
    /// when `None`). Sessions are keyed by the server list and the timeout: locks
    /// asking for different timeouts need sessions of their own, since the timeout
    /// is a property of the session. A chroot is applied by each lock (see
    /// [`ZkSessions::lock`]), so locks under different chroots of one ensemble still
    /// share one session. Connecting happens lazily, on the first request.
    pub fn session(
        &self,
        connect: &str,
        timeout: Option<Duration>,
    ) -> Result<Arc<ZkSession>, LockError> {
        let (servers, _chroot) = parse_connect(connect)?;
        let timeout = timeout.unwrap_or(self.default_timeout);
        let mut sessions = self
            .sessions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let session = sessions
            .entry((servers.clone(), timeout))
            .or_insert_with(|| {
                Arc::new(ZkSession {
                    servers,
                    requested_timeout: timeout,
                    current: Mutex::new(None),
                })
            });
        Ok(session.clone())
    }

    /// A contender for the lock at `path` (under the chroot of `connect`, if any) on a
    /// session with the default timeout:
    /// `lock("zk://a:2181,b:2181/chroot", "/locks/db")` and
    /// `lock("a:2181,b:2181", "/chroot/locks/db")` name the same lock.
    pub fn lock(&self, connect: &str, path: &str) -> Result<ZkLock, LockError> {
        self.lock_with_timeout(connect, path, None)
    }

    /// [`ZkSessions::lock`] on a session asking for `timeout` (the default when `None`).
    pub fn lock_with_timeout(
        &self,
        connect: &str,
        path: &str,
        timeout: Option<Duration>,
    ) -> Result<ZkLock, LockError> {
        let (_, chroot) = parse_connect(connect)?;
        ZkLock::new(self.session(connect, timeout)?, &format!("{chroot}{path}"))
    }
}

/// Splits `[zk://]host:port[,host:port…][/chroot]` into the server list and the chroot
/// (`""` or `/a/b`, without a trailing slash).
pub fn parse_connect(connect: &str) -> Result<(String, String), LockError> {
    let invalid = |why: &str| LockError::Backend {
        url: format!("zk://{connect}"),
        message: format!("invalid ZooKeeper connect string: {why}"),
    };
    let s = connect.trim();
    let s = s.strip_prefix("zk://").unwrap_or(s);
    // The chroot follows the last server; skip that server's own `tcp://` scheme.
    let last = s.rfind(',').map_or(0, |i| i + 1);
    let tail = &s[last..];
    let scheme = ["tcp+tls://", "tcp://"]
        .iter()
        .find(|p| tail.starts_with(*p))
        .map_or(0, |p| p.len());
    let (servers, chroot) = match tail[scheme..].find('/') {
        Some(i) => s.split_at(last + scheme + i),
        None => (s, ""),
    };
    let servers: Vec<&str> = servers.split(',').map(str::trim).collect();
    if servers.iter().any(|h| h.is_empty()) {
        return Err(invalid("empty server address"));
    }
    let chroot = chroot.trim_end_matches('/');
    if !chroot.is_empty() {
        super::path_name(chroot).map_err(|e| invalid(&format!("chroot: {e}")))?;
    }
    Ok((servers.join(","), chroot.to_string()))
}

/// One ZooKeeper session to one ensemble, and the sessions that replace it after it
/// expires. Locks created on an expired session are lost; new acquisitions get a new
/// session.
pub struct ZkSession {
    pub(super) servers: String,
    requested_timeout: Duration,
    /// The live session, if one was opened. Locked while connecting, so concurrent
    /// acquisitions wait for one connection instead of opening several.
    current: Mutex<Option<Arc<Generation>>>,
}

/// One actual ZooKeeper session.
pub(super) struct Generation {
    pub(super) client: Client,
    pub(super) id: i64,
    /// Negotiated session timeout: the server expires the session after this long
    /// without hearing from it, so it is also the lease.
    pub(super) timeout: Duration,
    /// The client's session task is gone (the runtime that ran it shut down): its
    /// state still reads as connected, but no request can be sent any more.
    pub(super) dead: std::sync::atomic::AtomicBool,
    /// The session's state as [`watch_session`] last saw it, for the holders waiting
    /// on a disconnection.
    states: watch::Receiver<SessionState>,
}

impl Generation {
    pub(super) fn state(&self) -> SessionState {
        self.client.state()
    }

    /// Expired, closed or failed authentication: its ephemeral znodes are (or will
    /// shortly be) gone, and it will never reconnect.
    pub(super) fn is_gone(&self) -> bool {
        self.state().is_terminated() || self.dead.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Learns from a failed request whether the client can still send at all: when
    /// its session task has ended, zookeeper-client answers every request with an
    /// "unexpected error" naming the state it last saw ("expect error state, got
    /// SyncConnected"). Such a session is treated as ended, so the next attempt opens
    /// a new one instead of failing forever.
    pub(super) fn note_error(&self, e: &ZkError) {
        if matches!(e, ZkError::UnexpectedError(m) if m.starts_with("expect error state")) {
            self.dead.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    pub(super) fn is_connected(&self) -> bool {
        self.state() == SessionState::SyncConnected
    }

    /// Resolves once the session is not (or no longer) `SyncConnected`, as
    /// [`watch_session`] sees it; never, once that watch has ended with its runtime.
    pub(super) async fn disconnected(&self) {
        let mut states = self.states.clone();
        if states
            .wait_for(|s| *s != SessionState::SyncConnected)
            .await
            .is_err()
        {
            std::future::pending::<()>().await;
        }
    }

    pub(super) fn fence_of(stat: &Stat) -> FenceToken {
        FenceToken(u64::try_from(stat.czxid).unwrap_or(0))
    }
}

impl ZkSession {
    /// The server list this session connects to.
    pub fn servers(&self) -> &str {
        &self.servers
    }

    /// The session timeout asked of the servers.
    pub fn requested_timeout(&self) -> Duration {
        self.requested_timeout
    }

    /// The live client (opening a session if there is none or the last one ended),
    /// e.g. for diagnostics.
    pub async fn client(&self) -> Result<Client, LockError> {
        let url = format!("zk://{}", self.servers);
        Ok(self.generation(&url).await?.client.clone())
    }

    pub(super) async fn generation(&self, url: &str) -> Result<Arc<Generation>, LockError> {
        let mut current = self.current.lock().await;
        if let Some(live) = current.as_ref().filter(|g| !g.is_gone()) {
            return Ok(live.clone());
        }
        if let Some(ended) = current.take() {
            tracing::info!(
                servers = %self.servers,
                session = %format_args!("{:#x}", ended.id),
                state = %ended.state(),
                "ZooKeeper session ended; opening a new one"
            );
        }
        let generation = Arc::new(self.connect(url).await?);
        *current = Some(generation.clone());
        Ok(generation)
    }

    async fn connect(&self, url: &str) -> Result<Generation, LockError> {
        // Fail fast when no server accepts a connection (the caller retries), instead
        // of cycling through the list for a whole session timeout.
        let connecting = Client::connector()
            .with_session_timeout(self.requested_timeout)
            .with_fail_eagerly()
            .connect(&self.servers);
        let limit = self.requested_timeout * 2 + Duration::from_secs(1);
        let client = match tokio::time::timeout(limit, connecting).await {
            Ok(Ok(client)) => client,
            Ok(Err(e @ ZkError::BadArguments(_))) => {
                return Err(LockError::Backend {
                    url: url.to_string(),
                    message: format!("invalid ZooKeeper servers {:?}: {e}", self.servers),
                });
            }
            Ok(Err(e)) => {
                return Err(LockError::Unavailable {
                    url: url.to_string(),
                    cause: While::new("cannot open a ZooKeeper session", e).into(),
                });
            }
            Err(_) => {
                return Err(LockError::Unavailable {
                    url: url.to_string(),
                    cause: format!("opening a ZooKeeper session took longer than {limit:?}").into(),
                });
            }
        };
        let (publish, states) = watch::channel(client.state());
        let generation = Generation {
            id: client.session_id().0,
            timeout: client.session_timeout(),
            dead: Default::default(),
            states,
            client,
        };
        tracing::info!(
            servers = %self.servers,
            session = %format_args!("{:#x}", generation.id),
            timeout = ?generation.timeout,
            "ZooKeeper session opened"
        );
        tokio::spawn(watch_session(
            generation.client.state_watcher(),
            publish,
            self.servers.clone(),
            generation.id,
            state_poll(generation.timeout),
        ));
        Ok(generation)
    }
}

/// How often [`watch_session`] looks at a session's state: a small share of the
/// session timeout, which is what a disconnection leaves the holder (docs/design.md
/// §3, ZooKeeper: the client itself checks every 1/20 of it).
fn state_poll(session_timeout: Duration) -> Duration {
    (session_timeout / 40).clamp(Duration::from_millis(10), Duration::from_millis(100))
}

/// Follows one session's state until it ends: publishes each change to the holders
/// ([`Generation::disconnected`]) and logs it, since a disconnection is the first sign
/// of jeopardy for every lock on the session and an expiry loses them all.
///
/// It looks at the state every `every` instead of awaiting the client's
/// `StateWatcher::changed`: that awaits an asyncs-sync 0.4 `Notified`, and dropping a
/// waiting `Notified` while its `Notify` wakes all waiters (a state change, or the
/// client's session task ending) is a race in that crate that hung a test binary's
/// runtime shutdown (docs/testing.md). One task per session looks; the holders wait on
/// a tokio watch. Holding the watcher, not a `Client`, keeps the session closable:
/// it closes once every `Client` handle is dropped.
async fn watch_session(
    watcher: StateWatcher,
    publish: watch::Sender<SessionState>,
    servers: String,
    id: i64,
    every: Duration,
) {
    let session = format!("{id:#x}");
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = *publish.borrow();
    loop {
        ticks.tick().await;
        let state = watcher.peek_state();
        if state == last {
            continue;
        }
        last = state;
        match state {
            SessionState::SyncConnected => {
                tracing::info!(%servers, %session, "ZooKeeper session reconnected")
            }
            SessionState::Disconnected => tracing::warn!(
                %servers, %session,
                "ZooKeeper session disconnected; its locks are in jeopardy"
            ),
            // Closed by us (every handle dropped): nothing was lost.
            SessionState::Closed => {
                tracing::info!(%servers, %session, "ZooKeeper session closed")
            }
            other => {
                tracing::warn!(%servers, %session, state = %other, "ZooKeeper session ended; its locks are lost")
            }
        }
        publish.send_replace(state);
        if state.is_terminated() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_strings_split_into_servers_and_chroot() {
        let split = |s: &str| parse_connect(s).map_err(|e| e.to_string());
        assert_eq!(
            split("127.0.0.1:2181,127.0.0.1:2182/chroot"),
            Ok(("127.0.0.1:2181,127.0.0.1:2182".into(), "/chroot".into()))
        );
        assert_eq!(
            split("zk://a:1, b:2/x/y/"),
            Ok(("a:1,b:2".into(), "/x/y".into()))
        );
        assert_eq!(split("a:1"), Ok(("a:1".into(), String::new())));
        assert_eq!(split("a:1/"), Ok(("a:1".into(), String::new())));
        assert_eq!(
            split("tcp://a:1,tcp://b:2/c"),
            Ok(("tcp://a:1,tcp://b:2".into(), "/c".into()))
        );
        assert!(split("a:1,,b:2").is_err());
        assert!(split("").is_err());
        assert!(split("a:1/x//y").is_err());
    }
}

//! ZooKeeper: a FIFO queue of ephemeral sequential znodes (DESIGN.md §3 "ZooKeeper").
//!
//! - Every contender creates `<path>/_c_<uuid>-lock-<seq>` (`EPHEMERAL_SEQUENTIAL`, the
//!   Curator "protected" form kafka-kit also uses, so they all queue together). The
//!   child with the lowest *sequence suffix* holds the lock; every other one watches
//!   only its predecessor. A contender keeps its znode across attempts, so waiters are
//!   served in arrival order.
//! - The znode's data is the JSON [`LockRecord`] (holder, nonce, lease = the session
//!   timeout, data). The fence is the holder znode's `czxid`, which the ensemble
//!   assigns from one cluster-wide, strictly increasing sequence; the record's own
//!   `fence` field is not authoritative (it cannot be known before the create).
//!   The [`Version`] is `"<znode name>:<data version>"`.
//! - Liveness is the ZooKeeper session, not a timestamp: the server deletes the
//!   ephemeral znode when the session expires. A renewal is one read (`exists` on our
//!   znode): its answer proves the server heard from our session at or after the
//!   moment we sent it, so the server cannot expire the session before
//!   `t_sent + session timeout`, and the holder stops claiming the lock earlier, at
//!   `t_sent + session timeout × (1 − δ) − margin` (rule 2). While the session is
//!   disconnected, renewals fail fast and the holder runs out its deadline
//!   (jeopardy); once the session is expired or closed, every lock on it is lost.
//! - One session per ensemble is shared by every lock of a process ([`ZkSessions`]);
//!   when it expires, the next acquisition opens a new one.
//! - A create whose reply was lost (connection loss, timeout, cancelled future) may
//!   have landed. Like Curator, the contender then looks for a child carrying its
//!   own `_c_<uuid>` prefix before creating another, and reuses the same uuid when it
//!   does create again, so a late duplicate is still recognised as ours and deleted.
//! - Children that are not lockwarden records (another client's queue entries) are
//!   queue members like any other: reported as the holder when they are first, never
//!   deleted (unless `force`).
//! - `force` deletes every entry ahead of ours, each conditioned on the version just
//!   read; the old holder learns it at its next renewal (`Lost(EntryGone)`), and the
//!   new fence (a later `czxid`) is higher.
//! - Missing parents are created: ancestors as persistent znodes, the lock path itself
//!   as a container znode, which the server deletes once its queue is empty.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex as StdMutex, OnceLock};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::Mutex;
use tokio::time::Instant;
use zookeeper_client::{
    Acls, Client, CreateMode, Error as ZkError, MultiReadResult, SessionState, Stat,
};

use super::kafka_kit;
use crate::lock::{
    AcquireRequest, Attempt, FenceToken, ForeignRecord, HeldBy, HolderDeadline, Lease, LockBackend,
    LockError, LockRecord, LockState, LostReason, SafetyMargins, Stored, Version,
};

/// Session timeout asked of the servers unless configured otherwise.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// The lock name in Curator's protected form `_c_<uuid>-lock-<seq>`: Curator's
/// `InterProcessMutex` and kafka-kit use `lock-`, so all three queue together.
const LOCK_NAME: &str = "lock-";
const PROTECTED_PREFIX: &str = "_c_";

/// How many times one call re-reads a queue that changed under it (a holder leaving
/// between the listing and the read of its data) before giving up for now.
const QUEUE_RETRIES: usize = 5;

/// ZooKeeper prints sequence numbers with at least ten digits (`%010d`); a child
/// without such a suffix is not a queue member.
const SEQUENCE_DIGITS: usize = 10;

/// Process-wide registry of ZooKeeper sessions: one per ensemble (server list),
/// shared by every lock on it.
pub struct ZkSessions {
    session_timeout: Duration,
    sessions: StdMutex<HashMap<String, Arc<ZkSession>>>,
}

impl Default for ZkSessions {
    fn default() -> Self {
        ZkSessions::new()
    }
}

impl ZkSessions {
    /// A registry whose sessions ask for [`DEFAULT_SESSION_TIMEOUT`].
    pub fn new() -> Self {
        ZkSessions::with_session_timeout(DEFAULT_SESSION_TIMEOUT)
    }

    /// A registry whose sessions ask for `timeout` (the servers clamp it to their
    /// `minSessionTimeout ..= maxSessionTimeout`; the negotiated value is what counts).
    pub fn with_session_timeout(timeout: Duration) -> Self {
        ZkSessions {
            session_timeout: timeout,
            sessions: StdMutex::new(HashMap::new()),
        }
    }

    /// The registry of this process, with the default session timeout.
    pub fn global() -> &'static ZkSessions {
        static GLOBAL: OnceLock<ZkSessions> = OnceLock::new();
        GLOBAL.get_or_init(ZkSessions::new)
    }

    pub fn session_timeout(&self) -> Duration {
        self.session_timeout
    }

    /// The session for the ensemble of `connect` (`host:port[,host:port…][/chroot]`,
    /// optionally prefixed with `zk://`). Sessions are keyed by the server list only:
    /// a chroot is applied by each lock (see [`ZkSessions::lock`]), so locks under
    /// different chroots of one ensemble still share one session. Connecting happens
    /// lazily, on the first request.
    pub fn get(&self, connect: &str) -> Result<Arc<ZkSession>, LockError> {
        let (servers, _chroot) = parse_connect(connect)?;
        let mut sessions = self
            .sessions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let session = sessions.entry(servers.clone()).or_insert_with(|| {
            Arc::new(ZkSession {
                servers,
                requested_timeout: self.session_timeout,
                current: Mutex::new(None),
            })
        });
        Ok(session.clone())
    }

    /// A contender for the lock at `path` (under the chroot of `connect`, if any):
    /// `lock("zk://a:2181,b:2181/chroot", "/locks/db")` and
    /// `lock("a:2181,b:2181", "/chroot/locks/db")` name the same lock.
    pub fn lock(&self, connect: &str, path: &str) -> Result<ZkLock, LockError> {
        let (_, chroot) = parse_connect(connect)?;
        ZkLock::new(self.get(connect)?, &format!("{chroot}{path}"))
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
        validate_path(chroot).map_err(|why| invalid(&format!("chroot: {why}")))?;
    }
    Ok((servers.join(","), chroot.to_string()))
}

/// The checks ZooKeeper makes on a path that matter for building child paths here.
fn validate_path(path: &str) -> Result<(), &'static str> {
    if !path.starts_with('/') {
        return Err("must start with /");
    }
    if path.len() > 1 && path.ends_with('/') {
        return Err("must not end with /");
    }
    if path
        .split('/')
        .skip(1)
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return Err("empty, . or .. segment");
    }
    Ok(())
}

/// One ZooKeeper session to one ensemble, and the sessions that replace it after it
/// expires. Locks created on an expired session are lost; new acquisitions get a new
/// session.
pub struct ZkSession {
    servers: String,
    requested_timeout: Duration,
    /// The live session, if one was opened. Locked while connecting, so concurrent
    /// acquisitions wait for one connection instead of opening several.
    current: Mutex<Option<Arc<Generation>>>,
}

/// One actual ZooKeeper session.
struct Generation {
    client: Client,
    id: i64,
    /// Negotiated session timeout: the server expires the session after this long
    /// without hearing from it, so it is also the lease.
    timeout: Duration,
}

impl Generation {
    fn state(&self) -> SessionState {
        self.client.state()
    }

    /// Expired, closed or failed authentication: its ephemeral znodes are (or will
    /// shortly be) gone, and it will never reconnect.
    fn is_gone(&self) -> bool {
        self.state().is_terminated()
    }

    fn is_connected(&self) -> bool {
        self.state() == SessionState::SyncConnected
    }

    fn fence_of(stat: &Stat) -> FenceToken {
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

    async fn generation(&self, url: &str) -> Result<Arc<Generation>, LockError> {
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
                    cause: format!("cannot open a ZooKeeper session: {e}"),
                });
            }
            Err(_) => {
                return Err(LockError::Unavailable {
                    url: url.to_string(),
                    cause: format!("opening a ZooKeeper session took longer than {limit:?}"),
                });
            }
        };
        let generation = Generation {
            id: client.session_id().0,
            timeout: client.session_timeout(),
            client,
        };
        tracing::info!(
            servers = %self.servers,
            session = %format_args!("{:#x}", generation.id),
            timeout = ?generation.timeout,
            "ZooKeeper session opened"
        );
        // Log every state change: a disconnection is the first sign of jeopardy for
        // every lock on the session, and an expiry loses them all.
        let mut states = generation.client.state_watcher();
        let (servers, id) = (self.servers.clone(), generation.id);
        tokio::spawn(async move {
            loop {
                let state = states.changed().await;
                let session = format!("{id:#x}");
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
                if state.is_terminated() {
                    return;
                }
            }
        });
        Ok(generation)
    }
}

/// Our znode in the queue.
struct Entry {
    generation: Arc<Generation>,
    /// `_c_<uuid>-lock-`: what the name looks like before the server appends the
    /// sequence number; identifies duplicates of this entry.
    prefix: String,
    name: String,
    stat: Stat,
    record: LockRecord,
}

/// A create whose outcome we have not learned yet (reply lost, timed out, or the
/// attempt was cancelled): a znode named `prefix…` may exist on `generation`.
struct Pending {
    generation: Arc<Generation>,
    prefix: String,
    record: LockRecord,
}

/// What one contender remembers between calls.
#[derive(Default)]
struct Contender {
    entry: Option<Entry>,
    pending: Option<Pending>,
    /// The child just ahead of us, which `changed()` watches.
    predecessor: Option<String>,
}

impl Contender {
    /// Forgets queue state bound to a session that has ended: its ephemeral znodes are
    /// gone with it.
    fn forget_ended_session(&mut self) {
        if self.entry.as_ref().is_some_and(|e| e.generation.is_gone()) {
            self.entry = None;
            self.predecessor = None;
        }
        if self
            .pending
            .as_ref()
            .is_some_and(|p| p.generation.is_gone())
        {
            self.pending = None;
        }
    }
}

/// A queue member: a child of the lock path with a sequence suffix.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Child {
    name: String,
    sequence: i64,
}

/// The sequence number a child's name ends with, if it is a queue member. Ordering is
/// by this suffix only: the protected prefix is random.
pub fn sequence_of(name: &str) -> Option<i64> {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits < SEQUENCE_DIGITS {
        return None;
    }
    name[name.len() - digits..].parse().ok()
}

/// The queue, lowest sequence first.
fn queue_of(children: Vec<String>) -> Vec<Child> {
    let mut queue: Vec<Child> = children
        .into_iter()
        .filter_map(|name| sequence_of(&name).map(|sequence| Child { name, sequence }))
        .collect();
    queue.sort_by(|a, b| (a.sequence, &a.name).cmp(&(b.sequence, &b.name)));
    queue
}

/// The znode name a [`Version`] of this backend names.
fn name_of(version: &Version) -> Option<&str> {
    version.0.rsplit_once(':').map(|(name, _)| name)
}

fn version_of(name: &str, stat: &Stat) -> Version {
    Version(format!("{name}:{}", stat.version))
}

fn wall_clock(ms: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// The session is gone: nothing on it will ever succeed again.
fn session_ended(e: &ZkError) -> bool {
    matches!(
        e,
        ZkError::SessionExpired | ZkError::ClientClosed | ZkError::AuthFailed
    )
}

/// A refusal that retrying will not change.
fn permanent(e: &ZkError) -> bool {
    matches!(
        e,
        ZkError::NoAuth
            | ZkError::InvalidAcl
            | ZkError::BadArguments(_)
            | ZkError::NoChildrenForEphemerals
            | ZkError::Unimplemented
            | ZkError::QuotaExceeded
            | ZkError::MarshallingError
    )
}

/// The server answered a write with a definite "did not apply". Anything else that is
/// not success (connection loss, timeout, I/O errors…) may have applied.
fn definite(e: &ZkError) -> bool {
    permanent(e)
        || matches!(
            e,
            ZkError::NoNode | ZkError::NodeExists | ZkError::BadVersion | ZkError::NotEmpty
        )
}

/// One lock path in ZooKeeper, as seen by one contender: each `ZkLock` has at most one
/// znode in the queue. Use one `ZkLock` per would-be holder.
pub struct ZkLock {
    session: Arc<ZkSession>,
    /// Absolute path of the lock's parent znode (chroot included).
    dir: String,
    url: String,
    margins: SafetyMargins,
    state: Mutex<Contender>,
}

impl ZkLock {
    /// A contender for the lock whose queue lives under `path` (absolute, chroot
    /// included) on `session`'s ensemble.
    pub fn new(session: Arc<ZkSession>, path: &str) -> Result<ZkLock, LockError> {
        let url = format!("zk://{}{path}", session.servers);
        validate_path(path)
            .and_then(|()| {
                if path == "/" {
                    Err("must not be the root")
                } else {
                    Ok(())
                }
            })
            .map_err(|why| LockError::Backend {
                url: url.clone(),
                message: format!("invalid lock path {path:?}: {why}"),
            })?;
        Ok(ZkLock {
            session,
            dir: path.to_string(),
            url,
            margins: SafetyMargins::default(),
            state: Mutex::new(Contender::default()),
        })
    }

    pub fn with_margins(mut self, margins: SafetyMargins) -> Self {
        self.margins = margins;
        self
    }

    /// The lock's parent znode (chroot included).
    pub fn path(&self) -> &str {
        &self.dir
    }

    pub fn session(&self) -> &Arc<ZkSession> {
        &self.session
    }

    /// The name of this contender's znode in the queue, if it has one.
    pub async fn queue_entry(&self) -> Option<String> {
        self.state
            .lock()
            .await
            .entry
            .as_ref()
            .map(|e| e.name.clone())
    }

    fn node(&self, name: &str) -> String {
        format!("{}/{name}", self.dir)
    }

    fn error(&self, op: &str, e: ZkError) -> LockError {
        if permanent(&e) {
            LockError::Backend {
                url: self.url.clone(),
                message: format!("{op}: {e}"),
            }
        } else {
            self.unavailable(format!("{op}: {e}"))
        }
    }

    fn unavailable(&self, cause: impl Into<String>) -> LockError {
        LockError::Unavailable {
            url: self.url.clone(),
            cause: cause.into(),
        }
    }

    fn lost(&self, reason: LostReason) -> LockError {
        LockError::Lost {
            url: self.url.clone(),
            reason,
        }
    }

    /// Bounds one request: the client queues requests while it reconnects, and an
    /// attempt must not hang past the session's own lifetime.
    async fn bounded<T>(
        generation: &Generation,
        request: impl Future<Output = Result<T, ZkError>>,
    ) -> Result<T, ZkError> {
        tokio::time::timeout(generation.timeout, request)
            .await
            .unwrap_or(Err(ZkError::Timeout))
    }

    /// The queue, lowest first; empty when the lock path does not exist.
    async fn queue(&self, generation: &Generation) -> Result<Vec<Child>, ZkError> {
        match Self::bounded(generation, generation.client.list_children(&self.dir)).await {
            Ok(children) => Ok(queue_of(children)),
            Err(ZkError::NoNode) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// A child's data and stat; `None` when it is gone.
    async fn read(
        &self,
        generation: &Generation,
        name: &str,
    ) -> Result<Option<(Vec<u8>, Stat)>, ZkError> {
        match Self::bounded(generation, generation.client.get_data(&self.node(name))).await {
            Ok(found) => Ok(Some(found)),
            Err(ZkError::NoNode) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A queue member's record as stored: ours, with the fence taken from `czxid`, or
    /// a description of whatever else is there.
    pub fn stored(name: &str, data: &[u8], stat: &Stat) -> Stored {
        Stored {
            record: LockRecord::from_json(&kafka_kit::record_part(data))
                .map(|mut record| {
                    record.fence = Generation::fence_of(stat);
                    record
                })
                .map_err(|found| {
                    kafka_kit::describe(data, SystemTime::now()).map_or(found, ForeignRecord::new)
                }),
            version: version_of(name, stat),
        }
    }

    /// The holder as a record, also when the holder is not a lockwarden contender
    /// (rule 6: reported, with what was found, never deleted).
    pub fn holder_record(name: &str, stored: Stored, stat: &Stat, lease: Duration) -> LockRecord {
        match stored.record {
            Ok(record) => record,
            Err(found) => LockRecord {
                holder: format!("foreign queue entry {name}: {found}"),
                nonce: String::new(),
                revision: String::new(),
                fence: Generation::fence_of(stat),
                lease,
                state: LockState::Held,
                data: None,
                acquired_at: wall_clock(stat.ctime),
                renewed_at: wall_clock(stat.mtime),
            },
        }
    }

    /// Creates the lock path: ancestors as persistent znodes, the lock path itself as
    /// a container, which the server removes once its last child is gone, so
    /// short-lived lock names do not pile up.
    async fn ensure_dir(&self, generation: &Generation) -> Result<(), ZkError> {
        let open = Acls::anyone_all();
        if let Some((parent, _)) = self.dir.rsplit_once('/')
            && !parent.is_empty()
        {
            Self::bounded(
                generation,
                generation
                    .client
                    .mkdir(parent, &CreateMode::Persistent.with_acls(open)),
            )
            .await?;
        }
        let create = |mode: CreateMode| {
            Self::bounded(
                generation,
                generation
                    .client
                    .create(&self.dir, &[], &mode.with_acls(Acls::anyone_all())),
            )
        };
        match create(CreateMode::Container).await {
            Ok(_) | Err(ZkError::NodeExists) => Ok(()),
            // Servers before 3.5 have no containers.
            Err(ZkError::Unimplemented) => match create(CreateMode::Persistent).await {
                Ok(_) | Err(ZkError::NodeExists) => Ok(()),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// Looks for the znode a create with this protected prefix may have left. Keeps
    /// the lowest and deletes any duplicate.
    async fn find_own(
        &self,
        generation: &Arc<Generation>,
        prefix: &str,
        record: &LockRecord,
    ) -> Result<Option<Entry>, ZkError> {
        // A read served by a follower may lag behind the leader, which may already
        // have applied our create: `sync` first, or we would create a second entry.
        match Self::bounded(generation, generation.client.sync(&self.dir)).await {
            Ok(()) | Err(ZkError::NoNode) => {}
            Err(e) => return Err(e),
        }
        let ours: Vec<Child> = self
            .queue(generation)
            .await?
            .into_iter()
            .filter(|c| c.name.starts_with(prefix))
            .collect();
        for child in &ours {
            let Some(stat) = Self::bounded(
                generation,
                generation.client.check_stat(&self.node(&child.name)),
            )
            .await?
            else {
                continue;
            };
            if stat.ephemeral_owner != generation.id {
                continue;
            }
            for duplicate in ours.iter().filter(|c| c.name != child.name) {
                spawn_cleanup(
                    generation.clone(),
                    self.node(&duplicate.name),
                    Cleanup::Node,
                );
            }
            return Ok(Some(Entry {
                generation: generation.clone(),
                prefix: prefix.to_string(),
                name: child.name.clone(),
                stat,
                record: record.clone(),
            }));
        }
        Ok(None)
    }

    /// Puts this contender in the queue (or finds the entry a lost reply left).
    async fn enqueue(
        &self,
        generation: &Arc<Generation>,
        st: &mut Contender,
        req: &AcquireRequest,
    ) -> Result<Entry, LockError> {
        let (prefix, record) = match st.pending.take() {
            Some(pending) if Arc::ptr_eq(&pending.generation, generation) => {
                match self
                    .find_own(generation, &pending.prefix, &pending.record)
                    .await
                {
                    Ok(Some(entry)) => return Ok(entry),
                    Ok(None) => (pending.prefix, pending.record),
                    Err(e) => {
                        st.pending = Some(pending);
                        return Err(self.error("looking for our queue entry", e));
                    }
                }
            }
            _ => (
                format!("{PROTECTED_PREFIX}{}-{LOCK_NAME}", uuid::Uuid::new_v4()),
                LockRecord::new_acquisition(
                    &req.holder,
                    FenceToken(0),
                    generation.timeout,
                    req.data.clone(),
                ),
            ),
        };
        let data = kafka_kit::entry_data(&record);
        let path = self.node(&prefix);
        let mode = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        for _ in 0..QUEUE_RETRIES {
            // Remembered *before* sending: if this future is dropped mid-request, or the
            // reply is lost, the next attempt (or abandon/drop) finds the znode.
            st.pending = Some(Pending {
                generation: generation.clone(),
                prefix: prefix.clone(),
                record: record.clone(),
            });
            let created =
                Self::bounded(generation, generation.client.create(&path, &data, &mode)).await;
            match created {
                Ok((stat, sequence)) => {
                    st.pending = None;
                    return Ok(Entry {
                        generation: generation.clone(),
                        name: format!("{prefix}{sequence}"),
                        prefix,
                        stat,
                        record,
                    });
                }
                Err(ZkError::NoNode) => {
                    st.pending = None;
                    if let Err(e) = self.ensure_dir(generation).await {
                        return Err(self.error("creating the lock path", e));
                    }
                }
                Err(e) if session_ended(&e) => {
                    // Whatever was created died with the session.
                    st.pending = None;
                    return Err(self.unavailable(format!(
                        "ZooKeeper session ended while joining the queue ({e}); a new session is opened on the next attempt"
                    )));
                }
                Err(e) if definite(&e) => {
                    st.pending = None;
                    return Err(self.error("joining the queue", e));
                }
                Err(e) => {
                    // Rule 4 the Curator way: the create may have landed; look for our
                    // protected name before creating another.
                    tracing::debug!(url = %self.url, error = %e, "queue entry create outcome unknown; looking for it");
                    match self.find_own(generation, &prefix, &record).await {
                        Ok(Some(entry)) => {
                            st.pending = None;
                            return Ok(entry);
                        }
                        Ok(None) => {}
                        Err(find) => {
                            return Err(self.unavailable(format!(
                                "joining the queue: {e}; then looking for our entry: {find}"
                            )));
                        }
                    }
                }
            }
        }
        Err(self.unavailable("could not join the queue; retrying"))
    }

    /// Force: deletes every child ahead of us, each conditioned on the version just
    /// read, and returns who held the lock.
    async fn force_ahead(
        &self,
        generation: &Generation,
        ahead: &[Child],
    ) -> Result<Option<HeldBy>, LockError> {
        let mut forced_from = None;
        for (i, child) in ahead.iter().enumerate() {
            let Some((data, stat)) = self
                .read(generation, &child.name)
                .await
                .map_err(|e| self.error("reading a queue entry to force", e))?
            else {
                continue;
            };
            let stored = Self::stored(&child.name, &data, &stat);
            let holder = Self::holder_record(&child.name, stored, &stat, generation.timeout);
            let deleted = Self::bounded(
                generation,
                generation
                    .client
                    .delete(&self.node(&child.name), Some(stat.version)),
            )
            .await;
            match deleted {
                Ok(()) | Err(ZkError::NoNode) => {}
                // Changed since we read it: the caller lists again and retries.
                Err(ZkError::BadVersion) => continue,
                Err(e) => return Err(self.error("deleting a queue entry to force", e)),
            }
            tracing::warn!(url = %self.url, entry = %child.name, holder = %holder.holder, "forced: deleted a queue entry ahead of us");
            if i == 0 {
                forced_from = Some(HeldBy::from_record(&holder));
            }
        }
        Ok(forced_from)
    }
}

#[async_trait]
impl LockBackend for ZkLock {
    fn url(&self) -> &str {
        &self.url
    }

    fn margins(&self) -> SafetyMargins {
        self.margins
    }

    /// Joins the queue (or keeps our place in it) and reports the holder. The lease is
    /// the session timeout; `req.lease` does not apply to ZooKeeper.
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Attempt, LockError> {
        let mut st = self.state.lock().await;
        let mut forced_from = None;
        for _ in 0..QUEUE_RETRIES {
            st.forget_ended_session();
            let generation = match (&st.entry, &st.pending) {
                (Some(entry), _) => entry.generation.clone(),
                (None, Some(pending)) => pending.generation.clone(),
                (None, None) => self.session.generation(&self.url).await?,
            };
            if !generation.is_connected() {
                if generation.is_gone() {
                    continue;
                }
                return Err(self.unavailable(format!(
                    "ZooKeeper session {:#x} is {}",
                    generation.id,
                    generation.state()
                )));
            }
            if st.entry.is_none() {
                let entry = self.enqueue(&generation, &mut st, req).await?;
                st.entry = Some(entry);
            }
            let Some(entry) = st.entry.as_ref() else {
                continue;
            };
            let (name, prefix) = (entry.name.clone(), entry.prefix.clone());

            let sent = Instant::now();
            let queue = match self.queue(&generation).await {
                Ok(queue) => queue,
                Err(e) if session_ended(&e) => continue,
                Err(e) => return Err(self.error("listing the queue", e)),
            };
            for duplicate in queue
                .iter()
                .filter(|c| c.name.starts_with(&prefix) && c.name != name)
            {
                spawn_cleanup(
                    generation.clone(),
                    self.node(&duplicate.name),
                    Cleanup::Node,
                );
            }
            match queue.iter().position(|c| c.name == name) {
                None => {
                    // Deleted by someone (force), or the session just expired: queue
                    // again, at the back.
                    tracing::warn!(url = %self.url, entry = %name, "our queue entry disappeared; queueing again");
                    st.entry = None;
                    st.predecessor = None;
                }
                Some(0) => {
                    let mut record = entry.record.clone();
                    record.fence = Generation::fence_of(&entry.stat);
                    let version = version_of(&name, &entry.stat);
                    st.predecessor = None;
                    let deadline =
                        HolderDeadline::after_write(sent, generation.timeout, &self.margins);
                    let mut lease = Lease::new(record, version, deadline);
                    lease.forced_from = forced_from;
                    return Ok(Attempt::Acquired(lease));
                }
                Some(i) if req.force => {
                    // The first pass removed the holder; a later pass (after a
                    // concurrent change) must not overwrite whom we took over from.
                    let removed = self.force_ahead(&generation, &queue[..i]).await?;
                    forced_from = forced_from.or(removed);
                }
                Some(i) => {
                    let head = &queue[0].name;
                    let (data, stat) = match self.read(&generation, head).await {
                        Ok(Some(found)) => found,
                        // The holder just left: look again.
                        Ok(None) => continue,
                        Err(e) if session_ended(&e) => continue,
                        Err(e) => return Err(self.error("reading the holder's entry", e)),
                    };
                    let stored = Self::stored(head, &data, &stat);
                    let holder = Self::holder_record(head, stored, &stat, generation.timeout);
                    st.predecessor = Some(queue[i - 1].name.clone());
                    return Ok(Attempt::Busy {
                        holder,
                        retry_in: None,
                        queue_position: Some(u32::try_from(i - 1).unwrap_or(u32::MAX)),
                    });
                }
            }
        }
        Err(self.unavailable("the queue kept changing while we read it; retrying"))
    }

    /// One `exists` on our znode: it proves the session alive at the server at or after
    /// `t_sent`, so the server cannot expire it (and delete the znode) before
    /// `t_sent + session timeout`.
    async fn renew(&self, lease: &mut Lease) -> Result<(), LockError> {
        let mut st = self.state.lock().await;
        let Some(entry) = st
            .entry
            .as_mut()
            .filter(|e| name_of(&lease.version) == Some(e.name.as_str()))
        else {
            return Err(self.lost(LostReason::EntryGone));
        };
        let generation = entry.generation.clone();
        if generation.is_gone() {
            st.entry = None;
            return Err(self.lost(LostReason::SessionExpired));
        }
        if !generation.is_connected() {
            // Jeopardy: the server may still count the session alive, or may expire it
            // at `last contact + timeout`; the holder's deadline already stops short
            // of that.
            return Err(self.unavailable(format!(
                "ZooKeeper session {:#x} is {}; lock in jeopardy until it reconnects",
                generation.id,
                generation.state()
            )));
        }
        let path = self.node(&entry.name);
        let sent = Instant::now();
        match Self::bounded(&generation, generation.client.check_stat(&path)).await {
            Ok(Some(stat)) if stat.ephemeral_owner == generation.id => {
                entry.stat = stat;
                let version = version_of(&entry.name, &stat);
                let record = lease.record.clone();
                lease.confirm(record, version, sent, &self.margins);
                Ok(())
            }
            Ok(Some(_)) => {
                st.entry = None;
                Err(self.lost(LostReason::NotOurs))
            }
            Ok(None) => {
                st.entry = None;
                Err(self.lost(LostReason::EntryGone))
            }
            Err(e) if session_ended(&e) => {
                st.entry = None;
                Err(self.lost(LostReason::SessionExpired))
            }
            Err(e) => Err(self.error("checking our queue entry", e)),
        }
    }

    /// Deletes our znode, conditioned on its version. A lost reply is resolved by
    /// deleting again: `NoNode` then means the first delete landed.
    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        let mut st = self.state.lock().await;
        st.predecessor = None;
        let Some(entry) = st
            .entry
            .take_if(|e| name_of(&lease.version) == Some(e.name.as_str()))
        else {
            return Err(self.lost(LostReason::EntryGone));
        };
        drop(st);
        let generation = entry.generation.clone();
        let path = self.node(&entry.name);
        let mut expected = Some(entry.stat.version);
        let mut uncertain = false;
        let give_up = Instant::now() + generation.timeout;
        loop {
            if generation.is_gone() {
                return Err(self.lost(LostReason::SessionExpired));
            }
            let deleted =
                Self::bounded(&generation, generation.client.delete(&path, expected)).await;
            match deleted {
                Ok(()) => return Ok(()),
                Err(ZkError::NoNode) if uncertain => return Ok(()),
                Err(ZkError::NoNode) => return Err(self.lost(LostReason::EntryGone)),
                Err(ZkError::BadVersion) => {
                    // Someone rewrote our znode's data; it is still ours if our session
                    // owns it, and it must go or it blocks the queue.
                    match Self::bounded(&generation, generation.client.check_stat(&path)).await {
                        Ok(Some(stat)) if stat.ephemeral_owner == generation.id => {
                            expected = Some(stat.version);
                            continue;
                        }
                        Ok(None) => return Ok(()),
                        Ok(Some(_)) => return Err(self.lost(LostReason::NotOurs)),
                        Err(e) => {
                            tracing::debug!(url = %self.url, error = %e, "release: re-reading our entry failed");
                            uncertain = true;
                        }
                    }
                }
                Err(e) if session_ended(&e) => {
                    return Err(self.lost(LostReason::SessionExpired));
                }
                Err(e) if definite(&e) => return Err(self.error("deleting our queue entry", e)),
                Err(e) => {
                    tracing::debug!(url = %self.url, error = %e, "release outcome unknown; retrying");
                    uncertain = true;
                }
            }
            if Instant::now() >= give_up {
                // Our znode must not outlive this release: it would block the queue for
                // as long as the (shared, long-lived) session lives.
                spawn_cleanup(generation, path, Cleanup::Node);
                return Err(self.unavailable(
                    "release not confirmed; the queue entry is deleted in the background (or with the session)",
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn inspect(&self) -> Result<Option<Stored>, LockError> {
        let generation = self.session.generation(&self.url).await?;
        for _ in 0..QUEUE_RETRIES {
            let queue = self
                .queue(&generation)
                .await
                .map_err(|e| self.error("listing the queue", e))?;
            let Some(head) = queue.first() else {
                return Ok(None);
            };
            match self.read(&generation, &head.name).await {
                Ok(Some((data, stat))) => {
                    // The head of the queue holds the lock whatever wrote it (a
                    // kafka-kit or Curator entry too): report it as the holder.
                    let stored = Self::stored(&head.name, &data, &stat);
                    let version = stored.version.clone();
                    let holder = Self::holder_record(&head.name, stored, &stat, generation.timeout);
                    return Ok(Some(Stored {
                        record: Ok(holder),
                        version,
                    }));
                }
                Ok(None) => continue,
                Err(e) => return Err(self.error("reading the holder's entry", e)),
            }
        }
        Err(self.unavailable("the queue kept changing while we read it; retrying"))
    }

    /// Finds the znode of this acquisition (same nonce) owned by our live session. A
    /// restarted process has a new session, and the old one's ephemeral znodes are gone
    /// (or will be once it expires): `Lost(SessionExpired)`. The znode then belongs to
    /// this `ZkLock`: another one that still has it would delete it when dropped.
    async fn resume(&self, holder: &str, nonce: &str) -> Result<Lease, LockError> {
        let mut st = self.state.lock().await;
        let generation = self.session.generation(&self.url).await?;
        let queue = self
            .queue(&generation)
            .await
            .map_err(|e| self.error("listing the queue", e))?;
        if queue.is_empty() {
            return Err(self.lost(LostReason::SessionExpired));
        }
        // One round trip for every entry's data.
        let mut reader = generation.client.new_multi_reader();
        for child in &queue {
            reader
                .add_get_data(&self.node(&child.name))
                .map_err(|e| self.error("reading the queue", e))?;
        }
        let results = Self::bounded(&generation, reader.commit())
            .await
            .map_err(|e| self.error("reading the queue", e))?;
        for (position, (child, result)) in queue.iter().zip(results).enumerate() {
            let MultiReadResult::Data { data, stat } = result else {
                continue;
            };
            let Ok(mut record) = LockRecord::from_json(&kafka_kit::record_part(&data)) else {
                continue;
            };
            if record.nonce != nonce {
                continue;
            }
            if stat.ephemeral_owner != generation.id {
                // Made by another session (ours before a restart): it cannot be
                // renewed from here and disappears when that session expires.
                return Err(self.lost(LostReason::SessionExpired));
            }
            if record.holder != holder {
                return Err(self.lost(LostReason::NotOurs));
            }
            record.fence = Generation::fence_of(&stat);
            let version = version_of(&child.name, &stat);
            let prefix = child
                .name
                .trim_end_matches(|c: char| c.is_ascii_digit())
                .to_string();
            let entry = Entry {
                generation: generation.clone(),
                prefix,
                name: child.name.clone(),
                stat,
                record: record.clone(),
            };
            // This contender now owns the entry; one it had before must not linger.
            if let Some(previous) = st.entry.replace(entry).filter(|e| e.name != child.name) {
                spawn_cleanup(
                    previous.generation,
                    self.node(&previous.name),
                    Cleanup::Node,
                );
            }
            st.pending = None;
            st.predecessor = None;
            if position != 0 {
                // Still waiting in the queue: not a held lock. The entry is kept (a
                // `try_acquire` continues from its place; `abandon` or drop removes it).
                return Err(self.lost(LostReason::NotOurs));
            }
            return Ok(Lease::new(record, version, HolderDeadline::expired()));
        }
        Err(self.lost(LostReason::SessionExpired))
    }

    /// Leaves the queue: deletes our znode, and any a create with a lost reply left.
    async fn abandon(&self) {
        let mut st = self.state.lock().await;
        st.predecessor = None;
        let entry = st.entry.take();
        let pending = st.pending.take();
        drop(st);
        if let Some(entry) = entry {
            let path = self.node(&entry.name);
            let generation = entry.generation;
            let deleted = Self::bounded(
                &generation,
                generation.client.delete(&path, Some(entry.stat.version)),
            )
            .await;
            match deleted {
                Ok(()) | Err(ZkError::NoNode) => {}
                Err(e) if session_ended(&e) => {}
                Err(e) => {
                    tracing::debug!(url = %self.url, error = %e, "leaving the queue: deleting in the background");
                    spawn_cleanup(generation, path, Cleanup::Node);
                }
            }
        }
        if let Some(pending) = pending {
            spawn_cleanup(
                pending.generation,
                self.node(&pending.prefix),
                Cleanup::Prefix,
            );
        }
    }

    fn watches_changes(&self) -> bool {
        true
    }

    /// Watches only our predecessor: resolves when it is deleted (or changes, or the
    /// session ends), or after `timeout`.
    async fn changed(&self, timeout: Duration) {
        let watched = {
            let st = self.state.lock().await;
            match (&st.entry, &st.predecessor) {
                (Some(entry), Some(predecessor)) => {
                    Some((entry.generation.clone(), self.node(predecessor)))
                }
                _ => None,
            }
        };
        let Some((generation, path)) = watched else {
            tokio::time::sleep(timeout).await;
            return;
        };
        let wait = async {
            match generation.client.check_and_watch_stat(&path).await {
                Ok((None, _)) => {}
                Ok((Some(_), watcher)) => {
                    watcher.changed().await;
                }
                // Disconnected or similar: the timeout is the fallback.
                Err(_) => std::future::pending::<()>().await,
            }
        };
        let _ = tokio::time::timeout(timeout, wait).await;
    }
}

impl Drop for ZkLock {
    /// A contender dropped without `abandon()` (e.g. a cancelled acquisition) must
    /// not leave its znode in the queue for the life of the shared session.
    fn drop(&mut self) {
        let st = self.state.get_mut();
        let (entry, pending) = (st.entry.take(), st.pending.take());
        if let Some(entry) = entry {
            spawn_cleanup(entry.generation, self.node(&entry.name), Cleanup::Node);
        }
        if let Some(pending) = pending {
            spawn_cleanup(
                pending.generation,
                self.node(&pending.prefix),
                Cleanup::Prefix,
            );
        }
    }
}

/// What a background cleanup deletes.
#[derive(Clone, Copy, Debug)]
enum Cleanup {
    /// The znode at the path.
    Node,
    /// Every child whose name starts with the path's last segment (a protected
    /// prefix `_c_<uuid>-lock-`).
    Prefix,
}

/// Deletes a znode of ours in the background, retrying until it is gone or its
/// session ends (which deletes it anyway). Only znodes our session owns are deleted.
fn spawn_cleanup(generation: Arc<Generation>, path: String, what: Cleanup) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        // No runtime (dropped outside one): the znode goes with the session.
        return;
    };
    runtime.spawn(async move {
        let mut pause = Duration::from_millis(100);
        loop {
            if generation.is_gone() {
                return;
            }
            let done = match what {
                Cleanup::Node => delete_own(&generation, &path).await,
                Cleanup::Prefix => delete_own_prefixed(&generation, &path).await,
            };
            match done {
                Ok(()) => return,
                Err(e) if session_ended(&e) => return,
                Err(e) => {
                    tracing::debug!(%path, error = %e, "background cleanup of a queue entry failed; retrying");
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    });
}

/// Deletes the znode at `path` if our session owns it. `Ok` when it is gone.
async fn delete_own(generation: &Generation, path: &str) -> Result<(), ZkError> {
    let stat = ZkLock::bounded(generation, generation.client.check_stat(path)).await?;
    match stat {
        Some(stat) if stat.ephemeral_owner == generation.id => {
            match ZkLock::bounded(
                generation,
                generation.client.delete(path, Some(stat.version)),
            )
            .await
            {
                Ok(()) | Err(ZkError::NoNode) => Ok(()),
                // Rewritten meanwhile: look again.
                Err(ZkError::BadVersion) => Err(ZkError::BadVersion),
                Err(e) => Err(e),
            }
        }
        _ => Ok(()),
    }
}

/// Deletes every child of ours whose name starts with the last segment of `prefix`.
async fn delete_own_prefixed(generation: &Generation, prefix: &str) -> Result<(), ZkError> {
    let Some((dir, name)) = prefix.rsplit_once('/') else {
        return Ok(());
    };
    let children = match ZkLock::bounded(generation, generation.client.list_children(dir)).await {
        Ok(children) => children,
        Err(ZkError::NoNode) => return Ok(()),
        Err(e) => return Err(e),
    };
    for child in children.iter().filter(|c| c.starts_with(name)) {
        delete_own(generation, &format!("{dir}/{child}")).await?;
    }
    Ok(())
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

    #[test]
    fn queue_orders_by_sequence_suffix_not_name() {
        let queue = queue_of(vec![
            "_c_ffff-lock-0000000003".into(),
            "_c_0000-lock-0000000010".into(),
            "config".into(),
            "lock-0000000001".into(),
            "x-12".into(),
            "_c_aaaa-lock-0000000002".into(),
        ]);
        let names: Vec<&str> = queue.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "lock-0000000001",
                "_c_aaaa-lock-0000000002",
                "_c_ffff-lock-0000000003",
                "_c_0000-lock-0000000010"
            ]
        );
        // 64-bit sequences (19 digits) still parse; overflow is not a queue member.
        assert_eq!(sequence_of("n-0000000004294967296"), Some(4294967296));
        assert_eq!(sequence_of("n-99999999999999999999"), None);
    }

    #[test]
    fn version_names_the_znode() {
        let stat = Stat {
            czxid: 7,
            mzxid: 7,
            pzxid: 7,
            ctime: 0,
            mtime: 0,
            version: 3,
            cversion: 0,
            aversion: 0,
            ephemeral_owner: 1,
            data_length: 0,
            num_children: 0,
        };
        let v = version_of("_c_x-lock-0000000001", &stat);
        assert_eq!(v.0, "_c_x-lock-0000000001:3");
        assert_eq!(name_of(&v), Some("_c_x-lock-0000000001"));
    }

    #[test]
    fn foreign_entries_are_described_not_parsed() {
        let stat = Stat {
            czxid: 42,
            mzxid: 42,
            pzxid: 42,
            ctime: 1_700_000_000_000,
            mtime: 1_700_000_000_000,
            version: 0,
            cversion: 0,
            aversion: 0,
            ephemeral_owner: 9,
            data_length: 0,
            num_children: 0,
        };
        let name = "_c_k-lock-0000000001";
        let stored = ZkLock::stored(name, br#"{"owner_id":"kafka-kit"}"#, &stat);
        assert!(stored.record.is_err());
        let holder = ZkLock::holder_record(name, stored, &stat, Duration::from_secs(10));
        assert!(
            holder.holder.contains("foreign queue entry"),
            "{}",
            holder.holder
        );
        assert!(holder.holder.contains("kafka-kit"), "{}", holder.holder);
        assert_eq!(holder.fence, FenceToken(42));
    }
}

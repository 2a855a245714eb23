//! ZooKeeper: a FIFO queue of ephemeral sequential znodes (docs/design.md §3 "ZooKeeper").
//!
//! - Every contender creates `<path>/_c_<uuid>-lock-<seq>` (`EPHEMERAL_SEQUENTIAL`, the
//!   Curator "protected" form kafka-kit also uses, so they all queue together). The
//!   child with the lowest *sequence suffix* holds the lock; every other one watches
//!   only its predecessor. A contender keeps its znode across attempts, so waiters are
//!   served in arrival order.
//! - More than one holder (docs/design.md §6.2), the Curator recipes on the same queue:
//!   a key with `permits: N ≥ 2` grants an exclusive entry (a writer) when it is first,
//!   and a shared one (a reader, a semaphore holder) when no exclusive entry and fewer
//!   than N entries are ahead of it; entries of other clients count as exclusive, so a
//!   mutex user (kafka-kit, Curator) sees the key held by its first entry, and a
//!   waiting writer blocks the readers behind it. The entry's record carries a
//!   [`HolderSet`] with this contender alone in it (permits and mode), which is how
//!   other lockwarden contenders check that every lock on the key names the same
//!   permits (a lockwarden mutex entry names 1); a contender behind one that disagrees
//!   is refused (`PermitsDisagree`) and leaves the queue. (So a waiting contender,
//!   mutexes too, reads every entry ahead of it, in one multi-read where the holder's
//!   entry alone was read before.) A waiter watches what blocks it: its predecessor
//!   (a writer), the nearest writer ahead, or the N entries that hold the permits.
//!   The fence is still the entry's `czxid`: grants follow the queue order, so fences
//!   increase along them. `inspect` reports every granted lockwarden entry as a
//!   holder; `force` is refused on such keys.
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
//!   deleted (unless `force`). Our entries also carry the fields kafka-kit reads, with
//!   a TTL deadline that never passes (`kafka_kit`).
//! - `force` deletes every entry ahead of ours, each conditioned on the version just
//!   read; the old holder learns it at its next renewal (`Lost(EntryGone)`), and the
//!   new fence (a later `czxid`) is higher.
//! - Missing parents are created: ancestors as persistent znodes, the lock path itself
//!   as a container znode, which the server deletes once its queue is empty.
//!
//! Modules: `key` (the URL `zk://HOST:PORT[,…]/PATH` and ZooKeeper's path rules);
//! with the `zookeeper` feature `session` (the shared sessions), `queue` (queue
//! members, joining and forcing the queue), `semaphore` (the grant rule for more than
//! one holder), `lock` (`ZkLock`, the [`LockBackend`] on top), `connect`, `cleanup`
//! (deleting our znodes in the background) and `kafka_kit` (what kafka-kit reads in a
//! queue entry); the command line's `flags` with `cli`. Its part of a DistributedLock's
//! spec is lockwarden-api's.
//!
//! [`HolderSet`]: lockwarden_core::HolderSet
//! [`LockBackend`]: lockwarden_core::LockBackend
//! [`LockRecord`]: lockwarden_core::LockRecord
//! [`Version`]: lockwarden_core::Version

#[cfg(feature = "zookeeper")]
mod cleanup;
#[cfg(feature = "zookeeper")]
mod connect;
#[cfg(feature = "cli")]
mod flags;
#[cfg(feature = "zookeeper")]
mod kafka_kit;
pub mod key;
#[cfg(feature = "zookeeper")]
mod lock;
#[cfg(feature = "zookeeper")]
mod queue;
#[cfg(feature = "zookeeper")]
mod runs;
#[cfg(feature = "zookeeper")]
mod semaphore;
#[cfg(feature = "zookeeper")]
mod session;

use std::time::Duration;

#[cfg(feature = "zookeeper")]
pub use connect::{connect, release_recorded};
#[cfg(feature = "zookeeper")]
use connect::{definite, permanent, session_ended};
#[cfg(feature = "cli")]
pub use flags::ZooKeeperFlags;
pub use key::{DEFAULT_PORT, PATH_MAX_BYTES, ZkKey, path_name};
#[cfg(feature = "zookeeper")]
pub use lock::{FOREIGN_QUEUE_ENTRY, ZkLock};
#[cfg(feature = "zookeeper")]
pub use queue::sequence_of;
#[cfg(feature = "zookeeper")]
pub use session::{ZkSession, ZkSessions, parse_connect};

/// How to open the session a lock lives on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ZooKeeperOptions {
    /// The session timeout to ask the servers for (they clamp it to their
    /// `minSessionTimeout ..= maxSessionTimeout`). Default [`DEFAULT_SESSION_TIMEOUT`].
    /// Locks asking for different timeouts get different sessions.
    pub session_timeout: Option<Duration>,
}

/// Session timeout asked of the servers unless configured otherwise.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

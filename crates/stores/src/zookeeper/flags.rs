//! The command line's ZooKeeper flag (feature `cli`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ZooKeeperOptions;

/// The command line's ZooKeeper flag (not saved: `unlock` deletes the entry on any
/// session).
#[derive(clap::Args, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct ZooKeeperFlags {
    /// ZooKeeper session timeout to ask the servers for (they may adjust it); a lock
    /// on ZooKeeper is lost this long after its holder stops being heard from [default: 10s]
    #[arg(long, value_name = "DURATION", value_parser = lockwarden_core::duration::parse_flag_duration)]
    #[serde(skip)]
    pub session_timeout: Option<Duration>,
}

impl ZooKeeperFlags {
    pub fn options(&self) -> ZooKeeperOptions {
        ZooKeeperOptions {
            session_timeout: self.session_timeout,
        }
    }
}

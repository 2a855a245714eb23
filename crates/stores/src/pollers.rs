//! The other tools whose clients poll a key lockwarden shares with them
//! (docs/design.md §6.4, "Sharing a key with a tool that polls"): on which store each
//! lives and how often its clients look by default. A request that yields to one
//! leaves a key lockwarden freed alone for one of those polls. Each store declares its
//! own tool (`POLLING_TOOL` in its folder); the registry lists them and finds one by
//! name (`SharedWith::named`).

use std::fmt;
use std::time::Duration;

/// A tool whose waiting clients poll the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollingTool {
    pub name: &'static str,
    /// The one store it locks on (its `StoreKey::KIND`: `s3`, `dynamodb`, …).
    pub store: &'static str,
    /// How often a waiting client of it looks, unless configured otherwise.
    pub default_period: Duration,
    /// Its source, for the period.
    pub why: &'static str,
}

/// A tool sharing a key, and how often its clients poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedWith {
    pub tool: PollingTool,
    pub period: Duration,
}

impl SharedWith {
    /// How long a freed key is left to the tool: one poll period, plus a quarter of it
    /// (at least 200 ms) for the poll's own request and the scheduling of the client.
    pub fn window(&self) -> Duration {
        self.period + (self.period / 4).max(Duration::from_millis(200))
    }
}

impl fmt::Display for SharedWith {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} polling every {}",
            self.tool.name,
            humantime::format_duration(self.period)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_covers_one_poll_and_its_request() {
        let dynamolock = SharedWith::named("dynamolock").unwrap();
        assert_eq!(dynamolock.window(), Duration::from_millis(1_250));
        let fast = SharedWith {
            period: Duration::from_millis(200),
            ..dynamolock
        };
        assert_eq!(fast.window(), Duration::from_millis(400));
        assert_eq!(SharedWith::named("consul"), None);
    }
}

//! Time-based safety decisions, made only on the local monotonic clock.
//!
//! Two rules of docs/design.md §3 live here:
//! - rule 1, [`LeaseObserver`]: a contender may take over only after it has itself
//!   seen the same record version, unchanged, for the whole lease plus a grace;
//! - rule 2, [`HolderDeadline`]: a holder stops claiming the lock at
//!   `t_sent(last successful write) + lease × (1 − δ) − margin`.
//!
//! Together they make the holder give up strictly before any contender can take
//! over, as long as the two clocks' rates differ by less than δ. Wall-clock time
//! stored in records is never consulted.

use std::time::Duration;

use tokio::time::Instant;

use super::record::Version;

/// Safety parameters shared by holders and contenders.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SafetyMargins {
    /// Tolerated relative clock-rate difference between two processes (δ).
    pub drift: f64,
    /// Time the holder reserves for the latency of its own renewal request.
    pub margin: Duration,
    /// Extra time a contender waits beyond the lease before it takes over.
    pub grace: Duration,
}

impl Default for SafetyMargins {
    fn default() -> Self {
        SafetyMargins {
            drift: 0.02,
            margin: Duration::from_millis(250),
            grace: Duration::from_millis(250),
        }
    }
}

impl SafetyMargins {
    /// How long after sending a successful write the writer may still claim the lock.
    pub fn holder_validity(&self, lease: Duration) -> Duration {
        lease.mul_f64(1.0 - self.drift).saturating_sub(self.margin)
    }

    /// How long a contender must see one version unchanged before taking over.
    pub fn takeover_after(&self, lease: Duration) -> Duration {
        lease + self.grace
    }
}

/// Rule 1: expiry is observed, not computed from timestamps.
///
/// Remembers the first local instant at which a version was seen. A restarted
/// contender (a new observer) starts observing afresh.
#[derive(Debug, Default)]
pub struct LeaseObserver {
    seen: Option<(Version, Instant)>,
}

impl LeaseObserver {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `version` was read now (or earlier, if it was already being
    /// observed) and returns how long it has been seen unchanged.
    pub fn observe(&mut self, version: &Version) -> Duration {
        self.observe_at(version, Instant::now())
    }

    fn observe_at(&mut self, version: &Version, now: Instant) -> Duration {
        match &self.seen {
            Some((v, since)) if v == version => now.saturating_duration_since(*since),
            _ => {
                self.seen = Some((version.clone(), now));
                Duration::ZERO
            }
        }
    }

    /// Whether `version`, read now, has been unchanged for at least `after`.
    pub fn is_expired(&mut self, version: &Version, after: Duration) -> bool {
        self.observe(version) >= after
    }

    /// Time left until `version` could be considered expired, if it stays unchanged.
    pub fn remaining(&self, version: &Version, after: Duration) -> Duration {
        match &self.seen {
            Some((v, since)) if v == version => after.saturating_sub(since.elapsed()),
            _ => after,
        }
    }

    pub fn forget(&mut self) {
        self.seen = None;
    }
}

/// Rule 2: the holder's own deadline for claiming the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HolderDeadline {
    valid_until: Instant,
}

impl HolderDeadline {
    /// The deadline after a successful write that was *sent* at `sent`.
    pub fn after_write(sent: Instant, lease: Duration, margins: &SafetyMargins) -> Self {
        HolderDeadline {
            valid_until: sent + margins.holder_validity(lease),
        }
    }

    /// A deadline that has already passed (e.g. a lease resumed without a fresh write).
    pub fn expired() -> Self {
        HolderDeadline {
            valid_until: Instant::now(),
        }
    }

    pub fn instant(&self) -> Instant {
        self.valid_until
    }

    /// Whether the holder may still claim the lock.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until
    }

    pub fn remaining(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version(s.into())
    }

    #[test]
    fn observed_expiry_needs_the_same_version_for_the_whole_lease() {
        let mut o = LeaseObserver::new();
        let t0 = Instant::now();
        assert_eq!(o.observe_at(&v("a"), t0), Duration::ZERO);
        assert_eq!(
            o.observe_at(&v("a"), t0 + Duration::from_secs(3)),
            Duration::from_secs(3)
        );
        // A new version (a renewal) restarts the observation.
        assert_eq!(
            o.observe_at(&v("b"), t0 + Duration::from_secs(4)),
            Duration::ZERO
        );
        assert_eq!(
            o.observe_at(&v("b"), t0 + Duration::from_secs(5)),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn rule1_remaining_counts_down_from_the_first_sight_of_a_version() {
        let mut o = LeaseObserver::new();
        let after = Duration::from_secs(60);
        // Not observed yet, or another version: the whole wait is ahead.
        assert_eq!(o.remaining(&v("a"), after), after);
        o.observe_at(&v("a"), Instant::now() - Duration::from_secs(20));
        let left = o.remaining(&v("a"), after);
        assert!(left <= Duration::from_secs(40) && left > Duration::from_secs(39));
        assert_eq!(o.remaining(&v("b"), after), after);
        assert!(o.is_expired(&v("a"), Duration::from_secs(20)));
        // A restarted contender (forgetting) starts again.
        o.forget();
        assert!(!o.is_expired(&v("a"), Duration::from_secs(20)));
    }

    #[test]
    fn rule2_deadline_is_lease_less_drift_and_margin_after_the_send() {
        let m = SafetyMargins::default();
        let sent = Instant::now() - Duration::from_secs(5);
        let lease = Duration::from_secs(10);
        let d = HolderDeadline::after_write(sent, lease, &m);
        // 10 s × (1 − 0.02) − 250 ms
        assert_eq!(d.instant(), sent + Duration::from_millis(9_550));
        assert!(d.is_valid());
        let stale = HolderDeadline::after_write(sent, Duration::from_secs(5), &m);
        assert!(!stale.is_valid(), "sent 5 s ago with a 5 s lease");
        assert!(!HolderDeadline::expired().is_valid());
        assert_eq!(HolderDeadline::expired().remaining(), Duration::ZERO);
    }

    #[test]
    fn holder_gives_up_before_a_contender_may_take_over() {
        let m = SafetyMargins::default();
        for lease_ms in [1_000u64, 5_000, 30_000, 600_000] {
            let lease = Duration::from_millis(lease_ms);
            // The contender's observation starts no earlier than the holder's send, and
            // its clock may run δ fast: the holder must still be done first.
            let contender_earliest = m.takeover_after(lease).mul_f64(1.0 - m.drift);
            assert!(
                m.holder_validity(lease) < contender_earliest,
                "lease {lease:?}"
            );
        }
    }

    #[test]
    fn rule8_the_delay_adds_to_the_time_between_the_holders_deadline_and_a_takeover() {
        let m = SafetyMargins::default();
        for (lease_ms, delay_ms) in [(2_000u64, 3_000u64), (30_000, 30_000), (30_000, 600_000)] {
            let (lease, delay) = (
                Duration::from_millis(lease_ms),
                Duration::from_millis(delay_ms),
            );
            // The holder's deadline runs on its lease; contenders observe lease + delay,
            // on a clock that may run δ fast.
            let holder_done = m.holder_validity(lease);
            let contender_earliest = m.takeover_after(lease + delay).mul_f64(1.0 - m.drift);
            // What the holder's processes get after its deadline: (D + grace)(1 − δ) +
            // margin, as docs/design.md rule 8 argues.
            let window = contender_earliest - holder_done;
            let argued = (delay + m.grace).mul_f64(1.0 - m.drift) + m.margin;
            let diff = window.abs_diff(argued);
            assert!(diff < Duration::from_micros(1), "{window:?} vs {argued:?}");
        }
    }
}

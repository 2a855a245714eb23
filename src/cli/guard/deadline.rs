//! What the guard's reads prove (docs/design.md §3 rule 9): each read of a lock's
//! record ([`Seen`], [`Read`]), the deadline one lock's reads give ([`GuardDeadline`]),
//! how often to read and the longest grace a stored lease leaves, and the earliest
//! deadline of every lock the guard watches ([`Watch::deadline`]). No I/O: the reads
//! come from `reads.rs`, and what the deadline stops from `watch.rs`.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::cli::stop::longest_grace;
use lockwarden_core::{FenceToken, LockState, SafetyMargins, Stored};

/// What one read of the record showed about the acquisition the guard watches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Held with our nonce: the revision of our own entry (the record's, on a key with
    /// one permit), its stored lease (what contenders observe it for) and its fence.
    Ours {
        revision: String,
        lease: Duration,
        fence: FenceToken,
    },
    /// Not ours: another nonce, a released tombstone, no record, a foreign record.
    NotOurs(String),
    /// No answer (an error, a timeout): nothing learnt, nothing moves.
    NoAnswer(String),
}

impl Seen {
    /// Our acquisition (by `nonce`) in what a read returned. On a key with several
    /// permits only our own entry's revision proves a renewal: the other holders'
    /// writes change the record, not our entry.
    pub fn of(stored: Option<&Stored>, nonce: &str) -> Seen {
        let Some(stored) = stored else {
            return Seen::NotOurs("no record".into());
        };
        let record = match &stored.record {
            Ok(record) => record,
            Err(foreign) => return Seen::NotOurs(format!("a foreign record ({foreign})")),
        };
        if let Some(set) = &record.set {
            return match set.entry(nonce) {
                Some(entry) => Seen::Ours {
                    revision: entry.revision.clone(),
                    lease: Duration::from_millis(entry.lease_ms),
                    fence: entry.fence,
                },
                None => Seen::NotOurs("no permit of the key carries this nonce".into()),
            };
        }
        match (record.nonce == nonce, record.state) {
            (true, LockState::Held) => Seen::Ours {
                revision: record.revision.clone(),
                lease: record.lease,
                fence: record.fence,
            },
            (true, LockState::Released) => Seen::NotOurs("released".into()),
            (false, LockState::Held) => Seen::NotOurs(format!(
                "held by {} (fence {})",
                record.holder, record.fence
            )),
            (false, LockState::Released) => Seen::NotOurs(format!(
                "released, last by {} (fence {})",
                record.holder, record.fence
            )),
        }
    }
}

/// One read of the record: sent and answered on the guard's monotonic clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Read {
    pub sent: Instant,
    pub replied: Instant,
    pub seen: Seen,
}

/// What a read changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing new: the same revision, no answer, or the first revision seen.
    Unchanged,
    /// A renewal observed: the deadline moved to this instant.
    Renewed { deadline: Instant },
    /// The store says the lock is not ours, as of `at` (the reply).
    Lost { at: Instant, why: String },
}

/// Rule 9: the guard's deadline, from its own reads alone.
///
/// Seeing revision R says nothing about when R was written; what a linearizable read
/// does prove is that a revision R' first seen after R was written after the last read
/// that still showed R was served, so after that read was *sent*. A contender observes
/// R' for its stored lease plus the grace from no earlier than that write (rule 1), so
/// the work must stop by `t_send(last read showing R) + lease(R') × (1 − δ) − margin`.
/// Before the first renewal is seen, no deadline is known.
#[derive(Debug)]
pub struct GuardDeadline {
    margins: SafetyMargins,
    /// The revision last seen and the send time of the latest read showing it.
    latest: Option<(String, Instant)>,
    deadline: Option<Instant>,
}

impl GuardDeadline {
    pub fn new(margins: SafetyMargins) -> Self {
        GuardDeadline {
            margins,
            latest: None,
            deadline: None,
        }
    }

    /// The instant by which the work must have stopped, once a renewal was seen.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Takes one answered (or unanswered) read into account. Reads come in the order
    /// they were sent; each is answered (or given up) before the next is sent.
    pub fn read(&mut self, read: &Read) -> Step {
        let (revision, lease) = match &read.seen {
            Seen::NoAnswer(_) => return Step::Unchanged,
            Seen::NotOurs(why) => {
                return Step::Lost {
                    at: read.replied,
                    why: why.clone(),
                };
            }
            Seen::Ours {
                revision, lease, ..
            } => (revision, *lease),
        };
        match self.latest.take() {
            Some((seen, _)) if seen == *revision => {
                self.latest = Some((seen, read.sent));
                Step::Unchanged
            }
            Some((_, previous_sent)) => {
                // Written after `previous_sent`, observed by contenders for its own lease.
                let deadline = previous_sent + self.margins.holder_validity(lease);
                let deadline = self.deadline.map_or(deadline, |d| d.max(deadline));
                self.deadline = Some(deadline);
                self.latest = Some((revision.clone(), read.sent));
                Step::Renewed { deadline }
            }
            None => {
                self.latest = Some((revision.clone(), read.sent));
                Step::Unchanged
            }
        }
    }
}

/// How often the guard reads the record: a twentieth of the stored lease (at least
/// 100 ms), so that two polls are a small part of what the grace may use (rule 9).
pub fn poll_interval(lease: Duration) -> Duration {
    (lease / 20).max(Duration::from_millis(100))
}

/// The longest `--grace` for a stored lease: `run`'s bound (renewals on schedule must
/// not trigger SIGTERM), less two polls, since the guard's deadline runs from the send
/// of the read *before* the one that showed a renewal, and it sees the next renewal
/// only at its next read.
pub fn longest_guard_grace(lease: Duration, margins: &SafetyMargins) -> Duration {
    longest_grace(lease, margins).saturating_sub(2 * poll_interval(lease))
}

/// One lock as the guard sees it.
pub(super) struct Watched {
    pub(super) url: String,
    pub(super) clock: GuardDeadline,
    /// While the guard waits to start COMMAND: a holder that has not renewed this lock
    /// by then (its stored lease after the first read) has itself given up.
    pub(super) give_up: Instant,
    pub(super) lease: Duration,
}

/// The guard's view of its locks while it waits and while COMMAND runs.
pub(super) struct Watch {
    pub(super) grace: Duration,
    pub(super) locks: Vec<Watched>,
    /// Every lock's reads, tagged with its index in `locks`.
    pub(super) reads: mpsc::Receiver<(usize, Read)>,
}

impl Watch {
    /// The earliest of the locks' deadlines and the lock it is of, once every lock has
    /// one: the work must stop by the first of them.
    pub(super) fn deadline(&self) -> Option<(Instant, usize)> {
        let mut earliest: Option<(Instant, usize)> = None;
        for (i, lock) in self.locks.iter().enumerate() {
            let deadline = lock.clock.deadline()?;
            if earliest.is_none_or(|(e, _)| deadline < e) {
                earliest = Some((deadline, i));
            }
        }
        earliest
    }

    pub(super) fn urls(&self) -> String {
        let urls: Vec<&str> = self.locks.iter().map(|l| l.url.as_str()).collect();
        urls.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::stop::StopTimes;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn ours(revision: &str, lease_ms: u64) -> Seen {
        Seen::Ours {
            revision: revision.into(),
            lease: ms(lease_ms),
            fence: FenceToken(7),
        }
    }

    /// A read sent at `t0 + sent` ms, answered 20 ms later.
    fn read(t0: Instant, sent: u64, seen: Seen) -> Read {
        Read {
            sent: t0 + ms(sent),
            replied: t0 + ms(sent + 20),
            seen,
        }
    }

    #[test]
    fn rule9_no_deadline_before_one_renewal_is_seen() {
        let t0 = Instant::now();
        let mut clock = GuardDeadline::new(SafetyMargins::default());
        for at in [0, 150, 300, 450] {
            assert_eq!(clock.read(&read(t0, at, ours("r0", 3000))), Step::Unchanged);
        }
        assert_eq!(
            clock.deadline(),
            None,
            "the same revision proves no renewal"
        );
        assert_eq!(
            clock.read(&read(t0, 600, Seen::NoAnswer("timeout".into()))),
            Step::Unchanged
        );
        assert_eq!(clock.deadline(), None);
    }

    #[test]
    fn rule9_the_deadline_runs_from_the_send_of_the_last_read_showing_the_previous_revision() {
        let margins = SafetyMargins::default();
        let t0 = Instant::now();
        let mut clock = GuardDeadline::new(margins);
        clock.read(&read(t0, 0, ours("r0", 3000)));
        clock.read(&read(t0, 150, ours("r0", 3000)));
        // An unanswered read in between proves nothing either way.
        clock.read(&read(t0, 300, Seen::NoAnswer("timeout".into())));
        let expected = t0 + ms(150) + margins.holder_validity(ms(3000));
        assert_eq!(
            clock.read(&read(t0, 450, ours("r1", 3000))),
            Step::Renewed { deadline: expected }
        );
        // Seeing r1 again does not move it: when r1 was written is not known better.
        assert_eq!(
            clock.read(&read(t0, 600, ours("r1", 3000))),
            Step::Unchanged
        );
        assert_eq!(clock.deadline(), Some(expected));
        // The next renewal moves it from the last read that still showed r1, with the
        // lease stored in the new revision.
        let moved = t0 + ms(600) + margins.holder_validity(ms(6000));
        assert_eq!(
            clock.read(&read(t0, 750, ours("r2", 6000))),
            Step::Renewed { deadline: moved }
        );
        // A revision stored with a shorter lease never pulls the deadline back.
        assert_eq!(
            clock.read(&read(t0, 900, ours("r3", 100))),
            Step::Renewed { deadline: moved }
        );
    }

    #[test]
    fn rule9_a_record_that_is_not_ours_is_a_loss_as_of_the_reply() {
        let t0 = Instant::now();
        let mut clock = GuardDeadline::new(SafetyMargins::default());
        clock.read(&read(t0, 0, ours("r0", 3000)));
        let step = clock.read(&read(t0, 150, Seen::NotOurs("released".into())));
        assert_eq!(
            step,
            Step::Lost {
                at: t0 + ms(170),
                why: "released".into()
            }
        );
    }

    /// The safety argument with drift: the holder's write of r1 lands after the guard's
    /// last read showing r0 was sent; a contender whose clock runs δ faster starts
    /// observing r1 no earlier than the write and takes over after `lease + grace` of
    /// its own time, which is `(lease + grace) / (1 + δ)` of the guard's. The deadline
    /// comes first, and SIGKILL a kill margin before it.
    #[test]
    fn rule9_the_deadline_precedes_the_earliest_takeover_of_a_contender_whose_clock_runs_fast() {
        let margins = SafetyMargins::default();
        for lease in [ms(1000), ms(3000), ms(30_000), ms(3_600_000)] {
            let t0 = Instant::now();
            let mut clock = GuardDeadline::new(margins);
            let poll = poll_interval(lease);
            clock.read(&read(t0, 0, ours("r0", lease.as_millis() as u64)));
            let last_r0 = t0 + poll;
            clock.read(&Read {
                sent: last_r0,
                replied: last_r0 + ms(20),
                seen: ours("r0", lease.as_millis() as u64),
            });
            // The write of r1 lands the instant after the read showing r0 was served:
            // the earliest it can be, so the worst case for the guard.
            let written = last_r0 + ms(1);
            let Step::Renewed { deadline } = clock.read(&Read {
                sent: last_r0 + poll,
                replied: last_r0 + poll + ms(20),
                seen: ours("r1", lease.as_millis() as u64),
            }) else {
                panic!("a new revision is a renewal");
            };
            let fast = 1.0 + margins.drift;
            let takeover = written + margins.takeover_after(lease).div_f64(fast);
            assert!(
                deadline < takeover,
                "{lease:?}: deadline {deadline:?} not before takeover {takeover:?}"
            );
            let stop = StopTimes::before(deadline, longest_guard_grace(lease, &margins));
            assert!(stop.term <= stop.kill && stop.kill < deadline);
        }
    }

    #[test]
    fn rule9_the_longest_grace_leaves_a_renewal_on_schedule_and_two_polls_before_sigterm() {
        use lockwarden_core::RenewPolicy;
        let margins = SafetyMargins::default();
        for (lease, longest) in [(30_000, 8_150), (4_000, 436), (3_000, 140), (1_500, 0)] {
            let lease = ms(lease);
            assert_eq!(
                longest_guard_grace(lease, &margins),
                ms(longest),
                "{lease:?}"
            );
            // The holder's renewal r1 is written just after the guard's read s showing
            // r0; the next renewal goes one interval after r1's reply and takes its
            // whole request timeout; the guard reads every poll. It sees that renewal
            // by its second read after the write, before SIGTERM.
            let s = Instant::now();
            let policy = RenewPolicy::for_lease(lease);
            let poll = poll_interval(lease);
            let next_written = s + poll + policy.interval + policy.request_timeout;
            let seen = next_written + poll;
            let deadline = s + margins.holder_validity(lease);
            let stop = StopTimes::before(deadline, longest_guard_grace(lease, &margins));
            if longest > 0 {
                assert!(seen <= stop.term, "{lease:?}: {seen:?} > {:?}", stop.term);
            }
        }
    }

    #[test]
    fn rule9_only_our_own_entry_proves_a_renewal_on_a_key_with_permits() {
        use lockwarden_core::{HolderSet, LockRecord, Mode, SetEntry, Version};
        let entry = |nonce: &str, revision: &str| SetEntry {
            holder: "h".into(),
            nonce: nonce.into(),
            revision: revision.into(),
            fence: FenceToken(3),
            lease_ms: 4000,
            mode: Mode::Shared,
            data: None,
            acquired_at_ms: 0,
            renewed_at_ms: 0,
            weight: 1,
            priority: 0,
            ticket: 0,
            overtaken: 0,
            unknown: Default::default(),
        };
        let stored = |other_revision: &str| {
            let mut record = LockRecord::new_acquisition("h", FenceToken(3), ms(4000), None);
            record.nonce = "another".into();
            record.revision = random_revision(other_revision);
            record.set = Some(HolderSet {
                permits: 2,
                last_fence: FenceToken(3),
                holders: vec![entry("another", other_revision), entry("mine", "e1")],
                waiting_writer: None,
                queue: None,
                unknown: Default::default(),
            });
            Stored {
                record: Ok(record),
                version: Version(other_revision.into()),
            }
        };
        // Another holder renews: the record changes, our entry does not.
        let a = Seen::of(Some(&stored("x1")), "mine");
        let b = Seen::of(Some(&stored("x2")), "mine");
        assert_eq!(a, b);
        assert_eq!(
            a,
            Seen::Ours {
                revision: "e1".into(),
                lease: ms(4000),
                fence: FenceToken(3)
            }
        );
        assert!(matches!(
            Seen::of(Some(&stored("x1")), "gone"),
            Seen::NotOurs(_)
        ));
        assert!(matches!(Seen::of(None, "mine"), Seen::NotOurs(_)));
    }

    /// With several locks COMMAND starts once every lock has shown a renewal, and its
    /// deadline is the earliest of theirs.
    #[test]
    fn rule9_several_locks_stop_the_command_by_the_earliest_deadline() {
        let margins = SafetyMargins::default();
        let t0 = Instant::now();
        let (_tx, reads) = mpsc::channel(1);
        let watched = |url: &str| Watched {
            url: url.into(),
            clock: GuardDeadline::new(margins),
            give_up: t0 + ms(3000),
            lease: ms(3000),
        };
        let mut watch = Watch {
            grace: ms(100),
            locks: vec![watched("s3://b/a"), watched("s3://b/b")],
            reads,
        };
        for lock in &mut watch.locks {
            lock.clock.read(&read(t0, 0, ours("r0", 3000)));
        }
        watch.locks[0].clock.read(&read(t0, 150, ours("r1", 3000)));
        assert_eq!(watch.deadline(), None, "lock b has shown no renewal yet");
        watch.locks[1].clock.read(&read(t0, 300, ours("r1", 3000)));
        // Both renewals were written after the reads sent at 0: the same deadline.
        let both = t0 + margins.holder_validity(ms(3000));
        assert_eq!(watch.deadline(), Some((both, 0)));
        // a renews again: its deadline moves on, b's is now the earlier one.
        watch.locks[0].clock.read(&read(t0, 450, ours("r1", 3000)));
        watch.locks[0].clock.read(&read(t0, 600, ours("r2", 3000)));
        assert_eq!(
            watch.locks[0].clock.deadline(),
            Some(t0 + ms(450) + margins.holder_validity(ms(3000)))
        );
        assert_eq!(watch.deadline(), Some((both, 1)));
    }

    fn random_revision(seed: &str) -> String {
        format!("record-{seed}")
    }
}

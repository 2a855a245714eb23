//! Keys with more than one holder (docs/design.md §6.2) on every store, against the real
//! servers: a counting semaphore (permits 3, 12 contenders × 50 acquisitions) and a
//! shared/exclusive lock (8 readers, 2 writers). One checker records every hold and
//! judges both while they happen and afterwards, from the recorded intervals.
//!
//! Each hold's interval runs from just after the grant returned to just before the
//! release was sent, so it lies inside the time the store counted the permit as taken:
//! more overlapping intervals than permits would mean the store granted too many. In
//! the first round every holder keeps its permit until the key is full (or 20 s
//! passed) and then 2.5 s more, so a full key is seen however slowly the machine runs,
//! and every waiter asks while it is full.
//!
//! S3 and DynamoDB run on versitygw and dynalite (both pass the canary) unless
//! `LOCKWARDEN_S3_SERVER` / `LOCKWARDEN_DYNAMODB_SERVER` name another server: on
//! moto-atomic, which answers one request at a time, 600 grants take minutes.

use lockwarden_testsupport as support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockwarden::lock::{AcquireRequest, Attempt, Lease, LockBackend, Mode, Permits};
use rand::Rng;
use support::keys::Key;
use support::stores::{dynamodb_choice_for_load, s3_choice_for_load};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep};

/// How long any one contender may wait for a permit before the test gives up: far
/// beyond anything a loaded 2-core machine needs.
const GIVE_UP: Duration = Duration::from_secs(120);

/// How long the first holders keep a full key.
const FULL_FOR: Duration = Duration::from_millis(2500);

/// The stated bound for a writer among 8 readers: from its first attempt to its grant.
/// What it proves is no starvation: readers keep coming until the writers are done, so
/// without the writer policy a writer waits until GIVE_UP. Each reader holds at most
/// 60 ms and polls at most every second, so an idle machine lets a writer in within a
/// few seconds; the bound leaves room for a 2-core machine running the whole suite
/// beside it (33 s was seen there once, with two other builds on the machine).
const WRITER_BOUND: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug)]
struct Hold {
    fence: u64,
    mode: Mode,
    /// When the contender began asking for this permit: its grant was written later.
    asked: Instant,
    start: Instant,
    end: Instant,
}

/// Every hold, and the holders right now.
#[derive(Default)]
struct Holds {
    state: Mutex<HoldState>,
}

#[derive(Default)]
struct HoldState {
    live: Vec<(u64, Mode)>,
    done: Vec<Hold>,
    most_shared_at_once: usize,
}

impl Holds {
    /// A grant just returned: no more than `permits` shared holders, and an exclusive
    /// one alone.
    fn enter(&self, lease: &Lease, permits: u32, mode: Mode) -> Instant {
        assert!(
            lease.is_valid(),
            "granted a lease already past its deadline"
        );
        let mut st = self.state.lock().unwrap();
        let fence = lease.fence().0;
        let conflict = match mode {
            Mode::Exclusive => !st.live.is_empty(),
            Mode::Shared => {
                st.live.len() >= permits as usize
                    || st.live.iter().any(|(_, m)| *m == Mode::Exclusive)
            }
        };
        assert!(
            !conflict,
            "{mode} grant with fence {fence} while {:?} held the key (permits {permits})",
            st.live
        );
        st.live.push((fence, mode));
        if mode == Mode::Shared {
            st.most_shared_at_once = st.most_shared_at_once.max(st.live.len());
        }
        Instant::now()
    }

    fn exit(&self, lease: &Lease, mode: Mode, asked: Instant, start: Instant) {
        let mut st = self.state.lock().unwrap();
        let fence = lease.fence().0;
        st.live.retain(|(f, _)| *f != fence);
        st.done.push(Hold {
            fence,
            mode,
            asked,
            start,
            end: Instant::now(),
        });
    }

    /// The recorded intervals, judged afterwards: never more than `permits` at once (an
    /// exclusive hold counting as all of them), fences distinct, and a hold that ended
    /// before another contender began asking has the lower fence (grants are ordered by
    /// fence in the store; the moment a contender learns of its grant can be later, so
    /// the comparison is with when it asked).
    fn check(&self, permits: u32) -> Vec<Hold> {
        let st = self.state.lock().unwrap();
        let holds = st.done.clone();
        let mut fences: Vec<u64> = holds.iter().map(|h| h.fence).collect();
        fences.sort_unstable();
        fences.dedup();
        if fences.len() != holds.len() {
            let mut seen = std::collections::HashMap::new();
            for h in &holds {
                if let Some(first) = seen.insert(h.fence, *h) {
                    panic!("two grants shared fence {}: {first:?} and {h:?}", h.fence);
                }
            }
        }
        let mut events: Vec<(Instant, i64)> = Vec::new();
        for h in &holds {
            let weight = match h.mode {
                Mode::Exclusive => permits as i64,
                Mode::Shared => 1,
            };
            events.push((h.start, weight));
            events.push((h.end, -weight));
        }
        // At equal instants, ends first: an interval is closed at its release.
        events.sort_by_key(|(t, w)| (*t, *w));
        let mut in_use = 0;
        for (t, w) in &events {
            in_use += w;
            assert!(
                in_use <= permits as i64,
                "{in_use} permits in use at {t:?} (permits {permits})"
            );
        }
        let mut by_asked = holds.clone();
        by_asked.sort_by_key(|h| h.asked);
        let mut ended: Vec<&Hold> = holds.iter().collect();
        ended.sort_by_key(|h| h.end);
        // For each hold, every hold that ended before it was asked for has a lower
        // fence: the highest such fence, swept in order of asking.
        let (mut i, mut highest_ended) = (0, 0);
        for h in &by_asked {
            while i < ended.len() && ended[i].end < h.asked {
                highest_ended = highest_ended.max(ended[i].fence);
                i += 1;
            }
            assert!(
                h.fence > highest_ended,
                "fence {} asked for after fence {highest_ended} was released",
                h.fence
            );
        }
        holds
    }

    fn most_shared_at_once(&self) -> usize {
        self.state.lock().unwrap().most_shared_at_once
    }

    /// Waits (up to 20 s) until `n` shared holders hold the key at once.
    async fn until_shared_by(&self, n: usize) {
        let give_up = Instant::now() + Duration::from_secs(20);
        while self.most_shared_at_once() < n && Instant::now() < give_up {
            sleep(Duration::from_millis(10)).await;
        }
    }
}

fn request(holder: &str, permits: u32, mode: Mode) -> AcquireRequest {
    AcquireRequest {
        permits: Permits {
            total: permits,
            mode,
        },
        ..AcquireRequest::new(holder, Duration::from_secs(60))
    }
}

/// Waits for a permit: tries, and on "busy" waits for a release in this process (as the
/// controller's same-cluster index would tell it), the store's own notification, or a
/// short poll. Returns the lease and how long it took.
async fn take(
    lock: &dyn LockBackend,
    req: &AcquireRequest,
    released: &Notify,
) -> (Lease, Duration) {
    let started = Instant::now();
    loop {
        match lock.try_acquire(req).await {
            Ok(Attempt::Acquired(lease)) => return (lease, started.elapsed()),
            Ok(Attempt::Busy { retry_in, .. }) => {
                let poll = retry_in
                    .unwrap_or(Duration::MAX)
                    .min(Duration::from_secs(1));
                tokio::select! {
                    _ = released.notified() => {}
                    _ = lock.changed(poll) => {}
                }
            }
            Err(e) if e.is_transient() => sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("{}: {e}", req.holder),
        }
        assert!(
            started.elapsed() < GIVE_UP,
            "{} never got a permit",
            req.holder
        );
    }
}

/// What one contender does: at least `rounds` times (and, with `until`, until it is
/// set) take a permit, hold it for a random time in `hold`, release. In its first round
/// a shared contender keeps its permit until `fill` shared holders held the key at once.
struct Contender {
    key: Key,
    req: AcquireRequest,
    rounds: usize,
    hold: std::ops::Range<u64>,
    fill: usize,
    until: Option<Arc<AtomicBool>>,
}

impl Contender {
    fn new(key: &Key, req: AcquireRequest, rounds: usize, hold: std::ops::Range<u64>) -> Self {
        Contender {
            key: key.clone(),
            req,
            rounds,
            hold,
            fill: 0,
            until: None,
        }
    }

    fn more(&self, done: usize) -> bool {
        done < self.rounds
            || self
                .until
                .as_ref()
                .is_some_and(|u| !u.load(Ordering::SeqCst))
    }

    /// Runs the rounds; returns how long each grant took to come.
    async fn run(self, holds: Arc<Holds>, released: Arc<Notify>) -> Vec<Duration> {
        let lock = self.key.handle().await;
        let (req, mode) = (&self.req, self.req.permits.mode);
        let mut waits = Vec::new();
        while self.more(waits.len()) {
            let asked = Instant::now();
            let (lease, waited) = take(lock.as_ref(), req, &released).await;
            let start = holds.enter(&lease, req.permits.total, mode);
            let ms = rand::rng().random_range(self.hold.clone());
            sleep(Duration::from_millis(ms)).await;
            if waits.is_empty() && mode == Mode::Shared && self.fill > 0 {
                holds.until_shared_by(self.fill).await;
                // Stay while the key is full, long enough for every waiter to ask
                // (they poll at least once a second): a store granting more than the
                // permits is caught here, not only by chance later.
                sleep(FULL_FOR).await;
            }
            waits.push(waited);
            holds.exit(&lease, mode, asked, start);
            lock.release(&lease)
                .await
                .unwrap_or_else(|e| panic!("{}: release: {e}", req.holder));
            released.notify_one();
        }
        waits
    }
}

const PERMITS: u32 = 3;
const CONTENDERS: usize = 12;
const ACQUISITIONS_EACH: usize = 50;

/// Permits 3, 12 contenders × 50 acquisitions: never more than 3 holders at once, and
/// fences strictly increasing across all grants.
async fn never_more_holders_than_permits((_server, key): Loaded) {
    let holds = Arc::new(Holds::default());
    let released = Arc::new(Notify::new());
    let started = Instant::now();
    let tasks: Vec<_> = (0..CONTENDERS)
        .map(|c| {
            let req = request(&format!("contender-{c}"), PERMITS, Mode::Shared);
            let contender = Contender {
                fill: PERMITS as usize,
                ..Contender::new(&key, req, ACQUISITIONS_EACH, 5..15)
            };
            tokio::spawn(contender.run(holds.clone(), released.clone()))
        })
        .collect();
    for t in tasks {
        t.await.expect("contender panicked");
    }
    let all = holds.check(PERMITS);
    assert_eq!(all.len(), CONTENDERS * ACQUISITIONS_EACH);
    let most = holds.most_shared_at_once();
    eprintln!(
        "{} grants in {:?}; at most {most} holders at once",
        all.len(),
        started.elapsed()
    );
    assert!(
        most >= 2,
        "the permits were never shared (at most {most} at once)"
    );
}

const READERS: usize = 8;
const WRITERS: usize = 2;
/// Readers coexist up to all of them; a writer takes every permit.
const RW_PERMITS: u32 = READERS as u32;

/// 8 readers and 2 writers on one key: a writer never overlaps anyone, readers are seen
/// together, and every writer gets in within [`WRITER_BOUND`].
async fn writers_are_alone_and_readers_share((_server, key): Loaded) {
    let holds = Arc::new(Holds::default());
    let released = Arc::new(Notify::new());
    // Readers keep coming until the writers are done, so that without the writer
    // policy a writer would wait for a moment with no reader at all.
    let writers_done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..READERS)
        .map(|r| {
            let req = request(&format!("reader-{r}"), RW_PERMITS, Mode::Shared);
            let reader = Contender {
                fill: 2,
                until: Some(writers_done.clone()),
                ..Contender::new(&key, req, 10, 20..60)
            };
            tokio::spawn(reader.run(holds.clone(), released.clone()))
        })
        .collect();
    // Writers start once readers were seen together: a writer waiting from the start
    // would (rightly) keep the second reader out, and the first round's fill would wait.
    holds.until_shared_by(2).await;
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let req = request(&format!("writer-{w}"), RW_PERMITS, Mode::Exclusive);
            let writer = Contender::new(&key, req, 5, 5..15);
            tokio::spawn(writer.run(holds.clone(), released.clone()))
        })
        .collect();
    let mut writer_results = Vec::new();
    for w in writers {
        writer_results.push(w.await);
    }
    writers_done.store(true, Ordering::SeqCst);
    for r in readers {
        r.await.expect("reader panicked");
    }
    let writer_waits: Vec<Duration> = writer_results
        .into_iter()
        .flat_map(|w| w.expect("writer panicked"))
        .collect();
    let all = holds.check(RW_PERMITS);
    let writes = all.iter().filter(|h| h.mode == Mode::Exclusive).count();
    assert_eq!(writes, WRITERS * 5);
    assert!(all.len() >= READERS * 10 + writes);
    let longest = writer_waits.iter().max().copied().unwrap_or_default();
    let most = holds.most_shared_at_once();
    eprintln!("longest writer wait {longest:?}; at most {most} readers together");
    assert!(most >= 2, "readers were never observed together");
    assert!(
        longest <= WRITER_BOUND,
        "a writer waited {longest:?}, more than the stated {WRITER_BOUND:?}"
    );
}

/// A key of one store for a test that loads it, and the server of its own it lives on
/// (S3 and DynamoDB, when the shared server serializes requests: moto), kept as long
/// as the key.
type Loaded = (Option<Box<dyn support::stores::AwsServer>>, Key);

async fn s3_key() -> Loaded {
    Key::on_own_server_if_serialized(s3_choice_for_load(), Key::s3_on).await
}

async fn dynamodb_key() -> Loaded {
    Key::on_own_server_if_serialized(dynamodb_choice_for_load(), Key::dynamo_on).await
}

async fn lease_key() -> Loaded {
    (None, Key::lease().await)
}

async fn zookeeper_key() -> Loaded {
    (None, Key::zookeeper())
}

/// One `#[tokio::test]` per line: `name: body(key)` runs `body` on the key `key()`
/// makes.
macro_rules! store_tests {
    ($($name:ident: $body:ident($key:ident)),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                $body($key().await).await;
            }
        )+
    };
}

store_tests! {
    never_more_than_three_holders_of_three_permits_on_s3: never_more_holders_than_permits(s3_key),
    never_more_than_three_holders_of_three_permits_on_dynamodb: never_more_holders_than_permits(dynamodb_key),
    never_more_than_three_holders_of_three_permits_on_leases: never_more_holders_than_permits(lease_key),
    never_more_than_three_holders_of_three_permits_on_zookeeper: never_more_holders_than_permits(zookeeper_key),
    writers_are_alone_and_readers_share_on_s3: writers_are_alone_and_readers_share(s3_key),
    writers_are_alone_and_readers_share_on_dynamodb: writers_are_alone_and_readers_share(dynamodb_key),
    writers_are_alone_and_readers_share_on_leases: writers_are_alone_and_readers_share(lease_key),
    writers_are_alone_and_readers_share_on_zookeeper: writers_are_alone_and_readers_share(zookeeper_key),
}

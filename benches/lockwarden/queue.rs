//! Part "queue" (issue 27, docs/design.md §6.4), on S3, DynamoDB and Leases:
//!
//! 1. A drain: after a first drain of 8 (which fills the key's hold times), 30 queued
//!    waiters registered one after the other while the key is held; each holds `HOLD` when granted and releases.
//!    Rows: each waiter's wait per place ahead of it (`wait / (position + 1)`, against
//!    `HOLD`: the rest is the hand-off slack), the hand-off gap (a release returned →
//!    the next grant returned, across contenders as across clusters: each waiter is a
//!    process-independent engine), and |expected − actual start| as a share of the
//!    wait (the estimate read at registration).
//! 2. Renewal with 50 waiters: a holder renews every second for 20 s while 50 waiters
//!    refresh their entries; against the same holder with none, in the same run:
//!    renewal latency, round trips per renewal, lost write races per renewal and the
//!    smallest margin left before the holder deadline after a renewal. With the record's
//!    size in bytes and the writes per second it took (round trips counted by the
//!    store's own counters).

use super::*;
use lockwarden::lock::{Lease, QueueView, Queueing, Stored, Wait, acquire, lost_write_races};

/// How long each grant holds the key in the drain.
const HOLD: Duration = Duration::from_millis(300);
/// Waiters in the drain.
const DRAIN: usize = 30;
/// Waiters beside the renewing holder.
const CROWD: usize = 50;

fn queued(holder: &str) -> AcquireRequest {
    AcquireRequest {
        queue: Some(Queueing::default()),
        ..AcquireRequest::new(holder, Duration::from_secs(30))
    }
}

async fn take(b: &dyn LockBackend, req: &AcquireRequest) -> Lease {
    acquire(b, req, Wait::For(Duration::from_secs(600)))
        .await
        .unwrap_or_else(|e| panic!("{}: {} never granted: {e}", b.url(), req.holder))
}

/// One attempt that registers (or finds the key free: `None`).
async fn register(b: &dyn LockBackend, req: &AcquireRequest) -> Option<u32> {
    loop {
        match b.try_acquire(req).await {
            Ok(Attempt::Busy {
                queue_position: Some(p),
                ..
            }) => return Some(p),
            Ok(Attempt::Busy { .. }) => tokio::time::sleep(Duration::from_millis(20)).await,
            Ok(Attempt::Acquired(_)) => return None,
            Err(e) if e.is_transient() => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("{}: {e}", b.url()),
        }
    }
}

pub(crate) async fn part_queue(env: Arc<Env>, _opts: Opts, report: Shared) {
    for kind in [Kind::S3, Kind::DynamoDb, Kind::Lease] {
        drain(&env, kind, &report).await;
        renewals(&env, kind, &report).await;
    }
}

/// A holder, then `n` waiters registered one after the other while it holds; each
/// holds `HOLD` when granted. Returns what each waiter saw and when the first holder's
/// release returned.
async fn queue_up(
    env: &Arc<Env>,
    kind: Kind,
    key: &str,
    n: usize,
) -> (Vec<Waited>, std::time::Instant) {
    let primer = env.engine(kind, key);
    let first = take(primer.as_ref(), &queued("bench/first")).await;
    let first_held = std::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..n {
        let b = env.engine(kind, key);
        let req = queued(&format!("bench/waiter-{i:02}"));
        let registered = std::time::Instant::now();
        let registered_wall = std::time::SystemTime::now();
        let position = register(b.as_ref(), &req).await.expect("the key is held");
        let expected = match b.inspect().await {
            Ok(Some(Stored { record: Ok(r), .. })) => r
                .set
                .as_ref()
                .and_then(|s| QueueView::of_holder(s, &req.holder, registered_wall))
                .and_then(|v| v.expected_start),
            _ => None,
        };
        tasks.push(tokio::spawn(async move {
            let lease = take(b.as_ref(), &req).await;
            let granted = std::time::Instant::now();
            tokio::time::sleep(HOLD).await;
            b.release(&lease).await.expect("release");
            Waited {
                position,
                registered,
                expected,
                registered_wall,
                granted,
                released: std::time::Instant::now(),
            }
        }));
    }
    // The first holder keeps the key until its hold is over, counted from its grant.
    tokio::time::sleep(HOLD.saturating_sub(first_held.elapsed())).await;
    primer.release(&first).await.expect("release");
    let first_released = std::time::Instant::now();
    let mut waited = Vec::new();
    for t in tasks {
        waited.push(t.await.expect("a waiter"));
    }
    (waited, first_released)
}

struct Waited {
    position: u32,
    registered: std::time::Instant,
    expected: Option<std::time::SystemTime>,
    registered_wall: std::time::SystemTime,
    granted: std::time::Instant,
    released: std::time::Instant,
}

async fn drain(env: &Arc<Env>, kind: Kind, report: &Shared) {
    let key = support::unique("queue-drain");
    // A first drain of 8 fills the key's hold times with real turns (hold and
    // hand-off), as a busy key has them; the estimate is judged on the second.
    let _ = queue_up(env, kind, &key, 8).await;
    let (mut waited, first_released) = queue_up(env, kind, &key, DRAIN).await;
    waited.sort_by_key(|w| w.granted);
    let per_place: Vec<f64> = waited
        .iter()
        .map(|w| ms(w.granted - w.registered) / (w.position + 1) as f64)
        .collect();
    let mut gaps = vec![ms(waited[0].granted - first_released)];
    for pair in waited.windows(2) {
        gaps.push(ms(pair[1]
            .granted
            .saturating_duration_since(pair[0].released)));
    }
    let errors: Vec<f64> = waited
        .iter()
        .filter_map(|w| {
            let expected = w.expected?.duration_since(w.registered_wall).ok()?;
            let actual = w.granted - w.registered;
            Some(100.0 * (ms(expected) - ms(actual)).abs() / ms(actual).max(1.0))
        })
        .collect();
    add_row(
        report,
        "queue",
        kind,
        &format!(
            "drain of {DRAIN}: wait per place ahead (hold {} ms each; the rest is the hand-off slack)",
            HOLD.as_millis()
        ),
        &per_place,
        None,
    );
    add_row(
        report,
        "queue",
        kind,
        "drain: hand-off gap, a release returned → the head's grant returned",
        &gaps,
        None,
    );
    add_row(
        report,
        "queue",
        kind,
        &format!(
            "drain: |expected − actual start| as % of the wait (n = {} estimates)",
            errors.len()
        ),
        &errors,
        None,
    );
}

async fn renewals(env: &Arc<Env>, kind: Kind, report: &Shared) {
    for crowd in [0, CROWD] {
        let key = support::unique("queue-renew");
        let holder_backend = env.engine(kind, &key);
        let mut lease = take(holder_backend.as_ref(), &queued("bench/holder")).await;
        let mut waiters = Vec::new();
        for i in 0..crowd {
            let b = env.engine(kind, &key);
            let req = queued(&format!("bench/crowd-{i:02}"));
            register(b.as_ref(), &req).await;
            // Each keeps refreshing its entry as a waiting contender does.
            waiters.push(tokio::spawn(async move {
                loop {
                    let pause = match b.try_acquire(&req).await {
                        Ok(Attempt::Busy { retry_in, .. }) => {
                            retry_in.unwrap_or(Duration::from_millis(100))
                        }
                        Ok(Attempt::Acquired(l)) => {
                            let _ = b.release(&l).await;
                            return;
                        }
                        Err(_) => Duration::from_millis(100),
                    };
                    tokio::time::sleep(pause).await;
                }
            }));
        }
        let size = match holder_backend.inspect().await {
            Ok(Some(Stored { record: Ok(r), .. })) => r.set.map(|s| s.to_json().len()),
            _ => None,
        };
        let (mut latency, mut margins) = (Vec::new(), Vec::new());
        let (rt0, races0) = (env.round_trips(kind).await, lost_write_races());
        let began = std::time::Instant::now();
        let mut renew_trips = 0.0;
        let renewals = 20;
        for _ in 0..renewals {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let c = env.round_trips(kind).await;
            let t = std::time::Instant::now();
            holder_backend.renew(&mut lease).await.expect("renew");
            latency.push(ms(t.elapsed()));
            renew_trips += env.round_trips(kind).await - c;
            margins.push(ms(lease.deadline.remaining()));
        }
        let seconds = began.elapsed().as_secs_f64();
        let (rt1, races1) = (env.round_trips(kind).await, lost_write_races());
        let what = format!(
            "renew with {crowd} waiters refreshing: round trips per renewal {:.2}, lost races \
             (all writers) {:.1}/s, smallest deadline margin {:.0} ms, record {} bytes, {:.1} \
             requests/s on the key",
            renew_trips / renewals as f64,
            (races1 - races0) as f64 / seconds,
            margins.iter().cloned().fold(f64::INFINITY, f64::min),
            size.map_or("-".to_string(), |s| s.to_string()),
            (rt1 - rt0) / seconds,
        );
        add_row(
            report,
            "queue",
            kind,
            &what,
            &latency,
            Some(renew_trips / renewals as f64),
        );
        for w in waiters {
            w.abort();
        }
        holder_backend.release(&lease).await.expect("release");
    }
}

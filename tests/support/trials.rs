//! What the stop-before-next trials on the node share (tests/node stop.rs and guard.rs,
//! tests/kueue loss.rs): the register the writers write to, a contender that writes
//! there the moment it acquires (straight to the store, never through a fault proxy),
//! how trials of several scales run, and the margins' summary. Their durations are
//! `super::timescale`'s.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockwarden::lock::{AcquireRequest, Attempt, Lease, LockBackend, LockState};
use tokio::io::AsyncWriteExt;
use tokio::task::JoinHandle;

use super::timescale::{self, CONTENDER_POLL, LAST_WRITE_IN_FLIGHT, SAMPLE_EVERY, Scale};

pub use super::register::{Register, monotonic_now};

/// A backend on `s3://bucket/key` straight to the shared moto, never through a proxy:
/// the contender's, and the record sampler's.
pub async fn direct_s3_backend(bucket: &str, key: &str) -> Arc<dyn LockBackend> {
    use lockwarden::backend::{AwsOptions, ConnectOptions, Credentials, S3Options, Target};
    let moto = super::moto::Moto::shared();
    let options = ConnectOptions {
        aws: AwsOptions {
            endpoint: Some(moto.endpoint()),
            region: Some(super::moto::REGION.into()),
            credentials: Some(Credentials::new(
                super::moto::ACCESS_KEY_ID,
                super::moto::SECRET_ACCESS_KEY,
                None,
            )),
            ..AwsOptions::default()
        },
        s3: S3Options {
            force_path_style: Some(true),
            ..S3Options::default()
        },
        ..ConnectOptions::default()
    };
    let target = Target::parse(&format!("s3://{bucket}/{key}")).unwrap();
    target.connect(&options).await.expect("an S3 backend")
}

/// The contender: tries `backend` every [`CONTENDER_POLL`] (or sooner when told) and writes
/// `contender 1` to the register on `port` the moment it acquires; the task ends with
/// the backend and its lease, to release.
pub async fn contend(
    backend: Arc<dyn LockBackend>,
    port: u16,
    lease: Duration,
) -> JoinHandle<(Arc<dyn LockBackend>, Lease)> {
    let mut line = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to the register");
    tokio::spawn(async move {
        let request = AcquireRequest::new("contender", lease);
        loop {
            match backend.try_acquire(&request).await {
                Ok(Attempt::Acquired(lease)) => {
                    line.write_all(b"contender 1\n").await.unwrap();
                    line.flush().await.unwrap();
                    return (backend, lease);
                }
                Ok(Attempt::Busy { retry_in, .. }) => {
                    let pause = retry_in.unwrap_or(CONTENDER_POLL);
                    tokio::time::sleep(pause.min(CONTENDER_POLL)).await;
                }
                Err(e) => {
                    eprintln!("trial: contender attempt failed: {e}");
                    tokio::time::sleep(CONTENDER_POLL).await;
                }
            }
        }
    })
}

/// Once the workload can write no more: its last arrival and the contender's first, the
/// moment a last write in flight takes to arrive later; and the store's record, as
/// `sampler` read it, held by the workload's one acquisition until that last write.
pub async fn last_and_first(
    register: &Register,
    sampler: RecordSampler,
    whose: &str,
) -> (f64, f64) {
    tokio::time::sleep(LAST_WRITE_IN_FLIGHT).await;
    let last = *register
        .of("job")
        .last()
        .expect("the workload wrote to the register");
    let first = register.of("contender")[0];
    RecordSampler::assert_held_until(&sampler.stop(), last, whose);
    (last, first)
}

/// Runs `trial(n, scale)` for each of `scales` (`timescale::trials`) and returns what
/// each returned, in order: side by side in the suite (each trial has its own key,
/// register and workload, and measures its own margin), one after another in the long
/// runs (`LOCKWARDEN_NODE_TRIALS`), which repeat the full-scale trial many times.
pub async fn run_trials<T, F, Fut>(scales: Vec<Scale>, trial: F) -> Vec<T>
where
    F: Fn(usize, Scale) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    if timescale::long_run().is_some() {
        let mut done = Vec::new();
        for (n, scale) in scales.into_iter().enumerate() {
            done.push(trial(n, scale).await);
        }
        done
    } else {
        futures::future::join_all(
            scales
                .into_iter()
                .enumerate()
                .map(|(n, scale)| trial(n, scale)),
        )
        .await
    }
}

/// Asserts that the controller gave `lock` (a workload's own lock) the lock-delay its
/// Pods' grace needs at `scale` (rule 8, §6.3), the one the trial's timing rests on.
pub fn assert_lock_delay(lock: &lockwarden::api::DistributedLock, scale: Scale) {
    let delay = lock
        .spec
        .lock_delay
        .as_deref()
        .map(|d| lockwarden::duration::parse_duration(d).expect("a lockDelay"));
    assert_eq!(
        delay,
        Some(scale.lock_delay()),
        "the workload's own lock has lockDelay {:?}, not the {:?} its grace of {} s needs",
        lock.spec.lock_delay,
        scale.lock_delay(),
        scale.grace_seconds()
    );
}

/// Reads a lock's record in its store every [`SAMPLE_EVERY`] on its own task, for a test to
/// check who the store said held the key, and when (CLOCK_MONOTONIC, the register's
/// clock: a sample's time is its read's *send* time, so a sample showing the workload's
/// holder proves the record was still its at that instant or later).
pub struct RecordSampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    task: JoinHandle<()>,
}

/// One read of the record.
#[derive(Clone, Debug)]
pub struct Sample {
    pub at: f64,
    /// The holder and its fence, `None` when the record is absent, released or
    /// unreadable as ours (the fence tells a new acquisition by the same holder apart).
    pub holder: Option<(String, u64)>,
}

impl RecordSampler {
    pub fn start(backend: Arc<dyn LockBackend>) -> RecordSampler {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let sink = samples.clone();
        let task = tokio::spawn(async move {
            loop {
                let at = monotonic_now();
                match backend.inspect().await {
                    Ok(stored) => {
                        let holder = stored
                            .and_then(|s| s.record.ok())
                            .filter(|r| r.state == LockState::Held)
                            .map(|r| (r.holder, r.fence.0));
                        sink.lock().unwrap().push(Sample { at, holder });
                    }
                    Err(e) => eprintln!("trial: sampler read failed: {e}"),
                }
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
        });
        RecordSampler { samples, task }
    }

    /// Stops sampling; the samples taken.
    pub fn stop(self) -> Vec<Sample> {
        self.task.abort();
        self.samples.lock().unwrap().clone()
    }

    /// Asserts that every read sent before `until` found the record held by one and the
    /// same acquisition (the workload's: the first read's holder and fence), never free,
    /// re-acquired nor the contender's — the store never let the key go while the
    /// workload still wrote.
    pub fn assert_held_until(samples: &[Sample], until: f64, whose: &str) {
        let before: Vec<&Sample> = samples.iter().filter(|s| s.at < until).collect();
        assert!(
            !before.is_empty(),
            "no read of the record before {whose} last write"
        );
        let first = before[0].holder.clone();
        assert!(
            first.is_some(),
            "the record was not held at the first read: {before:?}"
        );
        if let Some(other) = before.iter().find(|s| s.holder != first) {
            panic!(
                "the store showed {:?} at {:.3}, before {whose} last write at {until:.3} \
                 (the record was let go, or taken, while the work ran); first holder {first:?}",
                other.holder, other.at
            );
        }
        println!(
            "trial: {} reads of the record before {whose} last write, every one held by {:?}",
            before.len(),
            first
        );
    }
}

/// Prints the margins' min and median under `name`, and asserts each is positive (the
/// workload's last write arrived before the contender's first).
pub fn report_margins(name: &str, margins: &[f64]) {
    let mut sorted = margins.to_vec();
    sorted.sort_by(f64::total_cmp);
    println!(
        "{name}: {} trial(s): margin min {:+.3} s, median {:+.3} s",
        margins.len(),
        sorted[0],
        sorted[sorted.len() / 2]
    );
    assert!(
        margins.iter().all(|m| *m > 0.0),
        "{name}: the workload wrote after the contender's first write (margins in seconds: \
         {margins:?})"
    );
}

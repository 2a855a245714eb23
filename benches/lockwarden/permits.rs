//! Part 5, permits (issue 16): acquire, renew and release of one permit on a key that
//! 1, 10 or 100 holders share, per backend. The other holders renew in the background
//! (every 10 s, as a 30 s lease does), so the figures include the write races a busy
//! holder set causes: round trips are counted (as in part 2) and the conditional
//! writes that lost a race are counted by the engine (`lock::lost_write_races`).

use super::*;
use lockwarden::lock::{HeldLock, Mode, Permits, Wait, lost_write_races};

/// Every key here has room for the largest holder count and one more.
const PERMITS: u32 = 101;

fn permit_req(holder: &str) -> AcquireRequest {
    AcquireRequest {
        permits: Permits {
            total: PERMITS,
            mode: Mode::Shared,
        },
        ..engine::req(holder)
    }
}

async fn permit_now(b: &dyn LockBackend, holder: &str) -> lockwarden::lock::Lease {
    for _ in 0..200 {
        match b.try_acquire(&permit_req(holder)).await {
            Ok(Attempt::Acquired(l)) => return l,
            Ok(Attempt::Busy { .. }) => tokio::time::sleep(Duration::from_millis(5)).await,
            Err(e) if e.is_transient() => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("{}: {e}", b.url()),
        }
    }
    panic!("{}: no permit", b.url())
}

pub(crate) async fn part_permits(env: Arc<Env>, opts: Opts, report: Shared) {
    let n = opts.n(40);
    for kind in KINDS {
        for holders in [1usize, 10, 100] {
            let key = support::unique("permits");
            let mut others = Vec::new();
            for i in 1..holders {
                let req = permit_req(&format!("bench/other-{i}"));
                let held = HeldLock::acquire(env.engine(kind, &key), &req, Wait::No)
                    .await
                    .unwrap_or_else(|e| panic!("{}: holder {i} of {holders}: {e}", kind.name()));
                others.push(held);
            }
            let (mut acquire, mut renew, mut release) = (vec![], vec![], vec![]);
            let races_before = lost_write_races();
            for _ in 0..n {
                let b = env.engine(kind, &key);
                let t = Instant::now();
                let mut lease = permit_now(b.as_ref(), "bench/permit").await;
                acquire.push(ms(t.elapsed()));
                let t = Instant::now();
                b.renew(&mut lease).await.expect("renew");
                renew.push(ms(t.elapsed()));
                let t = Instant::now();
                b.release(&lease).await.expect("release");
                release.push(ms(t.elapsed()));
            }
            let races = (lost_write_races() - races_before) as f64 / (3 * n) as f64;
            let rounds = 5;
            let (mut rt_acquire, mut rt_renew, mut rt_release) = (0.0, 0.0, 0.0);
            for _ in 0..rounds {
                let b = env.engine(kind, &key);
                let c0 = env.round_trips(kind).await;
                let mut lease = permit_now(b.as_ref(), "bench/permit").await;
                let c1 = env.round_trips(kind).await;
                b.renew(&mut lease).await.expect("renew");
                let c2 = env.round_trips(kind).await;
                b.release(&lease).await.expect("release");
                let c3 = env.round_trips(kind).await;
                rt_acquire += c1 - c0;
                rt_renew += c2 - c1;
                rt_release += c3 - c2;
            }
            let per = |x: f64| Some(x / rounds as f64);
            let what = |op: &str| {
                format!(
                    "{op} one permit, {holders} holder(s) on the key; lost write races per op {races:.2}"
                )
            };
            add_row(
                &report,
                "permits",
                kind,
                &what("acquire"),
                &acquire,
                per(rt_acquire),
            );
            add_row(
                &report,
                "permits",
                kind,
                &what("renew"),
                &renew,
                per(rt_renew),
            );
            add_row(
                &report,
                "permits",
                kind,
                &what("release"),
                &release,
                per(rt_release),
            );
            for held in others {
                let _ = held.release().await;
            }
        }
    }
}

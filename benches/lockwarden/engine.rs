//! Part 2, engine: cold/warm acquire, renew and release per backend, round trips per
//! operation, acquire+release throughput on many keys.

use super::*;

// ---------------------------------------------------------------------------------
// Part 2: engine

pub(crate) fn req(holder: &str) -> AcquireRequest {
    AcquireRequest::new(holder, Duration::from_secs(30))
}

pub(crate) async fn acquire_now(b: &dyn LockBackend, holder: &str) -> lockwarden::lock::Lease {
    for _ in 0..50 {
        match b.try_acquire(&req(holder)).await {
            Ok(Attempt::Acquired(l)) => return l,
            Ok(Attempt::Busy { holder, .. }) => {
                panic!("{} busy, held by {}", b.url(), holder.holder)
            }
            Err(e) if e.is_transient() => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("{}: {e}", b.url()),
        }
    }
    panic!("{}: kept failing", b.url())
}

pub(crate) async fn part_engine(env: Arc<Env>, opts: Opts, report: Shared) {
    let n = opts.n(100);
    let secs = if opts.quick { 3.0 } else { 6.0 };
    for kind in KINDS {
        let key = support::unique("eng");
        // Latency: each round a new contender (cold: it knows nothing of the key),
        // then the same contender again (warm: its release left the version cached).
        let (mut cold, mut warm, mut renew, mut release) = (vec![], vec![], vec![], vec![]);
        for i in 0..n + 3 {
            let b = env.engine(kind, &key);
            let t = Instant::now();
            let mut lease = acquire_now(b.as_ref(), "bench/engine").await;
            let c = ms(t.elapsed());
            let t = Instant::now();
            b.renew(&mut lease).await.expect("renew");
            let r1 = ms(t.elapsed());
            let t = Instant::now();
            b.release(&lease).await.expect("release");
            let l1 = ms(t.elapsed());
            let t = Instant::now();
            let mut lease = acquire_now(b.as_ref(), "bench/engine").await;
            let w = ms(t.elapsed());
            let t = Instant::now();
            b.renew(&mut lease).await.expect("renew");
            let r2 = ms(t.elapsed());
            let t = Instant::now();
            b.release(&lease).await.expect("release");
            let l2 = ms(t.elapsed());
            if i >= 3 {
                cold.push(c);
                warm.push(w);
                renew.extend([r1, r2]);
                release.extend([l1, l2]);
            }
        }
        // Round trips: a separate pass with a counter read around every operation
        // (reading kube-apiserver's /metrics is too slow to do inside the timed loop).
        let rounds = 5;
        let (mut rt_cold, mut rt_warm, mut rt_renew, mut rt_release) = (0.0, 0.0, 0.0, 0.0);
        for _ in 0..rounds {
            let b = env.engine(kind, &key);
            let c0 = env.round_trips(kind).await;
            let mut lease = acquire_now(b.as_ref(), "bench/engine").await;
            let c1 = env.round_trips(kind).await;
            b.renew(&mut lease).await.expect("renew");
            let c2 = env.round_trips(kind).await;
            b.release(&lease).await.expect("release");
            let c3 = env.round_trips(kind).await;
            let lease = acquire_now(b.as_ref(), "bench/engine").await;
            let c4 = env.round_trips(kind).await;
            b.release(&lease).await.expect("release");
            rt_cold += c1 - c0;
            rt_renew += c2 - c1;
            rt_release += c3 - c2;
            rt_warm += c4 - c3;
        }
        let per = |x: f64| Some(x / rounds as f64);
        add_row(
            &report,
            "engine",
            kind,
            "acquire, cold",
            &cold,
            per(rt_cold),
        );
        add_row(
            &report,
            "engine",
            kind,
            "acquire, warm",
            &warm,
            per(rt_warm),
        );
        add_row(&report, "engine", kind, "renew", &renew, per(rt_renew));
        add_row(
            &report,
            "engine",
            kind,
            "release",
            &release,
            per(rt_release),
        );

        // Throughput: WRITERS tasks, each cycling acquire+release over its own keys.
        let keys_per_writer = 16;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cycles = Arc::new(AtomicU64::new(0));
        let ready = Arc::new(tokio::sync::Barrier::new(WRITERS + 1));
        let mut tasks = Vec::new();
        for w in 0..WRITERS {
            let (env, stop, cycles, ready) =
                (env.clone(), stop.clone(), cycles.clone(), ready.clone());
            tasks.push(tokio::spawn(async move {
                let prefix = support::unique(&format!("tp{w}"));
                let backends: Vec<_> = (0..keys_per_writer)
                    .map(|k| env.engine(kind, &format!("{prefix}-{k}")))
                    .collect();
                // One untimed round so every key exists and every contender is warm.
                for b in &backends {
                    let l = acquire_now(b.as_ref(), "bench/tp").await;
                    b.release(&l).await.expect("release");
                }
                ready.wait().await;
                'outer: loop {
                    for b in &backends {
                        if stop.load(Ordering::Relaxed) {
                            break 'outer;
                        }
                        let l = acquire_now(b.as_ref(), "bench/tp").await;
                        b.release(&l).await.expect("release");
                        cycles.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        ready.wait().await;
        let began = Instant::now();
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        stop.store(true, Ordering::Relaxed);
        let counted = cycles.load(Ordering::Relaxed);
        let elapsed_at_stop = began.elapsed().as_secs_f64();
        for t in tasks {
            t.await.unwrap();
        }
        let engine_ops = 2.0 * counted as f64 / elapsed_at_stop;
        let raw = report
            .lock()
            .unwrap()
            .floors
            .get(&kind)
            .map(|f| f.ops_per_s);
        let raw = match raw {
            Some(r) => r,
            None => raw_throughput(&env, kind, WRITERS, secs).await,
        };
        let store_ops = store_throughput(&env, kind, keys_per_writer, secs).await;
        if let Some(samples) = store_write_latency(&env, kind, opts.n(200)).await {
            report
                .lock()
                .unwrap()
                .store_write_p50
                .insert(kind, pct(&samples, 0.5));
        }
        eprintln!(
            "[bench] engine {} throughput: {engine_ops:.0} writes/s (acquire+release) vs raw {raw:.0}/s, store layer {store_ops:?}",
            kind.name()
        );
        let mut r = report.lock().unwrap();
        r.throughput.push((kind, engine_ops, raw, WRITERS));
        if let Some(ops) = store_ops {
            r.store_throughput.insert(kind, ops);
        }
    }
}

/// The engine's acquire+release writes sent through the store layer alone (no
/// protocol: no reads, no observation, no deadlines), with the same writers and keys:
/// what separates the engine's throughput from the raw write's is then either the
/// engine (engine < store layer) or the request lockwarden's record needs (store layer
/// < raw). `None` for ZooKeeper, which has no single-record store layer.
async fn store_throughput(env: &Arc<Env>, kind: Kind, keys: usize, secs: f64) -> Option<f64> {
    env.store(kind, "probe")?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(tokio::sync::Barrier::new(WRITERS + 1));
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let (env, stop, writes, ready) = (env.clone(), stop.clone(), writes.clone(), ready.clone());
        tasks.push(tokio::spawn(async move {
            let prefix = support::unique(&format!("st{w}"));
            let lease = Duration::from_secs(30);
            let mut chains = Vec::new();
            for k in 0..keys {
                let store = env.store(kind, &format!("{prefix}-{k}")).expect("store");
                let first = LockRecord::new_acquisition("bench/st", FenceToken(1), lease, None);
                let version = store.create(&first.released()).await.expect("create");
                chains.push((store, version));
            }
            ready.wait().await;
            let mut fence = 2;
            'outer: loop {
                for (store, version) in &mut chains {
                    if stop.load(Ordering::Relaxed) {
                        break 'outer;
                    }
                    let held =
                        LockRecord::new_acquisition("bench/st", FenceToken(fence), lease, None);
                    *version = store.replace(version, &held).await.expect("acquire write");
                    *version = store
                        .replace(version, &held.released())
                        .await
                        .expect("release write");
                    writes.fetch_add(2, Ordering::Relaxed);
                }
                fence += 1;
            }
        }));
    }
    ready.wait().await;
    let began = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let ops = writes.load(Ordering::Relaxed) as f64 / began.elapsed().as_secs_f64();
    for t in tasks {
        t.await.unwrap();
    }
    Some(ops)
}

/// One of lockwarden's own record writes through the store layer alone (the request a
/// renewal or release sends, without the engine), chained on one key: how far the
/// store's request for lockwarden's record is from the floor's minimal write.
async fn store_write_latency(env: &Arc<Env>, kind: Kind, n: usize) -> Option<Vec<f64>> {
    let store = env.store(kind, &support::unique("stl"))?;
    let lease = Duration::from_secs(30);
    let record = |fence| LockRecord::new_acquisition("bench/stl", FenceToken(fence), lease, None);
    let mut version = store.create(&record(1)).await.expect("create");
    let mut samples = Vec::with_capacity(n);
    for i in 0..n + 5 {
        let next = record(2 + i as u64);
        let t = Instant::now();
        version = store.replace(&version, &next).await.expect("store write");
        if i >= 5 {
            samples.push(ms(t.elapsed()));
        }
    }
    Some(samples)
}

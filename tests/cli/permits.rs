//! `--permits N` and `--shared` (docs/design.md §6.2), on S3, a Lease and ZooKeeper:
//! two `lock --permits 2` succeed, a third is refused as held; `status` lists both holders with their fences; a lock
//! with other permits is refused naming both numbers; `unlock` frees one permit.

use super::*;

/// The holders `status -o json` lists, as (holder, fence, mode).
fn listed(status: &Value) -> Vec<(String, u64, String)> {
    status["holders"]
        .as_array()
        .unwrap_or_else(|| panic!("no holders in {status}"))
        .iter()
        .map(|h| {
            (
                h["holder"].as_str().unwrap().to_string(),
                fence(h),
                h["mode"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

async fn two_permits(backend: Backend) {
    let (cli, url) = fresh_lock(backend, "cli-permits", "loads").await;
    let (lw, url) = (&cli, url.as_str());
    // Two holders of the key's two permits.
    let mut taken = Vec::new();
    for (name, holder) in [("a.lock", "loader-a"), ("b.lock", "loader-b")] {
        let out = lw
            .run(&[
                "lock",
                url,
                "--permits",
                "2",
                "-o",
                name,
                "--holder",
                holder,
            ])
            .await;
        out.ok();
        taken.push((holder.to_string(), fence(&lw.read_json(name))));
    }
    assert!(taken[1].1 > taken[0].1, "one fence per grant: {taken:?}");

    // A third is refused as held (exit 3), and writes no file.
    let out = lw
        .run(&["lock", url, "--permits", "2", "-o", "c.lock"])
        .await;
    out.code(3).one_line_error(&[url, "lock already held"]);
    assert!(!lw.path("c.lock").exists());

    // status lists both, with their fences, and says how many permits are in use.
    let status = lw.status(url).await;
    assert_eq!(status["state"], "held", "{status}");
    assert_eq!(
        (status["permits"].as_u64(), status["permitsInUse"].as_u64()),
        (Some(2), Some(2))
    );
    let shared = |(h, f): &(String, u64)| (h.clone(), *f, "shared".to_string());
    assert_eq!(
        listed(&status),
        taken.iter().map(shared).collect::<Vec<_>>()
    );
    let table = lw.run(&["status", url]).await;
    table.ok();
    println!("lockwarden status {url}:\n{}", table.stdout);
    assert!(
        table.stdout.contains("2 of 2 permits in use, 2 holders"),
        "{table:#?}"
    );
    for (holder, fence) in &taken {
        assert!(
            table
                .stdout
                .lines()
                .any(|l| l.starts_with(holder.as_str()) && l.contains(&format!(" {fence} "))),
            "{holder} (fence {fence}) not listed: {table:#?}"
        );
    }
    let asked_three = lw.run(&["status", url, "--permits", "3"]).await;
    asked_three.ok();
    assert!(
        asked_three.stdout.contains("the key has 2 permits"),
        "{asked_three:#?}"
    );

    // Other permits, or a plain mutex, on this key: refused, naming both numbers.
    for (flags, asked) in [(&["--permits", "3"][..], 3), (&[][..], 1)] {
        let mut args = vec!["lock", url, "-o", "other.lock"];
        args.extend_from_slice(flags);
        let out = lw.run(&args).await;
        out.code(1).one_line_error(&[
            url,
            &format!("held with 2 permits but this lock asks for {asked}"),
        ]);
    }
    // A shared lock needs two permits: a usage error before any store is asked.
    let out = lw.run(&["lock", url, "--shared", "-o", "other.lock"]).await;
    out.code(2)
        .one_line_error(&["--shared", "shared mode needs permits of 2 or more"]);

    // unlock frees one permit: `run` takes it (and gets its own fence) while b holds.
    lw.unlock("a.lock").await;
    let out = lw
        .run(&[
            "run",
            url,
            "--permits",
            "2",
            "--",
            "sh",
            "-c",
            "echo fence=$LOCKWARDEN_FENCE",
        ])
        .await;
    out.ok();
    let ran: u64 = out
        .stdout
        .trim()
        .strip_prefix("fence=")
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("no fence printed: {out:#?}"));
    assert!(ran > taken[1].1, "fence {ran} after {taken:?}");
    let status = lw.status(url).await;
    assert_eq!(
        listed(&status),
        vec![shared(&taken[1])],
        "run released its permit"
    );
    lw.unlock("b.lock").await;
    // Nobody holds it: a released set (no permit in use) or, on ZooKeeper, no entry.
    let status = lw.status(url).await;
    assert_ne!(status["state"], "held", "{status}");
    assert_eq!(status["permitsInUse"].as_u64().unwrap_or(0), 0, "{status}");
    assert!(status.get("holders").is_none(), "{status}");
}

/// On ZooKeeper `lock` leaves a keeper per permit (it is started with the same flags).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_permits_two_holders_a_third_is_held_on_s3_kubernetes_and_zookeeper() {
    const STORES: [Backend; 3] = [Backend::S3, Backend::Kubernetes, Backend::ZooKeeper];
    on_each(&STORES, two_permits).await;
}

/// A `lockwarden run` holding a permit is SIGKILLed with its command (no release): a
/// waiter takes that permit only once the dead holder's lease has elapsed since its last
/// renewal (rule 1 per entry, on the waiter's clock), and the other holder keeps its own.
///
/// The times compared are wall-clock times from the store, on one machine, at second
/// resolution: the dead entry's last `renewedAt` (written before its last renewal was
/// sent) and the waiter's `acquiredAt` (taken before its grant was sent). With a 6 s
/// lease a correct waiter shows at least 6.25 s between them, so at least 5 s after
/// truncation; one that took the permit at the kill would show at most the renewal
/// interval (2 s) plus a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_run_s_permit_is_taken_only_after_its_lease() {
    const LEASE_S: u64 = 6;
    let bucket = Moto::shared().new_bucket("cli-permit-kill").await;
    let lw = Cli::aws();
    let url = format!("s3://{bucket}/loads");
    let lease = format!("{LEASE_S}s");
    lw.run(&[
        "lock",
        &url,
        "--permits",
        "2",
        "--lease",
        "5m",
        "-o",
        "b.lock",
        "--holder",
        "b",
    ])
    .await
    .ok();
    let mut cmd = lw.command(&[
        "run",
        &url,
        "--permits",
        "2",
        "--lease",
        &lease,
        "--holder",
        "doomed",
        "--",
        "sh",
        "-c",
        "echo started > started.txt; sleep 600",
    ]);
    cmd.process_group(0);
    let runner = cmd.spawn().expect("spawn run");
    let started = lw.path("started.txt");
    eventually("the command under `run` to start", || async {
        started.exists().then_some(())
    })
    .await;
    // Let it renew a few times, then kill `run` and its command together.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let pid = runner.id().expect("run's pid") as i32;
    // SAFETY: kill(2) on the process group of a child of this test.
    assert_eq!(unsafe { libc::kill(-pid, libc::SIGKILL) }, 0);
    drop(runner);

    // The dead holder's entry as it stays: its last renewal.
    let status = lw.status(&url).await;
    let entry = |status: &Value, who: &str| {
        status["holders"]
            .as_array()
            .and_then(|hs| hs.iter().find(|h| h["holder"] == who).cloned())
    };
    let dead = entry(&status, "doomed").unwrap_or_else(|| panic!("no doomed entry: {status}"));
    let last_renewed = dead["renewedAt"]
        .as_str()
        .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
        .unwrap_or_else(|| panic!("no renewedAt: {dead}"));

    let out = lw
        .run(&[
            "lock",
            &url,
            "--permits",
            "2",
            "--wait",
            "90s",
            "--lease",
            "30s",
            "-o",
            "c.lock",
            "--holder",
            "c",
        ])
        .await;
    out.ok();
    let acquired = humantime::parse_rfc3339_weak(
        lw.read_json("c.lock")["acquiredAt"]
            .as_str()
            .expect("acquiredAt"),
    )
    .expect("an RFC 3339 time");
    let waited = acquired
        .duration_since(last_renewed)
        .unwrap_or_default()
        .as_secs();
    println!("the waiter's grant came {waited} s (truncated) after the dead holder's last renewal");
    assert!(
        waited >= LEASE_S - 1,
        "the permit was taken {waited} s after the dead holder's last renewal; its lease is {LEASE_S} s"
    );
    let status = lw.status(&url).await;
    assert!(entry(&status, "doomed").is_none(), "{status}");
    assert!(
        entry(&status, "b").is_some(),
        "the other holder lost its permit: {status}"
    );
    assert!(entry(&status, "c").is_some(), "{status}");
    lw.unlock("c.lock").await;
    lw.unlock("b.lock").await;
}

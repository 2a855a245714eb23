//! `--lock-delay` (docs/design.md rule 8) on the stores that carry it in the lease
//! every contender reads: after an expiry a contender waits the lease, the delay and
//! the grace of its own observation; after a clean release it takes the key at once.

use super::*;

const LEASE: &str = "2s";
const DELAY: &str = "2500ms";
/// What the record carries: lease + delay (a Lease's `leaseDurationSeconds` rounds it
/// up to 5).
const STORED: Duration = Duration::from_millis(4_500);
/// The contenders' grace beyond the stored lease (rule 1's default).
const GRACE: Duration = Duration::from_millis(250);

/// `lockwarden lock URL` as HOLDER with the tests' lease and lock-delay, its lock file
/// OUT; whether it acquired is for the caller's next read to show.
async fn lock_with_delay(lw: &Cli, url: &str, out: &str, holder: &str) {
    lw.run(&[
        "lock",
        url,
        "-o",
        out,
        "--holder",
        holder,
        "--lease",
        LEASE,
        "--lock-delay",
        DELAY,
    ])
    .await
    .ok();
}

/// A holder that never renews (`lock` exits, as a crashed holder would), then a
/// contender that waits; then a clean release taken without waiting.
async fn expiry_waits_the_delay_and_a_release_does_not(lw: &Cli, url: &str) -> Duration {
    lock_with_delay(lw, url, "a.lock", "a").await;
    let status = lw.status(url).await;
    assert_eq!(status["leaseMs"], STORED.as_millis() as u64, "{status}");
    assert!(
        status["noTakeoverBefore"].is_string(),
        "status says from when a takeover is possible: {status}"
    );

    // The contender's observation starts with its first read, after `began`: it may
    // take over only once the stored lease and the grace have passed on its clock.
    let began = Instant::now();
    lw.run(&["lock", url, "-o", "b.lock", "--holder", "b", "--wait", "60"])
        .await
        .ok();
    let waited = began.elapsed();
    assert!(
        waited >= STORED + GRACE,
        "took over after {waited:?}: rule 8 needs lease + delay + grace = {:?}",
        STORED + GRACE
    );
    assert_eq!(lw.status(url).await["holder"], "b");
    lw.unlock("b.lock").await;

    // A clean release writes a tombstone: the next holder takes it without waiting.
    lock_with_delay(lw, url, "c.lock", "c").await;
    lw.unlock("c.lock").await;
    lw.run(&["lock", url, "-o", "d.lock", "--holder", "d", "--wait", "0"])
        .await
        .ok();
    lw.unlock("d.lock").await;
    println!("{url}: takeover after an expiry waited {waited:?} (lease 2s + delay 2.5s + grace)");
    waited
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule8_s3_a_takeover_after_an_expiry_waits_the_lock_delay_and_a_release_does_not() {
    let (lw, url) = fresh_lock(Backend::S3, "cli-lock-delay", "delayed").await;
    expiry_waits_the_delay_and_a_release_does_not(&lw, &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule8_dynamodb_a_takeover_after_an_expiry_waits_the_lock_delay_and_a_release_does_not() {
    let (lw, url) = fresh_lock(Backend::DynamoDb, "cli-lock-delay", "delayed").await;
    expiry_waits_the_delay_and_a_release_does_not(&lw, &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule8_kubernetes_a_takeover_after_an_expiry_waits_the_lock_delay_and_a_release_does_not() {
    let (lw, url) = fresh_lock(Backend::Kubernetes, "cli-lock-delay", "delayed").await;
    lock_with_delay(&lw, &url, "a.lock", "a").await;
    // What client-go reads: whole seconds, rounded up.
    let namespace = url["k8s://".len()..].split('/').next().unwrap();
    let client = ControlPlane::shared().client().await;
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client, namespace);
    let lease = leases.get("delayed").await.expect("the Lease");
    assert_eq!(
        lease.spec.and_then(|s| s.lease_duration_seconds),
        Some(5),
        "leaseDurationSeconds carries lease + delay, rounded up"
    );
    lw.run(&["unlock", "a.lock"]).await.ok();
    expiry_waits_the_delay_and_a_release_does_not(&lw, &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule8_run_holds_on_its_lease_and_stores_the_delay() {
    let bucket = Moto::shared().new_bucket("cli-run-lock-delay").await;
    let lw = Cli::aws();
    let url = format!("s3://{bucket}/run");
    let run = ["run", url.as_str(), "--lease", "3s", "--lock-delay", "5s"];
    // The --grace bound is the holder's lease's (3s leaves 440ms), not the stored 8s's.
    lw.run(&[&run[..], &["--grace", "1s", "--", "true"]].concat())
        .await
        .code(2)
        .one_line_error(&["--grace 1s", "3s lease", "at most 440ms"]);
    let status = "lockwarden_status=$(\"$0\" status \"$LOCKWARDEN_URL\" -o json) && echo \"$lockwarden_status\" > status.json";
    let out = lw
        .run(&[&run[..], &["--", "sh", "-c", status, bin()]].concat())
        .await;
    out.ok();
    let status = lw.read_json("status.json");
    assert_eq!(status["leaseMs"], 8_000, "{status}");
    // Released when COMMAND ended: the next holder need not wait.
    lw.run(&["lock", &url, "-o", "next.lock", "--wait", "0"])
        .await
        .ok();
    lw.unlock("next.lock").await;
}

/// The previous release reads the stored lease (`leaseMs`, `leaseDuration`) and waits
/// it out by its own rule 1: the delay reaches it without it knowing of one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule8_the_previous_release_waits_out_the_lock_delay() {
    let bucket = Moto::shared().new_bucket("cli-lock-delay-prev").await;
    let table = Moto::shared().new_table("cli-lock-delay-prev", "key").await;
    let lw = Cli::aws();
    let previous = Cli::aws().previous_release();
    for (store, url) in [
        ("s3", format!("s3://{bucket}/delayed")),
        ("dynamodb", format!("dynamodb://{table}/delayed")),
    ] {
        // The expired holder's lock file stays behind, as a crashed holder's would.
        let file = format!("{store}.lock");
        lock_with_delay(&lw, &url, &file, "a").await;
        let began = Instant::now();
        previous
            .run(&[
                "lock", &url, "-o", "old.lock", "--holder", "old", "--wait", "60",
            ])
            .await
            .ok();
        let waited = began.elapsed();
        assert!(
            waited >= STORED + GRACE,
            "{url}: the previous release took over after {waited:?}, before lease + delay + grace"
        );
        println!("{url}: the previous release took over after {waited:?}");
        previous.run(&["unlock", "old.lock"]).await.ok();
    }
}

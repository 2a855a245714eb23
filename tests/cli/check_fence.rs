//! `check-fence URL FENCE` on every store: the holder's fence → 0; an older one, and
//! any fence on a key nobody holds → 5 with one line saying why; on a key with
//! several permits, every holder's fence is current. And rule 10 (docs/design.md
//! §6.5) on every store: `put --lock URL` with a fence the lock never issued → 5.

use super::*;

/// Exit 5, one error line: `URL: fence N is not current: <why>`.
fn assert_not_current(out: &Out, url: &str, fence: u64, why: &str) {
    out.code(5)
        .one_line_error(&[&format!("{url}: fence {fence} is not current: "), why]);
    assert!(out.stdout.is_empty(), "{out:#?}");
}

/// Exit 0 and `URL: fence N is current: held by HOLDER` on stdout.
fn assert_current(out: &Out, url: &str, fence: u64, holder: &str) {
    out.ok();
    assert_eq!(
        out.stdout,
        format!("{url}: fence {fence} is current: held by {holder}\n"),
        "{out:#?}"
    );
    assert!(out.stderr.is_empty(), "{out:#?}");
}

async fn check(lw: &Cli, url: &str, fence: u64) -> Out {
    lw.run(&["check-fence", url, &fence.to_string()]).await
}

/// Nobody → 5; holder a's fence → 0; after a hand-over to b, a's fence → 5 naming b
/// and b's fence, b's → 0; after b's release, b's fence → 5, nobody holds it.
async fn fence_checks(backend: Backend) {
    let key = match backend {
        Backend::S3 => "locks/fenced",
        Backend::DynamoDb | Backend::ZooKeeper | Backend::Kubernetes => "fenced",
    };
    let (cli, url) = fresh_lock(backend, "cli-check-fence", key).await;
    // The fenced object is on S3 whatever the lock's store.
    let cli = cli.with_aws();
    let data = format!(
        "s3://{}/data",
        Moto::shared().new_bucket("cli-fenced").await
    );
    std::fs::write(cli.path("data.txt"), "data\n").unwrap();
    let (lw, url) = (&cli, url.as_str());
    let out = check(lw, url, 1).await;
    assert_not_current(&out, url, 1, "nobody holds the key");
    let out = put(lw, url, 1, &data).await;
    out.code(5)
        .one_line_error(&[url, "has no record", "none is accepted"]);

    lw.run(&["lock", url, "-o", "a.lock", "--holder", "holder-a"])
        .await
        .ok();
    let fa = fence(&lw.read_json("a.lock"));
    assert_current(&check(lw, url, fa).await, url, fa, "holder-a");
    lw.unlock("a.lock").await;

    lw.run(&["lock", url, "-o", "b.lock", "--holder", "holder-b"])
        .await
        .ok();
    let fb = fence(&lw.read_json("b.lock"));
    assert!(fb > fa, "{fb} > {fa}");
    let out = check(lw, url, fa).await;
    assert_not_current(&out, url, fa, &format!("held by holder-b with fence {fb}"));
    assert_current(&check(lw, url, fb).await, url, fb, "holder-b");
    rule10_a_fence_the_lock_never_issued_is_refused(lw, url, fb, &data).await;
    lw.unlock("b.lock").await;

    let out = check(lw, url, fb).await;
    assert_not_current(&out, url, fb, "nobody holds the key");
    let out = put(lw, url, fb, &data).await;
    if backend == Backend::ZooKeeper {
        // A free ZooKeeper key keeps nothing (its queue is a container znode).
        out.code(5).one_line_error(&[url, "has no record"]);
    } else {
        // The tombstone keeps the fence: the last holder's late write goes on to the
        // object's own check, as it always did.
        out.ok();
    }
}

/// `lockwarden put --fence FENCE --lock URL TARGET data.txt`.
async fn put(lw: &Cli, url: &str, fence: u64, target: &str) -> Out {
    let fence = fence.to_string();
    lw.run(&["put", "--fence", &fence, "--lock", url, target, "data.txt"])
        .await
}

/// Held with fence `latest`: a write with a fence above it is refused naming both and
/// writes nothing; the holder's own fence then writes, and is not locked out.
async fn rule10_a_fence_the_lock_never_issued_is_refused(
    lw: &Cli,
    url: &str,
    latest: u64,
    data: &str,
) {
    let invented = latest + 10;
    let out = put(lw, url, invented, data).await;
    out.code(5).one_line_error(&[
        url,
        &format!("fence {invented} was never issued by lock"),
        &format!("its latest fence is {latest}"),
    ]);
    lw.run(&["get", data])
        .await
        .code(1)
        .one_line_error(&[data, "no such object"]);
    lw.run(&[
        "delete",
        "--fence",
        &invented.to_string(),
        "--lock",
        url,
        data,
    ])
    .await
    .code(5)
    .one_line_error(&[url, "never issued"]);
    put(lw, url, latest, data).await.ok();
    let out = lw.run(&["get", data]).await;
    out.ok();
    assert_eq!(out.stdout, "data\n", "{out:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_fence_on_every_backend() {
    on_each(&EVERY_BACKEND, fence_checks).await;
}

/// Several permits: either holder's fence is current, a departed one's is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_check_fence_with_several_permits() {
    let (lw, url) = fresh_lock(Backend::S3, "cli-check-fence", "locks/semaphore").await;
    let mut fences = Vec::new();
    for (file, holder) in [("p1.lock", "reader-1"), ("p2.lock", "reader-2")] {
        lw.run(&[
            "lock",
            &url,
            "--permits",
            "2",
            "-o",
            file,
            "--holder",
            holder,
        ])
        .await
        .ok();
        fences.push((fence(&lw.read_json(file)), holder));
    }
    for (f, holder) in &fences {
        assert_current(&check(&lw, &url, *f).await, &url, *f, holder);
    }
    lw.unlock("p1.lock").await;
    let (gone, _) = fences[0];
    let (kept, _) = fences[1];
    let out = check(&lw, &url, gone).await;
    assert_not_current(
        &out,
        &url,
        gone,
        &format!("held by reader-2 with fence {kept}"),
    );
    lw.unlock("p2.lock").await;
}

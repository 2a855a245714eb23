//! `check-fence URL FENCE` on every store: the holder's fence → 0; an older one, and
//! any fence on a key nobody holds → 5 with one line saying why; on a key with
//! several permits, every holder's fence is current.

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
    let (lw, url) = (&cli, url.as_str());
    let out = check(lw, url, 1).await;
    assert_not_current(&out, url, 1, "nobody holds the key");

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
    lw.unlock("b.lock").await;

    let out = check(lw, url, fb).await;
    assert_not_current(&out, url, fb, "nobody holds the key");
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

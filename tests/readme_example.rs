//! The library example in README.md, compiled and run against a real S3 (moto).
//! `readme_shows_this_example` fails when the README's copy drifts from this one.

mod support;

// README:begin
use std::sync::Arc;
use std::time::Duration;

use lockwarden::backend::S3Store;
use lockwarden::lock::{AcquireRequest, CasLock, FenceToken, HeldLock, LockError, Wait};

/// Runs `work` while holding `s3://locks/payments/db-migration`, renewed in the
/// background; stops early if the lock is lost.
async fn migrate(s3: aws_sdk_s3::Client) -> Result<(), LockError> {
    let lock = Arc::new(CasLock::new(S3Store::new(
        s3,
        "locks",
        "payments/db-migration",
    )));
    let request = AcquireRequest::new("migrator@host-1", Duration::from_secs(30));
    let held = HeldLock::acquire(lock, &request, Wait::For(Duration::from_secs(600))).await?;

    tokio::select! {
        // Hand the fencing token to whatever you write to: it rejects stale holders.
        _ = work(held.fence()) => {}
        state = held.lost() => eprintln!("lock lost, stopping: {state:?}"),
    }
    held.release().await
}
// README:end

async fn work(fence: FenceToken) {
    assert!(fence.0 >= 1);
}

#[tokio::test]
async fn readme_example_runs_against_s3() {
    let moto = support::moto::Moto::shared();
    let s3 = moto.s3_client().await;
    s3.create_bucket().bucket("locks").send().await.ok();
    migrate(s3.clone())
        .await
        .expect("the README example holds and releases the lock");
    // A second run continues the fence sequence from the tombstone.
    migrate(s3).await.expect("and again");
}

#[test]
fn readme_shows_this_example() {
    let this = include_str!("readme_example.rs");
    let begin = this.find("// README:begin\n").unwrap() + "// README:begin\n".len();
    let end = this.find("// README:end").unwrap();
    let example = &this[begin..end];
    let readme = std::fs::read_to_string(support::repo_root().join("README.md")).unwrap();
    assert!(
        readme.contains(example),
        "README.md's library example differs from tests/readme_example.rs; copy this block into it:\n{example}"
    );
}

//! `lockwarden put`, `get` and `delete` as a user runs them: exit 0 and 5, one-line
//! errors naming the object and both fences, the fence and lock from the environment
//! `lockwarden run` gives its command.

use serde_json::Value;

use super::support::cli::{Cli, Out};
use super::support::moto::{Moto, new_table_at};
use super::support::unique;

/// `lockwarden put --fence FENCE --lock LOCK TARGET FILE`.
async fn put(cli: &Cli, fence: u64, lock: &str, target: &str, file: &str) -> Out {
    let fence = fence.to_string();
    cli.run(&["put", "--fence", &fence, "--lock", lock, target, file])
        .await
}

/// Takes and releases `lock` with `lockwarden lock`/`unlock` until its latest fence is
/// `latest`, so that fences up to it are ones the lock issued (rule 10: `put` refuses
/// any other).
async fn issue_fences(cli: &Cli, lock: &str, latest: u64) {
    for _ in 0..latest {
        cli.run(&["lock", lock, "-o", "issue.lock"]).await.ok();
        cli.run(&["unlock", "issue.lock"]).await.ok();
    }
}

/// `put` with the fence `yours` is refused with exit 5 and one line naming the object:
/// it was `what` ("written", "deleted") by the fence `stored`.
async fn assert_put_is_stale(
    cli: &Cli,
    (lock, target, file): (&str, &str, &str),
    what: &str,
    (stored, yours): (u64, u64),
) {
    let says = format!("stale fence: object {what} by fence {stored}, yours is {yours}");
    put(cli, yours, lock, target, file)
        .await
        .code(5)
        .one_line_error(&[target, &says]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_delete_on_s3_refuse_a_stale_fence_with_exit_5() {
    let bucket = Moto::shared().new_bucket("fenced-cli").await;
    let target = format!("s3://{bucket}/data/report.csv");
    let lock = format!("s3://{bucket}/locks/report");
    let cli = Cli::aws();
    std::fs::write(cli.path("v5.csv"), "a,b\n5,5\n").unwrap();
    std::fs::write(cli.path("v4.csv"), "a,b\n4,4\n").unwrap();
    issue_fences(&cli, &lock, 6).await;

    put(&cli, 5, &lock, &target, "v5.csv").await.ok();
    let out = cli.run(&["get", &target]).await;
    out.ok();
    assert_eq!(out.stdout, "a,b\n5,5\n");
    assert_eq!(
        out.stderr.trim(),
        format!("lockwarden: {target}: written by fence 5 of lock {lock}")
    );

    let v4 = (lock.as_str(), target.as_str(), "v4.csv");
    assert_put_is_stale(&cli, v4, "written", (5, 4)).await;
    cli.run(&["delete", "--fence", "4", "--lock", &lock, &target])
        .await
        .code(5)
        .one_line_error(&[&target, "written by fence 5, yours is 4"]);
    let other = format!("s3://{bucket}/locks/other");
    issue_fences(&cli, &other, 1).await;
    put(&cli, 1, &other, &target, "v4.csv")
        .await
        .code(5)
        .one_line_error(&[&target, &format!("fenced by lock {lock}"), &other]);

    // Under `lockwarden run`, the fence and the lock come from the environment.
    let holder = Cli::aws()
        .with("LOCKWARDEN_FENCE", "6")
        .with("LOCKWARDEN_URL", lock.as_str());
    holder.run(&["delete", &target]).await.ok();
    cli.run(&["get", &target])
        .await
        .code(1)
        .one_line_error(&[&target, "deleted by fence 6"]);
    let json = cli.run(&["get", "-o", "json", &target]).await;
    json.ok();
    let doc: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(doc["state"], "deleted");
    assert_eq!(doc["fence"], 6);
    assert_eq!(doc["lock"], lock.as_str());
    let v5 = (lock.as_str(), target.as_str(), "v5.csv");
    assert_put_is_stale(&cli, v5, "deleted", (6, 5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_and_get_on_dynamodb_take_and_print_dynamodb_json() {
    let endpoint = Moto::shared().endpoint();
    let table = new_table_at(&endpoint, "fenced-cli", "pk").await;
    let target = format!("dynamodb://{table}/{}", unique("job"));
    // Lock items live in a table of their own (partition key `key`, as dynamolock's).
    let lock_table = new_table_at(&endpoint, "fenced-locks", "key").await;
    let lock = format!("dynamodb://{lock_table}/the-lock");
    let cli = Cli::aws();
    issue_fences(&cli, &lock, 2).await;
    std::fs::write(
        cli.path("item.json"),
        r#"{"count":{"N":"3"},"state":{"S":"done"}}"#,
    )
    .unwrap();
    put(&cli, 2, &lock, &target, "item.json").await.ok();
    let out = cli.run(&["get", "--output", "json", &target]).await;
    out.ok();
    let doc: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(doc["state"], "written");
    assert_eq!(doc["fence"], 2);
    let data: Value = serde_json::from_str(doc["data"].as_str().unwrap()).unwrap();
    assert_eq!(
        data,
        serde_json::json!({"count": {"N": "3"}, "state": {"S": "done"}})
    );
    let item = (lock.as_str(), target.as_str(), "item.json");
    assert_put_is_stale(&cli, item, "written", (2, 1)).await;
}

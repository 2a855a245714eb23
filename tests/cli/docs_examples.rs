//! The `sh` examples of the README and the user guide marked
//! `<!-- runs: tests/cli/docs_examples.rs -->`, read from the Markdown and run as they
//! are written, one after another, each with `bash -euo pipefail` in a directory of its
//! own, against moto (S3, DynamoDB), with `lockwarden` (and, for a block that calls
//! them, `kubectl` and `helm`) on PATH and HOME in that directory, which also holds the
//! repository's `charts/`, `crds/` and `examples/` (links), as a clone would.
//!
//! Before a block runs, every bucket it names (`s3://BUCKET/…`) is emptied or created,
//! and every DynamoDB table it names (`dynamodb://TABLE/…`) deleted and, unless the
//! block creates it itself (`--create-table`), created with dynamolock's partition key
//! `key`: each block starts from stores as a new user has them. A line with a comment
//! `# exit N` promises that the block prints `exit N` (the `|| echo "exit $?…"` of a
//! command expected to fail with N).

use std::collections::BTreeSet;
use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
};

use super::docs_markdown::{Mark, blocks};
use super::support;
use support::cli::{Cli, bin};
use support::moto::Moto;

/// This file, as the marks name it.
const THIS: &str = "tests/cli/docs_examples.rs";

/// The pages whose marked blocks this test runs (every page with such a block must be
/// here: docs_markdown checks that a `runs:` mark names a file that names its page).
const PAGES: &[&str] = &[
    "README.md",
    "docs/guide/cli.md",
    "docs/guide/fencing.md",
    "docs/guide/interop.md",
    "docs/guide/kubectl-plugin.md",
    "docs/guide/monitoring.md",
    "docs/guide/operations.md",
    "docs/guide/queues.md",
    "docs/guide/semaphores.md",
];

/// What a block may take at most (a `--wait` in it included).
const BLOCK_TIMEOUT: Duration = Duration::from_secs(180);

/// The names after `scheme://` in `text`, up to the next `/`.
fn names_after(text: &str, scheme: &str) -> BTreeSet<String> {
    text.match_indices(scheme)
        .filter_map(|(at, _)| {
            let rest = &text[at + scheme.len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
                .collect();
            (rest[name.len()..].starts_with('/') && !name.is_empty()).then_some(name)
        })
        .collect()
}

/// The exit codes the block's `# exit N` comments promise.
fn promised_exits(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let (_, comment) = line.rsplit_once("# exit ")?;
            let code: String = comment.chars().take_while(char::is_ascii_digit).collect();
            (!code.is_empty()).then(|| format!("exit {code}"))
        })
        .collect()
}

/// Empties or creates the buckets, and recreates the tables, that `script` names.
async fn fresh_stores(moto: &Moto, script: &str) {
    let s3 = moto.s3_client().await;
    for bucket in names_after(script, "s3://") {
        if s3.head_bucket().bucket(&bucket).send().await.is_ok() {
            let listed = s3
                .list_objects_v2()
                .bucket(&bucket)
                .send()
                .await
                .unwrap_or_else(|e| panic!("list s3://{bucket}: {e:?}"));
            for object in listed.contents() {
                let key = object.key().expect("an object key");
                s3.delete_object()
                    .bucket(&bucket)
                    .key(key)
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("delete s3://{bucket}/{key}: {e:?}"));
            }
            assert!(
                listed.is_truncated() != Some(true),
                "s3://{bucket}: more objects than one listing"
            );
        } else {
            s3.create_bucket()
                .bucket(&bucket)
                .send()
                .await
                .unwrap_or_else(|e| panic!("create s3://{bucket}: {e:?}"));
        }
    }
    let dynamodb = moto.dynamodb_client().await;
    for table in names_after(script, "dynamodb://") {
        dynamodb.delete_table().table_name(&table).send().await.ok();
        if script.contains("--create-table") {
            continue;
        }
        dynamodb
            .create_table()
            .table_name(&table)
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name("key")
                    .attribute_type(ScalarAttributeType::S)
                    .build()
                    .expect("an attribute definition"),
            )
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name("key")
                    .key_type(KeyType::Hash)
                    .build()
                    .expect("a key schema"),
            )
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await
            .unwrap_or_else(|e| panic!("create table {table}: {e:?}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sh_examples_of_the_readme_and_the_guide_run_as_written() {
    let moto = Moto::shared();
    let bin_dir = std::path::Path::new(bin())
        .parent()
        .expect("the binary's directory");
    let mut ran = Vec::new();
    for page in PAGES {
        let mine: Vec<_> = blocks(page)
            .into_iter()
            .filter(|b| b.mark == Ok(Some(Mark::Runs(THIS.to_string()))))
            .collect();
        assert!(
            !mine.is_empty(),
            "{page} has no block marked `runs: {THIS}`: drop it from PAGES"
        );
        for block in mine {
            assert_eq!(
                block.lang,
                "sh",
                "{}: only sh blocks are run",
                block.place()
            );
            fresh_stores(moto, &block.text).await;
            let cli = Cli::aws();
            let home = cli.dir().to_path_buf();
            let mut path = vec![home.join(".local/bin"), bin_dir.to_path_buf()];
            for (program, tool) in [("kubectl", "KUBECTL"), ("helm", "HELM")] {
                if block.text.contains(program) {
                    let tool = support::tool(tool);
                    path.push(tool.parent().expect("a tool's directory").to_path_buf());
                }
            }
            for dir in ["charts", "crds", "examples"] {
                std::os::unix::fs::symlink(support::repo_root().join(dir), home.join(dir))
                    .expect("link a directory of the repository");
            }
            path.extend(std::env::split_paths(
                &std::env::var_os("PATH").unwrap_or_default(),
            ));
            let script = format!("set -euo pipefail\n{}", block.text);
            let mut cmd =
                cli.command_under(&["bash", "-c", &script, "docs-example"], &[] as &[&str]);
            cmd.env("PATH", std::env::join_paths(path).expect("a PATH"))
                .env("HOME", &home);
            let out = tokio::time::timeout(BLOCK_TIMEOUT, cmd.output())
                .await
                .unwrap_or_else(|_| {
                    panic!("{}: still running after {BLOCK_TIMEOUT:?}", block.place())
                })
                .expect("run bash");
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            println!(
                "--- {} ({})\n{}--- stdout:\n{stdout}--- stderr:\n{stderr}",
                block.place(),
                out.status,
                block.text
            );
            assert!(
                out.status.success(),
                "{}: the example failed ({}):\n{}\nstdout:\n{stdout}\nstderr:\n{stderr}",
                block.place(),
                out.status,
                block.text
            );
            for exit in promised_exits(&block.text) {
                assert!(
                    stdout.contains(&exit),
                    "{}: the example promises `{exit}` but printed:\n{stdout}\nstderr:\n{stderr}",
                    block.place()
                );
            }
            ran.push(block.place());
        }
    }
    println!("ran {} examples: {ran:?}", ran.len());
}

#[test]
fn store_names_and_promised_exits_are_read_from_the_block() {
    assert_eq!(
        names_after(
            "lockwarden put s3://reports/daily.csv - s3://locks/x s3://notabucket",
            "s3://"
        ),
        BTreeSet::from(["locks".to_string(), "reports".to_string()])
    );
    assert_eq!(
        promised_exits("a || echo \"exit $?: held\"   # exit 3\nb\n# exit x\n"),
        vec!["exit 3".to_string()]
    );
}

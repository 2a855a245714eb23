//! The library example of docs/guide/library.md, compiled and run against a real S3
//! (moto). `the_guide_shows_this_example` fails when the guide's copy drifts from this
//! one. And README.md's **Prerequisites** are the programs the scripts call.

use lockwarden_testsupport as support;

use std::collections::{BTreeMap, BTreeSet};

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

/// The page that shows the example (its block is marked
/// `<!-- runs: tests/readme_example.rs -->`; tests/cli/docs_markdown.rs checks that
/// this file names the page).
const GUIDE: &str = "docs/guide/library.md";

#[test]
fn the_guide_shows_this_example() {
    let this = include_str!("readme_example.rs");
    let begin = this.find("// README:begin\n").unwrap() + "// README:begin\n".len();
    let end = this.find("// README:end").unwrap();
    let example = &this[begin..end];
    let guide = std::fs::read_to_string(support::repo_root().join(GUIDE)).expect(GUIDE);
    assert!(
        guide.contains(example),
        "{GUIDE}'s library example differs from tests/readme_example.rs; copy this block into it:\n{example}"
    );
}

/// The commands the scripts call that no script installs, as scripts/testenv declares
/// them (`DEMO_PREREQUISITES`, `NODE_PREREQUISITES`, `SUITE_PREREQUISITES`; it checks
/// them before building anything).
fn declared_prerequisites(testenv: &str) -> BTreeSet<String> {
    [
        "DEMO_PREREQUISITES=(",
        "NODE_PREREQUISITES=(",
        "SUITE_PREREQUISITES=(",
    ]
    .iter()
    .flat_map(|start| {
        let line = testenv
            .lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("scripts/testenv declares no {start}…)"));
        line[start.len()..]
            .trim_end_matches(')')
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    })
    .collect()
}

/// The backticked names in README.md's paragraph that starts with `**Prerequisites**`.
fn readme_prerequisites(readme: &str) -> BTreeSet<String> {
    let start = readme
        .find("**Prerequisites**")
        .expect("README.md has a **Prerequisites** paragraph");
    let paragraph = readme[start..].split("\n\n").next().unwrap();
    paragraph
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// Programs a machine may lack, looked for at a command's position in the scripts.
const TOOLCHAIN: &[&str] = &[
    "cargo", "rustc", "rustup", "go", "gofmt", "mvn", "java", "javac", "python3", "python", "pip",
    "pip3", "node", "npm", "npx", "git", "curl", "wget", "openssl", "gcc", "cc", "make", "cmake",
    "jq", "yq", "docker", "podman", "apt-get", "unzip", "zstd", "ssh", "sudo", "ruby", "buildah",
];
/// Of those, what the scripts install themselves (scripts/testenv's NODE_PACKAGES,
/// with apt-get) or find only behind `command -v` — never a prerequisite.
const INSTALLED_BY_THE_SCRIPTS: &[&str] = &["gcc", "buildah"];

/// The TOOLCHAIN programs each bash script in scripts/ runs: a name at the start of a
/// command (line start, or after `|`, `;`, `&&`, `(`, `$(`, `then`, `do`, `exec`, `!`),
/// outside comments and lines that only print.
fn called_by_scripts() -> BTreeMap<String, BTreeSet<String>> {
    let mut called: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let dir = support::repo_root().join("scripts");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if !text.starts_with("#!/usr/bin/env bash") {
            continue; // Rust (dev-node.rs) and Python (stdlib only: python3 is listed)
        }
        let script = path.file_name().unwrap().to_string_lossy().into_owned();
        for line in text.lines() {
            let line = line.trim_start();
            let first = line.split_whitespace().next().unwrap_or("");
            if line.starts_with('#') || ["echo", "log", "say", "printf"].contains(&first) {
                continue;
            }
            let mut line = line.to_string();
            for separator in ["$(", "&&", "||", "|", ";", "(", "!"] {
                line = line.replace(separator, "\n");
            }
            for command in line.lines() {
                let mut words = command
                    .split_whitespace()
                    .skip_while(|w| ["then", "do", "exec", "else", "if", "while"].contains(w))
                    // `NAME=VALUE cmd`: the environment before the command.
                    .skip_while(|w| w.contains('=') && !w.starts_with('-'));
                if let Some(word) = words.next()
                    && TOOLCHAIN.contains(&word)
                {
                    called
                        .entry(word.to_string())
                        .or_default()
                        .insert(script.clone());
                }
            }
        }
    }
    called
}

#[test]
fn readme_prerequisites_are_the_commands_the_scripts_call() {
    let root = support::repo_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let testenv = std::fs::read_to_string(root.join("scripts/testenv")).unwrap();
    let listed = readme_prerequisites(&readme);
    let declared = declared_prerequisites(&testenv);
    assert_eq!(
        listed, declared,
        "README.md's **Prerequisites** and scripts/testenv's *_PREREQUISITES differ"
    );
    let called = called_by_scripts();
    println!("prerequisites: {declared:?}; called by the scripts: {called:?}");
    for (program, scripts) in &called {
        assert!(
            declared.contains(program) || INSTALLED_BY_THE_SCRIPTS.contains(&program.as_str()),
            "{scripts:?} call {program}, which README.md's **Prerequisites** does not name \
             and no script installs"
        );
    }
    for program in &declared {
        assert!(
            called.contains_key(program) || program == "rustc" && called.contains_key("cargo"),
            "README.md names {program} as a prerequisite, but no script calls it"
        );
    }
    // The scan sees a call: a script line that runs `jq` would fail the test.
    assert!(called.get("cargo").is_some_and(|s| s.contains("test")));
}

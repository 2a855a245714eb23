//! `scripts/demo --once`, the README's first command, runs to the end: control plane,
//! backends, controller, every example applied, each lock Acquired, one hand-off.

mod support;

use std::process::Command;

#[test]
fn demo_once_completes() {
    let dev = support::work_dir(&support::unique("demo"));
    let out = Command::new(support::repo_root().join("scripts/demo"))
        .arg("--once")
        .env("LOCKWARDEN_BIN", env!("CARGO_BIN_EXE_lockwarden"))
        .env("LOCKWARDEN_DEV", &dev)
        .output()
        .expect("run scripts/demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "scripts/demo --once failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // Four locks acquired, then the waiter after the hand-off.
    assert_eq!(stdout.matches("condition met").count(), 5, "{stdout}");
    assert!(
        stdout.contains("Waiting"),
        "the contender is shown waiting:\n{stdout}"
    );
    for backend in ["kubernetes", "s3", "dynamodb", "zookeeper"] {
        assert!(
            stdout.contains(backend),
            "no {backend} lock in the table:\n{stdout}"
        );
    }
}

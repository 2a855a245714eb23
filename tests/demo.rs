//! `scripts/demo --once`, the README's first command, runs to the end: control plane,
//! backends, controller, every example applied, each lock Acquired, one hand-off.

use lockwarden_testsupport as support;

#[test]
fn demo_once_completes() {
    let run = support::run_demo("demo", &["--once"], env!("CARGO_BIN_EXE_lockwarden"));
    let stdout = &run.stdout;
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

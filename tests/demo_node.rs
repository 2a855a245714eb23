//! `scripts/demo --node --once` runs to the end: a real node (`scripts/dev up --node`),
//! lockwarden's image installed there with helm, two Jobs gated on one lock whose
//! containers print their fences, the second's higher; then `scripts/dev down` leaves
//! nothing of the node behind.

use lockwarden_testsupport as support;

use std::path::Path;

#[test]
fn demo_node_once_runs_gated_jobs_and_leaves_nothing() {
    let run = support::run_demo(
        "demo-node",
        &["--node", "--once"],
        env!("CARGO_BIN_EXE_lockwarden"),
    );
    let (stdout, stderr, dev) = (&run.stdout, &run.stderr, &run.dev);

    // `kubectl logs --timestamps`: "<time> migrate-schema-N migrating with fence F".
    let fence = |job: &str| -> i64 {
        let needle = format!(" {job} migrating with fence ");
        let line = stdout
            .lines()
            .find(|l| l.contains(&needle))
            .unwrap_or_else(|| panic!("no output of Job {job}:\n{stdout}"));
        line.rsplit(' ')
            .next()
            .and_then(|f| f.parse().ok())
            .unwrap_or_else(|| panic!("no fence in {line:?}"))
    };
    let (first, second) = (fence("migrate-schema-1"), fence("migrate-schema-2"));
    assert!(first > 0, "Job 1's fence {first}:\n{stdout}");
    assert!(
        second > first,
        "Job 2 (fence {second}) ran after Job 1 (fence {first}) with a higher fence:\n{stdout}"
    );

    // The node's teardown ran (while this node held the machine lock) and found nothing
    // left; scripts/dev down relayed its report.
    assert!(
        stderr.contains("node torn down") && !stderr.contains("left behind"),
        "the node's teardown report:\n{stderr}"
    );
    // What is this node's alone, checked again now that its process is gone (another
    // node, of a concurrent test binary, may run by now: its processes, cgroups and
    // state file are not this one's).
    let node_dir = stdout
        .lines()
        .find_map(|l| l.strip_prefix("node directory: "))
        .unwrap_or_else(|| panic!("no node directory in the output:\n{stdout}"));
    let node_dir = Path::new(node_dir.trim());
    assert!(node_dir.is_dir(), "{}", node_dir.display());
    assert!(
        !dev.join("node.pid").exists(),
        "scripts/dev down left its pid file"
    );
    let left = processes_under(&[node_dir, dev]);
    assert!(left.is_empty(), "processes left: {left:?}");
    let mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| Path::new(p).starts_with(node_dir))
        .map(str::to_string)
        .collect();
    assert!(mounts.is_empty(), "mounts left: {mounts:?}");
    let state = std::fs::read_to_string("/run/lockwarden-node.state").unwrap_or_default();
    assert_ne!(
        Path::new(state.trim()),
        node_dir,
        "/run/lockwarden-node.state still names this node: its teardown did not finish"
    );
}

/// Processes (but this one) whose cwd or command line is under one of `dirs`.
fn processes_under(dirs: &[&Path]) -> Vec<String> {
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == me {
            continue;
        }
        let Ok(cwd) = std::fs::read_link(entry.path().join("cwd")) else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if dirs
            .iter()
            .any(|d| cwd.starts_with(d) || cmdline.contains(&d.display().to_string()))
        {
            found.push(format!("{pid}: {cmdline}"));
        }
    }
    found
}

//! Every server a test binary starts is gone once the binary is, also when it is
//! killed with SIGKILL (no exit path of its own runs then): the guard process of
//! `support::run_dir` reaps what is left under the run's directory.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::support;
use support::moto::Moto;

/// Set in the copy of this test binary that the test starts and kills.
const CHILD: &str = "LOCKWARDEN_LIFETIME_CHILD";
const NAME: &str = "lifetime::a_test_binary_killed_with_sigkill_leaves_no_server_behind";

/// Whether `pid` is a live process (a zombie is not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
        !s.lines()
            .any(|l| l.starts_with("State:") && l.contains('Z'))
    })
}

/// Live processes whose cwd or command line is under `dir`.
fn under(dir: &Path) -> Vec<(u32, String)> {
    let dir = format!("{}/", dir.display());
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse().ok()) else {
            continue;
        };
        let cwd = std::fs::read_link(entry.path().join("cwd"))
            .map(|p| format!("{}/", p.display()))
            .unwrap_or_default();
        let args = std::fs::read(entry.path().join("cmdline"))
            .map(|a| String::from_utf8_lossy(&a).replace('\0', " "))
            .unwrap_or_default();
        if (cwd.starts_with(&dir) || args.contains(&dir)) && alive(pid) {
            found.push((pid, args));
        }
    }
    found
}

/// The child's part: a server as the suite starts them (moto, spawned by the support
/// code), and a process that left into a session of its own under the run's
/// directory, as `scripts/dev` starts the demo's servers; then it waits to be killed.
fn be_the_child() {
    let moto = Moto::shared();
    let dir = support::work_dir("escaped");
    let escaped = unsafe {
        Command::new("sleep")
            .arg("600")
            .current_dir(&dir)
            .pre_exec(|| {
                libc::setsid();
                Ok(())
            })
            .spawn()
            .expect("start sleep")
    };
    println!(
        "SERVERS {} {} {}",
        moto.pid().expect("moto runs"),
        escaped.id(),
        support::run_dir().display()
    );
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn a_test_binary_killed_with_sigkill_leaves_no_server_behind() {
    if std::env::var_os(CHILD).is_some() {
        return be_the_child();
    }
    let mut child = Command::new(std::env::current_exe().expect("this test binary"))
        .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start a copy of this test binary");
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    // libtest prints `test NAME ... ` before the test's own output, on the same line.
    let line = stdout
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.split_once("SERVERS ").map(|(_, rest)| rest.to_string()))
        .expect("the child reports its servers");
    let fields: Vec<&str> = line.split(' ').collect();
    let [moto, escaped, run] = fields[..] else {
        panic!("unexpected report {line:?}");
    };
    let (moto, escaped): (u32, u32) = (moto.parse().unwrap(), escaped.parse().unwrap());
    let run = Path::new(run);
    assert!(alive(moto) && alive(escaped), "servers run before the kill");
    assert!(!under(run).is_empty(), "processes under {}", run.display());

    child.kill().expect("SIGKILL the child test binary");
    child.wait().expect("reap it");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = under(run);
        if left.is_empty() && !alive(moto) && !alive(escaped) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "60s after SIGKILL of the test binary, still running: {left:?} (moto {moto}: {}, \
             escaped {escaped}: {}); guard log:\n{}",
            alive(moto),
            alive(escaped),
            std::fs::read_to_string(run.join("guard.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

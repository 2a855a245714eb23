//! The `lockwarden` command-line tool, run as a built binary against the real servers
//! (moto for S3 and DynamoDB, ZooKeeper, kube-apiserver): lock / unlock / run / status
//! on every backend, waiting, takeover, loss while running, and malformed input.
//!
//! Every test uses its own bucket, table, ZooKeeper path or namespace, and runs the
//! binary in its own temporary directory with the backend settings in its
//! environment (AWS_ENDPOINT_URL, AWS_REGION, credentials, KUBECONFIG), as a user would.

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Child;

use support::cli::{BIN, Cli, Out, TIMEOUT};
use support::kube::ControlPlane;
use support::moto::Moto;
use support::unique;
use support::zookeeper::ZooKeeper;

/// Assertions on the binary's lock files specific to these tests.
impl Cli {
    /// `unlock FILE`, which must succeed; for a ZooKeeper lock, also waits until the
    /// process that kept its session has exited.
    async fn unlock(&self, name: &str) -> Out {
        let keeper = self.read_json(name)["keeper"]["pid"].as_u64();
        let out = self.run(&["unlock", name]).await;
        out.ok();
        assert!(!self.path(name).exists(), "{name} must be deleted");
        if let Some(pid) = keeper {
            eventually(
                &format!("the keeper of {name} (pid {pid}) to exit"),
                || async move { (!process_alive(pid)).then_some(()) },
            )
            .await;
        }
        out
    }

    async fn status(&self, url: &str) -> Value {
        let out = self.run(&["status", url, "-o", "json"]).await;
        out.ok();
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("status JSON: {e}: {out:#?}"))
    }
}

/// Reads a child's stdout and stderr to the end and waits for it.
async fn finish(mut child: Child, stderr_so_far: String) -> Out {
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut s) = child.stdout.take() {
        s.read_to_string(&mut stdout).await.expect("read stdout");
    }
    if let Some(mut s) = child.stderr.take() {
        s.read_to_string(&mut stderr).await.expect("read stderr");
    }
    let status = tokio::time::timeout(TIMEOUT, child.wait())
        .await
        .expect("child exits")
        .expect("wait");
    Out {
        code: status.code().unwrap_or(-1),
        stdout,
        stderr: stderr_so_far + &stderr,
    }
}

/// Reads a running child's stderr until a line contains `needle`; returns what was
/// read (the rest stays in the pipe).
async fn stderr_until(child: &mut Child, needle: &str) -> String {
    let stderr = child.stderr.take().expect("piped stderr");
    let mut reader = BufReader::new(stderr);
    let mut seen = String::new();
    let found = tokio::time::timeout(TIMEOUT, async {
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).await.expect("read stderr") == 0 {
                return false;
            }
            seen.push_str(&line);
            if line.contains(needle) {
                return true;
            }
        }
    })
    .await
    .unwrap_or(false);
    assert!(
        found,
        "no stderr line with {needle:?}; stderr so far:\n{seen}"
    );
    // Put the rest back for `finish`.
    child.stderr = Some(reader.into_inner());
    seen
}

/// Polls `check` until it returns `Some`, failing after [`TIMEOUT`].
async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    support::eventually(what, TIMEOUT, check).await
}

/// Whether `pid` is a running (not exited, not zombie) process.
fn process_alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            // `pid (comm) state …`: the state follows the last ')'.
            let rest = &stat[stat.rfind(')')? + 1..];
            rest.split_whitespace().next().map(|s| s != "Z" && s != "X")
        })
        .unwrap_or(false)
}

fn fence(v: &Value) -> u64 {
    v["fence"]
        .as_u64()
        .unwrap_or_else(|| panic!("no fence in {v}"))
}

/// What each backend does with fences: +1 per acquisition, except ZooKeeper, whose
/// fence is the holder znode's czxid (strictly increasing, with gaps).
#[derive(Clone, Copy, PartialEq)]
enum Fences {
    PlusOne,
    Increasing,
}

fn assert_next_fence(kind: Fences, before: u64, after: u64) {
    match kind {
        Fences::PlusOne => assert_eq!(after, before + 1, "fence must be the previous + 1"),
        Fences::Increasing => assert!(after > before, "fence {after} must exceed {before}"),
    }
}

/// Acceptance, per backend: lock → a second lock fails with exit 3 → unlock → lock
/// again with fence + 1; then `run` continues the sequence, passes the fence and the
/// exit code, and releases.
async fn lock_cycle(lw: &Cli, url: &str, fences: Fences) {
    // lock
    let out = lw
        .run(&["lock", url, "-o", "first.lock", "--lease", "5m"])
        .await;
    out.ok();
    assert_eq!(
        out.stdout,
        format!("{url} has been locked\ncreate first.lock\n"),
        "{out:#?}"
    );
    let first = lw.read_json("first.lock");
    assert_eq!(first["url"], url);
    assert_eq!(first["lease"], "5m");
    let holder = first["holder"].as_str().expect("holder").to_string();
    assert!(
        holder.starts_with("tester@"),
        "default holder is user@host:pid: {holder}"
    );
    for field in ["nonce", "version", "acquiredAt"] {
        assert!(
            first[field].as_str().is_some_and(|s| !s.is_empty()),
            "{field} missing in {first}"
        );
    }
    let f1 = fence(&first);

    // A second lock fails: held, exit 3, names the holder and fence; writes no file.
    let out = lw.run(&["lock", url, "-o", "second.lock"]).await;
    out.code(3)
        .one_line_error(&[url, &format!("lock already held by {holder} (fence {f1})")]);
    assert!(out.stdout.is_empty(), "{out:#?}");
    assert!(!lw.path("second.lock").exists());

    // status reads it without acquiring.
    let status = lw.status(url).await;
    assert_eq!(status["state"], "held", "{status}");
    assert_eq!(status["holder"], holder.as_str(), "{status}");
    assert_eq!(fence(&status), f1);

    // unlock
    let out = lw.unlock("first.lock").await;
    assert_eq!(
        out.stdout,
        format!("{url} has been unlocked\ndelete first.lock\n")
    );
    assert!(!lw.path("first.lock").exists());

    // lock again: fence + 1
    let out = lw
        .run(&[
            "lock",
            url,
            "-o",
            "third.lock",
            "--holder",
            "third",
            "--data",
            "hello",
        ])
        .await;
    out.ok();
    let third = lw.read_json("third.lock");
    let f2 = fence(&third);
    assert_next_fence(fences, f1, f2);
    assert_eq!(third["holder"], "third");
    let status = lw.status(url).await;
    assert_eq!(status["holder"], "third", "{status}");
    assert_eq!(status["data"], "hello", "{status}");
    lw.unlock("third.lock").await;

    // run: the fence goes to the command, its exit code comes back, the lock is
    // released afterwards — and while it runs, the lock is held by it.
    let script = format!(
        "echo \"$LOCKWARDEN_FENCE $LOCKWARDEN_HOLDER $LOCKWARDEN_URL\" > env.txt; \
         {BIN} status \"$LOCKWARDEN_URL\" -o json > during.json; exit 7"
    );
    let out = lw
        .run(&[
            "run", url, "--wait", "60", "--holder", "runner", "--", "sh", "-c", &script,
        ])
        .await;
    out.code(7);
    let env = std::fs::read_to_string(lw.path("env.txt")).expect("env.txt");
    let parts: Vec<&str> = env.split_whitespace().collect();
    assert_eq!(parts.len(), 3, "{env:?}");
    let f3: u64 = parts[0].parse().expect("LOCKWARDEN_FENCE is a number");
    assert_next_fence(fences, f2, f3);
    assert_eq!(parts[1], "runner");
    assert_eq!(parts[2], url);
    let during = lw.read_json("during.json");
    assert_eq!(during["state"], "held", "{during}");
    assert_eq!(during["holder"], "runner", "{during}");
    assert_eq!(fence(&during), f3);

    // Released afterwards: the next lock succeeds at once with the next fence.
    let out = lw.run(&["lock", url, "-o", "fourth.lock"]).await;
    out.ok();
    assert_next_fence(fences, f3, fence(&lw.read_json("fourth.lock")));
    lw.unlock("fourth.lock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_lock_unlock_relock_and_run() {
    let bucket = Moto::shared().new_bucket("cli-cycle").await;
    let lw = Cli::aws();
    let url = format!("s3://{bucket}/locks/lock-object");
    lock_cycle(&lw, &url, Fences::PlusOne).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_lock_file_has_s3lock_fields_and_default_name() {
    let bucket = Moto::shared().new_bucket("cli-file").await;
    let lw = Cli::aws();
    let url = format!("s3://{bucket}/lock-object");
    let out = lw.run(&["lock", &url]).await;
    out.ok();
    assert_eq!(
        out.stdout,
        format!("{url} has been locked\ncreate lock-object.lock\n")
    );
    let file = lw.read_json("lock-object.lock");
    assert_eq!(file["Bucket"], bucket.as_str());
    assert_eq!(file["Key"], "lock-object");
    assert_eq!(file["Id"], file["nonce"]);
    assert_eq!(file["ETag"], file["version"]);
    assert_eq!(file["lease"], "1h", "lock's default lease");
    // The ETag in the file is the object's.
    let head = Moto::shared()
        .s3_client()
        .await
        .head_object()
        .bucket(&bucket)
        .key("lock-object")
        .send()
        .await
        .expect("head lock object");
    assert_eq!(file["ETag"], head.e_tag().unwrap_or_default());
    std::fs::copy(lw.path("lock-object.lock"), lw.path("stale.lock")).expect("copy");
    lw.unlock("lock-object.lock").await;

    // A lock file is never overwritten (it is what unlocks its lock): the lock just
    // taken is released again.
    std::fs::rename(lw.path("stale.lock"), lw.path("lock-object.lock")).expect("rename");
    let out = lw.run(&["lock", &url]).await;
    out.code(1)
        .one_line_error(&[&url, "lock-object.lock already exists", "released again"]);
    assert_eq!(lw.status(&url).await["state"], "released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_lock_unlock_relock_and_run() {
    let table = Moto::shared().new_table("cli-cycle", "key").await;
    let lw = Cli::aws();
    let url = format!("dynamodb://{table}/db-migration");
    lock_cycle(&lw, &url, Fences::PlusOne).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_custom_partition_key_is_remembered_by_the_lock_file() {
    let table = Moto::shared().new_table("cli-pk", "LockID").await;
    let lw = Cli::aws();
    let url = format!("dynamodb://{table}/x");
    lw.run(&["lock", &url, "--partition-key", "LockID"])
        .await
        .ok();
    let file = lw.read_json("x.lock");
    assert_eq!(file["backend"]["partitionKey"], "LockID", "{file}");
    // Without the flag, the table's key schema does not match: an error, exit 1.
    lw.run(&["status", &url])
        .await
        .code(1)
        .one_line_error(&[&url]);
    // unlock needs no flag: the lock file says.
    lw.unlock("x.lock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_lock_unlock_relock_and_run() {
    let zk = ZooKeeper::shared();
    let lw = Cli::new();
    let url = format!(
        "zk://{}/lockwarden-cli/{}",
        zk.connect_string(),
        unique("cycle")
    );
    lock_cycle(&lw, &url, Fences::Increasing).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_lock_unlock_relock_and_run() {
    let plane = ControlPlane::shared();
    let client = plane.client().await;
    let namespace = plane.namespace(&client, "cli").await;
    let lw = Cli::kube();
    let url = format!("k8s://{namespace}/db-migration");
    lock_cycle(&lw, &url, Fences::PlusOne).await;
}

/// `--wait` acquires as soon as the holder unlocks (the delay is printed), and fails
/// cleanly, with exit 3, when its deadline passes first.
async fn wait_for_unlock(lw: &Cli, url: &str) {
    lw.run(&["lock", url, "-o", "holder.lock"]).await.ok();
    let holder = lw.read_json("holder.lock");

    // Deadline: still held after 2 s.
    let began = Instant::now();
    let out = lw
        .run(&["lock", url, "-o", "late.lock", "--wait", "2"])
        .await;
    let took = began.elapsed();
    assert_eq!(out.code, 3, "{out:#?}");
    let error = out
        .stderr
        .lines()
        .find(|l| l.starts_with("lockwarden: error:"))
        .unwrap_or_else(|| panic!("no error line: {out:#?}"));
    assert!(error.contains(url), "{error}");
    assert!(
        error.contains(&format!(
            "lock already held by {} (fence {})",
            holder["holder"].as_str().unwrap(),
            fence(&holder)
        )),
        "{error}"
    );
    assert!(error.contains("gave up after waiting 2s"), "{error}");
    assert!(
        out.stderr.contains("waiting for"),
        "plain progress lines without a terminal: {out:#?}"
    );
    assert!(took >= Duration::from_secs(2), "gave up early: {took:?}");
    assert!(!lw.path("late.lock").exists());
    println!("--wait 2 on a held lock gave up after {took:.2?}");

    // Acquire as soon as it is unlocked.
    let mut waiter = lw.spawn(&["lock", url, "-o", "waiter.lock", "--wait", "120"]);
    let seen = stderr_until(&mut waiter, "waiting for").await;
    lw.run(&["unlock", "holder.lock"]).await.ok();
    let unlocked = Instant::now();
    let out = finish(waiter, seen).await;
    let delay = unlocked.elapsed();
    out.ok();
    assert!(
        out.stdout.contains(&format!("{url} has been locked")),
        "{out:#?}"
    );
    println!("{url}: waiter acquired {delay:.2?} after the holder's unlock returned");
    // The pollers back off to 1 s between attempts; the rest is process start-up on a
    // loaded machine.
    assert!(
        delay < Duration::from_secs(30),
        "waiter took {delay:?} after unlock"
    );
    let waited = lw.read_json("waiter.lock");
    assert!(fence(&waited) > fence(&holder));
    lw.unlock("waiter.lock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_wait_acquires_when_the_holder_unlocks_and_fails_at_the_deadline() {
    let bucket = Moto::shared().new_bucket("cli-wait").await;
    let lw = Cli::aws();
    wait_for_unlock(&lw, &format!("s3://{bucket}/waited")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_wait_acquires_when_the_holder_unlocks_and_fails_at_the_deadline() {
    let lw = Cli::new();
    let url = format!(
        "zk://{}/lockwarden-cli/{}",
        ZooKeeper::shared().connect_string(),
        unique("wait")
    );
    wait_for_unlock(&lw, &url).await;
}

/// A lock stolen with `lock --force` by another process: `run` terminates its command
/// (SIGTERM) and exits 4; the thief's lock is left alone.
async fn stolen_while_running(lw: &Cli, url: &str, lease: &str) {
    // The command records its pid, then waits; on SIGTERM it records that and exits.
    let script = "trap 'echo terminated > term.txt; exit 143' TERM; \
                  echo \"$LOCKWARDEN_FENCE\" > started.txt; \
                  while true; do sleep 0.1; done";
    let runner = lw.spawn(&[
        "run", url, "--lease", lease, "--holder", "runner", "--grace", "30s", "--", "sh", "-c",
        script,
    ]);
    let started = lw.path("started.txt");
    let run_fence: u64 = eventually("the command under `run` to start", || async {
        std::fs::read_to_string(&started)
            .ok()
            .and_then(|s| s.trim().parse().ok())
    })
    .await;

    let out = lw
        .run(&[
            "lock",
            url,
            "--force",
            "-o",
            "thief.lock",
            "--holder",
            "thief",
        ])
        .await;
    out.ok();
    assert!(
        out.stderr.contains(&format!(
            "took the lock over from runner (fence {run_fence})"
        )),
        "{out:#?}"
    );
    let thief = lw.read_json("thief.lock");
    assert!(fence(&thief) > run_fence);

    let stolen_at = Instant::now();
    let out = finish(runner, String::new()).await;
    println!(
        "{url}: run noticed the takeover and exited {:.2?} after it",
        stolen_at.elapsed()
    );
    out.code(4)
        .one_line_error(&[url, "lock lost", "thief", "SIGTERM"]);
    assert_eq!(
        std::fs::read_to_string(lw.path("term.txt")).unwrap_or_default(),
        "terminated\n",
        "the command got SIGTERM"
    );
    // The thief still holds it: `run` did not release someone else's lock.
    let status = lw.status(url).await;
    assert_eq!(status["state"], "held", "{status}");
    assert_eq!(status["holder"], "thief", "{status}");
    assert_eq!(fence(&status), fence(&thief));
    lw.unlock("thief.lock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_run_exits_4_and_terminates_its_command_when_the_lock_is_stolen() {
    let bucket = Moto::shared().new_bucket("cli-steal").await;
    let lw = Cli::aws();
    stolen_while_running(&lw, &format!("s3://{bucket}/stolen"), "3s").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_run_exits_4_and_terminates_its_command_when_the_lock_is_stolen() {
    let lw = Cli::new();
    let url = format!(
        "zk://{}/lockwarden-cli/{}",
        ZooKeeper::shared().connect_string(),
        unique("steal")
    );
    stolen_while_running(&lw, &url, "10s").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_passes_sigterm_to_its_command_and_releases() {
    let bucket = Moto::shared().new_bucket("cli-sigterm").await;
    let lw = Cli::aws();
    let url = format!("s3://{bucket}/terminated");
    let script = "trap 'echo terminated > term.txt; exit 143' TERM; \
                  echo started > started.txt; while true; do sleep 0.1; done";
    let runner = lw.spawn(&["run", &url, "--", "sh", "-c", script]);
    let pid = runner.id().expect("run's pid");
    let started = lw.path("started.txt");
    eventually("the command under `run` to start", || async {
        started.exists().then_some(())
    })
    .await;
    // SAFETY: kill(2) on a child of this test.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    let out = finish(runner, String::new()).await;
    out.code(143);
    assert_eq!(
        std::fs::read_to_string(lw.path("term.txt")).unwrap_or_default(),
        "terminated\n"
    );
    assert_eq!(lw.status(&url).await["state"], "released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_force_with_wait_takes_over_only_when_the_wait_runs_out() {
    let bucket = Moto::shared().new_bucket("cli-force-wait").await;
    let lw = Cli::aws();
    let url = format!("s3://{bucket}/forced");
    lw.run(&["lock", &url, "-o", "old.lock", "--holder", "old"])
        .await
        .ok();
    let began = Instant::now();
    let out = lw
        .run(&["lock", &url, "-o", "new.lock", "--force", "--wait", "2"])
        .await;
    out.ok();
    assert!(
        began.elapsed() >= Duration::from_secs(2),
        "--force --wait 2 must wait 2s before taking over"
    );
    assert!(
        out.stderr.contains("took the lock over from old (fence 1)"),
        "{out:#?}"
    );
    assert_eq!(fence(&lw.read_json("new.lock")), 2);
    lw.run(&["unlock", "old.lock"])
        .await
        .code(3)
        .one_line_error(&["lock mismatch"]);
    lw.unlock("new.lock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_of_a_held_lock_exits_3_without_running_the_command() {
    let plane = ControlPlane::shared();
    let namespace = plane.namespace(&plane.client().await, "cli-held").await;
    let lw = Cli::kube();
    let url = format!("k8s://{namespace}/busy");
    lw.run(&["lock", &url, "-o", "a.lock"]).await.ok();
    let out = lw
        .run(&["run", &url, "--", "sh", "-c", "touch ran.txt"])
        .await;
    out.code(3).one_line_error(&[&url, "lock already held by"]);
    assert!(!lw.path("ran.txt").exists(), "the command must not run");
    // A command that cannot be found: 127, and the lock is given back.
    lw.unlock("a.lock").await;
    let out = lw.run(&["run", &url, "--", "/nonexistent/command"]).await;
    out.code(127)
        .one_line_error(&[&url, "/nonexistent/command"]);
    assert_eq!(lw.status(&url).await["state"], "released");
}

/// `unlock` of a lock someone else took over: "lock mismatch", exit 3, and their lock
/// stays held; `--force` only removes the stale file. Unlocking twice: "already
/// unlocked", exit 1.
async fn unlock_after_takeover(lw: &Cli, url: &str) {
    lw.run(&["lock", url, "-o", "mine.lock", "--holder", "me"])
        .await
        .ok();
    lw.run(&[
        "lock",
        url,
        "--force",
        "-o",
        "theirs.lock",
        "--holder",
        "them",
    ])
    .await
    .ok();
    let theirs = lw.read_json("theirs.lock");

    let out = lw.run(&["unlock", "mine.lock"]).await;
    out.code(3).one_line_error(&[url, "lock mismatch", "them"]);
    assert!(out.stdout.is_empty(), "{out:#?}");
    assert!(lw.path("mine.lock").exists(), "kept without --force");
    let status = lw.status(url).await;
    assert_eq!(status["state"], "held", "{status}");
    assert_eq!(status["holder"], "them", "{status}");
    assert_eq!(fence(&status), fence(&theirs));

    // --force: the error is ignored and the file removed; their lock is untouched.
    let out = lw.run(&["unlock", "--force", "mine.lock"]).await;
    out.ok();
    assert_eq!(out.stdout, "delete mine.lock\n", "{out:#?}");
    assert!(out.stderr.contains("lock mismatch"), "{out:#?}");
    assert!(!lw.path("mine.lock").exists());
    let status = lw.status(url).await;
    assert_eq!(status["state"], "held", "{status}");
    assert_eq!(status["holder"], "them", "{status}");

    // Unlocked twice: already unlocked.
    std::fs::copy(lw.path("theirs.lock"), lw.path("copy.lock")).expect("copy");
    lw.unlock("theirs.lock").await;
    let out = lw.run(&["unlock", "copy.lock"]).await;
    out.code(1).one_line_error(&[url, "already unlocked"]);
    let out = lw.run(&["unlock", "-f", "copy.lock"]).await;
    out.ok();
    assert!(!lw.path("copy.lock").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_unlock_of_a_taken_over_lock_reports_mismatch_and_leaves_it() {
    let table = Moto::shared().new_table("cli-mismatch", "key").await;
    let lw = Cli::aws();
    unlock_after_takeover(&lw, &format!("dynamodb://{table}/contested")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_unlock_of_a_taken_over_lock_reports_mismatch_and_leaves_it() {
    let bucket = Moto::shared().new_bucket("cli-mismatch").await;
    let lw = Cli::aws();
    unlock_after_takeover(&lw, &format!("s3://{bucket}/contested")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_unlock_of_a_taken_over_lock_reports_mismatch_and_leaves_it() {
    let lw = Cli::new();
    let url = format!(
        "zk://{}/lockwarden-cli/{}",
        ZooKeeper::shared().connect_string(),
        unique("mismatch")
    );
    unlock_after_takeover(&lw, &url).await;
}

/// Malformed URLs, durations, flags and lock files: each a one-line error with exit 2
/// (usage) or 1 (lock file), and nothing reaches the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_is_a_one_line_error_and_writes_nothing() {
    let bucket = Moto::shared().new_bucket("cli-malformed").await;
    let lw = Cli::aws();
    let good = format!("s3://{bucket}/k");
    std::fs::write(lw.path("corrupt.lock"), "{ this is not json").unwrap();
    std::fs::write(lw.path("empty.lock"), "").unwrap();
    std::fs::write(
        lw.path("s3lock.lock"),
        // What s3lock itself writes: no url, nonce or fence.
        r#"{"Bucket":"b","Key":"k","Id":"0b3c7e4c","ETag":"\"x\""}"#,
    )
    .unwrap();
    std::fs::write(
        lw.path("badurl.lock"),
        r#"{"url":"s3://x","holder":"h","nonce":"n","fence":1,"version":"v","lease":"1h","acquiredAt":"2025-01-01T00:00:00Z","format":1}"#,
    )
    .unwrap();
    std::fs::write(
        lw.path("future.lock"),
        format!(
            r#"{{"url":"{good}","holder":"h","nonce":"n","fence":1,"version":"v","lease":"1h","acquiredAt":"2025-01-01T00:00:00Z","format":99}}"#
        ),
    )
    .unwrap();

    let cases: Vec<(Vec<String>, i32, Vec<String>)> = vec![
        // URLs
        (
            vec!["lock".into(), format!("s3:/{bucket}/k")],
            2,
            vec!["is not a lock URL".into(), "s3://BUCKET/KEY".into()],
        ),
        (
            vec!["lock".into(), format!("s3://{bucket}")],
            2,
            vec!["no key after the bucket".into()],
        ),
        (
            vec!["lock".into(), format!("s3://{bucket}/")],
            2,
            vec!["empty key".into()],
        ),
        (
            vec!["lock".into(), "s3://Not_A_Bucket/k".into()],
            2,
            vec!["invalid bucket name".into()],
        ),
        (
            vec!["lock".into(), format!("ftp://{bucket}/k")],
            2,
            vec!["unknown scheme \"ftp\"".into()],
        ),
        (
            vec!["lock".into(), "dynamodb://t/k".into()],
            2,
            vec!["invalid table name".into(), "dynamodb://TABLE/KEY".into()],
        ),
        (
            vec!["lock".into(), "zk://127.0.0.1:notaport/x".into()],
            2,
            vec!["invalid port".into(), "zk://HOST:PORT".into()],
        ),
        (
            vec!["lock".into(), "zk://127.0.0.1:2181".into()],
            2,
            vec!["no lock path".into()],
        ),
        (
            vec!["status".into(), "k8s://only-namespace".into()],
            2,
            vec!["no Lease name".into(), "k8s://NAMESPACE/LEASE-NAME".into()],
        ),
        (
            vec![
                "run".into(),
                "k8s://Bad_NS/x".into(),
                "--".into(),
                "true".into(),
            ],
            2,
            vec!["invalid namespace".into()],
        ),
        // durations and numbers
        (
            vec![
                "lock".into(),
                good.clone(),
                "--lease".into(),
                "10parsecs".into(),
            ],
            2,
            vec!["--lease".into(), "30s, 5m, 1h30m".into()],
        ),
        (
            vec!["lock".into(), good.clone(), "--lease".into(), "0s".into()],
            2,
            vec!["greater than zero".into()],
        ),
        (
            vec![
                "lock".into(),
                good.clone(),
                "--lease".into(),
                "500ms".into(),
            ],
            2,
            vec!["at least 1s".into()],
        ),
        (
            vec!["lock".into(), good.clone(), "--wait".into(), "soon".into()],
            2,
            vec!["--wait".into(), "10, 90s or 5m".into()],
        ),
        (
            vec![
                "run".into(),
                good.clone(),
                "--grace".into(),
                "a while".into(),
                "--".into(),
                "true".into(),
            ],
            2,
            vec!["--grace".into()],
        ),
        // flags
        (
            vec!["lock".into(), good.clone(), "--bogus".into()],
            2,
            vec!["unexpected argument '--bogus'".into()],
        ),
        (
            vec!["lock".into(), good.clone(), "--holder".into(), "".into()],
            2,
            vec!["holder must not be empty".into()],
        ),
        (
            vec![
                "lock".into(),
                good.clone(),
                "--endpoint".into(),
                "localhost:9000".into(),
            ],
            2,
            vec!["http(s)://HOST[:PORT]".into()],
        ),
        (
            vec![
                "lock".into(),
                good.clone(),
                "--sort-key".into(),
                "novalue".into(),
            ],
            2,
            vec!["NAME=VALUE".into()],
        ),
        (
            vec!["status".into(), good.clone(), "-o".into(), "xml".into()],
            2,
            vec!["'xml'".into(), "json, yaml, wide".into()],
        ),
        (
            vec!["run".into(), good.clone()],
            2,
            vec!["<COMMAND>".into()],
        ),
        (vec!["lock".into()], 2, vec!["<URL>".into()]),
        (
            vec!["frobnicate".into()],
            2,
            vec!["unrecognized subcommand".into()],
        ),
        // lock files
        (
            vec!["unlock".into(), "missing.lock".into()],
            1,
            vec!["missing.lock: no such file".into()],
        ),
        (
            vec!["unlock".into(), "corrupt.lock".into()],
            1,
            vec!["corrupt.lock is not a lockwarden lock file".into()],
        ),
        (
            vec!["unlock".into(), "empty.lock".into()],
            1,
            vec!["the file is empty".into()],
        ),
        (
            vec!["unlock".into(), "s3lock.lock".into()],
            1,
            vec!["not a lockwarden lock file".into(), "missing field".into()],
        ),
        (
            vec!["unlock".into(), "badurl.lock".into()],
            1,
            vec!["url:".into(), "no key after the bucket".into()],
        ),
        (
            vec!["unlock".into(), "future.lock".into()],
            1,
            vec!["format 99 is not supported".into()],
        ),
        (
            vec!["unlock".into(), "--force".into(), "corrupt.lock".into()],
            1,
            vec!["not a lockwarden lock file".into()],
        ),
        // an output file that cannot be written is found before acquiring
        (
            vec![
                "lock".into(),
                good.clone(),
                "-o".into(),
                "no/such/dir/x.lock".into(),
            ],
            1,
            vec!["no/such/dir".into()],
        ),
    ];
    assert!(cases.len() >= 15);
    for (args, code, needles) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
        let out = lw.run(&args).await;
        out.code(*code).one_line_error(&needles);
        assert!(out.stdout.is_empty(), "{args:?}: {out:#?}");
    }
    // The bad lock files are still there (nothing removed them), and nothing was
    // written to the bucket.
    assert!(lw.path("corrupt.lock").exists());
    let listed = Moto::shared()
        .s3_client()
        .await
        .list_objects_v2()
        .bucket(&bucket)
        .send()
        .await
        .expect("list bucket");
    assert_eq!(
        listed.key_count().unwrap_or(0),
        0,
        "malformed input wrote to the bucket: {:?}",
        listed.contents()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_backend_is_an_error_naming_the_url() {
    // Nothing listens on this port.
    let port = support::free_port();
    let lw = Cli::new().with("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}"));
    let url = "s3://some-bucket/k";
    let out = lw.run(&["status", url]).await;
    out.code(1).one_line_error(&[url]);
    // No credentials at all for Kubernetes.
    let out = lw.run(&["status", "k8s://default/x"]).await;
    out.code(1)
        .one_line_error(&["k8s://default/x", "Kubernetes configuration"]);
}

#[test]
fn help_documents_exit_codes_and_completions_are_generated() {
    let out = std::process::Command::new(BIN)
        .arg("--help")
        .output()
        .expect("run --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "Exit status:",
        "3    the lock is held by someone else",
        "4    run: the lock was lost",
        "s3://BUCKET/KEY",
        "k8s://NAMESPACE/LEASE-NAME",
    ] {
        assert!(help.contains(needle), "--help lacks {needle:?}:\n{help}");
    }
    for shell in ["bash", "zsh", "fish"] {
        let out = std::process::Command::new(BIN)
            .args(["completions", shell])
            .output()
            .expect("run completions");
        assert!(out.status.success(), "{shell}: {out:?}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(
            script.contains("lockwarden") && script.contains("unlock"),
            "{shell} completions:\n{script}"
        );
    }
}

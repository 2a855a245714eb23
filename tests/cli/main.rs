//! The `lockwarden` command-line tool, run as a built binary against the real servers
//! (moto for S3 and DynamoDB, ZooKeeper, kube-apiserver): lock / unlock / run / status
//! on every backend, waiting, takeover, loss while running, and malformed input;
//! check-fence on every backend.
//!
//! Every test uses its own bucket, table, ZooKeeper path or namespace, and runs the
//! binary in its own temporary directory with the backend settings in its
//! environment (AWS_ENDPOINT_URL, AWS_REGION, credentials, KUBECONFIG), as a user would.

mod check_fence;
mod connecting;
mod cycle;
mod docs;
mod docs_examples;
mod docs_markdown;
mod docs_reference;
mod guard;
mod input;
mod lifetime;
mod lock_delay;
mod once;
mod permits;
mod reclaim;
mod run;
use lockwarden_testsupport as support;
mod takeover;
mod waiting;

use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Child;

use support::cli::{Cli, Out, TIMEOUT, bin};
use support::kube::ControlPlane;
use support::moto::Moto;
use support::unique;
use support::zookeeper::ZooKeeper;

/// Assertions on the binary's lock files specific to these tests (`Cli` is the
/// support crate's).
trait CliAssertions {
    /// `unlock FILE`, which must succeed; for a ZooKeeper lock, also waits until the
    /// process that kept its session has exited.
    async fn unlock(&self, name: &str) -> Out;
    /// `status URL -o json`, which must succeed.
    async fn status(&self, url: &str) -> Value;
}

impl CliAssertions for Cli {
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

/// A fresh lock URL on the shared ZooKeeper server.
fn zk_url(prefix: &str) -> String {
    format!(
        "zk://{}/lockwarden-cli/{}",
        ZooKeeper::shared().connect_string(),
        unique(prefix)
    )
}

/// A store the CLI tests run one body on, in a test of its own per store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    S3,
    DynamoDb,
    ZooKeeper,
    Kubernetes,
}

/// Every backend, for a test that runs one body on each.
const EVERY_BACKEND: [Backend; 4] = [
    Backend::S3,
    Backend::DynamoDb,
    Backend::ZooKeeper,
    Backend::Kubernetes,
];

impl Backend {
    /// What the store does with fences.
    fn fences(self) -> Fences {
        match self {
            Backend::ZooKeeper => Fences::Increasing,
            Backend::S3 | Backend::DynamoDb | Backend::Kubernetes => Fences::PlusOne,
        }
    }
}

/// A fresh lock URL on `backend` and a CLI with that store's settings in its
/// environment: `key` in a new bucket, table (partition key `key`) or namespace named
/// after `prefix`; on ZooKeeper a new path named after `prefix` ([`zk_url`]), whatever
/// `key`.
async fn fresh_lock(backend: Backend, prefix: &str, key: &str) -> (Cli, String) {
    match backend {
        Backend::S3 => {
            let bucket = Moto::shared().new_bucket(prefix).await;
            (Cli::aws(), format!("s3://{bucket}/{key}"))
        }
        Backend::DynamoDb => {
            let table = Moto::shared().new_table(prefix, "key").await;
            (Cli::aws(), format!("dynamodb://{table}/{key}"))
        }
        Backend::ZooKeeper => (Cli::new(), zk_url(prefix)),
        Backend::Kubernetes => {
            let plane = ControlPlane::shared();
            let namespace = plane.namespace(&plane.client().await, prefix).await;
            (Cli::kube(), format!("k8s://{namespace}/{key}"))
        }
    }
}

/// Runs `body` on each of `backends` at once, each in a task of its own (they share
/// nothing but the servers), and fails naming every backend whose run failed; each
/// one's panic is printed above.
async fn on_each<Fut>(backends: &[Backend], body: impl Fn(Backend) -> Fut)
where
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let runs: Vec<_> = backends
        .iter()
        .map(|&backend| (backend, tokio::spawn(body(backend))))
        .collect();
    let mut failed = Vec::new();
    for (backend, run) in runs {
        if let Err(e) = run.await {
            failed.push(format!("{backend:?}: {e}"));
        }
    }
    assert!(failed.is_empty(), "failed on {}", failed.join("; "));
}

//! lockwarden next to the lock libraries teams already run, on the same real servers:
//! winebarrel/s3lock and cirello.io/dynamolock on moto, DataDog kafka-kit's ZooKeeper
//! lock on ZooKeeper, client-go leader election on kube-apiserver.
//!
//! The other side is `tests/interop` (Go), built by `scripts/testenv` and found through
//! `LOCKWARDEN_INTEROP`. Each library is driven both ways: while it holds, lockwarden's
//! engine and CLI report the lock held (by whom) and do not acquire, and acquire once it
//! lets go; while lockwarden holds, the library cannot acquire, and can once lockwarden
//! lets go.

use lockwarden_testsupport as support;

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease as KubeLease;
use kube::api::{Api, DeleteParams, PostParams};
use lockwarden::api::conditions::{self, ACQUIRED};
use lockwarden::api::{BackendSpec, DistributedLock, DistributedLockSpec, S3Backend, SecretRef};
use lockwarden::backend::{
    AwsOptions, ConnectOptions, Credentials, KubernetesOptions, S3Options, Target, ZkSessions,
};
use lockwarden::lock::{
    AcquireRequest, Attempt, HeldLock, Lease, LockBackend, LockError, LockState, Permits, Queueing,
    Stored, Wait, acquire,
};
use serde_json::Value;
use support::cli::{Cli, Out};
use support::eventually;
use support::kube::ControlPlane;
use support::locks::lease_lock_timed;
use support::moto::{self, Moto};
use support::unique;
use support::zookeeper::ZooKeeper;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// Generous: a loaded 2-core machine, JVMs and Python servers next to a cargo build.
const TIMEOUT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------
// The Go side

/// One contender of a foreign library: a `tests/interop` process.
struct Foreign {
    what: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Foreign {
    fn spawn(library: &str, args: &[&str]) -> Foreign {
        let driver = support::tool("LOCKWARDEN_INTEROP");
        let mut child = Command::new(&driver)
            .arg(library)
            .args(args)
            .env("AWS_ACCESS_KEY_ID", moto::ACCESS_KEY_ID)
            .env("AWS_SECRET_ACCESS_KEY", moto::SECRET_ACCESS_KEY)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", driver.display()));
        let stdin = child.stdin.take();
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Foreign {
            what: format!("{library} {}", args.join(" ")),
            child,
            stdin,
            lines,
        }
    }

    /// The next event line.
    async fn next(&mut self) -> String {
        match tokio::time::timeout(TIMEOUT, self.lines.next_line()).await {
            Ok(Ok(Some(line))) => {
                eprintln!("[{}] {line}", self.what);
                line
            }
            Ok(Ok(None)) => panic!("{}: exited without another event", self.what),
            Ok(Err(e)) => panic!("{}: reading its output: {e}", self.what),
            Err(_) => panic!("{}: no event within {TIMEOUT:?}", self.what),
        }
    }

    /// The next event, which must start with `word`; returns the rest of the line.
    async fn expect(&mut self, word: &str) -> String {
        let line = self.next().await;
        let (first, rest) = line.split_once(' ').unwrap_or((&line, ""));
        assert_eq!(first, word, "{}: expected {word}, got {line:?}", self.what);
        rest.to_string()
    }

    /// Whether an event line is already waiting (without blocking for one).
    async fn has_event(&mut self) -> Option<String> {
        tokio::time::timeout(Duration::from_millis(200), self.lines.next_line())
            .await
            .ok()
            .and_then(|r| r.ok().flatten())
    }

    async fn send(&mut self, request: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin
            .write_all(format!("{request}\n").as_bytes())
            .await
            .unwrap_or_else(|e| panic!("{}: writing {request:?}: {e}", self.what));
        stdin.flush().await.expect("flush");
    }

    async fn release(&mut self) {
        self.send("release").await;
        self.expect("RELEASED").await;
    }

    async fn exit_code(mut self) -> i32 {
        drop(self.stdin.take());
        tokio::time::timeout(TIMEOUT, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("{}: did not exit", self.what))
            .expect("wait")
            .code()
            .unwrap_or(-1)
    }
}

// ---------------------------------------------------------------------------------
// The lockwarden side: the engine through the same URL + options path the CLI and the
// controller use, and the CLI binary itself.

fn aws_options(s3lock_compatible: bool) -> ConnectOptions {
    ConnectOptions {
        aws: AwsOptions {
            endpoint: Some(Moto::shared().endpoint()),
            region: Some(moto::REGION.into()),
            credentials: Some(Credentials::new(
                moto::ACCESS_KEY_ID,
                moto::SECRET_ACCESS_KEY,
                None,
            )),
            ..Default::default()
        },
        s3: S3Options {
            s3lock_compatible,
            ..Default::default()
        },
        ..Default::default()
    }
}

async fn engine(url: &str, options: &ConnectOptions) -> Arc<dyn LockBackend> {
    Target::parse(url)
        .unwrap_or_else(|e| panic!("{e}"))
        .connect(options)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"))
}

fn request(holder: &str, lease: Duration) -> AcquireRequest {
    AcquireRequest::new(holder, lease)
}

/// One attempt, which must find the lock held by a holder whose name contains `by`.
/// `lockwarden` takes the key with a 30 s lease, waiting as `wait` says.
async fn lockwarden_acquires(backend: &dyn LockBackend, wait: Wait, why: &str) -> Lease {
    acquire(
        backend,
        &request("lockwarden", Duration::from_secs(30)),
        wait,
    )
    .await
    .expect(why)
}

/// One of three permits of a key with free permits (renewed in the background until
/// released).
async fn hold_permit(backend: Arc<dyn LockBackend>, holder: &str, lease: Duration) -> HeldLock {
    let req = AcquireRequest {
        permits: Permits::semaphore(3),
        ..request(holder, lease)
    };
    HeldLock::acquire(backend, &req, Wait::No)
        .await
        .expect("a permit of a free key")
}

/// Two holders of a key with three permits (docs/design.md §6.2), renewed in the
/// background until released: what the seed tools must see as a held lock.
async fn hold_two_permits(url: &str, options: &ConnectOptions, lease: Duration) -> [HeldLock; 2] {
    let mut held = Vec::new();
    for holder in ["lockwarden-permit-1", "lockwarden-permit-2"] {
        let backend = engine(url, options).await;
        held.push(hold_permit(backend, holder, lease).await);
    }
    let second = held.pop().expect("two holders");
    let first = held.pop().expect("two holders");
    [first, second]
}

/// `lockwarden` waiting (up to [`TIMEOUT`]) for the key with a 10 s lease, in a task
/// of its own so that the test can let the other holder go meanwhile.
fn lockwarden_waits_in_background(
    backend: &Arc<dyn LockBackend>,
) -> tokio::task::JoinHandle<Result<Lease, LockError>> {
    let backend = backend.clone();
    tokio::spawn(async move {
        acquire(
            backend.as_ref(),
            &request("lockwarden", Duration::from_secs(10)),
            Wait::For(TIMEOUT),
        )
        .await
    })
}

/// Holds a key nobody holds yet (renewed in the background until released).
async fn hold_free_key(backend: &Arc<dyn LockBackend>, holder: &str, lease: Duration) -> HeldLock {
    HeldLock::acquire(backend.clone(), &request(holder, lease), Wait::No)
        .await
        .expect("acquire a free key")
}

async fn assert_engine_sees_held(backend: &dyn LockBackend, by: &str) {
    match backend
        .try_acquire(&request("lockwarden-probe", Duration::from_secs(30)))
        .await
    {
        Ok(Attempt::Busy { holder, .. }) => {
            assert!(
                holder.holder.contains(by),
                "{}: held by {:?}, expected {by:?}",
                backend.url(),
                holder.holder
            );
            assert_eq!(holder.state, LockState::Held);
        }
        Ok(Attempt::Acquired(lease)) => {
            panic!(
                "{}: lockwarden acquired a lock {by} holds (fence {})",
                backend.url(),
                lease.fence()
            )
        }
        Err(e) => panic!("{}: expected held by {by}, got {e}", backend.url()),
    }
    backend.abandon().await;
}

/// Both lockwarden sides, the engine and the CLI, see the key held by `by` and do not
/// take it.
async fn assert_seen_held(backend: &dyn LockBackend, url: &str, by: &str) {
    assert_engine_sees_held(backend, by).await;
    Cli::aws().with_kube().assert_sees_held(url, by, &[]).await;
}

/// lockwarden, asking for a `lease` lease and waiting `wait`, does not take over the
/// other tool's lock: `why` it keeps it.
/// How another tool's lock keeps lockwarden out while it holds, and how lockwarden
/// gets the key once it lets go.
struct Keeps {
    /// lockwarden asking for this lease, waiting this long, does not take it over…
    lease: Duration,
    wait: Duration,
    /// … because of this.
    why: &'static str,
    /// How lockwarden waits once the tool let go.
    then: Wait,
}

/// While the other tool's `holder` (a contender that must acquire) holds the key,
/// lockwarden's engine and CLI see it held by the holder's id and do not take it over
/// as `keeps` says; once it lets go, lockwarden acquires. Returns the engine and its
/// lease.
async fn seen_held_then_acquired(
    url: &str,
    holder: Foreign,
    keeps: &Keeps,
) -> (Arc<dyn LockBackend>, Lease) {
    let (mut holder, by) = holding(holder).await;
    let backend = engine(url, &aws_options(false)).await;
    assert_seen_held(backend.as_ref(), url, &by).await;
    let attempt = acquire(
        backend.as_ref(),
        &request("lockwarden", keeps.lease),
        Wait::For(keeps.wait),
    )
    .await;
    match attempt {
        Err(LockError::Timeout { .. }) => {}
        Err(err) => panic!("{}: expected a timeout, got {err}", keeps.why),
        Ok(lease) => {
            // Whether the holder itself had lost its lease (a heartbeat that failed or
            // came too late) tells a stalled machine from a wrong takeover.
            let mut said = Vec::new();
            while let Some(line) = holder.has_event().await {
                said.push(line);
            }
            panic!(
                "{}: lockwarden took the key over (fence {}); the holder said since: {said:?}",
                keeps.why,
                lease.fence()
            );
        }
    }
    holder.release().await;
    let after = format!("lockwarden acquires once {} let go", holder.what);
    let lease = lockwarden_acquires(backend.as_ref(), keeps.then, &after).await;
    (backend, lease)
}

// The other tool's contenders, whichever tool: each failure names the contender.

/// A contender that must acquire; returns it, holding, and the rest of its ACQUIRED
/// line (the holder's id, where the tool has one).
async fn holding(mut tool: Foreign) -> (Foreign, String) {
    let id = tool.expect("ACQUIRED").await;
    (tool, id)
}

/// A contender that must acquire, and then lets go.
async fn acquires(tool: Foreign) {
    holding(tool).await.0.release().await;
}

/// A contender that tries once and must find the key held (it exits 3).
async fn refused(tool: Foreign, why: &str) {
    let what = tool.what.clone();
    assert_eq!(tool.exit_code().await, 3, "{what}: {why}");
}

/// A contender with a bounded wait that must give up (TIMEOUT).
async fn times_out(mut tool: Foreign, why: &str) {
    assert_eq!(tool.next().await, "TIMEOUT", "{}: {why}", tool.what);
}

/// A contender (`contender(owner)`) tried while `held` holds finds it held (`why`);
/// once `held` lets go, another acquires.
async fn refused_until_released(contender: impl Fn(&str) -> Foreign, held: HeldLock, why: &str) {
    refused(contender("refused"), why).await;
    held.release().await.expect("release");
    acquires(contender("acquirer")).await;
}

/// A waiting contender that gets nothing while `held` holds (`why` it must not) and
/// acquires once `held` lets go.
async fn gets_it_after(mut waiting: Foreign, held: HeldLock, why: &str) {
    assert_eq!(waiting.has_event().await, None, "{}: {why}", waiting.what);
    held.release().await.expect("release");
    acquires(waiting).await;
}

/// The CLI refused with exit 3, saying `says` and naming `by`.
fn assert_refused(out: &Out, says: &str, by: &str) {
    assert_eq!(out.code, 3, "{out:#?}");
    assert!(
        out.stderr.contains(says) && out.stderr.contains(by),
        "the error must say {says:?} and name {by:?}: {out:#?}"
    );
}

/// The CLI with moto and the shared control plane; assertions of these tests.
trait InteropCli {
    async fn assert_sees_held(&self, url: &str, by: &str, extra: &[&str]);
    async fn assert_permits_wait_for(&self, url: &str, holder: Foreign, by: &str);
    async fn lock(&self, url: &str, name: &str, extra: &[&str]);
    async fn unlock(&self, name: &str);
}

impl InteropCli for Cli {
    /// `lock URL` fails with exit 3 naming the holder, writes no lock file, and
    /// `status URL` reports the lock held by that holder.
    async fn assert_sees_held(&self, url: &str, by: &str, extra: &[&str]) {
        let mut args = vec!["lock", url, "-o", "refused.lock"];
        args.extend_from_slice(extra);
        assert_refused(&self.run(&args).await, "lock already held by", by);
        assert!(!self.path("refused.lock").exists());
        let mut args = vec!["status", url, "-o", "json"];
        args.extend_from_slice(extra);
        let out = self.run(&args).await;
        assert_eq!(out.code, 0, "{out:#?}");
        let status: Value = serde_json::from_str(&out.stdout)
            .unwrap_or_else(|e| panic!("status JSON: {e}: {out:#?}"));
        assert_eq!(status["state"], "held", "{status}");
        assert!(
            status["holder"].as_str().is_some_and(|h| h.contains(by)),
            "status must name {by:?}: {status}"
        );
    }

    /// A key another tool's `holder` holds is *held, permits unknown* (docs/design.md
    /// §6.2), on every store: `lock --permits 3` exits 3 at once naming the holder
    /// (not a disagreement of permits, exit 1), and `--wait` waits for it, to exit 3
    /// when the wait runs out. Once the holder let go, the first lockwarden holder sets
    /// the key's permits.
    async fn assert_permits_wait_for(&self, url: &str, mut holder: Foreign, by: &str) {
        let out = self
            .run(&["lock", url, "--permits", "3", "-o", "permit.lock"])
            .await;
        assert_refused(&out, "lock already held by", by);
        assert!(
            !out.stderr
                .contains("every lock on one key must name the same permits"),
            "not a disagreement of permits: {out:#?}"
        );
        let asked = std::time::Instant::now();
        let out = self
            .run(&[
                "lock",
                url,
                "--permits",
                "3",
                "--wait",
                "3",
                "-o",
                "permit.lock",
            ])
            .await;
        assert_refused(&out, "gave up after waiting", by);
        assert!(
            asked.elapsed() >= Duration::from_secs(3),
            "--wait was not waited"
        );
        assert!(!self.path("permit.lock").exists());

        holder.release().await;
        self.lock(url, "permit.lock", &["--permits", "3", "--wait", "60"])
            .await;
        let out = self.run(&["status", url, "-o", "json"]).await;
        let status: Value = serde_json::from_str(&out.stdout).expect("status JSON");
        assert_eq!(status["permits"], 3, "{status}");
        self.unlock("permit.lock").await;
    }

    /// `lock URL -o NAME` succeeds.
    async fn lock(&self, url: &str, name: &str, extra: &[&str]) {
        let mut args = vec!["lock", url, "-o", name];
        args.extend_from_slice(extra);
        let out = self.run(&args).await;
        assert_eq!(out.code, 0, "{out:#?}");
    }

    async fn unlock(&self, name: &str) {
        let out = self.run(&["unlock", name]).await;
        assert_eq!(out.code, 0, "{out:#?}");
    }
}

// ---------------------------------------------------------------------------------
// S3: winebarrel/s3lock

async fn s3_key() -> (String, String, String) {
    let bucket = Moto::shared().new_bucket("interop").await;
    let key = unique("locks/s3lock");
    let url = format!("s3://{bucket}/{key}");
    (bucket, key, url)
}

/// An s3lock lock has no lease: waiting past any lease does not take it over.
const S3LOCK_KEEPS: Keeps = Keeps {
    lease: Duration::from_secs(1),
    wait: Duration::from_secs(3),
    why: "an s3lock lock never expires",
    then: Wait::For(TIMEOUT),
};

fn s3lock(bucket: &str, key: &str, wait: &str) -> Foreign {
    Foreign::spawn(
        "s3lock",
        &[
            "--endpoint",
            &Moto::shared().endpoint(),
            "--bucket",
            bucket,
            "--key",
            key,
            "--wait",
            wait,
            "--interval",
            "200ms",
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3lock_holder_is_reported_held_and_lockwarden_acquires_after_its_unlock() {
    let (bucket, key, url) = s3_key().await;
    let holder = s3lock(&bucket, &key, "0s");
    let (backend, lease) = seen_held_then_acquired(&url, holder, &S3LOCK_KEEPS).await;
    backend.release(&lease).await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_waits_for_an_s3lock_holder_and_then_sets_the_permits() {
    let (bucket, key, url) = s3_key().await;
    let (holder, id) = holding(s3lock(&bucket, &key, "0s")).await;
    let cli = Cli::aws();
    // Its status: s3lock's lock never expires (no placeholder duration).
    let out = cli.run(&["status", &url]).await;
    assert_eq!(out.code, 0, "{out:#?}");
    assert!(out.stdout.contains("never expires"), "{out:#?}");
    assert!(!out.stdout.contains("years"), "{out:#?}");
    cli.assert_permits_wait_for(&url, holder, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3lock_cannot_lock_while_lockwarden_holds_and_can_after_a_compatible_release() {
    let (bucket, key, url) = s3_key().await;

    // Engine, s3lock-compatible: the release deletes the object.
    let backend = engine(&url, &aws_options(true)).await;
    let held = hold_free_key(&backend, "lockwarden-engine", Duration::from_secs(30)).await;
    let s3lock_now = |_: &str| s3lock(&bucket, &key, "0s");
    refused_until_released(s3lock_now, held, "s3lock must find it held").await;

    // CLI, s3lock-compatible: the lock file remembers the option for unlock.
    let cli = Cli::aws().with_kube();
    cli.lock(&url, "held.lock", &["--s3lock-compatible"]).await;
    refused(s3lock(&bucket, &key, "0s"), "the CLI holds it").await;
    let waiting = s3lock(&bucket, &key, "120s");
    cli.unlock("held.lock").await;
    acquires(waiting).await;

    // Without the option lockwarden leaves a tombstone, which s3lock takes as held.
    cli.lock(&url, "plain.lock", &[]).await;
    cli.unlock("plain.lock").await;
    refused(
        s3lock(&bucket, &key, "0s"),
        "s3lock treats lockwarden's release tombstone as a held lock",
    )
    .await;
}

/// A key with several permits is one object holding the whole holder set: s3lock sees
/// it as held while anyone holds a permit, and, with `s3lockCompatible`, can lock once
/// the last holder has let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3lock_sees_a_semaphore_key_as_held_until_its_last_holder_lets_go() {
    let (bucket, key, url) = s3_key().await;
    let [first, second] = hold_two_permits(&url, &aws_options(true), Duration::from_secs(30)).await;
    let s3lock_now = |_: &str| s3lock(&bucket, &key, "0s");
    refused(s3lock_now("refused"), "two permits are held").await;
    first.release().await.expect("release");
    refused_until_released(s3lock_now, second, "one permit is still held").await;
}

/// `lockwarden status` on a key lockwarden released without deleting it: free for
/// lockwarden, but s3lock clients see it as held — the status says so and names the
/// option that deletes on release. (With the option the key is absent after a release.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_a_released_s3_key_says_s3lock_sees_it_held_and_names_the_option() {
    let (bucket, key, url) = s3_key().await;
    let cli = Cli::aws();
    cli.lock(&url, "plain.lock", &[]).await;
    cli.unlock("plain.lock").await;

    let out = cli.run(&["status", &url, "-o", "json"]).await;
    assert_eq!(out.code, 0, "{out:#?}");
    let status: Value = serde_json::from_str(&out.stdout).expect("status JSON");
    assert_eq!(status["state"], "released", "{status}");
    let note = status["note"].as_str().unwrap_or_default();
    for says in [
        "free for lockwarden",
        "s3lock",
        "as held",
        "s3lockCompatible: true",
        "--s3lock-compatible",
    ] {
        assert!(note.contains(says), "the note must say {says:?}: {status}");
    }
    let table = cli.run(&["status", &url]).await;
    assert!(
        table.stdout.contains("note: free for lockwarden"),
        "{table:#?}"
    );
    // What it says is so.
    refused(
        s3lock(&bucket, &key, "0s"),
        "the note says s3lock sees it held",
    )
    .await;

    // Released with the option: nothing left, nothing to say.
    cli.lock(&url, "compatible.lock", &["--s3lock-compatible"])
        .await;
    cli.unlock("compatible.lock").await;
    let out = cli.run(&["status", &url, "-o", "json"]).await;
    let status: Value = serde_json::from_str(&out.stdout).expect("status JSON");
    assert_eq!(status["state"], "absent", "{status}");
    assert!(status.get("note").is_none(), "{status}");
}

/// `spec.backend.s3.s3lockCompatible: true`: a DistributedLock's release deletes the
/// object, so an s3lock client waiting on the key gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_distributed_lock_with_s3lock_compatible_lets_s3lock_lock_after_its_release() {
    let (bucket, key, _url) = s3_key().await;
    let (client, ns) = support::kube::namespace_with_controller("interop-s3lock", "interop").await;
    support::locks::aws_secret(&client, &ns).await;
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), &ns);
    let lock = DistributedLock::new(
        "compatible",
        DistributedLockSpec {
            backend: BackendSpec {
                s3: Some(S3Backend {
                    bucket: bucket.clone(),
                    key: key.clone(),
                    region: Some(moto::REGION.into()),
                    endpoint: Some(Moto::shared().endpoint()),
                    force_path_style: Some(true),
                    credentials_secret_ref: Some(SecretRef { name: "aws".into() }),
                    s3lock_compatible: Some(true),
                    terraform_compatible: None,
                }),
                ..Default::default()
            },
            lease_duration: "30s".into(),
            renew_interval: "10s".into(),
            ..Default::default()
        },
    );
    locks
        .create(&PostParams::default(), &lock)
        .await
        .expect("create DistributedLock");
    eventually("the DistributedLock to be Acquired", TIMEOUT, || async {
        locks.get("compatible").await.ok().filter(|l| {
            l.status
                .as_ref()
                .is_some_and(|s| conditions::is_true(&s.conditions, ACQUIRED))
        })
    })
    .await;
    let mut waiting = s3lock(&bucket, &key, "120s");
    assert_eq!(waiting.has_event().await, None, "s3lock took a held lock");
    locks
        .patch(
            "compatible",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"release": true}})),
        )
        .await
        .expect("set spec.release");
    acquires(waiting).await;
}

// ---------------------------------------------------------------------------------
// DynamoDB: cirello.io/dynamolock/v2

async fn dynamo_key() -> (String, String, String) {
    let table = Moto::shared().new_table("interop", "key").await;
    let key = unique("k");
    let url = format!("dynamodb://{table}/{key}");
    (table, key, url)
}

/// Long enough that a heartbeat every second survives a loaded machine: the shared
/// moto applies one request at a time, and with 6 s one CI run saw ten heartbeats in a
/// row land too late, after which dynamolock itself counts its lock as lost.
const DYNAMOLOCK_LEASE: &str = "10s";

/// Heartbeats keep it: a wait of two leases does not take it over. Its release
/// (isReleased = "1") is a free lock: no lease wait.
const DYNAMOLOCK_KEEPS: Keeps = Keeps {
    lease: Duration::from_secs(10),
    wait: Duration::from_secs(20),
    why: "a heartbeating dynamolock holder keeps the lock",
    then: Wait::No,
};

fn dynamolock(table: &str, key: &str, owner: &str, wait: &str) -> Foreign {
    Foreign::spawn(
        "dynamolock",
        &[
            "--endpoint",
            &Moto::shared().endpoint(),
            "--table",
            table,
            "--key",
            key,
            "--owner",
            owner,
            "--lease",
            DYNAMOLOCK_LEASE,
            "--heartbeat",
            "1s",
            "--wait",
            wait,
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamolock_holder_is_reported_held_and_lockwarden_acquires_after_its_release() {
    let (table, key, url) = dynamo_key().await;
    let owner = unique("dynamolock-owner");
    let holder = dynamolock(&table, &key, &owner, "0s");
    let (backend, lease) = seen_held_then_acquired(&url, holder, &DYNAMOLOCK_KEEPS).await;
    let first = lease.fence();
    backend.release(&lease).await.expect("release");

    // The fence survives a dynamolock acquisition in between (it copies attributes).
    acquires(dynamolock(&table, &key, &owner, "0s")).await;
    let lease = lockwarden_acquires(backend.as_ref(), Wait::No, "acquire").await;
    assert!(
        lease.fence() > first,
        "fence went from {first} to {}",
        lease.fence()
    );
    backend.release(&lease).await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_waits_for_a_dynamolock_holder_and_then_sets_the_permits() {
    let (table, key, url) = dynamo_key().await;
    let owner = unique("dynamolock-owner");
    let (holder, _) = holding(dynamolock(&table, &key, &owner, "0s")).await;
    Cli::aws()
        .assert_permits_wait_for(&url, holder, &owner)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamolock_cannot_acquire_while_lockwarden_holds_and_can_after_release() {
    let (table, key, url) = dynamo_key().await;
    let backend = engine(&url, &aws_options(false)).await;
    let held = hold_free_key(&backend, "lockwarden-engine", Duration::from_secs(6)).await;
    refused(
        dynamolock(&table, &key, "d1", "0s"),
        "dynamolock must find it held",
    )
    .await;
    // Nor by waiting past the lease: lockwarden's renewals change the version.
    times_out(dynamolock(&table, &key, "d2", "10s"), "renewed").await;
    assert!(
        held.is_held(),
        "lockwarden lost the lock: {:?}",
        held.state()
    );
    held.release().await.expect("release");
    acquires(dynamolock(&table, &key, "d3", "0s")).await;

    // The CLI's lock, likewise.
    let cli = Cli::aws().with_kube();
    cli.lock(&url, "held.lock", &["--lease", "5m"]).await;
    refused(dynamolock(&table, &key, "d4", "0s"), "the CLI holds it").await;
    cli.unlock("held.lock").await;
    acquires(dynamolock(&table, &key, "d5", "0s")).await;
}

/// dynamolock sees a key with several permits as held by its first holder, also when it
/// waits past the lease (every renewal of any holder writes a new version), and takes it
/// once every holder has let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamolock_sees_a_semaphore_key_as_held_until_its_last_holder_lets_go() {
    let (table, key, url) = dynamo_key().await;
    // 10 s, not 6: the two holders' renewals race on one record, and in a loaded suite
    // a 6 s lease once ran out while dynamolock waited (the cause was not traced).
    let [first, second] =
        hold_two_permits(&url, &aws_options(false), Duration::from_secs(10)).await;
    refused(dynamolock(&table, &key, "d1", "0s"), "two permits are held").await;
    times_out(dynamolock(&table, &key, "d2", "16s"), "renewed permits").await;
    assert!(
        first.is_held() && second.is_held(),
        "a permit was lost while dynamolock waited: {:?}, {:?}",
        first.state(),
        second.state()
    );
    first.release().await.expect("release");
    let dynamolock_now = |owner: &str| dynamolock(&table, &key, owner, "0s");
    refused_until_released(dynamolock_now, second, "one permit is still held").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dynamolock_holder_that_stops_heartbeating_is_taken_over_after_its_lease() {
    let (table, key, url) = dynamo_key().await;
    let (mut holder, _) = holding(dynamolock(&table, &key, "stalled", "0s")).await;
    let backend = engine(&url, &aws_options(false)).await;
    assert_engine_sees_held(backend.as_ref(), "stalled").await;
    holder.send("stop-heartbeat").await;
    holder.expect("HEARTBEAT-STOPPED").await;
    let lease = lockwarden_acquires(
        backend.as_ref(),
        Wait::For(TIMEOUT),
        "lockwarden takes over once the lease ran out unrenewed",
    )
    .await;
    // The stalled holder's release is refused: it is no longer the owner.
    holder.send("release").await;
    let line = holder.next().await;
    assert!(line.starts_with("ERROR"), "the old holder released: {line}");
    backend.release(&lease).await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamolock_takes_over_a_lockwarden_lock_that_is_no_longer_renewed() {
    let (table, key, url) = dynamo_key().await;

    // An engine holder that stops renewing (as a hung process would).
    let backend = engine(&url, &aws_options(false)).await;
    let abandoned = acquire(
        backend.as_ref(),
        &request("lockwarden-abandoned", Duration::from_secs(3)),
        Wait::No,
    )
    .await
    .expect("acquire");
    let (mut taker, _) = holding(dynamolock(&table, &key, "taker", "60s")).await;
    let err = backend
        .renew(&mut abandoned.clone())
        .await
        .expect_err("lost");
    assert!(matches!(err, LockError::Lost { .. }), "{err}");
    taker.release().await;

    // A `lockwarden run` process that is killed while holding.
    let cli = Cli::aws().with_kube();
    let mut run = cli
        .command(&["run", &url, "--lease", "3s", "--", "sleep", "600"])
        .spawn()
        .expect("spawn lockwarden run");
    // Wait until `run` holds, then kill it: no release, no more renewals.
    eventually("lockwarden run to hold the lock", TIMEOUT, || {
        let url = url.clone();
        async move {
            let b = engine(&url, &aws_options(false)).await;
            match b.inspect().await {
                Ok(Some(s)) => s
                    .record
                    .ok()
                    .filter(|r| r.state == LockState::Held && r.holder.starts_with("tester@"))
                    .map(|_| ()),
                _ => None,
            }
        }
    })
    .await;
    run.kill().await.expect("kill lockwarden run");
    acquires(dynamolock(&table, &key, "taker-2", "60s")).await;
}

/// A lockwarden lock with a 2 s lease and a 3 s lock-delay (docs/design.md rule 8),
/// acquired once and never renewed nor released (a crashed holder): its record carries
/// 5 s, the time every contender of another tool waits from its own first sight.
const ABANDONED_LEASE: Duration = Duration::from_secs(2);
const ABANDONED_DELAY: Duration = Duration::from_secs(3);

/// `taker` (started after the abandoned lock is written) waits out its lease and its
/// delay before it takes the key over: its observation starts with its first read,
/// after the lock was written.
async fn assert_waits_out_the_lock_delay(
    url: &str,
    options: &ConnectOptions,
    taker: impl FnOnce() -> Foreign,
) {
    let backend = engine(url, options).await;
    let req = AcquireRequest {
        lock_delay: ABANDONED_DELAY,
        ..request("lockwarden-delayed", ABANDONED_LEASE)
    };
    acquire(backend.as_ref(), &req, Wait::No)
        .await
        .expect("acquire");
    let spawned = std::time::Instant::now();
    let (mut taker, _) = holding(taker()).await;
    let waited = spawned.elapsed();
    assert!(
        waited >= ABANDONED_LEASE + ABANDONED_DELAY,
        "{} took over after {waited:?}, before the lease and the delay",
        taker.what
    );
    println!(
        "{} took the expired lock over after {waited:?} (lease 2s + delay 3s)",
        taker.what
    );
    taker.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule8_dynamolock_waits_out_the_lock_delay_of_an_expired_lockwarden_lock() {
    let (table, key, url) = dynamo_key().await;
    // dynamolock's observation lasts the item's leaseDuration: lease + delay.
    assert_waits_out_the_lock_delay(&url, &aws_options(false), || {
        dynamolock(&table, &key, "taker", "60s")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule8_client_go_waits_out_the_lock_delay_of_an_expired_lockwarden_lease() {
    let (ns, name, url, options) = lease_key("interop-delay").await;
    // client-go observes leaseDurationSeconds (5) from its own first sight.
    assert_waits_out_the_lock_delay(&url, &options, || {
        leader(&ns, &name, "go-leader", &["--wait", "60s"])
    })
    .await;
}

// ---------------------------------------------------------------------------------
// ZooKeeper: DataDog kafka-kit's lock

fn zk_url(path: &str) -> String {
    format!("zk://{}{path}", ZooKeeper::shared().connect_string())
}

/// A lockwarden contender on its own ZooKeeper session. Not through `Target::connect`:
/// its process-wide session registry keeps a session bound to the runtime that opened
/// it, and every test here has its own runtime.
fn zk_engine(path: &str) -> Arc<dyn LockBackend> {
    Arc::new(
        ZkSessions::new()
            .lock(&ZooKeeper::shared().connect_string(), path)
            .unwrap_or_else(|e| panic!("{path}: {e}")),
    )
}

/// A kafka-kit contender (settings as for [`kafkakit_with`]) that has queued and then
/// reported `until` (ACQUIRED, WAITING or BUSY). Returns it and the name of its entry.
async fn kafkakit_until(path: &str, wait: &str, extra: &[&str], until: &str) -> (Foreign, String) {
    let mut contender = kafkakit_with(path, wait, extra);
    let entry = contender.expect("QUEUED").await;
    contender.expect(until).await;
    (contender, entry)
}

/// A kafka-kit contender with more settings (`--ttl MS`, `--owner O`).
fn kafkakit_with(path: &str, wait: &str, extra: &[&str]) -> Foreign {
    let servers = ZooKeeper::shared().connect_string();
    let mut args = vec!["--servers", &servers, "--path", path, "--wait", wait];
    args.extend_from_slice(extra);
    Foreign::spawn("kafkakit", &args)
}

/// A kafka-kit contender `owner` with a TTL of `ttl_ms` (it purges an entry ahead of
/// it whose `ttl_deadline` passed), as for [`kafkakit_until`].
async fn kafkakit_ttl(
    path: &str,
    wait: &str,
    ttl_ms: &str,
    owner: &str,
    until: &str,
) -> (Foreign, String) {
    kafkakit_until(path, wait, &["--ttl", ttl_ms, "--owner", owner], until).await
}

/// Polls `backend` until it acquires (`what` is waited for).
async fn eventually_acquires(backend: &dyn LockBackend, req: &AcquireRequest, what: &str) -> Lease {
    eventually(what, TIMEOUT, || async {
        match backend.try_acquire(req).await {
            Ok(Attempt::Acquired(lease)) => Some(lease),
            _ => None,
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_kit_holder_is_reported_held_and_lockwarden_acquires_after_its_unlock() {
    let path = format!("/{}", unique("interop-kk"));
    let url = zk_url(&path);
    let (mut holder, entry) = kafkakit_until(&path, "0s", &[], "ACQUIRED").await;

    let backend = zk_engine(&path);
    assert_seen_held(backend.as_ref(), &url, &entry).await;

    let waiting = lockwarden_waits_in_background(&backend);
    holder.release().await;
    let lease = waiting
        .await
        .unwrap()
        .expect("acquires after kafka-kit's unlock");
    backend.release(&lease).await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_kit_cannot_lock_while_lockwarden_holds_and_can_after_release() {
    let path = format!("/{}", unique("interop-kk"));
    let backend = zk_engine(&path);
    let held = HeldLock::acquire(
        backend.clone(),
        &request("lockwarden-engine", Duration::from_secs(10)),
        Wait::No,
    )
    .await
    .expect("acquire");
    let (_refused, _) = kafkakit_until(&path, "0s", &[], "BUSY").await;
    let (waiting, _) = kafkakit_until(&path, "120s", &[], "WAITING").await;
    gets_it_after(waiting, held, "kafka-kit acquired a held lock").await;
}

/// Permit holders are entries of the same queue: kafka-kit, which takes the first entry
/// as the holder, waits while any of them is ahead and acquires once all are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_kit_waits_behind_the_holders_of_a_semaphore_key() {
    let path = format!("/{}", unique("interop-kk-sem"));
    let mut held = Vec::new();
    for holder in ["lockwarden-permit-1", "lockwarden-permit-2"] {
        held.push(hold_permit(zk_engine(&path), holder, Duration::from_secs(10)).await);
    }
    let (_refused, _) = kafkakit_until(&path, "0s", &[], "BUSY").await;
    let (waiting, _) = kafkakit_until(&path, "120s", &[], "WAITING").await;
    let second = held.pop().expect("two holders");
    held.pop()
        .expect("two holders")
        .release()
        .await
        .expect("release");
    gets_it_after(
        waiting,
        second,
        "kafka-kit acquired while a permit was held",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_waits_for_a_kafka_kit_holder_and_then_sets_the_permits() {
    let path = format!("/{}", unique("interop-kk-permits"));
    let url = zk_url(&path);
    let (holder, entry) = kafkakit_until(&path, "0s", &["--owner", "kk-owner"], "ACQUIRED").await;
    let cli = Cli::new();
    // status: the table names the owner and the entry in a short cell; the sentence
    // about its TTL is for -o wide and JSON/YAML.
    let table = cli.run(&["status", &url]).await;
    assert_eq!(table.code, 0, "{table:#?}");
    assert!(
        table
            .stdout
            .contains(&format!("kafka-kit \"kk-owner\" (entry {entry})")),
        "{table:#?}"
    );
    assert!(!table.stdout.contains("ttl_deadline"), "{table:#?}");
    let wide = cli.run(&["status", &url, "-o", "wide"]).await;
    assert!(wide.stdout.contains("ttl_deadline"), "{wide:#?}");
    cli.assert_permits_wait_for(&url, holder, &entry).await;
}

/// A permit refused because a kafka-kit entry waits ahead of it (another client's
/// entry counts as exclusive) names that entry, not the lockwarden holder before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_behind_a_queued_kafka_kit_entry_names_that_entry() {
    let path = format!("/{}", unique("interop-kk-blocks"));
    let url = zk_url(&path);
    let first = hold_permit(
        zk_engine(&path),
        "lockwarden-permit-1",
        Duration::from_secs(10),
    )
    .await;
    let (queued, entry) = kafkakit_until(&path, "120s", &["--owner", "kk-queued"], "WAITING").await;

    let out = Cli::new()
        .run(&["lock", &url, "--permits", "3", "-o", "blocked.lock"])
        .await;
    assert_eq!(out.code, 3, "{out:#?}");
    assert!(
        out.stderr.contains(&entry) && out.stderr.contains("kk-queued"),
        "the refusal must name the kafka-kit entry {entry} that blocks it: {out:#?}"
    );
    assert!(!out.stderr.contains("lockwarden-permit-1"), "{out:#?}");
    first.release().await.expect("release");
    acquires(queued).await;
}

/// `status` of a ZooKeeper key with several permit holders names every one of them in
/// its summary row, as S3 and DynamoDB do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_a_zookeeper_semaphore_names_every_holder() {
    let path = format!("/{}", unique("interop-zk-holders"));
    let url = zk_url(&path);
    let mut held = Vec::new();
    for holder in ["permit-a", "permit-b"] {
        held.push(hold_permit(zk_engine(&path), holder, Duration::from_secs(10)).await);
    }
    let out = Cli::new().run(&["status", &url, "-o", "json"]).await;
    let status: Value = serde_json::from_str(&out.stdout).expect("status JSON");
    assert_eq!(status["holder"], "permit-a and permit-b", "{status}");
    for lock in held {
        lock.release().await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockwarden_and_kafka_kit_contenders_share_one_fifo_queue() {
    let path = format!("/{}", unique("interop-fifo"));
    let req = request("lockwarden", Duration::from_secs(10));

    // Arrival order: K1 (holds), L1, K2, L2, K3.
    let (mut k1, _) = kafkakit_until(&path, "0s", &[], "ACQUIRED").await;
    let l1 = zk_engine(&path);
    assert!(matches!(
        l1.try_acquire(&req).await,
        Ok(Attempt::Busy { .. })
    ));
    let (mut k2, _) = kafkakit_until(&path, "300s", &[], "WAITING").await;
    let l2 = zk_engine(&path);
    assert!(matches!(
        l2.try_acquire(&req).await,
        Ok(Attempt::Busy { .. })
    ));
    let (mut k3, _) = kafkakit_until(&path, "300s", &[], "WAITING").await;

    // K1 leaves: L1 is next, and nobody behind it gets the lock.
    k1.release().await;
    let lease1 = eventually_acquires(l1.as_ref(), &req, "L1 (second in line) to acquire").await;
    assert!(matches!(
        l2.try_acquire(&req).await,
        Ok(Attempt::Busy { queue_position: Some(p), .. }) if p > 0
    ));
    assert_eq!(k2.has_event().await, None, "K2 jumped the queue");
    assert_eq!(k3.has_event().await, None, "K3 jumped the queue");

    // L1 leaves: K2, not L2 nor K3.
    l1.release(&lease1).await.expect("release");
    k2.expect("ACQUIRED").await;
    assert!(matches!(
        l2.try_acquire(&req).await,
        Ok(Attempt::Busy { .. })
    ));
    assert_eq!(k3.has_event().await, None, "K3 jumped the queue");

    // K2 leaves: L2, not K3.
    k2.release().await;
    let lease2 = eventually_acquires(l2.as_ref(), &req, "L2 (fourth in line) to acquire").await;
    assert_eq!(k3.has_event().await, None, "K3 jumped the queue");

    // L2 leaves: K3.
    l2.release(&lease2).await.expect("release");
    acquires(k3).await;
}

/// kafka-kit contenders configured with a TTL purge the entry ahead of them once its
/// `ttl_deadline` has passed, and count an entry without one as passed. lockwarden's
/// entries carry a `ttl_deadline` that never passes (their liveness is the session's),
/// so a TTL contender queues behind a live lockwarden holder like any other, and gets
/// the lock when lockwarden lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_kit_ttl_contender_waits_behind_a_live_lockwarden_holder() {
    let path = format!("/{}", unique("interop-kk-ttl"));
    let backend = zk_engine(&path);
    let held = hold_free_key(&backend, "lockwarden-engine", Duration::from_secs(10)).await;
    // Once queued, its first pass decides, reading our entry's data: PURGED (our entry taken for
    // expired) or WAITING on it. It reads it again only when our entry changes.
    let (mut contender, _) = kafkakit_ttl(&path, "120s", "300", "ttl-1", "WAITING").await;
    assert_eq!(
        contender.has_event().await,
        None,
        "kafka-kit took a held lock"
    );
    assert_seen_held(
        zk_engine(&path).as_ref(),
        &zk_url(&path),
        "lockwarden-engine",
    )
    .await;

    held.release()
        .await
        .expect("release: our entry is still ours");
    acquires(contender).await;
}

/// lockwarden's rule for a kafka-kit entry whose `ttl_deadline` has passed: it keeps
/// the queue's semantics (the entry holds until it is deleted: by its owner, its
/// session's end, or a kafka-kit contender with a TTL) and says so when it reports the
/// holder. It never purges the entry itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockwarden_waits_behind_a_kafka_kit_holder_whose_ttl_passed() {
    let path = format!("/{}", unique("interop-kk-expired"));
    let url = zk_url(&path);
    let (mut holder, entry) = kafkakit_ttl(&path, "0s", "200", "kk-owner", "ACQUIRED").await;

    let backend = zk_engine(&path);
    let passed = eventually(
        "the kafka-kit holder's ttl_deadline to pass",
        TIMEOUT,
        || async {
            match backend
                .try_acquire(&request("lockwarden", Duration::from_secs(10)))
                .await
            {
                Ok(Attempt::Busy { holder, .. })
                    if holder.holder.contains("ttl_deadline passed") =>
                {
                    Some(holder.holder)
                }
                Ok(Attempt::Busy { .. }) => None,
                Ok(Attempt::Acquired(_)) => {
                    panic!("lockwarden took a kafka-kit lock whose TTL passed")
                }
                Err(e) => panic!("{e}"),
            }
        },
    )
    .await;
    assert!(
        passed.contains(&entry) && passed.contains("kk-owner"),
        "{passed}"
    );
    Cli::new()
        .assert_sees_held(&url, "ttl_deadline passed", &[])
        .await;

    let waiting = lockwarden_waits_in_background(&backend);
    // A kafka-kit contender with a TTL behind lockwarden's waiting entry waits too:
    // lockwarden's entry is live, the expired one is not the one just ahead of it.
    let (mut behind, _) = kafkakit_ttl(&path, "120s", "200", "kk-behind", "WAITING").await;
    holder.release().await;
    let lease = waiting
        .await
        .unwrap()
        .expect("acquires once the kafka-kit holder leaves");
    assert_eq!(behind.has_event().await, None, "kafka-kit took a held lock");
    backend.release(&lease).await.expect("release");
    acquires(behind).await;
}

// ---------------------------------------------------------------------------------
// Kubernetes Lease: client-go leader election

fn leader(ns: &str, lease: &str, identity: &str, extra: &[&str]) -> Foreign {
    let kubeconfig = ControlPlane::shared()
        .kubeconfig_path()
        .display()
        .to_string();
    let mut args = vec![
        "--kubeconfig",
        &kubeconfig,
        "--namespace",
        ns,
        "--name",
        lease,
        "--identity",
        identity,
        "--lease",
        "4s",
        "--renew",
        "3s",
        "--retry",
        "500ms",
    ];
    args.extend_from_slice(extra);
    Foreign::spawn("leader", &args)
}

/// A Lease in a new namespace (`prefix-…`): its namespace, name and URL, and the
/// options that reach it.
async fn lease_key(prefix: &str) -> (String, String, String, ConnectOptions) {
    let plane = ControlPlane::shared();
    let client = plane.client().await;
    let ns = plane.namespace(&client, prefix).await;
    let name = unique("lease");
    let url = format!("k8s://{ns}/{name}");
    let options = ConnectOptions {
        kubernetes: KubernetesOptions {
            client: Some(client),
            ..Default::default()
        },
        ..Default::default()
    };
    (ns, name, url, options)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_go_leader_and_lockwarden_exclude_each_other_on_a_lease() {
    let (ns, name, url, options) = lease_key("interop-lease").await;

    // client-go leads: lockwarden sees it held and does not acquire.
    let (mut elector, _) = holding(leader(&ns, &name, "go-leader-1", &[])).await;
    let backend = engine(&url, &options).await;
    assert_seen_held(backend.as_ref(), &url, "go-leader-1").await;
    elector.release().await;
    let held = HeldLock::acquire(
        backend.clone(),
        &request("lockwarden-engine", Duration::from_secs(4)),
        Wait::For(TIMEOUT),
    )
    .await
    .expect("acquires after client-go released");

    // lockwarden holds: client-go cannot lead, over several of its lease durations.
    let refused = leader(&ns, &name, "go-leader-2", &["--wait", "10s"]);
    times_out(refused, "lockwarden holds").await;
    assert!(held.is_held(), "{:?}", held.state());
    let waiting = leader(&ns, &name, "go-leader-3", &[]);
    gets_it_after(waiting, held, "lockwarden holds").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_waits_for_a_client_go_leader_and_then_sets_the_permits() {
    let (ns, name, url, _) = lease_key("interop-lease").await;
    let (elector, _) = holding(leader(&ns, &name, "go-leader-permits", &[])).await;
    Cli::kube()
        .assert_permits_wait_for(&url, elector, "go-leader-permits")
        .await;
}

/// client-go reads a Lease holding a holder set by its `holderIdentity` (the holders'
/// names): it cannot lead while anyone holds a permit, and leads once all let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_go_cannot_lead_a_lease_that_holds_permits() {
    let (ns, name, url, options) = lease_key("interop-lease").await;
    let [first, second] = hold_two_permits(&url, &options, Duration::from_secs(4)).await;
    let refused = leader(&ns, &name, "go-leader-1", &["--wait", "10s"]);
    times_out(refused, "two permits are held").await;
    first.release().await.expect("release");
    let refused = leader(&ns, &name, "go-leader-2", &["--wait", "6s"]);
    times_out(refused, "one permit is still held").await;
    second.release().await.expect("release");
    acquires(leader(&ns, &name, "go-leader-3", &[])).await;
}

/// A `DistributedLock` held by the in-process controller and a client-go elector on
/// the same Lease, handing it back and forth. Each side keeps a marker file while it
/// holds (created after acquiring, removed before releasing): creating it while the
/// other's exists would mean both held at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_distributed_lock_and_a_client_go_elector_never_both_hold_the_lease() {
    const ROUNDS: usize = 4;
    let (client, ns) = support::kube::namespace_with_controller("interop-ha", "interop").await;
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), &ns);
    let leases: Api<KubeLease> = Api::namespaced(client.clone(), &ns);
    let lease_name = "shared-lease";
    let markers = tempfile::tempdir().expect("temp dir");
    let marker = markers.path().join("holder");

    let mut elector: Option<Foreign> = None;
    let mut go_rounds = 0;
    let mut done = false;
    let mut ours = 0;
    while ours < ROUNDS {
        let name = format!("dlock-{ours}");
        locks
            .create(
                &PostParams::default(),
                &lease_lock_timed(&name, lease_name, "4s", "1s"),
            )
            .await
            .expect("create DistributedLock");
        let held = eventually(&format!("{name} to be Acquired"), TIMEOUT, || async {
            locks.get(&name).await.ok().filter(|l| {
                l.status
                    .as_ref()
                    .is_some_and(|s| conditions::is_true(&s.conditions, ACQUIRED))
            })
        })
        .await;
        claim(&marker, &format!("lockwarden {name}"));
        if elector.is_none() {
            // Started while lockwarden holds: the first handover is lockwarden → client-go.
            elector = Some(leader(
                &ns,
                lease_name,
                "go-elector",
                &[
                    "--rounds",
                    &ROUNDS.to_string(),
                    "--hold",
                    "1500ms",
                    "--marker",
                    &marker.display().to_string(),
                ],
            ));
        }
        let elector = elector.as_mut().expect("started");
        let lease = leases.get(lease_name).await.expect("Lease");
        assert_eq!(
            lease.spec.and_then(|s| s.holder_identity),
            held.status.and_then(|s| s.holder),
            "the Lease names the DistributedLock's holder"
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
        std::fs::remove_file(&marker).expect("remove our marker");
        locks
            .delete(&name, &DeleteParams::default())
            .await
            .expect("delete DistributedLock");
        eventually(
            &format!("{name} to be gone (released)"),
            TIMEOUT,
            || async {
                locks
                    .get_opt(&name)
                    .await
                    .ok()
                    .flatten()
                    .is_none()
                    .then_some(())
            },
        )
        .await;
        ours += 1;
        // The elector gets its turn in between (or overlapped attempts show up here).
        while let Some(line) = elector.has_event().await {
            eprintln!("[elector] {line}");
            done |= elector_event(&line, &mut go_rounds);
        }
    }
    let mut elector = elector.expect("started");
    while !done {
        done = elector_event(&elector.next().await, &mut go_rounds);
    }
    assert_eq!(go_rounds, ROUNDS, "every elector round led once");
    elector.send("quit").await;
}

/// One event of the elector: never an overlap nor a lost Lease; counts its rounds.
/// Whether it is done.
fn elector_event(line: &str, go_rounds: &mut usize) -> bool {
    assert!(!line.starts_with("OVERLAP"), "both held the Lease: {line}");
    assert!(
        !line.starts_with("LOST"),
        "the elector lost the Lease: {line}"
    );
    if line.starts_with("ACQUIRED") {
        *go_rounds += 1;
    }
    line == "DONE"
}

/// Creates the holder marker, which must not exist: if it does, the other side holds.
fn claim(marker: &Path, who: &str) {
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(marker)
    {
        Ok(_) => {}
        Err(e) => {
            let other = std::fs::read_to_string(marker).unwrap_or_default();
            panic!(
                "{who} acquired while {} holds the Lease ({e})",
                other.trim()
            );
        }
    }
}

// ---------------------------------------------------------------------------------
// Queues (docs/design.md §6.4): with lockwarden waiters queued, a release hands the key
// to the head; the other tools wait until the queue drains, then take the key.

/// A queued lock with a 12 s lease. With 6 s, a renewal had 1.5 s (a quarter of the
/// lease) for its write, and behind a moto shared with three other test binaries on a
/// loaded machine three renewals in a row took longer, so the holder's entry expired
/// and the waiter took it (a suite run, 2026-12-06).
fn queued_request(holder: &str) -> AcquireRequest {
    AcquireRequest {
        queue: Some(Queueing::default()),
        ..request(holder, QUEUED_LEASE)
    }
}

const QUEUED_LEASE: Duration = Duration::from_secs(12);

/// A queued lockwarden holder (renewed in the background) and a queued lockwarden
/// waiter, registered, waiting in a task of its own.
async fn holder_and_queued_waiter(
    url: &str,
    options: &ConnectOptions,
) -> (HeldLock, tokio::task::JoinHandle<HeldLock>) {
    // The engine's warnings (a renewal not confirmed by the holder deadline) in the
    // output of a test that fails.
    support::kube::test_logs();
    let holder = HeldLock::acquire(
        engine(url, options).await,
        &queued_request("lockwarden-holder"),
        Wait::No,
    )
    .await
    .expect("a queued holder of a free key");
    let backend = engine(url, options).await;
    let waiter = {
        let backend = backend.clone();
        tokio::spawn(async move {
            HeldLock::acquire(
                backend,
                &queued_request("lockwarden-waiter"),
                Wait::For(TIMEOUT),
            )
            .await
            .expect("the queued waiter is granted")
        })
    };
    eventually("the lockwarden waiter to register", TIMEOUT, || async {
        let Ok(Some(Stored { record: Ok(r), .. })) = backend.inspect().await else {
            return None;
        };
        let queue = r.set?.queue?;
        queue
            .waiters
            .iter()
            .any(|w| w.holder == "lockwarden-waiter")
            .then_some(())
    })
    .await;
    (holder, waiter)
}

/// Releases the queued holder `held` of `url`. Should it fail, the panic shows the
/// record as the store now has it: its holder, state, queue and history say who wrote
/// last (a run once failed here with `NotHeld` and nothing else to go on).
async fn release_the_queued_holder(held: HeldLock, url: &str, options: &ConnectOptions) {
    if let Err(e) = held.release().await {
        let record = engine(url, options).await.inspect().await;
        panic!("release of the queued holder: {e}; the record now: {record:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamolock_waits_while_lockwarden_waiters_queue_and_acquires_once_the_queue_drains() {
    let (table, key, url) = dynamo_key().await;
    let (holder, waiter) = holder_and_queued_waiter(&url, &aws_options(false)).await;
    // Past the holder's lease (QUEUED_LEASE): its renewals and the waiter's refreshes
    // keep writing new versions.
    times_out(dynamolock(&table, &key, "d1", "14s"), "lockwarden holds").await;
    release_the_queued_holder(holder, &url, &aws_options(false)).await;
    let next = waiter.await.expect("the waiter's task");
    let dynamolock_now = |owner: &str| dynamolock(&table, &key, owner, "0s");
    refused_until_released(
        dynamolock_now,
        next,
        "the release went to the head, not to dynamolock",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3lock_waits_while_lockwarden_waiters_queue() {
    let (bucket, key, url) = s3_key().await;
    let (holder, waiter) = holder_and_queued_waiter(&url, &aws_options(false)).await;
    times_out(s3lock(&bucket, &key, "3s"), "lockwarden holds").await;
    release_the_queued_holder(holder, &url, &aws_options(false)).await;
    let next = waiter.await.expect("the waiter's task");
    assert_ne!(s3lock(&bucket, &key, "0s").exit_code().await, 0);
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_go_waits_while_lockwarden_waiters_queue_and_leads_once_the_queue_drains() {
    let (ns, name, url, options) = lease_key("interop-lease").await;
    let (holder, waiter) = holder_and_queued_waiter(&url, &options).await;
    // Over several of its lease durations (4 s).
    let refused = leader(&ns, &name, "go-refused", &["--wait", "10s"]);
    times_out(refused, "lockwarden holds").await;
    let waiting = leader(&ns, &name, "go-waiting", &[]);
    release_the_queued_holder(holder, &url, &options).await;
    let next = waiter.await.expect("the waiter's task");
    assert!(next.is_held(), "{:?}", next.state());
    gets_it_after(waiting, next, "client-go led beside the head").await;
}

/// On ZooKeeper the queue is the entries' order: a queued lockwarden waiter between a
/// kafka-kit holder and a later kafka-kit waiter is granted in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_kit_and_a_queued_lockwarden_waiter_keep_the_entries_order() {
    let path = format!("/{}", unique("interop-kk-queue"));
    let (mut first, _) = kafkakit_until(&path, "0s", &[], "ACQUIRED").await;
    let backend = zk_engine(&path);
    // Told once lockwarden's entry has queued (its first busy attempt).
    let (queued, mut queued_rx) = tokio::sync::mpsc::unbounded_channel();
    let ours = {
        let backend = backend.clone();
        tokio::spawn(async move {
            lockwarden::lock::acquire_with_progress(
                backend.as_ref(),
                &queued_request("lockwarden"),
                Wait::For(TIMEOUT),
                move |_, position| {
                    let _ = queued.send(position);
                },
            )
            .await
        })
    };
    let position = tokio::time::timeout(TIMEOUT, queued_rx.recv())
        .await
        .expect("lockwarden queued in time")
        .expect("a position");
    assert_eq!(position, Some(0), "behind kafka-kit's holder");
    let (mut later, _) = kafkakit_until(&path, "60s", &[], "WAITING").await;
    first.release().await;
    let lease = ours
        .await
        .unwrap()
        .expect("lockwarden is next in the entries' order");
    assert_eq!(
        later.has_event().await,
        None,
        "kafka-kit took the key out of order"
    );
    backend.release(&lease).await.expect("release");
    acquires(later).await;
}

// ---------------------------------------------------------------------------------
// Taking turns with a tool that polls (docs/design.md §6.4, "Sharing a key with a tool
// that polls"): 3 workers of the tool and 3 lockwarden workers on one key, each
// taking it SECTIONS times; before (lockwarden takes a freed key at once) and after
// (`yield_to_pollers`, what `--shared-with TOOL` sets).

/// Sections per worker: 3 workers × 4 = 12 a side.
const SECTIONS: usize = 4;
/// How long each section holds the key.
const HOLD: Duration = Duration::from_millis(200);
/// A worker's wait for one section: it never runs out in a fair race (each section
/// waits behind at most a few of the other five workers' sections and hand-offs).
const SECTION_WAIT: Duration = Duration::from_secs(60);

/// One critical section as its worker saw it, in time since the race began: it asked
/// at `asked`, held the key from `got` (after the acquisition was confirmed) until
/// `left` (before its release was sent). The real hold contains [got, left], so
/// two logged sections that overlap prove a real overlap.
#[derive(Clone, Debug)]
struct Section {
    who: String,
    tool: bool,
    asked: Duration,
    got: Duration,
    left: Duration,
}

impl Section {
    fn waited(&self) -> Duration {
        self.got - self.asked
    }
}

/// What a race measured for one side.
#[derive(Debug)]
struct Side {
    sections: usize,
    longest_wait: Duration,
}

fn side(sections: &[Section], tool: bool) -> Side {
    let mine: Vec<_> = sections.iter().filter(|s| s.tool == tool).collect();
    Side {
        sections: mine.len(),
        longest_wait: mine.iter().map(|s| s.waited()).max().unwrap_or_default(),
    }
}

/// Runs the race: `tool(worker)` spawns one waiting client of the tool (its section
/// begins at its `ACQUIRED` and ends with `release`); lockwarden's workers use the
/// engine on `url`, each a contender of its own (as separate processes are), with
/// `yield_to` as the request's yield. Asserts that no two sections overlapped and that
/// every worker finished all its sections; returns them in order.
async fn take_turns(
    tool: Arc<dyn Fn(usize) -> Foreign + Send + Sync>,
    url: &str,
    options: &ConnectOptions,
    yield_to: Option<Duration>,
) -> Vec<Section> {
    let start = tokio::time::Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..3 {
        let tool = tool.clone();
        workers.spawn(async move {
            let mut sections = Vec::new();
            for _ in 0..SECTIONS {
                let asked = start.elapsed();
                let mut client = tool(worker);
                client.expect("ACQUIRED").await;
                let got = start.elapsed();
                tokio::time::sleep(HOLD).await;
                let left = start.elapsed();
                client.release().await;
                assert_eq!(client.exit_code().await, 0, "tool worker {worker}");
                sections.push(Section {
                    who: format!("tool-{worker}"),
                    tool: true,
                    asked,
                    got,
                    left,
                });
            }
            sections
        });
        let backend = engine(url, options).await;
        workers.spawn(async move {
            let holder = format!("lockwarden-{worker}");
            let req = AcquireRequest {
                yield_to_pollers: yield_to,
                ..request(&holder, Duration::from_secs(30))
            };
            let mut sections = Vec::new();
            for _ in 0..SECTIONS {
                let asked = start.elapsed();
                let lease = acquire(backend.as_ref(), &req, Wait::For(SECTION_WAIT))
                    .await
                    .unwrap_or_else(|e| panic!("{holder}: {e}"));
                let got = start.elapsed();
                tokio::time::sleep(HOLD).await;
                let left = start.elapsed();
                backend.release(&lease).await.expect("release");
                sections.push(Section {
                    who: holder.clone(),
                    tool: false,
                    asked,
                    got,
                    left,
                });
            }
            sections
        });
    }
    let mut sections = Vec::new();
    while let Some(done) = workers.join_next().await {
        sections.extend(done.expect("a worker finished all its sections"));
    }
    sections.sort_by_key(|s| s.got);
    for pair in sections.windows(2) {
        assert!(
            pair[1].got >= pair[0].left,
            "two holders at once: {} held until {:?}, {} from {:?}",
            pair[0].who,
            pair[0].left,
            pair[1].who,
            pair[1].got
        );
    }
    sections
}

/// The race before and after the yield: prints each side's longest wait and the order
/// of the sections; after, both sides finish and the tool's longest wait is at most
/// twice lockwarden's (the two alternate, so a waiter of either waits behind about as
/// many sections of the other).
async fn tool_and_lockwarden_take_turns(
    name: &str,
    tool: Arc<dyn Fn(usize) -> Foreign + Send + Sync>,
    url: &str,
    options: &ConnectOptions,
    window: Duration,
) {
    tool_and_lockwarden_take_turns_with(name, tool.clone(), tool, url, options, window).await
}

/// [`tool_and_lockwarden_take_turns`] with another client of the tool for the race
/// after the yield (one with a shorter wait of its own, which must not run out).
async fn tool_and_lockwarden_take_turns_with(
    name: &str,
    tool: Arc<dyn Fn(usize) -> Foreign + Send + Sync>,
    tool_after: Arc<dyn Fn(usize) -> Foreign + Send + Sync>,
    url: &str,
    options: &ConnectOptions,
    window: Duration,
) {
    let order = |sections: &[Section]| {
        sections
            .iter()
            .map(|s| if s.tool { "T" } else { "L" })
            .collect::<String>()
    };
    let before = take_turns(tool, url, options, None).await;
    let after = take_turns(tool_after, url, options, Some(window)).await;
    for (when, sections) in [("before", &before), ("after", &after)] {
        let (theirs, ours) = (side(sections, true), side(sections, false));
        println!(
            "[take turns] {name} {when}: {name} longest wait {:.2}s over {} sections, \
             lockwarden {:.2}s over {}; order {}",
            theirs.longest_wait.as_secs_f64(),
            theirs.sections,
            ours.longest_wait.as_secs_f64(),
            ours.sections,
            order(sections)
        );
    }
    let (theirs, ours) = (side(&after, true), side(&after, false));
    assert_eq!(
        (theirs.sections, ours.sections),
        (3 * SECTIONS, 3 * SECTIONS)
    );
    assert!(
        theirs.longest_wait <= ours.longest_wait * 2,
        "{name} waited {:?} at most, lockwarden {:?}: order {}",
        theirs.longest_wait,
        ours.longest_wait,
        order(&after)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamolock_and_lockwarden_take_turns_on_a_shared_key() {
    let (table, key, url) = dynamo_key().await;
    // The driver's clients poll every 200 ms (`WithRefreshPeriod`): what
    // `--shared-with dynamolock=200ms` says.
    let shared = lockwarden::backend::SharedWith {
        period: Duration::from_millis(200),
        ..lockwarden::backend::SharedWith::named("dynamolock").unwrap()
    };
    let wait = format!("{}s", SECTION_WAIT.as_secs());
    let (t, k) = (table.clone(), key.clone());
    let tool: Arc<dyn Fn(usize) -> Foreign + Send + Sync> =
        Arc::new(move |worker| dynamolock(&t, &k, &format!("dynamolock-{worker}"), &wait));
    // After the yield the tool's clients give up after three rounds of every worker's
    // hold (3 × 6 × 200 ms): a client that times out fails the race (the race
    // had one dynamolock waiter time out).
    let short_wait = format!("{}ms", (HOLD * 6 * 3).as_millis());
    let tool_after: Arc<dyn Fn(usize) -> Foreign + Send + Sync> = Arc::new(move |worker| {
        dynamolock(&table, &key, &format!("dynamolock-{worker}"), &short_wait)
    });
    tool_and_lockwarden_take_turns_with(
        "dynamolock",
        tool,
        tool_after,
        &url,
        &aws_options(false),
        shared.window(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3lock_and_lockwarden_take_turns_on_a_compatible_key() {
    let (bucket, key, url) = s3_key().await;
    // s3lock's own LockWaitInterval, 1 s: what `--shared-with s3lock` assumes.
    let shared = lockwarden::backend::SharedWith::named("s3lock").unwrap();
    let tool: Arc<dyn Fn(usize) -> Foreign + Send + Sync> = Arc::new(move |_| {
        Foreign::spawn(
            "s3lock",
            &[
                "--endpoint",
                &Moto::shared().endpoint(),
                "--bucket",
                &bucket,
                "--key",
                &key,
                "--wait",
                "60s",
                "--interval",
                "1s",
            ],
        )
    });
    // The window plus an allowance for a poll that comes late: each s3lock section is a
    // new Go process polling every second, and with the whole suite beside it on two
    // cores its poll can come more than the window's quarter-period margin late, which
    // hands the freed key back to lockwarden for a whole round (a suite run: s3lock waited
    // 8.35 s against lockwarden's 3.68 s, as long as without the yield, 8.30 s). What
    // is tested is that a window the tool's poll falls in gives the tool its turn; the
    // default's figure is measured on a quiet machine (docs/design.md §6.4).
    let window = shared.window() + S3LOCK_LATE_POLL;
    tool_and_lockwarden_take_turns("s3lock", tool, &url, &aws_options(true), window).await;
}

/// How late an s3lock poll may come on the loaded test host, beyond the window.
const S3LOCK_LATE_POLL: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------------
// Once per run (docs/design.md §6.7): a key with a memory of completed runs, next to
// each tool. The tools see it free or held exactly as without one, and a tool's write
// keeps the memory or loses it — never invents a run.

/// A grant and a release that records run `run` on the key; the fence it ran with.
async fn record_run(backend: &dyn LockBackend, run: &str) -> u64 {
    use lockwarden::lock::{CompletedRun, RunKey};
    let lease = lockwarden_acquires(backend, Wait::For(TIMEOUT), "acquire to run").await;
    let run = RunKey::new(run).unwrap();
    let done = CompletedRun::now(&run, lease.fence(), "lockwarden", Some("east"));
    backend
        .release_completed(&lease, done, 64)
        .await
        .expect("a release recording the run");
    lease.fence().0
}

/// The runs lockwarden's next grant finds remembered, with their fences.
async fn remembered(backend: &dyn LockBackend) -> Vec<(String, u64)> {
    let lease = lockwarden_acquires(backend, Wait::For(TIMEOUT), "acquire to look").await;
    let runs = backend.completed_runs(&lease).await.expect("the memory");
    backend.release(&lease).await.expect("release");
    runs.runs.into_iter().map(|r| (r.run, r.fence.0)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_dynamolock_takes_a_key_with_a_memory_as_free_and_keeps_the_memory() {
    let (table, key, url) = dynamo_key().await;
    let backend = engine(&url, &aws_options(false)).await;
    let fence = record_run(backend.as_ref(), "r1").await;
    // dynamolock sees the released key free, takes it and lets go: it copies the
    // attributes it does not know, so the memory stays, and nothing is added to it.
    acquires(dynamolock(&table, &key, &unique("dynamolock-owner"), "0s")).await;
    assert_eq!(
        remembered(backend.as_ref()).await,
        [("r1".to_string(), fence)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_client_go_leads_a_lease_with_a_memory_and_keeps_the_memory() {
    let (ns, name, url, options) = lease_key("interop-once").await;
    let backend = engine(&url, &options).await;
    let fence = record_run(backend.as_ref(), "r1").await;
    // client-go leads the released Lease and steps down: it carries annotations it does
    // not know through its updates, so the memory stays.
    let (mut elector, _) = holding(leader(&ns, &name, "go-leader-once", &[])).await;
    elector.release().await;
    assert_eq!(
        remembered(backend.as_ref()).await,
        [("r1".to_string(), fence)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_kafka_kit_locks_a_path_with_a_memory_and_leaves_the_memory() {
    let path = format!("/{}", unique("interop-kk-once"));
    let backend = zk_engine(&path);
    let fence = record_run(backend.as_ref(), "r1").await;
    // The memory lives beside the lock path, not among the entries kafka-kit reads:
    // kafka-kit locks at once and unlocks; the memory stays.
    let (mut holder, _) = kafkakit_until(&path, "0s", &[], "ACQUIRED").await;
    holder.release().await;
    assert_eq!(
        remembered(backend.as_ref()).await,
        [("r1".to_string(), fence)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_s3lock_sees_a_key_with_a_memory_as_it_sees_any_released_key() {
    let (bucket, key, url) = s3_key().await;
    let backend = engine(&url, &aws_options(false)).await;
    let fence = record_run(backend.as_ref(), "r1").await;
    // A released key stays an object (not --s3lock-compatible): s3lock reads any
    // object as held, with a memory or without; it writes nothing.
    refused(s3lock(&bucket, &key, "0s"), "the tombstone with a memory").await;
    assert_eq!(
        remembered(backend.as_ref()).await,
        [("r1".to_string(), fence)]
    );
}

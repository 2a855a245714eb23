//! lockwarden beside the real `tofu` (OpenTofu; Terraform writes the same locks, but
//! its licence keeps it out of the build) on the tools' own state locks, S3's
//! `.tflock` object and DynamoDB's lock table (docs/design.md §6.8), on moto:
//!
//! - tofu's lock is seen (busy, named from its LockInfo, never expired by time),
//!   waited for, and shown by `status` and a DistributedLock;
//! - lockwarden's lock with `--terraform-compatible` is one tofu parses: `tofu plan`
//!   prints its holder, `tofu force-unlock ID` ends it and the holder reports the loss;
//! - 3 `tofu apply` loops and 3 `lockwarden run` loops on one state, on each store:
//!   every critical section alone (a shared register of start and end times), each
//!   side's longest wait printed;
//! - a `tofu` killed mid-apply keeps its lock until `--force`, whose warning says what
//!   `tofu force-unlock` would have done;
//! - examples/terraform-job.yaml, applied as written, driven to its promised state;
//! - bad input refused with nothing written.

use lockwarden_testsupport as support;

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::batch::v1::Job;
use kube::api::Api;
use lockwarden::api::{DistributedLock, LockPhase};
use lockwarden::backend::terraform::{LOCKWARDEN_OPERATION, LockInfo};
use support::cli::Cli;
use support::eventually;
use support::moto::Moto;
use support::tofu::{STATE_KEY, StateLock, Tofu};
use support::workloads::Workload;

const TIMEOUT: Duration = Duration::from_secs(120);
const CLUSTER: &str = "tf-test";

/// exit codes (docs/reference/cli.md): busy or a wait run out; a lock lost; bad flags.
const HELD: i32 = 3;
const LOST: i32 = 4;
const USAGE: i32 = 2;

async fn s3_state() -> Tofu {
    let bucket = Moto::shared().new_bucket("tf").await;
    Tofu::init(&bucket, StateLock::S3File).await
}

async fn dynamodb_state() -> Tofu {
    let moto = Moto::shared();
    let bucket = moto.new_bucket("tf").await;
    let table = moto.new_table("tflocks", "LockID").await;
    Tofu::init(&bucket, StateLock::DynamoDbTable(table)).await
}

/// The state lock as the store holds it now: the `LockInfo` (S3: the `.tflock` body;
/// DynamoDB: the item's `Info`), or `None` when there is no lock.
async fn lock_info(tofu: &Tofu) -> Option<LockInfo> {
    let moto = Moto::shared();
    let bytes: Vec<u8> = match &tofu.lock {
        StateLock::S3File => {
            let got = moto
                .s3_client()
                .await
                .get_object()
                .bucket(&tofu.bucket)
                .key(format!("{STATE_KEY}.tflock"))
                .send()
                .await
                .ok()?;
            got.body.collect().await.ok()?.into_bytes().to_vec()
        }
        StateLock::DynamoDbTable(table) => {
            let item = moto
                .dynamodb_client()
                .await
                .get_item()
                .table_name(table)
                .key(
                    "LockID",
                    aws_sdk_dynamodb::types::AttributeValue::S(format!(
                        "{}/{STATE_KEY}",
                        tofu.bucket
                    )),
                )
                .consistent_read(true)
                .send()
                .await
                .ok()?
                .item?;
            item.get("Info")?.as_s().ok()?.as_bytes().to_vec()
        }
    };
    Some(LockInfo::parse(&bytes, None).expect("the state lock is a LockInfo"))
}

/// Waits for the state lock to be held (by anyone).
async fn wait_lock_info(tofu: &Tofu) -> LockInfo {
    eventually("the state lock", TIMEOUT, || lock_info(tofu)).await
}

/// `lockwarden ARGS…` with this state's lock URL and flags after the subcommand.
fn on_state<'a>(
    tofu: &'a Tofu,
    url: &'a str,
    subcommand: &'a str,
    more: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![subcommand, url];
    args.extend(tofu.lock_flags());
    args.extend(more);
    args
}

/// A file the provisioner of an apply touches once tofu holds the lock and runs it.
fn started_file(tofu: &Tofu) -> std::path::PathBuf {
    tofu.path("started")
}

async fn wait_started(tofu: &Tofu) {
    let started = started_file(tofu);
    eventually("tofu's apply to run its provisioner", TIMEOUT, || async {
        started.exists().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tofus_lock_is_busy_named_and_waited_for_then_lockwarden_holds_the_state() {
    let tofu = s3_state().await;
    let url = tofu.lock_url();
    let lw = Cli::aws();
    let mut apply = tofu.spawn_apply("touch started; sleep 6", "0s");
    wait_started(&tofu).await;
    let theirs = wait_lock_info(&tofu).await;
    assert_eq!(theirs.operation, "OperationTypeApply");

    // Busy, named from the LockInfo; never expiring: status says what frees it.
    let out = lw.run(&on_state(&tofu, &url, "lock", &[])).await;
    out.code(HELD);
    for needle in ["apply by", &theirs.who, &theirs.id] {
        assert!(out.stderr.contains(needle), "{needle:?}: {out:#?}");
    }
    let status = lw
        .run(&on_state(&tofu, &url, "status", &["-o", "json"]))
        .await;
    let status: serde_json::Value = serde_json::from_str(&status.stdout).expect("status JSON");
    assert!(
        status["holder"]
            .as_str()
            .unwrap_or_default()
            .contains("tofu/terraform apply by"),
        "{status:#}"
    );
    assert!(
        status["freedBy"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!("tofu force-unlock {}", theirs.id)),
        "{status:#}"
    );
    assert!(status.get("noTakeoverBefore").is_none(), "{status:#}");

    // A waiter gets the key once the apply released it.
    let waiter = lw
        .command(&on_state(
            &tofu,
            &url,
            "lock",
            &["--wait", "90s", "--output", "state.lock"],
        ))
        .spawn()
        .unwrap();
    let applied = apply.wait().await.expect("tofu apply");
    assert!(applied.success(), "tofu apply failed");
    let waited = waiter.wait_with_output().await.expect("the waiting lock");
    assert_eq!(waited.status.code(), Some(0), "{waited:#?}");
    let ours = wait_lock_info(&tofu).await;
    assert_eq!(ours.operation, LOCKWARDEN_OPERATION);
    // A tofu run now waits for lockwarden's holder, and names it.
    let plan = tofu
        .run(&["plan", "-input=false", "-lock-timeout=0s"])
        .await;
    assert!(!plan.status.success());
    let text = Tofu::text(&plan);
    assert!(text.contains("Error acquiring the state lock"), "{text}");
    assert!(text.contains(&format!("ID:        {}", ours.id)), "{text}");
    lw.run(&["unlock", "state.lock"]).await.ok();
    assert!(
        lock_info(&tofu).await.is_none(),
        "unlock deletes the state lock"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tofu_prints_lockwardens_lock_and_its_force_unlock_ends_the_hold() {
    let tofu = s3_state().await;
    let url = tofu.lock_url();
    let lw = Cli::aws();
    let mut run = lw
        .command(&on_state(
            &tofu,
            &url,
            "run",
            &[
                "--holder",
                "ops/apply@eu-1",
                "--lease",
                "6s",
                "--",
                "sleep",
                "300",
            ],
        ))
        .spawn()
        .unwrap();
    let ours = wait_lock_info(&tofu).await;
    assert_eq!(
        (ours.operation.as_str(), ours.who.as_str()),
        (LOCKWARDEN_OPERATION, "ops/apply@eu-1")
    );
    let plan = tofu
        .run(&["plan", "-input=false", "-lock-timeout=0s"])
        .await;
    assert!(!plan.status.success());
    let text = Tofu::text(&plan);
    for needle in [
        "Error acquiring the state lock",
        "Operation: lockwarden",
        "Who:       ops/apply@eu-1",
        "(fence 1)",
        &format!("ID:        {}", ours.id),
    ] {
        assert!(text.contains(needle), "{needle:?}: {text}");
    }
    // The tool's own way out ends lockwarden's hold: the holder finds its lock gone at
    // its next renewal (every 2 s: a third of the lease) and reports the loss.
    let unlocked = tofu.run(&["force-unlock", "-force", &ours.id]).await;
    assert!(unlocked.status.success(), "{}", Tofu::text(&unlocked));
    let unlocked_at = Instant::now();
    let ended = tokio::time::timeout(TIMEOUT, run.wait())
        .await
        .expect("lockwarden run to notice")
        .unwrap();
    println!(
        "[terraform] lockwarden run reported the loss {:.1?} after tofu force-unlock (renew interval 2 s)",
        unlocked_at.elapsed()
    );
    assert_eq!(ended.code(), Some(LOST));
    assert!(
        unlocked_at.elapsed() < Duration::from_secs(30),
        "the loss took {:?}",
        unlocked_at.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tofu_killed_mid_apply_keeps_its_lock_until_force() {
    let tofu = s3_state().await;
    let url = tofu.lock_url();
    let lw = Cli::aws();
    let apply = tofu.spawn_apply("touch started; sleep 300", "0s");
    wait_started(&tofu).await;
    let theirs = wait_lock_info(&tofu).await;
    // SIGKILL to tofu and its provisioner: nothing releases the lock.
    let group = apply.id().expect("tofu's pid") as i32;
    // SAFETY: kill(2) of the process group this test started.
    assert_eq!(unsafe { libc::kill(-group, libc::SIGKILL) }, 0);
    drop(apply);
    let out = lw
        .run(&on_state(&tofu, &url, "lock", &["--wait", "4s"]))
        .await;
    out.code(HELD);
    assert!(out.stderr.contains(&theirs.id), "{out:#?}");
    assert_eq!(
        lock_info(&tofu).await,
        Some(theirs.clone()),
        "never taken over by time"
    );
    let forced = lw
        .run(&on_state(
            &tofu,
            &url,
            "lock",
            &["--force", "--output", "state.lock"],
        ))
        .await;
    forced.ok();
    assert!(
        forced
            .stderr
            .contains(&format!("tofu force-unlock {}", theirs.id)),
        "{forced:#?}"
    );
    assert_eq!(wait_lock_info(&tofu).await.operation, LOCKWARDEN_OPERATION);
    lw.run(&["unlock", "state.lock"]).await.ok();
}

/// One critical section as the register saw it.
#[derive(Debug)]
struct Section {
    who: String,
    asked: u128,
    start: u128,
    end: u128,
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// The shell command of one section: its start and end, with the time in ns, in the
/// register.
fn section_command(who: &str, register: &Path) -> String {
    let reg = register.display();
    format!(
        "echo \"{who} start $(date +%s%N)\" >> {reg}; sleep 0.3; echo \"{who} end $(date +%s%N)\" >> {reg}"
    )
}

/// Sections per worker.
const SECTIONS: usize = 5;

/// 3 `tofu apply` loops and 3 `lockwarden run` loops, [`SECTIONS`] each, on the state
/// lock of `tofus` (three working directories of one configuration): no two sections
/// overlap, everyone finishes, and each side's longest wait is printed.
async fn take_turns(tofus: Vec<Tofu>) {
    // Its own directory: each working directory goes with its worker.
    let register_dir = tempfile::tempdir().expect("a directory for the register");
    let register = register_dir.path().join("register");
    let url = tofus[0].lock_url();
    let mut workers = tokio::task::JoinSet::new();
    let started = Instant::now();
    for (i, tofu) in tofus.into_iter().enumerate() {
        let flags = tofu.lock_flags();
        let command = section_command(&format!("tofu-{i}"), &register);
        workers.spawn(async move {
            let mut asked = Vec::new();
            let (mut lost_reads, mut resent_releases) = (0, 0);
            for _ in 0..SECTIONS {
                asked.push(now_ns());
                loop {
                    let out = tofu
                        .spawn_apply(&command, "180s")
                        .wait_with_output()
                        .await
                        .expect("tofu apply");
                    if out.status.success() {
                        break;
                    }
                    let text = Tofu::text(&out);
                    // tofu's own race: its create is refused (412), and the lock it then
                    // reads to print is gone (404) because its holder let go meanwhile;
                    // tofu gives up instead of retrying. A CI job would run it again.
                    if text.contains("Error acquiring the state lock") && lost_read(&text) {
                        lost_reads += 1;
                        continue;
                    }
                    // Its section ran; only tofu's report of its release failed.
                    if resent_release(&tofu, &text) {
                        resent_releases += 1;
                        break;
                    }
                    panic!(
                        "tofu-{i}: {text}\ntofu's DynamoDB requests (its debug log):\n{}",
                        tofu.requests_of("DynamoDB/").join("\n")
                    );
                }
            }
            if lost_reads > 0 {
                println!("[terraform] tofu-{i}: {lost_reads} applies gave up on a lock released between tofu's create and its read");
            }
            if resent_releases > 0 {
                println!("[terraform] tofu-{i}: {resent_releases} applies reported a failed release: their SDK re-sent the DeleteItem, whose condition found the lock already gone");
            }
            (format!("tofu-{i}"), asked)
        });
        let (register, url) = (register.clone(), url.clone());
        workers.spawn(async move {
            let who = format!("lockwarden-{i}");
            let command = section_command(&who, &register);
            let lw = Cli::aws();
            let mut asked = Vec::new();
            for _ in 0..SECTIONS {
                asked.push(now_ns());
                let mut args = vec!["run", url.as_str()];
                args.extend(flags.iter().copied());
                args.extend([
                    "--holder", &who, "--wait", "180s", "--", "sh", "-c", &command,
                ]);
                let out = lw.run_within(Duration::from_secs(240), &args).await;
                assert_eq!(out.code, 0, "{who}: {out:#?}");
            }
            (who, asked)
        });
    }
    let mut asked = std::collections::HashMap::new();
    while let Some(done) = workers.join_next().await {
        let (who, times) = done.expect("a worker finished all its sections");
        asked.insert(who, times);
    }
    let sections = read_register(&register, &asked);
    assert_eq!(sections.len(), 6 * SECTIONS, "{sections:#?}");
    for pair in sections.windows(2) {
        assert!(
            pair[1].start >= pair[0].end,
            "two holders at once: {} until {}, {} from {}",
            pair[0].who,
            pair[0].end,
            pair[1].who,
            pair[1].start
        );
    }
    let longest = |prefix: &str| {
        sections
            .iter()
            .filter(|s| s.who.starts_with(prefix))
            .map(|s| Duration::from_nanos((s.start - s.asked) as u64))
            .max()
            .unwrap()
    };
    let order: String = sections
        .iter()
        .map(|s| if s.who.starts_with("tofu") { 'T' } else { 'L' })
        .collect();
    println!(
        "[terraform] {url}: {} sections in {:.1?}, no overlap; longest wait: tofu {:.2?}, \
         lockwarden {:.2?}; order {order}",
        sections.len(),
        started.elapsed(),
        longest("tofu"),
        longest("lockwarden"),
    );
}

/// Whether tofu's lock failure is its read of a lock that was released after its create
/// was refused (S3: `NoSuchKey`; DynamoDB: no item, so no lock info).
fn lost_read(text: &str) -> bool {
    text.contains("NoSuchKey") || text.contains("no lock info found")
}

/// tofu's other race, its own SDK's: the release's `DeleteItem` (conditioned on tofu's
/// `Info`) is sent again (`attempt=2` or later in its debug log) when the reply to the
/// first was not received, the first having deleted the lock. The re-sent delete's
/// condition then fails (the lock is gone, or is the next holder's — which the condition
/// rightly keeps), and tofu reports its release as failed. Its section ran; the
/// register checks that no two overlapped.
fn resent_release(tofu: &Tofu, text: &str) -> bool {
    text.contains("Error releasing the state lock")
        && text.contains("ConditionalCheckFailedException")
        && tofu.requests_of("DynamoDB/DeleteItem").iter().any(|l| {
            l.contains("HTTP Request Sent")
                && l.contains("amz_sdk_request=\"attempt=")
                && !l.contains("amz_sdk_request=\"attempt=1;")
        })
}

/// The sections the register recorded, each with when its worker asked for it, in
/// order of their start.
fn read_register(
    register: &Path,
    asked: &std::collections::HashMap<String, Vec<u128>>,
) -> Vec<Section> {
    let text = std::fs::read_to_string(register).expect("the register");
    let mut open: std::collections::HashMap<String, u128> = Default::default();
    let mut count: std::collections::HashMap<String, usize> = Default::default();
    let mut sections = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(who), Some(what), Some(at)) = (words.next(), words.next(), words.next()) else {
            panic!("a register line {line:?}");
        };
        let at: u128 = at.parse().expect("a time in ns");
        match what {
            "start" => {
                assert!(
                    open.insert(who.to_string(), at).is_none(),
                    "{who} started twice"
                );
            }
            "end" => {
                let start = open.remove(who).expect("an end after its start");
                let n = count.entry(who.to_string()).or_default();
                sections.push(Section {
                    who: who.to_string(),
                    asked: asked[who][*n],
                    start,
                    end: at,
                });
                *n += 1;
            }
            other => panic!("a register line {other:?}"),
        }
    }
    sections.sort_by_key(|s| s.start);
    sections
}

async fn three_of(state: &Tofu) -> Vec<Tofu> {
    let mut tofus = Vec::new();
    for _ in 0..3 {
        tofus.push(Tofu::init(&state.bucket, state.lock.clone()).await);
    }
    tofus
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_tofu_applies_and_three_lockwarden_runs_take_turns_on_the_s3_lock_file() {
    let state = s3_state().await;
    take_turns(three_of(&state).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_tofu_applies_and_three_lockwarden_runs_take_turns_on_the_dynamodb_lock_table() {
    let state = dynamodb_state().await;
    take_turns(three_of(&state).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_lock_bad_input_is_refused_and_nothing_is_written() {
    let tofu = s3_state().await;
    let url = tofu.lock_url();
    let lw = Cli::aws();
    let s3 = Moto::shared().s3_client().await;
    let key = format!("{STATE_KEY}.tflock");
    let put = |body: &'static str| {
        let (s3, bucket, key) = (s3.clone(), tofu.bucket.clone(), key.clone());
        async move {
            s3.put_object()
                .bucket(bucket)
                .key(key)
                .content_type("application/json")
                .body(body.as_bytes().to_vec().into())
                .send()
                .await
                .expect("put the lock object");
        }
    };
    let body = || async {
        let got = s3
            .get_object()
            .bucket(&tofu.bucket)
            .key(&key)
            .send()
            .await
            .ok()?;
        Some(got.body.collect().await.ok()?.into_bytes().to_vec())
    };
    for (what, stored, needle) in [
        (
            "not LockInfo JSON",
            "held by someone",
            "not a Terraform/OpenTofu lock",
        ),
        (
            "another state's lock",
            r#"{"ID":"x-1","Operation":"OperationTypeApply","Who":"w","Path":"b/other.tfstate"}"#,
            "another state",
        ),
    ] {
        put(stored).await;
        let out = lw.run(&on_state(&tofu, &url, "lock", &[])).await;
        assert_ne!(out.code, 0, "{what}: {out:#?}");
        assert!(out.stderr.contains(needle), "{what}: {out:#?}");
        assert_eq!(
            body().await.as_deref(),
            Some(stored.as_bytes()),
            "{what}: written"
        );
    }
    s3.delete_object()
        .bucket(&tofu.bucket)
        .key(&key)
        .send()
        .await
        .unwrap();
    // A plain lock on a state lock's key would be one the tools cannot read.
    let out = lw.run(&["lock", &url, "--path-style"]).await;
    assert_ne!(out.code, 0, "{out:#?}");
    assert!(out.stderr.contains("--terraform-compatible"), "{out:#?}");
    assert_eq!(body().await, None, "nothing written");
    // The flag where it has no meaning, or with what it cannot do: usage errors.
    let table_url = format!("dynamodb://tflocks/{}/{STATE_KEY}", tofu.bucket);
    let plain_key = format!("s3://{}/{STATE_KEY}", tofu.bucket);
    for (args, needle) in [
        (
            vec!["lock", "zk://127.0.0.1:2181/x", "--terraform-compatible"],
            "not on zk://",
        ),
        (
            vec!["lock", "k8s://ns/x", "--terraform-compatible"],
            "not on k8s://",
        ),
        (
            vec!["lock", &plain_key, "--terraform-compatible"],
            "followed by .tflock",
        ),
        (
            vec!["lock", &table_url, "--terraform-compatible"],
            "--partition-key LockID",
        ),
        (
            vec!["lock", &url, "--terraform-compatible", "--queue"],
            "--queue",
        ),
        (
            vec!["lock", &url, "--terraform-compatible", "--permits", "2"],
            "--permits",
        ),
        (
            vec![
                "lock",
                &url,
                "--terraform-compatible",
                "--s3lock-compatible",
            ],
            "--s3lock-compatible",
        ),
    ] {
        let out = lw.run(&args).await;
        out.expect(USAGE, &["--terraform-compatible", needle], &args.join(" "));
    }
    assert_eq!(body().await, None, "nothing written");
}

/// A DistributedLock on the state lock waits while tofu holds it, naming tofu's holder,
/// then holds it as the tools' lock (its message says what that costs), and tofu
/// names its holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_distributed_lock_waits_for_tofu_then_holds_the_state_lock() {
    let tofu = s3_state().await;
    let (client, ns) = support::kube::namespace_with_controller("tf-lock", CLUSTER).await;
    let secret = support::locks::aws_secret(&client, &ns).await;
    let mut lock = support::locks::s3_lock(
        "prod-state",
        &tofu.bucket,
        &format!("{STATE_KEY}.tflock"),
        Moto::shared().endpoint(),
        &secret.name,
    );
    lock.spec.backend.s3.as_mut().unwrap().terraform_compatible = Some(true);
    let mut apply = tofu.spawn_apply("touch started; sleep 8", "0s");
    wait_started(&tofu).await;
    let theirs = wait_lock_info(&tofu).await;
    let locks = Api::<DistributedLock>::namespaced(client.clone(), &ns);
    support::kube::create(&locks, &lock).await;
    eventually(
        "prod-state Waiting, naming tofu's holder",
        TIMEOUT,
        || async {
            let lock = locks.get("prod-state").await.ok()?;
            let message = lock.acquired_condition()?.message.clone();
            (lock.status.as_ref()?.phase == Some(LockPhase::Waiting)
                && message.contains("tofu/terraform apply by")
                && message.contains(&theirs.id))
            .then_some(())
        },
    )
    .await;
    assert!(apply.wait().await.unwrap().success());
    let held = support::locks::wait_acquired(&locks, "prod-state", TIMEOUT).await;
    let message = held.acquired_condition().unwrap().message.clone();
    assert!(
        message.contains("held as a Terraform/OpenTofu state lock"),
        "{message}"
    );
    let holder = held.status.unwrap().holder.unwrap();
    let ours = wait_lock_info(&tofu).await;
    assert_eq!(ours.who, holder);
    let plan = tofu
        .run(&["plan", "-input=false", "-lock-timeout=0s"])
        .await;
    assert!(Tofu::text(&plan).contains(&format!("Who:       {holder}")));
    support::kube::delete(&locks, "prod-state").await;
    eventually("the state lock deleted on release", TIMEOUT, || async {
        lock_info(&tofu).await.is_none().then_some(())
    })
    .await;
}

/// examples/terraform-job.yaml as written (the local endpoint filled in): the Job runs
/// holding the state lock, tofu meanwhile names its holder, and once the Job completes
/// the lock is gone and tofu takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_terraform_job_example_runs_holding_the_state_lock() {
    let moto = Moto::shared();
    // The bucket the example names.
    let _ = moto
        .s3_client()
        .await
        .create_bucket()
        .bucket("tfstate")
        .send()
        .await;
    let tofu = Tofu::init("tfstate", StateLock::S3File).await;
    let (client, ns) = support::kube::namespace_with_controller("tf-example", CLUSTER).await;
    let text = std::fs::read_to_string(support::repo_root().join("examples/terraform-job.yaml"))
        .unwrap()
        .replace("${AWS_ENDPOINT_URL}", &moto.endpoint());
    let plane = support::kube::ControlPlane::shared();
    let out = support::kubectl::kubectl_as(
        plane,
        plane.kubeconfig_path(),
        &["apply", "-n", &ns, "-f", "-"],
        Some(&text),
    )
    .await;
    assert!(out.status.success(), "{}", support::kubectl::text(&out));
    let locks = Api::<DistributedLock>::namespaced(client.clone(), &ns);
    let jobs = Api::<Job>::namespaced(client.clone(), &ns);
    let lock = support::locks::wait_acquired(&locks, "prod-state", TIMEOUT).await;
    let message = lock.acquired_condition().unwrap().message.clone();
    assert!(
        message.contains("held as a Terraform/OpenTofu state lock"),
        "{message}"
    );
    Job::wait_started(&jobs, "apply-prod").await;
    let holder = lock.status.unwrap().holder.unwrap();
    assert_eq!(wait_lock_info(&tofu).await.who, holder);
    let plan = tofu
        .run(&["plan", "-input=false", "-lock-timeout=0s"])
        .await;
    assert!(!plan.status.success());
    assert!(Tofu::text(&plan).contains(&format!("Who:       {holder}")));
    support::kube::finish_pods(&client, &ns, "apply-prod", true).await;
    eventually(
        "the state lock deleted once the Job completed",
        TIMEOUT,
        || async { lock_info(&tofu).await.is_none().then_some(()) },
    )
    .await;
    let plan = tofu
        .run(&["plan", "-input=false", "-lock-timeout=30s"])
        .await;
    assert!(plan.status.success(), "{}", Tofu::text(&plan));
}

/// `terraformCompatible` exists on the S3 and DynamoDB parts of a spec only: on a
/// ZooKeeper or Lease lock `kubectl apply` (strict field validation, its default)
/// refuses it by name, and nothing is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terraform_compatible_on_zookeeper_or_a_lease_is_refused_by_kubectl() {
    let (client, ns) = support::kube::namespace_with_crd("tf-fields").await;
    let plane = support::kube::ControlPlane::shared();
    for (name, backend) in [
        (
            "on-zookeeper",
            r#"zookeeper: {servers: ["127.0.0.1:2181"], path: /locks/s, terraformCompatible: true}"#,
        ),
        (
            "on-a-lease",
            "kubernetes: {leaseName: s, terraformCompatible: true}",
        ),
    ] {
        let manifest = format!(
            "apiVersion: lockwarden.io/v1alpha1\nkind: DistributedLock\nmetadata: {{name: {name}}}\nspec:\n  backend:\n    {backend}\n"
        );
        let out = support::kubectl::kubectl_as(
            plane,
            plane.kubeconfig_path(),
            &["apply", "-n", &ns, "-f", "-"],
            Some(&manifest),
        )
        .await;
        let text = support::kubectl::text(&out);
        assert!(!out.status.success(), "{name}: {text}");
        assert!(
            text.contains("unknown field") && text.contains("terraformCompatible"),
            "{name}: {text}"
        );
        let locks = Api::<DistributedLock>::namespaced(client.clone(), &ns);
        assert!(
            locks.get_opt(name).await.unwrap().is_none(),
            "{name} created"
        );
    }
}

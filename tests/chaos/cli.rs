//! Command-line contenders: `lockwarden run`, and `lockwarden lock` + `unlock`
//! processes, fighting over the schedule's keys next to the engine clients and the
//! controllers (docs/safety.md, "Fault-injection harness").
//!
//! - `run URL -- bash -c …`: the command writes to the fenced register over one TCP
//!   connection to the harness (one line per write, carrying `LOCKWARDEN_FENCE` and
//!   `LOCKWARDEN_NONCE` from its environment), every 100 ms for its hold, then exits
//!   and `run` releases. A `run` that loses the lock must SIGTERM it before anyone
//!   else can take the lock: the harness applies each line to the register as it
//!   arrives, so a command still writing after a takeover shows up as a refused write
//!   or an overlapping claim.
//! - `lock URL` then `unlock FILE`: the harness, as the script around them, writes with
//!   the fence from the lock file only while the lease it asked for is surely still
//!   running (the holder deadline of rule 2, counted from before `lock` started), then
//!   unlocks — sometimes late, after the lease, when the key may be someone else's and
//!   `unlock` must leave it alone.
//!
//! - a guarded round (S3, DynamoDB, Leases): `run URL [--lock-delay D] -- lockwarden
//!   guard --url URL -- bash -c …`. `run` holds the key and renews; its command, the
//!   guard, gets the nonce and fence from `run`'s environment (what a gated Pod gets
//!   from its annotations), reads the record through proxies of its own and runs the
//!   same writer as `run`'s command. It must stop the writer by its own deadline
//!   whenever it cannot confirm the record still carries the nonce — the holder `run`
//!   SIGSTOPped alone (`cli-holder-sigstop`) or cut off, or the guard itself cut off.
//!   The guard logs its deadlines on CLOCK_MONOTONIC; the harness records the latest,
//!   and a guarded write that arrives after it is a violation (rule (g),
//!   docs/safety.md).
//!
//! Every process runs in a process group of its own, so the `cli-sigkill` fault kills a
//! `run` and its command together (a guard, its command and its holder too), as a
//! machine that dies would.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lockwarden::lock::SafetyMargins;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;

use super::history::{Claim, History, Kind};
use super::schedule::{Backend, LEASE};
use super::world::{Paths, world};
use crate::support::cli::{Cli, bin};
use crate::support::moto::REGION;

#[derive(Clone, Debug)]
pub struct CliSpec {
    pub slot: usize,
    pub start_after: Duration,
    /// How often a round is `lock` + `unlock` instead of `run`.
    pub lock_unlock_share: f64,
    /// How long each hold lasts.
    pub hold: (Duration, Duration),
    /// How often a round is a guarded one (0 on ZooKeeper, which the guard refuses).
    pub guarded_share: f64,
    /// Broken on purpose: `run`'s (or the guard's) command hands its writes to a daemon outside `run`'s
    /// process tree (the harness, asked over the register's socket), which `run`
    /// cannot stop (docs/design.md §3 rule 7, "what stays outside"): its writes
    /// outlive a lost lock, and only the fence refuses them.
    pub hands_writes_to_a_daemon: bool,
}

/// The lock on key `k` as CLI slot `slot` names it: URL, backend flags, environment.
pub struct CliTarget {
    pub key: String,
    pub url: String,
    pub flags: Vec<String>,
    pub cli: Cli,
    /// The guard's way to the store: its own proxies (S3, DynamoDB; a kubeconfig
    /// through its own API-server proxy for Leases).
    pub guard_flags: Vec<String>,
    pub guard_kubeconfig: Option<std::path::PathBuf>,
}

impl CliTarget {
    /// `key_url` is the key as the checker names it; on ZooKeeper the URL names the
    /// slot's own proxies instead, with `zk_path`.
    pub fn new(backend: Backend, slot: usize, key_url: &str, zk_path: &str) -> CliTarget {
        let slot = &world().clis[slot];
        let (url, flags, cli) = through(backend, &slot.paths, &slot.kubeconfig, key_url, zk_path);
        let (guard_flags, guard_kubeconfig) = match backend {
            Backend::ZooKeeper => (Vec::new(), None),
            Backend::Lease => (Vec::new(), Some(slot.guard_kubeconfig.clone())),
            Backend::S3 | Backend::DynamoDb => {
                let (_, flags, _) = through(
                    backend,
                    &slot.guard_paths,
                    &slot.guard_kubeconfig,
                    key_url,
                    zk_path,
                );
                (flags, None)
            }
        };
        CliTarget {
            key: key_url.to_string(),
            url,
            flags,
            cli,
            guard_flags,
            guard_kubeconfig,
        }
    }
}

/// The URL, flags and CLI that reach `key_url` through `paths`.
fn through(
    backend: Backend,
    paths: &Paths,
    kubeconfig: &std::path::Path,
    key_url: &str,
    zk_path: &str,
) -> (String, Vec<String>, Cli) {
    let mut flags = Vec::new();
    let mut cli = Cli::new();
    let url = match backend {
        Backend::Lease => {
            cli = cli.with("KUBECONFIG", kubeconfig.display().to_string());
            key_url.to_string()
        }
        Backend::S3 | Backend::DynamoDb => {
            flags.extend([
                "--endpoint".into(),
                paths.moto().endpoint(),
                "--region".into(),
                REGION.into(),
            ]);
            if backend == Backend::S3 {
                flags.push("--path-style".into());
            }
            key_url.to_string()
        }
        Backend::ZooKeeper => {
            flags.extend(["--session-timeout".into(), format!("{}s", LEASE.as_secs())]);
            format!("zk://{}{zk_path}", paths.zk_connect())
        }
    };
    (url, flags, cli)
}

/// The register's door for CLI commands: a loopback listener; each connection is one
/// command's writes, `w KEY-INDEX WHO NONCE FENCE SENT` per line (SENT: the wall
/// clock when it was written). A line
/// `d KEY-INDEX WHO NONCE FENCE N` asks the harness's daemon to make N such writes on
/// the command's behalf, every 100 ms, over a connection of its own.
pub async fn serve_register(
    keys: Vec<String>,
    history: Arc<History>,
    stop: Arc<AtomicBool>,
) -> (u16, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let mut connections = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            let Ok(Ok((stream, _))) =
                tokio::time::timeout(Duration::from_millis(200), listener.accept()).await
            else {
                continue;
            };
            let (keys, history) = (keys.clone(), history.clone());
            connections.push(tokio::spawn(command_writes(stream, keys, history, port)));
        }
        for c in connections {
            let _ = tokio::time::timeout(Duration::from_secs(30), c).await;
        }
    });
    (port, task)
}

/// Applies one command's writes to the register as they arrive; its claim runs from
/// its first write to its last.
async fn command_writes(
    stream: tokio::net::TcpStream,
    keys: Vec<String>,
    history: Arc<History>,
    port: u16,
) {
    let mut lines = BufReader::new(stream).lines();
    let mut claim: Option<Claim> = None;
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(order) = line.strip_prefix("d ") {
            tokio::spawn(daemon(order.to_string(), port));
            continue;
        }
        let fields: Vec<&str> = line.split(' ').collect();
        // A command's line ends with its send time (bash's $EPOCHREALTIME): on a
        // loaded machine the harness may read it well after it was written, after
        // `run` released and someone else took the key. The daemon's lines carry none.
        let (fields, sent) = match fields[..] {
            [.., realtime] if fields.len() == 6 => (&fields[..5], send_time(realtime, &history)),
            _ => (&fields[..], None),
        };
        let ["w", k, who, nonce, fence] = fields[..] else {
            history.violation(format!(
                "seed {}: a CLI command wrote a malformed line {line:?}",
                history.seed
            ));
            continue;
        };
        let (Some(key), Ok(fence)) = (
            k.parse::<usize>().ok().and_then(|k| keys.get(k)),
            fence.parse::<u64>(),
        ) else {
            history.violation(format!(
                "seed {}: a CLI command wrote an unknown key or fence: {line:?}",
                history.seed
            ));
            continue;
        };
        let t = sent.unwrap_or_else(|| history.now());
        if claim.is_none() {
            // The command's environment is the acquisition's evidence (rule (b)).
            history.acquired(key, who, t, nonce, fence, "");
        }
        history
            .write_fenced_sent(key, who, Kind::Cli, fence, t)
            .await;
        let c = claim.get_or_insert_with(|| Claim {
            key: key.clone(),
            who: who.to_string(),
            nonce: nonce.to_string(),
            fence,
            start: t,
            end: t,
        });
        c.end = t;
    }
    if let Some(c) = claim {
        history.claim(c);
    }
}

/// When a line stamped `realtime` (seconds since the epoch) was sent, on `history`'s
/// clock: now, less how long it waited to be read. Only the difference of two nearby
/// wall-clock readings is used, so the clocks' origins do not matter.
fn send_time(realtime: &str, history: &History) -> Option<f64> {
    let sent = realtime.parse::<f64>().ok()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs_f64();
    Some(history.now() - (now - sent).max(0.0))
}

/// The daemon a broken command hands its writes to: `K WHO NONCE FENCE N` makes N
/// writes with that fence, every 100 ms, from outside `run`'s process tree.
async fn daemon(order: String, port: u16) {
    let Some((write, count)) = order.rsplit_once(' ') else {
        return;
    };
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return;
    };
    use tokio::io::AsyncWriteExt;
    for _ in 0..count.parse::<u32>().unwrap_or(0) {
        if stream
            .write_all(format!("w {write}\n").as_bytes())
            .await
            .is_err()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The broken command: hands its writes to the daemon, then lives as long as the
/// writes would take (so `run` still has something to stop).
const HANDS_OFF: &str = r#"exec 3<>"/dev/tcp/127.0.0.1/$CHAOS_REGISTER" || exit 70
echo "d $CHAOS_KEY $CHAOS_WHO $LOCKWARDEN_NONCE $LOCKWARDEN_FENCE $CHAOS_WRITES" >&3 || exit 71
sleep "$((CHAOS_WRITES / 10 + 1))""#;

/// The command `run` starts: writes to the register every 100 ms, `CHAOS_WRITES` times.
const COMMAND: &str = r#"exec 3<>"/dev/tcp/127.0.0.1/$CHAOS_REGISTER" || exit 70
for ((i = 0; i < CHAOS_WRITES; i++)); do
  echo "w $CHAOS_KEY $CHAOS_WHO $LOCKWARDEN_NONCE $LOCKWARDEN_FENCE $EPOCHREALTIME" >&3 || exit 71
  sleep 0.1
done"#;

/// One CLI contender on key `k`: rounds of `run` (or `lock` + `unlock`) until `stop`.
pub async fn contender(
    spec: CliSpec,
    target: CliTarget,
    k: usize,
    register: u16,
    history: Arc<History>,
    stop: Arc<AtomicBool>,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    // Guarded rounds from a stream of their own: the other draws stay as they were.
    let mut guarded_rng = StdRng::seed_from_u64(seed ^ 0x6a4d);
    tokio::time::sleep(spec.start_after).await;
    let mut round = 0;
    while !stop.load(Ordering::SeqCst) {
        round += 1;
        let broken = if spec.hands_writes_to_a_daemon {
            "-broken"
        } else {
            ""
        };
        let guarded = guarded_rng.random_bool(spec.guarded_share);
        let kind = if guarded { "-guard" } else { "" };
        let who = format!("cli-{}{kind}{broken}-k{k}-{round}", spec.slot);
        let hold_ms =
            rng.random_range(spec.hold.0.as_millis() as u64..=spec.hold.1.as_millis() as u64);
        // Short and long waits: ZooKeeper queues and busy keys need the long ones.
        let wait = [2, 4, 6][rng.random_range(0..3)];
        if guarded {
            // Some holders ask for a lock-delay (rule 8): the stored lease, which the
            // guard's deadline runs on, is then longer than the holder's own.
            let lock_delay = guarded_rng
                .random_bool(0.4)
                .then(|| [500, 1000, 2000][guarded_rng.random_range(0..3)]);
            let round = Round {
                who: &who,
                hold_ms,
                wait,
                lock_delay,
            };
            guarded_round(&spec, &target, k, round, register, &history).await;
        } else if rng.random_bool(spec.lock_unlock_share) {
            let late = rng.random_bool(0.25);
            lock_then_unlock(&spec, &target, &who, (hold_ms, wait), late, &history).await;
        } else {
            run(&spec, &target, k, &who, (hold_ms, wait), register, &history).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..600))).await;
    }
}

/// The lease CLI contenders ask for: the engine clients' (3 s).
fn lease_flag() -> String {
    format!("{}s", LEASE.as_secs())
}

/// `run --lease L --wait W --grace G --holder WHO`, the start of every `run` a CLI
/// slot invokes, and the writer its command runs (broken or not, as `spec` says).
/// A 3 s lease leaves `run` at most 440 ms of grace before the holder deadline
/// (rule 7).
fn run_args(spec: &CliSpec, who: &str, wait: u64) -> (Vec<String>, &'static str) {
    let writer = if spec.hands_writes_to_a_daemon {
        HANDS_OFF
    } else {
        COMMAND
    };
    let (lease, wait) = (lease_flag(), wait.to_string());
    let args = [
        "run", "--lease", &lease, "--wait", &wait, "--grace", "400ms", "--holder", who,
    ];
    (args.map(String::from).to_vec(), writer)
}

async fn run(
    spec: &CliSpec,
    target: &CliTarget,
    k: usize,
    who: &str,
    (hold_ms, wait): (u64, u64),
    register: u16,
    history: &History,
) {
    let (mut args, command) = run_args(spec, who, wait);
    args.extend(target.flags.iter().cloned());
    args.extend([target.url.clone(), "--".into()]);
    args.extend(["bash".into(), "-c".into(), command.into()]);
    let mut cmd = target.cli.command(&args);
    cmd.env("CHAOS_REGISTER", register.to_string())
        .env("CHAOS_KEY", k.to_string())
        .env("CHAOS_WHO", who)
        .env("CHAOS_WRITES", (hold_ms / 100 + 1).to_string())
        .process_group(0);
    let invoke = history.now();
    let Ok(child) = cmd.spawn() else {
        history.failed(
            &target.key,
            who,
            "run",
            invoke,
            "fail",
            "cannot start lockwarden",
        );
        return;
    };
    let pid = child.id();
    world().clis[spec.slot].started(pid);
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await;
    world().clis[spec.slot].ended(pid);
    let (result, detail) = match out {
        Ok(Ok(out)) => {
            let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
            match out.status.code() {
                Some(0) => ("ok", stderr),
                // Busy for the whole --wait: a clean refusal.
                Some(3) => ("fail", stderr),
                // Lost while the command ran (the command was stopped), or the
                // backend failed: an outcome the history records, not a violation.
                Some(c) => ("unknown", format!("exit {c}: {stderr}")),
                None => ("unknown", "killed".into()),
            }
        }
        Ok(Err(e)) => ("unknown", e.to_string()),
        Err(_) => ("unknown", "still running after 60 s".into()),
    };
    history.record(
        json!({"process": who, "op": "run", "key": target.key, "invoke": invoke,
        "complete": history.now(), "result": result, "detail": detail}),
    );
}

/// `lock`, writes within the lease from the lock file, `unlock` (maybe late).
async fn lock_then_unlock(
    spec: &CliSpec,
    target: &CliTarget,
    who: &str,
    (hold_ms, wait): (u64, u64),
    late: bool,
    history: &History,
) {
    let file = target.cli.path(&format!("{who}.lock"));
    let file_arg = file.display().to_string();
    let mut args: Vec<String> = vec![
        "lock".into(),
        "--lease".into(),
        lease_flag(),
        "--wait".into(),
        wait.to_string(),
        "--holder".into(),
        who.into(),
        "--output".into(),
        file_arg.clone(),
    ];
    args.extend(target.flags.iter().cloned());
    args.push(target.url.clone());
    let invoke = history.now();
    let (code, stderr) = run_to_end(spec, target, &args).await;
    if code != Some(0) {
        let result = if code == Some(3) { "fail" } else { "unknown" };
        history.failed(&target.key, who, "lock", invoke, result, &stderr);
        return;
    }
    let Some((nonce, fence)) = std::fs::read_to_string(&file)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| Some((v["nonce"].as_str()?.to_string(), v["fence"].as_u64()?)))
    else {
        history.violation(format!(
            "seed {}: `lock` succeeded but its lock file {file_arg} has no nonce and fence",
            history.seed
        ));
        return;
    };
    history.acquired(&target.key, who, invoke, &nonce, fence, "");
    // The lease started after `invoke`: writes stop at its holder deadline from there.
    let valid_until = invoke
        + SafetyMargins::default()
            .holder_validity(LEASE)
            .as_secs_f64();
    let until = (history.now() + hold_ms as f64 / 1000.0).min(valid_until);
    let mut claim: Option<Claim> = None;
    while history.now() < until {
        let t = history.now();
        history
            .write_fenced(&target.key, who, Kind::Cli, fence)
            .await;
        claim
            .get_or_insert_with(|| Claim {
                key: target.key.clone(),
                who: who.to_string(),
                nonce: nonce.clone(),
                fence,
                start: t,
                end: t,
            })
            .end = t;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if let Some(c) = claim {
        history.claim(c);
    }
    if late {
        // Forgotten past the lease: the key may be someone else's by now.
        let after_lease = invoke + LEASE.as_secs_f64() + 1.0 - history.now();
        tokio::time::sleep(Duration::from_secs_f64(after_lease.max(0.0))).await;
    }
    let invoke = history.now();
    let mut args = vec!["unlock".to_string(), file_arg];
    args.extend(target.flags.iter().cloned());
    let (code, stderr) = run_to_end(spec, target, &args).await;
    // 0: released; 1: already unlocked (expired, released elsewhere); 3: taken over
    // and left alone. Whether `unlock` let someone else's lock go shows in the
    // other holder's claim and the observer's reads.
    let result = match code {
        Some(0) => "ok",
        Some(1 | 3) => "fail",
        _ => "unknown",
    };
    history.record(
        json!({"process": who, "op": "unlock", "key": target.key, "invoke": invoke,
        "complete": history.now(), "result": result, "detail": stderr, "late": late,
        "fence": fence}),
    );
}

/// Runs one short command to its end (killed after 60 s); its exit code and stderr.
async fn run_to_end(spec: &CliSpec, target: &CliTarget, args: &[String]) -> (Option<i32>, String) {
    let mut cmd = target.cli.command(args);
    cmd.process_group(0);
    let Ok(child) = cmd.spawn() else {
        return (None, "cannot start lockwarden".into());
    };
    let pid = child.id();
    world().clis[spec.slot].started(pid);
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await;
    world().clis[spec.slot].ended(pid);
    match out {
        Ok(Ok(out)) => (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ),
        Ok(Err(e)) => (None, e.to_string()),
        Err(_) => (None, "still running after 60 s".into()),
    }
}

/// One guarded round's parameters.
struct Round<'a> {
    who: &'a str,
    hold_ms: u64,
    wait: u64,
    /// The holder's `--lock-delay`, in milliseconds.
    lock_delay: Option<u64>,
}

/// The holder's command: the guard (`"$@"`), its log in a file of its own so that its
/// deadlines are not mixed with the holder's.
const GUARD_LOGGED: &str = r#"exec 2>"$CHAOS_GUARD_LOG"; exec "$@""#;

/// A guarded round: `run URL [--lock-delay D] -- lockwarden guard -- bash -c WRITER`.
/// The holder is `run`: it takes the key and renews, and its command is the guard,
/// which gets the nonce and fence from the environment `run` gives it (as a gated Pod
/// gets them from its annotations), reads the record through proxies of its own and
/// runs the writer. `run` releases only once its command's whole tree has ended, as
/// a controller releases a gated workload's lock only once its processes are gone
/// (issue 26: every release path waits for the processes); a holder that released
/// while the guarded command still ran would hand the key over before the guard could
/// see it. `cli-holder-sigstop` stops the `run` process alone: its command, the guard,
/// runs on, and only the guard can stop the writer, by its own deadline.
async fn guarded_round(
    spec: &CliSpec,
    target: &CliTarget,
    k: usize,
    round: Round<'_>,
    register: u16,
    history: &History,
) {
    let Round {
        who,
        hold_ms,
        wait,
        lock_delay,
    } = round;
    let holder_who = format!("{who}-holder");
    let holder_log = target.cli.path(&format!("{who}.holder.log"));
    let guard_log = target.cli.path(&format!("{who}.guard.log"));
    let (mut args, writer) = run_args(spec, &holder_who, wait);
    if let Some(delay) = lock_delay {
        args.extend(["--lock-delay".into(), format!("{delay}ms")]);
    }
    args.extend(target.flags.iter().cloned());
    args.extend([target.url.clone(), "--".into()]);
    args.extend([
        "bash".into(),
        "-c".into(),
        GUARD_LOGGED.into(),
        "guard".into(),
    ]);
    // The guard's environment: its own kubeconfig, and every deadline it derives in
    // its log (debug: the renewals' too). Its nonce and fence come from `run`.
    args.push("env".into());
    args.push("LOCKWARDEN_LOG=lockwarden=debug".into());
    if let Some(kubeconfig) = &target.guard_kubeconfig {
        args.push(format!("KUBECONFIG={}", kubeconfig.display()));
    }
    // No --grace: the guard's default, the longest the stored lease leaves.
    args.extend([
        bin().into(),
        "guard".into(),
        "--url".into(),
        target.key.clone(),
    ]);
    args.extend(target.guard_flags.iter().cloned());
    args.extend(["--".into(), "bash".into(), "-c".into(), writer.into()]);
    let mut cmd = target.cli.command(&args);
    let Ok(log) = std::fs::File::create(&holder_log) else {
        return;
    };
    cmd.env("CHAOS_GUARD_LOG", &guard_log)
        .env("CHAOS_REGISTER", register.to_string())
        .env("CHAOS_KEY", k.to_string())
        .env("CHAOS_WHO", who)
        // 2 s longer than a `run`'s command: still writing when its holder stops.
        .env("CHAOS_WRITES", (hold_ms / 100 + 21).to_string())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .process_group(0);
    let invoke = history.now();
    let Ok(mut holder) = cmd.spawn() else {
        history.failed(
            &target.key,
            &holder_who,
            "run",
            invoke,
            "fail",
            "cannot start lockwarden",
        );
        return;
    };
    let pid = holder.id();
    let slot = &world().clis[spec.slot];
    slot.holder_started(pid);
    let ended = tokio::time::timeout(Duration::from_secs(90), holder.wait()).await;
    if ended.is_err()
        && let Some(pid) = pid
    {
        // SAFETY: kill(2) on the process group of the holder we started.
        unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
        let _ = holder.wait().await;
    }
    slot.holder_ended(pid);
    let code = match ended {
        Ok(Ok(status)) => status.code(),
        _ => None,
    };
    let holder_said = std::fs::read_to_string(&holder_log).unwrap_or_default();
    history.record(
        json!({"process": holder_who, "op": "run", "key": target.key,
        "invoke": invoke, "complete": history.now(),
        "result": match code { Some(0) => "ok", Some(3) => "fail", _ => "unknown" },
        "detail": format!("exit {code:?}: {}", last_lines(&holder_said, 3)),
        "lockDelayMs": lock_delay}),
    );

    // The guard ran only if `run` acquired the lock.
    let Ok(guard_said) = std::fs::read_to_string(&guard_log) else {
        return;
    };
    let guard_said = without_colours(&guard_said);
    // Its deadline on CLOCK_MONOTONIC, on the history's clock.
    let deadline = latest_deadline(&guard_said).map(|d| d - monotonic_now() + history.now());
    history.guard_deadline(&target.key, who, deadline);
    // Outcomes, not violations: the writes decide.
    let outcome = if guard_said.contains("could not be confirmed") {
        // Exit 6: the writer stopped (or never started) by the guard's own deadline.
        "stopped-unconfirmed".to_string()
    } else if guard_said.contains("lock lost while the command ran")
        || guard_said.contains("not held with this nonce")
    {
        // Exit 4: the record was not ours any more.
        "stopped-not-held".into()
    } else {
        match code {
            Some(0) => "ended".into(),
            // `run` stopped its command, the guard with it (a loss `run` saw first).
            Some(4) => "stopped-by-the-holder".into(),
            Some(c) => format!("exit-{c}"),
            None => "killed".into(),
        }
    };
    history.guard_outcome(&outcome);
    history.record(
        json!({"process": who, "op": "guard", "key": target.key, "invoke": invoke,
        "complete": history.now(), "result": if code == Some(0) { "ok" } else { "unknown" },
        "outcome": outcome, "deadline": deadline, "lockDelayMs": lock_delay,
        "detail": last_lines(&guard_said, 2)}),
    );
}

/// The latest deadline the guard logged (`until_monotonic=` when it started the
/// command, `deadline_monotonic=` at every renewal and when it stopped it): deadlines
/// only move forward, so the latest bounds every write.
fn latest_deadline(log: &str) -> Option<f64> {
    ["until_monotonic=", "deadline_monotonic="]
        .iter()
        .flat_map(|field| log.split(field).skip(1))
        .filter_map(|rest| {
            rest.split(|c: char| !(c.is_ascii_digit() || c == '.'))
                .next()?
                .parse::<f64>()
                .ok()
        })
        .fold(None, |latest: Option<f64>, d| {
            Some(latest.map_or(d, |l| l.max(d)))
        })
}

/// Seconds of CLOCK_MONOTONIC, the clock the guard logs its deadlines on.
fn monotonic_now() -> f64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes one timespec into the one we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as f64 + now.tv_nsec as f64 / 1e9
}

/// `text` without ANSI colour sequences.
fn without_colours(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.trim().lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

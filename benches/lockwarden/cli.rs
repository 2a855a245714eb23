//! Part 6, CLI start-up (issue 18 item 5): one `lockwarden lock` + `lockwarden unlock`
//! cycle, each its own process, against a Go baseline doing the same job on the same
//! server in the same run (`tests/interop`, `s3lock-lock`/`-unlock` with s3lock's
//! protocol on S3, `dynamo-lock`/`-unlock` with dynamolock's item format on DynamoDB).
//! Per process: wall time, CPU (user + system) and peak RSS, from `wait4`'s rusage.
//! A cycle's figures are the two processes' sums (wall, CPU) and their maximum (RSS).

use super::*;

/// One finished process: what it printed and what it cost.
struct Measured {
    stdout: String,
    wall_ms: f64,
    cpu_ms: f64,
    peak_rss_kb: f64,
}

/// Runs `program args` to the end under GNU `time`, which reports the program's own
/// peak RSS (`%M`): the rusage of a child of this process would count this process's
/// memory, which the child shares until it executes. CPU comes from `wait4` on `time`
/// (its children included, `time` itself adding well under a millisecond).
#[allow(clippy::zombie_processes)] // reaped by wait4 below, not by std's wait
fn measured(program: &std::path::Path, args: &[String], env: &AwsEnv) -> Measured {
    use std::io::Read;
    let rss_file = env.dir.join(support::unique("rss"));
    let mut cmd = Command::new("/usr/bin/time");
    cmd.arg("-f")
        .arg("%M")
        .arg("-o")
        .arg(&rss_file)
        .arg(program)
        .args(args);
    env.apply(&mut cmd);
    let started = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("/usr/bin/time (GNU time) runs the CLI benchmark's processes");
    let mut stdout = String::new();
    let mut stderr = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value; wait4 fills it in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `child` is our child and has not been reaped.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    let wall_ms = ms(started.elapsed());
    assert!(pid > 0, "wait4 failed");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{program:?} {args:?} failed ({status}): {stderr}"
    );
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    let rss = std::fs::read_to_string(&rss_file).unwrap_or_default();
    let _ = std::fs::remove_file(&rss_file);
    Measured {
        stdout,
        wall_ms,
        cpu_ms: tv(usage.ru_utime) + tv(usage.ru_stime),
        peak_rss_kb: rss
            .trim()
            .lines()
            .last()
            .unwrap_or("")
            .parse()
            .unwrap_or(f64::NAN),
    }
}

/// The environment both tools get: the server and its credentials, nothing else to
/// look up, and a working directory for the lock file.
struct AwsEnv {
    endpoint: String,
    dir: PathBuf,
}

impl AwsEnv {
    fn apply(&self, cmd: &mut Command) {
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &self.dir)
            .env("AWS_ENDPOINT_URL", &self.endpoint)
            .env("AWS_REGION", support::moto::REGION)
            .env("AWS_ACCESS_KEY_ID", support::moto::ACCESS_KEY_ID)
            .env("AWS_SECRET_ACCESS_KEY", support::moto::SECRET_ACCESS_KEY)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .current_dir(&self.dir);
    }
}

#[derive(Default)]
struct Cycle {
    wall: Vec<f64>,
    cpu: Vec<f64>,
    rss: Vec<f64>,
}

impl Cycle {
    fn add(&mut self, lock: &Measured, unlock: &Measured) {
        self.wall.push(lock.wall_ms + unlock.wall_ms);
        self.cpu.push(lock.cpu_ms + unlock.cpu_ms);
        self.rss
            .push(lock.peak_rss_kb.max(unlock.peak_rss_kb) / 1024.0);
    }
}

/// `LOCKWARDEN_BENCH_CLI_BEFORE=/path/to/an/older/lockwarden` measures that binary too,
/// in the same rounds, so a change's before → after comes from one run.
fn before_binary() -> Option<PathBuf> {
    std::env::var_os("LOCKWARDEN_BENCH_CLI_BEFORE").map(PathBuf::from)
}

fn lockwarden_cycle(bin: &std::path::Path, url: &str, env: &AwsEnv) -> (Measured, Measured) {
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let lock = measured(
        bin,
        &args(&["lock", url, "-o", "bench.lock", "--lease", "30s"]),
        env,
    );
    let unlock = measured(bin, &args(&["unlock", "bench.lock"]), env);
    (lock, unlock)
}

/// The Go tool's lock and unlock: `where_` names the bucket or table, `key` the key.
fn go_cycle(kind: Kind, where_: &str, key: &str, env: &AwsEnv) -> (Measured, Measured) {
    let driver = support::tool("LOCKWARDEN_INTEROP");
    let place = if kind == Kind::S3 {
        "--bucket"
    } else {
        "--table"
    };
    let base = |cmd: &str| -> Vec<String> {
        [
            cmd,
            "--endpoint",
            &env.endpoint,
            place,
            where_,
            "--key",
            key,
        ]
        .map(String::from)
        .to_vec()
    };
    if kind == Kind::S3 {
        let lock = measured(&driver, &base("s3lock-lock"), env);
        let (id, etag) = lock.stdout.trim().split_once(' ').expect("id etag");
        let unlock_args = [
            base("s3lock-unlock"),
            ["--id", id, "--etag", etag].map(String::from).to_vec(),
        ]
        .concat();
        let unlock = measured(&driver, &unlock_args, env);
        (lock, unlock)
    } else {
        let lock_args = [base("dynamo-lock"), vec!["--owner".into(), "bench".into()]].concat();
        let lock = measured(&driver, &lock_args, env);
        let unlock_args = [
            base("dynamo-unlock"),
            vec!["--rvn".into(), lock.stdout.trim().to_string()],
        ]
        .concat();
        let unlock = measured(&driver, &unlock_args, env);
        (lock, unlock)
    }
}

pub(crate) async fn part_cli(env: Arc<Env>, opts: Opts, report: Shared) {
    let n = opts.n(30);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(support::unique("cli-bench"));
    std::fs::create_dir_all(&dir).unwrap();
    for kind in [Kind::S3, Kind::DynamoDb] {
        let env = env.clone();
        let dir = dir.clone();
        let (ours, go, before) = tokio::task::spawn_blocking(move || {
            let (mut ours, mut go, mut before) =
                (Cycle::default(), Cycle::default(), Cycle::default());
            let bin = std::path::Path::new(env!("CARGO_BIN_EXE_lockwarden"));
            let (place, endpoint) = match kind {
                Kind::S3 => (env.bucket.clone(), env.s3_server.endpoint()),
                _ => (env.table.clone(), env.dynamodb_server.endpoint()),
            };
            let scheme = if kind == Kind::S3 { "s3" } else { "dynamodb" };
            let url = format!("{scheme}://{place}/{}", support::unique("cli"));
            let aws = AwsEnv { endpoint, dir };
            // Alternate the two tools round by round, so both see the same machine.
            for i in 0..n + 2 {
                let (l, u) = lockwarden_cycle(bin, &url, &aws);
                let (gl, gu) = go_cycle(kind, &place, &support::unique("go-cli"), &aws);
                let old = before_binary().map(|b| lockwarden_cycle(&b, &url, &aws));
                if i >= 2 {
                    ours.add(&l, &u);
                    go.add(&gl, &gu);
                    if let Some((bl, bu)) = old {
                        before.add(&bl, &bu);
                    }
                }
            }
            (ours, go, before)
        })
        .await
        .unwrap();
        if let Some(b) = before_binary() {
            note(
                &report,
                format!(
                    "cli {}: before ({}) → now, p50 per cycle: wall {:.1} → {:.1} ms, CPU {:.1} → {:.1} ms, peak RSS {:.1} → {:.1} MiB (same run)",
                    kind.name(),
                    b.display(),
                    pct(&before.wall, 0.5),
                    pct(&ours.wall, 0.5),
                    pct(&before.cpu, 0.5),
                    pct(&ours.cpu, 0.5),
                    pct(&before.rss, 0.5),
                    pct(&ours.rss, 0.5)
                ),
            );
        }
        let mut r = report.lock().unwrap();
        r.cli.push(CliRow {
            kind,
            n,
            wall: (pct(&ours.wall, 0.5), pct(&go.wall, 0.5)),
            cpu: (pct(&ours.cpu, 0.5), pct(&go.cpu, 0.5)),
            rss: (pct(&ours.rss, 0.5), pct(&go.rss, 0.5)),
        });
        eprintln!(
            "[bench] cli {}: wall {:.1}/{:.1} ms, cpu {:.1}/{:.1} ms, rss {:.1}/{:.1} MiB (lockwarden/go, p50)",
            kind.name(),
            pct(&ours.wall, 0.5),
            pct(&go.wall, 0.5),
            pct(&ours.cpu, 0.5),
            pct(&go.cpu, 0.5),
            pct(&ours.rss, 0.5),
            pct(&go.rss, 0.5)
        );
    }
}

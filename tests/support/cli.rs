//! The built `lockwarden` binary, run as a user would: in a directory of its own, with
//! the test servers' settings in its environment (AWS_ENDPOINT_URL, AWS_REGION,
//! credentials, KUBECONFIG) and nothing from the developer's own AWS or Kubernetes
//! set-up.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::process::{Child, Command};

use super::kube::ControlPlane;
use super::moto::{self, Moto};

/// The `lockwarden` binary Cargo built beside the running test binary
/// (`<target>/<profile>/lockwarden`: Cargo builds the package's binaries for its
/// integration tests and benchmarks).
pub fn bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| {
        let bin = crate::profile_dir().join("lockwarden");
        assert!(
            bin.is_file(),
            "{} is missing: run the tests through cargo (cargo test, scripts/test), which builds it",
            bin.display()
        );
        bin.into_os_string()
            .into_string()
            .expect("the target directory's path is UTF-8")
    })
}

/// Generous: a loaded 2-core machine, JVMs and Python servers next to a cargo build.
pub const TIMEOUT: Duration = Duration::from_secs(120);

/// What one run of the binary produced.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn ok(&self) -> &Self {
        assert_eq!(self.code, 0, "expected success: {self:#?}");
        self
    }

    pub fn code(&self, code: i32) -> &Self {
        assert_eq!(self.code, code, "expected exit code {code}: {self:#?}");
        self
    }

    /// Exactly one line on stderr, `lockwarden: error: …`, containing every `needle`.
    pub fn one_line_error(&self, needles: &[&str]) -> &Self {
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "expected a one-line error: {self:#?}");
        assert!(
            lines[0].starts_with("lockwarden: error: "),
            "expected `lockwarden: error: …`: {self:#?}"
        );
        for needle in needles {
            assert!(
                lines[0].contains(needle),
                "error lacks {needle:?}: {self:#?}"
            );
        }
        self
    }

    /// Exit `code`, exactly one error line naming every fragment (progress lines
    /// `lockwarden: …` may precede it), a bounded message, and no panic. `case` names
    /// the input in failure messages.
    pub fn expect(&self, code: i32, fragments: &[&str], case: &str) {
        assert_ne!(self.code, 101, "{case}: panicked: {self:#?}");
        assert!(
            !self.stderr.contains("panicked"),
            "{case}: panicked: {self:#?}"
        );
        assert_eq!(self.code, code, "{case}: exit code: {self:#?}");
        let errors: Vec<&str> = self
            .stderr
            .lines()
            .filter(|l| l.starts_with("lockwarden: error: "))
            .collect();
        assert_eq!(
            errors.len(),
            1,
            "{case}: expected a one-line error: {self:#?}"
        );
        assert!(
            self.stderr.lines().all(|l| l.starts_with("lockwarden: ")),
            "{case}: {self:#?}"
        );
        for fragment in fragments {
            assert!(
                self.stderr.contains(fragment),
                "{case}: error lacks {fragment:?}: {self:#?}"
            );
        }
        assert!(
            self.stderr.len() < 4096,
            "{case}: a {} byte error message",
            self.stderr.len()
        );
    }
}

/// The binary, in a directory of its own, with one backend environment.
pub struct Cli {
    dir: tempfile::TempDir,
    env: Vec<(&'static str, String)>,
    /// Start from an empty environment (only PATH kept) instead of removing the
    /// variables known to matter.
    clear_env: bool,
    /// The binary run: this build's, or the previous release's ([`Cli::previous_release`]).
    bin: PathBuf,
}

impl Default for Cli {
    fn default() -> Self {
        Cli::new()
    }
}

impl Cli {
    /// AWS region and credentials of the test servers, no endpoint, no kubeconfig.
    pub fn new() -> Cli {
        let env = vec![
            ("AWS_REGION", moto::REGION.to_string()),
            ("AWS_ACCESS_KEY_ID", moto::ACCESS_KEY_ID.to_string()),
            ("AWS_SECRET_ACCESS_KEY", moto::SECRET_ACCESS_KEY.to_string()),
            // Nothing from the developer's own AWS setup, and no IMDS probing.
            ("AWS_CONFIG_FILE", "/nonexistent/aws-config".to_string()),
            (
                "AWS_SHARED_CREDENTIALS_FILE",
                "/nonexistent/aws-credentials".to_string(),
            ),
            ("AWS_EC2_METADATA_DISABLED", "true".to_string()),
            ("USER", "tester".to_string()),
            ("KUBECONFIG", "/nonexistent/kubeconfig".to_string()),
        ];
        Cli {
            dir: tempfile::tempdir().expect("temp dir"),
            env,
            clear_env: false,
            bin: PathBuf::from(bin()),
        }
    }

    /// Runs lockwarden as released at `LOCKWARDEN_PREVIOUS_RELEASE` instead of this
    /// build: the binary `scripts/testenv` built beside the previous release's CRD
    /// (`LOCKWARDEN_PREVIOUS_CRD`), for the formats shared across a rolling upgrade.
    pub fn previous_release(mut self) -> Cli {
        const INSTALL: &str = "run `eval \"$(scripts/testenv env)\"` (scripts/testenv builds \
                               the previous release once)";
        let crd = std::env::var_os("LOCKWARDEN_PREVIOUS_CRD")
            .unwrap_or_else(|| panic!("LOCKWARDEN_PREVIOUS_CRD is not set: {INSTALL}"));
        let bin = std::path::Path::new(&crd)
            .parent()
            .expect("the previous release's directory")
            .join("bin/lockwarden");
        assert!(bin.is_file(), "{} is missing: {INSTALL}", bin.display());
        self.bin = bin;
        self
    }

    /// With moto as the AWS endpoint.
    pub fn aws() -> Cli {
        Cli::new().with_aws()
    }

    /// With the shared control plane's admin kubeconfig.
    pub fn kube() -> Cli {
        Cli::new().with_kube()
    }

    pub fn with_aws(self) -> Cli {
        self.with("AWS_ENDPOINT_URL", Moto::shared().endpoint())
    }

    pub fn with_kube(self) -> Cli {
        let kubeconfig = ControlPlane::shared().kubeconfig_path();
        self.with("KUBECONFIG", kubeconfig.display().to_string())
    }

    /// Runs with only PATH and this environment.
    pub fn clearing_env(mut self) -> Cli {
        self.clear_env = true;
        self
    }

    pub fn with(mut self, name: &'static str, value: impl Into<String>) -> Cli {
        self.env.retain(|(n, _)| *n != name);
        self.env.push((name, value.into()));
        self
    }

    /// The working directory of every run.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn command<S: AsRef<OsStr>>(&self, args: &[S]) -> Command {
        self.command_under::<&str, S>(&[], args)
    }

    /// [`Cli::command`] run by `wrapper` (a program and its arguments, the binary's
    /// path and `args` following), e.g. `unshare --pid --fork` to run it as PID 1.
    pub fn command_under<W: AsRef<OsStr>, S: AsRef<OsStr>>(
        &self,
        wrapper: &[W],
        args: &[S],
    ) -> Command {
        let mut cmd = match wrapper.split_first() {
            None => Command::new(&self.bin),
            Some((program, rest)) => {
                let mut cmd = Command::new(program);
                cmd.args(rest).arg(&self.bin);
                cmd
            }
        };
        cmd.args(args).current_dir(self.dir.path());
        if self.clear_env {
            cmd.env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default());
        } else {
            cmd.env_remove("AWS_PROFILE")
                .env_remove("AWS_ENDPOINT_URL_S3")
                .env_remove("AWS_ENDPOINT_URL_DYNAMODB")
                .env_remove("LOCKWARDEN_LOG");
        }
        cmd.envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    /// Runs the binary to the end (at most [`TIMEOUT`]) and logs what it printed.
    pub async fn run(&self, args: &[&str]) -> Out {
        self.run_os(args).await
    }

    /// [`Cli::run`] with arguments that need not be UTF-8.
    pub async fn run_os<S: AsRef<OsStr>>(&self, args: &[S]) -> Out {
        self.run_within(TIMEOUT, args).await
    }

    /// [`Cli::run_os`] for a command that may rightly run longer than [`TIMEOUT`] (one
    /// with a `--wait` of its own): at most `timeout`.
    pub async fn run_within<S: AsRef<OsStr>>(&self, timeout: Duration, args: &[S]) -> Out {
        let shown: Vec<String> = args
            .iter()
            .map(|a| a.as_ref().to_string_lossy().into_owned())
            .collect();
        let started = Instant::now();
        let out = tokio::time::timeout(timeout, self.command(args).output())
            .await
            .unwrap_or_else(|_| panic!("lockwarden {shown:?} did not finish within {timeout:?}"))
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.bin.display()));
        let out = Out {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        eprintln!(
            "$ lockwarden {} -> {} in {:.1?}\n{}{}",
            shown.join(" "),
            out.code,
            started.elapsed(),
            out.stdout,
            out.stderr
        );
        out
    }

    pub fn spawn(&self, args: &[&str]) -> Child {
        self.command(args).spawn().expect("spawn lockwarden")
    }

    /// A JSON file the binary wrote in its directory (a lock file).
    pub fn read_json(&self, name: &str) -> Value {
        let text =
            std::fs::read_to_string(self.path(name)).unwrap_or_else(|e| panic!("read {name}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not JSON ({e}): {text}"))
    }
}

/// Command-line arguments as `OsString`s.
pub fn os_args(list: &[&str]) -> Vec<OsString> {
    list.iter().map(OsString::from).collect()
}

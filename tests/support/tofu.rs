//! The real `tofu` (OpenTofu, built by `scripts/testenv` from the Go module proxy), in a
//! working directory of its own whose configuration keeps its state on the test S3
//! server with the tools' state lock: the S3 lock file (`use_lockfile`) or the DynamoDB
//! lock table (`dynamodb_table`). Its one resource is the built-in `terraform_data`,
//! replaced on every apply so that its `local-exec` provisioner runs the command a test
//! passes (`-var command=…`): no provider is downloaded.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use tokio::process::{Child, Command};

use super::moto::{self, Moto};
use super::tool;

/// Where the state is kept, under the bucket: the S3 lock is this key plus `.tflock`.
pub const STATE_KEY: &str = "env/prod/terraform.tfstate";

/// An apply's debug log, in its working directory.
const DEBUG_LOG: &str = "tofu-debug.log";

/// Which of the tools' state locks a working directory takes.
#[derive(Clone, Debug)]
pub enum StateLock {
    /// `use_lockfile = true`: `<bucket>/<state key>.tflock`.
    S3File,
    /// `dynamodb_table = TABLE` (partition key `LockID`).
    DynamoDbTable(String),
}

/// A working directory with `tofu init` done.
pub struct Tofu {
    dir: tempfile::TempDir,
    pub bucket: String,
    pub lock: StateLock,
}

impl Tofu {
    /// A configuration whose state is `s3://bucket/STATE_KEY` on the shared moto, locked
    /// by `lock`; `tofu init` run.
    pub async fn init(bucket: &str, lock: StateLock) -> Tofu {
        let endpoint = Moto::shared().endpoint();
        let lock_setting = match &lock {
            StateLock::S3File => "use_lockfile = true".to_string(),
            StateLock::DynamoDbTable(table) => format!("dynamodb_table = \"{table}\""),
        };
        let config = format!(
            r#"terraform {{
  backend "s3" {{
    bucket = "{bucket}"
    key    = "{STATE_KEY}"
    region = "{region}"
    {lock_setting}
    endpoints = {{
      s3       = "{endpoint}"
      dynamodb = "{endpoint}"
    }}
    use_path_style              = true
    skip_credentials_validation = true
    skip_requesting_account_id  = true
    skip_metadata_api_check     = true
    skip_region_validation      = true
    skip_s3_checksum            = true
  }}
}}

variable "command" {{
  type    = string
  default = "true"
}}

resource "terraform_data" "work" {{
  triggers_replace = timestamp()
  provisioner "local-exec" {{
    command = var.command
  }}
}}
"#,
            region = moto::REGION
        );
        let dir = tempfile::tempdir().expect("a working directory");
        std::fs::write(dir.path().join("main.tf"), config).expect("write main.tf");
        let tofu = Tofu {
            dir,
            bucket: bucket.to_string(),
            lock,
        };
        let out = tofu.run(&["init", "-input=false"]).await;
        assert!(out.status.success(), "tofu init: {}", Tofu::text(&out));
        tofu
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The lock URL lockwarden names this configuration's state lock by.
    pub fn lock_url(&self) -> String {
        match &self.lock {
            StateLock::S3File => format!("s3://{}/{STATE_KEY}.tflock", self.bucket),
            StateLock::DynamoDbTable(table) => {
                format!("dynamodb://{table}/{}/{STATE_KEY}", self.bucket)
            }
        }
    }

    /// The store flags lockwarden needs beside the URL for this state lock.
    pub fn lock_flags(&self) -> Vec<&'static str> {
        match &self.lock {
            StateLock::S3File => vec!["--terraform-compatible", "--path-style"],
            StateLock::DynamoDbTable(_) => {
                vec!["--terraform-compatible", "--partition-key", "LockID"]
            }
        }
    }

    /// `tofu ARGS` with the test servers' credentials and nothing of the machine's own
    /// set-up (its CLI configuration, plugin caches, checkpoint calls).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(tool("TOFU"));
        // `-no-color` right after the subcommand: Go's flags end at the first operand
        // (`force-unlock ID`).
        let (subcommand, rest) = args.split_first().expect("a tofu subcommand");
        cmd.arg(subcommand)
            .arg("-no-color")
            .args(rest)
            .current_dir(self.dir.path())
            .env("AWS_ACCESS_KEY_ID", moto::ACCESS_KEY_ID)
            .env("AWS_SECRET_ACCESS_KEY", moto::SECRET_ACCESS_KEY)
            .env("AWS_REGION", moto::REGION)
            .env_remove("AWS_PROFILE")
            .env("AWS_CONFIG_FILE", "/nonexistent/aws-config")
            .env(
                "AWS_SHARED_CREDENTIALS_FILE",
                "/nonexistent/aws-credentials",
            )
            .env("AWS_EC2_METADATA_DISABLED", "true")
            // This machine names a CLI configuration file that does not exist; tofu then
            // warns on every command.
            .env("TF_CLI_CONFIG_FILE", "/dev/null")
            .env("TF_IN_AUTOMATION", "1")
            .env("CHECKPOINT_DISABLE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // A process group of its own: a test can SIGKILL tofu with its provisioner.
        cmd.process_group(0);
        cmd
    }

    /// Runs `tofu ARGS` to the end.
    pub async fn run(&self, args: &[&str]) -> Output {
        let out = self
            .command(args)
            .output()
            .await
            .expect("run tofu (scripts/testenv builds it)");
        eprintln!(
            "$ tofu {} -> {:?}\n{}",
            args.join(" "),
            out.status.code(),
            Tofu::text(&out)
        );
        out
    }

    /// Starts `tofu apply` whose provisioner runs `command` (in this directory), waiting
    /// for the state lock at most `lock_timeout`. Its debug log (every AWS request it
    /// sends, with the SDK's attempt number) is [`Tofu::debug_log`], this apply's only.
    pub fn spawn_apply(&self, command: &str, lock_timeout: &str) -> Child {
        let var = format!("command={command}");
        let timeout = format!("-lock-timeout={lock_timeout}");
        let log = self.path(DEBUG_LOG);
        // tofu appends to TF_LOG_PATH: start each apply's log empty.
        std::fs::write(&log, "").expect("empty tofu's debug log");
        self.command(&[
            "apply",
            "-input=false",
            "-auto-approve",
            &timeout,
            "-var",
            &var,
        ])
        .env("TF_LOG", "debug")
        .env("TF_LOG_PATH", &log)
        .spawn()
        .expect("spawn tofu apply")
    }

    /// The debug log of the last [`Tofu::spawn_apply`].
    pub fn debug_log(&self) -> String {
        std::fs::read_to_string(self.path(DEBUG_LOG)).unwrap_or_default()
    }

    /// The lines of the last apply's debug log that record a request of `operation`
    /// (e.g. `DynamoDB/DeleteItem`) or its reply.
    pub fn requests_of(&self, operation: &str) -> Vec<String> {
        let method = format!("rpc.method={operation} ");
        self.debug_log()
            .lines()
            .filter(|l| l.contains(&method))
            .map(str::to_string)
            .collect()
    }

    /// A file in the working directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// stdout and stderr of a run, for messages and checks.
    pub fn text(out: &Output) -> String {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }
}

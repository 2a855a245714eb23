//! The `lockwarden` binary: one clap entry point for every command.

#![warn(clippy::too_many_lines)]
#![cfg_attr(test, allow(clippy::too_many_lines))]

use std::process::ExitCode;

use anyhow::Context;
use clap::{CommandFactory, Parser, Subcommand};
use lockwarden::cli::kubectl::{self, InvokedAs};
use lockwarden::cli::{self, CliError};

/// Distributed locks with fencing tokens in S3, DynamoDB, ZooKeeper and Kubernetes Leases.
#[derive(Parser)]
#[command(
    name = "lockwarden",
    version,
    propagate_version = true,
    subcommand_required = true,
    arg_required_else_help = true,
    after_help = cli::after_help()
)]
struct Cli {
    #[command(flatten)]
    global: cli::GlobalArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Acquire a lock and write a lock file (like s3lock lock)
    Lock(cli::lock::LockArgs),
    /// Release the lock a lock file describes (like s3lock unlock)
    Unlock(cli::unlock::UnlockArgs),
    /// Run a command while holding a lock, renewed in the background
    Run(cli::run::RunArgs),
    /// Run a command as a container's entrypoint and stop it by the lock's deadline, read from the store on its own (a gated workload's node-side stop)
    Guard(cli::guard::GuardArgs),
    /// Copy this binary into DIR (an init container's step before `guard`: the image has no shell or cp)
    Install(cli::install::InstallArgs),
    /// Show a lock's holder (every holder of a key with permits), fence, version and lease without acquiring it
    Status(cli::status::StatusArgs),
    /// Write data to an S3 object or DynamoDB item with your fence; a stale fence is refused (exit 5)
    Put(cli::put::PutArgs),
    /// Print an object's data (stdout) and the fence and lock that wrote it (stderr)
    Get(cli::put::GetArgs),
    /// Delete an object with your fence, leaving a fenced tombstone; a stale fence is refused (exit 5)
    Delete(cli::put::DeleteArgs),
    /// Exit 0 if FENCE is still a current holder's on the lock, 5 if not (like Chubby's CheckSequencer; advisory: the holder may lose the lock right after, only a conditional write at the resource is safe)
    CheckFence(cli::check_fence::CheckFenceArgs),
    /// Run the DistributedLock operator (uses KUBECONFIG or the in-cluster service account)
    Controller {
        #[command(flatten)]
        config: lockwarden::controller::ControllerConfig,
        #[command(flatten)]
        election: lockwarden::controller::LeaderElectionArgs,
    },
    /// Print a shell completion script
    Completions(cli::completions::CompletionsArgs),
    /// Print the DistributedLock CustomResourceDefinition (YAML, as in crds/)
    Crd,
}

async fn dispatch(command: Command) -> anyhow::Result<u8> {
    let code = match command {
        Command::Lock(args) => cli::lock::run(args).await?,
        Command::Unlock(args) => cli::unlock::run(args).await?,
        Command::Run(args) => cli::run::run(args).await?,
        Command::Guard(args) => cli::guard::run(args).await?,
        Command::Install(args) => cli::install::run(args)?,
        Command::Status(args) => cli::status::run(args).await?,
        Command::Put(args) => cli::put::put(args).await?,
        Command::Get(args) => cli::put::get(args).await?,
        Command::Delete(args) => cli::put::delete(args).await?,
        Command::CheckFence(args) => cli::check_fence::run(args).await?,
        Command::Controller { config, election } => {
            let kube_config = kube::Config::infer().await.context(
                "cannot reach the Kubernetes API (KUBECONFIG, ~/.kube/config or in-cluster)",
            )?;
            let client =
                lockwarden::controller::bounded_client(kube_config, config.api_requests_in_flight)
                    .context("cannot build the Kubernetes client")?;
            lockwarden::controller::run_elected(client, config, election).await?;
            cli::exit::OK
        }
        Command::Completions(args) => cli::completions::run(args, Cli::command())?,
        Command::Crd => {
            print!("{}", lockwarden::api::all_crds_yaml());
            cli::exit::OK
        }
    };
    Ok(code)
}

/// Runs `work` on a single-threaded runtime (a command that does one thing and exits)
/// or, for the controller, one thread per core.
fn block_on<F: std::future::Future<Output = anyhow::Result<u8>>>(
    multi_thread: bool,
    work: F,
) -> ExitCode {
    let mut runtime = if multi_thread {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let result = runtime
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .and_then(|runtime| {
            let result = runtime.block_on(work);
            // Do not wait for background tasks (a ZooKeeper session, a renewal in
            // flight): the command's outcome is known.
            runtime.shutdown_timeout(std::time::Duration::from_millis(200));
            result
        });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            cli::print_error(&format!("{e:#}"));
            ExitCode::from(
                e.downcast_ref::<CliError>()
                    .map_or(cli::exit::ERROR, CliError::exit_code),
            )
        }
    }
}

/// `kubectl-lockwarden` / `kubectl_complete-lockwarden`: the same binary under the
/// names kubectl looks for, with a command line of its own (kubectl passes no flags).
fn plugin_main(mode: InvokedAs) -> ExitCode {
    match mode {
        InvokedAs::Completion => {
            let args: Vec<String> = std::env::args_os()
                .skip(1)
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            block_on(false, async move { Ok(kubectl::complete(args).await) })
        }
        InvokedAs::Plugin => {
            let cli = match kubectl::PluginCli::try_parse() {
                Ok(cli) => cli,
                Err(e) => return ExitCode::from(cli::report_parse_error(e)),
            };
            cli::init_logging(&cli::GlobalArgs::default());
            block_on(false, async move { Ok(kubectl::run(cli).await?) })
        }
    }
}

fn main() -> ExitCode {
    lockwarden::allocator::tune();
    if let Some(mode) = kubectl::invoked_as(std::env::args_os().next().as_ref()) {
        return plugin_main(mode);
    }
    // `lockwarden reference-cli`: docs/reference/cli.md from these definitions
    // (scripts/gen-reference). Not a subcommand, so that no help or completion offers it.
    if std::env::args_os().skip(1).eq(["reference-cli"]) {
        print!(
            "{}",
            cli::reference::cli_reference_markdown(&Cli::command())
        );
        return ExitCode::SUCCESS;
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return ExitCode::from(cli::report_parse_error(e)),
    };
    cli::init_logging(&cli.global);
    // The controller serves many locks at once: threads for each core. Every other
    // command does one thing and exits: a single-threaded runtime starts faster and
    // uses less memory (issue 18: a CLI lighter than the Go tools).
    let multi_thread = matches!(cli.command, Command::Controller { .. });
    block_on(multi_thread, dispatch(cli.command))
}

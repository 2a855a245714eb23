//! `kubectl lockwarden`: the same binary as a kubectl plugin, chosen by the name it is
//! run as (argv[0]): `kubectl-lockwarden` is the plugin, `kubectl_complete-lockwarden`
//! its shell completion (kubectl ≥ 1.26 runs it for `kubectl lockwarden <TAB>`).
//!
//! - `status [dlock/NAME]`: a lock's phase, holders, fences, lease, queue and last
//!   Events; without a name every lock of the namespace (`-A`: of every namespace).
//! - `why job/NAME|pod/NAME`: which locks a workload waits for, who holds each, its
//!   position, and what would unblock it ([`why`]).
//! - `history dlock/NAME`: the key's last grants, oldest first ([`view`]).
//!
//! kubectl passes its own flags to no plugin, so this one parses the ones kubectl users
//! type (`-n`, `-A`, `--context`, `--kubeconfig`, `-o`) itself, before or after the
//! command, and connects as kubectl would (the kubeconfig's context and namespace).
//! Everything here only reads.

mod complete;
pub(super) mod object;
mod view;
mod why;

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use super::{CliError, exit};
pub use object::{ObjectError, ObjectKind, parse_resource};

/// The plugin's executable name, as kubectl finds it on PATH.
pub const PLUGIN_NAME: &str = "kubectl-lockwarden";
/// The plugin's completion executable name (kubectl's convention for plugins).
pub const COMPLETE_NAME: &str = "kubectl_complete-lockwarden";

/// What the binary was run as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvokedAs {
    /// `kubectl-lockwarden` (or `kubectl lockwarden`).
    Plugin,
    /// `kubectl_complete-lockwarden`.
    Completion,
}

/// Whether `argv0` names the plugin or its completion: the file name, without a
/// directory, compared whole (a symlink keeps its own name in argv[0]).
pub fn invoked_as(argv0: Option<&OsString>) -> Option<InvokedAs> {
    let name = Path::new(argv0?).file_name()?.to_str()?;
    // `.exe` for the odd Windows user; kubectl looks for that name there.
    let name = name.strip_suffix(".exe").unwrap_or(name);
    match name {
        PLUGIN_NAME => Some(InvokedAs::Plugin),
        COMPLETE_NAME => Some(InvokedAs::Completion),
        _ => None,
    }
}

/// Operate lockwarden's DistributedLocks and the Jobs and Pods gated on them.
#[derive(Parser, Debug)]
#[command(
    name = "kubectl lockwarden",
    bin_name = "kubectl lockwarden",
    version,
    subcommand_required = true,
    arg_required_else_help = true,
    after_help = "\
Examples:
  kubectl lockwarden status                    every lock of the namespace
  kubectl lockwarden status dlock/db -n prod   one lock: holders, fences, lease, queue, Events
  kubectl lockwarden why job/nightly           what the Job waits for and what would unblock it
  kubectl lockwarden history dlock/db -o yaml  the key's last grants, oldest first"
)]
pub struct PluginCli {
    #[command(flatten)]
    pub flags: KubeFlags,

    #[command(subcommand)]
    pub command: PluginCommand,
}

/// The kubectl flags the plugin takes itself, anywhere on the line.
#[derive(Args, Clone, Debug, Default, PartialEq)]
pub struct KubeFlags {
    /// The namespace [default: the kubeconfig context's, else `default`]
    #[arg(short, long, global = true, value_name = "NAMESPACE")]
    pub namespace: Option<String>,

    /// Every namespace (`status` without a name)
    #[arg(short = 'A', long, global = true, conflicts_with = "namespace")]
    pub all_namespaces: bool,

    /// The kubeconfig context to use [default: the current context]
    #[arg(long, global = true, value_name = "CONTEXT")]
    pub context: Option<String>,

    /// The kubeconfig file [default: KUBECONFIG, else ~/.kube/config, else in-cluster]
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// Output format [default: text]
    #[arg(short, long, global = true, value_enum, value_name = "FORMAT")]
    pub output: Option<Output>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Json,
    Yaml,
}

#[derive(Subcommand, Debug)]
pub enum PluginCommand {
    /// A lock's phase, holders, fences, lease, queue and last Events; every lock without a name
    Status {
        /// dlock/NAME (also distributedlock/NAME or NAME alone)
        #[arg(value_name = "dlock/NAME")]
        resource: Vec<String>,
    },
    /// Which locks a Job or Pod waits for, who holds them, its position, what would unblock it
    Why {
        /// job/NAME or pod/NAME
        #[arg(value_name = "job/NAME|pod/NAME", required = true)]
        resource: Vec<String>,
    },
    /// The lock key's last grants (holder, cluster, fence, acquired, how each ended), oldest first
    History {
        /// dlock/NAME (also distributedlock/NAME or NAME alone)
        #[arg(value_name = "dlock/NAME", required = true)]
        resource: Vec<String>,

        /// Read the key's history from its store (the newest) instead of the lock's
        /// status.history (as last mirrored), with the key's completed runs (once per
        /// run) if it remembers any; needs the store's credentials here, as
        /// `lockwarden status --history` does (AWS_* for S3 and DynamoDB, KUBECONFIG
        /// for Lease keys, the ensemble's address for ZooKeeper, whose key keeps only
        /// its current holder)
        #[arg(long)]
        store: bool,
    },
}

/// A connection to the cluster, as kubectl would make it from the same flags.
pub struct Cluster {
    pub client: Client,
    /// `-n`, else the context's namespace, else `default`.
    pub namespace: String,
}

impl Cluster {
    pub async fn connect(flags: &KubeFlags) -> Result<Cluster, CliError> {
        let config = kube_config(flags).await?;
        let namespace = flags
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let client = Client::try_from(config).map_err(|e| CliError::Kube {
            context: "cannot make a Kubernetes client".into(),
            cause: e.to_string(),
        })?;
        Ok(Cluster { client, namespace })
    }
}

/// The client configuration: `--kubeconfig` (a file), else KUBECONFIG / ~/.kube/config,
/// else (with no `--context` asked for) the in-cluster service account.
async fn kube_config(flags: &KubeFlags) -> Result<Config, CliError> {
    let options = KubeConfigOptions {
        context: flags.context.clone(),
        ..Default::default()
    };
    let failed = |what: String| {
        move |e: kube::config::KubeconfigError| CliError::Kube {
            context: what,
            cause: e.to_string(),
        }
    };
    match &flags.kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(failed(format!("cannot read kubeconfig {}", path.display())))?;
            Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(failed(format!("kubeconfig {}", path.display())))
        }
        None if flags.context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(failed("kubeconfig (KUBECONFIG or ~/.kube/config)".into())),
        None => Config::infer().await.map_err(|e| CliError::Kube {
            context: "no Kubernetes configuration (KUBECONFIG, ~/.kube/config or in-cluster)"
                .into(),
            cause: e.to_string(),
        }),
    }
}

/// A failed API call, named by what it was for.
pub(crate) fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> CliError {
    let context = what.into();
    move |e| CliError::Kube {
        context,
        cause: e.to_string(),
    }
}

/// What to show, from the command line alone: checked before any connection, so a
/// mistyped object is a usage error wherever the cluster is.
enum Asked {
    List,
    Status(String),
    History { name: String, store: bool },
    Why(ObjectKind, String),
}

fn asked(command: &PluginCommand) -> Result<Asked, CliError> {
    let lock = |words: &[String]| {
        parse_resource(words, &[ObjectKind::Lock], Some(ObjectKind::Lock)).map(|(_, n)| n)
    };
    Ok(match command {
        PluginCommand::Status { resource } if resource.is_empty() => Asked::List,
        PluginCommand::Status { resource } => Asked::Status(lock(resource)?),
        PluginCommand::History { resource, store } => Asked::History {
            name: lock(resource)?,
            store: *store,
        },
        PluginCommand::Why { resource } => {
            let (kind, name) = parse_resource(resource, &[ObjectKind::Job, ObjectKind::Pod], None)?;
            Asked::Why(kind, name)
        }
    })
}

/// Runs the plugin's command.
pub async fn run(cli: PluginCli) -> Result<u8, CliError> {
    let asked = asked(&cli.command)?;
    let cluster = Cluster::connect(&cli.flags).await?;
    let output = cli.flags.output;
    let text = match asked {
        Asked::List => {
            let namespace = (!cli.flags.all_namespaces).then_some(cluster.namespace.as_str());
            view::list(&cluster.client, namespace, output).await?
        }
        Asked::Status(name) => view::status(&cluster, &name, output).await?,
        Asked::History { name, store } => view::history(&cluster, &name, store, output).await?,
        Asked::Why(kind, name) => why::why(&cluster, kind, &name, output).await?,
    };
    print!("{text}");
    Ok(exit::OK)
}

/// Runs the completion executable: prints the candidates for the last argument, one a
/// line, then cobra's directive line. Never fails: no candidates is an answer.
pub async fn complete(args: Vec<String>) -> u8 {
    print!("{}", complete::complete(&args).await);
    exit::OK
}

/// Renders `value` as `-o json` / `-o yaml` asks.
pub(crate) fn render<T: serde::Serialize>(value: &T, output: Output) -> String {
    match output {
        Output::Json => serde_json::to_string_pretty(value).expect("serialises") + "\n",
        Output::Yaml => serde_yaml_ng::to_string(value).expect("serialises"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_it_runs_as_chooses_the_mode() {
        let run_as = |s: &str| invoked_as(Some(&OsString::from(s)));
        assert_eq!(
            run_as("/home/u/.local/bin/kubectl-lockwarden"),
            Some(InvokedAs::Plugin)
        );
        assert_eq!(run_as("kubectl-lockwarden"), Some(InvokedAs::Plugin));
        assert_eq!(
            run_as("/x/kubectl_complete-lockwarden"),
            Some(InvokedAs::Completion)
        );
        assert_eq!(run_as("/usr/bin/lockwarden"), None);
        assert_eq!(run_as("kubectl-lockwarden-old"), None);
        assert_eq!(invoked_as(None), None);
    }
}

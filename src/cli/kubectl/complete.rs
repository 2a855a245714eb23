//! `kubectl_complete-lockwarden ARGS…`: completion the way kubectl plugins offer it.
//! kubectl (≥ 1.26) runs it with the words typed after `kubectl lockwarden`, the last
//! one being the word under completion (empty after a space), and passes its output to
//! the shell as cobra's `__complete` does: one candidate a line (`value<TAB>help`),
//! then a directive line `:N` (4 = no file completion, 0 = the shell's default).

use kube::api::{Api, ListParams};
use kube::config::Kubeconfig;
use kube::{Client, ResourceExt};

use super::{Cluster, KubeFlags};
use lockwarden_api::DistributedLock;
use lockwarden_controller::gating::decide;
use lockwarden_controller::pods::GATED_SELECTOR;

/// cobra's ShellCompDirectiveNoFileComp: candidates only, never file names.
const NO_FILES: &str = ":4";
/// cobra's ShellCompDirectiveDefault: the shell may complete file names.
const FILES: &str = ":0";

const COMMANDS: [(&str, &str); 3] = [
    (
        "status",
        "a lock's holders, fences, lease, queue and Events",
    ),
    (
        "why",
        "which lock a Job or Pod waits for and what would unblock it",
    ),
    ("history", "the lock key's last grants"),
];

const FLAGS: [(&str, &str); 9] = [
    ("-n", "namespace"),
    ("--namespace", "namespace"),
    ("-A", "every namespace"),
    ("--all-namespaces", "every namespace"),
    ("--context", "kubeconfig context"),
    ("--kubeconfig", "kubeconfig file"),
    ("-o", "output format: json or yaml"),
    ("--output", "output format: json or yaml"),
    ("--help", "help"),
];

/// The flags that take a value (the next word, or `--flag=value`).
fn takes_value(flag: &str) -> bool {
    matches!(
        flag,
        "-n" | "--namespace" | "--context" | "--kubeconfig" | "-o" | "--output"
    )
}

/// The words typed so far, split into flags (with values) and positionals.
#[derive(Debug, Default)]
struct Typed {
    flags: KubeFlags,
    positionals: Vec<String>,
    /// The flag whose value is being completed.
    value_of: Option<String>,
}

fn typed(before: &[String]) -> Typed {
    let mut t = Typed::default();
    let mut words = before.iter();
    while let Some(w) = words.next() {
        let (flag, inline) = match w.split_once('=') {
            Some((f, v)) if f.starts_with('-') => (f, Some(v.to_string())),
            _ => (w.as_str(), None),
        };
        if flag.starts_with('-') && flag.len() > 1 {
            if !takes_value(flag) {
                if matches!(flag, "-A" | "--all-namespaces") {
                    t.flags.all_namespaces = true;
                }
                continue;
            }
            let value = match inline {
                Some(v) => v,
                None => match words.next() {
                    Some(v) => v.clone(),
                    None => {
                        t.value_of = Some(flag.to_string());
                        break;
                    }
                },
            };
            match flag {
                "-n" | "--namespace" => t.flags.namespace = Some(value),
                "--context" => t.flags.context = Some(value),
                "--kubeconfig" => t.flags.kubeconfig = Some(value.into()),
                _ => {}
            }
        } else {
            t.positionals.push(w.clone());
        }
    }
    t
}

/// The completion output for `args` (the last is the word being completed).
pub async fn complete(args: &[String]) -> String {
    let (current, before) = match args.split_last() {
        Some((current, before)) => (current.as_str(), before),
        None => ("", &[][..]),
    };
    let t = typed(before);
    let mut candidates: Vec<String> = Vec::new();
    let mut directive = NO_FILES;
    if let Some(flag) = &t.value_of {
        match flag.as_str() {
            "-o" | "--output" => candidates.extend(["json".into(), "yaml".into()]),
            "--kubeconfig" => directive = FILES,
            "--context" => candidates.extend(contexts(&t.flags)),
            _ => {
                if let Ok(cluster) = Cluster::connect(&t.flags).await {
                    candidates.extend(namespaces(&cluster.client).await);
                }
            }
        }
    } else if current.starts_with('-') {
        candidates.extend(FLAGS.iter().map(|(f, help)| format!("{f}\t{help}")));
    } else {
        match t.positionals.first().map(String::as_str) {
            None => candidates.extend(COMMANDS.iter().map(|(c, help)| format!("{c}\t{help}"))),
            Some("status" | "history") if t.positionals.len() == 1 => {
                if let Ok(cluster) = Cluster::connect(&t.flags).await {
                    candidates.extend(lock_names(&cluster).await);
                }
            }
            Some("why") if t.positionals.len() == 1 => {
                if let Ok(cluster) = Cluster::connect(&t.flags).await {
                    candidates.extend(workload_names(&cluster).await);
                }
            }
            _ => {}
        }
    }
    let mut out = String::new();
    for c in candidates.iter().filter(|c| c.starts_with(current)) {
        out.push_str(c);
        out.push('\n');
    }
    out.push_str(directive);
    out.push('\n');
    out
}

/// `dlock/NAME` for every lock of the namespace.
async fn lock_names(cluster: &Cluster) -> Vec<String> {
    Api::<DistributedLock>::namespaced(cluster.client.clone(), &cluster.namespace)
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .map(|lock| format!("dlock/{}", lock.name_any()))
                .collect()
        })
        .unwrap_or_default()
}

/// `job/NAME` for every Job naming a lock and `pod/NAME` for every labelled Pod: the
/// workloads `why` explains.
async fn workload_names(cluster: &Cluster) -> Vec<String> {
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::Pod;
    let ns = &cluster.namespace;
    // Misconfigured ones too: `why` says what is wrong with them.
    let names_a_lock = |a: &std::collections::BTreeMap<String, String>| {
        !matches!(
            decide::locks(a, &lockwarden_controller::jobs::JOB),
            Ok(None)
        )
    };
    let mut out: Vec<String> = Api::<Job>::namespaced(cluster.client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .filter(|j| names_a_lock(j.annotations()))
                .map(|j| format!("job/{}", j.name_any()))
                .collect()
        })
        .unwrap_or_default();
    out.extend(
        Api::<Pod>::namespaced(cluster.client.clone(), ns)
            .list(&ListParams::default().labels(GATED_SELECTOR))
            .await
            .map(|l| {
                l.items
                    .iter()
                    .map(|p| format!("pod/{}", p.name_any()))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default(),
    );
    out
}

async fn namespaces(client: &Client) -> Vec<String> {
    use k8s_openapi::api::core::v1::Namespace;
    Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items.iter().map(|n| n.name_any()).collect())
        .unwrap_or_default()
}

/// The contexts of the kubeconfig `--kubeconfig` names, else of KUBECONFIG /
/// ~/.kube/config.
fn contexts(flags: &KubeFlags) -> Vec<String> {
    let config = match &flags.kubeconfig {
        Some(path) => Kubeconfig::read_from(path),
        None => Kubeconfig::read(),
    };
    config
        .map(|c| c.contexts.into_iter().map(|c| c.name).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_and_their_values_are_told_from_the_command() {
        let t = typed(&words(&["-n", "prod", "status", "--context=c1", "-A"]));
        assert_eq!(t.positionals, ["status"]);
        assert_eq!(t.flags.namespace.as_deref(), Some("prod"));
        assert_eq!(t.flags.context.as_deref(), Some("c1"));
        assert!(t.flags.all_namespaces);
        assert_eq!(t.value_of, None);
        let t = typed(&words(&["why", "--namespace"]));
        assert_eq!(t.value_of.as_deref(), Some("--namespace"));
        assert_eq!(t.positionals, ["why"]);
    }

    #[tokio::test]
    async fn commands_flags_and_formats_need_no_cluster() {
        let out = complete(&words(&[""])).await;
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.last(), Some(&":4"), "{out}");
        let names: Vec<&str> = lines[..lines.len() - 1]
            .iter()
            .map(|l| l.split('\t').next().unwrap())
            .collect();
        assert_eq!(names, ["status", "why", "history"]);
        assert_eq!(complete(&words(&["h"])).await.lines().count(), 2);
        assert_eq!(
            complete(&words(&["status", "-o", ""])).await,
            "json\nyaml\n:4\n"
        );
        assert!(
            complete(&words(&["--kub"]))
                .await
                .starts_with("--kubeconfig\t")
        );
        assert_eq!(complete(&words(&["--kubeconfig", ""])).await, ":0\n");
    }
}

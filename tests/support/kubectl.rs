//! `kubectl` (the installed test tool) against a test control plane.

use std::path::Path;
use std::process::{Output, Stdio};

use tokio::io::AsyncWriteExt;

use super::kube::ControlPlane;
use super::tool;

/// `kubectl ARGS` with the shared control plane's admin kubeconfig, `stdin` piped in.
pub async fn kubectl(args: &[&str], stdin: Option<&str>) -> Output {
    kubectl_on(ControlPlane::shared(), args, stdin).await
}

/// `kubectl ARGS` against `plane` with its admin kubeconfig.
pub async fn kubectl_on(plane: &ControlPlane, args: &[&str], stdin: Option<&str>) -> Output {
    kubectl_as(plane, plane.kubeconfig_path(), args, stdin).await
}

/// `kubectl ARGS` against `plane` with another kubeconfig (e.g. a ServiceAccount's).
/// The discovery cache stays in the plane's directory, out of $HOME.
pub async fn kubectl_as(
    plane: &ControlPlane,
    kubeconfig: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> Output {
    let mut cmd = tokio::process::Command::new(tool("KUBECTL"));
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(plane.dir().join("kubectl-cache"))
        .arg("--request-timeout=60s")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("run kubectl");
    let mut input = child.stdin.take().expect("piped stdin");
    if let Some(stdin) = stdin {
        input
            .write_all(stdin.as_bytes())
            .await
            .expect("write kubectl stdin");
    }
    drop(input);
    child.wait_with_output().await.expect("kubectl output")
}

/// kubectl's stdout, asserting it succeeded (its stderr in the failure message).
pub fn stdout_ok(out: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kubectl {what} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// stdout then stderr, as one text (for messages and `contains` checks).
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A directory to put on PATH holding the plugin as kubectl finds it: the built binary
/// linked as `kubectl-lockwarden` and as its completion `kubectl_complete-lockwarden`
/// (what the README tells users to do).
pub fn plugin_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for name in ["kubectl-lockwarden", "kubectl_complete-lockwarden"] {
        std::os::unix::fs::symlink(super::cli::bin(), dir.path().join(name))
            .expect("link the plugin");
    }
    dir
}

/// The real `kubectl ARGS` with `plugins` first on PATH and the shared control plane's
/// admin kubeconfig in KUBECONFIG (kubectl finds a plugin only when its name comes
/// before any flag, so none is put in front).
pub async fn kubectl_with_plugin(plugins: &Path, args: &[&str]) -> Output {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![plugins.to_path_buf()];
    dirs.extend(std::env::split_paths(&path));
    let plane = ControlPlane::shared();
    let out = tokio::process::Command::new(tool("KUBECTL"))
        .args(args)
        .env("PATH", std::env::join_paths(dirs).expect("a PATH"))
        .env("KUBECONFIG", plane.kubeconfig_path())
        .env("KUBECACHEDIR", plane.dir().join("kubectl-cache"))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .expect("run kubectl");
    eprintln!(
        "$ kubectl {} -> {}\n{}",
        args.join(" "),
        out.status,
        text(&out)
    );
    out
}

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

//! The real node of `scripts/dev up --node`: `support::node::Node::shared()` (a control
//! plane of its own, kube-scheduler, containerd and a kubelet; tests/support/node.rs),
//! kept running until SIGTERM or SIGINT, then torn down by the harness's own exit-time
//! teardown, which checks that no process, mount, cgroup, network namespace, interface
//! or CNI iptables rule of the node is left (and exits 1, naming them, if one is).
//!
//! A Cargo test target (`harness = false`) rather than an example: only tests and
//! benches are compiled with `CARGO_BIN_EXE_lockwarden` and `CARGO_TARGET_TMPDIR`, which
//! the harness needs. `cargo test` runs it too: without `LOCKWARDEN_DEV_NODE_ENV` it
//! does nothing.
//!
//! `LOCKWARDEN_DEV_NODE_ENV=FILE`: once the node is Ready, FILE gets `export` lines
//! (written whole, by a rename): `LOCKWARDEN_NODE_KUBECONFIG` (the node cluster's admin
//! kubeconfig), `LOCKWARDEN_NODE_API_PORT` (its API server's port on 127.0.0.1),
//! `LOCKWARDEN_NODE_CONTAINERD` (containerd's socket, for `ctr --address`) and
//! `LOCKWARDEN_NODE_DIR` (logs and state).
//!
//! Only one node runs per machine (the harness's `flock` on /run/lockwarden-node.lock),
//! so the start may wait for another one. A signal while waiting for that lock ends
//! this process at once (nothing of a node has been started yet); a signal once the
//! lock is held waits for the start to finish, as only a started node has a teardown.

use lockwarden_testsupport as support;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use support::node::Node;
use tokio::signal::unix::{SignalKind, signal};

/// The harness's machine lock (tests/support/node.rs).
const MACHINE_LOCK: &str = "/run/lockwarden-node.lock";

fn main() {
    let Some(env_file) = std::env::var_os("LOCKWARDEN_DEV_NODE_ENV") else {
        println!(
            "dev-node: run by `scripts/dev up --node` (LOCKWARDEN_DEV_NODE_ENV unset): nothing to do"
        );
        return;
    };
    let env_file = std::path::PathBuf::from(env_file);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let ok = runtime.block_on(serve(&env_file));
    drop(runtime);
    if !ok {
        std::process::exit(1);
    }
    // Returning runs the exit handlers: the node's teardown (see the module comment).
}

/// Starts the node, writes `env_file`, waits for SIGTERM or SIGINT; whether the node
/// started.
async fn serve(env_file: &Path) -> bool {
    // Handlers first: from here on a signal never kills this process outright.
    let mut term = signal(SignalKind::terminate()).expect("a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("a SIGINT handler");
    let mut start = tokio::task::spawn_blocking(Node::shared);
    let mut stop_requested = false;
    let started = tokio::select! {
        started = &mut start => started,
        _ = stopped(&mut term, &mut int) => {
            if !holds_machine_lock() {
                eprintln!("dev-node: stopped while waiting for {MACHINE_LOCK}: no node was started");
                // Not a return: the runtime would wait for the blocked start.
                std::process::exit(0);
            }
            eprintln!("dev-node: asked to stop while the node starts: stopping once it has started");
            stop_requested = true;
            start.await
        }
    };
    let node = match started {
        Ok(node) => node,
        Err(e) => {
            // The harness's panic message is in the log already (the panic hook).
            eprintln!("dev-node: the node did not start: {e}");
            return false;
        }
    };
    if stop_requested {
        eprintln!("dev-node: started; stopping as asked: the node's teardown follows");
        return true;
    }
    let lines = format!(
        "export LOCKWARDEN_NODE_KUBECONFIG={}\nexport LOCKWARDEN_NODE_API_PORT={}\n\
         export LOCKWARDEN_NODE_CONTAINERD={}\nexport LOCKWARDEN_NODE_DIR={}\n",
        node.plane().kubeconfig_path().display(),
        node.plane().port(),
        node.containerd_socket().display(),
        node.dir().display(),
    );
    let partial = env_file.with_extension("partial");
    std::fs::write(&partial, lines)
        .and_then(|()| std::fs::rename(&partial, env_file))
        .unwrap_or_else(|e| panic!("write {}: {e}", env_file.display()));
    eprintln!(
        "dev-node: node Ready; its environment is in {}",
        env_file.display()
    );
    stopped(&mut term, &mut int).await;
    eprintln!("dev-node: stopping: the node's teardown follows");
    true
}

async fn stopped(term: &mut tokio::signal::unix::Signal, int: &mut tokio::signal::unix::Signal) {
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// Whether this process holds the machine lock: whether the harness is past waiting
/// for it (/proc/locks names the holder's PID and the file's inode).
fn holds_machine_lock() -> bool {
    let Ok(inode) = std::fs::metadata(MACHINE_LOCK).map(|m| m.ino()) else {
        return false;
    };
    let pid = std::process::id().to_string();
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    locks.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // "1: FLOCK  ADVISORY  WRITE 1234 00:19:5678 0 EOF"
        fields.get(1) == Some(&"FLOCK")
            && fields.get(4) == Some(&pid.as_str())
            && fields
                .get(5)
                .and_then(|dev_inode| dev_inode.rsplit(':').next())
                .is_some_and(|i| i == inode.to_string())
    })
}

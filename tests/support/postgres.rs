//! PostgreSQL from Debian's packages (`scripts/testenv`: `POSTGRES_BIN`,
//! `POSTGRES_USER`): one server per test binary, listening on 127.0.0.1 only, on a
//! free port, with its Unix socket beside its data.
//!
//! `initdb` and `postgres` refuse to run as root, so both run as `POSTGRES_USER` (the
//! system user Debian's package creates), which owns the data directory. That user
//! must be able to reach the directory: the run's [`work_dir`] is used when every
//! directory above it is searchable by others; otherwise (a target directory under
//! root's 0700 home) the data lives in a directory of the system's temporary directory
//! named after this test binary's PID, and `<work_dir>/data` links to it. Directories
//! of test binaries that are gone are removed at the next start.
//!
//! The server's command line names the run's work directory (a placeholder setting,
//! `-c lockwarden.test_run=…`), so the run's guard and `scripts/test`'s left-behind
//! check find it like every other server; its own backends exit when it dies.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::fs::{PermissionsExt, chown, symlink};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{ServerProcess, free_port, tool, unique_suffix, wait_until, work_dir};

/// initdb plus the first start, on a loaded 2-core machine.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(120);

/// The superuser initdb creates; clients connect as it over TCP with trust
/// authentication (loopback only, a throwaway cluster).
pub const SUPERUSER: &str = "postgres";

/// Prefix of the data directories kept outside the work directory.
const TMP_PREFIX: &str = "lockwarden-postgres-";

pub struct Postgres {
    port: u16,
    bin: PathBuf,
    /// Kept for the process's lifetime: dropping it would kill the server.
    _process: ServerProcess,
}

/// The unprivileged account the server runs as.
struct Account {
    uid: u32,
    gid: u32,
}

impl Account {
    fn named(name: &str) -> Account {
        let c_name = CString::new(name).expect("a user name");
        // SAFETY: getpwnam returns a pointer into static storage or null; it is read
        // at once, and only one test thread starts the server.
        let entry = unsafe { libc::getpwnam(c_name.as_ptr()) };
        assert!(
            !entry.is_null(),
            "system user {name:?} (POSTGRES_USER) does not exist; run `scripts/testenv` first"
        );
        let entry = unsafe { &*entry };
        Account {
            uid: entry.pw_uid,
            gid: entry.pw_gid,
        }
    }

    /// Runs `cmd` as this account: groups, group, then user, before exec.
    fn apply(&self, cmd: &mut Command) {
        let (uid, gid) = (self.uid, self.gid);
        // Not `Command::uid`: std changes user *before* changing directory, and the
        // work directory may be where this user cannot go; here the directory is
        // entered as root first.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    fn own(&self, path: &Path) {
        chown(path, Some(self.uid), Some(self.gid))
            .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
    }
}

/// Whether every directory above `path` lets others through.
fn searchable_by_others(path: &Path) -> bool {
    path.ancestors()
        .skip(1)
        .all(|dir| std::fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 != 0))
}

/// Removes data directories of earlier test binaries whose PID is gone.
fn remove_stale_tmp_dirs(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(TMP_PREFIX)
            .and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl Postgres {
    /// The server shared by every test in this binary, started on first use.
    pub fn shared() -> &'static Postgres {
        static SHARED: OnceLock<Postgres> = OnceLock::new();
        SHARED.get_or_init(Postgres::start)
    }

    fn start() -> Postgres {
        let began = Instant::now();
        let bin = tool("POSTGRES_BIN");
        let user = std::env::var("POSTGRES_USER")
            .ok()
            .or_else(|| super::testenv().get("POSTGRES_USER").cloned())
            .unwrap_or_else(|| "postgres".into());
        let account = Account::named(&user);
        let work = work_dir("postgres");
        let base = if searchable_by_others(&work) {
            work.clone()
        } else {
            let tmp = std::env::temp_dir();
            remove_stale_tmp_dirs(&tmp);
            let base = tmp.join(format!(
                "{TMP_PREFIX}{}-{}",
                std::process::id(),
                unique_suffix()
            ));
            std::fs::create_dir_all(&base).expect("create PostgreSQL's directory");
            symlink(&base, work.join("data")).expect("link PostgreSQL's directory");
            base
        };
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755))
            .expect("chmod PostgreSQL's directory");
        let data = base.join("data");
        let sockets = base.join("sockets");
        for dir in [&data, &sockets] {
            std::fs::create_dir_all(dir).expect("create PostgreSQL's directories");
            account.own(dir);
        }

        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args([
                "--username",
                SUPERUSER,
                "--auth",
                "trust",
                "--encoding",
                "UTF8",
                "--locale",
                "C",
                // A throwaway cluster: no fsync of its files.
                "--no-sync",
            ])
            .current_dir(&base);
        account.apply(&mut initdb);
        let out = initdb.output().expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );

        let port = free_port();
        let mut cmd = Command::new(bin.join("postgres"));
        cmd.arg("-D")
            .arg(&data)
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", &format!("port={port}")])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", sockets.display()))
            .args(["-c", "fsync=off", "-c", "max_connections=40"])
            // The guard and scripts/test find the server by this argument.
            .arg("-c")
            .arg(format!("lockwarden.test_run={}/", work.display()));
        account.apply(&mut cmd);
        let mut server = ServerProcess::start("postgres", cmd, &base);
        let isready = bin.join("pg_isready");
        wait_until(
            &mut server,
            STARTUP_TIMEOUT,
            "PostgreSQL to accept connections",
            || {
                Command::new(&isready)
                    .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()])
                    .status()
                    .is_ok_and(|s| s.success())
            },
        );
        eprintln!(
            "[support] PostgreSQL ready on 127.0.0.1:{port} after {:?}",
            began.elapsed()
        );
        Postgres {
            port,
            bin,
            _process: server,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `psql` of the same packages, connected over TCP to the `postgres` database,
    /// stopping at the first error; `script` on its standard input.
    pub fn psql(&self, args: &[&str], script: &str) -> Output {
        let mut child = Command::new(self.bin.join("psql"))
            .args([
                "--no-psqlrc",
                "--set",
                "ON_ERROR_STOP=1",
                "--host",
                "127.0.0.1",
            ])
            .args(["--port", &self.port.to_string(), "--username", SUPERUSER])
            .args(["--dbname", "postgres"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run psql");
        child
            .stdin
            .take()
            .expect("psql's stdin")
            .write_all(script.as_bytes())
            .expect("write psql's script");
        child.wait_with_output().expect("psql exits")
    }
}

//! The lock file `lock` writes and `unlock` reads: JSON with s3lock's fields (`Bucket`,
//! `Key`, `Id`, `ETag`, for S3 locks) and lockwarden's (`url`, `holder`, `nonce`,
//! `fence`, `version`, `lease`, …).
//!
//! ```json
//! {
//!   "Bucket": "my-bucket",
//!   "Key": "lock-object",
//!   "Id": "5f0c…",
//!   "ETag": "\"9b2cf535f27731c974343645a3985328\"",
//!   "url": "s3://my-bucket/lock-object",
//!   "holder": "alice@build-7:4242",
//!   "nonce": "5f0c…",
//!   "fence": 3,
//!   "version": "\"9b2cf535f27731c974343645a3985328\"",
//!   "lease": "1h",
//!   "acquiredAt": "2025-01-01T12:00:00Z"
//! }
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use lockwarden_core::Lease;
use lockwarden_stores::{LockFileFields, StoreFlags, Target, TargetError};

/// Format marker of lock files written by this build.
pub const FORMAT: u32 = 1;

/// The process that keeps a ZooKeeper session (and with it the lock) alive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Keeper {
    pub pid: u32,
    pub host: String,
}

/// One acquisition, as written to disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LockFile {
    /// What another tool reads in a lock file for this key, beside lockwarden's own
    /// fields: s3lock's `Bucket`, `Key`, `Id` (our nonce) and `ETag` for S3 locks
    /// (the store declares them: [`lockwarden_stores::StoreKey::lock_file_fields`]).
    #[serde(flatten)]
    pub store: LockFileFields,
    pub url: String,
    pub holder: String,
    pub nonce: String,
    pub fence: u64,
    /// The backend's version of the record: release is conditioned on it.
    pub version: String,
    /// How long the lock lasts without `unlock` (it is never renewed).
    pub lease: String,
    /// Informational (wall clock).
    pub acquired_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// The backend flags `lock` was given, so `unlock` reaches the same store without
    /// repeating them (flags given to `unlock` still win); each store says which it
    /// saves.
    #[serde(default, skip_serializing_if = "StoreFlags::is_empty")]
    pub backend: StoreFlags,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keeper: Option<Keeper>,
    /// lockwarden's lock file format.
    pub format: u32,
}

/// A lock file that cannot be read, parsed or written.
#[derive(Debug, thiserror::Error)]
pub enum LockFileError {
    #[error("lock file {}: no such file", path.display())]
    NotFound { path: PathBuf },

    #[error("lock file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("lock file {} is not a lockwarden lock file: {why}", path.display())]
    Corrupt { path: PathBuf, why: String },

    /// Not JSON, or not a lock file's fields.
    #[error("lock file {} is not a lockwarden lock file: {source}", path.display())]
    Unparsable {
        path: PathBuf,
        source: serde_json::Error,
    },

    #[error("lock file {} is not a lockwarden lock file: url: {source}", path.display())]
    BadUrl { path: PathBuf, source: TargetError },

    #[error("lock file {} already exists (unlock it first, remove it, or choose another file with --output)", path.display())]
    Exists { path: PathBuf },

    #[error("lock file {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl LockFile {
    /// The file for a lease just acquired on `target`.
    pub fn new(
        target: &Target,
        lease: &Lease,
        lease_duration: Duration,
        backend: StoreFlags,
    ) -> LockFile {
        LockFile {
            store: target.lock_file_fields(lease.nonce(), &lease.version.0),
            url: target.url(),
            holder: lease.holder().to_string(),
            nonce: lease.nonce().to_string(),
            fence: lease.fence().0,
            version: lease.version.0.clone(),
            lease: humantime::format_duration(lease_duration).to_string(),
            acquired_at: humantime::format_rfc3339_seconds(lease.acquired_at()).to_string(),
            data: lease.record.data.clone(),
            backend,
            keeper: None,
            format: FORMAT,
        }
    }

    /// The lock's target, from `url` (checked when the file is read).
    pub fn target(&self) -> Target {
        Target::parse(&self.url).expect("checked by LockFile::read")
    }

    /// The default file name for a lock on `target`: `<last path segment>.lock`.
    pub fn default_path(target: &Target) -> PathBuf {
        PathBuf::from(format!("{}.lock", target.basename()))
    }

    /// Reads and checks a lock file.
    pub fn read(path: &Path) -> Result<LockFile, LockFileError> {
        let bytes = std::fs::read(path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => LockFileError::NotFound {
                path: path.to_path_buf(),
            },
            _ => LockFileError::Read {
                path: path.to_path_buf(),
                source,
            },
        })?;
        LockFile::parse(path, &bytes)
    }

    /// Parses and checks the contents of the lock file at `path` (named in errors).
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<LockFile, LockFileError> {
        let corrupt = |why: String| LockFileError::Corrupt {
            path: path.to_path_buf(),
            why,
        };
        let file: LockFile = serde_json::from_slice(bytes).map_err(|source| {
            if bytes.iter().all(u8::is_ascii_whitespace) {
                corrupt("the file is empty".into())
            } else {
                LockFileError::Unparsable {
                    path: path.to_path_buf(),
                    source,
                }
            }
        })?;
        if file.format != FORMAT {
            return Err(corrupt(format!(
                "format {} is not supported (this build reads format {FORMAT})",
                file.format
            )));
        }
        let target = Target::parse(&file.url).map_err(|source| LockFileError::BadUrl {
            path: path.to_path_buf(),
            source,
        })?;
        if file.nonce.is_empty() {
            return Err(corrupt("empty nonce".into()));
        }
        if file.holder.is_empty() {
            return Err(corrupt("empty holder".into()));
        }
        target
            .check_lock_file_fields(&file.store)
            .map_err(|e| corrupt(e.to_string()))?;
        if target.is_session_bound() && file.version.rsplit_once(':').is_none() {
            return Err(corrupt(format!(
                "version {:?} is not a ZooKeeper entry (NAME:VERSION)",
                file.version
            )));
        }
        Ok(file)
    }

    /// Writes the file; fails if it exists (an earlier lock's file is never
    /// overwritten: it is what unlocks that lock).
    pub fn create(&self, path: &Path) -> Result<(), LockFileError> {
        let mut json = serde_json::to_vec_pretty(self).expect("lock file serialises");
        json.push(b'\n');
        let write_err = |source| LockFileError::Write {
            path: path.to_path_buf(),
            source,
        };
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|source| match source.kind() {
                std::io::ErrorKind::AlreadyExists => LockFileError::Exists {
                    path: path.to_path_buf(),
                },
                _ => write_err(source),
            })?;
        if let Err(e) = file.write_all(&json).and_then(|()| file.sync_all()) {
            let _ = std::fs::remove_file(path);
            return Err(write_err(e));
        }
        Ok(())
    }

    /// Removes the file.
    pub fn remove(path: &Path) -> Result<(), LockFileError> {
        match std::fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(LockFileError::Write {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// When the lock was acquired, if the file says.
    pub fn acquired(&self) -> Option<SystemTime> {
        humantime::parse_rfc3339_weak(&self.acquired_at).ok()
    }
}

/// Checks, before acquiring, that a lock file can be created at `path`: its directory
/// exists. (Whether the file itself exists is checked when it is created, after the
/// lock is taken, so a second `lock` reports who holds the lock.)
pub fn check_writable(path: &Path) -> Result<(), LockFileError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(LockFileError::Write {
            path: path.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotADirectory,
                format!("{} is not a directory", dir.display()),
            ),
        }),
        Err(e) => Err(LockFileError::Write {
            path: path.to_path_buf(),
            source: std::io::Error::new(e.kind(), format!("directory {}: {e}", dir.display())),
        }),
    }
}

//! A ZooKeeper lock key, `zk://HOST:PORT[,HOST:PORT…][/CHROOT]/PATH`, and ZooKeeper's
//! path rules: what its `PathUtils.validatePath` accepts (absolute, no empty, `.` or
//! `..` segment, no trailing `/`, none of U+0000-U+001F, U+007F-U+009F,
//! U+D800-U+F8FF, U+FFF0-U+FFFF; a character beyond U+FFFF is a surrogate pair in
//! Java and so refused too). ZooKeeper bounds a path only by the request size
//! (`jute.maxbuffer`); lockwarden keeps lock paths (chroot included) within
//! [`PATH_MAX_BYTES`] so that the CRD's rules stay cheap to evaluate. `/zookeeper` is
//! not refused: the server lets clients create below it (3.9.5 refuses only
//! `/zookeeper/config`, by its ACL, which a lock reports as an error).

use std::fmt;

use crate::store::{StoreKey, TargetError, bad_name, invalid};
use lockwarden_core::names::{self, NameError};

/// The client port used when a server is given without one.
pub const DEFAULT_PORT: u16 = 2181;
/// Lock paths (chroot included): at most this many bytes of UTF-8 (lockwarden's bound,
/// see the module documentation).
pub const PATH_MAX_BYTES: usize = 1024;
/// A character ZooKeeper refuses in a path besides the control characters.
pub const BAD_CHARACTER_PATTERN: &str = r"[\x{E000}-\x{F8FF}\x{FFF0}-\x{10FFFF}]";
/// An absolute path below the root: `/a/b`, no trailing `/`, no empty segment.
pub const PATH_PATTERN: &str = "^(/[^/]+)+$";
/// A `.` or `..` segment anywhere in a path.
pub const DOT_SEGMENT_PATTERN: &str = "/[.][.]?(/|$)";

const RELATIVE_RULE: &str = "must start with /";
const ROOT_RULE: &str = "must name a znode below the root /";
const TRAILING_SLASH_RULE: &str = "must not end with /";
const SEGMENT_RULE: &str = "has an empty, \".\" or \"..\" segment";
const CHARACTER_RULE: &str =
    "ZooKeeper paths cannot contain U+E000-U+F8FF, U+FFF0-U+FFFF or characters beyond U+FFFF";

/// Whether ZooKeeper refuses `c` in a path (beyond the control characters). Java sees
/// a character beyond U+FFFF as two surrogates (U+D800-U+DFFF), which it refuses.
fn refused(c: char) -> bool {
    matches!(c as u32, 0xE000..=0xF8FF | 0xFFF0..) || c.is_control()
}

/// An absolute path below the root (a lock path, or a chroot), at most
/// [`PATH_MAX_BYTES`].
pub fn path_name(path: &str) -> Result<(), NameError> {
    const WHAT: &str = "ZooKeeper path";
    if path.is_empty() {
        return Err(NameError::Empty { what: WHAT });
    }
    if path.len() > PATH_MAX_BYTES {
        return Err(NameError::TooLong {
            what: WHAT,
            len: path.len(),
            max: PATH_MAX_BYTES,
        });
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(names::invalid(WHAT, path, RELATIVE_RULE));
    };
    if rest.is_empty() {
        return Err(names::invalid(WHAT, path, ROOT_RULE));
    }
    if rest.ends_with('/') {
        return Err(names::invalid(WHAT, path, TRAILING_SLASH_RULE));
    }
    if rest
        .split('/')
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return Err(names::invalid(WHAT, path, SEGMENT_RULE));
    }
    names::no_control_characters(WHAT, path)?;
    match path.char_indices().find(|(_, c)| refused(*c)) {
        Some((at, c)) => Err(NameError::Character {
            what: WHAT,
            code: c as u32,
            at,
            rule: CHARACTER_RULE,
        }),
        None => Ok(()),
    }
}

/// A queue of ephemeral sequential znodes under `chroot` + `path`.
///
/// In a URL the chroot cannot be told apart from the path (`zk://h:2181/a/b` is chroot
/// `/a`, path `/b` as much as path `/a/b`), and both name the same znodes, so a parsed
/// URL puts everything in `path`; the operator may still set a chroot explicitly.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ZkKey {
    /// `host:port` of each server.
    pub servers: Vec<String>,
    /// `/a/b`, without a trailing slash.
    pub chroot: Option<String>,
    /// Absolute path of the lock (below the chroot, if any).
    pub path: String,
}

impl ZkKey {
    /// The connect string: the servers and the chroot.
    pub fn connect_string(&self) -> String {
        format!(
            "{}{}",
            self.servers.join(","),
            self.chroot.as_deref().unwrap_or("")
        )
    }
}

impl StoreKey for ZkKey {
    const KIND: &'static str = "zookeeper";
    const SCHEMES: &'static [&'static str] = &["zk", "zookeeper"];
    const FORM: &'static str = "zk://HOST:PORT[,HOST:PORT…][/CHROOT]/PATH";
    const ABOUT: &'static str = "ZooKeeper queue of ephemeral sequential znodes";

    fn parse(url: &str, rest: &str) -> Result<ZkKey, TargetError> {
        parse_url(url, rest)
    }

    fn name(&self) -> &str {
        &self.path
    }

    /// The chroot and path without the servers: a URL's server list differs between
    /// clients of one ensemble.
    fn order_key(&self) -> String {
        format!("zk://{}{}", self.chroot.as_deref().unwrap_or(""), self.path)
    }

    fn is_session_bound(&self) -> bool {
        true
    }

    /// Session expiry deletes the holder's entry and wakes every waiter at once: no
    /// lease for a delay to live in (docs/design.md rule 8).
    fn supports_lock_delay(&self) -> bool {
        false
    }

    /// The queue is the sequence of entries, and "the lowest sequence holds" is what
    /// every client of the key (kafka-kit, Curator, earlier lockwarden) obeys: a
    /// priority would let two of them hold at once (docs/design.md §6.4).
    fn supports_priorities(&self) -> bool {
        false
    }
}

impl fmt::Display for ZkKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "zk://{}{}", self.connect_string(), self.path)
    }
}

const FORM: &str = ZkKey::FORM;

fn parse_url(url: &str, rest: &str) -> Result<ZkKey, TargetError> {
    let (hosts, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if hosts.is_empty() {
        return Err(invalid(url, "no ZooKeeper server", FORM));
    }
    let mut servers = Vec::new();
    for server in hosts.split(',') {
        servers.push(parse_zk_server(url, server)?);
    }
    if path.is_empty() || path == "/" {
        return Err(invalid(url, "no lock path after the servers", FORM));
    }
    path_name(path).map_err(|e| bad_name(url, e, FORM))?;
    Ok(ZkKey {
        servers,
        chroot: None,
        path: path.to_string(),
    })
}

fn parse_zk_server(url: &str, server: &str) -> Result<String, TargetError> {
    let server = server.trim();
    if server.is_empty() {
        return Err(invalid(
            url,
            "empty server address in the server list",
            FORM,
        ));
    }
    // `[v6::addr]:port`, `host:port` or `host`.
    let (host, port) = if let Some(inner) = server.strip_prefix('[') {
        match inner.split_once(']') {
            Some((addr, "")) => (format!("[{addr}]"), None),
            Some((addr, port)) if port.starts_with(':') => (format!("[{addr}]"), Some(&port[1..])),
            _ => {
                return Err(invalid(
                    url,
                    format!("invalid server address {server:?}"),
                    FORM,
                ));
            }
        }
    } else {
        match server.rsplit_once(':') {
            Some((host, port)) => (host.to_string(), Some(port)),
            None => (server.to_string(), None),
        }
    };
    let host_ok = !host.is_empty()
        && (host.starts_with('[')
            || host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')));
    if !host_ok {
        return Err(invalid(url, format!("invalid server host {host:?}"), FORM));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
            invalid(
                url,
                format!("invalid port {p:?} for server {host} (1-65535)"),
                FORM,
            )
        })?,
    };
    Ok(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_path_utils() {
        for ok in [
            "/a",
            "/locks/db-1",
            "/a/.hidden",
            "/a/..x",
            "/é/\u{a0}",
            "/\u{ffef}",
        ] {
            assert_eq!(path_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "/",
            "a/b",
            "/a/",
            "/a//b",
            "/a/./b",
            "/a/..",
            "/.",
            "/a\u{0}",
            "/a\n",
            "/a\u{85}",
            "/a\u{e000}",
            "/a\u{f8ff}",
            "/a\u{fff0}",
            "/a\u{fffd}",
            "/a\u{ffff}",
            "/a\u{1f600}",
        ] {
            assert!(path_name(bad).is_err(), "{bad:?}");
        }
        let at_limit = format!("/{}", "z".repeat(PATH_MAX_BYTES - 1));
        assert_eq!(path_name(&at_limit), Ok(()));
        assert!(path_name(&format!("{at_limit}z")).is_err());
        assert!(
            path_name("/a\u{e000}")
                .unwrap_err()
                .to_string()
                .contains("ZooKeeper paths cannot contain U+E000-U+F8FF")
        );
    }
}

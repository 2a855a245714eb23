//! `spec.backend.zookeeper` of a `DistributedLock`: a lock queue in ZooKeeper, its
//! admission rules (CEL, and the same checks in Rust) and how it becomes a key and
//! connection options.

use kube::KubeSchema;
use kube::core::Rule;
use serde::{Deserialize, Serialize};

use crate::schema::{
    MAX_DURATION_LEN, RuleExt, lit, no_control_characters, optional_immutable, positive_duration,
};
use crate::store_spec::{
    SpecFieldError, StoreSpec, check, invalid, parse_spec_duration, unchanged,
};
use lockwarden_stores::zookeeper::ZooKeeperOptions;
use lockwarden_stores::zookeeper::key::{
    BAD_CHARACTER_PATTERN, DOT_SEGMENT_PATTERN, PATH_MAX_BYTES, PATH_PATTERN, ZkKey, path_name,
};

/// `spec.backend.zookeeper.sessionTimeout`, in messages.
const SESSION_TIMEOUT: &str = "spec.backend.zookeeper.sessionTimeout";

/// A lock queue in ZooKeeper.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::strip_nullable)]
#[x_kube(validation = optional_immutable("chroot"), validation = full_path_size())]
pub struct ZooKeeperBackend {
    /// The ensemble, as `host:port` entries.
    #[schemars(length(min = 1, max = 16), inner(length(max = 261)))]
    #[x_kube(validation = servers_rule())]
    pub servers: Vec<String>,
    /// Absolute path of the lock (its queue lives under it), relative to `chroot`;
    /// chroot and path together at most 1,024 bytes of UTF-8.
    #[schemars(length(max = PATH_MAX_BYTES))]
    #[x_kube(
        validation = path_rule("path"),
        validation = no_control_characters("path"),
        validation = path_characters("path"),
        validation = crate::schema::immutable("path")
    )]
    pub path: String,
    /// Absolute path every other path is relative to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = PATH_MAX_BYTES))]
    #[x_kube(
        validation = path_rule("chroot"),
        validation = no_control_characters("chroot"),
        validation = path_characters("chroot")
    )]
    pub chroot: Option<String>,
    /// Requested session timeout (Go duration such as `10s`); the server may adjust it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_DURATION_LEN))]
    #[x_kube(validation = positive_duration("sessionTimeout"))]
    pub session_timeout: Option<String>,
}

/// `host:port` with a DNS name, an IPv4 address or a bracketed IPv6 address.
const HOST_PORT_RE: &str = "^([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?([.][A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*|\\[[0-9A-Fa-f:.]+\\]):[1-9][0-9]{0,4}$";
/// On a path: absolute, no trailing `/`, no empty, `.` or `..` segment.
fn path_rule(field: &str) -> Rule {
    Rule::new(format!(
        "self.matches({}) && !self.matches({})",
        lit(PATH_PATTERN),
        lit(DOT_SEGMENT_PATTERN)
    ))
    .msg(format!(
        "{field} must be an absolute ZooKeeper path such as /locks/name: no trailing '/', no empty, '.' or '..' segments"
    ))
}

/// On a ZooKeeper path: none of the characters ZooKeeper refuses besides the control
/// characters.
fn path_characters(field: &str) -> Rule {
    Rule::new(format!(
        "!self.matches({})",
        lit(BAD_CHARACTER_PATTERN)
    ))
    .msg(format!(
        "{field} must not contain U+E000-U+F8FF, U+FFF0-U+FFFF or characters beyond U+FFFF (ZooKeeper refuses them)"
    ))
}

/// On the ZooKeeper backend: chroot and path together stay within the path limit.
fn full_path_size() -> Rule {
    let max = PATH_MAX_BYTES;
    Rule::new(format!(
        "size(bytes((has(self.chroot) ? self.chroot : '') + self.path)) <= {max}"
    ))
    .msg(format!(
        "chroot and path together must be at most {max} bytes (UTF-8)"
    ))
    .field_path(".path")
}

/// On `servers`: `host:port` entries.
fn servers_rule() -> Rule {
    Rule::new(format!(
        "self.all(s, s.matches({}) && int(s.substring(s.lastIndexOf(':') + 1)) <= 65535)",
        lit(HOST_PORT_RE)
    ))
    .msg("servers must be host:port entries such as zk-0.zk:2181 (port 1-65535)")
}

impl ZooKeeperBackend {
    /// The session timeout asked for (`validate` refuses a malformed one; none reaches
    /// here from it).
    pub fn options(&self) -> ZooKeeperOptions {
        ZooKeeperOptions {
            session_timeout: self
                .session_timeout
                .as_deref()
                .and_then(|t| parse_spec_duration(SESSION_TIMEOUT, t).ok()),
        }
    }
}

impl StoreSpec for ZooKeeperBackend {
    type Key = ZkKey;

    fn key(&self, _lock_namespace: &str) -> ZkKey {
        ZkKey {
            servers: self.servers.clone(),
            chroot: self.chroot.clone(),
            path: self.path.clone(),
        }
    }

    fn validate(&self) -> Result<(), SpecFieldError> {
        if self.servers.is_empty() || self.servers.len() > 16 {
            return Err(invalid(
                "zookeeper.servers",
                "must list 1-16 host:port entries",
            ));
        }
        if let Some(bad) = self.servers.iter().find(|s| !check_host_port(s)) {
            return Err(invalid(
                "zookeeper.servers",
                &format!("{bad:?} is not a host:port entry"),
            ));
        }
        check("zookeeper.path", path_name(&self.path))?;
        if let Some(chroot) = &self.chroot {
            check("zookeeper.chroot", path_name(chroot))?;
        }
        let full = format!("{}{}", self.chroot.as_deref().unwrap_or(""), self.path);
        check("zookeeper.path", path_name(&full))?;
        if let Some(t) = &self.session_timeout {
            parse_spec_duration(SESSION_TIMEOUT, t)?;
        }
        Ok(())
    }

    fn validate_update(&self, old: &ZooKeeperBackend) -> Result<(), SpecFieldError> {
        unchanged("zookeeper.path", &self.path, &old.path)?;
        unchanged("zookeeper.chroot", &self.chroot, &old.chroot)
    }

    /// Rule 8 has nowhere to live: session expiry deletes the holder's entry and wakes
    /// every waiter at once (docs/design.md rule 8).
    fn supports_lock_delay(&self) -> bool {
        false
    }

    /// The entries' order is the queue every client obeys (docs/design.md §6.4).
    fn supports_priorities(&self) -> bool {
        false
    }
}

// ---- The servers rule in Rust. ----

/// One RFC 1123 label, with `upper` letters allowed or not.
fn check_label(s: &str, upper: bool) -> bool {
    let b = s.as_bytes();
    let ok =
        |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit() || (upper && c.is_ascii_uppercase());
    !b.is_empty() && ok(b[0]) && ok(b[b.len() - 1]) && b.iter().all(|&c| ok(c) || c == b'-')
}

/// `HOST_PORT_RE` and port ≤ 65535.
fn check_host_port(s: &str) -> bool {
    let Some((host, port)) = s.rsplit_once(':') else {
        return false;
    };
    let port_ok = (1..=5).contains(&port.len())
        && !port.starts_with('0')
        && port.bytes().all(|c| c.is_ascii_digit())
        && port.parse::<u32>().is_ok_and(|p| p <= 65535);
    let host_ok = if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        !inner.is_empty()
            && inner
                .bytes()
                .all(|c| c.is_ascii_hexdigit() || c == b':' || c == b'.')
    } else {
        host.split('.').all(|label| check_label(label, true))
    };
    port_ok && host_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ports() {
        for ok in [
            "zk:2181",
            "zk-0.zk.ns.svc:2181",
            "127.0.0.1:1",
            "[::1]:2181",
            "Host:65535",
        ] {
            assert!(check_host_port(ok), "{ok}");
        }
        for bad in [
            "zk", "zk:", ":2181", "zk:0", "zk:65536", "zk:02181", "-zk:1", "zk..a:1", "[]:1",
            "zk:1:2",
        ] {
            assert!(!check_host_port(bad), "{bad}");
        }
    }
}

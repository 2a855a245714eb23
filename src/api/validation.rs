//! The admission rules of the CRD, twice: as CEL (`x-kubernetes-validations`, enforced
//! by the API server) and as Rust (the same checks, for the CLI, the controller and
//! unit tests). Keep the two in step: `tests/crd/` sends every invalid spec of its
//! table to a real API server and also through [`DistributedLockSpec::validate`].
//!
//! The name and size rules themselves live in [`crate::lock::names`], shared with the
//! command-line URL parser: the CEL rules here are built from its constants and
//! patterns, and the Rust checks call it.
//!
//! CEL notes: Kubernetes rejects rules whose estimated cost is too high, so every
//! string a rule reads has a `maxLength` and every list a `maxItems`. Regexes avoid
//! backslashes (`[.]` instead of `\.`) where they can, so they read the same in Rust,
//! CEL and YAML; the character-class rules need them (`\p{Cc}`), and [`lit`] escapes
//! them for CEL. Sizes in bytes are `size(bytes(self))`: `size(self)` and `maxLength`
//! count characters.
//!
//! [`DistributedLockSpec::validate`]: super::DistributedLockSpec::validate

use std::time::Duration;

use kube::core::{Message, Reason, Rule};

use super::SpecError;
use super::duration::{DurationError, parse_positive_duration};
use crate::lock::names;
use crate::lock::{Mode, Permits};

/// `Rule::message` for owned strings.
trait RuleExt {
    fn msg(self, message: impl Into<String>) -> Rule;
}

impl RuleExt for Rule {
    fn msg(self, message: impl Into<String>) -> Rule {
        self.message(Message::Message(message.into()))
    }
}

/// A Go duration (`time.ParseDuration`) without a sign: one or more `<number><unit>`.
pub(crate) const DURATION_RE: &str = "^(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+$";
/// `host:port` with a DNS name, an IPv4 address or a bracketed IPv6 address.
const HOST_PORT_RE: &str = "^([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?([.][A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*|\\[[0-9A-Fa-f:.]+\\]):[1-9][0-9]{0,4}$";
/// The longest duration string accepted (also bounds the CEL cost of duration rules).
pub(crate) const MAX_DURATION_LEN: u32 = 32;

/// A property name as Kubernetes CEL spells it: CEL reserved words are escaped as
/// `__word__` (e.g. `self.__namespace__`).
fn cel_property(name: &str) -> String {
    const RESERVED: [&str; 21] = [
        "true",
        "false",
        "null",
        "in",
        "as",
        "break",
        "const",
        "continue",
        "else",
        "for",
        "function",
        "if",
        "import",
        "let",
        "loop",
        "package",
        "namespace",
        "return",
        "var",
        "void",
        "while",
    ];
    if RESERVED.contains(&name) {
        format!("__{name}__")
    } else {
        name.to_string()
    }
}

/// A CEL string literal (single-quoted) for `s`.
fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// `self` is a positive Go duration.
pub(crate) fn positive_duration(field: &str) -> Rule {
    Rule::new(format!(
        "self.matches({}) && duration(self) > duration('0s')",
        lit(DURATION_RE)
    ))
    .msg(format!(
        "{field} must be a positive duration such as \"30s\", \"1m30s\" or \"500ms\""
    ))
}

/// On the spec: `renewInterval < leaseDuration / 2` (skipped while either is malformed;
/// their own rules report that).
pub(crate) fn renew_below_half_lease() -> Rule {
    let re = lit(DURATION_RE);
    Rule::new(format!(
        "!(self.leaseDuration.matches({re}) && self.renewInterval.matches({re})) || \
         duration(self.renewInterval) + duration(self.renewInterval) < duration(self.leaseDuration)"
    ))
    .msg("renewInterval must be less than half of leaseDuration")
    .field_path(".renewInterval")
}

/// On the backend: exactly one kind is set.
pub(crate) fn exactly_one_backend() -> Rule {
    Rule::new(
        "(has(self.s3) ? 1 : 0) + (has(self.dynamodb) ? 1 : 0) + \
         (has(self.zookeeper) ? 1 : 0) + (has(self.kubernetes) ? 1 : 0) == 1",
    )
    .msg("exactly one of backend.s3, backend.dynamodb, backend.zookeeper or backend.kubernetes must be set")
}

/// On the backend: the kind cannot change.
pub(crate) fn backend_kind_immutable() -> Rule {
    Rule::new(
        "has(self.s3) == has(oldSelf.s3) && has(self.dynamodb) == has(oldSelf.dynamodb) && \
         has(self.zookeeper) == has(oldSelf.zookeeper) && has(self.kubernetes) == has(oldSelf.kubernetes)",
    )
    .msg("the backend kind (s3, dynamodb, zookeeper or kubernetes) is immutable; create a new DistributedLock instead")
    .reason(Reason::FieldValueForbidden)
}

/// On a required field: it cannot change.
pub(crate) fn immutable(field: &str) -> Rule {
    Rule::new("self == oldSelf")
        .msg(format!(
            "{field} is immutable: it names the lock; create a new DistributedLock instead"
        ))
        .reason(Reason::FieldValueForbidden)
}

/// On `spec.permits`: it cannot change (every lock on one key names the same number).
pub(crate) fn permits_immutable() -> Rule {
    Rule::new("self == oldSelf")
        .msg(
            "permits is immutable: every lock on a key must name the same permits; \
             create a new DistributedLock instead",
        )
        .reason(Reason::FieldValueForbidden)
}

/// On the spec: `mode` cannot be added, removed or changed.
pub(crate) fn mode_immutable() -> Rule {
    Rule::new(
        "has(self.mode) == has(oldSelf.mode) && (!has(self.mode) || self.mode == oldSelf.mode)",
    )
    .msg("mode is immutable: create a new DistributedLock instead")
    .reason(Reason::FieldValueForbidden)
    .field_path(".mode")
}

/// On the spec: `mode: shared` needs two permits or more (with the lock layer's
/// message).
pub(crate) fn shared_needs_permits() -> Rule {
    let shared_one = Permits {
        total: 1,
        mode: Mode::Shared,
    };
    let message = shared_one
        .validate()
        .expect_err("shared with one permit is refused");
    Rule::new("!has(self.mode) || self.mode != 'shared' || self.permits >= 2")
        .msg(message)
        .field_path(".mode")
}

/// On an object, for its optional field `field`: it cannot be added, removed or changed.
pub(crate) fn optional_immutable(field: &str) -> Rule {
    let f = cel_property(field);
    Rule::new(format!(
        "has(self.{f}) == has(oldSelf.{f}) && (!has(self.{f}) || self.{f} == oldSelf.{f})"
    ))
    .msg(format!(
        "{field} is immutable: it names the lock; create a new DistributedLock instead"
    ))
    .reason(Reason::FieldValueForbidden)
    .field_path(format!(".{field}"))
}

pub(crate) fn non_empty(field: &str) -> Rule {
    Rule::new("size(self) > 0")
        .msg(format!("{field} must not be empty"))
        .reason(Reason::FieldValueRequired)
}

pub(crate) fn s3_bucket() -> Rule {
    Rule::new(format!(
        "self.matches({}) && !self.contains('..')",
        lit(&names::s3_bucket_pattern())
    ))
    .msg("bucket must be a valid S3 bucket name: 3-63 characters of lowercase letters, digits, '.' and '-', starting and ending with a letter or digit")
}

pub(crate) fn dynamodb_table() -> Rule {
    Rule::new(format!(
        "self.matches({})",
        lit(names::DYNAMODB_TABLE_PATTERN)
    ))
    .msg(
        "table must be a valid DynamoDB table name: 3-255 characters of letters, digits, '_', '.' and '-'",
    )
}

/// On a string: at most `max` bytes of UTF-8 (the stores count bytes; `maxLength`
/// counts characters).
pub(crate) fn max_bytes(field: &str, max: usize) -> Rule {
    Rule::new(format!("size(bytes(self)) <= {max}"))
        .msg(format!("{field} must be at most {max} bytes (UTF-8)"))
}

/// On a string: no control characters (Unicode category Cc).
pub(crate) fn no_control_characters(field: &str) -> Rule {
    Rule::new(format!(
        "!self.matches({})",
        lit(names::CONTROL_CHARACTER_PATTERN)
    ))
    .msg(format!("{field} must not contain control characters"))
}

pub(crate) fn zk_path(field: &str) -> Rule {
    Rule::new(format!(
        "self.matches({}) && !self.matches({})",
        lit(names::ZOOKEEPER_PATH_PATTERN),
        lit(names::ZOOKEEPER_DOT_SEGMENT_PATTERN)
    ))
    .msg(format!(
        "{field} must be an absolute ZooKeeper path such as /locks/name: no trailing '/', no empty, '.' or '..' segments"
    ))
}

/// On a ZooKeeper path: none of the characters ZooKeeper refuses besides the control
/// characters.
pub(crate) fn zk_path_characters(field: &str) -> Rule {
    Rule::new(format!(
        "!self.matches({})",
        lit(names::ZOOKEEPER_BAD_CHARACTER_PATTERN)
    ))
    .msg(format!(
        "{field} must not contain U+E000-U+F8FF, U+FFF0-U+FFFF or characters beyond U+FFFF (ZooKeeper refuses them)"
    ))
}

/// On the ZooKeeper backend: chroot and path together stay within the path limit.
pub(crate) fn zk_full_path_size() -> Rule {
    let max = names::ZOOKEEPER_PATH_MAX_BYTES;
    Rule::new(format!(
        "size(bytes((has(self.chroot) ? self.chroot : '') + self.path)) <= {max}"
    ))
    .msg(format!(
        "chroot and path together must be at most {max} bytes (UTF-8)"
    ))
    .field_path(".path")
}

pub(crate) fn zk_servers() -> Rule {
    Rule::new(format!(
        "self.all(s, s.matches({}) && int(s.substring(s.lastIndexOf(':') + 1)) <= 65535)",
        lit(HOST_PORT_RE)
    ))
    .msg("servers must be host:port entries such as zk-0.zk:2181 (port 1-65535)")
}

pub(crate) fn dns_subdomain(field: &str) -> Rule {
    Rule::new(format!(
        "self.matches({})",
        lit(names::DNS_SUBDOMAIN_PATTERN)
    ))
    .msg(format!(
        "{field} must be a valid Kubernetes object name (a lowercase RFC 1123 subdomain)"
    ))
}

pub(crate) fn dns_label(field: &str) -> Rule {
    Rule::new(format!("self.matches({})", lit(names::DNS_LABEL_PATTERN))).msg(format!(
        "{field} must be a valid namespace name (a lowercase RFC 1123 label)"
    ))
}

// ---- The same checks in Rust. ----

/// One RFC 1123 label, with `upper` letters allowed or not.
fn check_label(s: &str, upper: bool) -> bool {
    let b = s.as_bytes();
    let ok =
        |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit() || (upper && c.is_ascii_uppercase());
    !b.is_empty() && ok(b[0]) && ok(b[b.len() - 1]) && b.iter().all(|&c| ok(c) || c == b'-')
}

/// `HOST_PORT_RE` and port ≤ 65535.
pub(crate) fn check_host_port(s: &str) -> bool {
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

/// A positive duration field of the spec, with the CRD's length limit.
pub(crate) fn parse_field(field: &'static str, value: &str) -> Result<Duration, SpecError> {
    if value.len() > MAX_DURATION_LEN as usize {
        return Err(SpecError::Invalid {
            field: field.to_string(),
            message: format!("must be at most {MAX_DURATION_LEN} characters"),
        });
    }
    // Go accepts a leading '+'; the CRD's rule (and so this) does not.
    let parsed = if value.starts_with('+') {
        Err(DurationError::Malformed)
    } else {
        parse_positive_duration(value)
    };
    parsed.map_err(|reason| SpecError::Duration {
        field,
        value: value.to_string(),
        reason,
    })
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

    #[test]
    fn cel_literals_escape() {
        assert_eq!(lit(r"a\[b'"), r"'a\\[b\''");
    }
}

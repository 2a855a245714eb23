//! The admission rules of the CRD, twice: as CEL (`x-kubernetes-validations`, enforced
//! by the API server) and as Rust (the same checks, for the CLI, the controller and
//! unit tests). Keep the two in step: `tests/crd.rs` sends every invalid spec of its
//! table to a real API server and also through [`DistributedLockSpec::validate`].
//!
//! CEL notes: Kubernetes rejects rules whose estimated cost is too high, so every
//! string a rule reads has a `maxLength` and every list a `maxItems`. Regexes avoid
//! backslashes (`[.]` instead of `\.`) so they read the same in Rust, CEL and YAML.
//!
//! [`DistributedLockSpec::validate`]: super::DistributedLockSpec::validate

use kube::core::{Message, Reason, Rule};

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
/// S3 bucket names (general purpose buckets): 3–63 of `a-z 0-9 . -`, starting and
/// ending with a letter or digit.
const S3_BUCKET_RE: &str = "^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$";
/// DynamoDB table names.
const DYNAMODB_TABLE_RE: &str = "^[a-zA-Z0-9_.-]{3,255}$";
/// An absolute ZooKeeper path: `/a/b`, no trailing slash, no empty segment.
const ZK_PATH_RE: &str = "^(/[^/]+)+$";
/// A `.` or `..` segment anywhere in a path.
const ZK_DOT_SEGMENT_RE: &str = "/[.][.]?(/|$)";
/// `host:port` with a DNS name, an IPv4 address or a bracketed IPv6 address.
const HOST_PORT_RE: &str = "^([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?([.][A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*|\\[[0-9A-Fa-f:.]+\\]):[1-9][0-9]{0,4}$";
/// An RFC 1123 DNS subdomain (Kubernetes object names such as Leases and Secrets).
const DNS_SUBDOMAIN_RE: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// An RFC 1123 DNS label (namespace names).
const DNS_LABEL_RE: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

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
        lit(S3_BUCKET_RE)
    ))
    .msg("bucket must be a valid S3 bucket name: 3-63 characters of lowercase letters, digits, '.' and '-', starting and ending with a letter or digit")
}

pub(crate) fn dynamodb_table() -> Rule {
    Rule::new(format!("self.matches({})", lit(DYNAMODB_TABLE_RE))).msg(
        "table must be a valid DynamoDB table name: 3-255 characters of letters, digits, '_', '.' and '-'",
    )
}

pub(crate) fn zk_path(field: &str) -> Rule {
    Rule::new(format!(
        "self.matches({}) && !self.matches({})",
        lit(ZK_PATH_RE),
        lit(ZK_DOT_SEGMENT_RE)
    ))
    .msg(format!(
        "{field} must be an absolute ZooKeeper path such as /locks/name: no trailing '/', no empty, '.' or '..' segments"
    ))
}

pub(crate) fn zk_servers() -> Rule {
    Rule::new(format!(
        "self.all(s, s.matches({}) && int(s.substring(s.lastIndexOf(':') + 1)) <= 65535)",
        lit(HOST_PORT_RE)
    ))
    .msg("servers must be host:port entries such as zk-0.zk:2181 (port 1-65535)")
}

pub(crate) fn dns_subdomain(field: &str) -> Rule {
    Rule::new(format!("self.matches({})", lit(DNS_SUBDOMAIN_RE))).msg(format!(
        "{field} must be a valid Kubernetes object name (a lowercase RFC 1123 subdomain)"
    ))
}

pub(crate) fn dns_label(field: &str) -> Rule {
    Rule::new(format!("self.matches({})", lit(DNS_LABEL_RE))).msg(format!(
        "{field} must be a valid namespace name (a lowercase RFC 1123 label)"
    ))
}

// ---- The same checks in Rust. ----

fn is_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// `S3_BUCKET_RE` and no `..`.
pub(crate) fn check_s3_bucket(s: &str) -> bool {
    let b = s.as_bytes();
    (3..=63).contains(&b.len())
        && is_alnum(b[0])
        && is_alnum(b[b.len() - 1])
        && b.iter().all(|&c| is_alnum(c) || c == b'.' || c == b'-')
        && !s.contains("..")
}

/// `DYNAMODB_TABLE_RE`.
pub(crate) fn check_dynamodb_table(s: &str) -> bool {
    (3..=255).contains(&s.len())
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// `ZK_PATH_RE` and no `.`/`..` segment.
pub(crate) fn check_zk_path(s: &str) -> bool {
    match s.strip_prefix('/') {
        None => false,
        Some(rest) => rest
            .split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != ".."),
    }
}

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

/// `DNS_SUBDOMAIN_RE`, at most 253 characters.
pub(crate) fn check_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(|label| check_label(label, false))
}

/// `DNS_LABEL_RE`, at most 63 characters.
pub(crate) fn check_dns_label(s: &str) -> bool {
    s.len() <= 63 && check_label(s, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_names() {
        for ok in ["abc", "my-bucket.v2", "0ab", &"a".repeat(63)] {
            assert!(check_s3_bucket(ok), "{ok}");
        }
        for bad in [
            "ab",
            "Abc",
            "-abc",
            "abc-",
            "a_b",
            "a..b",
            &"a".repeat(64),
            "",
        ] {
            assert!(!check_s3_bucket(bad), "{bad}");
        }
    }

    #[test]
    fn table_names() {
        assert!(check_dynamodb_table("Locks_v1.x-y"));
        assert!(!check_dynamodb_table("ab"));
        assert!(!check_dynamodb_table("a b c"));
        assert!(!check_dynamodb_table(&"a".repeat(256)));
    }

    #[test]
    fn zk_paths() {
        for ok in ["/a", "/locks/db-1", "/a/.hidden", "/a/..x"] {
            assert!(check_zk_path(ok), "{ok}");
        }
        for bad in ["", "/", "a/b", "/a/", "/a//b", "/a/./b", "/a/..", "/."] {
            assert!(!check_zk_path(bad), "{bad}");
        }
    }

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
    fn dns_names() {
        assert!(check_dns_subdomain("a.b-c.d"));
        assert!(!check_dns_subdomain("A"));
        assert!(!check_dns_subdomain("a..b"));
        assert!(!check_dns_subdomain(""));
        assert!(check_dns_label("ns-1"));
        assert!(!check_dns_label("a.b"));
    }

    #[test]
    fn cel_literals_escape() {
        assert_eq!(lit(r"a\[b'"), r"'a\\[b\''");
    }
}

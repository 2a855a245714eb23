//! The name and size rules of every store, written once. The command-line URL parser
//! (`backend::url`), the `DistributedLock` admission rules (the CRD's CEL rules and
//! their Rust twin in `api::validation`) and Job gating all call these, so a lock key
//! one of them accepts is accepted by all.
//!
//! The limits are the services' own:
//! - S3: bucket names 3-63 of `a-z 0-9 . -`, starting and ending with a letter or
//!   digit, no `..`; object keys at most 1,024 bytes of UTF-8.
//! - DynamoDB: table names 3-255 of `a-z A-Z 0-9 _ . -`; a partition key value at most
//!   2,048 bytes, a sort key value at most 1,024 bytes; key attribute names at most
//!   255 bytes.
//! - ZooKeeper: what its `PathUtils.validatePath` accepts (absolute, no empty, `.` or
//!   `..` segment, no trailing `/`, none of U+0000-U+001F, U+007F-U+009F,
//!   U+D800-U+F8FF, U+FFF0-U+FFFF; a character beyond U+FFFF is a surrogate pair in
//!   Java and so refused too). ZooKeeper bounds a path only by the request size
//!   (`jute.maxbuffer`); lockwarden keeps lock paths (chroot included) within
//!   [`ZOOKEEPER_PATH_MAX_BYTES`] so that the CRD's rules stay cheap to evaluate.
//!   `/zookeeper` is not refused: the server lets clients create below it (3.9.5
//!   refuses only `/zookeeper/config`, by its ACL, which a lock reports as an error).
//! - Kubernetes: object names (Leases, Secrets, DistributedLocks) are DNS-1123
//!   subdomains of at most 253 characters; namespaces DNS-1123 labels of at most 63.
//!
//! Control characters (Unicode category Cc: U+0000-U+001F, U+007F-U+009F) are refused
//! in every name and key, also where the store itself would take them: they break
//! lock files, logs and terminals.
//!
//! The `*_PATTERN` constants and functions are the same rules as regular expressions
//! (RE2 syntax, as CEL's `matches` reads them) for the CRD.

/// S3 bucket names: at least this many characters.
pub const S3_BUCKET_MIN_LEN: usize = 3;
/// S3 bucket names: at most this many characters.
pub const S3_BUCKET_MAX_LEN: usize = 63;
/// S3 object keys: at most this many bytes of UTF-8.
pub const S3_KEY_MAX_BYTES: usize = 1024;
/// DynamoDB table names: at least this many characters.
pub const DYNAMODB_TABLE_MIN_LEN: usize = 3;
/// DynamoDB table names: at most this many characters.
pub const DYNAMODB_TABLE_MAX_LEN: usize = 255;
/// DynamoDB partition key values: at most this many bytes of UTF-8.
pub const DYNAMODB_KEY_MAX_BYTES: usize = 2048;
/// DynamoDB sort key values: at most this many bytes of UTF-8.
pub const DYNAMODB_SORT_KEY_MAX_BYTES: usize = 1024;
/// DynamoDB key attribute names: at most this many bytes of UTF-8.
pub const DYNAMODB_ATTRIBUTE_NAME_MAX_BYTES: usize = 255;
/// ZooKeeper lock paths (chroot included): at most this many bytes of UTF-8
/// (lockwarden's bound, see the module documentation).
pub const ZOOKEEPER_PATH_MAX_BYTES: usize = 1024;
/// Kubernetes object names (DNS-1123 subdomains): at most this many characters.
pub const KUBERNETES_NAME_MAX_LEN: usize = 253;
/// Kubernetes namespace names (DNS-1123 labels): at most this many characters.
pub const KUBERNETES_NAMESPACE_MAX_LEN: usize = 63;

/// A control character anywhere (Unicode category Cc, as [`char::is_control`]).
pub const CONTROL_CHARACTER_PATTERN: &str = r"\p{Cc}";
/// A character ZooKeeper refuses in a path besides the control characters.
pub const ZOOKEEPER_BAD_CHARACTER_PATTERN: &str = r"[\x{E000}-\x{F8FF}\x{FFF0}-\x{10FFFF}]";
/// An absolute ZooKeeper path below the root: `/a/b`, no trailing `/`, no empty segment.
pub const ZOOKEEPER_PATH_PATTERN: &str = "^(/[^/]+)+$";
/// A `.` or `..` segment anywhere in a path.
pub const ZOOKEEPER_DOT_SEGMENT_PATTERN: &str = "/[.][.]?(/|$)";
/// DynamoDB table names, length included.
pub const DYNAMODB_TABLE_PATTERN: &str = "^[a-zA-Z0-9_.-]{3,255}$";
/// An RFC 1123 DNS subdomain (length checked separately).
pub const DNS_SUBDOMAIN_PATTERN: &str =
    "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// An RFC 1123 DNS label (length checked separately).
pub const DNS_LABEL_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// S3 bucket names, length included (the `..` rule is separate).
pub fn s3_bucket_pattern() -> String {
    format!(
        "^[a-z0-9][a-z0-9.-]{{{},{}}}[a-z0-9]$",
        S3_BUCKET_MIN_LEN - 2,
        S3_BUCKET_MAX_LEN - 2
    )
}

const S3_BUCKET_RULE: &str = "3-63 lowercase letters, digits, dots and hyphens, starting and \
     ending with a letter or digit, without \"..\"";
const DYNAMODB_TABLE_RULE: &str = "3-255 letters, digits, underscores, hyphens and dots";
const KUBERNETES_NAME_RULE: &str = "a DNS-1123 subdomain: at most 253 lowercase letters, \
     digits, '-' and '.', each dot-separated part starting and ending with a letter or digit";
const KUBERNETES_NAMESPACE_RULE: &str = "a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and ending \
     with a letter or digit";
const ZOOKEEPER_RELATIVE_RULE: &str = "must start with /";
const ZOOKEEPER_ROOT_RULE: &str = "must name a znode below the root /";
const ZOOKEEPER_TRAILING_SLASH_RULE: &str = "must not end with /";
const ZOOKEEPER_SEGMENT_RULE: &str = "has an empty, \".\" or \"..\" segment";

/// The longest value a message quotes in full.
const QUOTED_MAX_CHARS: usize = 80;

/// A name or key a store would refuse (or lockwarden refuses, for control characters).
/// The message names what was checked and the rule or limit it broke.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{what} is empty")]
    Empty { what: &'static str },

    #[error("{what} is longer than {max} bytes ({len} bytes in UTF-8)")]
    TooLong {
        what: &'static str,
        len: usize,
        max: usize,
    },

    #[error("{what} contains control characters (U+{code:04X} at byte {at}); none are allowed")]
    ControlCharacter {
        what: &'static str,
        code: u32,
        at: usize,
    },

    #[error(
        "{what} contains U+{code:04X} at byte {at}; ZooKeeper paths cannot contain \
         U+E000-U+F8FF, U+FFF0-U+FFFF or characters beyond U+FFFF"
    )]
    ZooKeeperCharacter {
        what: &'static str,
        code: u32,
        at: usize,
    },

    #[error("invalid {what} {value:?}: {rule}")]
    Invalid {
        what: &'static str,
        value: String,
        rule: &'static str,
    },
}

impl NameError {
    /// The same error about `what` (e.g. "Lease name" for a Kubernetes object name).
    pub fn named(self, what: &'static str) -> NameError {
        match self {
            NameError::Empty { .. } => NameError::Empty { what },
            NameError::TooLong { len, max, .. } => NameError::TooLong { what, len, max },
            NameError::ControlCharacter { code, at, .. } => {
                NameError::ControlCharacter { what, code, at }
            }
            NameError::ZooKeeperCharacter { code, at, .. } => {
                NameError::ZooKeeperCharacter { what, code, at }
            }
            NameError::Invalid { value, rule, .. } => NameError::Invalid { what, value, rule },
        }
    }
}

fn invalid(what: &'static str, value: &str, rule: &'static str) -> NameError {
    let value = if value.chars().count() > QUOTED_MAX_CHARS {
        value.chars().take(QUOTED_MAX_CHARS).chain(['…']).collect()
    } else {
        value.to_string()
    };
    NameError::Invalid { what, value, rule }
}

/// Refuses control characters (Unicode category Cc) in `value`.
pub fn no_control_characters(what: &'static str, value: &str) -> Result<(), NameError> {
    match value.char_indices().find(|(_, c)| c.is_control()) {
        Some((at, c)) => Err(NameError::ControlCharacter {
            what,
            code: c as u32,
            at,
        }),
        None => Ok(()),
    }
}

/// A non-empty value of at most `max` bytes without control characters.
fn bounded_text(what: &'static str, value: &str, max: usize) -> Result<(), NameError> {
    if value.is_empty() {
        return Err(NameError::Empty { what });
    }
    if value.len() > max {
        return Err(NameError::TooLong {
            what,
            len: value.len(),
            max,
        });
    }
    no_control_characters(what, value)
}

fn is_lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// An S3 (general purpose) bucket name.
pub fn s3_bucket(name: &str) -> Result<(), NameError> {
    const WHAT: &str = "S3 bucket name";
    let b = name.as_bytes();
    let ok = (S3_BUCKET_MIN_LEN..=S3_BUCKET_MAX_LEN).contains(&b.len())
        && is_lower_alnum(b[0])
        && is_lower_alnum(b[b.len() - 1])
        && b.iter()
            .all(|&c| is_lower_alnum(c) || c == b'.' || c == b'-')
        && !name.contains("..");
    if ok {
        Ok(())
    } else {
        Err(invalid(WHAT, name, S3_BUCKET_RULE))
    }
}

/// An S3 object key: 1 to 1,024 bytes of UTF-8, no control characters.
pub fn s3_key(key: &str) -> Result<(), NameError> {
    bounded_text("S3 key", key, S3_KEY_MAX_BYTES)
}

/// A DynamoDB table name.
pub fn dynamodb_table(name: &str) -> Result<(), NameError> {
    let ok = (DYNAMODB_TABLE_MIN_LEN..=DYNAMODB_TABLE_MAX_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(invalid("DynamoDB table name", name, DYNAMODB_TABLE_RULE))
    }
}

/// The partition key value of a DynamoDB lock item: 1 to 2,048 bytes of UTF-8, no
/// control characters.
pub fn dynamodb_key(value: &str) -> Result<(), NameError> {
    bounded_text("DynamoDB key", value, DYNAMODB_KEY_MAX_BYTES)
}

/// The sort key value of a DynamoDB lock item: 1 to 1,024 bytes of UTF-8, no control
/// characters.
pub fn dynamodb_sort_key_value(value: &str) -> Result<(), NameError> {
    bounded_text(
        "DynamoDB sort key value",
        value,
        DYNAMODB_SORT_KEY_MAX_BYTES,
    )
}

/// A DynamoDB key attribute name: 1 to 255 bytes of UTF-8, no control characters.
pub fn dynamodb_attribute_name(name: &str) -> Result<(), NameError> {
    bounded_text(
        "DynamoDB attribute name",
        name,
        DYNAMODB_ATTRIBUTE_NAME_MAX_BYTES,
    )
}

/// Whether ZooKeeper refuses `c` in a path (beyond the control characters). Java sees
/// a character beyond U+FFFF as two surrogates (U+D800-U+DFFF), which it refuses.
fn zookeeper_refuses(c: char) -> bool {
    matches!(c as u32, 0xE000..=0xF8FF | 0xFFF0..) || c.is_control()
}

/// An absolute ZooKeeper path below the root (a lock path, or a chroot), at most
/// [`ZOOKEEPER_PATH_MAX_BYTES`].
pub fn zookeeper_path(path: &str) -> Result<(), NameError> {
    const WHAT: &str = "ZooKeeper path";
    if path.is_empty() {
        return Err(NameError::Empty { what: WHAT });
    }
    if path.len() > ZOOKEEPER_PATH_MAX_BYTES {
        return Err(NameError::TooLong {
            what: WHAT,
            len: path.len(),
            max: ZOOKEEPER_PATH_MAX_BYTES,
        });
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(invalid(WHAT, path, ZOOKEEPER_RELATIVE_RULE));
    };
    if rest.is_empty() {
        return Err(invalid(WHAT, path, ZOOKEEPER_ROOT_RULE));
    }
    if rest.ends_with('/') {
        return Err(invalid(WHAT, path, ZOOKEEPER_TRAILING_SLASH_RULE));
    }
    if rest
        .split('/')
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return Err(invalid(WHAT, path, ZOOKEEPER_SEGMENT_RULE));
    }
    no_control_characters(WHAT, path)?;
    match path.char_indices().find(|(_, c)| zookeeper_refuses(*c)) {
        Some((at, c)) => Err(NameError::ZooKeeperCharacter {
            what: WHAT,
            code: c as u32,
            at,
        }),
        None => Ok(()),
    }
}

/// Whether `s` is one RFC 1123 label (no length limit of its own).
fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && is_lower_alnum(b[0])
        && is_lower_alnum(b[b.len() - 1])
        && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
}

/// A Kubernetes object name (a Lease, a Secret, a DistributedLock): a DNS-1123
/// subdomain of at most 253 characters, as the API server checks it.
pub fn kubernetes_name(name: &str) -> Result<(), NameError> {
    if name.len() <= KUBERNETES_NAME_MAX_LEN && name.split('.').all(is_dns_label) {
        Ok(())
    } else {
        Err(invalid(
            "Kubernetes object name",
            name,
            KUBERNETES_NAME_RULE,
        ))
    }
}

/// A Kubernetes namespace name: a DNS-1123 label of at most 63 characters.
pub fn kubernetes_namespace(name: &str) -> Result<(), NameError> {
    if name.len() <= KUBERNETES_NAMESPACE_MAX_LEN && is_dns_label(name) {
        Ok(())
    } else {
        Err(invalid("namespace", name, KUBERNETES_NAMESPACE_RULE))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_names() {
        for ok in ["abc", "my-bucket.v2", "0ab", &"a".repeat(63)] {
            assert_eq!(s3_bucket(ok), Ok(()), "{ok}");
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
            assert!(s3_bucket(bad).is_err(), "{bad}");
        }
        assert_eq!(s3_bucket_pattern(), "^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$");
    }

    #[test]
    fn keys_are_bounded_in_bytes_not_characters() {
        assert_eq!(s3_key(&"k".repeat(1024)), Ok(()));
        assert_eq!(
            s3_key(&"k".repeat(1025)).unwrap_err().to_string(),
            "S3 key is longer than 1024 bytes (1025 bytes in UTF-8)"
        );
        // 512 two-byte characters fill the limit; one more byte is over it.
        assert_eq!(s3_key(&"é".repeat(512)), Ok(()));
        assert!(s3_key(&format!("{}k", "é".repeat(512))).is_err());
        assert_eq!(dynamodb_key(&"k".repeat(2048)), Ok(()));
        assert!(dynamodb_key(&"k".repeat(2049)).is_err());
        assert_eq!(dynamodb_sort_key_value(&"k".repeat(1024)), Ok(()));
        assert!(dynamodb_sort_key_value(&"k".repeat(1025)).is_err());
        assert!(dynamodb_attribute_name(&"p".repeat(256)).is_err());
        assert_eq!(s3_key(""), Err(NameError::Empty { what: "S3 key" }));
    }

    #[test]
    fn control_characters_are_refused_everywhere() {
        for c in ['\0', '\t', '\n', '\u{1f}', '\u{7f}', '\u{85}', '\u{9f}'] {
            let s = format!("a{c}b");
            assert!(
                s3_key(&s)
                    .unwrap_err()
                    .to_string()
                    .contains("control characters"),
                "{s:?}"
            );
            assert!(dynamodb_key(&s).is_err(), "{s:?}");
            assert!(dynamodb_sort_key_value(&s).is_err(), "{s:?}");
            assert!(dynamodb_attribute_name(&s).is_err(), "{s:?}");
            assert!(zookeeper_path(&format!("/{s}")).is_err(), "{s:?}");
            assert!(kubernetes_name(&s).is_err(), "{s:?}");
        }
        assert_eq!(s3_key("a\u{a0}b"), Ok(()));
    }

    #[test]
    fn table_names() {
        assert_eq!(dynamodb_table("Locks_v1.x-y"), Ok(()));
        assert!(dynamodb_table("ab").is_err());
        assert!(dynamodb_table("a b c").is_err());
        assert!(dynamodb_table(&"a".repeat(256)).is_err());
    }

    #[test]
    fn zookeeper_paths_follow_path_utils() {
        for ok in [
            "/a",
            "/locks/db-1",
            "/a/.hidden",
            "/a/..x",
            "/é/\u{a0}",
            "/\u{ffef}",
        ] {
            assert_eq!(zookeeper_path(ok), Ok(()), "{ok}");
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
            "/a\u{e000}",
            "/a\u{f8ff}",
            "/a\u{fff0}",
            "/a\u{fffd}",
            "/a\u{ffff}",
            "/a\u{1f600}",
        ] {
            assert!(zookeeper_path(bad).is_err(), "{bad:?}");
        }
        let at_limit = format!("/{}", "z".repeat(ZOOKEEPER_PATH_MAX_BYTES - 1));
        assert_eq!(zookeeper_path(&at_limit), Ok(()));
        assert!(zookeeper_path(&format!("{at_limit}z")).is_err());
    }

    #[test]
    fn kubernetes_names() {
        assert_eq!(kubernetes_name("a.b-c.d"), Ok(()));
        assert_eq!(kubernetes_name(&"a".repeat(253)), Ok(()));
        for bad in ["A", "a..b", "", "a_b", "-a", &"a".repeat(254)] {
            assert!(kubernetes_name(bad).is_err(), "{bad}");
        }
        assert_eq!(kubernetes_namespace("ns-1"), Ok(()));
        assert_eq!(kubernetes_namespace(&"n".repeat(63)), Ok(()));
        assert!(kubernetes_namespace(&"n".repeat(64)).is_err());
        assert!(kubernetes_namespace("a.b").is_err());
    }

    #[test]
    fn messages_name_the_rule_and_stay_short() {
        let e = kubernetes_name(&"A".repeat(300))
            .unwrap_err()
            .named("Lease name");
        let msg = e.to_string();
        assert!(msg.starts_with("invalid Lease name \"AAA"), "{msg}");
        assert!(msg.contains("at most 253"), "{msg}");
        assert!(msg.len() < 400, "{msg}");
    }
}

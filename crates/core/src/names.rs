//! Name rules shared by more than one part of lockwarden, written once: what a name or
//! key error says ([`NameError`]), the bounded-text and control-character rules every
//! store's keys follow, and Kubernetes object and namespace names (Leases, Secrets and
//! DistributedLocks alike). Each store's own limits (S3 bucket names, DynamoDB tables,
//! ZooKeeper paths) live with that store (lockwarden-stores' `<store>/key.rs`), which
//! builds on these; the command-line URL parser, the CRD's admission rules and Job
//! gating all call the same functions, so a lock key one of them accepts is accepted
//! by all.
//!
//! - Kubernetes: object names are DNS-1123 subdomains of at most 253 characters;
//!   namespaces DNS-1123 labels of at most 63.
//!
//! Control characters (Unicode category Cc: U+0000-U+001F, U+007F-U+009F) are refused
//! in every name and key, also where the store itself would take them: they break
//! lock files, logs and terminals.
//!
//! The `*_PATTERN` constants are the same rules as regular expressions (RE2 syntax, as
//! CEL's `matches` reads them) for the CRD.

/// Kubernetes object names (DNS-1123 subdomains): at most this many characters.
pub const KUBERNETES_NAME_MAX_LEN: usize = 253;
/// Kubernetes namespace names (DNS-1123 labels): at most this many characters.
pub const KUBERNETES_NAMESPACE_MAX_LEN: usize = 63;

/// A control character anywhere (Unicode category Cc, as [`char::is_control`]).
pub const CONTROL_CHARACTER_PATTERN: &str = r"\p{Cc}";
/// An RFC 1123 DNS subdomain (length checked separately).
pub const DNS_SUBDOMAIN_PATTERN: &str =
    "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// An RFC 1123 DNS label (length checked separately).
pub const DNS_LABEL_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

const KUBERNETES_NAME_RULE: &str = "a DNS-1123 subdomain: at most 253 lowercase letters, \
     digits, '-' and '.', each dot-separated part starting and ending with a letter or digit";
const KUBERNETES_NAMESPACE_RULE: &str = "a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and ending \
     with a letter or digit";

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

    /// A character the store refuses besides the control characters; `rule` says which.
    #[error("{what} contains U+{code:04X} at byte {at}; {rule}")]
    Character {
        what: &'static str,
        code: u32,
        at: usize,
        rule: &'static str,
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
            NameError::Character { code, at, rule, .. } => NameError::Character {
                what,
                code,
                at,
                rule,
            },
            NameError::Invalid { value, rule, .. } => NameError::Invalid { what, value, rule },
        }
    }
}

/// `value` breaks `rule` (quoted in full up to a length).
pub fn invalid(what: &'static str, value: &str, rule: &'static str) -> NameError {
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
pub fn bounded_text(what: &'static str, value: &str, max: usize) -> Result<(), NameError> {
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

/// A lowercase ASCII letter or a digit.
pub fn is_lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
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
    fn text_is_bounded_in_bytes_not_characters() {
        assert_eq!(bounded_text("key", &"k".repeat(8), 8), Ok(()));
        assert_eq!(
            bounded_text("key", &"k".repeat(9), 8)
                .unwrap_err()
                .to_string(),
            "key is longer than 8 bytes (9 bytes in UTF-8)"
        );
        assert_eq!(bounded_text("key", &"é".repeat(4), 8), Ok(()));
        assert!(bounded_text("key", &format!("{}k", "é".repeat(4)), 8).is_err());
        assert_eq!(
            bounded_text("key", "", 8),
            Err(NameError::Empty { what: "key" })
        );
    }

    #[test]
    fn control_characters_are_refused_everywhere() {
        for c in ['\0', '\t', '\n', '\u{1f}', '\u{7f}', '\u{85}', '\u{9f}'] {
            let s = format!("a{c}b");
            assert!(
                bounded_text("key", &s, 8)
                    .unwrap_err()
                    .to_string()
                    .contains("control characters"),
                "{s:?}"
            );
            assert!(kubernetes_name(&s).is_err(), "{s:?}");
        }
        assert_eq!(bounded_text("key", "a\u{a0}b", 8), Ok(()));
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

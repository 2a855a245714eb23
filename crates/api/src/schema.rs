//! Building blocks of the CRD's schema, shared by the `DistributedLock` spec
//! (`distributed_lock.rs`) and each store's part of `spec.backend`
//! (`stores/<store>.rs`), which hold the rules themselves: the schema transforms every
//! type of the CRD applies (`strip_nullable`, `kubernetes_integer_formats`) and the
//! pieces of its CEL admission rules (`x-kubernetes-validations`).
//!
//! CEL notes: Kubernetes rejects rules whose estimated cost is too high, so every
//! string a rule reads has a `maxLength` and every list a `maxItems`. Regexes avoid
//! backslashes (`[.]` instead of `\.`) where they can, so they read the same in Rust,
//! CEL and YAML; the character-class rules need them (`\p{Cc}`), and `lit` escapes
//! them for CEL. Sizes in bytes are `size(bytes(self))`: `size(self)` and `maxLength`
//! count characters.

use kube::core::{Message, Reason, Rule};
use schemars::transform::{Transform, transform_subschemas};
use serde_json::Value;

use lockwarden_core::names;

/// `Rule::message` for owned strings.
pub(crate) trait RuleExt {
    fn msg(self, message: impl Into<String>) -> Rule;
}

impl RuleExt for Rule {
    fn msg(self, message: impl Into<String>) -> Rule {
        self.message(Message::Message(message.into()))
    }
}

/// A Go duration (`time.ParseDuration`) without a sign: one or more `<number><unit>`.
pub(crate) const DURATION_RE: &str = "^(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+$";
/// The longest duration string accepted (also bounds the CEL cost of duration rules).
pub(crate) const MAX_DURATION_LEN: u32 = 32;

/// A property name as Kubernetes CEL spells it: CEL reserved words are escaped as
/// `__word__` (e.g. `self.__namespace__`).
pub(crate) fn cel_property(name: &str) -> String {
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
pub(crate) fn lit(s: &str) -> String {
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

/// On a string: not empty.
pub(crate) fn non_empty(field: &str) -> Rule {
    Rule::new("size(self) > 0")
        .msg(format!("{field} must not be empty"))
        .reason(Reason::FieldValueRequired)
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

/// Schema transform: gives every integer a format Kubernetes knows, recursively.
///
/// schemars names Rust's unsigned types (`format: uint32`…), which the API server does
/// not know and warns about on every `kubectl apply` of the CRD. An integer whose
/// declared maximum fits in 32 bits is `int32`, any other `int64`; its `minimum`
/// (schemars writes 0 for an unsigned type) still keeps it non-negative.
pub(crate) fn kubernetes_integer_formats(schema: &mut schemars::Schema) {
    KubernetesIntegerFormats.transform(schema);
}

struct KubernetesIntegerFormats;

impl Transform for KubernetesIntegerFormats {
    fn transform(&mut self, schema: &mut schemars::Schema) {
        transform_subschemas(self, schema);
        let Some(obj) = schema.as_object_mut() else {
            return;
        };
        let Some(Value::String(format)) = obj.get("format") else {
            return;
        };
        if matches!(format.as_str(), "int32" | "int64") || !format.contains("int") {
            return;
        }
        let fits_int32 = obj
            .get("maximum")
            .and_then(Value::as_f64)
            .is_some_and(|max| max <= f64::from(i32::MAX))
            || matches!(format.as_str(), "int8" | "uint8" | "int16" | "uint16");
        let known = if fits_int32 { "int32" } else { "int64" };
        obj.insert("format".into(), Value::from(known));
    }
}

/// Schema transform: makes every optional field non-nullable (drops `null` from
/// `type` and `enum`, unwraps `anyOf: [T, null]`, removes `nullable`), recursively.
pub(crate) fn strip_nullable(schema: &mut schemars::Schema) {
    StripNullable.transform(schema);
}

struct StripNullable;

impl Transform for StripNullable {
    fn transform(&mut self, schema: &mut schemars::Schema) {
        transform_subschemas(self, schema);
        let Some(obj) = schema.as_object_mut() else {
            return;
        };
        obj.remove("nullable");
        if let Some(Value::Array(types)) = obj.get_mut("type") {
            types.retain(|t| t != "null");
            if types.len() == 1 {
                let only = types.remove(0);
                obj.insert("type".into(), only);
            }
        }
        if let Some(Value::Array(values)) = obj.get_mut("enum") {
            values.retain(|v| !v.is_null());
        }
        let is_null = |v: &Value| {
            v.get("type") == Some(&Value::from("null"))
                || v.get("enum") == Some(&Value::Array(vec![Value::Null]))
                || v.get("enum") == Some(&Value::Array(vec![]))
        };
        if let Some(Value::Array(any_of)) = obj.get("anyOf")
            && any_of.len() == 2
            && let Some(other) = any_of.iter().find(|v| !is_null(v)).cloned()
            && any_of.iter().any(is_null)
        {
            obj.remove("anyOf");
            if let Value::Object(other) = other {
                for (k, v) in other {
                    obj.entry(k).or_insert(v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cel_literals_escape() {
        assert_eq!(lit(r"a\[b'"), r"'a\\[b\''");
    }
}

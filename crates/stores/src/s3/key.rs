//! An S3 lock key, `s3://BUCKET/KEY`, and S3's name rules: bucket names 3-63 of
//! `a-z 0-9 . -`, starting and ending with a letter or digit, no `..`; object keys at
//! most 1,024 bytes of UTF-8, without control characters.

use std::fmt;

use crate::store::{LockFileFields, LockFileMismatch, StoreKey, TargetError, bad_name, split_two};
use lockwarden_core::names::{self, NameError, is_lower_alnum};

/// Bucket names: at least this many characters.
pub const BUCKET_MIN_LEN: usize = 3;
/// Bucket names: at most this many characters.
pub const BUCKET_MAX_LEN: usize = 63;
/// Object keys: at most this many bytes of UTF-8.
pub const KEY_MAX_BYTES: usize = 1024;

const BUCKET_RULE: &str = "3-63 lowercase letters, digits, dots and hyphens, starting and \
     ending with a letter or digit, without \"..\"";

/// Bucket names as a regular expression, length included (the `..` rule is separate).
pub fn bucket_pattern() -> String {
    format!(
        "^[a-z0-9][a-z0-9.-]{{{},{}}}[a-z0-9]$",
        BUCKET_MIN_LEN - 2,
        BUCKET_MAX_LEN - 2
    )
}

/// An S3 (general purpose) bucket name.
pub fn bucket_name(name: &str) -> Result<(), NameError> {
    let b = name.as_bytes();
    let ok = (BUCKET_MIN_LEN..=BUCKET_MAX_LEN).contains(&b.len())
        && is_lower_alnum(b[0])
        && is_lower_alnum(b[b.len() - 1])
        && b.iter()
            .all(|&c| is_lower_alnum(c) || c == b'.' || c == b'-')
        && !name.contains("..");
    if ok {
        Ok(())
    } else {
        Err(names::invalid("S3 bucket name", name, BUCKET_RULE))
    }
}

/// An object key: 1 to 1,024 bytes of UTF-8, no control characters.
pub fn object_key(key: &str) -> Result<(), NameError> {
    names::bounded_text("S3 key", key, KEY_MAX_BYTES)
}

/// An object in an S3 bucket.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct S3Key {
    pub bucket: String,
    pub key: String,
}

/// s3lock's lock file fields: the bucket, the object key, the lock id and the ETag.
const BUCKET_FIELD: &str = "Bucket";
const KEY_FIELD: &str = "Key";
const ID_FIELD: &str = "Id";
const ETAG_FIELD: &str = "ETag";

impl StoreKey for S3Key {
    const KIND: &'static str = "s3";
    const SCHEMES: &'static [&'static str] = &["s3"];
    const FORM: &'static str = "s3://BUCKET/KEY";
    const ABOUT: &'static str = "S3 object (conditional writes)";

    fn parse(url: &str, rest: &str) -> Result<S3Key, TargetError> {
        let (bucket, key) = split_two(url, rest, "bucket", "key", Self::FORM)?;
        bucket_name(bucket).map_err(|e| bad_name(url, e.named("bucket name"), Self::FORM))?;
        object_key(key).map_err(|e| bad_name(url, e, Self::FORM))?;
        Ok(S3Key {
            bucket: bucket.to_string(),
            key: key.to_string(),
        })
    }

    fn name(&self) -> &str {
        &self.key
    }

    /// What winebarrel/s3lock writes to its lock file, so s3lock's `unlock` can read
    /// ours: the bucket, the key, the lock id (our nonce) and the object's ETag.
    fn lock_file_fields(&self, nonce: &str, version: &str) -> LockFileFields {
        [
            (BUCKET_FIELD, &self.bucket[..]),
            (KEY_FIELD, &self.key[..]),
            (ID_FIELD, nonce),
            (ETAG_FIELD, version),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_string(), value.into()))
        .collect()
    }

    fn check_lock_file_fields(&self, fields: &LockFileFields) -> Result<(), LockFileMismatch> {
        let differs =
            |name: &str, ours: &str| fields.get(name).is_some_and(|v| v.as_str() != Some(ours));
        if differs(BUCKET_FIELD, &self.bucket) || differs(KEY_FIELD, &self.key) {
            return Err(LockFileMismatch {
                fields: "Bucket/Key",
                url: self.to_string(),
            });
        }
        Ok(())
    }
}

impl fmt::Display for S3Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_names() {
        for ok in ["abc", "my-bucket.v2", "0ab", &"a".repeat(63)] {
            assert_eq!(bucket_name(ok), Ok(()), "{ok}");
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
            assert!(bucket_name(bad).is_err(), "{bad}");
        }
        assert_eq!(bucket_pattern(), "^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$");
    }

    #[test]
    fn keys_are_bounded_in_bytes_not_characters() {
        assert_eq!(object_key(&"k".repeat(1024)), Ok(()));
        assert_eq!(
            object_key(&"k".repeat(1025)).unwrap_err().to_string(),
            "S3 key is longer than 1024 bytes (1025 bytes in UTF-8)"
        );
        // 512 two-byte characters fill the limit; one more byte is over it.
        assert_eq!(object_key(&"é".repeat(512)), Ok(()));
        assert!(object_key(&format!("{}k", "é".repeat(512))).is_err());
        assert_eq!(object_key(""), Err(NameError::Empty { what: "S3 key" }));
        assert!(
            object_key("a\u{85}b")
                .unwrap_err()
                .to_string()
                .contains("control characters")
        );
    }

    #[test]
    fn the_lock_file_carries_what_s3lock_reads_and_must_name_this_key() {
        let key = S3Key {
            bucket: "b".into(),
            key: "k".into(),
        };
        let fields = key.lock_file_fields("nonce-1", "\"etag\"");
        assert_eq!(fields["Bucket"], "b");
        assert_eq!(fields["Id"], "nonce-1");
        assert_eq!(key.check_lock_file_fields(&fields), Ok(()));
        let mut other = fields.clone();
        other.insert("Key".into(), "other".into());
        assert_eq!(
            key.check_lock_file_fields(&other)
                .map_err(|e| e.to_string()),
            Err("Bucket/Key do not match the url s3://b/k".into())
        );
    }
}

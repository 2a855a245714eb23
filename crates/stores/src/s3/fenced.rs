//! A fenced S3 object ([`FencedObject`]): the object carries, in its user metadata,
//! the highest fence that wrote it and the lock that fence belongs to.
//!
//! A write reads the object's ETag and metadata (HEAD), refuses a higher fence or
//! another lock at once, and otherwise PUTs the whole object conditioned on that ETag
//! (`If-Match`), or on there being no object (`If-None-Match: *`). Only the
//! conditional PUT makes the check atomic: a higher fence written between our HEAD and
//! our PUT changes the ETag, the PUT fails (412, or 409 for a concurrent conditional
//! write), and we read again. There is no blind overwrite, and no metadata-only update
//! (CopyObject takes no write conditions).
//!
//! A delete is a conditional PUT of an empty tombstone that keeps the fence: deleting
//! the object would let a stale holder recreate it with `If-None-Match: *`.
//!
//! This relies on a HEAD answering the ETag and the metadata of one and the same
//! version, as S3 does: an ETag paired with an older version's fence would let a lower
//! fence pass the check and its PUT match. (versitygw was seen to lower the fence under
//! load in `tests/fenced/race.rs`; this is the suspected cause.)

use async_trait::async_trait;
use aws_sdk_s3::Client;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use std::collections::HashMap;

use super::store::parse_body;
use crate::aws::{RequestGate, fenced_error, fenced_send, status_and_code};
use lockwarden_core::FenceToken;
use lockwarden_core::fenced::{
    Content, Fence, FencedError, FencedObject, FencedRead, MAX_ATTEMPTS, Written, check,
};

/// User metadata (`x-amz-meta-…`): the highest fence that wrote the object.
pub const FENCE_METADATA: &str = "lockwarden-fence";
/// User metadata: the lock of that fence (percent-encoded where not printable ASCII).
pub const LOCK_METADATA: &str = "lockwarden-fence-lock";
/// User metadata on a tombstone: `true`.
pub const DELETED_METADATA: &str = "lockwarden-fence-deleted";

/// Objects without our metadata at most this large are read to see whether they are a
/// lock record (lock records are a few hundred bytes; data is never read otherwise).
const LOCK_RECORD_MAX_BYTES: i64 = 1 << 20;

/// One object in a bucket, written only with fences.
pub struct FencedS3Object {
    client: Client,
    bucket: String,
    key: String,
    url: String,
    /// The client's bound of requests in flight (`aws::RequestGate`).
    requests: RequestGate,
}

/// What a HEAD found.
struct Head {
    etag: String,
    fence: Option<Fence>,
    deleted: bool,
}

impl FencedS3Object {
    pub fn new(client: Client, bucket: impl Into<String>, key: impl Into<String>) -> Self {
        let (bucket, key) = (bucket.into(), key.into());
        let url = format!("s3://{bucket}/{key}");
        FencedS3Object {
            client,
            bucket,
            key,
            url,
            requests: RequestGate::unbounded(),
        }
    }

    /// Sends every request through `gate` (see `S3Store::with_request_gate`).
    pub fn with_request_gate(mut self, gate: RequestGate) -> Self {
        self.requests = gate;
        self
    }

    /// The object's ETag and fence, `None` if there is no object. An object without
    /// our metadata is checked not to be a lock record.
    async fn head(&self) -> Result<Option<Head>, FencedError> {
        let request = self.client.head_object().bucket(&self.bucket);
        let request = request.key(&self.key);
        let sent = fenced_send(&self.requests, "HEAD", || request.send()).await?;
        let Some(out) = unless_absent(sent, "HEAD")? else {
            return Ok(None);
        };
        let etag = out.e_tag().unwrap_or_default().to_string();
        let (fence, deleted) = fence_of(out.metadata())?;
        if fence.is_none() && out.content_length().unwrap_or(0) <= LOCK_RECORD_MAX_BYTES {
            self.refuse_lock_record(&etag).await?;
        }
        Ok(Some(Head {
            etag,
            fence,
            deleted,
        }))
    }

    /// Reads the object at `etag` and refuses it if it is a lock record. A newer
    /// version (412) is not ours to judge here: the conditional write will fail on it.
    async fn refuse_lock_record(&self, etag: &str) -> Result<(), FencedError> {
        let get = || {
            self.client
                .get_object()
                .bucket(&self.bucket)
                .key(&self.key)
                .if_match(etag)
                .send()
        };
        let out = fenced_send(&self.requests, "GET", get).await?;
        let out = match out {
            Ok(out) => out,
            Err(SdkError::ServiceError(e)) if matches!(e.raw().status().as_u16(), 404 | 412) => {
                return Ok(());
            }
            Err(e) => return Err(fenced_error(e, "GET")),
        };
        let bytes = read_body(out.body).await?;
        refuse_lock_body(&bytes, etag)
    }

    /// One conditional PUT of `body` with `fence` (a tombstone when `deleted`).
    async fn conditional_put(
        &self,
        expected: Option<&str>,
        fence: &Fence,
        body: &[u8],
        deleted: bool,
    ) -> Result<String, SdkError<aws_sdk_s3::operation::put_object::PutObjectError, HttpResponse>>
    {
        let mut req = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(&self.key)
            .metadata(FENCE_METADATA, fence.token.to_string())
            .metadata(LOCK_METADATA, encode(&fence.lock))
            .body(ByteStream::from(body.to_vec()));
        if deleted {
            req = req.metadata(DELETED_METADATA, "true");
        }
        req = match expected {
            Some(etag) => req.if_match(etag),
            None => req.if_none_match("*"),
        };
        let out = req.send().await?;
        Ok(out.e_tag().unwrap_or_default().to_string())
    }

    /// Read, check, conditional PUT; again when another write won in between.
    async fn write(
        &self,
        fence: &Fence,
        body: &[u8],
        deleted: bool,
    ) -> Result<Written, FencedError> {
        let mut last = String::new();
        for _ in 0..MAX_ATTEMPTS {
            let head = self.head().await?;
            if let Some(head) = &head {
                check(head.fence.as_ref(), head.deleted, fence)?;
            }
            let expected = head.as_ref().map(|h| h.etag.as_str());
            let op = match expected {
                Some(_) => "PUT If-Match",
                None => "PUT If-None-Match: *",
            };
            let put = || self.conditional_put(expected, fence, body, deleted);
            match fenced_send(&self.requests, op, put).await? {
                Ok(etag) => {
                    return Ok(Written {
                        version: Some(etag).filter(|e| !e.is_empty()),
                    });
                }
                Err(e) => {
                    let (status, code) = status_and_code(&e);
                    match status {
                        // The object changed since our HEAD (412), another conditional
                        // write was in flight (409), or it was deleted by hand (404 on
                        // If-Match): read again and decide on what is there now.
                        Some(412 | 409 | 404) => {
                            last = format!(
                                "{op} answered {}{}",
                                status.unwrap_or_default(),
                                code.map(|c| format!(" {c}")).unwrap_or_default()
                            );
                        }
                        _ => return Err(fenced_error(e, op)),
                    }
                }
            }
        }
        Err(FencedError::Contended {
            attempts: MAX_ATTEMPTS,
            last,
        })
    }
}

#[async_trait]
impl FencedObject for FencedS3Object {
    fn url(&self) -> &str {
        &self.url
    }

    async fn put(&self, fence: &Fence, data: &[u8]) -> Result<Written, FencedError> {
        self.write(fence, data, false).await
    }

    async fn get(&self) -> Result<Option<FencedRead>, FencedError> {
        let request = self.client.get_object().bucket(&self.bucket);
        let request = request.key(&self.key);
        let sent = fenced_send(&self.requests, "GET", || request.send()).await?;
        let Some(out) = unless_absent(sent, "GET")? else {
            return Ok(None);
        };
        let etag = out.e_tag().unwrap_or_default().to_string();
        let (written_by, deleted) = fence_of(out.metadata())?;
        let bytes = read_body(out.body).await?;
        if written_by.is_none() {
            refuse_lock_body(&bytes, &etag)?;
        }
        Ok(Some(FencedRead {
            written_by,
            content: if deleted {
                Content::Deleted
            } else {
                Content::Data(bytes)
            },
        }))
    }

    async fn delete(&self, fence: &Fence) -> Result<Written, FencedError> {
        self.write(fence, &[], true).await
    }
}

/// The fence and tombstone mark in an object's user metadata.
fn fence_of(
    metadata: Option<&HashMap<String, String>>,
) -> Result<(Option<Fence>, bool), FencedError> {
    let Some(metadata) = metadata else {
        return Ok((None, false));
    };
    let get = |name: &str| {
        metadata
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    let Some(token) = get(FENCE_METADATA) else {
        return Ok((None, false));
    };
    // Unreadable metadata of ours is refused rather than overwritten: it may hold a
    // fence higher than any we could compare with.
    let token: u64 = token.trim().parse().map_err(|_| {
        FencedError::Unsupported(format!(
            "the object's {FENCE_METADATA} metadata {token:?} is not a fence (a whole number)"
        ))
    })?;
    let lock = decode(get(LOCK_METADATA).unwrap_or_default());
    let deleted = get(DELETED_METADATA).is_some_and(|v| v.eq_ignore_ascii_case("true"));
    Ok((
        Some(Fence {
            token: FenceToken(token),
            lock,
        }),
        deleted,
    ))
}

/// Refuses a body that is a lockwarden lock record or another tool's lock (s3lock).
fn refuse_lock_body(bytes: &[u8], etag: &str) -> Result<(), FencedError> {
    match parse_body(bytes, etag) {
        Ok(record) => Err(FencedError::LockRecord {
            what: if record.by_another_tool() {
                format!("held by {}", record.holder)
            } else {
                format!("lockwarden lock, fence {}", record.fence)
            },
        }),
        Err(_) => Ok(()),
    }
}

async fn read_body(body: ByteStream) -> Result<Vec<u8>, FencedError> {
    Ok(body
        .collect()
        .await
        .map_err(|e| FencedError::Store {
            op: "GET".into(),
            detail: format!("reading the body: {e}"),
            source: Some(Box::new(e)),
        })?
        .into_bytes()
        .to_vec())
}

/// A read's answer, `None` when the object does not exist (404).
fn unless_absent<T, E>(
    sent: Result<T, SdkError<E, HttpResponse>>,
    op: &str,
) -> Result<Option<T>, FencedError>
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match sent {
        Ok(out) => Ok(Some(out)),
        Err(SdkError::ServiceError(e)) if e.raw().status().as_u16() == 404 => Ok(None),
        Err(e) => Err(fenced_error(e, op)),
    }
}

/// Metadata values travel as HTTP headers: printable ASCII only. A lock URL may have
/// any UTF-8 in its key, so other bytes (and `%`) are percent-encoded.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x21..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = (bytes[i] == b'%')
            .then(|| text.get(i + 1..i + 3))
            .flatten()
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_urls_round_trip_through_metadata() {
        for url in ["s3://b/locks/db", "s3://b/ключ 100%", "zk:///a b"] {
            let encoded = encode(url);
            assert!(
                encoded.bytes().all(|b| (0x21..0x7f).contains(&b)),
                "{encoded}"
            );
            assert_eq!(decode(&encoded), url);
        }
    }

    #[test]
    fn metadata_gives_the_fence_and_the_tombstone() {
        let metadata: HashMap<String, String> = [
            (FENCE_METADATA.to_string(), "12".to_string()),
            (LOCK_METADATA.to_string(), "s3://b/l".to_string()),
            (DELETED_METADATA.to_string(), "true".to_string()),
        ]
        .into();
        let (fence, deleted) = fence_of(Some(&metadata)).unwrap();
        assert_eq!(fence, Some(Fence::new(12, "s3://b/l")));
        assert!(deleted);
        assert_eq!(fence_of(None).unwrap(), (None, false));
        let bad: HashMap<String, String> =
            [(FENCE_METADATA.to_string(), "twelve".to_string())].into();
        assert!(fence_of(Some(&bad)).is_err());
    }

    #[test]
    fn lock_records_are_recognised() {
        assert!(refuse_lock_body(b"0b3c7e4c-5a8f-4b3e-9d9a-0e3f1c2b4a5d", "e").is_err());
        assert!(refuse_lock_body(b"{\"some\": \"data\"}", "e").is_ok());
        assert!(refuse_lock_body(b"", "e").is_ok());
    }
}

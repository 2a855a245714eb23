//! S3: one object per lock, every write a conditional PUT (DESIGN.md §3 "S3").
//!
//! - create: `PUT If-None-Match: *`; takeover, renew, release: `PUT If-Match: <etag>`.
//! - The body is the JSON [`LockRecord`] with a fresh revision per write, so every
//!   write has a distinct ETag even on servers whose ETag is the body's MD5.
//! - A 409 `ConditionalRequestConflict`, a 5xx, a timeout or a dropped connection is
//!   an *indeterminate* outcome; the engine resolves it by re-reading (rule 4).
//! - Release writes a tombstone; deleting (optional) happens only after it, since
//!   several S3-compatible servers ignore `DELETE If-Match`.

use async_trait::async_trait;
use aws_sdk_s3::Client;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;

use super::aws::{describe, status_and_code};
use crate::lock::{LockRecord, RecordStore, StoreError, Stored, Version};

/// One lock key in an S3 bucket.
pub struct S3Store {
    client: Client,
    bucket: String,
    key: String,
    url: String,
}

impl S3Store {
    pub fn new(client: Client, bucket: impl Into<String>, key: impl Into<String>) -> Self {
        let (bucket, key) = (bucket.into(), key.into());
        let url = format!("s3://{bucket}/{key}");
        S3Store {
            client,
            bucket,
            key,
            url,
        }
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    pub fn key(&self) -> &str {
        &self.key
    }
}

/// What an SDK failure means for a write.
fn classify<E>(err: SdkError<E, HttpResponse>, op: &str, url: &str) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let (status, code) = status_and_code(&err);
    let detail = describe(&err);
    match (status, code.as_deref()) {
        (Some(412), _) => StoreError::Conflict { current: None },
        // If-Match on an object that no longer exists.
        (Some(404), Some("NoSuchKey")) | (Some(404), None) => {
            StoreError::Conflict { current: None }
        }
        (Some(404), Some(_)) | (Some(403), _) | (Some(400), _) | (Some(301), _) => {
            StoreError::Rejected(format!("{op} refused: {detail}"))
        }
        // S3's "a conflicting conditional operation is in progress": may have applied.
        (Some(409), _) => StoreError::Indeterminate(format!("{op}: {detail}")),
        // Success with a reply we cannot read: the write applied, or may have.
        (Some(s), _) if (200..300).contains(&s) => {
            StoreError::Indeterminate(format!("{op}: {detail}"))
        }
        (Some(s), _) if s >= 500 => StoreError::Indeterminate(format!("{op}: {detail}")),
        (Some(_), _) => StoreError::Rejected(format!("{op} refused: {detail}")),
        // No response: the request may or may not have been processed.
        (None, _) => match &err {
            SdkError::ConstructionFailure(_) => StoreError::Rejected(format!("{op}: {detail}")),
            _ => StoreError::Indeterminate(format!("{op} to {url}: {detail}")),
        },
    }
}

#[async_trait]
impl RecordStore for S3Store {
    fn url(&self) -> &str {
        &self.url
    }

    async fn read(&self) -> Result<Option<Stored>, StoreError> {
        let out = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(&self.key)
            .send()
            .await;
        let out = match out {
            Ok(out) => out,
            Err(err) => {
                if let SdkError::ServiceError(e) = &err
                    && (e.err().is_no_such_key() || e.raw().status().as_u16() == 404)
                {
                    return Ok(None);
                }
                return Err(classify(err, "GET", &self.url).for_read());
            }
        };
        let version = Version(out.e_tag().unwrap_or_default().to_string());
        let bytes = out
            .body
            .collect()
            .await
            .map_err(|e| StoreError::Unavailable(format!("GET {}: reading body: {e}", self.url)))?
            .into_bytes();
        Ok(Some(Stored {
            record: LockRecord::from_json(&bytes),
            version,
        }))
    }

    async fn create(&self, record: &LockRecord) -> Result<Version, StoreError> {
        self.put(record, None).await
    }

    async fn replace(
        &self,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StoreError> {
        self.put(record, Some(expected)).await
    }

    async fn delete(&self, expected: &Version) -> Result<(), StoreError> {
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(&self.key)
            .if_match(&expected.0)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| classify(e, "DELETE If-Match", &self.url))
    }
}

impl S3Store {
    async fn put(
        &self,
        record: &LockRecord,
        expected: Option<&Version>,
    ) -> Result<Version, StoreError> {
        let req = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(&self.key)
            .content_type("application/json")
            .body(ByteStream::from(record.to_json()));
        let (req, op) = match expected {
            None => (req.if_none_match("*"), "PUT If-None-Match"),
            Some(v) => (req.if_match(&v.0), "PUT If-Match"),
        };
        match req.send().await {
            Ok(out) => match out.e_tag() {
                Some(etag) => Ok(Version(etag.to_string())),
                // Without an ETag the next conditional write is impossible; the engine
                // re-reads to learn it.
                None => Err(StoreError::Indeterminate(format!(
                    "{op} to {}: no ETag in the reply",
                    self.url
                ))),
            },
            Err(e) => Err(classify(e, op, &self.url)),
        }
    }
}

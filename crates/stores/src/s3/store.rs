//! The S3 [`RecordStore`]: one lock key, one object (see the module above).

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_s3::Client;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;

use super::put::{Put, PutReply, PutTarget, SignedPuts};
use crate::aws::{
    RequestGate, SendError, describe, reply_detail, status_and_code, store_admit, store_send,
};
use crate::terraform::{self, StateLock};
use lockwarden_core::history;
use lockwarden_core::{
    ANOTHER_TOOL_NONCE_PREFIX, FenceToken, ForeignRecord, LockRecord, LockState, RecordStore,
    StoreError, Stored, UnknownFields, Version,
};

/// The user-metadata key (`x-amz-meta-lockwarden-history`) of the key's holder
/// history (`lockwarden_core::history`): beside the body, because the previous release
/// reads a body with a field it does not know as foreign.
pub const HISTORY_METADATA: &str = "lockwarden-history";

/// The longest history text stored: S3 allows 2 KB of user metadata per object (names
/// and values together), and a PUT over it is refused, so the oldest entries are left
/// out instead.
pub const HISTORY_METADATA_MAX: usize = 1800;

/// The lease reported for an s3lock lock, which has none.
pub const S3LOCK_LEASE: std::time::Duration = lockwarden_core::NO_LEASE;

/// Reads a stored body: a lockwarden record, an s3lock lock, or something foreign.
pub fn parse_body(bytes: &[u8], etag: &str) -> Result<LockRecord, ForeignRecord> {
    LockRecord::from_json(bytes).or_else(|not_ours| {
        let id = std::str::from_utf8(bytes).ok().map(str::trim);
        match id.and_then(|id| uuid::Uuid::try_parse(id).ok().map(|_| id)) {
            Some(id) => Ok(LockRecord {
                holder: format!("s3lock (lock id {id})"),
                nonce: format!("{ANOTHER_TOOL_NONCE_PREFIX}s3lock:{id}"),
                revision: etag.to_string(),
                fence: FenceToken(0),
                lease: S3LOCK_LEASE,
                state: LockState::Held,
                data: None,
                acquired_at: std::time::SystemTime::UNIX_EPOCH,
                renewed_at: std::time::SystemTime::UNIX_EPOCH,
                set: None,
                history: Vec::new(),
                runs: Default::default(),
                unknown: UnknownFields::new(),
            }),
            None => Err(not_ours),
        }
    })
}

/// Reads a Terraform/OpenTofu state lock's body (docs/design.md §6.8): lockwarden's
/// record (a plain one, or carried beside its `LockInfo`), or the tool's lock, held and
/// never expiring; anything else — or the lock of another state than `state_path` —
/// is foreign.
pub fn parse_state_lock_body(
    bytes: &[u8],
    etag: &str,
    state_path: &str,
) -> Result<LockRecord, ForeignRecord> {
    LockRecord::from_json(bytes).or_else(|_| match terraform::parse_s3_body(bytes, state_path) {
        Ok(StateLock::Ours(record)) => Ok(*record),
        Ok(StateLock::Theirs(info)) => Ok(info.foreign_record(etag)),
        Err(why) => Err(ForeignRecord::from_bytes(&why.to_string(), bytes)),
    })
}

/// One lock key in an S3 bucket.
pub struct S3Store {
    client: Client,
    bucket: String,
    key: String,
    url: String,
    /// A Terraform/OpenTofu state lock's key (`<state key>.tflock`): the state it
    /// protects, `<bucket>/<state key>`.
    state_path: Option<String>,
    /// Hold the key as those tools do (`terraformCompatible`): write the record inside
    /// a `LockInfo` they parse. Without it a state lock's key is read, never written.
    terraform_compatible: bool,
    /// The client's bound of requests in flight (`aws::RequestGate`).
    requests: RequestGate,
    /// The client's PUTs without the SDK's orchestrator (`put.rs`), when given; the
    /// key's target in them is resolved on the first write.
    puts: Option<Arc<SignedPuts>>,
    put_target: tokio::sync::OnceCell<Option<PutTarget>>,
}

impl S3Store {
    pub fn new(client: Client, bucket: impl Into<String>, key: impl Into<String>) -> Self {
        let (bucket, key) = (bucket.into(), key.into());
        let url = format!("s3://{bucket}/{key}");
        let state_path = terraform::s3_state_path(&bucket, &key);
        S3Store {
            client,
            bucket,
            key,
            url,
            state_path,
            terraform_compatible: false,
            requests: RequestGate::unbounded(),
            puts: None,
            put_target: tokio::sync::OnceCell::new(),
        }
    }

    /// Sends the record's PUTs as `puts` signs them, not through the SDK's
    /// orchestrator (`put.rs`; `connect` passes the process client's). A key whose
    /// endpoint needs more than SigV4 still goes through the SDK.
    pub fn with_signed_puts(mut self, puts: Arc<SignedPuts>) -> Self {
        self.puts = Some(puts);
        self
    }

    /// Sends every request through `gate`: the bound of requests in flight of the
    /// client's (`connect` passes the one of the process's client; without it, none).
    pub fn with_request_gate(mut self, gate: RequestGate) -> Self {
        self.requests = gate;
        self
    }

    /// Holds the key as Terraform and OpenTofu hold their state lock (the key must be
    /// one: `<state key>.tflock`); the caller deletes it on release, as they need.
    pub fn terraform_compatible(mut self, on: bool) -> Self {
        self.terraform_compatible = on;
        self
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
    match status {
        Some(status) => classify_reply(status, code.as_deref(), &detail, op),
        // No response: the request may or may not have been processed.
        None => match &err {
            SdkError::ConstructionFailure(_) => StoreError::Rejected(format!("{op}: {detail}")),
            _ => StoreError::Indeterminate(format!("{op} to {url}: {detail}")),
        },
    }
}

/// What a write's reply with HTTP `status` and S3 error `code` means; `detail` says
/// what failed, for the message.
fn classify_reply(status: u16, code: Option<&str>, detail: &str, op: &str) -> StoreError {
    match (status, code) {
        (412, _) => StoreError::Conflict { current: None },
        // If-Match on an object that no longer exists.
        (404, Some("NoSuchKey")) | (404, None) => StoreError::Conflict { current: None },
        (404, Some(_)) | (403, _) | (400, _) | (301, _) => {
            StoreError::Rejected(format!("{op} refused: {detail}"))
        }
        // S3's "a conflicting conditional operation is in progress": may have applied.
        (409, _) => StoreError::Indeterminate(format!("{op}: {detail}")),
        // Success with a reply we cannot read: the write applied, or may have.
        (s, _) if (200..300).contains(&s) => StoreError::Indeterminate(format!("{op}: {detail}")),
        (s, _) if s >= 500 => StoreError::Indeterminate(format!("{op}: {detail}")),
        _ => StoreError::Rejected(format!("{op} refused: {detail}")),
    }
}

/// What a signed PUT's outcome (`put.rs`) means for the write.
fn classify_signed_put(
    outcome: Result<PutReply, SendError>,
    op: &str,
    url: &str,
) -> Result<Version, StoreError> {
    let reply = outcome.map_err(|e| e.into_store_error(op, url))?;
    match reply.etag {
        Some(etag) if (200..300).contains(&reply.status) => Ok(Version(etag)),
        // Without an ETag the next conditional write is impossible; the engine
        // re-reads to learn it (a 2xx is indeterminate in the table).
        _ => {
            let detail = match reply.code {
                None if (200..300).contains(&reply.status) => {
                    format!("HTTP {} without an ETag", reply.status)
                }
                _ => reply_detail(
                    reply.status,
                    reply.code.as_deref(),
                    reply.message.as_deref(),
                ),
            };
            Err(classify_reply(
                reply.status,
                reply.code.as_deref(),
                &detail,
                op,
            ))
        }
    }
}

/// What a released record left in the bucket means to winebarrel/s3lock.
const S3LOCK_SEES_HELD: &str = "free for lockwarden, but winebarrel/s3lock clients see this \
key as held: their lock is a PUT If-None-Match: *, refused while any object is there. Release \
with spec.backend.s3.s3lockCompatible: true (DistributedLock) or --s3lock-compatible (CLI) to \
delete the object, or delete it by hand";

#[async_trait]
impl RecordStore for S3Store {
    fn url(&self) -> &str {
        &self.url
    }

    fn kept_tombstone_note(&self) -> Option<&'static str> {
        Some(S3LOCK_SEES_HELD)
    }

    async fn admit(&self) -> Result<Option<lockwarden_core::Admission>, StoreError> {
        store_admit(&self.requests, &self.url).await
    }

    async fn read(&self) -> Result<Option<Stored>, StoreError> {
        // Built once admitted, and the body read under the same permit: a read waiting
        // for the gate is then this closure, not the SDK's input and output
        // (docs/design.md §3, "Requests in flight are bounded"), and its connection
        // counts until the body is in.
        let get = || async {
            let request = self.client.get_object().bucket(&self.bucket);
            let out = match request.key(&self.key).send().await {
                Ok(out) => out,
                Err(SdkError::ServiceError(e))
                    if e.err().is_no_such_key() || e.raw().status().as_u16() == 404 =>
                {
                    return Ok(None);
                }
                Err(err) => return Err(classify(err, "GET", &self.url).for_read()),
            };
            let version = Version(out.e_tag().unwrap_or_default().to_string());
            let history = out
                .metadata()
                .and_then(|m| m.get(HISTORY_METADATA))
                .map(|text| history::parse_text(text));
            let bytes = out.body.collect().await.map_err(|e| {
                StoreError::Unavailable(format!("GET {}: reading body: {e}", self.url))
            })?;
            Ok(Some((version, history, bytes.into_bytes())))
        };
        let Some((version, history, bytes)) =
            store_send(&self.requests, "GET", &self.url, get).await??
        else {
            return Ok(None);
        };
        let mut record = match &self.state_path {
            Some(path) => parse_state_lock_body(&bytes, &version.0, path),
            None => parse_body(&bytes, &version.0),
        };
        if let (Ok(r), Some(history)) = (record.as_mut(), history) {
            r.history = history;
        }
        Ok(Some(Stored { record, version }))
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
        let delete = || {
            self.client
                .delete_object()
                .bucket(&self.bucket)
                .key(&self.key)
                .if_match(&expected.0)
                .send()
        };
        store_send(&self.requests, "DELETE If-Match", &self.url, delete)
            .await?
            .map(|_| ())
            .map_err(|e| classify(e, "DELETE If-Match", &self.url))
    }
}

impl S3Store {
    /// This key's signed PUTs and where they go, when it has them (the target is
    /// resolved on the first write).
    async fn signed_puts(&self) -> Option<(&SignedPuts, &PutTarget)> {
        let puts = self.puts.as_deref()?;
        let target = self
            .put_target
            .get_or_init(|| puts.target(&self.bucket, &self.key))
            .await
            .as_ref()?;
        Some((puts, target))
    }

    /// Whether this key may be written at all: a state lock's key only with
    /// `terraformCompatible`, and `terraformCompatible` only on a state lock's key. A
    /// state lock's key is never written otherwise: a plain record there would keep the
    /// tools out for good (they cannot parse it, so they neither wait nor force-unlock).
    fn writable(&self) -> Result<(), StoreError> {
        match (&self.state_path, self.terraform_compatible) {
            (Some(_), false) => Err(StoreError::Rejected(format!(
                "{} is a Terraform/OpenTofu state lock: lockwarden holds it only as they do, \
                 with --terraform-compatible (spec.backend.s3.terraformCompatible: true)",
                self.url
            ))),
            (None, true) => Err(StoreError::Rejected(format!(
                "{}: --terraform-compatible holds a Terraform/OpenTofu state lock, whose key \
                 ends in {}",
                self.url,
                terraform::S3_LOCK_SUFFIX
            ))),
            _ => Ok(()),
        }
    }

    /// What a write of `record` puts in the object (once [`writable`](Self::writable)
    /// said it may): the record, or on a state lock's key its `LockInfo` carrying the
    /// record.
    fn body(&self, record: &LockRecord) -> Vec<u8> {
        match &self.state_path {
            Some(path) => terraform::s3_body(record, path),
            None => record.to_json(),
        }
    }

    async fn put(
        &self,
        record: &LockRecord,
        expected: Option<&Version>,
    ) -> Result<Version, StoreError> {
        self.writable()?;
        // The body and its history metadata are encoded once admitted, like the rest of
        // the request: behind an overloaded store every held lock keeps a renewal
        // waiting for the gate, and encoded before it each kept a kilobyte or more
        // (docs/design.md §3, "Requests in flight are bounded").
        let history = || history::to_bounded_ascii(&record.history, HISTORY_METADATA_MAX);
        let op = match expected {
            None => "PUT If-None-Match",
            Some(_) => "PUT If-Match",
        };
        if let Some((puts, target)) = self.signed_puts().await {
            let put = || {
                puts.send(
                    target,
                    Put {
                        body: self.body(record).into(),
                        content_type: "application/json",
                        if_match: expected.map(|v| v.0.as_str()),
                        metadata: history().map(|text| (HISTORY_METADATA, text)),
                    },
                )
            };
            let outcome = store_send(&self.requests, op, &self.url, put).await?;
            return classify_signed_put(outcome, op, &self.url);
        }
        // Built once admitted, as in `read`: the SDK's input for a PUT is several
        // kilobytes.
        let put = || {
            let mut req = self
                .client
                .put_object()
                .bucket(&self.bucket)
                .key(&self.key)
                .content_type("application/json")
                .body(ByteStream::from(self.body(record)));
            if let Some(text) = history() {
                req = req.metadata(HISTORY_METADATA, text);
            }
            match expected {
                None => req.if_none_match("*"),
                Some(v) => req.if_match(&v.0),
            }
            .send()
        };
        match store_send(&self.requests, op, &self.url, put).await? {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_s3lock_body_is_held_by_s3lock_forever() {
        let r = parse_body(b"0b3c7e4c-5a8f-4b3e-9d9a-0e3f1c2b4a5d", "\"e\"").unwrap();
        assert_eq!(r.state, LockState::Held);
        assert!(r.holder.contains("s3lock"), "{}", r.holder);
        assert_eq!(r.lease, S3LOCK_LEASE);
        assert!(parse_body(b"not a uuid", "e").is_err());
    }
}

//! The SigV4 signature of lockwarden's own writes, with what does not change from one
//! write to the next computed once (issue 45, docs/benchmarks.md "Renewal CPU").
//!
//! A renewal is one small write, and signing it through `aws_sigv4::sign` was 18 % of
//! an S3 renewal's CPU: every call derives the day's signing key again (four HMACs),
//! formats the date twice, and builds the canonical request through a header map, a
//! dozen strings and a sorted vector. The signature depends on none of that work but
//! the canonical request's own bytes. [`SigningKeys`] keeps the signing key of the day
//! and the `x-amz-date` of the second; [`sign_headers`] writes the canonical request
//! of a write lockwarden builds itself (no query, a path that needs no normalization
//! or re-encoding under the service's settings) into one buffer and signs it with the
//! SDK's own primitives (`generate_signing_key`, `calculate_signature`). Any other
//! request returns `None` and is signed by `aws_sigv4::sign`, and the tests hold the
//! two to the same bytes, as they hold both to the SDK client's own signature.

use std::borrow::Cow;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SessionTokenMode, SignatureLocation,
    UriPathNormalizationMode,
};
use aws_sigv4::sign::v4::{calculate_signature, generate_signing_key};
use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::Signing;

/// The headers a signature adds to a request: `x-amz-date`, `authorization`, and as
/// the settings and credentials ask, `x-amz-content-sha256` and `x-amz-security-token`.
pub(crate) type SignatureHeaders = Vec<(&'static str, String)>;

/// The signing key of the current day, and the `x-amz-date` of the current second, of
/// one client's requests. The key depends on the secret, the UTC date, the region and
/// the service; it is derived again when any of them changes.
#[derive(Default)]
pub(crate) struct SigningKeys {
    current: Mutex<Option<DayKey>>,
}

struct DayKey {
    /// The second `date_time` was formatted for.
    second: u64,
    /// `YYYYMMDD'T'HHMMSS'Z'`; the key's date is its first eight characters.
    date_time: String,
    secret: String,
    region: String,
    service: String,
    key: [u8; 32],
}

impl SigningKeys {
    /// The `x-amz-date` of `time` and the signing key for it, `secret`, and
    /// `signing`'s scope.
    fn date_time_and_key(
        &self,
        time: SystemTime,
        secret: &str,
        signing: &Signing,
    ) -> (String, [u8; 32]) {
        let second = time
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(day) = current.as_mut()
            && day.secret == secret
            && day.region == signing.region
            && day.service == signing.name
        {
            if day.second != second {
                let date_time = amz_date_time(time);
                if date_time[..8] != day.date_time[..8] {
                    day.key = signing_key(secret, time, signing);
                }
                day.second = second;
                day.date_time = date_time;
            }
            return (day.date_time.clone(), day.key);
        }
        let day = DayKey {
            second,
            date_time: amz_date_time(time),
            secret: secret.to_string(),
            region: signing.region.clone(),
            service: signing.name.clone(),
            key: signing_key(secret, time, signing),
        };
        let out = (day.date_time.clone(), day.key);
        *current = Some(day);
        out
    }
}

/// The SigV4 signing key of `secret` on `time`'s date in `signing`'s scope.
fn signing_key(secret: &str, time: SystemTime, signing: &Signing) -> [u8; 32] {
    let mut key = [0; 32];
    key.copy_from_slice(
        generate_signing_key(secret, time, &signing.region, &signing.name).as_ref(),
    );
    key
}

/// `YYYYMMDD'T'HHMMSS'Z'` of `time`, in UTC.
fn amz_date_time(time: SystemTime) -> String {
    let seconds = time
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    jiff::Timestamp::from_second(seconds)
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
        .strftime("%Y%m%dT%H%M%SZ")
        .to_string()
}

/// The signature headers of `request` as `signing` says, for `credentials` at `time`;
/// `None` for a request this signer does not take (see [`takes`], or a header value
/// that is not text): the caller then signs it with `aws_sigv4::sign`.
pub(crate) fn sign_headers(
    request: &http::Request<Bytes>,
    signing: &Signing,
    credentials: &Credentials,
    time: SystemTime,
    keys: &SigningKeys,
) -> Option<SignatureHeaders> {
    if !takes(request, signing) {
        return None;
    }
    let settings = &signing.settings;
    let (date_time, key) = keys.date_time_and_key(time, credentials.secret_access_key(), signing);
    let payload_hash = hex::encode(Sha256::digest(request.body()));
    let token = credentials.session_token();

    // What the signature adds to the canonical headers, each replacing a header of
    // the request of the same name.
    let mut added: Vec<(&str, Cow<'_, str>)> = vec![("x-amz-date", Cow::Borrowed(&date_time))];
    if let Some(token) = token {
        added.push(("x-amz-security-token", Cow::Borrowed(token)));
    }
    if settings.payload_checksum_kind == PayloadChecksumKind::XAmzSha256 {
        added.push(("x-amz-content-sha256", Cow::Borrowed(&payload_hash)));
    }
    if request.headers().get(http::header::HOST).is_none() {
        added.push(("host", Cow::Owned(host(request.uri())?)));
    }
    let (canonical, signed_names) = canonical_request(request, signing, added, &payload_hash)?;

    // Joined, not `format!`ted: the formatting machinery was a third of this
    // function's time in a renewal's profile (docs/benchmarks.md).
    let scope = [
        &date_time[..8],
        "/",
        &signing.region,
        "/",
        &signing.name,
        "/aws4_request",
    ]
    .concat();
    let canonical_hash = hex::encode(Sha256::digest(canonical.as_bytes()));
    let string_to_sign = [
        "AWS4-HMAC-SHA256\n",
        &date_time,
        "\n",
        &scope,
        "\n",
        &canonical_hash,
    ]
    .concat();
    let signature = calculate_signature(key, string_to_sign.as_bytes());
    let authorization = [
        "AWS4-HMAC-SHA256 Credential=",
        credentials.access_key_id(),
        "/",
        &scope,
        ", SignedHeaders=",
        &signed_names,
        ", Signature=",
        &signature,
    ]
    .concat();

    let mut signature_headers = vec![("x-amz-date", date_time), ("authorization", authorization)];
    if settings.payload_checksum_kind == PayloadChecksumKind::XAmzSha256 {
        signature_headers.push(("x-amz-content-sha256", payload_hash));
    }
    if let Some(token) = token {
        signature_headers.push(("x-amz-security-token", token.to_string()));
    }
    Some(signature_headers)
}

/// Whether this signer takes `request`: no query, no presigning or renamed token, and
/// a path that is its own canonical form under the settings (they neither normalize it
/// nor encode its `%` again, or it has nothing either would change). Any mode a later
/// aws-sigv4 adds goes to aws-sigv4.
fn takes(request: &http::Request<Bytes>, signing: &Signing) -> bool {
    let settings = &signing.settings;
    let path = request.uri().path();
    let path_as_is = (settings.uri_path_normalization_mode == UriPathNormalizationMode::Disabled
        || path == "/")
        && (settings.percent_encoding_mode == PercentEncodingMode::Single
            || (settings.percent_encoding_mode == PercentEncodingMode::Double
                && !path.contains('%')));
    path_as_is
        && request.uri().query().is_none()
        && settings.signature_location == SignatureLocation::Headers
        && settings.session_token_name_override.is_none()
        && settings.expires_in.is_none()
}

/// The canonical request of `request` with the signature's `added` headers, and its
/// signed header names: the headers sorted by name (names are lower case in `http`),
/// values trimmed, the values of one name joined by commas in their order.
fn canonical_request<'a>(
    request: &'a http::Request<Bytes>,
    signing: &Signing,
    added: Vec<(&'a str, Cow<'a, str>)>,
    payload_hash: &str,
) -> Option<(String, String)> {
    let settings = &signing.settings;
    let signed = |name: &str| {
        let excluded = settings
            .excluded_headers
            .as_ref()
            .is_some_and(|excluded| excluded.iter().any(|e| e == name));
        let token_left_out = settings.session_token_mode == SessionTokenMode::Exclude
            && name == "x-amz-security-token";
        !excluded && !token_left_out
    };
    let mut headers: Vec<(&str, Cow<'_, str>)> = Vec::with_capacity(request.headers().len() + 4);
    for (name, value) in request.headers() {
        let name = name.as_str();
        if !added.iter().any(|(a, _)| *a == name) {
            headers.push((name, trim_spaces(value.to_str().ok()?)));
        }
    }
    headers.extend(added);
    headers.retain(|(name, _)| signed(name));
    // Stable: values of one name keep their order.
    headers.sort_by(|a, b| a.0.cmp(b.0));

    let names: usize = headers.iter().map(|(name, _)| name.len() + 1).sum();
    let values: usize = headers.iter().map(|(_, value)| value.len() + 1).sum();
    let path = request.uri().path();
    let mut canonical =
        String::with_capacity(16 + path.len() + 2 * names + values + payload_hash.len());
    let mut signed_names = String::with_capacity(names);
    for part in [request.method().as_str(), "\n", path, "\n\n"] {
        canonical.push_str(part);
    }
    for (i, (name, value)) in headers.iter().enumerate() {
        if i > 0 && headers[i - 1].0 == *name {
            canonical.push(',');
        } else {
            if i > 0 {
                canonical.push('\n');
                signed_names.push(';');
            }
            canonical.push_str(name);
            canonical.push(':');
            signed_names.push_str(name);
        }
        canonical.push_str(value);
    }
    for part in ["\n\n", &signed_names, "\n", payload_hash] {
        canonical.push_str(part);
    }
    Some((canonical, signed_names))
}

/// The `Host` a request to `uri` is sent with: its authority, without a port that is
/// the scheme's default (as hyper sends it and `aws_sigv4` signs it).
fn host(uri: &http::Uri) -> Option<String> {
    let authority = uri.authority()?;
    let default_port = matches!(
        (uri.scheme_str(), authority.port_u16()),
        (Some("http"), Some(80)) | (Some("https"), Some(443))
    );
    Some(if default_port {
        authority.host().to_string()
    } else {
        authority.as_str().to_string()
    })
}

/// A header value as SigV4 canonicalizes it: leading and trailing spaces removed, runs
/// of spaces made one (spaces only: S3 trims no other whitespace).
fn trim_spaces(value: &str) -> Cow<'_, str> {
    let value = value.trim_matches(' ');
    if !value.contains("  ") {
        return Cow::Borrowed(value);
    }
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if !(c == ' ' && out.ends_with(' ')) {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// What the stores' tests hold their own writes to: this signer's headers are the ones
/// `aws_sigv4::sign` makes for the same request.
#[cfg(test)]
pub(crate) mod testing {
    use aws_smithy_runtime_api::client::identity::Identity;

    use super::super::signed::aws_sigv4_signature;
    use super::*;

    /// The headers `aws_sigv4::sign` adds to `request`.
    pub(crate) fn sdk_signature(
        request: &http::Request<Bytes>,
        signing: &Signing,
        credentials: &Credentials,
        time: SystemTime,
    ) -> Vec<(String, String)> {
        let identity = Identity::from(credentials.clone());
        let instructions =
            aws_sigv4_signature(request, signing, &identity, time).expect("aws-sigv4 signs it");
        let mut headers: Vec<_> = instructions
            .headers()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        headers.sort();
        headers
    }

    pub(crate) fn ours(
        request: &http::Request<Bytes>,
        signing: &Signing,
        credentials: &Credentials,
        time: SystemTime,
        keys: &SigningKeys,
    ) -> Vec<(String, String)> {
        let mut headers: Vec<_> = sign_headers(request, signing, credentials, time, keys)
            .expect("a request the signer takes")
            .into_iter()
            .map(|(n, v)| (n.to_string(), v))
            .collect();
        headers.sort();
        headers
    }

    /// Asserts that this signer takes `request` (it is not left to `aws_sigv4::sign`)
    /// and signs it as `aws_sigv4::sign` does, with and without a session token.
    pub(crate) fn assert_signed_as_aws_sigv4_signs(
        request: &http::Request<Bytes>,
        signing: &Signing,
    ) {
        let time = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        let keys = SigningKeys::default();
        for token in [None, Some("a session token".to_string())] {
            let credentials = Credentials::new("AKID", "secret", token, None, "test");
            assert_eq!(
                ours(request, signing, &credentials, time, &keys),
                sdk_signature(request, signing, &credentials, time),
                "{} {}",
                request.method(),
                request.uri()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use aws_sigv4::http_request::SigningSettings;

    use super::testing::{ours, sdk_signature};
    use super::*;

    fn s3_settings() -> SigningSettings {
        let mut settings = SigningSettings::default();
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        settings
    }

    fn signing(name: &str, settings: SigningSettings) -> Signing {
        Signing {
            region: "eu-west-1".into(),
            name: name.into(),
            settings,
        }
    }

    #[test]
    fn the_signature_is_the_one_aws_sigv4_makes() {
        let static_keys = Credentials::new("AKIDEXAMPLE", "secret/key+", None, None, "test");
        let with_token = Credentials::new(
            "ASIAEXAMPLE",
            "another/secret",
            Some("a session token".into()),
            None,
            "test",
        );
        let time = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let s3_put = http::Request::builder()
            .method("PUT")
            .uri("http://127.0.0.1:9000/bucket/locks/a%20b/%E2%9C%93/c~d")
            .header("user-agent", "lockwarden/0")
            .header("content-type", "application/json")
            .header("content-length", "17")
            .header("if-match", "\"abc\"")
            .header("x-amz-meta-holder", "  two  spaces   inside ")
            .body(Bytes::from_static(b"{\"holder\":\"x y\"}\n"))
            .unwrap();
        let s3_default_port = http::Request::builder()
            .method("PUT")
            .uri("https://bucket.s3.eu-west-1.amazonaws.com:443/k")
            .header("if-none-match", "*")
            .header("x-amz-meta-a", "1")
            .header("x-amz-meta-a", "2")
            .body(Bytes::new())
            .unwrap();
        let dynamodb = http::Request::builder()
            .method("POST")
            .uri("http://localhost:8000")
            .header("content-type", "application/x-amz-json-1.0")
            .header("x-amz-target", "DynamoDB_20120810.UpdateItem")
            .body(Bytes::from_static(b"{\"TableName\":\"locks\"}"))
            .unwrap();
        let cases = [
            (&s3_put, signing("s3", s3_settings())),
            (&s3_default_port, signing("s3", s3_settings())),
            (&dynamodb, signing("dynamodb", SigningSettings::default())),
        ];
        let keys = SigningKeys::default();
        for (request, signing) in &cases {
            for credentials in [&static_keys, &with_token] {
                // Twice: the second from the cached key and date.
                for _ in 0..2 {
                    assert_eq!(
                        ours(request, signing, credentials, time, &keys),
                        sdk_signature(request, signing, credentials, time),
                        "{} {}",
                        request.method(),
                        request.uri()
                    );
                }
            }
        }
    }

    #[test]
    fn the_signing_key_follows_the_day_the_secret_and_the_scope() {
        let keys = SigningKeys::default();
        let credentials = Credentials::new("AKID1", "a secret", None, None, "test");
        let request = http::Request::builder()
            .method("POST")
            .uri("http://localhost:8000/")
            .body(Bytes::from_static(b"{}"))
            .unwrap();
        let dynamodb = signing("dynamodb", SigningSettings::default());
        let mut other_region = dynamodb.clone();
        other_region.region = "us-east-2".into();
        let rotated = Credentials::new("AKID2", "another secret", None, None, "test");
        let midnight = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_057_600);
        // Each step changes one input the key depends on, on one shared cache.
        for (signing, credentials, time) in [
            (&dynamodb, &credentials, midnight - Duration::from_secs(1)),
            (&dynamodb, &credentials, midnight),
            (
                &dynamodb,
                &credentials,
                midnight + Duration::from_secs(86_399),
            ),
            (&other_region, &credentials, midnight),
            (&other_region, &rotated, midnight),
            (&dynamodb, &credentials, midnight),
        ] {
            assert_eq!(
                ours(&request, signing, credentials, time, &keys),
                sdk_signature(&request, signing, credentials, time)
            );
        }
    }

    #[test]
    fn requests_the_signer_does_not_take_are_left_to_aws_sigv4() {
        let keys = SigningKeys::default();
        let credentials = Credentials::new("AKID1", "a secret", None, None, "test");
        for (uri, signing) in [
            // A query.
            (
                "http://127.0.0.1:9000/bucket/k?versionId=1",
                signing("s3", s3_settings()),
            ),
            // A path the settings would normalize.
            (
                "http://127.0.0.1:8000/a/../b",
                signing("dynamodb", SigningSettings::default()),
            ),
        ] {
            let request = http::Request::builder()
                .method("PUT")
                .uri(uri)
                .body(Bytes::new())
                .unwrap();
            let signed = sign_headers(&request, &signing, &credentials, SystemTime::now(), &keys);
            assert!(signed.is_none(), "{uri}");
        }
    }

    #[test]
    fn header_values_lose_only_their_extra_spaces() {
        assert_eq!(trim_spaces("  a  b   c "), "a b c");
        assert_eq!(trim_spaces("a\tb"), "a\tb");
        assert!(matches!(trim_spaces("plain"), Cow::Borrowed("plain")));
    }
}

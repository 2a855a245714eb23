//! HTTP answers no real server gives on demand, from a canned server.

use super::*;

// ----- responses no real server gives on demand -----------------------------------

/// One canned answer and what the engine must make of it.
struct Answer {
    name: &'static str,
    bytes: Vec<u8>,
    /// `true`: transient (LockError::Unavailable); `false`: a refusal (Backend).
    transient: bool,
}

fn s3_answers() -> Vec<Answer> {
    vec![
        Answer {
            name: "500",
            bytes: canned::s3_error(500, "Internal Server Error", "InternalError"),
            transient: true,
        },
        Answer {
            name: "503",
            bytes: canned::s3_error(503, "Service Unavailable", "SlowDown"),
            transient: true,
        },
        Answer {
            name: "403",
            bytes: canned::s3_error(403, "Forbidden", "AccessDenied"),
            transient: false,
        },
        Answer {
            name: "301",
            bytes: canned::s3_error(301, "Moved Permanently", "PermanentRedirect"),
            transient: false,
        },
        Answer {
            name: "not-http",
            bytes: b"\x00\x01\x02 this is not HTTP\r\n\r\n".to_vec(),
            transient: true,
        },
    ]
}

fn dynamodb_answers() -> Vec<Answer> {
    vec![
        Answer {
            name: "500",
            bytes: canned::dynamodb_error(500, "Internal Server Error", "InternalServerError"),
            transient: true,
        },
        Answer {
            name: "503",
            bytes: canned::dynamodb_error(503, "Service Unavailable", "ServiceUnavailable"),
            transient: true,
        },
        Answer {
            name: "403",
            bytes: canned::dynamodb_error(403, "Forbidden", "AccessDeniedException"),
            transient: false,
        },
        Answer {
            name: "400-garbage",
            bytes: canned::response(400, "Bad Request", &[], b"\xff\xfe not json"),
            transient: false,
        },
        Answer {
            name: "not-http",
            bytes: b"\x00\x01\x02 this is not HTTP\r\n\r\n".to_vec(),
            transient: true,
        },
        // The write may have applied: its outcome is unknown, not refused.
        Answer {
            name: "200-garbage",
            bytes: canned::response(
                200,
                "OK",
                &[("Content-Type", "application/x-amz-json-1.0")],
                b"{\"Attributes\": [garbage",
            ),
            transient: true,
        },
    ]
}

fn check_not_acquired(result: Result<Attempt, LockError>, answer: &Answer, what: &str) {
    match (result, answer.transient) {
        (Ok(attempt), _) => panic!("{what} {}: reported {attempt:?}", answer.name),
        (Err(LockError::Unavailable { .. }), true) | (Err(LockError::Backend { .. }), false) => {}
        (Err(e), _) => panic!(
            "{what} {}: expected {}, got {e:?}",
            answer.name,
            if answer.transient {
                "Unavailable"
            } else {
                "Backend"
            }
        ),
    }
}

/// S3 answering a conditional PUT (after a GET finding no object) and a GET with
/// status codes no healthy server sends on demand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_error_answers_are_classified_and_nothing_is_acquired() {
    for answer in s3_answers() {
        let bytes = answer.bytes.clone();
        let server = Canned::start(move |req| {
            if req.method == "GET" {
                canned::s3_error(404, "Not Found", "NoSuchKey")
            } else {
                bytes.clone()
            }
        });
        let client = support::moto::s3_client_for(&server.endpoint()).await;
        let lock = CasLock::new(S3Store::new(client, "bucket", "key"));
        check_not_acquired(lock.try_acquire(&request("me")).await, &answer, "PUT");
        assert!(
            server.requests().iter().any(|r| r.method == "PUT"),
            "{}: no PUT was sent",
            answer.name
        );

        let bytes = answer.bytes.clone();
        let server = Canned::start(move |_| bytes.clone());
        let client = support::moto::s3_client_for(&server.endpoint()).await;
        let lock = CasLock::new(S3Store::new(client, "bucket", "key"));
        match (lock.inspect().await, answer.transient) {
            (Err(LockError::Unavailable { .. }), true)
            | (Err(LockError::Backend { .. }), false) => {}
            (other, _) => panic!("GET {}: {other:?}", answer.name),
        }
        assert!(
            server.requests().iter().all(|r| r.method == "GET"),
            "{}: inspect wrote",
            answer.name
        );
    }

    // A GET answered 200 with garbage is a foreign record, not an error.
    let server =
        Canned::start(|_| canned::response(200, "OK", &[("ETag", "\"x\"")], b"\x00\xff garbage"));
    let client = support::moto::s3_client_for(&server.endpoint()).await;
    let lock = CasLock::new(S3Store::new(client, "bucket", "key"));
    let stored = lock.inspect().await.unwrap().unwrap();
    assert!(stored.record.is_err(), "{stored:?}");
    assert!(matches!(
        lock.try_acquire(&request("me")).await,
        Err(LockError::Foreign { .. })
    ));
    assert!(server.requests().iter().all(|r| r.method == "GET"));
}

/// DynamoDB answering UpdateItem (after a GetItem finding no item) with errors and
/// garbage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_error_answers_are_classified_and_nothing_is_acquired() {
    let target = |req: &canned::Request| req.header("x-amz-target").unwrap_or_default().to_string();
    for answer in dynamodb_answers() {
        let bytes = answer.bytes.clone();
        let server = Canned::start(move |req| {
            if target(req).ends_with("GetItem") {
                canned::response(
                    200,
                    "OK",
                    &[("Content-Type", "application/x-amz-json-1.0")],
                    b"{}",
                )
            } else {
                bytes.clone()
            }
        });
        let client = support::moto::dynamodb_client_for(&server.endpoint()).await;
        let lock = CasLock::new(DynamoStore::new(client, TableLayout::new("table"), "key"));
        check_not_acquired(
            lock.try_acquire(&request("me")).await,
            &answer,
            "UpdateItem",
        );
        assert!(
            server
                .requests()
                .iter()
                .any(|r| target(r).ends_with("UpdateItem")),
            "{}: no UpdateItem was sent",
            answer.name
        );
    }
}

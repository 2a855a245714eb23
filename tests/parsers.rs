//! Properties of every parser of outside input, run by `cargo test` (the cheap
//! companion of the libFuzzer targets in `fuzz/`): what we write reads back as the same
//! value, and no input makes a parser panic or produce an unbounded message.
//!
//! `PROPTEST_CASES=100000 cargo test --test parsers` runs them longer.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::types::AttributeValue;
use k8s_openapi::api::coordination::v1::Lease as KubeLease;
use lockwarden::api::DistributedLockSpec;
use lockwarden::backend::StoreFlags;
use lockwarden::backend::Target;
use lockwarden::backend::aws::AwsFlags;
use lockwarden::backend::dynamodb::{DynamoDbKey, parse_item};
use lockwarden::backend::kubernetes::{LeaseKey, parse_lease};
use lockwarden::backend::s3::S3Key;
use lockwarden::backend::zookeeper::{ZkKey, parse_connect, sequence_of};
use lockwarden::cli::lockfile::{Keeper, LockFile};
use lockwarden::duration::{format_duration, parse_duration};
use lockwarden::lock::{FenceToken, ForeignRecord, LockRecord, LockState};
use proptest::prelude::*;
use serde_json::{Value, json};

/// Go's largest duration, the top of the range `parse_duration` accepts.
const MAX_NANOS: u64 = i64::MAX as u64;

fn printable(max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(
        any::<char>().prop_filter("printable", |c| !c.is_control()),
        1..max,
    )
    .prop_map(|cs| cs.into_iter().collect())
}

fn record() -> impl Strategy<Value = LockRecord> {
    (
        any::<String>(),
        "[0-9a-f]{1,32}",
        any::<String>(),
        any::<u64>(),
        1..u64::MAX,
        any::<bool>(),
        proptest::option::of(any::<String>()),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(
            |(holder, nonce, revision, fence, lease_ms, held, data, acquired, renewed)| {
                LockRecord {
                    holder,
                    nonce,
                    revision,
                    fence: FenceToken(fence),
                    lease: Duration::from_millis(lease_ms),
                    state: if held {
                        LockState::Held
                    } else {
                        LockState::Released
                    },
                    data,
                    acquired_at: SystemTime::UNIX_EPOCH + Duration::from_millis(acquired),
                    renewed_at: SystemTime::UNIX_EPOCH + Duration::from_millis(renewed),
                    set: None,
                    history: Vec::new(),
                    runs: Default::default(),
                    unknown: Default::default(),
                }
            },
        )
}

fn s3_target() -> impl Strategy<Value = Target> {
    (
        "[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]".prop_filter("no ..", |b| !b.contains("..")),
        printable(200),
    )
        .prop_map(|(bucket, key)| Target::S3(S3Key { bucket, key }))
}

fn dynamodb_target() -> impl Strategy<Value = Target> {
    ("[A-Za-z0-9_.-]{3,255}", printable(200))
        .prop_map(|(table, key)| Target::DynamoDb(DynamoDbKey { table, key }))
}

fn zookeeper_target() -> impl Strategy<Value = Target> {
    (
        proptest::collection::vec(("[a-z0-9][a-z0-9.-]{0,20}", 1..=u16::MAX), 1..4),
        proptest::collection::vec("[A-Za-z0-9_-][A-Za-z0-9_.-]{0,20}", 1..5),
    )
        .prop_filter("no . or .. segment", |(_, segs)| {
            segs.iter().all(|s| s != "." && s != "..")
        })
        .prop_map(|(servers, segs)| {
            Target::ZooKeeper(ZkKey {
                servers: servers
                    .into_iter()
                    .map(|(h, p)| format!("{h}:{p}"))
                    .collect(),
                chroot: None,
                path: segs.iter().map(|s| format!("/{s}")).collect(),
            })
        })
}

fn kubernetes_target() -> impl Strategy<Value = Target> {
    (
        "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?",
        "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?(\\.[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?){0,3}",
    )
        .prop_map(|(namespace, name)| Target::Kubernetes(LeaseKey { namespace, name }))
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        s3_target(),
        dynamodb_target(),
        zookeeper_target(),
        kubernetes_target()
    ]
}

fn attribute() -> impl Strategy<Value = AttributeValue> {
    prop_oneof![
        any::<String>().prop_map(AttributeValue::S),
        any::<String>().prop_map(AttributeValue::N),
        any::<u64>().prop_map(|n| AttributeValue::N(n.to_string())),
        "-?[0-9]{1,40}(\\.[0-9]{0,5})?".prop_map(AttributeValue::N),
        "[0-9]{1,6}(ms|s|m|h)".prop_map(AttributeValue::S),
        any::<bool>().prop_map(AttributeValue::Bool),
        Just(AttributeValue::Null(true)),
        any::<Vec<u8>>().prop_map(|b| AttributeValue::B(b.into())),
        proptest::collection::vec(any::<String>(), 0..3).prop_map(AttributeValue::Ss),
    ]
}

const DYNAMODB_NAMES: &[&str] = &[
    "key",
    "ownerName",
    "leaseDuration",
    "recordVersionNumber",
    "isReleased",
    "data",
    "fence",
    "nonce",
    "acquiredAtMs",
    "renewedAtMs",
];

proptest! {
    #[test]
    fn durations_format_and_parse_back(nanos in 0..=MAX_NANOS) {
        let d = Duration::from_nanos(nanos);
        let text = format_duration(d);
        prop_assert_eq!(parse_duration(&text), Ok(d), "{}", text);
    }

    #[test]
    fn duration_like_text_never_panics(
        text in "[-+]?(([0-9]{0,25}(\\.[0-9]{0,25})?)(ns|us|µs|ms|s|m|h|d|x|)){0,5}",
    ) {
        if let Ok(d) = parse_duration(&text) {
            prop_assert!(d.as_nanos() <= u128::from(MAX_NANOS));
            prop_assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
    }

    #[test]
    fn any_text_as_duration_never_panics(text in any::<String>()) {
        let _ = parse_duration(&text);
    }

    #[test]
    fn records_encode_and_decode_back(record in record()) {
        prop_assert_eq!(LockRecord::from_json(&record.to_json()), Ok(record));
    }

    #[test]
    fn any_bytes_as_a_record_is_a_bounded_foreign_description(body in any::<Vec<u8>>()) {
        if let Err(foreign) = LockRecord::from_json(&body) {
            prop_assert!(foreign.what.len() <= ForeignRecord::MAX_LEN);
        }
    }

    #[test]
    fn a_corrupted_record_is_never_a_panic(
        record in record(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let mut body = record.to_json();
        let i = at.index(body.len());
        body[i] = byte;
        match LockRecord::from_json(&body) {
            Ok(back) => prop_assert!(!back.nonce.is_empty() && !back.lease.is_zero()),
            Err(foreign) => prop_assert!(foreign.what.len() <= ForeignRecord::MAX_LEN),
        }
    }

    #[test]
    fn lock_urls_display_and_parse_back(target in target()) {
        let url = target.to_string();
        prop_assert_eq!(Target::parse(&url), Ok(target.clone()), "{}", url);
        if let Target::ZooKeeper(key) = &target {
            prop_assert!(parse_connect(&key.servers.join(",")).is_ok());
        }
    }

    #[test]
    fn any_text_as_a_lock_url_never_panics(
        url in "(s3|dynamodb|zk|k8s|ftp|)(://)?[ -~]{0,80}",
        other in any::<String>(),
    ) {
        for text in [&url, &other] {
            match Target::parse(text) {
                Ok(t) => prop_assert_eq!(Target::parse(&t.to_string()), Ok(t)),
                Err(e) => prop_assert!(e.to_string().contains("expected")),
            }
            let _ = parse_connect(text);
            let _ = sequence_of(text);
        }
    }

    /// One set of name rules: a key the CLI's URL parser accepts is one the CRD's
    /// rules (in Rust) accept, and the other way round, for every store.
    #[test]
    fn the_url_parser_and_the_crd_agree_on_every_key(
        key in prop_oneof![
            any::<String>(),
            "[a-z0-9./-]{0,300}",
            proptest::collection::vec(any::<char>(), 1000..1030).prop_map(String::from_iter),
        ],
    ) {
        let spec = |backend: Value| {
            serde_json::from_value::<DistributedLockSpec>(json!({ "backend": backend }))
                .expect("a spec of the right shape")
                .validate()
                .is_ok()
        };
        let s3 = Target::parse(&format!("s3://bucket/{key}")).is_ok();
        prop_assert_eq!(s3, spec(json!({ "s3": { "bucket": "bucket", "key": key } })), "s3 {:?}", key);
        let ddb = Target::parse(&format!("dynamodb://table/{key}")).is_ok();
        prop_assert_eq!(ddb, spec(json!({ "dynamodb": { "table": "table", "key": key } })), "dynamodb {:?}", key);
        let path = format!("/{key}");
        let zk = Target::parse(&format!("zk://h:1{path}")).is_ok();
        prop_assert_eq!(zk, spec(json!({ "zookeeper": { "servers": ["h:1"], "path": path } })), "zk {:?}", key);
        // A Lease name is one URL segment (and a namespace has no dots).
        if !key.contains('/') {
            let lease = Target::parse(&format!("k8s://ns/{key}")).is_ok();
            prop_assert_eq!(lease, spec(json!({ "kubernetes": { "leaseName": key, "namespace": "ns" } })), "lease {:?}", key);
            let ns = Target::parse(&format!("k8s://{key}/lease")).is_ok();
            prop_assert_eq!(ns, spec(json!({ "kubernetes": { "leaseName": "lease", "namespace": key } })), "namespace {:?}", key);
        }
    }

    #[test]
    fn lock_files_write_and_read_back(
        target in target(),
        holder in printable(40),
        nonce in "[0-9a-f]{32}",
        fence in any::<u64>(),
        version in "[!-~]{1,40}",
        data in proptest::option::of(any::<String>()),
        endpoint in proptest::option::of("http://[a-z]{1,10}:[0-9]{1,5}"),
        keeper in proptest::option::of((any::<u32>(), "[a-z]{1,10}")),
    ) {
        let version = if target.is_session_bound() { format!("{version}:3") } else { version };
        let file = LockFile {
            store: target.lock_file_fields(&nonce, &version),
            url: target.url(),
            holder,
            nonce,
            fence,
            version,
            lease: "1h".into(),
            acquired_at: "2025-01-01T12:00:00Z".into(),
            data,
            backend: StoreFlags {
                aws: AwsFlags { endpoint, ..AwsFlags::default() },
                ..StoreFlags::default()
            },
            keeper: keeper.map(|(pid, host)| Keeper { pid, host }),
            format: 1,
        };
        let bytes = serde_json::to_vec_pretty(&file).unwrap();
        let back = LockFile::parse(Path::new("x.lock"), &bytes).unwrap();
        prop_assert_eq!(back.target(), target);
        prop_assert_eq!(back, file);
    }

    #[test]
    fn any_bytes_as_a_lock_file_never_panic(bytes in any::<Vec<u8>>()) {
        if let Ok(file) = LockFile::parse(Path::new("x.lock"), &bytes) {
            let _ = file.target();
        }
    }

    #[test]
    fn any_dynamodb_item_is_a_record_or_a_bounded_foreign_description(
        attributes in proptest::collection::vec(
            (prop_oneof![
                (0..DYNAMODB_NAMES.len()).prop_map(|i| DYNAMODB_NAMES[i].to_string()),
                any::<String>(),
            ], attribute()),
            0..14,
        ),
    ) {
        let item: HashMap<String, AttributeValue> = attributes.into_iter().collect();
        match parse_item(&item) {
            Ok(record) => prop_assert!(!record.lease.is_zero()),
            Err(foreign) => prop_assert!(foreign.what.len() <= ForeignRecord::MAX_LEN),
        }
    }

    #[test]
    fn any_lease_is_a_record_or_a_bounded_foreign_description(
        holder in proptest::option::of(any::<String>()),
        seconds in proptest::option::of(any::<i32>()),
        transitions in proptest::option::of(any::<i32>()),
        annotations in proptest::collection::btree_map(
            prop_oneof![
                Just("lockwarden.io/nonce".to_string()),
                Just("lockwarden.io/lease-ms".to_string()),
                Just("lockwarden.io/state".to_string()),
                Just("lockwarden.io/holder".to_string()),
                Just("lockwarden.io/revision".to_string()),
                "[a-z./-]{1,20}",
            ],
            prop_oneof![any::<String>(), "[0-9-]{1,25}", Just("held".to_string()), Just("released".to_string())],
            0..7,
        ),
    ) {
        let body = serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "x", "annotations": annotations},
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": seconds,
                "leaseTransitions": transitions,
            },
        });
        let lease: KubeLease = serde_json::from_value(body).unwrap();
        match parse_lease(&lease) {
            Ok(record) => prop_assert!(!record.lease.is_zero()),
            Err(foreign) => prop_assert!(foreign.what.len() <= ForeignRecord::MAX_LEN),
        }
    }
}

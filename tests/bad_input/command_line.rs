//! Command-line arguments and lock files the binary must refuse before touching a store.

use super::*;

/// A lock file with every field valid, as `lock` writes it; cases change one thing.
fn good_lock_file(url: &str) -> Value {
    json!({
        "url": url,
        "holder": "h",
        "nonce": "0123456789abcdef0123456789abcdef",
        "fence": 1,
        "version": "\"etag\"",
        "lease": "1h",
        "acquiredAt": "2025-01-01T00:00:00Z",
        "format": 1,
    })
}

fn with(mut file: Value, field: &str, value: Value) -> Vec<u8> {
    file[field] = value;
    serde_json::to_vec(&file).unwrap()
}

// ----- command line ---------------------------------------------------------------

/// Arguments the binary must refuse before touching a store: exit 2 (usage) or 1
/// (lock file), a one-line message naming what is wrong, and the bucket stays empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_and_lock_files_are_refused_without_a_write() {
    let bucket = Moto::shared().new_bucket("bad-args").await;
    let good = format!("s3://{bucket}/k");
    let cli = cli();
    let d = cli.dir();

    let files: Vec<(&str, Vec<u8>)> = vec![
        ("huge.lock", vec![b'x'; 10 << 20]),
        ("binary.lock", vec![0x00, 0xff, 0xfe, 0x13, 0x80, 0x7f]),
        ("array.lock", b"[]".to_vec()),
        ("deep.lock", "[".repeat(100_000).into_bytes()),
        (
            "fence-type.lock",
            with(good_lock_file(&good), "fence", json!("three")),
        ),
        (
            "fence-negative.lock",
            with(good_lock_file(&good), "fence", json!(-1)),
        ),
        (
            "fence-huge.lock",
            with(good_lock_file(&good), "fence", json!(1e30)),
        ),
        (
            "format-type.lock",
            with(good_lock_file(&good), "format", json!("1")),
        ),
        (
            "nonce-empty.lock",
            with(good_lock_file(&good), "nonce", json!("")),
        ),
        (
            "holder-empty.lock",
            with(good_lock_file(&good), "holder", json!("")),
        ),
        (
            "url-number.lock",
            with(good_lock_file(&good), "url", json!(42)),
        ),
        (
            "bucket-mismatch.lock",
            with(good_lock_file(&good), "Bucket", json!("other-bucket")),
        ),
        (
            "zk-version.lock",
            serde_json::to_vec(&good_lock_file("zk://127.0.0.1:1/x")).unwrap(),
        ),
        ("bad-item.json", br#"{"state":"done"}"#.to_vec()),
        ("data.txt", b"data".to_vec()),
    ];
    for (name, bytes) in &files {
        std::fs::write(d.join(name), bytes).unwrap();
    }
    std::fs::create_dir(d.join("dir.lock")).unwrap();

    let long_key = format!("s3://{bucket}/{}", "k".repeat(1025));
    let long_holder = "h".repeat(257);
    let long_table = format!("dynamodb://{}/k", "t".repeat(256));
    let long_lease_name = format!("k8s://ns/{}", "a".repeat(254));
    let long_namespace = format!("k8s://{}/x", "n".repeat(64));
    let long_attribute = "p".repeat(256);
    let tab_key = format!("s3://{bucket}/a\tb");
    let g = good.as_str();
    let data = format!("s3://{bucket}/data");

    #[rustfmt::skip]
    let mut cases: Vec<(Vec<&str>, i32, Vec<&str>)> = vec![
        // lock URLs
        (vec!["lock", ""], 2, vec!["is not a lock URL"]),
        (vec!["lock", &long_key], 2, vec!["longer than 1024 bytes", "s3://BUCKET/KEY"]),
        (vec!["lock", &tab_key], 2, vec!["control characters"]),
        (vec!["lock", "s3://a..b/k"], 2, vec!["invalid bucket name \"a..b\""]),
        (vec!["lock", "s3://-bucket/k"], 2, vec!["invalid bucket name"]),
        (vec!["lock", "dynamodb://ta$ble/k"], 2, vec!["invalid table name \"ta$ble\""]),
        (vec!["status", &long_table], 2, vec!["invalid table name"]),
        (vec!["lock", "zk://h:70000/x"], 2, vec!["invalid port \"70000\""]),
        (vec!["lock", "zk://h:-1/x"], 2, vec!["invalid port \"-1\""]),
        (vec!["lock", "zk://[::1/x"], 2, vec!["invalid server address"]),
        (vec!["lock", "zk://h!:1/x"], 2, vec!["invalid server host \"h!\""]),
        (vec!["lock", "zk://h:1/a/./b"], 2, vec!["\".\""]),
        (vec!["lock", "zk://h:1/a\u{1}b"], 2, vec!["control characters"]),
        (vec!["status", &long_lease_name], 2, vec!["invalid Lease name"]),
        (vec!["status", &long_namespace], 2, vec!["invalid namespace"]),
        // durations and numbers, including ones too large for the clock
        (vec!["lock", g, "--lease", "1000000000h"], 2, vec!["--lease", "at most 68 years"]),
        (vec!["lock", g, "--lease=-5s"], 2, vec!["--lease", "not a duration"]),
        (vec!["lock", g, "--lease", "99999999999999999999999s"], 2, vec!["--lease", "not a duration"]),
        (vec!["lock", g, "--wait", "18446744073709551615"], 2, vec!["--wait", "at most 68 years"]),
        (vec!["lock", g, "--wait", "99999999999999999999999"], 2, vec!["--wait"]),
        (vec!["lock", g, "--wait=-1"], 2, vec!["--wait", "10, 90s or 5m"]),
        (vec!["run", g, "--grace", "0s", "--", "true"], 2, vec!["--grace", "greater than zero"]),
        // Rule 7: SIGTERM and the grace after it both come before the holder deadline.
        (vec!["run", g, "--grace", "30s", "--", "true"], 2, vec!["--grace 30s", "30s lease", "at most 11s 150ms"]),
        (vec!["run", g, "--lease", "3s", "--grace", "1s", "--", "true"], 2, vec!["--grace 1s", "3s lease", "at most 440ms"]),
        (vec!["run", g, "--lease", "1h", "--lease", "2h", "--", "true"], 2, vec!["--lease", "cannot be used multiple times"]),
        // Rule 8: the lock-delay is capped, and ZooKeeper has nowhere to keep it.
        (vec!["lock", g, "--lock-delay", "2h"], 2, vec!["--lock-delay", "\"2h\"", "maximum lock-delay of 10m"]),
        (vec!["run", g, "--lock-delay", "2h", "--", "true"], 2, vec!["--lock-delay", "\"2h\"", "maximum lock-delay of 10m"]),
        (vec!["lock", "zk://127.0.0.1:1/locks/a", "--lock-delay", "3s"], 2, vec!["--lock-delay 3s: not supported on zk://"]),
        (vec!["run", "zk://127.0.0.1:1/locks/a", "--lock-delay", "3s", "--", "true"], 2, vec!["--lock-delay 3s: not supported on zk://"]),
        // Queues (docs/design.md §6.4): a weight that could never be granted, a
        // priority beyond int32, priorities and weights without --queue or on
        // ZooKeeper, a forced takeover that would not wait its turn.
        (vec!["lock", g, "--queue", "--permits", "4", "--weight", "5"], 2, vec!["--weight", "weight 5 is more than the key's 4 permits"]),
        (vec!["run", g, "--queue", "--permits", "4", "--weight", "5", "--", "true"], 2, vec!["--weight", "weight 5 is more than the key's 4 permits"]),
        (vec!["lock", g, "--queue", "--weight", "0"], 2, vec!["--weight", "at least 1"]),
        (vec!["lock", g, "--queue", "--permits", "4", "--exclusive", "--weight", "2"], 2, vec!["--weight", "exclusive holder takes all 4 permits"]),
        (vec!["lock", g, "--queue", "--priority", "3000000000"], 2, vec!["--priority", "3000000000"]),
        (vec!["lock", g, "--priority", "5"], 2, vec!["--priority", "--queue"]),
        (vec!["lock", g, "--weight", "2", "--permits", "4"], 2, vec!["--weight", "--queue"]),
        (vec!["lock", "zk://127.0.0.1:1/locks/a", "--queue", "--priority", "5"], 2, vec!["--priority: not supported on zk://", "lowest first"]),
        (vec!["run", "zk://127.0.0.1:1/locks/a", "--queue", "--permits", "3", "--weight", "2", "--", "true"], 2, vec!["--weight: not supported on zk://"]),
        (vec!["lock", g, "--queue", "--force"], 2, vec!["--force with --queue"]),
        (vec!["lock", "s3://locks/a", "--queue", "--s3lock-compatible"], 2, vec!["--queue with --s3lock-compatible", "no record"]),
        // Sharing a key with a tool that polls (§6.4): a tool of another store, an
        // unknown tool, a period out of range, a key s3lock could never take, a queue.
        (vec!["lock", "s3://locks/a", "--shared-with", "dynamolock", "--wait", "5"], 2, vec!["--shared-with dynamolock", "dynamolock locks on dynamodb", "not on s3://locks/a"]),
        (vec!["lock", g, "--shared-with", "consul"], 2, vec!["\"consul\" is not a tool lockwarden yields to", "s3lock (s3), dynamolock (dynamodb), client-go (kubernetes)"]),
        (vec!["lock", "dynamodb://tbl/k", "--shared-with", "dynamolock=5ms"], 2, vec!["\"5ms\"", "poll period must be from 10ms to 1m"]),
        (vec!["lock", "dynamodb://tbl/k", "--shared-with", "dynamolock=soon"], 2, vec!["--shared-with", "soon"]),
        (vec!["run", "s3://locks/a", "--shared-with", "s3lock", "--", "true"], 2, vec!["--shared-with s3lock needs --s3lock-compatible"]),
        (vec!["lock", "dynamodb://tbl/k", "--shared-with", "dynamolock", "--queue"], 2, vec!["--shared-with dynamolock", "only an exclusive lock outside a queue"]),
        (vec!["run", "dynamodb://tbl/k", "--shared-with", "dynamolock", "--permits", "3", "--", "true"], 2, vec!["only an exclusive lock outside a queue"]),
        // flags
        (vec!["lock", g, "--holder", "a\u{7}b"], 2, vec!["--holder", "printable"]),
        (vec!["lock", g, "--holder", &long_holder], 2, vec!["at most 256 characters"]),
        (vec!["lock", g, "--holder", "   "], 2, vec!["holder must not be empty"]),
        (vec!["lock", g, "--region", "EU_WEST_1"], 2, vec!["not a region name"]),
        (vec!["lock", g, "--partition-key", ""], 2, vec!["1-255 characters"]),
        (vec!["lock", g, "--partition-key", &long_attribute], 2, vec!["1-255 characters"]),
        (vec!["lock", g, "--sort-key", "=v"], 2, vec!["NAME=VALUE"]),
        (vec!["lock", g, "--endpoint", "ftp://x"], 2, vec!["http(s)://HOST[:PORT]"]),
        (vec!["lock", g, "--endpoint", "http://"], 2, vec!["http(s)://HOST[:PORT]"]),
        (vec!["lock", g, "--log-format", "xml"], 2, vec!["'xml'"]),
        (vec!["lock", g, "-o", "/nonexistent-dir/x.lock"], 1, vec!["/nonexistent-dir"]),
        // the controller's bounds: at least one of each
        (vec!["controller", "--reconciles-in-flight", "0"], 2, vec!["--reconciles-in-flight", "'0'"]),
        (vec!["controller", "--store-requests-in-flight", "0"], 2, vec!["--store-requests-in-flight", "'0'"]),
        (vec!["controller", "--api-requests-in-flight", "70000"], 2, vec!["--api-requests-in-flight", "'70000'"]),
        // --reclaim compares holder names: the default (user@host:pid) differs per run
        (vec!["lock", g, "--reclaim"], 2, vec!["--reclaim", "--holder"]),
        (vec!["run", g, "--reclaim", "--", "true"], 2, vec!["--reclaim", "--holder"]),
        (vec!["lock", g, "--reclaim", "--holder", "h", "--force"], 2, vec!["--reclaim", "--force"]),
        // check-fence: the fence is a required plain decimal number
        (vec!["check-fence", g], 2, vec!["<FENCE>"]),
        (vec!["check-fence", g, "seven"], 2, vec!["\"seven\" is not a fence", "plain decimal number"]),
        (vec!["check-fence", g, "5x"], 2, vec!["\"5x\" is not a fence"]),
        (vec!["check-fence", g, " 5"], 2, vec!["\" 5\" is not a fence"]),
        (vec!["check-fence", g, "18446744073709551616"], 2, vec!["\"18446744073709551616\" is not a fence", "18446744073709551615"]),
        (vec!["check-fence", g, ""], 2, vec!["\"\" is not a fence"]),
        // guard (rule 9): the acquisition it guards, as the Pod's annotations give it
        (vec!["guard", "--url", g, "--nonce", "n1", "--fence", "1"], 2, vec!["<COMMAND>"]),
        (vec!["guard", "--url", g, "--nonce", "", "--fence", "1", "--", "true"], 2, vec!["--nonce (LOCKWARDEN_NONCE) is missing or empty", "lockwarden.io/nonce"]),
        (vec!["guard", "--url", g, "--nonce", "n1", "--fence", "three", "--", "true"], 2, vec!["--fence", "\"three\" is not a fence"]),
        (vec!["guard", "--url", g, "--nonce", "n1", "--", "true"], 2, vec!["--fence (LOCKWARDEN_FENCE) is missing or empty"]),
        (vec!["guard", "--", "true"], 2, vec!["no lock to guard", "--url", "--urls"]),
        (vec!["guard", "--url", "zk://127.0.0.1:1/x", "--nonce", "n1", "--fence", "1", "--", "true"], 2, vec!["cannot watch", "session expires"]),
        (vec!["guard", "--url", g, "--nonce", "n1", "--fence", "1", "--", "true"], 4, vec![g, "not held with this nonce", "no record"]),
        (vec!["guard", "--url", g, "--endpoint", "http://127.0.0.1:1", "--nonce", "n1", "--fence", "1", "--", "true"], 1, vec![g, "backend unavailable", "not started"]),
        // guard of several locks: --urls/--nonces/--fences, every lock named once in each
        (vec!["guard", "--urls", "a=s3://locks/a", "--nonces", "a=n1", "--fences", "a=1,b=2", "--", "true"], 2, vec!["--urls, --nonces and --fences name 1, 1 and 2 locks"]),
        (vec!["guard", "--urls", "a=s3://locks/a b=s3://locks/b", "--nonces", "a=n1,c=n2", "--fences", "a=1,b=2", "--", "true"], 2, vec!["--nonces names no lock \"b\""]),
        (vec!["guard", "--urls", "a=s3://locks/a", "--nonces", "a=n1", "--", "true"], 2, vec!["--fences (LOCKWARDEN_FENCES) is missing or empty"]),
        (vec!["guard", "--url", g, "--urls", "a=s3://locks/a", "--nonces", "a=n1", "--fences", "a=1", "--", "true"], 2, vec!["both --url/--nonce/--fence and --urls/--nonces/--fences"]),
        (vec!["guard", "--urls", "a=zk://127.0.0.1:1/x", "--nonces", "a=n1", "--fences", "a=1", "--", "true"], 2, vec!["cannot watch", "session expires"]),
        // a bad lock file, forced (`bad_lock_files` below has each one unforced)
        (vec!["unlock", "--force", "binary.lock"], 1, vec!["not a lockwarden lock file"]),
        // fenced writes: put, get, delete
        (vec!["put", "--lock", g, &data, "data.txt"], 2, vec!["--fence"]),
        (vec!["put", "--fence", "5", &data, "data.txt"], 2, vec!["--lock"]),
        (vec!["delete", "--lock", g, &data], 2, vec!["--fence"]),
        (vec!["put", "--fence", "five", "--lock", g, &data, "data.txt"], 2, vec!["--fence", "five"]),
        (vec!["put", "--fence=-1", "--lock", g, &data, "data.txt"], 2, vec!["--fence", "-1"]),
        (vec!["put", "--fence", "1", "--lock", "nope", &data, "data.txt"], 2, vec!["--lock", "is not a lock URL"]),
        (vec!["put", "--fence", "1", "--lock", g, "ftp://x/y", "data.txt"], 2, vec!["unknown scheme \"ftp\""]),
        (vec!["get", "gopher://x/y"], 2, vec!["unknown scheme \"gopher\""]),
        (vec!["put", "--fence", "1", "--lock", g, "zk://127.0.0.1:1/x", "data.txt"], 2, vec!["zk://127.0.0.1:1/x", "not supported", "s3://BUCKET/KEY"]),
        (vec!["put", "--fence", "1", "--lock", g, "dynamodb://no-such-table/k", "bad-item.json"], 2, vec!["dynamodb://no-such-table/k", "invalid data", "\"state\"", "expected one type"]),
        (vec!["put", "--fence", "1", "--lock", g, &data, "no-such-file"], 1, vec!["no-such-file"]),
    ];
    // Lock files `unlock` refuses, each with exit 1 and the fragments named.
    #[rustfmt::skip]
    let bad_lock_files: Vec<(&str, Vec<&str>)> = vec![
        ("huge.lock", vec!["huge.lock is not a lockwarden lock file"]),
        ("binary.lock", vec!["binary.lock is not a lockwarden lock file"]),
        ("array.lock", vec!["not a lockwarden lock file"]),
        ("deep.lock", vec!["not a lockwarden lock file", "invalid type"]),
        ("fence-type.lock", vec!["invalid type", "three"]),
        ("fence-negative.lock", vec!["invalid value", "-1"]),
        ("fence-huge.lock", vec!["not a lockwarden lock file"]),
        ("format-type.lock", vec!["invalid type"]),
        ("nonce-empty.lock", vec!["empty nonce"]),
        ("holder-empty.lock", vec!["empty holder"]),
        ("url-number.lock", vec!["invalid type"]),
        ("bucket-mismatch.lock", vec!["Bucket/Key do not match the url"]),
        ("zk-version.lock", vec!["not a ZooKeeper entry"]),
        ("dir.lock", vec!["dir.lock"]),
    ];
    for (file, fragments) in bad_lock_files {
        cases.push((vec!["unlock", file], 1, fragments));
    }
    for (argv, code, fragments) in &cases {
        let out = cli.run(argv).await;
        let case = format!(
            "{:?}",
            argv.iter()
                .map(|a| a.chars().take(60).collect::<String>())
                .collect::<Vec<_>>()
        );
        out.expect(*code, fragments, &case);
    }

    // The guard outside the image it is meant for: S3 over TLS (AWS itself, no
    // endpoint) where no CA certificate can be found, as in busybox or scratch.
    let bare = Cli::new()
        .clearing_env()
        .with("SSL_CERT_FILE", "/nonexistent/ca.pem")
        .with("SSL_CERT_DIR", "/nonexistent/certs");
    let out = bare
        .run(&[
            "guard",
            "--url",
            "s3://locks/k",
            "--nonce",
            "n1",
            "--fence",
            "1",
            "--",
            "true",
        ])
        .await;
    out.expect(
        1,
        &[
            "s3://locks/k",
            "no CA certificates found",
            "SSL_CERT_FILE=/nonexistent/ca.pem",
            "not started",
        ],
        "guard without CA certificates",
    );

    // An argument that is not UTF-8 at all.
    let mut raw = b"s3://".to_vec();
    raw.extend_from_slice(&[0xff, 0xfe]);
    raw.extend_from_slice(b"/k");
    let out = cli
        .run_os(&[OsString::from("lock"), OsString::from_vec(raw)])
        .await;
    out.expect(2, &["UTF-8"], "non-UTF-8 URL");

    // Nothing reached the store, and no file was written or removed.
    let written = Moto::shared().object_keys(&bucket).await;
    assert!(written.is_empty(), "{written:?}");
    for (name, bytes) in &files {
        assert_eq!(
            &std::fs::read(d.join(name)).unwrap(),
            bytes,
            "{name} changed"
        );
    }
    let mut names: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut expected: Vec<String> = files.iter().map(|(n, _)| n.to_string()).collect();
    expected.push("dir.lock".into());
    expected.sort();
    assert_eq!(names, expected);
}

/// Fenced writes need a target that is not a lock and a lock with one permit: both are
/// refused with exit 1, a one-line message naming them, and nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_refuse_a_lock_record_and_a_lock_with_several_permits() {
    let bucket = Moto::shared().new_bucket("bad-fenced").await;
    let lock = format!("s3://{bucket}/locks/mutex");
    let semaphore = format!("s3://{bucket}/locks/semaphore");
    let data = format!("s3://{bucket}/data");
    let cli = cli();
    std::fs::write(cli.path("data.txt"), "data").unwrap();
    cli.run(&["lock", &lock, "-o", "mutex.lock"]).await.ok();
    cli.run(&["lock", "--permits", "2", &semaphore, "-o", "sem.lock"])
        .await
        .ok();
    let before = Moto::shared().object_keys(&bucket).await;

    #[rustfmt::skip]
    let cases: Vec<(Vec<&str>, i32, Vec<&str>)> = vec![
        (vec!["put", "--fence", "1", "--lock", &lock, &lock, "data.txt"], 1, vec![&lock, "lock record"]),
        (vec!["delete", "--fence", "1", "--lock", &lock, &lock], 1, vec![&lock, "lock record"]),
        (vec!["get", &lock], 1, vec![&lock, "lock record"]),
        (vec!["put", "--fence", "1", "--lock", &semaphore, &data, "data.txt"], 1, vec![&semaphore, "has 2 permits", "exclusive holder"]),
        (vec!["delete", "--fence", "1", "--lock", &semaphore, &data], 1, vec![&semaphore, "has 2 permits"]),
    ];
    for (argv, code, fragments) in &cases {
        cli.run(argv)
            .await
            .expect(*code, fragments, &format!("{argv:?}"));
    }
    assert_eq!(Moto::shared().object_keys(&bucket).await, before);
    cli.run(&["unlock", "mutex.lock"]).await.ok();
    cli.run(&["unlock", "sem.lock"]).await.ok();
}

// ----- kubectl lockwarden ---------------------------------------------------------

/// `kubectl-lockwarden` (the binary under its plugin name) refuses objects it cannot
/// read, missing names and unknown flags before connecting anywhere: exit 2 and one
/// line naming what is wrong and the expected form. Without a cluster it says so (1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubectl_plugin_refuses_bad_objects_and_flags() {
    let plugins = support::kubectl::plugin_dir();
    let plugin = plugins.path().join("kubectl-lockwarden");
    let rows: &[(&[&str], i32, &[&str])] = &[
        (
            &["why", "svc/x"],
            2,
            &[
                "\"svc\" is not a kind of object",
                "expected job/NAME or pod/NAME",
            ],
        ),
        (&["status", "svc/x"], 2, &["expected dlock/NAME"]),
        (&["why", "dlock/x"], 2, &["\"dlock\" cannot be used here"]),
        (&["why", "job/"], 2, &["the object's name is missing"]),
        (&["history", "dlock/"], 2, &["the object's name is missing"]),
        (
            &["why", "nightly"],
            2,
            &["\"nightly\" names no kind of object"],
        ),
        (&["why"], 2, &["required arguments were not provided"]),
        (&["history"], 2, &["required arguments were not provided"]),
        (
            &["history", "dlock/a", "dlock/b"],
            2,
            &["2 words given, one object"],
        ),
        (
            &["status", "--bogus"],
            2,
            &["unexpected argument '--bogus'"],
        ),
        (&["status", "-o", "table"], 2, &["invalid value 'table'"]),
        (
            &["status", "dlock/x", "--store"],
            2,
            &["unexpected argument '--store'"],
        ),
        (&["status", "-n", "a", "-A"], 2, &["cannot be used with"]),
        (
            &["scale", "dlock/x"],
            2,
            &["unrecognized subcommand 'scale'"],
        ),
        (&["status", "dlock/x"], 1, &["no Kubernetes configuration"]),
        (
            &["why", "job/x", "--kubeconfig", "/nonexistent/config"],
            1,
            &["cannot read kubeconfig /nonexistent/config"],
        ),
    ];
    for (args, code, fragments) in rows {
        let out = tokio::process::Command::new(&plugin)
            .args(*args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("KUBECONFIG", "/nonexistent/kubeconfig")
            .env("HOME", plugins.path())
            .output()
            .await
            .expect("run kubectl-lockwarden");
        let out = support::cli::Out {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        out.expect(
            *code,
            fragments,
            &format!("kubectl lockwarden {}", args.join(" ")),
        );
    }
}

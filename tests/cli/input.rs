//! Malformed input, unreachable backends, `--help` and completions.

use super::*;

/// Malformed URLs, durations, flags and lock files: each a one-line error with exit 2
/// (usage) or 1 (lock file), and nothing reaches the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_is_a_one_line_error_and_writes_nothing() {
    let bucket = Moto::shared().new_bucket("cli-malformed").await;
    let lw = Cli::aws();
    let good = format!("s3://{bucket}/k");
    std::fs::write(lw.path("corrupt.lock"), "{ this is not json").unwrap();
    std::fs::write(lw.path("empty.lock"), "").unwrap();
    std::fs::write(
        lw.path("s3lock.lock"),
        // What s3lock itself writes: no url, nonce or fence.
        r#"{"Bucket":"b","Key":"k","Id":"0b3c7e4c","ETag":"\"x\""}"#,
    )
    .unwrap();
    std::fs::write(
        lw.path("badurl.lock"),
        r#"{"url":"s3://x","holder":"h","nonce":"n","fence":1,"version":"v","lease":"1h","acquiredAt":"2025-01-01T00:00:00Z","format":1}"#,
    )
    .unwrap();
    std::fs::write(
        lw.path("future.lock"),
        format!(
            r#"{{"url":"{good}","holder":"h","nonce":"n","fence":1,"version":"v","lease":"1h","acquiredAt":"2025-01-01T00:00:00Z","format":99}}"#
        ),
    )
    .unwrap();

    let cases: Vec<(Vec<String>, i32, Vec<String>)> = vec![
        // URLs
        (
            vec!["lock".into(), format!("s3:/{bucket}/k")],
            2,
            vec!["is not a lock URL".into(), "s3://BUCKET/KEY".into()],
        ),
        (
            vec!["lock".into(), format!("s3://{bucket}")],
            2,
            vec!["no key after the bucket".into()],
        ),
        (
            vec!["lock".into(), format!("s3://{bucket}/")],
            2,
            vec!["empty key".into()],
        ),
        (
            vec!["lock".into(), "s3://Not_A_Bucket/k".into()],
            2,
            vec!["invalid bucket name".into()],
        ),
        (
            vec!["lock".into(), format!("ftp://{bucket}/k")],
            2,
            vec!["unknown scheme \"ftp\"".into()],
        ),
        (
            vec!["lock".into(), "dynamodb://t/k".into()],
            2,
            vec!["invalid table name".into(), "dynamodb://TABLE/KEY".into()],
        ),
        (
            vec!["lock".into(), "zk://127.0.0.1:notaport/x".into()],
            2,
            vec!["invalid port".into(), "zk://HOST:PORT".into()],
        ),
        (
            vec!["lock".into(), "zk://127.0.0.1:2181".into()],
            2,
            vec!["no lock path".into()],
        ),
        (
            vec!["status".into(), "k8s://only-namespace".into()],
            2,
            vec!["no Lease name".into(), "k8s://NAMESPACE/LEASE-NAME".into()],
        ),
        (
            vec![
                "run".into(),
                "k8s://Bad_NS/x".into(),
                "--".into(),
                "true".into(),
            ],
            2,
            vec!["invalid namespace".into()],
        ),
        // durations and numbers
        (
            vec![
                "lock".into(),
                good.clone(),
                "--lease".into(),
                "10parsecs".into(),
            ],
            2,
            vec!["--lease".into(), "30s, 5m, 1h30m".into()],
        ),
        (
            vec!["lock".into(), good.clone(), "--lease".into(), "0s".into()],
            2,
            vec!["greater than zero".into()],
        ),
        (
            vec![
                "lock".into(),
                good.clone(),
                "--lease".into(),
                "500ms".into(),
            ],
            2,
            vec!["at least 1s".into()],
        ),
        (
            vec!["lock".into(), good.clone(), "--wait".into(), "soon".into()],
            2,
            vec!["--wait".into(), "10, 90s or 5m".into()],
        ),
        (
            vec![
                "run".into(),
                good.clone(),
                "--grace".into(),
                "a while".into(),
                "--".into(),
                "true".into(),
            ],
            2,
            vec!["--grace".into()],
        ),
        // flags
        (
            vec!["lock".into(), good.clone(), "--bogus".into()],
            2,
            vec!["unexpected argument '--bogus'".into()],
        ),
        (
            vec!["lock".into(), good.clone(), "--holder".into(), "".into()],
            2,
            vec!["holder must not be empty".into()],
        ),
        (
            vec![
                "lock".into(),
                good.clone(),
                "--endpoint".into(),
                "localhost:9000".into(),
            ],
            2,
            vec!["http(s)://HOST[:PORT]".into()],
        ),
        (
            vec![
                "lock".into(),
                good.clone(),
                "--sort-key".into(),
                "novalue".into(),
            ],
            2,
            vec!["NAME=VALUE".into()],
        ),
        (
            vec!["status".into(), good.clone(), "-o".into(), "xml".into()],
            2,
            vec!["'xml'".into(), "json, yaml, wide".into()],
        ),
        (
            vec!["run".into(), good.clone()],
            2,
            vec!["<COMMAND>".into()],
        ),
        (vec!["lock".into()], 2, vec!["<URL>".into()]),
        (
            vec!["frobnicate".into()],
            2,
            vec!["unrecognized subcommand".into()],
        ),
        // lock files
        (
            vec!["unlock".into(), "missing.lock".into()],
            1,
            vec!["missing.lock: no such file".into()],
        ),
        (
            vec!["unlock".into(), "corrupt.lock".into()],
            1,
            vec!["corrupt.lock is not a lockwarden lock file".into()],
        ),
        (
            vec!["unlock".into(), "empty.lock".into()],
            1,
            vec!["the file is empty".into()],
        ),
        (
            vec!["unlock".into(), "s3lock.lock".into()],
            1,
            vec!["not a lockwarden lock file".into(), "missing field".into()],
        ),
        (
            vec!["unlock".into(), "badurl.lock".into()],
            1,
            vec!["url:".into(), "no key after the bucket".into()],
        ),
        (
            vec!["unlock".into(), "future.lock".into()],
            1,
            vec!["format 99 is not supported".into()],
        ),
        (
            vec!["unlock".into(), "--force".into(), "corrupt.lock".into()],
            1,
            vec!["not a lockwarden lock file".into()],
        ),
        // an output file that cannot be written is found before acquiring
        (
            vec![
                "lock".into(),
                good.clone(),
                "-o".into(),
                "no/such/dir/x.lock".into(),
            ],
            1,
            vec!["no/such/dir".into()],
        ),
    ];
    assert!(cases.len() >= 15);
    for (args, code, needles) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
        let out = lw.run(&args).await;
        out.code(*code).one_line_error(&needles);
        assert!(out.stdout.is_empty(), "{args:?}: {out:#?}");
    }
    // The bad lock files are still there (nothing removed them), and nothing was
    // written to the bucket.
    assert!(lw.path("corrupt.lock").exists());
    let written = Moto::shared().object_keys(&bucket).await;
    assert!(
        written.is_empty(),
        "malformed input wrote to the bucket: {written:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_backend_is_an_error_naming_the_url() {
    // Nothing listens on this port.
    let port = support::free_port();
    let lw = Cli::new().with("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}"));
    let url = "s3://some-bucket/k";
    let out = lw.run(&["status", url]).await;
    out.code(1).one_line_error(&[url]);
    // No credentials at all for Kubernetes.
    let out = lw.run(&["status", "k8s://default/x"]).await;
    out.code(1)
        .one_line_error(&["k8s://default/x", "Kubernetes configuration"]);
}

#[test]
fn help_documents_exit_codes_and_completions_are_generated() {
    let out = std::process::Command::new(BIN)
        .arg("--help")
        .output()
        .expect("run --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "Exit status:",
        "3    the lock is held by someone else",
        "4    run: the lock was lost",
        "s3://BUCKET/KEY",
        "k8s://NAMESPACE/LEASE-NAME",
    ] {
        assert!(help.contains(needle), "--help lacks {needle:?}:\n{help}");
    }
    for shell in ["bash", "zsh", "fish"] {
        let out = std::process::Command::new(BIN)
            .args(["completions", shell])
            .output()
            .expect("run completions");
        assert!(out.status.success(), "{shell}: {out:?}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(
            script.contains("lockwarden") && script.contains("unlock"),
            "{shell} completions:\n{script}"
        );
    }
}

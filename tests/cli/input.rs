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

    let g = good.as_str();
    let (one_slash, no_key) = (format!("s3:/{bucket}/k"), format!("s3://{bucket}"));
    let (empty_key, ftp) = (format!("s3://{bucket}/"), format!("ftp://{bucket}/k"));
    #[rustfmt::skip]
    let cases: Vec<(Vec<&str>, i32, Vec<&str>)> = vec![
        // URLs
        (vec!["lock", &one_slash], 2, vec!["is not a lock URL", "s3://BUCKET/KEY"]),
        (vec!["lock", &no_key], 2, vec!["no key after the bucket"]),
        (vec!["lock", &empty_key], 2, vec!["empty key"]),
        (vec!["lock", "s3://Not_A_Bucket/k"], 2, vec!["invalid bucket name"]),
        (vec!["lock", &ftp], 2, vec!["unknown scheme \"ftp\""]),
        (vec!["lock", "dynamodb://t/k"], 2, vec!["invalid table name", "dynamodb://TABLE/KEY"]),
        (vec!["lock", "zk://127.0.0.1:notaport/x"], 2, vec!["invalid port", "zk://HOST:PORT"]),
        (vec!["lock", "zk://127.0.0.1:2181"], 2, vec!["no lock path"]),
        (vec!["status", "k8s://only-namespace"], 2, vec!["no Lease name", "k8s://NAMESPACE/LEASE-NAME"]),
        (vec!["run", "k8s://Bad_NS/x", "--", "true"], 2, vec!["invalid namespace"]),
        // durations and numbers
        (vec!["lock", g, "--lease", "10parsecs"], 2, vec!["--lease", "30s, 5m, 1h30m"]),
        (vec!["lock", g, "--lease", "0s"], 2, vec!["greater than zero"]),
        (vec!["lock", g, "--lease", "500ms"], 2, vec!["at least 1s"]),
        (vec!["lock", g, "--wait", "soon"], 2, vec!["--wait", "10, 90s or 5m"]),
        (vec!["run", g, "--grace", "a while", "--", "true"], 2, vec!["--grace"]),
        // flags
        (vec!["lock", g, "--bogus"], 2, vec!["unexpected argument '--bogus'"]),
        (vec!["lock", g, "--holder", ""], 2, vec!["holder must not be empty"]),
        (vec!["lock", g, "--endpoint", "localhost:9000"], 2, vec!["http(s)://HOST[:PORT]"]),
        (vec!["lock", g, "--sort-key", "novalue"], 2, vec!["NAME=VALUE"]),
        (vec!["status", g, "-o", "xml"], 2, vec!["'xml'", "json, yaml, wide"]),
        (vec!["run", g], 2, vec!["<COMMAND>"]),
        (vec!["lock"], 2, vec!["<URL>"]),
        (vec!["frobnicate"], 2, vec!["unrecognized subcommand"]),
        // lock files
        (vec!["unlock", "missing.lock"], 1, vec!["missing.lock: no such file"]),
        (vec!["unlock", "corrupt.lock"], 1, vec!["corrupt.lock is not a lockwarden lock file"]),
        (vec!["unlock", "empty.lock"], 1, vec!["the file is empty"]),
        (vec!["unlock", "s3lock.lock"], 1, vec!["not a lockwarden lock file", "missing field"]),
        (vec!["unlock", "badurl.lock"], 1, vec!["url:", "no key after the bucket"]),
        (vec!["unlock", "future.lock"], 1, vec!["format 99 is not supported"]),
        (vec!["unlock", "--force", "corrupt.lock"], 1, vec!["not a lockwarden lock file"]),
        // an output file that cannot be written is found before acquiring
        (vec!["lock", g, "-o", "no/such/dir/x.lock"], 1, vec!["no/such/dir"]),
    ];
    assert!(cases.len() >= 15);
    for (args, code, needles) in &cases {
        let out = lw.run(args).await;
        out.code(*code).one_line_error(needles);
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
    let out = std::process::Command::new(bin())
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
        let out = std::process::Command::new(bin())
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

//! ZooKeeper queue entries that are not lockwarden's.

use super::*;

// ----- ZooKeeper ------------------------------------------------------------------

/// Queue entries another client left with garbage data: the lock is reported held
/// by that entry (docs/design.md §3 rule 6: foreign entries are never deleted), and the entry
/// is unchanged afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_garbage_queue_entries_are_reported_and_left_alone() {
    use zookeeper_client::{Acls, CreateMode};

    let zk = ZooKeeper::shared();
    let raw = zk.connect().await;
    let options = CreateMode::Persistent.with_acls(Acls::anyone_all());
    let sessions = ZkSessions::new();
    let cli = cli();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("binary", vec![0x00, 0xff, 0x13, 0x80]),
        (
            "json-of-someone-else",
            br#"{"owner_id":"kafka-kit","t":[1,2,3]}"#.to_vec(),
        ),
        ("wrong-types", record_json(json!({"fence": "x"}))),
        ("half-megabyte", vec![b'z'; 500_000]),
        ("empty", Vec::new()),
    ];
    for (name, data) in cases {
        let path = format!("/lockwarden-bad-input/{}", support::unique(name));
        // An entry that sorts first (sequence 0: ours get 1 and up), persistent so it
        // outlives its writer.
        let entry = format!("{path}/garbage-0000000000");
        let parent_options = CreateMode::Persistent.with_acls(Acls::anyone_all());
        let mut ancestor = String::new();
        for segment in path.trim_start_matches('/').split('/') {
            ancestor.push('/');
            ancestor.push_str(segment);
            let _ = raw.create(&ancestor, b"", &parent_options).await;
        }
        raw.create(&entry, &data, &options)
            .await
            .unwrap_or_else(|e| panic!("{name}: create {entry}: {e}"));
        let (_, stat_before) = raw.get_data(&entry).await.unwrap();

        let lock = sessions.lock(&zk.connect_string(), &path).unwrap();
        match lock.try_acquire(&request("me")).await {
            Ok(Attempt::Busy { holder, .. }) => {
                assert!(
                    holder
                        .holder
                        .contains("foreign queue entry garbage-0000000000"),
                    "{name}: {}",
                    holder.holder
                );
                assert!(
                    holder.holder.len() < 1024,
                    "{name}: {}",
                    holder.holder.len()
                );
            }
            other => panic!("{name}: expected busy, got {other:?}"),
        }
        lock.abandon().await;
        let url = format!("zk://{}{path}", zk.connect_string());
        let out = cli.run(&["lock", &url, "-o", "x.lock"]).await;
        out.expect(3, &[&url, "foreign queue entry"], name);

        let (data_after, stat_after) = raw.get_data(&entry).await.unwrap();
        assert!(data_after == data, "{name}: the entry's data changed");
        assert_eq!(stat_after.mzxid, stat_before.mzxid, "{name}: rewritten");
        // Our own queue entries are gone again; the foreign one stays.
        support::eventually(
            "only the foreign entry is left",
            Duration::from_secs(60),
            || {
                let raw = &raw;
                let path = path.clone();
                async move {
                    let (children, _) = raw.get_children(&path).await.ok()?;
                    (children == ["garbage-0000000000"]).then_some(())
                }
            },
        )
        .await;
    }
    assert!(!cli.path("x.lock").exists());
}

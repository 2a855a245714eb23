//! DynamoDB items with wrong attribute types, put into moto.

use super::*;

// ----- DynamoDB -------------------------------------------------------------------

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_string())
}

fn n(v: &str) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// Items whose attributes have the wrong types or values: foreign, reported, and
/// the item is unchanged afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_items_with_wrong_types_are_reported_and_left_alone() {
    let moto = Moto::shared();
    let table = moto.new_table("bad-ddb", "key").await;
    let client = moto.dynamodb_client().await;
    let good: HashMap<String, AttributeValue> = HashMap::from([
        ("ownerName".to_string(), s("someone")),
        ("leaseDuration".to_string(), s("30s")),
        ("recordVersionNumber".to_string(), s("rvn-1")),
        ("fence".to_string(), n("3")),
        ("nonce".to_string(), s("0123456789abcdef")),
    ]);
    let changed = |name: &str, value: Option<AttributeValue>| {
        let mut item = good.clone();
        match value {
            Some(v) => item.insert(name.to_string(), v),
            None => item.remove(name),
        };
        item
    };
    let huge_owner = "o".repeat(300_000);
    let cases: Vec<(&str, HashMap<String, AttributeValue>, &str)> = vec![
        (
            "lease-number",
            changed("leaseDuration", Some(n("30"))),
            "leaseDuration is a number",
        ),
        (
            "lease-garbage",
            changed("leaseDuration", Some(s("soon"))),
            "expected a duration",
        ),
        (
            "lease-zero",
            changed("leaseDuration", Some(s("0s"))),
            "expected a duration",
        ),
        (
            "lease-huge",
            changed("leaseDuration", Some(s("99999999999h"))),
            "expected a duration",
        ),
        (
            "fence-string",
            changed("fence", Some(s("3"))),
            "fence is a string",
        ),
        (
            "fence-negative",
            changed("fence", Some(n("-3"))),
            "non-negative integer",
        ),
        (
            "fence-fraction",
            changed("fence", Some(n("3.5"))),
            "non-negative integer",
        ),
        (
            "fence-beyond-u64",
            changed("fence", Some(n("18446744073709551616"))),
            "non-negative integer",
        ),
        // isReleased of any type is not here: like dynamolock, a present isReleased
        // means released (see src/backend/dynamodb.rs), so it is not bad input.
        (
            "data-number",
            changed("data", Some(n("1"))),
            "data is a number",
        ),
        (
            "owner-list",
            changed("ownerName", Some(AttributeValue::L(vec![s("a")]))),
            "ownerName is a list",
        ),
        (
            "owner-huge-map",
            changed(
                "ownerName",
                Some(AttributeValue::M(HashMap::from([(
                    huge_owner.clone(),
                    s("x"),
                )]))),
            ),
            "ownerName is a map",
        ),
        // A missing nonce is not here: an item without lockwarden's own attributes is
        // a dynamolock lock, held by its ownerName (tests/interop.rs).
        (
            "rvn-null",
            changed("recordVersionNumber", Some(AttributeValue::Null(true))),
            "recordVersionNumber is null",
        ),
    ];
    let cli = cli();
    for (name, mut item, fragment) in cases {
        item.insert("key".to_string(), s(name));
        client
            .put_item()
            .table_name(&table)
            .set_item(Some(item.clone()))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{name}: put: {e:?}"));
        let lock = CasLock::new(DynamoStore::new(
            client.clone(),
            TableLayout::new(&table),
            name,
        ));
        match lock.try_acquire(&request("me")).await {
            Err(LockError::Foreign { found, .. }) => {
                assert!(found.what.contains(fragment), "{name}: {found}");
                assert_bounded(&found);
            }
            other => panic!("{name}: expected a foreign record, got {other:?}"),
        }
        let url = format!("dynamodb://{table}/{name}");
        let out = cli.run(&["lock", &url, "-o", "x.lock"]).await;
        out.expect(3, &[&url, "not a lockwarden lock"], name);
        let out = cli.run(&["status", &url, "-o", "json"]).await;
        assert_eq!(out.code, 0, "{name}: {out:#?}");

        let stored = client
            .get_item()
            .table_name(&table)
            .key("key", s(name))
            .consistent_read(true)
            .send()
            .await
            .unwrap();
        assert_eq!(stored.item(), Some(&item), "{name}: the item changed");
    }
}

//! The SQL fencing recipe of docs/guide/fencing.md (its "## SQL" section) on a real
//! PostgreSQL from Debian's packages (tests/support/postgres.rs), through `psql`.
//!
//! The SQL is the guide's own `sql` block, read from docs/guide/fencing.md at run time, so the
//! recipe users copy and the one tested cannot drift apart. Each test works in a
//! schema of its own.

use lockwarden_testsupport as support;

use std::collections::BTreeMap;

use support::postgres::Postgres;
use support::{repo_root, unique};

/// The guide page the recipe is read from (its `<!-- runs: tests/fenced_sql.rs -->`
/// block; tests/cli/docs_markdown.rs checks this file names the page).
const GUIDE: &str = "docs/guide/fencing.md";

/// The `sql` block of docs/guide/fencing.md's "## SQL" section.
fn guide_recipe() -> String {
    let readme = std::fs::read_to_string(repo_root().join(GUIDE)).expect(GUIDE);
    let section = readme
        .split_once("\n## SQL\n")
        .map(|(_, rest)| rest)
        .expect("docs/guide/fencing.md has a \"## SQL\" section");
    let section = section.split("\n#").next().unwrap_or(section);
    let block = section
        .split_once("```sql\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(block, _)| block)
        .expect("docs/guide/fencing.md's SQL section has a ```sql block");
    block.to_string()
}

/// The recipe's `PREPARE` statements: what every session that writes needs.
fn prepared_statements(recipe: &str) -> String {
    let without_comments: String = recipe
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .map(|l| format!("{l}\n"))
        .collect();
    let prepares: Vec<&str> = without_comments
        .split(';')
        .map(str::trim)
        .filter(|s| s.starts_with("PREPARE "))
        .collect();
    assert_eq!(prepares.len(), 2, "the recipe's PREPAREs: {prepares:?}");
    prepares.iter().map(|s| format!("{s};\n")).collect()
}

/// A schema of this test's own, created, with the recipe run in it.
fn schema_with_recipe(pg: &Postgres, prefix: &str, extra: &str) -> String {
    let schema = unique(prefix).replace('-', "_");
    let script = format!(
        "CREATE SCHEMA {schema};\nSET search_path TO {schema};\n{}\n{extra}",
        guide_recipe()
    );
    let out = pg.psql(&["--quiet"], &script);
    assert!(
        out.status.success(),
        "the recipe failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    schema
}

/// Runs `script` in `schema` with the recipe's statements prepared; tuples only,
/// unaligned. Fails the test if psql fails.
fn run_in(pg: &Postgres, schema: &str, script: &str) -> Vec<String> {
    let recipe = guide_recipe();
    let full = format!(
        "SET search_path TO {schema};\n{}{script}",
        prepared_statements(&recipe)
    );
    let out = pg.psql(&["--quiet", "--tuples-only", "--no-align"], &full);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "psql failed ({}): {}\n{stdout}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// Acceptance: a stale fence's UPDATE changes 0 rows; equal and higher fences change
/// 1; the row keeps the highest fence; the first write creates the row; the upsert is
/// refused the same way; a fence of 2^64 − 1 fits.
#[test]
fn a_stale_fence_changes_no_row() {
    let pg = Postgres::shared();
    let schema = schema_with_recipe(pg, "fenced", "");
    let max = u64::MAX;
    #[rustfmt::skip]
    let steps: Vec<(String, &str, u32)> = vec![
        ("fenced_upsert(5, 'acct-1', 100)".into(), "the first write creates the row", 1),
        ("fenced_update(4, 'acct-1', 1)".into(), "a stale fence's update", 0),
        ("fenced_upsert(4, 'acct-1', 1)".into(), "a stale fence's upsert", 0),
        ("fenced_update(5, 'acct-1', 110)".into(), "the same fence again", 1),
        ("fenced_update(7, 'acct-1', 120)".into(), "a higher fence", 1),
        ("fenced_update(6, 'acct-1', 999)".into(), "a fence below the new one", 0),
        ("fenced_update(7, 'acct-2', 5)".into(), "an update of a row that does not exist", 0),
        (format!("fenced_upsert({max}, 'acct-3', 1)"), "the largest fence", 1),
        (format!("fenced_update({max}, 'acct-3', 2)"), "the largest fence again", 1),
        (format!("fenced_update({}, 'acct-3', 3)", max - 1), "one below the largest", 0),
    ];
    let mut script = String::new();
    for (i, (call, _, _)) in steps.iter().enumerate() {
        script.push_str(&format!("EXECUTE {call};\n\\echo step {i} :ROW_COUNT\n"));
    }
    script.push_str("SELECT id, balance, fence FROM ledger ORDER BY id;\n");
    let lines = run_in(pg, &schema, &script);

    let (echoes, rows): (Vec<&String>, Vec<&String>) =
        lines.iter().partition(|l| l.starts_with("step "));
    assert_eq!(echoes.len(), steps.len(), "{lines:?}");
    for (i, ((call, what, changed), echo)) in steps.iter().zip(&echoes).enumerate() {
        assert_eq!(
            echo.as_str(),
            format!("step {i} {changed}"),
            "{what}: EXECUTE {call} must change {changed} row(s)"
        );
    }
    assert_eq!(
        rows,
        [&"acct-1|120|7".to_string(), &format!("acct-3|2|{max}")],
        "each row keeps its highest fence and that fence's write"
    );
}

/// Eight writers with fences 1..8 update one row at once, 25 times each, each in its
/// own session: the stored fence never goes down (a trigger records every change),
/// only changes that happened are counted, and the highest fence's writes all land.
#[test]
fn racing_writers_never_lower_the_stored_fence() {
    const WRITERS: u64 = 8;
    const ROUNDS: u64 = 25;
    let pg = Postgres::shared();
    // Test instrumentation, not part of the recipe: every change of the row, recorded.
    let audit = "
        CREATE TABLE audit (seq bigserial PRIMARY KEY, old_fence numeric, new_fence numeric);
        CREATE FUNCTION audit_fence() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO audit (old_fence, new_fence) VALUES (OLD.fence, NEW.fence);
            RETURN NEW;
        END $$;
        CREATE TRIGGER audit_fence AFTER UPDATE ON ledger
            FOR EACH ROW EXECUTE FUNCTION audit_fence();
        INSERT INTO ledger (id, balance, fence) VALUES ('hot', 0, 0);
    ";
    let schema = schema_with_recipe(pg, "racing", audit);

    let changed: BTreeMap<u64, u64> = std::thread::scope(|scope| {
        let writers: Vec<_> = (1..=WRITERS)
            .map(|fence| {
                let schema = schema.clone();
                scope.spawn(move || {
                    let mut script = String::new();
                    for round in 0..ROUNDS {
                        let value = fence * 1000 + round;
                        script.push_str(&format!(
                            "EXECUTE fenced_update({fence}, 'hot', {value});\n\\echo :ROW_COUNT\n"
                        ));
                    }
                    let lines = run_in(pg, &schema, &script);
                    assert_eq!(lines.len() as u64, ROUNDS, "{lines:?}");
                    let landed = lines
                        .iter()
                        .map(|l| match l.as_str() {
                            "1" => 1,
                            "0" => 0,
                            other => panic!("a fenced update changed {other:?} rows"),
                        })
                        .sum::<u64>();
                    (fence, landed)
                })
            })
            .collect();
        writers.into_iter().map(|w| w.join().unwrap()).collect()
    });

    let summary = run_in(
        pg,
        &schema,
        "SELECT count(*) FILTER (WHERE new_fence < old_fence), count(*) FROM audit;\n\
         SELECT fence, balance FROM ledger WHERE id = 'hot';\n",
    );
    let landed: u64 = changed.values().sum();
    assert_eq!(
        summary[0],
        format!("0|{landed}"),
        "no change lowered the fence, and every change counted as 1 row happened \
         (landed per fence: {changed:?})"
    );
    assert_eq!(
        changed[&WRITERS], ROUNDS,
        "the highest fence is never refused: {changed:?}"
    );
    assert_eq!(
        summary[1],
        format!("{WRITERS}|{}", WRITERS * 1000 + ROUNDS - 1),
        "the row ends with the highest fence's last write"
    );
    eprintln!("fenced updates that landed, per fence: {changed:?}");
}

//! What the docs say about the CLI is what the code does: the exit-code tables of the
//! README and docs/architecture.md are `EXIT_CODES` row for row, `--help` prints every
//! row, and the architecture tree names every file of the engine and the stores.

use lockwarden::cli::EXIT_CODES;

use super::support;
use support::cli::BIN;

/// The rows `| code | meaning |` of the exit-code table that follows the line
/// containing `heading` in a Markdown file.
fn exit_code_rows(file: &str, heading: &str) -> Vec<(u8, String)> {
    let path = support::repo_root().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    let after = text
        .split_once(heading)
        .unwrap_or_else(|| panic!("{file} has no {heading:?}"))
        .1;
    let table = after
        .split_once("| code | meaning |")
        .unwrap_or_else(|| panic!("{file}: no exit-code table after {heading:?}"))
        .1;
    table
        .lines()
        .skip(2) // the rest of the header line, then |---|---|
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
            let [code, meaning] = cells[..] else {
                panic!("{file}: not a `| code | meaning |` row: {line:?}");
            };
            let code = code
                .trim()
                .parse()
                .unwrap_or_else(|e| panic!("{file}: code {code:?}: {e}"));
            (code, meaning.trim().to_string())
        })
        .collect()
}

#[test]
fn readme_and_architecture_list_the_exit_code_table_of_the_code() {
    let table: Vec<(u8, String)> = EXIT_CODES
        .iter()
        .map(|s| (s.code, s.meaning.to_string()))
        .collect();
    for (file, heading) in [
        ("README.md", "**Exit status**"),
        ("docs/architecture.md", "**Exit codes**"),
    ] {
        assert_eq!(
            exit_code_rows(file, heading),
            table,
            "{file}'s exit codes differ from cli::EXIT_CODES (src/cli/errors.rs)"
        );
    }
}

#[test]
fn help_prints_every_exit_code_of_the_table() {
    let out = std::process::Command::new(BIN)
        .arg("--help")
        .output()
        .expect("run --help");
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    // Wrapped to fit a terminal: compared word for word.
    let words = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
    let exit_status = words(
        help.split_once("Exit status:")
            .expect("an exit status table")
            .1,
    );
    for status in EXIT_CODES {
        let row = words(&format!("{} {}", status.code, status.meaning));
        assert!(exit_status.contains(&row), "--help lacks {row:?}:\n{help}");
    }
}

/// docs/architecture.md's tree names every source file of `src/lock/` and
/// `src/backend/` (where it lists files one by one).
#[test]
fn architecture_tree_names_every_file_of_the_engine_and_the_stores() {
    let root = support::repo_root();
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).expect("architecture.md");
    let tree = doc.split("```").nth(1).expect("the tree in a code block");
    let mut missing = Vec::new();
    for dir in ["src/lock", "src/backend", "src/backend/zookeeper"] {
        for entry in std::fs::read_dir(root.join(dir)).expect(dir) {
            let name = entry
                .expect("entry")
                .file_name()
                .into_string()
                .expect("UTF-8");
            if name.ends_with(".rs") && name != "mod.rs" && !tree.contains(&name) {
                missing.push(format!("{dir}/{name}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/architecture.md's tree lacks {missing:?}"
    );
}

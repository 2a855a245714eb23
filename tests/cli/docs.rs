//! What the docs say about the CLI is what the code does: the exit-code table is
//! written once in the docs, in the generated docs/reference/cli.md, and it is
//! `EXIT_CODES` row for row; `--help` prints every row; and the architecture tree names
//! every file of the engine and the stores.

use lockwarden::cli::EXIT_CODES;

use super::support;
use support::cli::bin;

/// The one page of the docs with the exit-code table (generated: scripts/gen-reference).
const EXIT_CODES_PAGE: &str = "docs/reference/cli.md";
const TABLE_HEADER: &str = "| code | meaning |";

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
        .split_once(TABLE_HEADER)
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
fn the_reference_lists_the_exit_code_table_of_the_code_and_no_other_page_copies_it() {
    let table: Vec<(u8, String)> = EXIT_CODES
        .iter()
        .map(|s| (s.code, s.meaning.to_string()))
        .collect();
    assert_eq!(
        exit_code_rows(EXIT_CODES_PAGE, "## Exit status"),
        table,
        "{EXIT_CODES_PAGE}'s exit codes differ from cli::EXIT_CODES (src/cli/errors.rs): \
         run scripts/gen-reference"
    );
    // Anywhere else a copy would drift: the README and docs link to the reference.
    let root = support::repo_root();
    let mut pages = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("docs/") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    let copies: Vec<String> = pages
        .iter()
        .filter(|p| !p.ends_with(EXIT_CODES_PAGE))
        .filter(|p| {
            std::fs::read_to_string(p)
                .expect("a page")
                .contains(TABLE_HEADER)
        })
        .map(|p| p.strip_prefix(&root).unwrap().display().to_string())
        .collect();
    assert!(
        copies.is_empty(),
        "{copies:?} copy the exit-code table: link to {EXIT_CODES_PAGE}#exit-status instead"
    );
}

#[test]
fn help_prints_every_exit_code_of_the_table() {
    let out = std::process::Command::new(bin())
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

/// docs/architecture.md's tree names every source file of the engine, the stores and
/// the API crate (where it lists files one by one).
#[test]
fn architecture_tree_names_every_file_of_the_engine_and_the_stores() {
    let root = support::repo_root();
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).expect("architecture.md");
    let tree = doc.split("```").nth(1).expect("the tree in a code block");
    let mut missing = Vec::new();
    for dir in [
        "crates/core/src",
        "crates/stores/src",
        "crates/stores/src/zookeeper",
        "crates/api/src",
    ] {
        for entry in std::fs::read_dir(root.join(dir)).expect(dir) {
            let name = entry
                .expect("entry")
                .file_name()
                .into_string()
                .expect("UTF-8");
            if name.ends_with(".rs")
                && !matches!(name.as_str(), "mod.rs" | "lib.rs")
                && !tree.contains(&name)
            {
                missing.push(format!("{dir}/{name}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/architecture.md's tree lacks {missing:?}"
    );
}

//! The README and the user guide as files (no server): every fenced code block is
//! accounted for, the README stays short, and every relative link resolves.
//!
//! A block is accounted for by a comment on the line before it (docs/README.md,
//! "Every example runs"):
//!
//! - `<!-- runs: TEST -->`: TEST reads the block from the Markdown and runs it; TEST
//!   must exist and name the page (tests/cli/docs_examples.rs, tests/fenced_sql.rs,
//!   tests/readme_example.rs);
//! - `<!-- same-as: examples/FILE -->`: the block is FILE, whole or after its opening
//!   comment, and FILE is one the examples tests apply (tests/jobs.rs, tests/kueue,
//!   tests/terraform.rs);
//! - `<!-- not-run: REASON -->`: not runnable here, and why.
//!
//! `cargo test --test cli docs_markdown -- --nocapture` prints every block with its
//! mark, and the unmarked blocks of the maintainers' docs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::support;

/// How a block is accounted for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mark {
    Runs(String),
    SameAs(String),
    NotRun(String),
}

/// A fenced code block of a Markdown file.
#[derive(Clone, Debug)]
pub struct Block {
    /// The file, relative to the repository (`docs/guide/cli.md`).
    pub file: String,
    /// The line of its opening fence, from 1.
    pub line: usize,
    /// The info string after the fence (`sh`, `yaml`, or empty).
    pub lang: String,
    /// Its lines, each ending in a newline.
    pub text: String,
    /// The comment on the line before it: `Ok(None)` without one, `Err` for a comment
    /// that looks like a mark but is not one.
    pub mark: Result<Option<Mark>, String>,
}

impl Block {
    pub fn place(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

/// The pages whose blocks must all be accounted for: README.md and docs/guide/*.md.
pub fn user_pages() -> Vec<String> {
    let mut pages = vec!["README.md".to_string()];
    pages.extend(markdown_under("docs/guide"));
    pages
}

/// The `.md` files under `dir` (relative to the repository), recursively, sorted.
fn markdown_under(dir: &str) -> Vec<String> {
    let root = support::repo_root();
    let mut found = Vec::new();
    let mut stack = vec![root.join(dir)];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                let rel = path.strip_prefix(&root).expect("under the repository");
                found.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    found.sort();
    found
}

fn read(file: &str) -> String {
    std::fs::read_to_string(support::repo_root().join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// The mark a comment line gives, if it is one.
fn parse_mark(line: &str) -> Result<Option<Mark>, String> {
    let Some(inner) = line
        .trim()
        .strip_prefix("<!--")
        .and_then(|l| l.strip_suffix("-->"))
    else {
        return Ok(None);
    };
    let inner = inner.trim();
    let Some((kind, value)) = inner.split_once(':') else {
        return Ok(None); // an ordinary comment
    };
    let value = value.trim().to_string();
    let mark = match kind.trim() {
        "runs" => Mark::Runs(value.clone()),
        "same-as" => Mark::SameAs(value.clone()),
        "not-run" => Mark::NotRun(value.clone()),
        _ => return Ok(None),
    };
    if value.is_empty() {
        return Err(format!("{line:?}: a mark needs a value after the colon"));
    }
    Ok(Some(mark))
}

/// Every fenced code block of `file`, in order. An unclosed block is an error.
pub fn blocks(file: &str) -> Vec<Block> {
    let text = read(file);
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if let Some(info) = line.strip_prefix("```") {
            let start = i;
            let mut body = String::new();
            i += 1;
            while i < lines.len() && lines[i].trim_end() != "```" {
                body.push_str(lines[i]);
                body.push('\n');
                i += 1;
            }
            assert!(
                i < lines.len(),
                "{file}:{}: a code block that is never closed",
                start + 1
            );
            let mark = match start.checked_sub(1) {
                Some(prev) => parse_mark(lines[prev]),
                None => Ok(None),
            };
            found.push(Block {
                file: file.to_string(),
                line: start + 1,
                lang: info.trim().to_string(),
                text: body,
                mark,
            });
        }
        i += 1;
    }
    found
}

/// The text of examples/FILE after its opening `#` comment lines.
fn without_opening_comment(text: &str) -> String {
    text.lines()
        .skip_while(|l| l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// What is wrong with `block`'s mark, if anything.
fn check(block: &Block) -> Result<String, String> {
    let root = support::repo_root();
    match &block.mark {
        Err(e) => Err(e.clone()),
        Ok(None) => Err(
            "no mark: put `<!-- runs: TEST -->`, `<!-- same-as: examples/FILE -->` \
                         or `<!-- not-run: REASON -->` on the line before it"
                .to_string(),
        ),
        Ok(Some(Mark::NotRun(reason))) => Ok(format!("not run: {reason}")),
        Ok(Some(Mark::Runs(test))) => {
            let path = root.join(test);
            let source =
                std::fs::read_to_string(&path).map_err(|e| format!("runs: {test}: {e}"))?;
            if !source.contains(&block.file) {
                return Err(format!(
                    "runs: {test} does not name {} (the page it should read the block from)",
                    block.file
                ));
            }
            if test == "tests/cli/docs_examples.rs" && block.lang != "sh" {
                return Err(format!(
                    "runs: {test} runs `sh` blocks, this one is `{}`",
                    block.lang
                ));
            }
            Ok(format!("runs: {test}"))
        }
        Ok(Some(Mark::SameAs(example))) => {
            let Some(name) = example.strip_prefix("examples/") else {
                return Err(format!("same-as: {example} is not under examples/"));
            };
            let text = std::fs::read_to_string(root.join(example))
                .map_err(|e| format!("same-as: {example}: {e}"))?;
            if block.text != text && block.text != without_opening_comment(&text) {
                return Err(format!(
                    "same-as: the block differs from {example} (whole, or after its opening \
                     comment); copy it from there:\n{}",
                    without_opening_comment(&text)
                ));
            }
            // The tests that apply examples/: tests/kueue every kueue-*.yaml, tests/jobs.rs
            // every other one (each reads the directory and fails on a file it has no
            // check for).
            let (test, needle) = if name.starts_with("kueue-") {
                ("tests/kueue/examples.rs", "examples/kueue-*.yaml")
            } else if name.starts_with("terraform-") {
                ("tests/terraform.rs", "examples/terraform-job.yaml")
            } else {
                (
                    "tests/jobs.rs",
                    "every_example_reaches_the_state_its_comment_promises",
                )
            };
            let source = std::fs::read_to_string(root.join(test)).expect(test);
            if !source.contains(needle) {
                return Err(format!(
                    "same-as: {test} no longer applies examples/ ({needle})"
                ));
            }
            Ok(format!("same as {example}, applied by {test}"))
        }
    }
}

#[test]
fn every_code_block_of_the_readme_and_the_guide_is_run_or_says_why_not() {
    let mut problems = Vec::new();
    let (mut runs, mut same, mut not_run) = (0, 0, 0);
    for page in user_pages() {
        let blocks = blocks(&page);
        assert!(
            page == "README.md" || !blocks.is_empty(),
            "{page}: a guide page opens with an example"
        );
        for block in blocks {
            match check(&block) {
                Ok(status) => {
                    match block.mark {
                        Ok(Some(Mark::Runs(_))) => runs += 1,
                        Ok(Some(Mark::SameAs(_))) => same += 1,
                        _ => not_run += 1,
                    }
                    println!("{} ```{}: {status}", block.place(), block.lang);
                }
                Err(problem) => {
                    println!(
                        "{} ```{}: UNACCOUNTED: {problem}",
                        block.place(),
                        block.lang
                    );
                    problems.push(format!("{}: {problem}", block.place()));
                }
            }
        }
    }
    println!("{runs} run by a test, {same} the same as an applied example, {not_run} not run");
    // The maintainers' docs: listed, not run.
    for page in markdown_under("docs") {
        if page.starts_with("docs/guide/") || page.starts_with("docs/reference/") {
            continue;
        }
        let blocks = blocks(&page);
        if !blocks.is_empty() {
            let langs: Vec<String> = blocks
                .iter()
                .map(|b| format!("{}:```{}", b.line, b.lang))
                .collect();
            println!("{page} (maintainers', not run): {}", langs.join(" "));
        }
    }
    assert!(
        problems.is_empty(),
        "code blocks not accounted for:\n{}",
        problems.join("\n")
    );
    assert!(
        runs >= 10,
        "only {runs} blocks are run: the marks are not being read"
    );
}

/// The README a newcomer reads in ten minutes (issue 46).
const README_MAX_LINES: usize = 350;

#[test]
fn the_readme_is_at_most_350_lines() {
    let lines = read("README.md").lines().count();
    println!("README.md: {lines} lines");
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move the detail to a page \
         of docs/guide/ and link it"
    );
}

/// The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut inside = false;
    let mut found = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            inside = !inside;
        } else if !inside && line.starts_with('#') {
            let heading = line.trim_start_matches('#');
            let base = anchor(&heading.replace('`', ""));
            // A repeated heading gets -1, -2, …
            let mut name = base.clone();
            let mut n = 0;
            while !found.insert(name.clone()) {
                n += 1;
                name = format!("{base}-{n}");
            }
        }
    }
    found
}

/// The targets of the Markdown links `[text](target)` of `text`, outside code blocks
/// and code spans, with their line numbers.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut inside = false;
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.starts_with("```") {
            inside = !inside;
            continue;
        }
        if inside {
            continue;
        }
        // Code spans hold no links.
        let prose: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, part)| part)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            found.push((n + 1, after[..end].trim().to_string()));
            rest = &after[end..];
        }
    }
    found
}

#[test]
fn every_relative_link_of_the_readme_and_docs_resolves() {
    let root = support::repo_root();
    let mut pages = vec!["README.md".to_string()];
    pages.extend(markdown_under("docs"));
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = read(page);
        let dir = Path::new(page).parent().unwrap_or(Path::new(""));
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, fragment) = match target.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (target.as_str(), None),
            };
            let file: PathBuf = if path.is_empty() {
                PathBuf::from(page)
            } else {
                dir.join(path)
            };
            let full = root.join(&file);
            if !full.exists() {
                broken.push(format!(
                    "{page}:{line}: {target}: {} does not exist",
                    file.display()
                ));
                continue;
            }
            if let Some(fragment) = fragment
                && full.extension().is_some_and(|e| e == "md")
            {
                let target_text = std::fs::read_to_string(&full).expect("a Markdown file");
                if !anchors(&target_text).contains(fragment) {
                    broken.push(format!(
                        "{page}:{line}: {target}: {} has no heading #{fragment}",
                        file.display()
                    ));
                }
            }
        }
    }
    println!("{checked} relative links in {} files", pages.len());
    assert!(
        checked > 50,
        "only {checked} links found: the scan is broken"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn marks_and_anchors_are_read_as_documented() {
    assert_eq!(
        parse_mark("<!-- runs: tests/fenced_sql.rs -->"),
        Ok(Some(Mark::Runs("tests/fenced_sql.rs".into())))
    );
    assert_eq!(
        parse_mark("<!-- not-run: needs a registry -->"),
        Ok(Some(Mark::NotRun("needs a registry".into())))
    );
    assert_eq!(parse_mark("<!-- an ordinary comment -->"), Ok(None));
    assert!(parse_mark("<!-- same-as: -->").is_err());
    assert_eq!(
        anchor("6.3 The work stops before the next holder"),
        "63-the-work-stops-before-the-next-holder"
    );
    assert_eq!(
        anchor("Fault-injection harness (issue 8)"),
        "fault-injection-harness-issue-8"
    );
    assert_eq!(
        links("see [a](x.md#b) and `[c](not-a-link)` [d](https://e)"),
        vec![(1, "x.md#b".to_string()), (1, "https://e".to_string())]
    );
}

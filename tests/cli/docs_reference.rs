//! The generated references are what the code generates now:
//!
//! - docs/reference/cli.md is `lockwarden reference-cli` (the clap definitions through
//!   clap-markdown, and the exit-code table of `cli::EXIT_CODES`);
//! - docs/reference/crds.md is generated here from the CRD schemas in crds/ (which
//!   tests/crd keeps equal to the Rust types).
//!
//! A file that differs fails its test, naming `scripts/gen-reference`, which runs these
//! tests with `LOCKWARDEN_REGENERATE=1` so that they write the files instead. And the
//! Markdown agrees with `--help`: every flag `lockwarden COMMAND --help` (and `kubectl
//! lockwarden COMMAND --help`) prints is in that command's section, and the reverse.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::support;
use support::cli::bin;

const REGENERATE: &str = "scripts/gen-reference";

/// Compares `generated` with the file at `rel`, or writes it with
/// `LOCKWARDEN_REGENERATE=1`.
fn up_to_date(rel: &str, generated: &str) {
    let path = support::repo_root().join(rel);
    if std::env::var_os("LOCKWARDEN_REGENERATE").is_some() {
        std::fs::create_dir_all(path.parent().expect("a directory")).expect("mkdir");
        std::fs::write(&path, generated).unwrap_or_else(|e| panic!("write {rel}: {e}"));
        println!("wrote {rel}");
        return;
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current != generated {
        let first = current
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(current.lines().count().min(generated.lines().count()));
        panic!(
            "{rel} differs from what the code generates now (first at line {}: {:?} instead \
             of {:?}); run `{REGENERATE}` and commit the result",
            first + 1,
            current.lines().nth(first).unwrap_or("<end of file>"),
            generated.lines().nth(first).unwrap_or("<end of file>"),
        );
    }
}

fn run(program: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new(program)
        .args(args)
        .env_remove("LOCKWARDEN_LOG")
        .output()
        .unwrap_or_else(|e| panic!("run {} {args:?}: {e}", program.display()));
    assert!(
        out.status.success(),
        "{} {args:?}: {}\n{}",
        program.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

fn cli_reference() -> String {
    run(Path::new(bin()), &["reference-cli"])
}

#[test]
fn docs_reference_cli_md_is_what_the_clap_definitions_generate() {
    up_to_date("docs/reference/cli.md", &cli_reference());
}

#[test]
fn docs_reference_crds_md_is_what_the_crd_schemas_generate() {
    up_to_date(
        "docs/reference/crds.md",
        &crd_reference(&support::repo_root().join("crds")),
    );
}

/// The long flags (`--name`) a text mentions.
fn long_flags(text: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    let bytes = text.as_bytes();
    for (at, _) in text.match_indices("--") {
        let before = at.checked_sub(1).map(|i| bytes[i]);
        if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'-') {
            continue;
        }
        let name: String = text[at + 2..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if name.len() > 1 && name.chars().next().is_some_and(|c| c.is_ascii_lowercase()) {
            flags.insert(format!("--{}", name.trim_end_matches('-')));
        }
    }
    flags
}

/// The flags a command's `--help` lists as its options: the lines that start with a
/// flag (`  -o, --output <FILE>`, `      --force`).
fn option_lines(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter_map(|line| {
            // clap's option lines: `  -o, --output <FILE>` or `      --force`; a
            // description wrapped onto a line of its own is indented further.
            let indent = line.len() - line.trim_start().len();
            let line = line.trim_start();
            if !(indent == 2 && line.starts_with('-') || indent == 6 && line.starts_with("--")) {
                return None;
            }
            let line = match line.strip_prefix('-') {
                Some(rest) if !rest.starts_with('-') => rest.split_once(", ").map(|(_, l)| l)?,
                _ => line,
            };
            let name: String = line
                .strip_prefix("--")?
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            Some(format!("--{name}"))
        })
        .collect()
}

/// The sections of a clap-markdown document: (`lockwarden lock`, its text up to the
/// next command's heading).
fn command_sections(markdown: &str) -> Vec<(String, String)> {
    let mut sections = Vec::new();
    for part in markdown
        .split("\n## `")
        .skip(1)
        .chain(markdown.split("\n### `").skip(1))
    {
        let Some((name, rest)) = part.split_once('`') else {
            continue;
        };
        let body = rest
            .split("\n## ")
            .next()
            .unwrap_or(rest)
            .split("\n### ")
            .next()
            .unwrap_or(rest);
        sections.push((name.to_string(), body.to_string()));
    }
    sections
}

/// The options of a clap-markdown section (its `###### **Options:**` list).
fn section_options(section: &str) -> BTreeSet<String> {
    section
        .lines()
        .filter_map(|line| {
            // `* `-o`, `--output <FILE>` — what it does`: the flag before the dash.
            let item = line.strip_prefix("* `")?.split(" — ").next()?;
            let flag = item
                .split(['`', ' ', '='])
                .find(|w| w.starts_with("--") && w.len() > 2)?;
            Some(flag.to_string())
        })
        .collect()
}

#[test]
fn every_flag_of_help_is_in_the_reference_and_the_reverse() {
    let reference = std::fs::read_to_string(support::repo_root().join("docs/reference/cli.md"))
        .expect("docs/reference/cli.md (scripts/gen-reference writes it)");
    let sections = command_sections(&reference);
    let plugins = support::kubectl::plugin_dir();
    let plugin = plugins.path().join("kubectl-lockwarden");
    let mut checked = Vec::new();
    for (name, section) in &sections {
        let (program, root, args): (&Path, &str, Vec<&str>) =
            if let Some(rest) = name.strip_prefix("kubectl lockwarden") {
                (
                    &plugin,
                    "kubectl lockwarden",
                    rest.split_whitespace().collect(),
                )
            } else if let Some(rest) = name.strip_prefix("lockwarden") {
                (
                    Path::new(bin()),
                    "lockwarden",
                    rest.split_whitespace().collect(),
                )
            } else {
                panic!("docs/reference/cli.md: a section for an unknown program: {name:?}")
            };
        let mut help_args = args.clone();
        help_args.push("--help");
        let help = run(program, &help_args);
        let mut in_help = option_lines(&help);
        in_help.remove("--help");
        in_help.remove("--version");
        let in_reference = section_options(section);
        // The program's global options are written once, in its own section.
        let (_, root_section) = sections
            .iter()
            .find(|(n, _)| n == root)
            .unwrap_or_else(|| panic!("docs/reference/cli.md has no section `{root}`"));
        let inherited = section_options(root_section);
        let missing: Vec<&String> = in_help
            .iter()
            .filter(|f| !in_reference.contains(*f) && !inherited.contains(*f))
            .collect();
        let stale: Vec<&String> = in_reference.difference(&in_help).collect();
        assert!(
            missing.is_empty() && stale.is_empty(),
            "`{name} --help` and its section of docs/reference/cli.md differ: {missing:?} \
             only in --help, {stale:?} only in the Markdown (run `{REGENERATE}`):\n{help}"
        );
        checked.push(format!("{name} ({} flags)", in_help.len()));
    }
    println!("checked {}: {checked:?}", checked.len());
    for command in [
        "lock",
        "unlock",
        "run",
        "guard",
        "status",
        "put",
        "get",
        "delete",
        "check-fence",
        "controller",
        "completions",
        "crd",
        "install",
    ] {
        assert!(
            sections
                .iter()
                .any(|(name, _)| name == &format!("lockwarden {command}")),
            "docs/reference/cli.md has no section for `lockwarden {command}`"
        );
    }
    assert!(
        sections
            .iter()
            .any(|(name, _)| name == "kubectl lockwarden why"),
        "docs/reference/cli.md has no section for the kubectl plugin"
    );
    assert!(
        !sections
            .iter()
            .any(|(name, _)| name.contains("reference-cli")),
        "reference-cli, not a subcommand, is not documented"
    );
    // Flags the guide pages name are flags of some command.
    let all: BTreeSet<String> = sections
        .iter()
        .flat_map(|(_, s)| section_options(s))
        .chain(["--help", "--version"].map(String::from))
        .collect();
    let cli_page = std::fs::read_to_string(support::repo_root().join("docs/guide/cli.md"))
        .expect("docs/guide/cli.md");
    let unknown: Vec<String> = long_flags(&cli_page)
        .into_iter()
        .filter(|f| !all.contains(f))
        .collect();
    assert!(
        unknown.is_empty(),
        "docs/guide/cli.md names flags no command has: {unknown:?}"
    );
}

// ---------------------------------------------------------------------------
// The CRD reference

/// One line of Markdown table cell text: whitespace collapsed, `|` escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

fn field<'a>(value: &'a Value, key: &str, what: &str) -> &'a Value {
    value
        .get(key)
        .unwrap_or_else(|| panic!("{what}: no `{key}`"))
}

fn text_of<'a>(value: &'a Value, key: &str, what: &str) -> &'a str {
    field(value, key, what)
        .as_str()
        .unwrap_or_else(|| panic!("{what}: `{key}` is not a string"))
}

/// A schema's type as the reference writes it.
fn type_of(schema: &Value, what: &str) -> String {
    let mut kind = if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        "integer or string".to_string()
    } else {
        match schema.get("type").and_then(Value::as_str) {
            Some("array") => {
                let items = field(schema, "items", what);
                format!("array of {}", type_of(items, &format!("{what}[]")))
            }
            Some("object") if schema.get("additionalProperties").is_some() => {
                let values = &schema["additionalProperties"];
                if values.is_object() {
                    format!("map of {}", type_of(values, &format!("{what}{{}}")))
                } else {
                    "map".to_string()
                }
            }
            Some(kind) => kind.to_string(),
            None if schema.get("x-kubernetes-preserve-unknown-fields").is_some() => {
                "any".to_string()
            }
            None => panic!("{what}: a schema without a type"),
        }
    };
    if let Some(format) = schema.get("format").and_then(Value::as_str) {
        let _ = write!(kind, " ({format})");
    }
    if schema.get("nullable") == Some(&Value::Bool(true)) {
        kind.push_str(", nullable");
    }
    kind
}

/// The limits, default and enum of a schema, as one cell.
fn constraints(schema: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = values.iter().map(|v| format!("`{}`", plain(v))).collect();
        parts.push(format!("one of {}", values.join(", ")));
    }
    for (key, name) in [
        ("default", "default"),
        ("minimum", "minimum"),
        ("maximum", "maximum"),
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
    ] {
        if let Some(value) = schema.get(key) {
            parts.push(format!("{name} `{}`", plain(value)));
        }
    }
    if let Some(rules) = schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    {
        for rule in rules {
            if let Some(message) = rule.get("message").and_then(Value::as_str) {
                parts.push(format!("checked: {message}"));
            }
        }
    }
    cell(&parts.join("; "))
}

fn plain(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The rows `| field | type | required | description | constraints |` of `schema`'s
/// properties, depth first, each path below `prefix`.
fn field_rows(schema: &Value, prefix: &str, rows: &mut Vec<String>) {
    let schema = match schema.get("type").and_then(Value::as_str) {
        Some("array") => field(schema, "items", prefix),
        _ => schema,
    };
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    let required: BTreeSet<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    // In the order serde_json keeps: sorted, as `lockwarden crd` writes them.
    for (name, property) in properties {
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        let description = property
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or("");
        rows.push(format!(
            "| `{path}` | {} | {} | {} | {} |",
            cell(&type_of(property, &path)),
            if required.contains(name.as_str()) {
                "yes"
            } else {
                ""
            },
            cell(description),
            constraints(property),
        ));
        let below = if property.get("type").and_then(Value::as_str) == Some("array") {
            format!("{path}[]")
        } else {
            path
        };
        field_rows(property, &below, rows);
    }
}

/// docs/reference/crds.md from every `*.yaml` CRD in `dir`.
fn crd_reference(dir: &Path) -> String {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{}: no CRD files", dir.display());
    let mut out = String::from(
        "<!-- Generated by scripts/gen-reference from the CRD schemas in crds/; do not edit. -->\n\n\
         # CRD reference\n\n\
         Every field of lockwarden's CustomResourceDefinitions, from their OpenAPI schemas \
         (`crds/`, which `lockwarden crd` prints and the chart installs). \"checked\" are \
         the rules the API server evaluates at admission.\n",
    );
    for file in &files {
        let name = file
            .file_name()
            .expect("a file name")
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{name}: {e}"));
        let crd: Value = serde_yaml_ng::from_str(&text)
            .unwrap_or_else(|e| panic!("crds/{name} is not YAML: {e}"));
        let what = format!("crds/{name}");
        if text_of(&crd, "kind", &what) != "CustomResourceDefinition" {
            panic!("{what}: not a CustomResourceDefinition");
        }
        let spec = field(&crd, "spec", &what);
        let names = field(spec, "names", &what);
        let kind = text_of(names, "kind", &what);
        let group = text_of(spec, "group", &what);
        let plural = text_of(names, "plural", &what);
        let _ = write!(out, "\n## {kind}\n\n");
        let short: Vec<String> = names
            .get("shortNames")
            .and_then(Value::as_array)
            .map(|s| s.iter().map(|n| format!("`{}`", plain(n))).collect())
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "`{plural}.{group}`, {} ({}){}.",
            text_of(spec, "scope", &what).to_lowercase(),
            format_args!("`crds/{name}`"),
            if short.is_empty() {
                String::new()
            } else {
                format!("; short names {}", short.join(", "))
            }
        );
        let versions = field(spec, "versions", &what)
            .as_array()
            .unwrap_or_else(|| panic!("{what}: spec.versions is not a list"));
        for version in versions {
            let version_name = text_of(version, "name", &what);
            let vwhat = format!("{what} version {version_name}");
            let schema = field(field(version, "schema", &vwhat), "openAPIV3Schema", &vwhat);
            let _ = write!(
                out,
                "\n### {kind} {group}/{version_name}\n\n{}\n",
                cell(
                    schema
                        .get("description")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                )
            );
            if let Some(columns) = version
                .get("additionalPrinterColumns")
                .and_then(Value::as_array)
            {
                out.push_str("\n`kubectl get` columns:\n\n| column | JSON path | type | description |\n|---|---|---|---|\n");
                for column in columns {
                    let _ = writeln!(
                        out,
                        "| {} | `{}` | {} | {} |",
                        cell(text_of(column, "name", &vwhat)),
                        text_of(column, "jsonPath", &vwhat),
                        text_of(column, "type", &vwhat),
                        cell(
                            column
                                .get("description")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                        ),
                    );
                }
            }
            let properties = field(schema, "properties", &vwhat)
                .as_object()
                .unwrap_or_else(|| panic!("{vwhat}: properties is not a map"));
            for part in ["spec", "status"] {
                let Some(part_schema) = properties.get(part) else {
                    continue;
                };
                let mut rows = Vec::new();
                field_rows(part_schema, part, &mut rows);
                let _ = write!(
                    out,
                    "\n#### {kind} `{part}`\n\n{}\n\n| field | type | required | description | constraints |\n|---|---|---|---|---|\n",
                    cell(
                        part_schema
                            .get("description")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                    )
                );
                for row in rows {
                    out.push_str(&row);
                    out.push('\n');
                }
            }
        }
    }
    out
}

#[test]
fn the_crd_generator_names_what_is_wrong_with_its_input() {
    let dir = tempfile::tempdir().expect("a temp dir");
    std::fs::write(dir.path().join("x.yaml"), "kind: ConfigMap\n").unwrap();
    let err = std::panic::catch_unwind(|| crd_reference(dir.path())).expect_err("refused");
    let message = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains("crds/x.yaml: not a CustomResourceDefinition"),
        "{message}"
    );
    std::fs::write(
        dir.path().join("x.yaml"),
        "kind: CustomResourceDefinition\nspec: {group: g, scope: Namespaced, names: {kind: K, plural: ks}, versions: [{name: v1}]}\n",
    )
    .unwrap();
    let err = std::panic::catch_unwind(|| crd_reference(dir.path())).expect_err("refused");
    let message = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("version v1: no `schema`"), "{message}");
    assert_eq!(
        long_flags("use --wait 5 or --lease=1h, not ---x or a--b"),
        BTreeSet::from(["--lease".to_string(), "--wait".to_string()])
    );
}

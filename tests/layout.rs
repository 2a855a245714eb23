//! The source layout's rules, checked over every crate's `src/` as text (no server, no
//! build of its own). The layers are crates (docs/architecture.md): the compiler
//! refuses a lower one naming a higher one, and [`the_crates_depend_downward_only`]
//! keeps the manifests so. Inside each crate, the file-level graph of `crate::`,
//! `super::` and child-module paths has no cycle spanning two folders, so each folder
//! (`controller/gating/`, `stores/zookeeper/`, …) depends on the others in one
//! direction only. A cycle inside one folder (a module and its children) is a module's
//! own business and allowed.
//!
//! Stores are named in one registry: outside their own folders (`crates/stores/src/
//! <store>/`, `crates/api/src/stores/<store>.rs`), only the stores' registry and the
//! API's composition of their specs (`backend_spec.rs`, `store_spec.rs`) name a
//! store's variant of the registry's enums or a store's URL scheme.
//!
//! `cargo test --test layout -- --nocapture` prints the graph's size and the files
//! naming stores and, on failure, each cycle with the paths that close it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The workspace's crates, lowest layer first: (short name, `src/` directory, package).
const CRATES: [(&str, &str, &str); 5] = [
    ("core", "crates/core/src", "lockwarden-core"),
    ("stores", "crates/stores/src", "lockwarden-stores"),
    ("api", "crates/api/src", "lockwarden-api"),
    (
        "controller",
        "crates/controller/src",
        "lockwarden-controller",
    ),
    ("lockwarden", "src", "lockwarden"),
];

/// A crate's file and the module path it defines, the crate's short name first
/// (`["controller", "gating"]`).
struct SourceFile {
    path: PathBuf,
    module: Vec<String>,
    text: String,
}

fn sources() -> Vec<SourceFile> {
    let mut files = Vec::new();
    for (name, dir, _) in CRATES {
        let root = lockwarden_testsupport::repo_root().join(dir);
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("src dir") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let rel = path.strip_prefix(&root).expect("under src");
                    // main.rs is the binary's crate: it reaches the library as
                    // `lockwarden::`.
                    if rel == Path::new("main.rs") {
                        continue;
                    }
                    let mut module: Vec<String> = vec![name.to_string()];
                    module.extend(
                        rel.with_extension("")
                            .components()
                            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
                    );
                    if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
                        module.pop();
                    }
                    let text = strip_comments(&std::fs::read_to_string(&path).expect("read"));
                    files.push(SourceFile { path, module, text });
                }
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files
}

/// The text without `//` comments and string literals (a URL in a string is no path).
fn strip_comments(text: &str) -> String {
    strip(text, false)
}

/// The text without `//` comments, or also without the contents of string literals.
fn strip(text: &str, keep_strings: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_string = false;
        let mut prev = ' ';
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if in_string {
                if c == '"' && prev != '\\' {
                    in_string = false;
                }
                if keep_strings {
                    out.push(c);
                }
                prev = if prev == '\\' && c == '\\' { ' ' } else { c };
                continue;
            }
            match c {
                '"' => {
                    in_string = true;
                    if keep_strings {
                        out.push(c);
                    }
                }
                '/' if chars.peek() == Some(&'/') => break,
                _ => out.push(c),
            }
            prev = c;
        }
        out.push('\n');
    }
    out
}

/// Every path the file names: `crate::a::b`, `super::x`, `child::y`, with `use`
/// groups (`use crate::a::{b, c::d}`) expanded, each as module segments from the crate
/// root.
fn paths_named(file: &SourceFile, children: &BTreeSet<String>) -> Vec<Vec<String>> {
    // An inline module (`mod tests { … }`) is a module of its own: `super::` there is
    // the file's module. Its text is looked at as such, and left out of the file's.
    let mut found = Vec::new();
    let mut outer = file.text.clone();
    while let Some((whole, start, name, end)) = inline_module(&outer) {
        let mut module = file.module.clone();
        module.push(name);
        let inner = SourceFile {
            path: file.path.clone(),
            module,
            text: outer[start..end].to_string(),
        };
        found.extend(paths_named(&inner, &BTreeSet::new()));
        outer.replace_range(whole..=end, "");
    }
    let file = &SourceFile {
        path: file.path.clone(),
        module: file.module.clone(),
        text: outer,
    };
    for statement in file.text.split(';') {
        let statement = statement.trim();
        if let Some(tree) = statement
            .strip_prefix("pub use ")
            .or_else(|| statement.strip_prefix("pub(crate) use "))
            .or_else(|| statement.strip_prefix("pub(super) use "))
            .or_else(|| statement.strip_prefix("use "))
        {
            for path in expand(tree.trim()) {
                found.extend(resolve(file, children, &path));
            }
        }
    }
    // Paths in expressions and types: `crate::x::y(…)`, `super::z::W`.
    let bytes = file.text.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < bytes.len() {
        if is_ident(bytes[i]) && (i == 0 || !(is_ident(bytes[i - 1]) || bytes[i - 1] == b':')) {
            let start = i;
            while i < bytes.len() && (is_ident(bytes[i]) || bytes[i] == b':') {
                i += 1;
            }
            let token = &file.text[start..i];
            // `crate::{a, b}` (a use group) names a and b, which the `use` pass above
            // found; the bare `crate::` before its brace is no path of its own.
            if token.contains("::") && !token.ends_with("::") {
                let segments: Vec<String> = token
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect();
                found.extend(resolve(file, children, &segments));
            }
        } else {
            i += 1;
        }
    }
    found
}

/// The first inline module of `text`: where `mod` is, where its body starts, its name,
/// and where its closing brace is.
fn inline_module(text: &str) -> Option<(usize, usize, String, usize)> {
    let mut search = 0;
    while let Some(at) = text[search..].find("mod ") {
        let at = search + at;
        search = at + 4;
        let preceded = at == 0 || !text.as_bytes()[at - 1].is_ascii_alphanumeric();
        let rest = &text[at + 4..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let after = rest[name.len()..].trim_start();
        if !preceded || name.is_empty() || !after.starts_with('{') {
            continue;
        }
        let open = at + 4 + rest.find('{')?;
        let mut depth = 0;
        for (i, c) in text[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some((at, open + 1, name, open + i));
                    }
                }
                _ => {}
            }
        }
        return None;
    }
    None
}

/// `a::{b, c::{d, e}}` → `[a, b]`, `[a, c, d]`, `[a, c, e]`.
fn expand(tree: &str) -> Vec<Vec<String>> {
    let tree: String = tree
        .chars()
        .map(|c| if c.is_whitespace() { ' ' } else { c })
        .collect();
    let mut out = Vec::new();
    expand_into(&tree, &mut Vec::new(), &mut out);
    out
}

fn expand_into(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let Some(open) = tree.find('{') else {
        let mut path = prefix.clone();
        // `x as y` names x.
        let tree = tree.split_whitespace().next().unwrap_or_default();
        path.extend(
            tree.split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string),
        );
        out.push(path);
        return;
    };
    let head: Vec<String> = tree[..open]
        .split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let depth = prefix.len();
    prefix.extend(head);
    let mut level = 0;
    let mut start = 0;
    for (i, c) in inner.char_indices() {
        match c {
            '{' => level += 1,
            '}' => level -= 1,
            ',' if level == 0 => {
                expand_into(&inner[start..i], prefix, out);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < inner.len() {
        expand_into(&inner[start..], prefix, out);
    }
    prefix.truncate(depth);
}

/// A path as module segments from the crate root, or `None` if it is not ours.
fn resolve(file: &SourceFile, children: &BTreeSet<String>, path: &[String]) -> Option<Vec<String>> {
    let first = path.first()?;
    let mut module = match first.as_str() {
        "crate" => file.module[..1].to_vec(),
        "self" => file.module.clone(),
        "super" => {
            let mut module = file.module.clone();
            let mut rest = path;
            while rest.first().map(String::as_str) == Some("super") {
                module.pop()?;
                rest = &rest[1..];
            }
            module.extend(rest.iter().cloned());
            return Some(module);
        }
        child if children.contains(child) => {
            let mut module = file.module.clone();
            module.push(child.to_string());
            module.extend(path[1..].iter().cloned());
            return Some(module);
        }
        _ => return None,
    };
    module.extend(path[1..].iter().cloned());
    Some(module)
}

/// The child modules a file declares (`mod x;`, `pub mod y;`).
fn declared_children(file: &SourceFile) -> BTreeSet<String> {
    file.text
        .split(';')
        .filter_map(|s| {
            let s = s.trim();
            let s = s.rsplit('\n').next().unwrap_or(s).trim();
            let s = s.strip_prefix("pub ").unwrap_or(s);
            let s = s.strip_prefix("pub(crate) ").unwrap_or(s);
            s.strip_prefix("mod ").map(|name| name.trim().to_string())
        })
        .collect()
}

/// Strongly connected components of `graph` (Tarjan), largest first.
fn components(graph: &BTreeMap<usize, BTreeSet<usize>>, n: usize) -> Vec<Vec<usize>> {
    struct Tarjan<'a> {
        graph: &'a BTreeMap<usize, BTreeSet<usize>>,
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: usize) {
            self.index[v] = Some(self.next);
            self.low[v] = self.next;
            self.next += 1;
            self.stack.push(v);
            self.on_stack[v] = true;
            for &w in self.graph.get(&v).into_iter().flatten() {
                match self.index[w] {
                    None => {
                        self.visit(w);
                        self.low[v] = self.low[v].min(self.low[w]);
                    }
                    Some(iw) if self.on_stack[w] => self.low[v] = self.low[v].min(iw),
                    _ => {}
                }
            }
            if Some(self.low[v]) == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                self.out.push(component);
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if t.index[v].is_none() {
            t.visit(v);
        }
    }
    t.out.sort_by_key(|c| std::cmp::Reverse(c.len()));
    t.out
}

/// The folder a file belongs to: `controller/mod.rs` and `controller/jobs.rs` are both
/// of `controller/`; `controller/gating/kind.rs` of `controller/gating/`.
fn folder(path: &Path) -> PathBuf {
    path.parent().expect("parent").to_path_buf()
}

#[test]
fn no_import_cycle_spans_two_folders() {
    let files = sources();
    let by_module: BTreeMap<Vec<String>, usize> = files
        .iter()
        .enumerate()
        .map(|(i, f)| (f.module.clone(), i))
        .collect();
    let mut graph: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    let mut why: BTreeMap<(usize, usize), String> = BTreeMap::new();
    for (i, file) in files.iter().enumerate() {
        let children = declared_children(file);
        for path in paths_named(file, &children) {
            // The deepest prefix of the path that is a file of ours.
            let target = (1..=path.len())
                .rev()
                .find_map(|len| by_module.get(&path[..len]).copied());
            if let Some(j) = target.filter(|&j| j != i) {
                graph.entry(i).or_default().insert(j);
                why.entry((i, j)).or_insert_with(|| path.join("::"));
            }
        }
    }
    let edges: usize = graph.values().map(BTreeSet::len).sum();
    println!("{} files, {edges} file-to-file uses", files.len());
    let mut spanning = Vec::new();
    for component in components(&graph, files.len()) {
        let folders: BTreeSet<PathBuf> =
            component.iter().map(|&i| folder(&files[i].path)).collect();
        if folders.len() > 1 {
            let names: Vec<String> = component
                .iter()
                .map(|&i| {
                    let uses: Vec<String> = graph[&i]
                        .iter()
                        .filter(|j| component.contains(j))
                        .map(|j| format!("{} ({})", files[*j].module.join("/"), why[&(i, *j)]))
                        .collect();
                    format!("  {} -> {}", files[i].module.join("/"), uses.join(", "))
                })
                .collect();
            spanning.push(names.join("\n"));
        }
    }
    assert!(
        spanning.is_empty(),
        "import cycles spanning two folders:\n{}",
        spanning.join("\n\n")
    );
}

#[test]
fn the_checker_finds_a_cycle_when_there_is_one() {
    // Two files in two folders naming each other: the graph must see both edges.
    let a = SourceFile {
        path: PathBuf::from("src/a/mod.rs"),
        module: vec!["lockwarden".into(), "a".into()],
        text: strip_comments(
            "use crate::b::thing; // crate::c::not_a_use\nfn f() { crate::b::g() }",
        ),
    };
    let paths = paths_named(&a, &BTreeSet::new());
    let path = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(paths.contains(&path(&["lockwarden", "b", "thing"])));
    assert!(
        !paths
            .iter()
            .any(|p| p.get(1).map(String::as_str) == Some("c"))
    );
    let grouped = expand("crate::x::{y, z::{p, q as r}}");
    assert_eq!(grouped.len(), 3);
    let mut graph = BTreeMap::new();
    graph.insert(0, BTreeSet::from([1]));
    graph.insert(1, BTreeSet::from([0]));
    assert_eq!(components(&graph, 2)[0].len(), 2);
}

#[test]
fn the_gating_machine_names_no_workload_kind() {
    // docs/design.md §2: `controller/gating/` drives every kind through the
    // `GatedWorkload` trait; a kind is registered, never imported.
    let kinds = [
        ["controller", "jobs"],
        ["controller", "pods"],
        ["controller", "kueue"],
    ];
    for file in sources() {
        if !file
            .module
            .starts_with(&["controller".to_string(), "gating".to_string()])
        {
            continue;
        }
        let children = declared_children(&file);
        for path in paths_named(&file, &children) {
            assert!(
                !kinds.iter().any(|k| path.starts_with(&k.map(String::from))),
                "{} names {}",
                file.path.display(),
                path.join("::")
            );
        }
    }
}

/// The stores' names where code could name them: their variants of the registry's
/// enums, and their URL schemes.
const STORE_VARIANTS: [&str; 4] = ["S3", "DynamoDb", "ZooKeeper", "Kubernetes"];
const STORE_ENUMS: [&str; 3] = ["BackendKind", "Target", "SelectedSpec"];
const STORE_SCHEMES: [&str; 8] = [
    "s3",
    "dynamodb",
    "ddb",
    "zk",
    "zookeeper",
    "k8s",
    "kubernetes",
    "lease",
];

/// Where a store is named in `text` (code and string literals, comments stripped):
/// `Target::S3`, `BackendKind::ZooKeeper`, `"zk"`, `"s3://…"`. A Cargo feature named
/// after a store (`#[cfg(feature = "s3")]`) is no use of the store.
fn store_names(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    let mut kept = String::with_capacity(text.len());
    while let Some(at) = rest.find("feature = \"") {
        kept.push_str(&rest[..at]);
        let after = &rest[at + "feature = \"".len()..];
        rest = after.find('"').map_or("", |end| &after[end + 1..]);
    }
    kept.push_str(rest);
    let text = kept.as_str();
    for e in STORE_ENUMS {
        for v in STORE_VARIANTS {
            let name = format!("{e}::{v}");
            let named = text.match_indices(&name).any(|(at, _)| {
                let next = text[at + name.len()..].chars().next();
                !next.is_some_and(|c| c.is_alphanumeric() || c == '_')
            });
            if named {
                found.push(name);
            }
        }
    }
    for scheme in STORE_SCHEMES {
        for literal in [format!("\"{scheme}\""), format!("\"{scheme}://")] {
            if text.contains(&literal) {
                found.push(literal);
            }
        }
    }
    found
}

/// `text` without its `#[cfg(test)]` items (inline test modules), and the names of
/// the child modules it declares under `#[cfg(test)]` (test-only files).
fn without_tests(text: &str) -> (String, BTreeSet<String>) {
    let mut out = text.to_string();
    let mut test_children = BTreeSet::new();
    while let Some(at) = out.find("#[cfg(test)]") {
        let rest = &out[at..];
        let body_end = rest.find(['{', ';']).unwrap_or(rest.len());
        let header = &rest[..body_end];
        if rest[body_end..].starts_with(';') {
            // `#[cfg(test)] mod name;`: a test-only file.
            if let Some(name) = header.split_whitespace().last() {
                test_children.insert(name.to_string());
            }
            out.replace_range(at..at + body_end + 1, "");
            continue;
        }
        let mut depth = 0;
        let mut end = rest.len();
        for (i, c) in rest[body_end..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = body_end + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.replace_range(at..at + end, "");
    }
    (out, test_children)
}

#[test]
fn stores_are_named_in_one_registry() {
    let root = lockwarden_testsupport::repo_root();
    let stores = ["s3", "dynamodb", "zookeeper", "kubernetes"];
    let own: Vec<PathBuf> = stores
        .iter()
        .flat_map(|s| {
            [
                root.join("crates/stores/src").join(s),
                root.join("crates/api/src/stores").join(format!("{s}.rs")),
            ]
        })
        .collect();
    let allowed = [
        root.join("crates/stores/src/registry.rs"),
        root.join("crates/api/src/backend_spec.rs"),
        root.join("crates/api/src/store_spec.rs"),
    ];
    let files = sources();
    // Test-only files: declared under `#[cfg(test)]` by their parent (or named
    // `tests.rs`, the convention for a module's tests in a file of their own).
    let mut test_only: BTreeSet<Vec<String>> = BTreeSet::new();
    for file in &files {
        let raw = std::fs::read_to_string(&file.path).expect("read");
        for child in without_tests(&strip(&raw, true)).1 {
            let mut module = file.module.clone();
            module.push(child);
            test_only.insert(module);
        }
    }
    let mut naming = Vec::new();
    for file in &files {
        if own.iter().any(|f| file.path.starts_with(f))
            || test_only.iter().any(|m| file.module.starts_with(m))
        {
            continue;
        }
        let raw = std::fs::read_to_string(&file.path).expect("read");
        let (code, _) = without_tests(&strip(&raw, true));
        let names = store_names(&code);
        if !names.is_empty() {
            naming.push((file.path.clone(), names));
        }
    }
    println!(
        "files outside the stores' own folders naming a store: {}",
        naming.len()
    );
    for (path, names) in &naming {
        println!(
            "  {} ({})",
            path.strip_prefix(&root).unwrap().display(),
            names.join(", ")
        );
    }
    let stray: Vec<String> = naming
        .iter()
        .filter(|(path, _)| !allowed.contains(path))
        .map(|(path, names)| format!("{} names {}", path.display(), names.join(", ")))
        .collect();
    assert!(
        stray.is_empty(),
        "stores named outside their folder and the registry:\n{}",
        stray.join("\n")
    );
    assert!(naming.len() <= allowed.len(), "{naming:?}");
}

#[test]
fn the_store_scan_sees_names_and_skips_tests() {
    let text = "#[cfg(feature = \"s3\")] fn f() { Target::S3(k); BackendKind::ZooKeeperX; x(\"zk://h\") }\n\
                #[cfg(test)]\nmod tests { fn g() { Target::DynamoDb } }\n\
                #[cfg(test)]\nmod testing;";
    let (code, children) = without_tests(text);
    assert_eq!(store_names(&code), ["Target::S3", "\"zk://"]);
    assert_eq!(children, BTreeSet::from(["testing".to_string()]));
}

/// The `lockwarden-*` packages `manifest` depends on in its `[dependencies]` (not the
/// dev-dependencies: a crate's tests may use a lower layer's test support).
fn our_dependencies(manifest: &str) -> BTreeSet<String> {
    let mut section = "";
    let mut found = BTreeSet::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
            continue;
        }
        if section == "[dependencies]"
            && let Some(name) = line.split(['.', ' ', '=']).next()
            && name.starts_with("lockwarden-")
        {
            found.insert(name.to_string());
        }
    }
    found
}

/// The layers' order holds in the manifests: each crate depends only on crates listed
/// before it in [`CRATES`], so the compiler refuses any use of a higher layer (the
/// engine cannot name a store, the stores cannot name the API types, nothing below the
/// controller can name it).
#[test]
fn the_crates_depend_downward_only() {
    let root = lockwarden_testsupport::repo_root();
    for (i, (_, dir, package)) in CRATES.iter().enumerate() {
        let manifest_path = root.join(dir).parent().unwrap().join("Cargo.toml");
        let manifest = std::fs::read_to_string(&manifest_path).expect("read Cargo.toml");
        let lower: BTreeSet<String> = CRATES[..i].iter().map(|c| c.2.to_string()).collect();
        for dependency in our_dependencies(&manifest) {
            assert!(
                lower.contains(&dependency),
                "{package} ({}) depends on {dependency}, which is not a lower layer \
                 (the order: {:?})",
                manifest_path.display(),
                CRATES.map(|c| c.2)
            );
        }
    }
    assert_eq!(
        our_dependencies(
            "[dependencies]\nlockwarden-core.workspace = true\n[dev-dependencies]\nlockwarden-api = 1\n"
        ),
        BTreeSet::from(["lockwarden-core".to_string()]),
    );
}

/// The packages `package` builds with, from `cargo tree` (normal dependencies, no
/// build): what a user of that package compiles.
fn dependency_closure(package: &str) -> BTreeSet<String> {
    let out = std::process::Command::new(env!("CARGO"))
        .current_dir(lockwarden_testsupport::repo_root())
        .args([
            "tree",
            "--locked",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .args(["--format", "{p}", "-p", package])
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// The engine builds with no Kubernetes, AWS, ZooKeeper or HTTP client, and a program
/// embedding one store (examples/embed-dynamodb: DynamoDB) gets that store's client
/// alone: no Kubernetes client, no S3 or ZooKeeper client.
#[test]
fn the_engine_and_an_embedding_of_one_store_carry_no_other_client() {
    let clients = |closure: &BTreeSet<String>, forbidden: &[&str]| -> Vec<String> {
        closure
            .iter()
            .filter(|p| forbidden.iter().any(|f| p.starts_with(f)))
            .cloned()
            .collect()
    };
    let core = dependency_closure("lockwarden-core");
    let in_core = clients(
        &core,
        &[
            "kube",
            "k8s-openapi",
            "aws-",
            "zookeeper-client",
            "hyper",
            "lockwarden-",
        ],
    );
    assert_eq!(
        in_core,
        ["lockwarden-core"],
        "lockwarden-core's dependencies"
    );
    let embedding = dependency_closure("embed-dynamodb");
    assert!(embedding.contains("aws-sdk-dynamodb"), "{embedding:?}");
    let others = clients(
        &embedding,
        &["kube", "k8s-openapi", "aws-sdk-s3", "zookeeper-client"],
    );
    assert!(
        others.is_empty(),
        "examples/embed-dynamodb builds {others:?} (of {} packages)",
        embedding.len()
    );
    println!(
        "lockwarden-core: {} packages; examples/embed-dynamodb: {}; lockwarden: {}",
        core.len(),
        embedding.len(),
        dependency_closure("lockwarden").len()
    );
}

//! The dependency direction of the workspace (`CRATE_GRAPH`, over `cargo
//! metadata`): actors ← providers, supervisor ← tools ← arbor (the embedder's
//! crate) ← service ← cli, and the lower crates pull in no HTTP, SQL, CLI or
//! TOML crate, even transitively.
//! Within each crate, the modules import each other without a cycle (but the
//! known ones, each named with its reason), read from the code outside tests
//! (`production_code`).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

fn normal_deps(package: &str) -> Vec<String> {
    tree_deps(package, &[])
}

/// The names of `package`'s normal dependencies, transitively, per `cargo
/// tree` with `extra` arguments (features).
fn tree_deps(package: &str, extra: &[&str]) -> Vec<String> {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "-p",
            package,
            "-e",
            "normal",
            "--prefix",
            "none",
            "--offline",
        ])
        .args(extra)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// The workspace's crates and the workspace crates each may depend on
/// directly (normal dependencies): dependencies point one way, down this
/// list. A crate not listed, or a dependency not allowed, fails the test.
const CRATE_GRAPH: [(&str, &[&str]); 9] = [
    ("arbor-actors", &[]),
    ("arbor-programs", &["arbor-actors"]),
    ("arbor-providers", &["arbor-actors"]),
    ("arbor-supervisor", &["arbor-actors"]),
    ("arbor-tools", &["arbor-actors", "arbor-supervisor"]),
    (
        "arbor-agents",
        &[
            "arbor-actors",
            "arbor-programs",
            "arbor-providers",
            "arbor-supervisor",
            "arbor-tools",
        ],
    ),
    (
        "arbor-service",
        &["arbor-actors", "arbor-supervisor", "arbor-agents"],
    ),
    (
        "arbor-cli",
        &[
            "arbor-actors",
            "arbor-supervisor",
            "arbor-agents",
            "arbor-service",
        ],
    ),
    ("arbor-test-support", &["arbor-actors", "arbor-supervisor"]),
];

#[test]
fn the_workspace_crates_depend_on_each_other_one_way() {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = metadata["packages"].as_array().unwrap();
    let members: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let listed: BTreeSet<&str> = CRATE_GRAPH.iter().map(|(name, _)| *name).collect();
    assert_eq!(members, listed, "the workspace's crates");
    for package in packages {
        let name = package["name"].as_str().unwrap();
        // Normal dependencies only (`kind` null); dev-dependencies may reach
        // any crate.
        let deps: BTreeSet<&str> = package["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["kind"].is_null())
            .filter_map(|d| d["name"].as_str())
            .filter(|d| members.contains(d))
            .collect();
        let allowed: BTreeSet<&str> = CRATE_GRAPH
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, deps)| deps.iter().copied().collect())
            .unwrap_or_default();
        assert!(
            deps.is_subset(&allowed),
            "{name} depends on {:?}, which it may not",
            deps.difference(&allowed).collect::<Vec<_>>()
        );
    }
    // Each crate may only depend on crates listed above it.
    for (i, (name, deps)) in CRATE_GRAPH.iter().enumerate() {
        for dep in *deps {
            let at = CRATE_GRAPH.iter().position(|(n, _)| n == dep).unwrap();
            assert!(at < i, "{name} may depend on {dep}, listed below it");
        }
    }
}

#[test]
fn tools_know_no_providers_server_cli_or_facade() {
    let deps = normal_deps("arbor-tools");
    for banned in [
        "arbor-providers",
        "arbor-agents",
        "axum",
        "clap",
        "opentelemetry",
    ] {
        assert!(
            !deps.iter().any(|d| d == banned),
            "arbor-tools depends on {banned}"
        );
    }
    assert!(deps.iter().any(|d| d == "rmcp"));
}

#[test]
fn providers_know_no_telemetry_supervisor_or_facade() {
    let deps = normal_deps("arbor-providers");
    for banned in SQL.iter().chain(&[
        "opentelemetry",
        "tracing-opentelemetry",
        "arbor-supervisor",
        "arbor-agents",
        "clap",
        "axum",
    ]) {
        assert!(
            !deps.iter().any(|d| d == banned),
            "arbor-providers depends on {banned}"
        );
    }
    assert!(deps.iter().any(|d| d == "reqwest"));
}

const WEB: [&str; 6] = ["hyper", "reqwest", "axum", "http", "h2", "tower"];
const SQL: [&str; 3] = ["rusqlite", "sqlx", "libsqlite3-sys"];

#[test]
fn actors_knows_no_http_sql_cli_toml_or_supervisor() {
    let deps = normal_deps("arbor-actors");
    for banned in
        WEB.iter()
            .chain(&SQL)
            .chain(&["clap", "toml", "arbor-supervisor", "arbor-agents"])
    {
        assert!(
            !deps.iter().any(|d| d == banned),
            "arbor-actors depends on {banned}"
        );
    }
    assert!(deps.iter().any(|d| d == "ractor"));
}

#[test]
fn programs_know_only_the_actors_and_no_http_sql_or_cli() {
    let deps = normal_deps("arbor-programs");
    for banned in WEB.iter().chain(&SQL).chain(&[
        "clap",
        "toml",
        "arbor-supervisor",
        "arbor-tools",
        "arbor-agents",
    ]) {
        assert!(
            !deps.iter().any(|d| d == banned),
            "arbor-programs depends on {banned}"
        );
    }
    for needed in ["arbor-actors", "rquickjs", "oxc"] {
        assert!(
            deps.iter().any(|d| d == needed),
            "arbor-programs lacks {needed}"
        );
    }
}

#[test]
fn supervisor_knows_no_http_cli_or_the_facade() {
    let deps = normal_deps("arbor-supervisor");
    for banned in WEB.iter().chain(&["clap", "arbor-agents"]) {
        assert!(
            !deps.iter().any(|d| d == banned),
            "arbor-supervisor depends on {banned}"
        );
    }
    assert!(deps.iter().any(|d| d == "arbor-actors"));
}

type Graph = BTreeMap<String, BTreeSet<String>>;

/// `text` (Rust source) as it is built outside tests: comments and the
/// insides of string and char literals blanked (newlines kept, so brace
/// matching and searches see code only), and every item a test-only
/// `#[cfg(…)]` (`test`, or `all(test, …)`) guards removed with its
/// attributes: a `mod x { … }`, `fn`, `impl` or `struct` to its matching
/// brace, a `use …;`, `mod x;` or `const` to its semicolon, a field or a
/// variant to its comma. What follows a mid-file test module is kept.
fn production_code(text: &str) -> String {
    let code = blank_comments_and_literals(text);
    let mut out = String::with_capacity(code.len());
    let mut at = 0;
    for range in test_items(&code) {
        out.push_str(&code[at..range.start]);
        at = range.end;
    }
    out.push_str(&code[at..]);
    out
}

/// The byte ranges of the test-only items of `code` (blanked by
/// `blank_comments_and_literals`), each from its `#[cfg(…)]` to its end.
fn test_items(code: &str) -> Vec<std::ops::Range<usize>> {
    let bytes = code.as_bytes();
    let mut items = Vec::new();
    let mut from = 0;
    while let Some(found) = code[from..].find("#[cfg(") {
        let start = from + found;
        let Some(attr_end) = matching(bytes, start + 1) else {
            break;
        };
        let predicate: String = code[start + 6..attr_end - 1]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        let test_only = predicate == "test"
            || predicate
                .strip_prefix("all(")
                .and_then(|rest| rest.strip_suffix(')'))
                .is_some_and(|all| all.split(',').any(|p| p == "test"));
        if !test_only {
            from = attr_end + 1;
            continue;
        }
        // Further attributes of the same item.
        let mut i = attr_end + 1;
        loop {
            while i < bytes.len() && bytes[i].is_ascii_whitespace() {
                i += 1;
            }
            if bytes.get(i) == Some(&b'#') && bytes.get(i + 1) == Some(&b'[') {
                match matching(bytes, i + 1) {
                    Some(end) => i = end + 1,
                    None => break,
                }
            } else {
                break;
            }
        }
        let end = item_end(bytes, i);
        items.push(start..end);
        from = end;
    }
    items
}

/// The index after the item that starts at `i`: after its `;` (or `,`) at
/// depth 0, or after the `}` that closes its body (unless a `;` follows, as
/// in `use a::{b};` or `static S: T = T { … };`); before a closing bracket
/// of what encloses it.
fn item_end(bytes: &[u8], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < bytes.len() {
        match bytes[i] {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' if depth == 0 => return i,
            b')' | b']' => depth -= 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    let next = bytes[i + 1..]
                        .iter()
                        .position(|b| !b.is_ascii_whitespace())
                        .map(|n| bytes[i + 1 + n]);
                    if next != Some(b';') {
                        return i + 1;
                    }
                }
            }
            b';' | b',' if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    bytes.len()
}

/// The index of the bracket that closes the one at `open`.
fn matching(bytes: &[u8], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, b) in bytes.iter().enumerate().skip(open) {
        match b {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// `text` with its comments and the insides of its string, raw-string and
/// char literals replaced by spaces (newlines kept); lifetimes stay.
fn blank_comments_and_literals(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if (c == 'r' || (c == 'b' && next == Some('r')))
            && !chars[..i]
                .last()
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
            && {
                let from = i + usize::from(c == 'b') + 1;
                let hashes = chars[from..].iter().take_while(|h| **h == '#').count();
                chars.get(from + hashes) == Some(&'"')
            }
        {
            // A raw string: r"…", r#"…"#, br"…".
            let from = i + usize::from(c == 'b') + 1;
            let hashes = chars[from..].iter().take_while(|h| **h == '#').count();
            out.extend(&chars[i..from + hashes + 1]);
            i = from + hashes + 1;
            let close: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            while i < chars.len() && !chars[i..].starts_with(&close) {
                out.push(blank(chars[i]));
                i += 1;
            }
            out.extend(&close);
            i += close.len();
        } else if c == '"' {
            out.push('"');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if let Some(&c) = chars.get(i) {
                    out.push(blank(c));
                }
                i += 1;
            }
            out.push('"');
            i += 1;
        } else if c == '\'' && (next == Some('\\') || chars.get(i + 2) == Some(&'\'')) {
            // A char literal ('x', '\n', '\u{7f}'), not a lifetime ('a).
            out.push('\'');
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                out.push(' ');
                i += 1;
            }
            out.push('\'');
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The paths of a `use` tree (`a::{b, c::d as e}` is `a::b` and
/// `a::c::e`, the alias last), as segments.
fn use_paths(tree: &str) -> Vec<Vec<String>> {
    let tree = tree.trim();
    let mut prefix = Vec::new();
    let mut rest = tree;
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let inner = group.strip_suffix('}').unwrap_or(group);
            let mut depth = 0;
            let mut parts = vec![String::new()];
            for c in inner.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        parts.push(String::new());
                        continue;
                    }
                    _ => {}
                }
                parts.last_mut().unwrap().push(c);
            }
            return parts
                .iter()
                .filter(|p| !p.trim().is_empty())
                .flat_map(|p| use_paths(p))
                .map(|tail| prefix.iter().cloned().chain(tail).collect())
                .collect();
        }
        match rest.split_once("::") {
            Some((head, tail)) if !head.contains('{') => {
                prefix.push(head.trim().to_owned());
                rest = tail.trim_start();
            }
            _ => {
                let leaf = match rest.split_once(" as ") {
                    Some((_, alias)) => alias.trim(),
                    None => rest.trim(),
                };
                prefix.push(leaf.to_owned());
                return vec![prefix];
            }
        }
    }
}

/// What follows `at` in `code` as a path or a use tree: `a::b::C`, or a
/// `{…}` group (brace-matched).
fn path_at(code: &str, at: usize) -> &str {
    let bytes = code.as_bytes();
    let mut i = at;
    while i < bytes.len() {
        match bytes[i] {
            b'{' => {
                let Some(end) = matching(bytes, i) else {
                    return &code[at..];
                };
                return &code[at..=end];
            }
            b':' => i += 1,
            c if c.is_ascii_alphanumeric() || c == b'_' => i += 1,
            _ => break,
        }
    }
    code[at..i].trim_end_matches(':')
}

/// The top-level modules of the crate whose root is `dir/root` (`lib.rs`,
/// `main.rs`: the files `NAME.rs` and `NAME/…` of each `mod NAME;` it
/// declares; the root itself is no module) and which of them each
/// names outside its tests (`production_code`): as `crate::NAME`, as
/// `super::…::NAME` climbing to the root, or through an item the root
/// re-exports from it (`pub use NAME::{Item, …}` in `lib.rs`, so
/// `crate::Item` names `NAME`). Files that only tests build (`#[cfg(test)]
/// mod tests;`) are left out.
fn module_graph(dir: &str, root_file: &str) -> Graph {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(path) = stack.pop() {
        for entry in std::fs::read_dir(&path).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                files.push((path, blank_comments_and_literals(&text)));
            }
        }
    }
    files.sort();
    // The files only tests build: those of `#[cfg(test)] mod NAME;`.
    let mut test_only: Vec<std::path::PathBuf> = Vec::new();
    for (path, code) in &files {
        let base = match path.file_stem().and_then(|s| s.to_str()) {
            Some("mod" | "lib" | "main") => path.parent().unwrap().to_owned(),
            Some(stem) => path.parent().unwrap().join(stem),
            None => continue,
        };
        for range in test_items(code) {
            let item = code[range].split(']').next_back().unwrap_or_default();
            let words: Vec<&str> = item
                .split(|c: char| c.is_whitespace() || c == ';')
                .filter(|w| !w.is_empty() && !w.starts_with("pub"))
                .collect();
            if let ["mod", name] = words[..] {
                test_only.push(base.join(format!("{name}.rs")));
                test_only.push(base.join(name));
            }
        }
    }
    let root_code = files
        .iter()
        .find(|(p, _)| *p == root.join(root_file))
        .map(|(_, code)| production_code(code))
        .unwrap_or_else(|| panic!("no {dir}/{root_file}"));
    // The root's `mod NAME;` declarations (an inline `mod x { … }` is the
    // root's own code).
    let modules: BTreeSet<String> = root_code
        .match_indices("mod ")
        .filter(|(at, _)| {
            root_code[..*at]
                .chars()
                .next_back()
                .is_none_or(|c| c.is_whitespace() || c == ')')
        })
        .filter_map(|(at, _)| {
            let rest = &root_code[at + 4..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest[name.len()..]
                .trim_start()
                .starts_with(';')
                .then_some(name)
        })
        .collect();
    // What the root re-exports, by the module it comes from.
    let mut exported: BTreeMap<String, String> = BTreeMap::new();
    for (at, _) in root_code.match_indices("pub use ") {
        for path in use_paths(path_at(&root_code, at + 8)) {
            if let (Some(first), Some(leaf)) = (path.first(), path.last())
                && modules.contains(first)
                && path.len() > 1
            {
                exported.insert(leaf.clone(), first.clone());
            }
        }
    }
    let resolve = |name: &str| -> Option<String> {
        if modules.contains(name) {
            Some(name.to_owned())
        } else {
            exported.get(name).cloned()
        }
    };
    let mut graph = Graph::new();
    for (path, code) in &files {
        let rel = path.strip_prefix(&root).unwrap();
        let parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let module = parts[0].trim_end_matches(".rs").to_owned();
        if !modules.contains(&module) || test_only.iter().any(|t| path == t || path.starts_with(t))
        {
            continue;
        }
        let code = production_code(code);
        // `super::` as many times as the file is deep climbs to the root.
        let depth = parts.len() - usize::from(parts.last().unwrap() == "mod.rs");
        let up = "super::".repeat(depth);
        let uses = graph.entry(module.clone()).or_default();
        for prefix in ["crate::", up.as_str()] {
            for (at, _) in code.match_indices(prefix) {
                // `super::super::x` is not `super::x` one level down.
                if code[..at].ends_with("super::") || code[..at].ends_with("crate::") {
                    continue;
                }
                for path in use_paths(path_at(&code, at + prefix.len())) {
                    if let Some(name) = path.first().and_then(|first| resolve(first))
                        && name != module
                    {
                        uses.insert(name);
                    }
                }
            }
        }
    }
    graph
}

/// A cycle among `graph`'s modules, if there is one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        graph: &Graph,
        node: &str,
        path: &mut Vec<String>,
        done: &mut std::collections::BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if !done.insert(node.to_owned()) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if graph.contains_key(next)
                && let Some(c) = visit(graph, next, path, done)
            {
                return Some(c);
            }
        }
        path.pop();
        None
    }
    let mut done = std::collections::BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(graph, m, &mut Vec::new(), &mut done))
}

/// The modules of `arbor-providers` (`NAME.rs` and `NAME/…`, the unit tests'
/// `tests.rs` files aside) and which of them each names, as `crate::OTHER`
/// or as `super::OTHER` where `super` is the crate's root, outside its tests.
fn provider_module_graph() -> Graph {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("providers/src");
    let mut graph = std::collections::BTreeMap::new();
    let mut stack = vec![root.clone()];
    while let Some(path) = stack.pop() {
        for entry in std::fs::read_dir(&path).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("tests.rs") {
                continue;
            }
            let rel = path.strip_prefix(&root).unwrap();
            let parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let module = parts[0].trim_end_matches(".rs").to_owned();
            if module == "lib" {
                continue;
            }
            // What `super::` means here: the crate's root for `NAME.rs` and
            // `NAME/mod.rs`, one more `super::` for the files below `NAME/`.
            let depth = parts.len() - usize::from(parts.last().unwrap() == "mod.rs");
            let up = "super::".repeat(depth);
            let text = std::fs::read_to_string(&path).unwrap();
            let code = production_code(&text);
            let code = code.as_str();
            let uses: &mut BTreeSet<String> = graph.entry(module.clone()).or_default();
            for prefix in ["crate::", up.as_str()] {
                for (at, _) in code.match_indices(prefix) {
                    // `super::super::x` is not `super::x` one level down.
                    if code[..at].ends_with("super::") {
                        continue;
                    }
                    let rest = &code[at + prefix.len()..];
                    let names = match rest.strip_prefix('{') {
                        Some(group) => {
                            let mut depth = 0;
                            let end = group
                                .find(|c| {
                                    match c {
                                        '{' => depth += 1,
                                        '}' if depth == 0 => return true,
                                        '}' => depth -= 1,
                                        _ => {}
                                    }
                                    false
                                })
                                .unwrap_or(group.len());
                            let mut depth = 0;
                            let mut names = vec![String::new()];
                            for c in group[..end].chars() {
                                match c {
                                    '{' => depth += 1,
                                    '}' => depth -= 1,
                                    ',' if depth == 0 => names.push(String::new()),
                                    _ => names.last_mut().unwrap().push(c),
                                }
                            }
                            names
                        }
                        None => vec![rest.to_owned()],
                    };
                    for name in names {
                        let name: String = name
                            .trim_start()
                            .chars()
                            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                            .collect();
                        if !name.is_empty() && name != module {
                            uses.insert(name);
                        }
                    }
                }
            }
        }
    }
    graph
}

#[test]
fn the_provider_modules_import_each_other_without_a_cycle() {
    let graph = provider_module_graph();
    for module in ["client", "wire", "openai", "anthropic", "settings"] {
        assert!(graph.contains_key(module), "no module {module}: {graph:?}");
    }
    assert!(graph["client"].contains("wire"), "the graph sees imports");
    assert!(
        graph["openai"].contains("wire"),
        "the graph sees nested files"
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!("providers/src has an import cycle: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_http_client_names_no_provider() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("providers/src/client.rs");
    let text = std::fs::read_to_string(path).unwrap();
    assert!(
        text.contains("WireFormat"),
        "the client speaks through the trait"
    );
    for (n, line) in text.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let lower = code.to_lowercase();
        for name in ["openai", "anthropic", "providerkind"] {
            assert!(
                !lower.contains(name),
                "providers/src/client.rs:{} names {name}: {line}",
                n + 1
            );
        }
    }
}

/// Every crate's root, as `module_graph` reads it, and whether its top-level
/// modules import each other at all (the embedder's crate has two, `config`
/// and `telemetry`, which do not; the binary's library is `loadtest` alone
/// and not listed).
const CRATES: [(&str, &str, bool); 9] = [
    ("actors/src", "lib.rs", true),
    ("programs/src", "lib.rs", true),
    ("providers/src", "lib.rs", true),
    ("supervisor/src", "lib.rs", true),
    ("tools/src", "lib.rs", true),
    ("arbor/src", "lib.rs", false),
    ("service/src", "lib.rs", true),
    ("src", "main.rs", true),
    ("test-support/src", "lib.rs", true),
];

/// The import cycles between modules there are today, each by the import
/// that closes it (the crate's root, `from`, `to`) and why it stays for now. The test
/// fails when one of them is gone (drop it here) and when a cycle not
/// listed appears.
const KNOWN_CYCLES: [(&str, &str, &str, &str); 6] = [
    (
        "service/src/lib.rs",
        "error",
        "conn",
        "an axum body error is answered 408 when it is the connection's \
         conn::BodyTimeout, and conn reads its timeouts from limits, \
         whose refusals are ApiErrors",
    ),
    (
        "service/src/lib.rs",
        "turns",
        "replica",
        "a follow-up turn for a tree another replica runs is forwarded \
         there (replica::forward), and the replica that runs it journals \
         the queued turn with turns::journal_told",
    ),
    (
        "supervisor/src/lib.rs",
        "store",
        "supervisor",
        "TreeRecord::request (store/mod.rs) builds the StartRequest a stored \
         tree resumes with, and StartRequest is the supervisor's",
    ),
    (
        "supervisor/src/lib.rs",
        "store",
        "tree",
        "both store backends stamp rows with tree::now_ms, the supervisor's \
         clock helper",
    ),
    (
        "supervisor/src/lib.rs",
        "error",
        "store",
        "Error::RaiseEnded names the ended tree's store::TreeStatus",
    ),
    (
        "supervisor/src/lib.rs",
        "limits",
        "recovery",
        "TreeBudget::restore takes the recovery::Spent a journal replay \
         counted, and recovery's Tape records limits::Raised",
    ),
];

#[test]
fn the_modules_of_every_crate_import_each_other_without_a_cycle_but_the_known_ones() {
    for (dir, root, imports) in CRATES {
        let mut graph = module_graph(dir, root);
        assert_eq!(
            graph.values().any(|uses| !uses.is_empty()),
            imports,
            "{dir}/{root}: the graph sees imports: {graph:?}"
        );
        let krate = format!("{dir}/{root}");
        for (_, from, to, why) in KNOWN_CYCLES.iter().filter(|k| k.0 == krate) {
            let closes = graph.get_mut(*from).is_some_and(|uses| uses.remove(*to));
            assert!(
                closes,
                "{krate}: {from} no longer imports {to}: drop it from KNOWN_CYCLES ({why})"
            );
        }
        if let Some(cycle) = find_cycle(&graph) {
            panic!("{dir}/{root} has an import cycle: {}", cycle.join(" -> "));
        }
    }
    // What each crate's graph is made of.
    let actors = module_graph("actors/src", "lib.rs");
    assert!(
        actors["agent"].contains("hooks"),
        "crate:: paths: {actors:?}"
    );
    let supervisor = module_graph("supervisor/src", "lib.rs");
    assert!(
        supervisor["tree"].contains("catalog"),
        "an item the root re-exports names its module: {supervisor:?}"
    );
    let embedder = module_graph("arbor/src", "lib.rs");
    assert_eq!(
        embedder.keys().collect::<Vec<_>>(),
        ["config", "telemetry"],
        "the embedder's crate is the config and the exporter over the runtime"
    );
    let service = module_graph("service/src", "lib.rs");
    assert!(service["router"].contains("api"), "{service:?}");
    let binary = module_graph("src", "main.rs");
    assert_eq!(binary.keys().collect::<Vec<_>>(), ["cli", "idle"]);
}

/// A test module in the middle of a file hides none of the code after it,
/// and braces, `#[cfg(test)]` and `crate::` inside strings and comments
/// are no code.
#[test]
fn production_code_strips_each_test_item_and_keeps_what_follows() {
    let text = r##"use crate::a::A;

#[cfg(test)]
mod tests {
    use crate::b::B;
    const OPEN: &str = "{ #[cfg(test)] crate::c";
    #[test]
    fn t() { let _ = ('}', r#"}"#, '{'); }
}

// crate::d in a comment; #[cfg(test)]
pub fn after<'a>(x: &'a str) -> &'a str { crate::e::f(x) }

#[cfg(test)]
use crate::g::G;
#[cfg(test)]
#[allow(dead_code)]
fn helper() -> u32 { crate::h::H }
#[cfg(all(test, feature = "postgres"))]
mod pg_tests;
#[cfg(feature = "server")]
pub mod served { use crate::i::I; }
struct S {
    #[cfg(test)]
    probe: crate::j::J,
    kept: crate::k::K,
}
const LAST: &str = "/* not a comment */ crate::l";
/* crate::m /* nested */ still a comment */
fn end() { crate::n::N }
"##;
    let code = production_code(text);
    for kept in [
        "crate::a::A",
        "pub fn after<'a>(x: &'a str)",
        "crate::e::f(x)",
        "#[cfg(feature = \"",
        "pub mod served",
        "crate::i::I",
        "kept: crate::k::K,",
        "fn end() { crate::n::N }",
    ] {
        assert!(code.contains(kept), "{kept:?} is gone from:\n{code}");
    }
    for gone in [
        "crate::b",
        "crate::c",
        "crate::d",
        "crate::g",
        "crate::h",
        "pg_tests",
        "crate::j",
        "crate::l",
        "crate::m",
        "#[cfg(test)]",
        "#[test]",
        "mod tests",
    ] {
        assert!(!code.contains(gone), "{gone:?} is left in:\n{code}");
    }
}

/// The embedder's crate's normal dependencies without default features: what an
/// embedder compiles.
fn light_deps() -> Vec<String> {
    tree_deps("arbor-agents", &["--no-default-features"])
}

#[test]
fn the_library_without_default_features_has_no_server_otel_plots_or_cli() {
    let deps = light_deps();
    for banned in [
        "axum",
        "clap",
        "plotters",
        "opentelemetry",
        "opentelemetry_sdk",
        "utoipa",
        "tracing-opentelemetry",
        "indicatif",
        "hdrhistogram",
        // The JavaScript engine is the default feature `programs`.
        "arbor-programs",
        "rquickjs",
        "oxc",
    ] {
        assert!(
            !deps.iter().any(|d| d == banned),
            "arbor-agents without default features depends on {banned}"
        );
    }
    for needed in ["reqwest", "rmcp", "arbor-supervisor", "toml"] {
        assert!(
            deps.iter().any(|d| d == needed),
            "arbor-agents without default features lacks {needed}"
        );
    }
}

/// Every `Result<…, String>` of `code` (as `production_code` gives it) that
/// is public API: in an item declared `pub` (not `pub(crate)` or
/// `pub(super)`), or in a `pub trait` or `pub enum`. Each as the item's text
/// up to it, trimmed. A `pub` item of a private module counts too.
fn public_string_results(code: &str) -> Vec<String> {
    let bytes = code.as_bytes();
    let is_pub = |header: &str| {
        header.match_indices("pub").any(|(at, _)| {
            let before = header[..at].chars().next_back();
            let after = header[at + 3..].chars().next();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                && after.is_some_and(char::is_whitespace)
        })
    };
    // The text of the item (or statement) that `at` is in, from the end of
    // the one before.
    let header_before = |at: usize| {
        let start = code[..at].rfind([';', '{', '}']).map_or(0, |i| i + 1);
        &code[start..at]
    };
    let mut found = Vec::new();
    for (at, _) in code.match_indices("Result<") {
        if code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        // The generic arguments, split at the commas outside any bracket
        // (a `->` in a `dyn Fn(…) -> …` closes nothing).
        let open = at + "Result".len();
        let mut depth = 0i32;
        let mut args = vec![open + 1];
        let mut close = None;
        for i in open..bytes.len() {
            match bytes[i] {
                b'<' | b'(' | b'[' => depth += 1,
                b'>' if i > 0 && bytes[i - 1] == b'-' => {}
                b'>' | b')' | b']' => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(i);
                        break;
                    }
                }
                b',' if depth == 1 => args.push(i + 1),
                _ => {}
            }
        }
        let Some(close) = close else { continue };
        let last = code[*args.last().unwrap()..close].trim();
        if args.len() < 2 || last != "String" {
            continue;
        }
        let header = header_before(at);
        let mut public = is_pub(header);
        if !public {
            // The block around it: a `pub trait`'s methods and a `pub
            // enum`'s variants are public.
            let mut depth = 0;
            let mut i = at;
            while i > 0 {
                i -= 1;
                match bytes[i] {
                    b'}' => depth += 1,
                    b'{' if depth == 0 => {
                        let around = header_before(i);
                        public = is_pub(around)
                            && (around.contains("trait ") || around.contains("enum "));
                        break;
                    }
                    b'{' => depth -= 1,
                    _ => {}
                }
            }
        }
        if public {
            let line = code[..at].matches('\n').count() + 1;
            found.push(format!("line {line}: {}", header.trim()));
        }
    }
    found
}

/// Errors are typed in every crate's public API (issue 35): no public
/// function, type, trait method or enum variant returns or holds a
/// `Result<_, String>`, whose error a caller can only print.
#[test]
fn no_public_api_returns_a_string_error() {
    let mut found = Vec::new();
    for (dir, _, _) in CRATES {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        let mut stack = vec![root];
        while let Some(path) = stack.pop() {
            for entry in std::fs::read_dir(&path).unwrap() {
                let path = entry.unwrap().path();
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if path.is_dir() {
                    if name != "tests" {
                        stack.push(path);
                    }
                } else if path.extension().is_some_and(|e| e == "rs") && name != "tests.rs" {
                    let code = production_code(&std::fs::read_to_string(&path).unwrap());
                    for hit in public_string_results(&code) {
                        found.push(format!("{}: {hit}", path.display()));
                    }
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "public Result<_, String>:\n{}",
        found.join("\n")
    );
    // What the search sees.
    let seen = public_string_results(
        "pub fn a() -> Result<u8, String> {}\n\
         pub(crate) fn b() -> Result<u8, String> {}\n\
         fn c() -> Result<u8, Error> {}\n\
         pub trait T { fn d(&self) -> Result<(), String>; }\n\
         pub type E = Box<dyn Fn(&str) -> Result<Vec<u8>, String>>;\n\
         pub enum O { Done(Result<u8, String>) }\n\
         fn f() { let g = |x: u8| -> Result<u8, String> { Ok(x) }; }\n\
         pub fn h() -> io::Result<String> {}\n",
    );
    let lines: Vec<&str> = seen.iter().map(|s| &s[..s.find(':').unwrap()]).collect();
    assert_eq!(lines, ["line 1", "line 4", "line 5", "line 6"], "{seen:#?}");
}

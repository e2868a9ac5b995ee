//! The dependency direction of the workspace: actors ← supervisor ← arbor, and
//! the lower crates pull in no HTTP, SQL, CLI or TOML crate, even transitively.

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

/// The modules of `dir` (`src/NAME.rs` and `src/NAME/…`) and which of them
/// each names as `crate::OTHER` outside its tests.
fn module_graph(
    dir: &str,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut graph = std::collections::BTreeMap::new();
    let mut stack = vec![root.clone()];
    while let Some(path) = stack.pop() {
        for entry in std::fs::read_dir(&path).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(&root).unwrap();
            let module = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_owned();
            if module == "lib" {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            let uses: &mut std::collections::BTreeSet<String> =
                graph.entry(module.clone()).or_default();
            for (at, _) in code.match_indices("crate::") {
                let name: String = code[at + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !name.is_empty() && name != module {
                    uses.insert(name);
                }
            }
        }
    }
    graph
}

/// A cycle among `graph`'s modules, if there is one.
fn find_cycle(
    graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Option<Vec<String>> {
    fn visit(
        graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
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

/// The modules of `src/providers` (`NAME.rs` and `NAME/…`, the unit tests'
/// `tests.rs` files aside) and which of them each names, as
/// `crate::providers::OTHER` or as `super::OTHER` where `super` is
/// `providers`, outside its tests.
fn provider_module_graph() -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>>
{
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/providers");
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
            if module == "mod" {
                continue;
            }
            // What `super::` means here: `providers` for `NAME.rs` and
            // `NAME/mod.rs`, one more `super::` for the files below `NAME/`.
            let depth = parts.len() - usize::from(parts.last().unwrap() == "mod.rs");
            let up = "super::".repeat(depth);
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            let uses: &mut std::collections::BTreeSet<String> =
                graph.entry(module.clone()).or_default();
            for prefix in ["crate::providers::", up.as_str()] {
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
        panic!("src/providers has an import cycle: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_http_client_names_no_provider() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/providers/client.rs");
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
                "src/providers/client.rs:{} names {name}: {line}",
                n + 1
            );
        }
    }
}

#[test]
fn the_modules_of_arbor_actors_import_each_other_without_a_cycle() {
    let graph = module_graph("actors/src");
    assert!(graph.contains_key("hooks") && graph.contains_key("agent"));
    assert!(graph["agent"].contains("hooks"), "the graph sees imports");
    if let Some(cycle) = find_cycle(&graph) {
        panic!("arbor-actors has an import cycle: {}", cycle.join(" -> "));
    }
}

/// The facade's normal dependencies without default features: what an
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

//! The dependency direction of the workspace: actors ← supervisor ← arbor, and
//! the lower crates pull in no HTTP, SQL, CLI or TOML crate, even transitively.

use std::process::Command;

fn normal_deps(package: &str) -> Vec<String> {
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
    for banned in WEB
        .iter()
        .chain(&SQL)
        .chain(&["clap", "toml", "arbor-supervisor", "arbor"])
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
    for banned in WEB.iter().chain(&["clap", "arbor"]) {
        assert!(
            !deps.iter().any(|d| d == banned),
            "arbor-supervisor depends on {banned}"
        );
    }
    assert!(deps.iter().any(|d| d == "arbor-actors"));
}

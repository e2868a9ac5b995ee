//! Claude Code's sub-agent files through the binary (issue 37): a TOML
//! root spawns a loaded `.claude/agents` editor that reads and edits its
//! workspace, a workspace's `.claude/agents` runs with one command, and
//! `check-config --agents` names an unsupported field at its line.

use std::path::Path;

use arbor_test_support::{call, spawn_call};
use serde_json::{Value, json};

use crate::{arbor_in, fixtures, text};

/// A workspace with `app.py`, and a scripted config whose `lead` (TOML)
/// may spawn `editor` (the Claude Code file of
/// `tests/fixtures/claude-agents/editor`).
fn setup(dir: &Path, script: &Value) -> std::path::PathBuf {
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("app.py"), "x = 1\n").unwrap();
    std::fs::write(
        dir.join("config.toml"),
        r#"
[models.script]
provider = "scripted"
file = "script.json"

[agents.lead]
model = "script"
spawnable_agents = ["editor"]
"#,
    )
    .unwrap();
    std::fs::write(dir.join("script.json"), script.to_string()).unwrap();
    std::fs::canonicalize(&ws).unwrap()
}

/// The editor's steps: read `app.py`, edit it, done.
fn editor_steps(app: &str) -> Value {
    json!([
        {"toolCalls": [call("Read", json!({"file_path": app}))]},
        {"toolCalls": [call("Edit", json!({"file_path": app, "old_string": "x = 1", "new_string": "x = 2"}))]},
        {"text": "DONE"}
    ])
}

/// The tool results of the `agent_type` run's final state, by tool name.
fn results(stderr: &[u8], agent_type: &str) -> Vec<(String, String)> {
    let events: Vec<Value> = text(stderr)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let finished = events
        .iter()
        .find(|e| e["type"] == "agentFinished" && e["state"]["agentType"] == agent_type)
        .unwrap_or_else(|| panic!("{agent_type} finished: {}", text(stderr)));
    finished["state"]["messageHistory"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["toolName"].as_str().unwrap().to_owned(),
                m["content"].to_string(),
            )
        })
        .collect()
}

#[test]
fn a_toml_root_spawns_a_claude_code_agent_file_that_reads_and_edits_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let app = dir.path().join("ws/app.py");
    let app = app.display().to_string();
    let script = json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("editor", "make x 2 in app.py")])]},
            {"text": "done"}
        ]},
        {"agent": "editor", "steps": editor_steps(&app)}
    ]});
    let ws = setup(dir.path(), &script);
    let editors = fixtures().join("claude-agents/editor");
    let out = arbor_in(
        dir.path(),
        &[
            "run",
            "--config",
            "config.toml",
            "--agents",
            editors.to_str().unwrap(),
            "--no-store",
            "--workspace",
            ws.to_str().unwrap(),
            "--agent",
            "lead",
            "--events",
            "fix app.py",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(ws.join("app.py")).unwrap(),
        "x = 2\n"
    );
    let results = results(&out.stderr, "editor");
    let names: Vec<&str> = results.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["Read", "Edit"]);
    assert!(results[0].1.contains("x = 1"), "{results:?}");
    // The file's own PostToolUse hook ran on its Edit.
    assert!(
        results[1].1.contains("edited: run the tests"),
        "{results:?}"
    );
}

#[test]
fn a_workspaces_claude_agents_directory_runs_with_one_command() {
    let dir = tempfile::tempdir().unwrap();
    let app = dir.path().join("ws/app.py");
    let app = app.display().to_string();
    let script = json!({"replies": [{"agent": "editor", "steps": editor_steps(&app)}]});
    let ws = setup(dir.path(), &script);
    std::fs::create_dir_all(ws.join(".claude/agents")).unwrap();
    std::fs::copy(
        fixtures().join("claude-agents/editor/editor.md"),
        ws.join(".claude/agents/editor.md"),
    )
    .unwrap();
    let config = dir.path().join("config.toml");
    // Run where the workspace is: its .claude/agents is loaded by default,
    // and the editor (model: inherit, a root) runs on the only model.
    let out = arbor_in(
        &ws,
        &[
            "run",
            "--config",
            config.to_str().unwrap(),
            "--tree-id",
            "tws",
            "--agent",
            "editor",
            "fix app.py",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "DONE");
    assert_eq!(
        std::fs::read_to_string(ws.join("app.py")).unwrap(),
        "x = 2\n"
    );
    // Every command there reads the same config: lead (TOML) spawns the
    // editor the directory defines, so without it the config would not load.
    let out = arbor_in(&ws, &["runs", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("tws"), "{}", text(&out.stdout));
}

#[test]
fn check_config_names_an_unsupported_field_of_an_agent_file_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), &json!({"replies": []}));
    std::fs::write(
        dir.path().join("config.toml"),
        "[models.script]\nprovider = \"scripted\"\nfile = \"script.json\"\n\n\
         [agents.lead]\nmodel = \"script\"\n",
    )
    .unwrap();
    let agents = dir.path().join("agents");
    std::fs::create_dir_all(&agents).unwrap();
    std::fs::write(
        agents.join("code-reviewer.md"),
        "---\nname: code-reviewer\ndescription: Reviews code for quality and best practices\n\
         memory: user\n---\n\nYou are a code reviewer.\n",
    )
    .unwrap();
    let out = arbor_in(
        dir.path(),
        &["check-config", "config.toml", "--agents", "agents"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("agents/code-reviewer.md:4: memory: is not supported"),
        "{stderr}"
    );
    // Without the field it passes, and counts the loaded agent.
    std::fs::write(
        agents.join("code-reviewer.md"),
        "---\nname: code-reviewer\ndescription: Reviews code\ntools: Read, Grep\n---\n\nYou review.\n",
    )
    .unwrap();
    let out = arbor_in(
        dir.path(),
        &["check-config", "config.toml", "--agents", "agents"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("2 agents"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn a_stored_tree_replays_on_the_agent_files_it_started_with_after_they_changed() {
    let dir = tempfile::tempdir().unwrap();
    let app = dir.path().join("ws/app.py");
    let app = app.display().to_string();
    let script = json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("editor", "make x 2 in app.py")])]},
            {"text": "done"}
        ]},
        {"agent": "editor", "steps": editor_steps(&app)}
    ]});
    let ws = setup(dir.path(), &script);
    // The config names the directory itself this time.
    let config = std::fs::read_to_string(dir.path().join("config.toml")).unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        format!("{config}\n[agents]\ninclude = [\"editors\"]\n"),
    )
    .unwrap();
    let editors = dir.path().join("editors");
    std::fs::create_dir_all(&editors).unwrap();
    let editor =
        std::fs::read_to_string(fixtures().join("claude-agents/editor/editor.md")).unwrap();
    std::fs::write(editors.join("editor.md"), &editor).unwrap();
    let out = arbor_in(
        dir.path(),
        &[
            "run",
            "--config",
            "config.toml",
            "--tree-id",
            "tfiles",
            "--workspace",
            ws.to_str().unwrap(),
            "--agent",
            "lead",
            "--quiet",
            "fix app.py",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(&app).unwrap(), "x = 2\n");
    // The file loses its Edit tool: run on it, the editor's Edit call would
    // be refused and its state differ. The replay (no --config: the config
    // the tree stored) runs on the stored file.
    std::fs::write(
        editors.join("editor.md"),
        editor.replace("tools: Read, Edit", "tools: Read"),
    )
    .unwrap();
    // The replay runs the tools again: the workspace as it was.
    std::fs::write(&app, "x = 1\n").unwrap();
    let out = arbor_in(dir.path(), &["replay", "tfiles"]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// README's "Bring your agents" config, in a project whose
/// `.claude/agents` holds Claude Code's documented reviewer: the config
/// checks, and the reviewer runs on the model its `sonnet` names.
#[test]
fn readmes_claude_code_config_loads_a_projects_agents() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let section = readme
        .split("## Bring your agents")
        .nth(1)
        .expect("README has a \"## Bring your agents\" section");
    let block = section
        .split("```toml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("with a ```toml block");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), block).unwrap();
    std::fs::create_dir_all(dir.path().join(".claude/agents")).unwrap();
    std::fs::copy(
        fixtures().join("claude-agents/docs/code-reviewer.md"),
        dir.path().join(".claude/agents/code-reviewer.md"),
    )
    .unwrap();
    let out = arbor_in(dir.path(), &["check-config"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = arbor_in(dir.path(), &["agents"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listing = text(&out.stdout);
    assert!(
        listing
            .lines()
            .any(|l| l.starts_with("code-reviewer") && l.contains("model=claude")),
        "{listing}"
    );
}

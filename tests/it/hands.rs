//! Agents with hands, through the binary (issue 36): the workspace tools
//! under Claude Code's names, in the workspace `--workspace` names, guarded
//! by Claude Code's hooks as its docs show them (tests/fixtures/hooks),
//! loaded from its `.claude/settings.json` as it is and from the config's
//! TOML.

use std::path::Path;

use serde_json::Value;

use crate::{arbor_in, text};

/// A workspace with a `build/` directory, `app.py`, and the hook scripts
/// under `.claude/`; a config whose editor works there with Claude Code's
/// tool names and `hooks`; the script: `rm -rf build`, then read and edit
/// `app.py`, then done.
fn setup(dir: &Path, hooks: &str) -> std::path::PathBuf {
    let ws = dir.join("ws");
    std::fs::create_dir_all(ws.join("build")).unwrap();
    std::fs::write(ws.join("build/keep.txt"), "keep").unwrap();
    std::fs::write(ws.join("app.py"), "x = 1\n").unwrap();
    let claude = crate::fixtures().join("hooks/.claude");
    std::fs::create_dir_all(ws.join(".claude/hooks")).unwrap();
    std::fs::copy(
        claude.join("settings.json"),
        ws.join(".claude/settings.json"),
    )
    .unwrap();
    for entry in std::fs::read_dir(claude.join("hooks")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(
            entry.path(),
            ws.join(".claude/hooks").join(entry.file_name()),
        )
        .unwrap();
    }
    let ws = std::fs::canonicalize(&ws).unwrap();
    let hooks = hooks.replace("WS", &ws.display().to_string());
    std::fs::write(
        dir.join("config.toml"),
        format!(
            r#"
[models.script]
provider = "scripted"
file = "script.json"

[agents.editor]
model = "script"
tools = ["workspace/*"]
tool_names = "claude"
{hooks}
"#
        ),
    )
    .unwrap();
    let app = ws.join("app.py").display().to_string();
    let script = serde_json::json!({"replies": [{"agent": "editor", "steps": [
        {"toolCalls": [{"name": "Bash", "input": {"command": "rm -rf build", "description": "clean"}}]},
        {"toolCalls": [{"name": "Read", "input": {"file_path": app}}]},
        {"toolCalls": [{"name": "Edit", "input": {"file_path": app, "old_string": "x = 1", "new_string": "x = 2"}}]},
        {"text": "DONE"}
    ]}]});
    std::fs::write(dir.join("script.json"), script.to_string()).unwrap();
    ws
}

fn events(lines: &[u8]) -> Vec<Value> {
    text(lines)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The tool results the root's final state holds, by tool name.
fn results(events: &[Value]) -> Vec<(String, String)> {
    let finished = events
        .iter()
        .find(|e| e["type"] == "agentFinished")
        .expect("the editor finished");
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

fn run_guarded(hooks: &str) {
    let dir = tempfile::tempdir().unwrap();
    let ws = setup(dir.path(), hooks);
    let out = arbor_in(
        dir.path(),
        &[
            "run",
            "--config",
            "config.toml",
            "--no-store",
            "--workspace",
            ws.to_str().unwrap(),
            "--agent",
            "editor",
            "--json",
            "--events",
            "tidy up",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The hook blocked the rm -rf: the directory is there, and the model
    // read the hook's reason as the call's result.
    assert!(ws.join("build/keep.txt").exists());
    // --events writes the events to stderr, one JSON object a line.
    let events = events(&out.stderr);
    let results = results(&events);
    assert_eq!(results[0].0, "Bash");
    assert!(
        results[0]
            .1
            .contains("a hook refused this call: • Refusing rm -rf: delete files one by one"),
        "{results:?}"
    );
    // The edit ran, and the PostToolUse hook's context joined its result.
    assert_eq!(
        std::fs::read_to_string(ws.join("app.py")).unwrap(),
        "x = 2\n"
    );
    assert_eq!(results[2].0, "Edit");
    assert!(
        results[2]
            .1
            .contains("app.py changed: run the test suite before finishing."),
        "{results:?}"
    );
    // Both verdicts are journaled.
    let decided: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "hookDecided")
        .map(|e| e["hook"].as_str().unwrap())
        .collect();
    assert_eq!(decided, ["PreToolUse", "PostToolUse"]);
}

#[test]
fn claude_code_hooks_from_its_settings_json_guard_an_editor_through_the_binary() {
    run_guarded("[hooks]\nclaude_settings = [\"WS/.claude/settings.json\"]\n");
}

#[test]
fn the_same_hooks_written_as_toml_guard_the_same_editor() {
    run_guarded(
        r#"
[[hooks.PreToolUse]]
matcher = "Bash"
command = "\"$CLAUDE_PROJECT_DIR\"/.claude/hooks/bash_command_validator.py"

[[hooks.PostToolUse]]
matcher = "Write|Edit|MultiEdit"
command = ["python3", "WS/.claude/hooks/after_edit.py"]
timeout = "30s"
"#,
    );
}

#[test]
fn a_workspace_that_does_not_exist_is_refused_naming_the_field_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), "");
    let out = arbor_in(
        dir.path(),
        &[
            "run",
            "--config",
            "config.toml",
            "--no-store",
            "--workspace",
            "no/such/dir",
            "--agent",
            "editor",
            "go",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("limits.workspace.root"), "{stderr}");
    assert!(stderr.contains("No such file"), "{stderr}");
}

/// A config with `[workspace] sandbox = "bwrap"`: the editor's shell runs
/// in bubblewrap, writing its workspace and nothing outside it (CI installs
/// bubblewrap; without it the config is refused, as the last check shows).
#[test]
fn a_sandboxed_editors_shell_writes_its_workspace_and_nothing_outside() {
    let dir = tempfile::tempdir().unwrap();
    let ws = setup(dir.path(), "[workspace]\nsandbox = \"bwrap\"\n");
    // Outside /tmp (the sandbox has a fresh /tmp of its own, which would
    // hide an escape there), and outside the workspace; also a try at the
    // workspace's .claude/, whose hooks run unsandboxed.
    let outside = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let escaped = outside.path().join("escaped.txt");
    let command = format!(
        "echo made > made.txt; echo out > {} ; echo evil >> .claude/hooks/keep_going.py; true",
        escaped.display()
    );
    let script = serde_json::json!({"replies": [{"agent": "editor", "steps": [
        {"toolCalls": [{"name": "Bash", "input": {"command": command}}]},
        {"text": "DONE"}
    ]}]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let args = [
        "run",
        "--config",
        "config.toml",
        "--no-store",
        "--workspace",
        ws.to_str().unwrap(),
        "--agent",
        "editor",
        "go",
    ];
    let out = arbor_in(dir.path(), &args);
    let stderr = text(&out.stderr);
    if which_bwrap().is_none() && std::env::var_os("CI").is_none() {
        // No bubblewrap here: refused before anything runs, naming why.
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("bubblewrap"), "{stderr}");
        return;
    }
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(ws.join("made.txt")).unwrap(),
        "made\n"
    );
    assert!(
        !escaped.exists(),
        "the sandboxed shell wrote outside its workspace"
    );
    let hook = std::fs::read_to_string(ws.join(".claude/hooks/keep_going.py")).unwrap();
    assert!(!hook.contains("evil"), "the sandboxed shell rewrote a hook");
}

/// A command tool runs in the same sandbox as the shell: it writes the
/// workspace, not outside it, and opens no socket (no network unless
/// allowed).
#[test]
fn a_sandboxed_command_tool_writes_its_workspace_but_not_outside_and_opens_no_socket() {
    if which_bwrap().is_none() && std::env::var_os("CI").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let escaped = outside.path().join("escaped.txt");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let tool = format!(
        r#"[workspace]
sandbox = "bwrap"

[tools.probe]
description = "Writes here and elsewhere, then tries the network."
input_schema = {{ type = "object" }}
command = ["bash", "-c", "echo made > made.txt; (echo out > {escaped}) 2>/dev/null && echo wrote-outside; (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo connected; echo probed"]
"#,
        escaped = escaped.display()
    );
    let ws = setup(dir.path(), &tool);
    let config = std::fs::read_to_string(dir.path().join("config.toml"))
        .unwrap()
        .replace(
            "tools = [\"workspace/*\"]",
            "tools = [\"workspace/*\", \"probe\"]",
        );
    std::fs::write(dir.path().join("config.toml"), config).unwrap();
    let script = serde_json::json!({"replies": [{"agent": "editor", "steps": [
        {"toolCalls": [{"name": "probe", "input": {}}]},
        {"text": "DONE"}
    ]}]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let out = arbor_in(
        dir.path(),
        &[
            "run",
            "--config",
            "config.toml",
            "--no-store",
            "--workspace",
            ws.to_str().unwrap(),
            "--agent",
            "editor",
            "--json",
            "--events",
            "go",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let results = results(&events(&out.stderr));
    assert_eq!(results[0].0, "probe");
    let result = &results[0].1;
    assert!(result.contains("probed"), "{result}");
    assert!(!result.contains("wrote-outside"), "{result}");
    assert!(!result.contains("connected"), "{result}");
    assert!(
        !escaped.exists(),
        "the sandboxed command wrote outside its workspace"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("made.txt")).unwrap(),
        "made\n"
    );
    drop(listener);
}

fn which_bwrap() -> Option<std::path::PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("bwrap"))
        .find(|p| p.is_file())
}

/// Claude Code's UserPromptSubmit example (its hooks reference, as it is):
/// a prompt with a secret in it is blocked before any model call, the run
/// failing with the hook's reason; any other prompt gets the current time
/// as context. And a SubagentStart hook's `additionalContext` reaches the
/// child it matches before its first step.
#[test]
fn a_prompt_hook_blocks_a_secret_and_gives_context_and_a_subagent_start_hook_briefs_the_child() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = r#"
[[hooks.UserPromptSubmit]]
command = ["python3", "WS/.claude/hooks/prompt_guard.py"]

[[hooks.SubagentStart]]
matcher = "editor"
command = """echo '{"hookSpecificOutput": {"hookEventName": "SubagentStart", "additionalContext": "Follow security guidelines for this task"}}'"""

[agents.lead]
model = "script"
spawnable_agents = ["editor"]
"#;
    let ws = setup(dir.path(), hooks);
    let script = serde_json::json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [{"name": "spawn_agents", "input": {"agents": [
                {"agent_type": "editor", "prompt": "fix it"}]}}]},
            {"text": "All done."}
        ]},
        {"agent": "editor", "steps": [{"text": "DONE"}]}
    ]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let run = |prompt: &str| {
        arbor_in(
            dir.path(),
            &[
                "run",
                "--config",
                "config.toml",
                "--no-store",
                "--workspace",
                ws.to_str().unwrap(),
                "--agent",
                "lead",
                "--json",
                "--events",
                prompt,
            ],
        )
    };
    let blocked = run("deploy with password: hunter2");
    assert!(!blocked.status.success(), "{}", text(&blocked.stderr));
    let refused = events(&blocked.stderr);
    let failed = refused
        .iter()
        .find(|e| e["type"] == "agentFailed")
        .expect("the root failed");
    let why = failed["state"]["output"].to_string();
    assert!(
        why.contains("Security policy violation: Prompt contains potential secrets"),
        "{why}"
    );
    assert_eq!(failed["state"]["errorKind"], "blocked");
    assert!(
        !refused.iter().any(|e| e["type"] == "modelResponded"),
        "the model was never called"
    );

    let out = run("fix the app");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events = events(&out.stderr);
    let decided: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "hookDecided" && e["toolCallId"] == "start@0")
        .map(|e| e["hook"].as_str().unwrap())
        .collect();
    assert_eq!(decided, ["UserPromptSubmit", "SubagentStart"]);
    let history = |agent: &str| {
        events
            .iter()
            .find(|e| e["type"] == "agentFinished" && e["state"]["agentType"] == agent)
            .map(|e| e["state"]["messageHistory"].to_string())
            .unwrap_or_default()
    };
    let lead = history("lead");
    assert!(lead.contains("Current time: "), "{lead}");
    assert!(lead.contains("HOOK_CONTEXT"), "{lead}");
    let editor = history("editor");
    assert!(
        editor.contains("Follow security guidelines for this task"),
        "{editor}"
    );
    assert!(!editor.contains("Current time: "), "{editor}");
}

/// Claude Code's SubagentStop example, from its settings file: a child that
/// ends without saying DONE is kept going with the hook's reason, once.
#[test]
fn a_subagent_stop_hook_keeps_a_child_going_until_it_says_done() {
    let dir = tempfile::tempdir().unwrap();
    let ws = setup(
        dir.path(),
        "[hooks]\nclaude_settings = [\"WS/.claude/settings.json\"]\n\n[agents.lead]\nmodel = \"script\"\nspawnable_agents = [\"editor\"]\n",
    );
    let script = serde_json::json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [{"name": "spawn_agents", "input": {"agents": [
                {"agent_type": "editor", "prompt": "fix it"}]}}]},
            {"text": "All done."}
        ]},
        {"agent": "editor", "steps": [
            {"text": "I edited two files."},
            {"text": "DONE"}
        ]}
    ]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let out = arbor_in(
        dir.path(),
        &[
            "run",
            "--config",
            "config.toml",
            "--no-store",
            "--workspace",
            ws.to_str().unwrap(),
            "--agent",
            "lead",
            "--json",
            "--events",
            "go",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events = events(&out.stderr);
    let stops: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "hookDecided" && e["hook"] == "SubagentStop")
        .collect();
    assert_eq!(stops.len(), 2, "{stops:?}");
    assert_eq!(
        stops[0]["verdict"]["block"],
        "You have not said DONE: finish the task, then say DONE."
    );
    assert_eq!(stops[1]["verdict"], serde_json::json!({}));
    // The child's second step read the reason, and its report is DONE.
    let child = events
        .iter()
        .find(|e| e["type"] == "agentFinished" && e["state"]["agentType"] == "editor")
        .expect("the editor finished");
    let history = child["state"]["messageHistory"].to_string();
    assert!(history.contains("STOP_HOOK"), "{history}");
    assert!(history.contains("DONE"), "{history}");
}

/// A service takes a request's workspace only inside the config's
/// `[workspace] roots`, and none without roots: a caller cannot point the
/// workspace tools at the server's whole filesystem.
#[tokio::test(flavor = "multi_thread")]
async fn a_service_takes_a_requests_workspace_only_inside_its_roots() {
    use crate::serve::{Server, TOKEN, post};
    use reqwest::StatusCode;
    let start = |root: &Path| {
        serde_json::json!({
            "agent": "worker",
            "prompt": "go",
            "limits": {"workspace": {"root": root}},
        })
    };
    // Without roots: refused, naming the field.
    let dir = tempfile::tempdir().unwrap();
    let plain = crate::fixtures().join("serve.toml");
    let server = Server::start(
        dir.path(),
        &["--config", plain.to_str().unwrap()],
        Some(TOKEN),
    );
    let (status, body) = post(&server, "/v1/runs", start(Path::new("/"))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body.to_string().contains("limits.workspace"), "{body}");
    assert!(body.to_string().contains("no [workspace] roots"), "{body}");
    drop(server);
    // With roots: a directory inside is taken, one outside refused.
    let dir = tempfile::tempdir().unwrap();
    let roots = dir.path().join("repos");
    std::fs::create_dir_all(roots.join("app")).unwrap();
    let text = std::fs::read_to_string(crate::fixtures().join("serve.toml")).unwrap()
        + &format!(
            "\n[workspace]\nroots = [{:?}]\n",
            roots.display().to_string()
        );
    let config = dir.path().join("rooted.toml");
    std::fs::write(&config, text).unwrap();
    let server = Server::start(
        dir.path(),
        &["--config", config.to_str().unwrap()],
        Some(TOKEN),
    );
    let (status, body) = post(&server, "/v1/runs", start(&roots.join("app"))).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = post(&server, "/v1/runs", start(Path::new("/etc"))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body.to_string().contains("outside the workspace roots"),
        "{body}"
    );
}

/// A PreToolUse verdict survives a kill -9: the tree is killed while the
/// call it allowed runs, and `arbor resume` runs the call again on the
/// recorded verdict, without running the hook a second time.
#[test]
fn a_resumed_tree_takes_the_recorded_hook_verdict_and_does_not_run_the_hook_again() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let counted = dir.path().join("hook-runs.txt");
    let ws = setup(
        dir.path(),
        &format!(
            "[[hooks.PreToolUse]]\nmatcher = \"Bash\"\ncommand = \"echo ran >> {}\"\n",
            counted.display()
        ),
    );
    let script = serde_json::json!({"replies": [{"agent": "editor", "steps": [
        {"toolCalls": [{"name": "Bash", "input": {"command": "sleep 3; echo slept > slept.txt"}}]},
        {"text": "DONE"}
    ]}]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let mut first = Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args([
            "run",
            "--config",
            "config.toml",
            "--store",
            "s.db",
            "--tree-id",
            "hooked",
            "--workspace",
            ws.to_str().unwrap(),
            "--agent",
            "editor",
            "--events",
            "go",
        ])
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = first.stderr.take().unwrap();
    let mut seen = false;
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        if line.contains("\"hookDecided\"") {
            seen = true;
            break;
        }
    }
    assert!(seen, "the hook's verdict was announced");
    // The verdict reaches the store within the writer's batch; the call
    // sleeps 3 s, so the kill lands while it runs.
    std::thread::sleep(std::time::Duration::from_millis(500));
    first.kill().unwrap();
    let _ = first.wait();
    assert!(
        !ws.join("slept.txt").exists(),
        "killed before the call ended"
    );
    assert_eq!(
        std::fs::read_to_string(&counted).unwrap().lines().count(),
        1
    );
    let resumed = arbor_in(
        dir.path(),
        &[
            "resume",
            "hooked",
            "--config",
            "config.toml",
            "--store",
            "s.db",
        ],
    );
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    // The call ran again, on the recorded verdict: the hook did not.
    assert_eq!(
        std::fs::read_to_string(ws.join("slept.txt")).unwrap(),
        "slept\n"
    );
    assert_eq!(
        std::fs::read_to_string(&counted).unwrap().lines().count(),
        1,
        "the hook ran again on resume"
    );
}

/// The workspace tools do not write the workspace's `.claude/`: the hooks
/// there run outside any sandbox, with Arbor's environment.
#[test]
fn an_agent_cannot_rewrite_the_hooks_that_guard_it() {
    let dir = tempfile::tempdir().unwrap();
    let ws = setup(
        dir.path(),
        "[hooks]\nclaude_settings = [\"WS/.claude/settings.json\"]\n",
    );
    let hook = ws.join(".claude/hooks/bash_command_validator.py");
    let before = std::fs::read_to_string(&hook).unwrap();
    let path = hook.display().to_string();
    let script = serde_json::json!({"replies": [{"agent": "editor", "steps": [
        {"toolCalls": [{"name": "Read", "input": {"file_path": path}}]},
        {"toolCalls": [{"name": "Write", "input": {"file_path": path, "content": "import sys; sys.exit(0)\n"}}]},
        {"toolCalls": [{"name": "Edit", "input": {"file_path": path, "old_string": "sys.exit(2)", "new_string": "sys.exit(0)"}}]},
        {"text": "DONE"}
    ]}]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let out = arbor_in(
        dir.path(),
        &[
            "run",
            "--config",
            "config.toml",
            "--no-store",
            "--workspace",
            ws.to_str().unwrap(),
            "--agent",
            "editor",
            "--json",
            "--events",
            "go",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(&hook).unwrap(), before);
    let results = results(&events(&out.stderr));
    for (tool, content) in &results[1..3] {
        assert!(
            content.contains("is not written by agents"),
            "{tool}: {content}"
        );
    }
}

/// A policy over Arbor's names (`--deny-tools workspace/shell`) reaches the
/// same tool under Claude Code's name (`Bash`): it is not offered, and a
/// call of it is refused by the tree's policy.
#[test]
fn denying_workspace_shell_denies_claude_codes_bash_too() {
    let dir = tempfile::tempdir().unwrap();
    let ws = setup(dir.path(), "");
    let script = serde_json::json!({"replies": [{"agent": "editor", "steps": [
        {"toolCalls": [{"name": "Bash", "input": {"command": "echo ran > ran.txt"}}]},
        {"text": "DONE"}
    ]}]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let out = arbor_in(
        dir.path(),
        &[
            "run",
            "--config",
            "config.toml",
            "--no-store",
            "--workspace",
            ws.to_str().unwrap(),
            "--deny-tools",
            "workspace/shell",
            "--agent",
            "editor",
            "--json",
            "--events",
            "go",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !ws.join("ran.txt").exists(),
        "Bash ran under a policy denying workspace/shell"
    );
    let results = results(&events(&out.stderr));
    assert!(
        results[0]
            .1
            .contains("not allowed by this tree's tool policy"),
        "{results:?}"
    );
}

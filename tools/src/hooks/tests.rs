//! Hooks run for real: Claude Code's documented kinds of hook, as Python
//! scripts under tests/fixtures/hooks/.claude, from its settings.json as it
//! is and from the config's TOML.

use std::path::PathBuf;

use arbor_actors::lifecycle::Permission;
use serde_json::json;

use super::*;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/hooks")
}

fn ctx() -> HookCall {
    HookCall {
        tree_id: "t1".into(),
        run_id: "t1/0".into(),
        agent_type: Some("editor".into()),
        workspace: None,
    }
}

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

fn from_settings() -> HookSet {
    let section = HooksSection {
        claude_settings: vec![".claude/settings.json".into()],
        ..HooksSection::default()
    };
    HookSet::from_section(&section, &fixtures()).expect("the settings file loads")
}

fn bash(command: &str) -> Map<String, Value> {
    object(json!({
        "tool_name": "Bash",
        "tool_input": {"command": command, "description": "run it"},
        "tool_use_id": "call_1",
    }))
}

#[tokio::test]
async fn claude_codes_bash_validator_from_settings_json_blocks_rm_rf_with_its_reason() {
    let hooks = from_settings();
    let verdict = hooks
        .run(HookEvent::PreToolUse, "Bash", bash("rm -rf build"), &ctx())
        .await;
    assert!(verdict.refuses_call(), "{verdict:?}");
    assert_eq!(
        verdict.refusal(),
        "a hook refused this call: • Refusing rm -rf: delete files one by one"
    );
    let fine = hooks
        .run(HookEvent::PreToolUse, "Bash", bash("ls -la"), &ctx())
        .await;
    assert!(!fine.refuses_call(), "{fine:?}");
    assert!(fine.is_empty(), "{fine:?}");
    // Another tool's calls do not run the Bash hooks at all.
    assert!(!hooks.wants(HookEvent::PreToolUse, "Read"));
}

#[tokio::test]
async fn a_pre_tool_use_hook_rewrites_the_input_and_allows_the_call() {
    let hooks = from_settings();
    let verdict = hooks
        .run(HookEvent::PreToolUse, "Bash", bash("npm test"), &ctx())
        .await;
    assert_eq!(verdict.permission, Some(Permission::Allow));
    assert_eq!(
        verdict.updated_input,
        Some(json!({"command": "npm test -- --ci", "description": "run it"}))
    );
    assert_eq!(verdict.reason.as_deref(), Some("npm test runs in CI mode"));
}

#[tokio::test]
async fn a_post_tool_use_hook_adds_context_after_a_matching_tool() {
    let hooks = from_settings();
    let input = object(json!({
        "tool_name": "Edit",
        "tool_input": {"file_path": "/w/app.py", "old_string": "a", "new_string": "b"},
        "tool_response": {"success": true},
    }));
    let verdict = hooks
        .run(HookEvent::PostToolUse, "Edit", input, &ctx())
        .await;
    assert_eq!(
        verdict.note_for_model().as_deref(),
        Some("/w/app.py changed: run the test suite before finishing.")
    );
    assert!(!hooks.wants(HookEvent::PostToolUse, "Read"));
}

#[tokio::test]
async fn a_subagent_stop_hook_keeps_the_sub_agent_going_once() {
    let hooks = from_settings();
    let stop = |active: bool, said: &str| {
        object(json!({"stop_hook_active": active, "last_assistant_message": said}))
    };
    let verdict = hooks
        .run(
            HookEvent::SubagentStop,
            "editor",
            stop(false, "I edited two files."),
            &ctx(),
        )
        .await;
    assert_eq!(
        verdict.block.as_deref(),
        Some("You have not said DONE: finish the task, then say DONE.")
    );
    let again = hooks
        .run(
            HookEvent::SubagentStop,
            "editor",
            stop(true, "still not"),
            &ctx(),
        )
        .await;
    assert!(again.is_empty(), "{again:?}");
    let done = hooks
        .run(
            HookEvent::SubagentStop,
            "editor",
            stop(false, "DONE"),
            &ctx(),
        )
        .await;
    assert!(done.is_empty(), "{done:?}");
}

#[tokio::test]
async fn a_hook_gets_the_event_and_the_trees_ids_on_stdin_and_in_its_environment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("seen.json");
    let line = format!(
        "cat > {out}; echo \"$ARBOR_TREE_ID $ARBOR_RUN_ID $CLAUDE_PROJECT_DIR\" > {out}.env",
        out = out.display()
    );
    let toml_text = format!(
        "[[PreToolUse]]\nmatcher = \"workspace/.*\"\ncommand = {line:?}\ntimeout = \"5s\"\n"
    );
    let section: HooksSection = toml::from_str(&toml_text).expect("toml");
    let hooks = HookSet::from_section(&section, dir.path()).expect("checks");
    let input = object(json!({"tool_name": "workspace/read", "tool_input": {"path": "a"}}));
    let verdict = hooks
        .run(HookEvent::PreToolUse, "workspace/read", input, &ctx())
        .await;
    assert!(
        verdict.is_empty() && verdict.errors.is_empty(),
        "{verdict:?}"
    );
    let seen: Value = serde_json::from_str(&std::fs::read_to_string(&out).expect("the hook wrote"))
        .expect("JSON");
    assert_eq!(seen["hook_event_name"], "PreToolUse");
    assert_eq!(seen["session_id"], "t1");
    assert_eq!(seen["arbor_run_id"], "t1/0");
    assert_eq!(seen["agent_type"], "editor");
    assert_eq!(seen["tool_input"], json!({"path": "a"}));
    assert_eq!(seen["cwd"], dir.path().display().to_string());
    let env = std::fs::read_to_string(format!("{}.env", out.display())).expect("env");
    assert_eq!(env.trim(), format!("t1 t1/0 {}", dir.path().display()));
}

#[tokio::test]
async fn a_hook_past_its_timeout_is_killed_with_its_children_and_does_not_block() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pid_file = dir.path().join("child.pid");
    let section: HooksSection = toml::from_str(&format!(
        "[[Stop]]\ncommand = [\"bash\", \"-c\", \"sleep 30 & echo $! > {}; wait\"]\ntimeout = \"300ms\"\n",
        pid_file.display()
    ))
    .expect("toml");
    let hooks = HookSet::from_section(&section, dir.path()).expect("checks");
    let verdict = hooks.run(HookEvent::Stop, "", Map::new(), &ctx()).await;
    assert!(verdict.block.is_none());
    assert_eq!(verdict.errors.len(), 1, "{verdict:?}");
    assert!(
        verdict.errors[0].contains("did not finish within"),
        "{verdict:?}"
    );
    let pid = std::fs::read_to_string(&pid_file).expect("the hook started its child");
    // The group was killed: the background sleep is gone (reaped by init or
    // a zombie at most, never still sleeping).
    let mut gone = false;
    for _ in 0..50 {
        let state = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()));
        if state.map_or(true, |s| s.contains(") Z ")) {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone, "the hook's child outlived its timeout");
}

#[test]
fn bad_hook_config_is_refused_naming_each_entry() {
    let section: HooksSection = toml::from_str(
        r#"
[[PreTooluse]]
command = "true"

[[PostToolUse]]
matcher = "Edit|("
command = "true"

[[Stop]]
command = []

[[Stop]]
command = "true"
timeout = "soon"
"#,
    )
    .expect("toml");
    let problems = HookSet::from_section(&section, Path::new(".")).expect_err("refused");
    let keys: Vec<&str> = problems.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "hooks.PostToolUse[0]",
            "hooks.PreTooluse",
            "hooks.Stop[0]",
            "hooks.Stop[1]"
        ]
    );
    assert!(
        problems[1].1.contains("PreToolUse, PostToolUse"),
        "{problems:?}"
    );
    assert!(problems[0].1.contains("regular expression"), "{problems:?}");
}

#[test]
fn a_settings_file_with_a_hook_arbor_cannot_run_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("settings.json");
    std::fs::write(
        &path,
        r#"{"hooks": {"Stop": [{"hooks": [{"type": "prompt", "prompt": "Is it done?"}]}]}}"#,
    )
    .expect("write");
    let section = HooksSection {
        claude_settings: vec![path.clone()],
        ..HooksSection::default()
    };
    let problems = HookSet::from_section(&section, dir.path()).expect_err("refused");
    assert_eq!(problems.len(), 1);
    assert!(problems[0].1.contains("type \"prompt\""), "{problems:?}");
    std::fs::write(&path, "{not json").expect("write");
    let problems = HookSet::from_section(&section, dir.path()).expect_err("refused");
    assert!(
        problems[0].1.contains("is not a Claude Code settings file"),
        "{problems:?}"
    );
}

#[test]
fn matchers_are_exact_names_or_whole_name_patterns() {
    let m = |text: &str| Matcher::parse(Some(text)).expect("parses");
    assert!(m("Bash").matches("Bash"));
    assert!(!m("Bash").matches("BashOutput"));
    assert!(m("Edit|Write").matches("Write"));
    assert!(!m("Edit|Write").matches("NotebookEdit"));
    assert!(m("Notebook.*").matches("NotebookEdit"));
    assert!(m("mcp__.*__write.*").matches("mcp__fs__write_file"));
    assert!(m("*").matches("anything"));
    assert!(m("").matches("anything"));
    assert!(m("workspace/shell").matches("workspace/shell"));
}

/// An agent file's hooks (Claude Code's front matter shape) run for that
/// agent only; its `Stop` runs as `Stop` and `SubagentStop`, for it alone.
#[tokio::test]
async fn an_agent_files_hooks_run_for_that_agent_only() {
    let mut hooks = HookSet::from_section(&HooksSection::default(), &fixtures()).unwrap();
    let front = json!({
        "PreToolUse": [{"matcher": "Bash", "hooks": [
            {"type": "command", "command": "\"$CLAUDE_PROJECT_DIR\"/.claude/hooks/bash_command_validator.py"}
        ]}],
        "Stop": [{"hooks": [{"type": "command", "command": "true"}]}]
    });
    hooks.add_agent_hooks("editor", &front).unwrap();
    let verdict = hooks
        .run(HookEvent::PreToolUse, "Bash", bash("rm -rf build"), &ctx())
        .await;
    assert!(verdict.refuses_call(), "{verdict:?}");
    let other = HookCall {
        agent_type: Some("reviewer".into()),
        ..ctx()
    };
    let verdict = hooks
        .run(HookEvent::PreToolUse, "Bash", bash("rm -rf build"), &other)
        .await;
    assert!(!verdict.refuses_call(), "another agent's call: {verdict:?}");
    // Another agent's calls are not held for the editor's own hooks.
    use arbor_actors::lifecycle::Lifecycle as _;
    assert!(hooks.wants_tool(HookEvent::PreToolUse, "Bash", "editor"));
    assert!(!hooks.wants_tool(HookEvent::PreToolUse, "Bash", "reviewer"));
    assert!(hooks.wants(HookEvent::SubagentStop, "editor"));
    assert!(hooks.wants(HookEvent::Stop, "editor"));
    assert!(!hooks.wants(HookEvent::SubagentStop, "reviewer"));
    assert!(!hooks.wants(HookEvent::Stop, "reviewer"));
    // An event Arbor does not run for an agent is refused by name.
    let (key, why) = hooks
        .add_agent_hooks("editor", &json!({"SessionStart": []}))
        .unwrap_err();
    assert_eq!(key, "hooks.SessionStart");
    assert!(why.contains("not run by Arbor"), "{why}");
}

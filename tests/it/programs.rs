//! Programmatic agents in JavaScript/TypeScript through the binary (issue
//! 37): a template names a Codebuff agent file as its `program`
//! (tests/fixtures/codebuff-agents, written as Codebuff's docs show them),
//! and its `handleSteps` drives the run on the scripted model.

use std::path::Path;

use serde_json::{Value, json};

use crate::{arbor_in, text};

/// The fixtures copied to `dir/agents`, a config of `agents` beside them
/// and the script.
fn setup(dir: &Path, agents: &str, script: Value) {
    let to = dir.join("agents");
    copy_dir(&crate::fixtures().join("codebuff-agents"), &to);
    std::fs::write(
        dir.join("config.toml"),
        format!("[models.script]\nprovider = \"scripted\"\nfile = \"script.json\"\n\n{agents}"),
    )
    .unwrap();
    std::fs::write(dir.join("script.json"), script.to_string()).unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn events(lines: &[u8]) -> Vec<Value> {
    text(lines)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn run(dir: &Path, agent: &str, extra: &[&str], prompt: &str) -> std::process::Output {
    let mut args = vec![
        "run",
        "--config",
        "config.toml",
        "--no-store",
        "--agent",
        agent,
        "--json",
        "--events",
    ];
    args.extend_from_slice(extra);
    args.push(prompt);
    arbor_in(dir, &args)
}

/// The root's final state (`--json` prints it).
fn root_state(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).expect("the final state as JSON")
}

#[test]
fn the_file_explorer_program_spawns_one_picker_per_param_and_sets_its_output_without_a_model_call()
{
    let dir = tempfile::tempdir().unwrap();
    setup(
        dir.path(),
        r#"
[agents.file-explorer]
model = "script"
program = "agents/file-explorer.ts"
spawnable_agents = ["file-picker"]
output_mode = "structured_output"

[agents.file-picker]
model = "script"
"#,
        // No entry for file-explorer: a model call of its would fail the run.
        json!({"replies": [
            {"agent": "file-picker", "prompt": "area: auth", "steps": [{"text": "src/auth.rs"}]},
            {"agent": "file-picker", "prompt": "area: storage", "steps": [{"text": "src/db.rs"}]},
        ]}),
    );
    let out = run(
        dir.path(),
        "file-explorer",
        &["--params", r#"{"prompts": ["auth", "storage"]}"#],
        "add login throttling",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events = events(&out.stderr);
    let state = root_state(&out);
    assert_eq!(state["status"], "completed", "{state}");
    // Two pickers, each with its own prompt built by the imported helper.
    let spawned = events
        .iter()
        .filter(|e| e["type"] == "childSpawned" && e["agentType"] == "file-picker")
        .count();
    assert_eq!(spawned, 2);
    let call = &state["messageHistory"][1]["content"][0];
    assert_eq!(call["toolName"], "spawn_agents");
    assert_eq!(
        call["input"]["agents"][1]["prompt"],
        "Based on the overall goal \"add login throttling\", find files related to this specific area: storage"
    );
    // set_output got the spawn's result as Codebuff's toolResult.
    let results = &state["output"]["results"][0];
    assert_eq!(results["type"], "json");
    let output = results["value"].to_string();
    assert!(
        output.contains("src/auth.rs") && output.contains("src/db.rs"),
        "{output}"
    );
    // The explorer made no model call: every model event is a picker's.
    let root_run = state["runId"].clone();
    assert!(
        !events
            .iter()
            .any(|e| e["type"] == "modelResponded" && e["runId"] == root_run),
        "the explorer called the model"
    );
}

#[test]
fn a_program_with_step_text_and_step_all_hands_the_turn_to_the_model_and_reads_the_end() {
    let dir = tempfile::tempdir().unwrap();
    setup(
        dir.path(),
        r#"
[agents.steps-and-text]
model = "script"
program = "agents/steps-and-text.ts"
output_mode = "structured_output"
"#,
        // Replies go by step: step 1 is the program's STEP_TEXT, which
        // never asks the model.
        json!({"replies": [{"agent": "steps-and-text", "steps": [
            {"text": "never sent"},
            {"text": "Done thinking."}
        ]}]}),
    );
    let out = run(dir.path(), "steps-and-text", &[], "count to three");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let state = root_state(&out);
    assert_eq!(state["status"], "completed", "{state}");
    let history = state["messageHistory"].as_array().unwrap();
    // The STEP_TEXT reply, with no model call, before the model's own.
    let replies: Vec<String> = history
        .iter()
        .filter(|m| m["role"] == "assistant")
        .map(|m| m["content"].to_string())
        .collect();
    assert!(
        replies[0].contains("Working on: count to three"),
        "{replies:?}"
    );
    assert!(replies[1].contains("Done thinking."), "{replies:?}");
    assert!(!state.to_string().contains("never sent"));
    // The program saw the model's turn end and the history it left.
    assert_eq!(state["output"]["stepsComplete"], true, "{state}");
    assert!(
        state["output"]["messages"].as_u64().unwrap() >= 3,
        "{state}"
    );
}

#[test]
fn a_runaway_program_fails_its_run_with_an_error_naming_the_time_limit() {
    let dir = tempfile::tempdir().unwrap();
    setup(
        dir.path(),
        r#"
[agents.runaway]
model = "script"
program = "agents/runaway.ts"
"#,
        json!({"replies": [{"agent": "runaway", "steps": [{"text": "one step"}]}]}),
    );
    let started = std::time::Instant::now();
    let out = run(dir.path(), "runaway", &[], "spin");
    let state = root_state(&out);
    assert_eq!(state["status"], "failed", "{state}");
    assert_eq!(state["errorKind"], "program", "{state}");
    let error = state["output"]["errorMessage"].as_str().unwrap_or_default();
    assert!(
        error.contains("ran longer than its time limit of 1000 ms without yielding"),
        "{state}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
}

#[test]
fn a_program_with_a_package_import_is_a_config_error_naming_the_import_and_its_line() {
    let dir = tempfile::tempdir().unwrap();
    setup(
        dir.path(),
        r#"
[agents.needs-package]
model = "script"
program = "agents/package-import.ts"
"#,
        json!({"replies": []}),
    );
    let out = run(dir.path(), "needs-package", &[], "go");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("agents.needs-package.program"), "{stderr}");
    assert!(
        stderr.contains("package-import.ts:1: import '@codebuff/common/types/session-state': a package import cannot be resolved"),
        "{stderr}"
    );
}

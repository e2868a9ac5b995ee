//! Interactive, long-running trees through the binary: a child's report cut
//! to its share of the parent's window, a looping agent stopped, and a hung
//! tool stopped by the idle watchdog.

use serde_json::{Value, json};

use crate::{arbor_in, text};

/// Writes `config.toml` and `script.json` into a temp dir.
fn scripted(config: &str, script: &Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), config).unwrap();
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    dir
}

#[test]
fn a_child_that_answers_at_length_does_not_flood_its_parents_window() {
    let config = r#"
[models.script]
provider = "scripted"
file = "script.json"

[agents.lead]
model = "script"
spawnable_agents = ["worker"]
context_window = 2000
report_share = 0.1

[agents.worker]
model = "script"
"#;
    let long = "z".repeat(20_000);
    let script = json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [{"name": "spawn_agents", "input": {"agents": [{"agent_type": "worker", "prompt": "go"}]}}],
             "usage": {"inputTokens": 900, "outputTokens": 100}},
            {"text": "done"}
        ]},
        {"agent": "worker", "steps": [{"text": long}]}
    ]});
    let dir = scripted(config, &script);
    let out = arbor_in(dir.path(), &["run", "--no-store", "--json", "go"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let state: Value = serde_json::from_slice(&out.stdout).unwrap();
    let history = state["messageHistory"].as_array().unwrap();
    let result = history
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("the spawn result");
    let entry = &result["content"][0]["value"][0];
    let value = &entry["value"];
    // 2000 - 1000 tokens left, a tenth is 100 tokens: 400 bytes of text.
    assert_eq!(value["type"], "truncated", "{entry}");
    assert_eq!(value["text"].as_str().unwrap().len(), 400);
    let run = entry["runId"].as_str().unwrap();
    assert_eq!(value["runId"], run);
    let note = value["note"].as_str().unwrap();
    assert!(note.contains(&format!("arbor show {run}")), "{note}");
    assert!(
        value["cutBytes"].as_u64().unwrap() > 20_000 - 400,
        "{value}"
    );
}

#[test]
fn a_scripted_agent_that_loops_is_stopped_by_loop_detection() {
    let config = r#"
[models.script]
provider = "scripted"
file = "script.json"

[agents.lead]
model = "script"
tools = ["add_message"]
max_steps = 50
loop_detection = { warn_after = 2, fail_after = 4 }
"#;
    let step = json!({"toolCalls": [{"name": "add_message", "input": {"role": "user", "content": "again"}}]});
    let steps: Vec<Value> = (0..10).map(|_| step.clone()).collect();
    let script = json!({"replies": [{"agent": "lead", "steps": steps}]});
    let dir = scripted(config, &script);
    let out = arbor_in(dir.path(), &["run", "--no-store", "go"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("loop detection: add_message was called 4 times in a row"),
        "{stderr}"
    );
    assert!(
        stderr.contains("looping: add_message repeated 2 times"),
        "the warning: {stderr}"
    );
}

#[test]
fn a_command_tool_that_hangs_is_stopped_by_the_idle_timeout() {
    let config = r#"
[models.script]
provider = "scripted"
file = "script.json"

[tools.wait]
description = "waits an hour"
command = ["sleep", "3600"]
timeout = "2h"
[tools.wait.input_schema]
type = "object"

[agents.lead]
model = "script"
tools = ["wait"]
idle_timeout = "200ms"
"#;
    let script = json!({"replies": [{"agent": "lead", "steps": [
        {"toolCalls": [{"name": "wait", "input": {}}]},
        {"text": "never reached"}
    ]}]});
    let dir = scripted(config, &script);
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(["run", "--no-store", "go"])
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    // The guard: without the watchdog the run would wait out the hour.
    let Ok(out) = rx.recv_timeout(std::time::Duration::from_secs(60)) else {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
        panic!("the hung tool was not stopped within the guard");
    };
    let out = out.unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("idle_timeout = 200ms") && stderr.contains("stalled"),
        "{stderr}"
    );
}

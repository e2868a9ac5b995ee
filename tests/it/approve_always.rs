//! Issue 34 (11): "always allow this tool in this tree" (the OpenAI Agents
//! SDK's `always_approve`): one answer approves a waiting call and lets
//! every later call of its tool in the tree run without asking, in a child
//! and after a kill -9 of `arbor serve`; another tree still asks.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::approvals_restart::read_until;
use crate::serve::{Server, TOKEN, encoded, get, post};
use crate::text;

/// How long any one wait may take before the test fails (never a pass).
const GUARD: Duration = Duration::from_secs(60);

/// A writer whose `say` and `gate` calls wait for a person, and a helper
/// it spawns whose `say` calls do too.
const CONFIG: &str = r#"
[service]
bind = "127.0.0.1:0"

[models.script]
provider = "scripted"
file = "script.json"

[tools.say]
description = "Says something out loud."
input_schema = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }
command = ["echo", "{text}"]

[tools.gate]
description = "Opens a gate."
input_schema = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }
command = ["echo", "{text}"]

[agents.writer]
model = "script"
tools = ["say", "gate"]
approve = ["say", "gate"]
spawnable_agents = ["helper"]

[agents.helper]
model = "script"
tools = ["say"]
approve = ["say"]
"#;

fn call(tool: &str, text: &str) -> Value {
    json!({"name": tool, "input": {"text": text}})
}

/// The config and `steps` as the writer's script (the helper says "two").
fn setup(dir: &Path, steps: Value) -> String {
    let script = json!({"replies": [
        {"agent": "writer", "steps": steps},
        {"agent": "helper", "steps": [{"toolCalls": [call("say", "two")]}, {"text": "helped"}]}
    ]});
    std::fs::write(dir.join("script.json"), script.to_string()).unwrap();
    let config = dir.join("always.toml");
    std::fs::write(&config, CONFIG).unwrap();
    config.display().to_string()
}

/// Starts a writer tree; its tree and root run ids.
async fn start(server: &Server, prompt: &str) -> (String, String) {
    let (status, created) = post(
        server,
        "/v1/runs",
        json!({"agent": "writer", "prompt": prompt}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = |key: &str| created[key].as_str().unwrap().to_owned();
    (id("treeId"), id("runId"))
}

/// The calls of `tree` waiting now: (call id, tool).
async fn waiting(server: &Server, tree: &str) -> Vec<(String, String)> {
    let (status, listed) = get(server, &format!("/v1/trees/{tree}/approvals")).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    listed["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let text = |k: &str| a[k].as_str().unwrap().to_owned();
            (text("toolCallId"), text("tool"))
        })
        .collect()
}

/// How many `approvalRequested` events of `tool` the stream text holds.
fn asked_for(stream: &str, tool: &str) -> usize {
    stream
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|e| e["type"] == "approvalRequested" && e["tool"] == tool)
        .count()
}

/// `arbor args… --server S --token T` (off the async runtime), bounded.
async fn arbor(server: &Server, args: &[&str]) -> Output {
    let mut args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    args.extend(["--server".into(), server.base.clone()]);
    args.extend(["--token".into(), TOKEN.into()]);
    tokio::task::spawn_blocking(move || {
        let child = Command::new(env!("CARGO_BIN_EXE_arbor"))
            .args(&args)
            .env_remove("RUST_LOG")
            .env_remove("ARBOR_SERVER")
            .env_remove("ARBOR_API_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let id = child.id();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        rx.recv_timeout(GUARD).unwrap_or_else(|_| {
            let _ = Command::new("kill")
                .args(["-KILL", &id.to_string()])
                .status();
            panic!("arbor {args:?} did not exit within {GUARD:?}");
        })
    })
    .await
    .unwrap()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approving_a_tool_always_lets_its_later_calls_in_the_tree_run_unasked() {
    let dir = tempfile::tempdir().unwrap();
    // say, then a helper that says, then say again.
    let spawn = json!({"name": "spawn_agents", "input": {"agents": [
        {"agent_type": "helper", "prompt": "help"}
    ]}});
    let config = setup(
        dir.path(),
        json!([
            {"toolCalls": [call("say", "one")]},
            {"toolCalls": [spawn]},
            {"toolCalls": [call("say", "three")]},
            {"text": "done"}
        ]),
    );
    let mut server = Server::start(dir.path(), &["--config", &config], Some(TOKEN));
    server.wait_for("ready");
    let (tree, run) = start(&server, "write").await;
    read_until(&server, &run, "event: approvalRequested", 1).await;
    let pending = waiting(&server, &tree).await;
    assert_eq!(pending.len(), 1, "{pending:?}");
    let out = arbor(&server, &["approve", &tree, &pending[0].0, "--always"]).await;
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said}{}", text(&out.stderr));
    assert!(
        said.contains("say always allowed in tree"),
        "the command names the tool: {said}"
    );
    // The helper's call and the writer's next one are not asked for.
    let stream = read_until(&server, &run, "event: agentFinished", 2).await;
    assert!(stream.contains("event: approvalRuleAdded"), "{stream}");
    assert_eq!(asked_for(&stream, "say"), 1, "{stream}");
    let (_, root) = get(&server, &format!("/v1/runs/{}", encoded(&run))).await;
    assert_eq!(root["status"], "completed", "{root}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_always_allow_rule_survives_a_kill_of_the_server() {
    let dir = tempfile::tempdir().unwrap();
    // say (allowed for good), then gate (asked; the server is killed while
    // it waits), then say again after the restart.
    let config = setup(
        dir.path(),
        json!([
            {"toolCalls": [call("say", "one")]},
            {"toolCalls": [call("gate", "open")]},
            {"toolCalls": [call("say", "after")]},
            {"text": "done"}
        ]),
    );
    let mut server = Server::start(dir.path(), &["--config", &config], Some(TOKEN));
    server.wait_for("ready");
    let (tree, run) = start(&server, "write").await;
    read_until(&server, &run, "event: approvalRequested", 1).await;
    let (say, _) = waiting(&server, &tree).await.remove(0);
    let (status, body) = post(
        &server,
        &format!("/v1/trees/{tree}/approvals/{}", encoded(&say)),
        json!({"decision": "approve", "always": true}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["alwaysAllowed"], json!(["say"]), "{body}");
    assert_eq!(body["approved"], json!([say]), "{body}");
    read_until(&server, &run, "event: approvalRequested", 2).await;

    // SIGKILL while the gate waits, then a new server on the same store.
    drop(server);
    let mut server = Server::start(dir.path(), &["--config", &config], Some(TOKEN));
    server.wait_for("ready");
    read_until(&server, &run, "event: approvalRequested", 3).await;
    let pending = waiting(&server, &tree).await;
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0].1, "gate");
    let (status, body) = post(
        &server,
        &format!("/v1/trees/{tree}/approvals/{}", encoded(&pending[0].0)),
        json!({"decision": "approve"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let stream = read_until(&server, &run, "event: agentFinished", 1).await;
    assert_eq!(
        asked_for(&stream, "say"),
        1,
        "say was not asked for after the restart: {stream}"
    );
    let (_, root) = get(&server, &format!("/v1/runs/{}", encoded(&run))).await;
    assert_eq!(root["status"], "completed", "{root}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_always_allow_rule_in_one_tree_does_not_let_another_trees_calls_run() {
    let dir = tempfile::tempdir().unwrap();
    let config = setup(
        dir.path(),
        json!([
            {"toolCalls": [call("say", "one")]},
            {"toolCalls": [call("say", "again")]},
            {"text": "done"}
        ]),
    );
    let mut server = Server::start(dir.path(), &["--config", &config], Some(TOKEN));
    server.wait_for("ready");
    let (a, run_a) = start(&server, "write").await;
    read_until(&server, &run_a, "event: approvalRequested", 1).await;
    // With `all`: every waiting call's tool (here say) in tree a.
    let out = arbor(&server, &["approve", &a, "all", "--always"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stream = read_until(&server, &run_a, "event: agentFinished", 1).await;
    assert_eq!(asked_for(&stream, "say"), 1, "{stream}");

    let (b, run_b) = start(&server, "write").await;
    read_until(&server, &run_b, "event: approvalRequested", 1).await;
    let pending = waiting(&server, &b).await;
    assert_eq!(pending.len(), 1, "tree b still asks: {pending:?}");
    assert_eq!(pending[0].1, "say");
    // An always with a denial or an edited input is refused, naming why.
    for body in [
        json!({"decision": "deny", "always": true}),
        json!({"decision": "approve", "input": {"text": "x"}, "always": true}),
        json!({"decision": "approve", "always": "yes"}),
    ] {
        let (status, answer) = post(
            &server,
            &format!("/v1/trees/{b}/approvals/{}", encoded(&pending[0].0)),
            body.clone(),
        )
        .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {answer}");
        assert!(answer.to_string().contains("always"), "{answer}");
    }
    assert_eq!(waiting(&server, &b).await.len(), 1, "still waiting");
}

/// At a terminal (a pseudo-terminal through util-linux's `script`, where
/// there is one), `arbor run` offers "always": answered once, the tool's
/// later calls in the tree (the helper's, the writer's next) are not asked.
#[test]
fn arbor_run_at_a_terminal_answered_always_asks_once_for_the_tool() {
    use std::io::Write as _;
    let util_linux = Command::new("script").arg("--version").output();
    if !util_linux.is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: no `script` to give arbor run a terminal");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spawn = json!({"name": "spawn_agents", "input": {"agents": [
        {"agent_type": "helper", "prompt": "help"}
    ]}});
    setup(
        dir.path(),
        json!([
            {"toolCalls": [call("say", "one")]},
            {"toolCalls": [spawn]},
            {"toolCalls": [call("say", "three")]},
            {"text": "done"}
        ]),
    );
    let config = format!("[run]\nagent = \"writer\"\n{CONFIG}");
    std::fs::write(dir.path().join("config.toml"), config).unwrap();
    let arbor = env!("CARGO_BIN_EXE_arbor");
    let mut child = Command::new("script")
        .args([
            "-qec",
            &format!("{arbor} run --plain --no-store --json write"),
            "/dev/null",
        ])
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Kept open until the run ends: a second question would wait, not end.
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"a\n").unwrap();
    stdin.flush().unwrap();
    let id = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let Ok(out) = rx.recv_timeout(GUARD) else {
        let _ = Command::new("kill")
            .args(["-KILL", &id.to_string()])
            .status();
        panic!("arbor run at a terminal did not exit within {GUARD:?} (asked again?)");
    };
    drop(stdin);
    let out = out.unwrap();
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{shown}");
    assert_eq!(
        shown
            .matches("approve? [y]es / [a]lways (every say call in this tree)")
            .count(),
        1,
        "{shown}"
    );
    assert!(shown.contains("say always allowed in this tree"), "{shown}");
    assert!(shown.contains(r#""status": "completed""#), "{shown}");
}

/// In real Chromium: each waiting call on the page has "Always allow TOOL",
/// which sends one `always` decision; the server approves the tool's other
/// waiting calls with it, and the panel empties.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pages_always_allow_button_approves_every_waiting_call_of_the_tool() {
    let browser = crate::support::browser::Browser::new();
    let dir = tempfile::tempdir().unwrap();
    let config = setup(
        dir.path(),
        json!([
            {"toolCalls": [call("say", "a"), call("say", "b"), call("say", "c")]},
            {"toolCalls": [call("say", "d")]},
            {"text": "done"}
        ]),
    );
    let mut server = Server::start(dir.path(), &["--config", &config], Some(TOKEN));
    server.wait_for("ready");
    let (tree, run) = start(&server, "write").await;
    read_until(&server, &run, "event: suspended", 1).await;
    let report = browser
        .drive(
            &browser.script("page_always_allow.mjs"),
            &[server.base.as_str(), TOKEN, tree.as_str(), "3", "say"],
            &[],
        )
        .await;
    assert_eq!(report["button"], "Always allow say", "{report:#}");
    assert_eq!(report["status"], 202, "{report:#}");
    assert_eq!(
        report["answer"]["alwaysAllowed"],
        json!(["say"]),
        "{report:#}"
    );
    assert_eq!(report["left"], 0, "{report:#}");
    assert_eq!(
        report["requests"][0]["body"],
        json!({"decision": "approve", "always": true}),
        "{report:#}"
    );
    assert_eq!(report["consoleErrors"], json!([]), "{report:#}");
    let stream = read_until(&server, &run, "event: agentFinished", 1).await;
    assert_eq!(asked_for(&stream, "say"), 3, "d was not asked: {stream}");
}

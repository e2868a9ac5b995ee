//! Approvals from the command line (semantics §12): `arbor approvals`,
//! `arbor approve` and `arbor deny` against a real `arbor serve`, and
//! `arbor run` without a terminal, which denies rather than waits.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::serve::{Server, Sse, TOKEN, encoded, get, post, stream};
use crate::text;

/// How long any one wait may take before the test fails (never a pass).
const GUARD: Duration = Duration::from_secs(60);

/// A lead whose `echo` calls wait for a person; a store and a loopback port
/// for `arbor serve`.
const CONFIG: &str = r#"
[run]
agent = "lead"

[store]
path = "arbor.db"

[service]
bind = "127.0.0.1:0"

[models.script]
provider = "scripted"
file = "script.json"

[tools.echo]
description = "Echoes its word."
input_schema = { type = "object", properties = { word = { type = "string" } }, required = ["word"] }
command = ["echo", "{word}"]

[agents.lead]
model = "script"
tools = ["echo"]
approve = ["echo"]
"#;

/// A temp dir with the config and the script: the lead calls echo once,
/// then answers "done".
fn scene() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), CONFIG).unwrap();
    let script = json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [{"name": "echo", "input": {"word": "model"}}]},
            {"text": "done"}
        ]}
    ]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    dir
}

/// Runs `arbor` in `dir` with `args` and `envs`, stdin not a terminal (null),
/// failing the test if it has not exited within GUARD.
fn arbor_env(dir: &Path, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_arbor"));
    command
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .env_remove("ARBOR_SERVER")
        .env_remove("ARBOR_API_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in envs {
        command.env(key, value);
    }
    let child = command.spawn().unwrap();
    let id = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(GUARD) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &id.to_string()])
                .status();
            panic!("arbor {args:?} did not exit within {GUARD:?}");
        }
    }
}

/// `arbor args… --server S --token T` in `dir` (off the async runtime).
async fn cli(server: &Server, dir: &Path, args: &[&str]) -> Output {
    let dir = dir.to_owned();
    let mut args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    args.extend([
        "--server".into(),
        server.base.clone(),
        "--token".into(),
        TOKEN.into(),
    ]);
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        arbor_env(&dir, &args, &[])
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_call_is_listed_approved_with_an_edited_input_and_the_tree_completes() {
    let dir = scene();
    let mut server = Server::start(dir.path(), &["--config", "config.toml"], Some(TOKEN));
    server.wait_for("ready");
    let server = Arc::new(server);
    let (status, created) = post(
        &server,
        "/v1/runs",
        json!({"agent": "lead", "prompt": "go"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let tree_id = created["treeId"].as_str().unwrap().to_owned();
    let run_id = created["runId"].as_str().unwrap().to_owned();

    // The run's stream, read to its end in the background; each event also
    // comes here as it arrives.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Sse>();
    let streaming = {
        let server = server.clone();
        let run_id = run_id.clone();
        tokio::spawn(async move {
            stream(&server, &run_id, None, |e| {
                let _ = tx.send(e.clone());
            })
            .await
        })
    };
    let requested = tokio::time::timeout(GUARD, async {
        while let Some(e) = rx.recv().await {
            if e.event == "approvalRequested" {
                return e;
            }
        }
        panic!("the stream ended without an approvalRequested event");
    })
    .await
    .expect("an approvalRequested event within the guard");
    assert_eq!(requested.data["tool"], "echo", "{:?}", requested.data);
    assert_eq!(requested.data["input"], json!({"word": "model"}));
    let call_id = requested.data["toolCallId"].as_str().unwrap().to_owned();

    // Listed as a table …
    let listed = cli(&server, dir.path(), &["approvals"]).await;
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let table = text(&listed.stdout);
    let header = table.lines().next().unwrap_or_default();
    for column in ["TREE", "CALL", "RUN", "TOOL", "INPUT", "AGE"] {
        assert!(header.contains(column), "{table}");
    }
    let row = table
        .lines()
        .find(|l| l.contains(&call_id))
        .unwrap_or_else(|| panic!("no row for {call_id}:\n{table}"));
    for cell in [
        tree_id.as_str(),
        run_id.as_str(),
        "echo",
        r#"{"word":"model"}"#,
    ] {
        assert!(row.contains(cell), "{cell} in {row}");
    }
    // … and as JSON, for one tree, the server and token from the environment.
    let base = server.base.clone();
    let (d, t) = (dir.path().to_owned(), tree_id.clone());
    let listed = tokio::task::spawn_blocking(move || {
        arbor_env(
            &d,
            &["approvals", &t, "--json"],
            &[("ARBOR_SERVER", &base), ("ARBOR_API_TOKEN", TOKEN)],
        )
    })
    .await
    .unwrap();
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let list: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(list[0]["toolCallId"], call_id.as_str());
    assert_eq!(list[0]["treeId"], tree_id.as_str());
    assert_eq!(list[0]["runId"], run_id.as_str());

    // An edit that is not JSON is refused here, naming the flag.
    let bad = cli(
        &server,
        dir.path(),
        &["approve", &tree_id, &call_id, "--input", "{word: x}"],
    )
    .await;
    assert_eq!(bad.status.code(), Some(1));
    let err = text(&bad.stderr);
    assert!(err.contains("--input is not valid JSON"), "{err}");
    // A call no one waits for: the server's 404 is the command's error.
    let unknown = cli(
        &server,
        dir.path(),
        &["deny", &tree_id, "no-such-call", "--reason", "x"],
    )
    .await;
    assert_eq!(unknown.status.code(), Some(1));
    let err = text(&unknown.stderr);
    assert!(err.contains("no-such-call") && err.contains("404"), "{err}");

    let approved = cli(
        &server,
        dir.path(),
        &[
            "approve",
            &tree_id,
            &call_id,
            "--input",
            r#"{"word": "edited"}"#,
        ],
    )
    .await;
    assert!(approved.status.success(), "{}", text(&approved.stderr));
    assert!(
        text(&approved.stdout).contains("approved"),
        "{}",
        text(&approved.stdout)
    );

    let events = tokio::time::timeout(GUARD, streaming)
        .await
        .expect("the tree ends within the guard")
        .unwrap();
    let decided = events
        .iter()
        .find(|e| e.event == "approvalDecided")
        .expect("an approvalDecided event");
    assert_eq!(decided.data["toolCallId"], call_id.as_str());
    assert_eq!(
        decided.data["decision"],
        json!({"decision": "approve", "input": {"word": "edited"}})
    );
    let called = events
        .iter()
        .find(|e| e.event == "toolCalled")
        .expect("the call ran");
    assert_eq!(called.data["error"], Value::Null, "{:?}", called.data);
    let last = events.last().unwrap();
    assert_eq!(last.event, "agentFinished");
    assert_eq!(last.data["status"], "completed");
    // The tool ran on the edited input.
    let (status, run) = get(&server, &format!("/v1/runs/{}", encoded(&run_id))).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(tool_result(&run), Some(json!("edited\n")), "{run}");

    // Nothing waits any more.
    let listed = cli(&server, dir.path(), &["approvals", &tree_id]).await;
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    assert_eq!(text(&listed.stdout), "");
    assert!(
        text(&listed.stderr).contains("no tool call waits"),
        "{}",
        text(&listed.stderr)
    );
    // Deciding it again: the call waits no more.
    let again = cli(&server, dir.path(), &["deny", &tree_id, &call_id]).await;
    assert_eq!(again.status.code(), Some(1));
    assert!(
        text(&again.stderr).contains(&call_id),
        "{}",
        text(&again.stderr)
    );
}

#[test]
fn the_cli_says_when_the_server_cannot_be_reached() {
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on (bound, then let go).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = format!("http://127.0.0.1:{port}");
    let out = arbor_env(dir.path(), &["approvals", "--server", &server], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("cannot reach the server at"), "{err}");
    let out = arbor_env(
        dir.path(),
        &["deny", "t1", "c1", "--server", "not a url"],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("--server"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn arbor_run_without_a_terminal_denies_a_call_that_needs_approval_and_says_why() {
    let dir = scene();
    let out = arbor_env(dir.path(), &["run", "--no-store", "--json", "go"], &[]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    let reason = "no one to approve it: arbor run has no terminal (run it in arbor serve and use arbor approve)";
    assert!(err.contains("warning") && err.contains(reason), "{err}");
    assert!(err.contains("echo"), "{err}");
    let state: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(state["status"], "completed", "{state}");
    // The model read the denial instead of the tool's result.
    assert_eq!(
        tool_result(&state),
        Some(json!({"errorMessage": format!("The user denied this tool call: {reason}")})),
        "{state}"
    );
}

/// At a terminal (a pseudo-terminal through `script`, where there is one),
/// `arbor run` asks, and an edited input is what the tool runs on.
/// With `--plain`, the line log and the line prompt, so the answers can be
/// typed ahead (the live view reads keys until a question is up).
#[test]
fn arbor_run_at_a_terminal_asks_and_runs_the_edited_input() {
    use std::io::Write as _;
    // util-linux's `script` (its flags differ elsewhere).
    let util_linux = Command::new("script").arg("--version").output();
    if !util_linux.is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: no `script` to give arbor run a terminal");
        return;
    }
    let dir = scene();
    let arbor = env!("CARGO_BIN_EXE_arbor");
    let mut child = Command::new("script")
        .args([
            "-qec",
            &format!("{arbor} run --plain --no-store --json go"),
            "/dev/null",
        ])
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Kept open until the run ends: an answer nobody gave is not an end of input.
    let mut stdin = child.stdin.take().unwrap();
    // Not an answer (asked again), then an edit.
    stdin
        .write_all(b"maybe\ne\n{\"word\": \"typed\"}\n")
        .unwrap();
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
        panic!("arbor run at a terminal did not exit within {GUARD:?}");
    };
    drop(stdin);
    let out = out.unwrap();
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains("approval needed: run "), "{shown}");
    assert_eq!(
        shown
            .matches(
                "approve? [y]es / [a]lways (every echo call in this tree) / [n]o / [e]dit input:"
            )
            .count(),
        2,
        "{shown}"
    );
    assert!(shown.contains(r#""value": "typed\n""#), "{shown}");
}

/// The content of the first tool-result message anywhere in `doc`.
fn tool_result(doc: &Value) -> Option<Value> {
    match doc {
        Value::Object(map) => {
            if map.get("role") == Some(&json!("tool")) {
                return map.get("content").map(|c| c[0]["value"].clone());
            }
            map.values().find_map(tool_result)
        }
        Value::Array(items) => items.iter().find_map(tool_result),
        _ => None,
    }
}

//! `arbor watch` (issue 38 item 2): the live view of a tree another process
//! runs, followed on the store's journal (a tree an `arbor run` runs) or on
//! an `arbor serve`'s event stream, across a kill -9 and restart of the
//! server (it reconnects with `Last-Event-ID`: every run's end shown once).

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::live_view::Tmux;
use crate::serve::{Server, TOKEN, get, post};
use crate::support::{Lines, poll, wait_exit};
use crate::{arbor_in, text};

const GUARD: Duration = Duration::from_secs(60);

const CONFIG: &str = r#"
[run]
agent = "lead"

[store]
path = "arbor.db"

[models.script]
provider = "scripted"
file = "script.json"

[tools.pause]
description = "Waits some seconds."
input_schema = { type = "object", properties = { secs = { type = "string" } }, required = ["secs"] }
command = ["sleep", "{secs}"]

[agents.lead]
model = "script"
spawnable_agents = ["worker"]

[agents.worker]
model = "script"
tools = ["pause"]
"#;

/// A lead with two workers: `quick` answers, `slow` sleeps `secs` seconds in
/// a tool, then answers.
fn scene(dir: &Path, secs: u32, service: Option<u16>) {
    let mut config = CONFIG.to_owned();
    if let Some(port) = service {
        config.push_str(&format!(
            "\n[service]\nbind = \"127.0.0.1:{port}\"\nshutdown_timeout = \"5s\"\n"
        ));
    }
    std::fs::write(dir.join("config.toml"), config).unwrap();
    let script = json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [{"name": "spawn_agents", "input": {"agents": [
                {"agent_type": "worker", "prompt": "quick"},
                {"agent_type": "worker", "prompt": "slow"}
            ]}}]},
            {"text": "all done"}
        ]},
        {"agent": "worker", "prompt": "quick", "steps": [{"text": "quick"}]},
        {"agent": "worker", "prompt": "slow", "steps": [
            {"toolCalls": [{"name": "pause", "input": {"secs": secs.to_string()}}]},
            {"text": "slept"}
        ]}
    ]});
    std::fs::write(dir.join("script.json"), script.to_string()).unwrap();
}

/// `arbor run --tree-id ID go` in the background, on the scene's store.
fn run_in_background(dir: &Path, tree: &str) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(["run", "--plain", "--tree-id", tree, "go"])
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The tree's tokens as `arbor tree --json` counts them.
fn tree_tokens(dir: &Path, tree: &str) -> u64 {
    let out = arbor_in(dir, &["tree", tree, "--json"]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    doc["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["inputTokens"].as_u64().unwrap() + r["outputTokens"].as_u64().unwrap())
        .sum()
}

/// How many times each run's end line (`✓ worker 0.2 completed in …`) was
/// printed, by run path.
fn ends(log: &str) -> HashMap<String, usize> {
    let mut ends = HashMap::new();
    for line in log.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if let [mark, _agent, path, how, ..] = words[..]
            && ["✓", "✗", "○"].contains(&mark)
            && ["completed", "failed:", "cancelled"].contains(&how)
        {
            *ends.entry(path.to_owned()).or_default() += 1;
        }
    }
    ends
}

/// A tree another `arbor run` runs, watched on the store: on a terminal
/// (tmux) the view shows the slow worker's tool and the footer while it
/// runs, then the summary, whose tokens are the tree's; with `--plain`,
/// every run's start and end once, each naming its parent, and the same
/// summary.
#[test]
fn arbor_watch_follows_a_tree_another_arbor_run_runs_on_the_store() {
    let dir = tempfile::tempdir().unwrap();
    scene(dir.path(), 3, None);
    let mut run = run_in_background(dir.path(), "watched");
    // The tree is in the store once `arbor runs` lists it.
    poll(GUARD, || {
        let out = arbor_in(dir.path(), &["runs", "--json"]);
        text(&out.stdout).contains("watched").then_some(())
    })
    .expect("the tree was never stored");
    let plain = Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(["watch", "watched", "--plain"])
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let command = format!(
        "env -u NO_COLOR {} watch watched",
        env!("CARGO_BIN_EXE_arbor")
    );
    let tmux = Tmux::start(dir.path(), 110, 30, &command);
    if let Some(tmux) = &tmux {
        let running = tmux.wait_for("running pause (1 left)");
        assert!(running.contains("▸ lead 0  waiting for "), "{running}");
        assert!(
            running
                .lines()
                .any(|l| l.contains(" running · ") && l.contains(" done · ")),
            "{running}"
        );
    }
    assert!(wait_exit(&mut run, GUARD).success());
    let out = plain.wait_with_output().unwrap();
    let log = text(&out.stderr);
    assert!(out.status.success(), "{log}");
    let tokens = tree_tokens(dir.path(), "watched");
    assert!(log.contains("▸ lead watched/0 (tree watched)"), "{log}");
    assert!(log.contains("  ▸ worker 0.1 (parent 0)"), "{log}");
    assert!(log.contains("  ▸ worker 0.2 (parent 0)"), "{log}");
    let ended = ends(&log);
    assert_eq!(ended.len(), 3, "{log}");
    assert!(ended.values().all(|n| *n == 1), "{log}");
    let summary = log.lines().last().unwrap();
    assert!(
        summary.starts_with("Finished tree watched in ")
            && summary.ends_with(&format!(": 3 agents (3 completed), {tokens} tokens in all")),
        "{log}"
    );
    if let Some(tmux) = tmux {
        let done = tmux.wait_for("EXIT=");
        assert!(done.contains("EXIT=0"), "{done}");
        assert!(
            done.contains(&format!("3 agents (3 completed), {tokens} tokens in all")),
            "{done}"
        );
    }
}

/// A tree whose process was killed (kill -9) runs nowhere: `arbor watch`
/// says so at once, naming what goes on with it, instead of waiting in
/// silence; after `arbor resume`, it follows the tree to its end.
#[test]
fn arbor_watch_on_a_tree_nobody_runs_says_it_is_interrupted_then_follows_its_resume() {
    let dir = tempfile::tempdir().unwrap();
    scene(dir.path(), 3, None);
    let mut run = run_in_background(dir.path(), "orphan");
    // Killed once the slow worker's tool runs (its step is stored).
    poll(GUARD, || {
        let out = arbor_in(dir.path(), &["tree", "orphan", "--json"]);
        text(&out.stdout).contains("orphan/0.2").then_some(())
    })
    .expect("the slow worker never started");
    std::thread::sleep(Duration::from_millis(500));
    run.kill().unwrap();
    let _ = run.wait();
    let mut watch = Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(["watch", "orphan", "--plain"])
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = Lines::read(watch.stderr.take().unwrap());
    let said = lines.wait_for(GUARD, |l| l.contains("is interrupted"));
    let said = said.unwrap_or_else(|| {
        let _ = watch.kill();
        panic!("never said so: {}", lines.rest())
    });
    assert!(said.contains("`arbor resume orphan`"), "{said}");
    let resumed = arbor_in(dir.path(), &["resume", "orphan", "--quiet"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert!(wait_exit(&mut watch, GUARD).success());
    let log = lines.rest();
    assert!(log.contains("tree orphan runs again"), "{log}");
    assert!(log.contains("Finished tree orphan in "), "{log}");
}

/// A free loopback port (taken back at once: a server binds it next).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A tree in `arbor serve`, watched with --server: the server is killed
/// (SIGKILL) while the slow worker sleeps and started again on the same
/// store and port; it resumes the tree, and the watch reconnects with
/// `Last-Event-ID` and follows it to its end. Every run's end is shown
/// once, the summary's tokens are the tree's, and the exit code is 0. An
/// unknown tree is refused at once, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arbor_watch_on_a_server_survives_a_kill_and_restart_of_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    scene(dir.path(), 4, Some(port));
    let config = dir.path().join("config.toml");
    let args = ["--config", config.to_str().unwrap()];
    let mut server = Server::start(dir.path(), &args, Some(TOKEN));
    server.wait_for("ready");
    let (status, created) = post(
        &server,
        "/v1/runs",
        json!({"agent": "lead", "prompt": "go"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let tree = created["treeId"].as_str().unwrap().to_owned();

    let mut watch = Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args([
            "watch",
            &tree,
            "--plain",
            "--server",
            &server.base,
            "--token",
            TOKEN,
        ])
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = Lines::read(watch.stderr.take().unwrap());
    // The quick worker has ended; the slow one sleeps.
    lines
        .wait_for(GUARD, |l| l.contains("✓ worker 0.1 completed"))
        .expect("the quick worker's end was never shown");

    drop(server); // SIGKILL
    let mut server = Server::start(dir.path(), &args, Some(TOKEN));
    server.wait_for("ready");

    let status = wait_exit(&mut watch, GUARD);
    let log = lines.rest();
    assert!(status.success(), "{log}");
    assert!(log.contains("reconnecting"), "{log}");
    assert!(log.contains("reconnected"), "{log}");
    let ended = ends(&log);
    assert_eq!(ended.len(), 3, "{log}");
    assert!(
        ended.values().all(|n| *n == 1),
        "a run's end shown twice: {log}"
    );
    let (_, doc) = get(&server, &format!("/v1/trees/{tree}")).await;
    assert_eq!(doc["tree"]["status"], "completed", "{doc}");
    let tokens: u64 = doc["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["inputTokens"].as_u64().unwrap() + n["outputTokens"].as_u64().unwrap())
        .sum();
    let summary = log.lines().last().unwrap();
    assert!(
        summary.ends_with(&format!(": 3 agents (3 completed), {tokens} tokens in all")),
        "{tokens}: {log}"
    );

    // An unknown tree: refused, named, exit 1, no retrying.
    let unknown = Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args([
            "watch",
            "tnosuchtree",
            "--server",
            &server.base,
            "--token",
            TOKEN,
        ])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!unknown.status.success());
    let said = text(&unknown.stderr);
    assert!(said.contains("tnosuchtree"), "{said}");
    drop(server);
}

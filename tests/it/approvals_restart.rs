//! An approval pending when `arbor serve` is killed (SIGKILL) is pending again
//! after a restart; deciding it then completes the tree, and `arbor replay`
//! of that tree matches (semantics §12).

use std::path::Path;
use std::time::Duration;

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::json;

use crate::serve::{Server, TOKEN, client, encoded, get, post};

const GUARD: Duration = Duration::from_secs(60);

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

[agents.writer]
model = "script"
tools = ["say"]
approve = ["say"]
"#;

fn setup(dir: &Path) -> String {
    let script = json!({"replies": [{"agent": "writer", "steps": [
        {"text": "Saying it.", "toolCalls": [{"name": "say", "input": {"text": "hello"}}]},
        {"text": "Said."}
    ]}]});
    std::fs::write(dir.join("script.json"), script.to_string()).unwrap();
    let config = dir.join("approve.toml");
    std::fs::write(&config, CONFIG).unwrap();
    config.display().to_string()
}

/// The value of one metric of the server's `/metrics`.
async fn metric(server: &Server, name: &str) -> f64 {
    let text = client()
        .get(server.url("/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// Reads the run's event stream (from the start of its journal) until
/// `needle` has been seen `times` times; returns the text read.
pub(crate) async fn read_until(
    server: &Server,
    run_id: &str,
    needle: &str,
    times: usize,
) -> String {
    let response = client()
        .get(server.url(&format!("/v1/runs/{}/events", encoded(run_id))))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK, "the stream of {run_id}");
    let mut body = response.bytes_stream();
    let mut text = String::new();
    tokio::time::timeout(GUARD, async {
        while text.matches(needle).count() < times {
            let Some(chunk) = body.next().await else {
                panic!("the stream ended before {times}× {needle:?}: {text}");
            };
            text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {times}× {needle:?} in the stream: {text}"));
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_pending_at_a_kill_is_pending_after_the_restart_and_the_tree_replays() {
    let dir = tempfile::tempdir().unwrap();
    let config = setup(dir.path());
    let mut server = Server::start(dir.path(), &["--config", &config], Some(TOKEN));
    server.wait_for("ready");
    let (status, created) = post(
        &server,
        "/v1/runs",
        json!({"agent": "writer", "prompt": "say hello"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let tree_id = created["treeId"].as_str().unwrap().to_owned();
    let run_id = created["runId"].as_str().unwrap().to_owned();
    read_until(&server, &run_id, "event: approvalRequested", 1).await;
    let (_, listed) = get(&server, &format!("/v1/trees/{tree_id}/approvals")).await;
    assert_eq!(listed["approvals"].as_array().unwrap().len(), 1, "{listed}");
    // The waiting agent is alive but holds no live slot.
    assert_eq!(metric(&server, "arbor_approvals_pending").await, 1.0);
    assert_eq!(metric(&server, "arbor_agents_parked").await, 1.0);
    assert_eq!(metric(&server, "arbor_live_agents").await, 1.0);

    // SIGKILL, then a new server on the same store.
    drop(server);
    let mut server = Server::start(dir.path(), &["--config", &config], Some(TOKEN));
    server.wait_for("ready");
    // The resumed agent is back at its step and asks again.
    read_until(&server, &run_id, "event: approvalRequested", 2).await;
    let (_, listed) = get(&server, "/v1/approvals").await;
    let pending = listed["approvals"].as_array().unwrap();
    assert_eq!(
        pending.len(),
        1,
        "pending again after the restart: {listed}"
    );
    assert_eq!(pending[0]["tool"], "say");
    assert_eq!(pending[0]["input"], json!({"text": "hello"}));
    let call = pending[0]["toolCallId"].as_str().unwrap().to_owned();
    let (status, body) = post(
        &server,
        &format!("/v1/trees/{tree_id}/approvals/{}", encoded(&call)),
        json!({"decision": "approve"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let text = read_until(&server, &run_id, "event: agentFinished", 1).await;
    assert!(text.contains("event: approvalDecided"), "{text}");
    assert_eq!(metric(&server, "arbor_approvals_pending").await, 0.0);
    assert_eq!(metric(&server, "arbor_agents_parked").await, 0.0);
    let (_, run) = get(&server, &format!("/v1/runs/{}", encoded(&run_id))).await;
    assert_eq!(run["state"]["status"], "completed", "{run}");
    let history = run["state"]["messageHistory"].to_string();
    assert!(history.contains("hello"), "the command ran: {history}");
    // A second decision for the same call is refused: nothing waits.
    let (status, _) = post(
        &server,
        &format!("/v1/trees/{tree_id}/approvals/{}", encoded(&call)),
        json!({"decision": "deny", "reason": "late"}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    drop(server);

    let replay = crate::arbor_in(dir.path(), &["replay", "--config", &config, &tree_id]);
    let out = crate::text(&replay.stdout);
    assert!(
        replay.status.success() && out.contains("match:"),
        "{out}{}",
        crate::text(&replay.stderr)
    );
}

/// 200 approvals waiting across 50 trees of one server: listed by
/// `GET /v1/approvals`, counted by `/metrics` (50 agents parked, holding no
/// live slot), and every tree completes once all are decided over HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_approvals_across_fifty_trees_of_one_server_are_listed_and_decided() {
    let dir = tempfile::tempdir().unwrap();
    let four: Vec<serde_json::Value> = (0..4)
        .map(|n| json!({"name": "say", "input": {"text": format!("n{n}")}}))
        .collect();
    let script = json!({"replies": [{"agent": "writer", "steps": [
        {"toolCalls": four},
        {"text": "Said."}
    ]}]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let config = dir.path().join("approve.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let config = config.display().to_string();
    let mut server = Server::start(dir.path(), &["--config", &config], Some(TOKEN));
    server.wait_for("ready");
    let mut runs = Vec::new();
    for i in 0..50 {
        let (status, created) = post(
            &server,
            "/v1/runs",
            json!({"agent": "writer", "prompt": format!("say {i}")}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        runs.push((
            created["treeId"].as_str().unwrap().to_owned(),
            created["runId"].as_str().unwrap().to_owned(),
        ));
    }
    for (_, run) in &runs {
        read_until(&server, run, "event: suspended", 1).await;
    }
    let (_, listed) = get(&server, "/v1/approvals").await;
    let pending = listed["approvals"].as_array().unwrap().clone();
    assert_eq!(pending.len(), 200);
    assert_eq!(metric(&server, "arbor_approvals_pending").await, 200.0);
    assert_eq!(metric(&server, "arbor_agents_parked").await, 50.0);
    for p in &pending {
        let (tree, call) = (
            p["treeId"].as_str().unwrap(),
            p["toolCallId"].as_str().unwrap(),
        );
        let (status, body) = post(
            &server,
            &format!("/v1/trees/{tree}/approvals/{}", encoded(call)),
            json!({"decision": "approve"}),
        )
        .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    }
    for (_, run) in &runs {
        read_until(&server, run, "event: agentFinished", 1).await;
    }
    let (_, listed) = get(&server, "/v1/approvals").await;
    assert!(listed["approvals"].as_array().unwrap().is_empty());
    assert_eq!(metric(&server, "arbor_approvals_pending").await, 0.0);
}

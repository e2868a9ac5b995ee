//! Issue 34 (11): approvals and budgets say what happened. A tree paused on
//! its credit budget has the page's raise form set for credits; a raise
//! only raises (`PATCH /v1/trees/{treeId}/limits` refuses a lower budget and
//! an add to a budget the tree does not have, 422).

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::approvals_restart::read_until;
use crate::serve::{Server, TOKEN, client, post};
use crate::support::browser::Browser;

/// Credits budget 1.0 that pauses; no step budget.
const CONFIG: &str = r#"
[service]
bind = "127.0.0.1:0"
shutdown_timeout = "5s"

[limits]
max_credits = 1.0
on_budget = "pause"
deadline = "2m"

[models.script]
provider = "scripted"
file = "script.json"

[agents.spender]
model = "script"
tools = ["add_message"]
"#;

/// Starts a server on `CONFIG` and a tree whose second step waits for
/// credits (the first spent the whole 1.0); its tree id.
async fn paused_on_credits(dir: &std::path::Path) -> (Server, String) {
    let usage = json!({"inputTokens": 10, "outputTokens": 5, "cost": 1.0});
    let note = json!({"name": "add_message", "input": {"role": "user", "content": "more"}});
    let script = json!({"replies": [{"agent": "spender", "steps": [
        {"toolCalls": [note], "usage": usage},
        {"text": "spent", "usage": usage}
    ]}]});
    std::fs::write(dir.join("script.json"), script.to_string()).unwrap();
    let config = dir.join("budget.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let config = config.display().to_string();
    let mut server = Server::start(dir, &["--config", &config], Some(TOKEN));
    server.wait_for("ready");
    let (status, created) = post(
        &server,
        "/v1/runs",
        json!({"agent": "spender", "prompt": "spend"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let run_id = created["runId"].as_str().unwrap().to_owned();
    let text = read_until(&server, &run_id, "event: budgetReached", 1).await;
    assert!(!text.contains("event: agentFailed"), "{text}");
    (server, created["treeId"].as_str().unwrap().to_owned())
}

async fn patch(server: &Server, tree: &str, body: Value) -> (StatusCode, Value) {
    let r = client()
        .patch(server.url(&format!("/v1/trees/{tree}/limits")))
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status(), r.json::<Value>().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raise_that_lowers_a_budget_or_adds_to_an_unlimited_one_is_refused_with_422() {
    let dir = tempfile::tempdir().unwrap();
    let (server, tree) = paused_on_credits(dir.path()).await;
    let (status, body) = patch(&server, &tree, json!({"maxCredits": 0.5})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let said = body.to_string();
    assert!(
        said.contains("maxCredits") && said.contains("lower"),
        "{said}"
    );
    let (status, body) = patch(&server, &tree, json!({"addSteps": 10})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body.to_string().contains("addSteps"), "{body}");
    // A real raise still raises: 200 with the budgets in force.
    let (status, body) = patch(&server, &tree, json!({"addCredits": 1.5})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["maxCredits"], 2.5, "{body}");
}

/// In real Chromium: the page's raise form for a tree paused on credits is
/// set for credits (it was set for 10 steps, a budget that had not run out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_prefills_the_raise_of_the_budget_that_ran_out_not_ten_steps() {
    let browser = Browser::new();
    let dir = tempfile::tempdir().unwrap();
    let (server, tree) = paused_on_credits(dir.path()).await;
    let report = browser
        .drive(
            &browser.script("page_budget.mjs"),
            &[server.base.as_str(), TOKEN, tree.as_str()],
            &[],
        )
        .await;
    assert_eq!(report["kind"], "credits", "{report:#}");
    assert_eq!(report["amount"], "1", "{report:#}");
    assert_eq!(report["consoleErrors"], json!([]), "{report:#}");
}

/// A lead whose twenty `echo` calls of one step each wait for a person.
const MANY: &str = r#"
[service]
bind = "127.0.0.1:0"
shutdown_timeout = "5s"

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

/// Twenty waiting calls need one decision, not twenty: `arbor approve TREE
/// all` posts one decision over every call of the tree waiting now
/// (`POST /v1/trees/{treeId}/approvals`), each journaled as its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_waiting_calls_are_approved_with_one_command_not_twenty() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), MANY).unwrap();
    let calls: Vec<Value> = (0..20)
        .map(|n| json!({"name": "echo", "input": {"word": format!("w{n}")}}))
        .collect();
    let script = json!({"replies": [{"agent": "lead", "steps": [
        {"toolCalls": calls},
        {"text": "done"}
    ]}]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let mut server = Server::start(dir.path(), &["--config", "config.toml"], Some(TOKEN));
    server.wait_for("ready");
    let (status, created) = post(
        &server,
        "/v1/runs",
        json!({"agent": "lead", "prompt": "go"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let tree = created["treeId"].as_str().unwrap().to_owned();
    let run_id = created["runId"].as_str().unwrap().to_owned();
    read_until(&server, &run_id, "event: suspended", 1).await;
    let base = server.base.clone();
    let at = dir.path().to_owned();
    let out = tokio::task::spawn_blocking(move || {
        crate::arbor_in(
            &at,
            &["approve", &tree, "all", "--server", &base, "--token", TOKEN],
        )
    })
    .await
    .unwrap();
    let said = crate::text(&out.stdout);
    assert!(out.status.success(), "{said}{}", crate::text(&out.stderr));
    assert!(said.contains("approved: 20 tool calls"), "{said}");
    let text = read_until(&server, &run_id, "event: agentFinished", 1).await;
    assert_eq!(text.matches("event: approvalDecided").count(), 20, "{text}");
    assert!(!text.contains("event: agentFailed"), "{text}");
}

/// In real Chromium: the approvals panel of a tree with twenty waiting calls
/// has "Approve all 20", which sends one request for all of them (not twenty)
/// and empties the panel; the tree completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_approves_all_twenty_waiting_calls_with_one_click() {
    let browser = Browser::new();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), MANY).unwrap();
    let calls: Vec<Value> = (0..20)
        .map(|n| json!({"name": "echo", "input": {"word": format!("w{n}")}}))
        .collect();
    let script = json!({"replies": [{"agent": "lead", "steps": [
        {"toolCalls": calls},
        {"text": "done"}
    ]}]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let mut server = Server::start(dir.path(), &["--config", "config.toml"], Some(TOKEN));
    server.wait_for("ready");
    let (status, created) = post(
        &server,
        "/v1/runs",
        json!({"agent": "lead", "prompt": "go"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let tree = created["treeId"].as_str().unwrap().to_owned();
    let run_id = created["runId"].as_str().unwrap().to_owned();
    read_until(&server, &run_id, "event: suspended", 1).await;
    let report = browser
        .drive(
            &browser.script("page_approve_all.mjs"),
            &[server.base.as_str(), TOKEN, tree.as_str(), "20"],
            &[],
        )
        .await;
    assert_eq!(report["button"], "Approve all 20", "{report:#}");
    assert_eq!(report["status"], 200, "{report:#}");
    assert_eq!(report["left"], 0, "{report:#}");
    assert_eq!(
        report["requests"].as_array().map(Vec::len),
        Some(1),
        "one request, not twenty: {report:#}"
    );
    assert_eq!(report["consoleErrors"], json!([]), "{report:#}");
    let text = read_until(&server, &run_id, "event: agentFinished", 1).await;
    assert_eq!(text.matches("event: approvalDecided").count(), 20, "{text}");
}

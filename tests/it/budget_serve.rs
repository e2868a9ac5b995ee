//! A tree that pauses at its credit limit on `arbor serve`, is raised over
//! HTTP (`arbor budget`, `PATCH /v1/trees/{treeId}/limits`) and completes;
//! what it spent is what its agents did (semantics §13).

use reqwest::StatusCode;
use serde_json::json;

use crate::approvals_restart::read_until;
use crate::serve::{Server, TOKEN, client, encoded, get, post};

const CONFIG: &str = r#"
[service]
bind = "127.0.0.1:0"

[limits]
max_credits = 1.5
on_budget = "pause"

[models.script]
provider = "scripted"
file = "script.json"

[agents.spender]
model = "script"
tools = ["add_message"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_paused_at_its_credit_limit_is_raised_over_http_and_completes() {
    let dir = tempfile::tempdir().unwrap();
    let usage = json!({"inputTokens": 10, "outputTokens": 5, "cost": 1.0});
    let note = json!({"name": "add_message", "input": {"role": "user", "content": "more"}});
    let script = json!({"replies": [{"agent": "spender", "steps": [
        {"toolCalls": [note], "usage": usage},
        {"toolCalls": [note], "usage": usage},
        {"text": "spent", "usage": usage}
    ]}]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let config = dir.path().join("budget.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let config = config.display().to_string();
    let mut server = Server::start(dir.path(), &["--config", &config], Some(TOKEN));
    server.wait_for("ready");
    let (status, created) = post(
        &server,
        "/v1/runs",
        json!({"agent": "spender", "prompt": "spend"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let tree_id = created["treeId"].as_str().unwrap().to_owned();
    let run_id = created["runId"].as_str().unwrap().to_owned();
    // Two credits spent against 1.5: the third step waits.
    let text = read_until(&server, &run_id, "event: budgetReached", 1).await;
    assert!(!text.contains("event: agentFailed"), "{text}");

    // Nothing to raise, or an unknown tree: clear errors.
    let patch = |tree: String, body: serde_json::Value| {
        let url = server.url(&format!("/v1/trees/{tree}/limits"));
        async move {
            let r = client()
                .patch(url)
                .bearer_auth(TOKEN)
                .json(&body)
                .send()
                .await
                .unwrap();
            (r.status(), r.json::<serde_json::Value>().await.unwrap())
        }
    };
    let (status, body) = patch(tree_id.clone(), json!({})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (status, body) = patch("nope".into(), json!({"addCredits": 1.0})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = patch(tree_id.clone(), json!({"addCredits": -1.0})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");

    let base = server.base.clone();
    let raised = crate::arbor(&[
        "budget",
        &tree_id,
        "--add-credits",
        "2.0",
        "--server",
        &base,
        "--token",
        TOKEN,
    ]);
    assert!(raised.status.success(), "{}", crate::text(&raised.stderr));
    assert!(
        crate::text(&raised.stdout).contains("max_credits 3.5"),
        "{}",
        crate::text(&raised.stdout)
    );
    let text = read_until(&server, &run_id, "event: agentFinished", 1).await;
    assert!(text.contains("event: limitsRaised"), "{text}");
    let (_, run) = get(&server, &format!("/v1/runs/{}", encoded(&run_id))).await;
    assert_eq!(run["state"]["status"], "completed", "{run}");
    assert_eq!(run["state"]["creditsUsed"], 3.0);
    assert_eq!(
        run["state"]["directCreditsUsed"], 3.0,
        "the root is the only agent"
    );
}

//! Follow-up turns over HTTP (semantics §14), with the three multitask
//! strategies, two clients racing for `enqueue`.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::approvals_restart::read_until;
use crate::serve::{Server, TOKEN, encoded, get, post};

const CONFIG: &str = r#"
[service]
bind = "127.0.0.1:0"

[models.script]
provider = "scripted"
file = "script.json"

[agents.chat]
model = "script"
"#;

async fn turn(server: &Server, tree: &str, body: Value) -> (StatusCode, Value) {
    post(server, &format!("/v1/trees/{tree}/turns"), body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_reject_interrupt_and_enqueue_with_two_clients_racing() {
    let dir = tempfile::tempdir().unwrap();
    let script = json!({"replies": [
        {"agent": "chat", "prompt": "slow", "steps": [{"text": "slow answer", "delayMs": 60000}]},
        {"agent": "chat", "prompt": "quick", "steps": [{"text": "quick answer", "delayMs": 300}]},
        {"agent": "chat", "steps": [{"text": "answer"}]}
    ]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let config = dir.path().join("chat.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let config = config.display().to_string();
    let mut server = Server::start(dir.path(), &["--config", &config], Some(TOKEN));
    server.wait_for("ready");
    let (status, created) = post(
        &server,
        "/v1/runs",
        json!({"agent": "chat", "prompt": "slow"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let tree = created["treeId"].as_str().unwrap().to_owned();
    let root = created["runId"].as_str().unwrap().to_owned();
    read_until(&server, &root, "event: stepStarted", 1).await;

    // reject: the tree is running a turn.
    let (status, body) = turn(
        &server,
        &tree,
        json!({"prompt": "x", "multitask": "reject"}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");

    // interrupt: the running turn is cancelled, the next goes on from it
    // (queued behind it, answered at once).
    let (status, body) = turn(
        &server,
        &tree,
        json!({"prompt": "after the interrupt", "multitask": "interrupt"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let first = body["runId"].as_str().unwrap().to_owned();
    assert_eq!(first, format!("{tree}/0~1"));
    read_until(&server, &first, "event: agentFinished", 1).await;
    let (_, run) = get(&server, &format!("/v1/runs/{}", encoded(&root))).await;
    assert_eq!(run["state"]["status"], "cancelled", "{run}");

    // enqueue (the default), two clients at once: one runs (201, or 202 if
    // the last turn had not quite ended), the other is queued behind it
    // (202) and runs next; neither is refused.
    let (a, b) = tokio::join!(
        turn(&server, &tree, json!({"prompt": "quick one"})),
        turn(&server, &tree, json!({"prompt": "quick two"})),
    );
    for (status, body) in [&a, &b] {
        assert!(
            [StatusCode::CREATED, StatusCode::ACCEPTED].contains(status),
            "{status}: {body}"
        );
    }
    assert!(
        a.0 == StatusCode::ACCEPTED || b.0 == StatusCode::ACCEPTED,
        "one waits: {} {}",
        a.1,
        b.1
    );
    let mut runs = [
        a.1["runId"].as_str().unwrap().to_owned(),
        b.1["runId"].as_str().unwrap().to_owned(),
    ];
    runs.sort();
    assert_eq!(runs, [format!("{tree}/0~2"), format!("{tree}/0~3")]);
    read_until(&server, &runs[1], "event: agentFinished", 1).await;
    let (_, last) = get(&server, &format!("/v1/runs/{}", encoded(&runs[1]))).await;
    assert_eq!(last["state"]["status"], "completed", "{last}");
    let texts: Vec<String> = last["state"]["messageHistory"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect();
    // Every turn's prompt, in turn order, the interrupted one's included.
    let prompts: Vec<&String> = texts
        .iter()
        .filter(|t| t.starts_with("slow") || t.starts_with("after") || t.starts_with("quick "))
        .collect();
    assert_eq!(prompts.len(), 4, "{texts:?}");
    assert_eq!(prompts[0], "slow");
    assert_eq!(prompts[1], "after the interrupt");
    // The tree lists every turn's root.
    let (_, view) = get(&server, &format!("/v1/trees/{tree}")).await;
    let roots: Vec<&str> = view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["depth"] == 0)
        .filter_map(|n| n["runId"].as_str())
        .collect();
    assert_eq!(roots.len(), 4, "{roots:?}");
    // Unknown tree: 404.
    let (status, _) = turn(&server, "nope", json!({"prompt": "hi"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

//! `POST /v1/runs/wait` (issue 38, item 4): one call starts a tree and
//! answers with its result when it ends; a tree that outlives the timeout
//! goes on, and the answer says where to follow it.

use reqwest::StatusCode;
use serde_json::json;

use crate::serve::{Server, TOKEN, client, encoded, get, post};

fn server(dir: &std::path::Path) -> Server {
    let config = crate::fixtures().join("serve.toml");
    let mut server = Server::start(dir, &["--config", config.to_str().unwrap()], Some(TOKEN));
    server.wait_for("ready");
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_answers_with_the_ended_trees_root_and_its_final_text() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let (status, body) = post(
        &server,
        "/v1/runs/wait?timeout=30s",
        json!({"agent": "coordinator", "prompt": "Compare three sorting algorithms"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "completed", "{body}");
    assert_eq!(body["final"], true, "{body}");
    assert_eq!(body["agentType"], "coordinator");
    let text = body["text"].as_str().unwrap();
    assert!(!text.is_empty(), "{body}");
    // The same run, read back: the text is its last reply's.
    let (_, run) = get(
        &server,
        &format!("/v1/runs/{}", encoded(body["runId"].as_str().unwrap())),
    )
    .await;
    let history = run["state"]["messageHistory"].as_array().unwrap();
    let last = history.last().unwrap()["content"].to_string();
    assert!(
        last.contains(&text[..text.len().min(20)]),
        "{last} / {text}"
    );
    // Its three researchers ran (and their analysts) before it answered.
    assert_eq!(run["state"]["childRunIds"].as_array().unwrap().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_that_outlives_the_wait_goes_on_and_the_answer_says_where_to_follow_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let response = client()
        .post(server.url("/v1/runs/wait?timeout=300ms"))
        .bearer_auth(TOKEN)
        .json(&json!({"agent": "sleeper", "prompt": "sleep"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let location = response.headers()["location"].to_str().unwrap().to_owned();
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["status"], "running", "{body}");
    let run_id = body["runId"].as_str().unwrap();
    assert_eq!(location, format!("/v1/runs/{}", encoded(run_id)));
    assert_eq!(body["events"], format!("{location}/events"));
    // It still runs: the wait let go of it, nothing cancelled it.
    let (status, run) = get(&server, &location).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(run["status"], "running", "{run}");
    let (status, _) = post(&server, &format!("{location}/cancel"), json!({})).await;
    assert!(status.is_success(), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_with_a_bad_timeout_is_refused_before_any_tree_starts() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    for timeout in ["soon", "0s", "11m"] {
        let (status, body) = post(
            &server,
            &format!("/v1/runs/wait?timeout={timeout}"),
            json!({"agent": "coordinator", "prompt": "x"}),
        )
        .await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{timeout}: {body}"
        );
        assert!(body.to_string().contains("timeout"), "{body}");
    }
    let (_, runs) = get(&server, "/v1/runs").await;
    assert_eq!(runs["runs"].as_array().map(Vec::len), Some(0), "{runs}");
}

//! Every background child is delivered to its parent exactly once, whatever
//! point `arbor serve` is killed (SIGKILL) at and restarted on the same store
//! (semantics §15): before the child starts, while it runs, after it ended
//! but before its report reached the parent, after the delivery, and after
//! the parent's end.
//!
//! Each point is held open by a slow scripted step (the scenario, not a
//! wait): the kill comes while that step runs. Where the point needs what
//! came before it to be durable, the test first reads a finished run, which
//! the server answers only once its store has every event so far.

use std::path::Path;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::approvals_restart::read_until;
use crate::serve::{Server, Sse, TOKEN, encoded, get, post, stream};

/// How long the step that holds a point open takes.
const HOLD_MS: u64 = 3000;

fn config(max_live: usize) -> String {
    format!(
        r#"
[service]
bind = "127.0.0.1:0"

[limits]
max_live_agents = {max_live}

[models.script]
provider = "scripted"
file = "script.json"

[agents.lead]
model = "script"
tools = ["spawn_agents_async"]
spawnable_agents = ["worker"]

[agents.worker]
model = "script"
"#
    )
}

/// The lead spawns one worker in the background, says it waits, and ends
/// when the report came; `lead_steps` and `worker` set the delays.
fn setup(dir: &Path, max_live: usize, lead_delays: [u64; 3], worker_delay: u64) -> String {
    let step = |text: &str, delay: u64| json!({"text": text, "delayMs": delay});
    let spawn = json!({
        "toolCalls": [{"name": "spawn_agents_async",
                       "input": {"agents": [{"agent_type": "worker", "prompt": "work"}]}}],
        "delayMs": lead_delays[0],
    });
    let script = json!({"replies": [
        {"agent": "lead", "steps": [
            spawn,
            step("waiting for the worker", lead_delays[1]),
            step("the worker reported", lead_delays[2]),
        ]},
        {"agent": "worker", "steps": [step("worked", worker_delay)]}
    ]});
    std::fs::write(dir.join("script.json"), script.to_string()).unwrap();
    let path = dir.join("background.toml");
    std::fs::write(&path, config(max_live)).unwrap();
    path.display().to_string()
}

fn serve(dir: &Path, config: &str) -> Server {
    let mut server = Server::start(dir, &["--config", config], Some(TOKEN));
    server.wait_for("ready");
    server
}

/// Starts the tree; returns its root run id.
async fn start(server: &Server) -> String {
    let (status, created) = post(
        server,
        "/v1/runs",
        json!({"agent": "lead", "prompt": "delegate"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    created["runId"].as_str().unwrap().to_owned()
}

/// Waits until the store has every event so far (a stored run is read only
/// then), for a run that has finished.
async fn durable(server: &Server, finished_run: &str) {
    let (status, body) = get(server, &format!("/v1/runs/{}", encoded(finished_run))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["live"], false, "{finished_run} has finished: {body}");
}

/// The run ids the events of `kind` are about.
fn runs_of(events: &[Sse], kind: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.event == kind)
        .map(|e| e.data["runId"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// After the restart: the tree completes, and the worker was delivered once.
async fn completes_with_one_delivery(server: &Server, root: &str) {
    let events = stream(server, root, None, |_| {}).await;
    let finished = runs_of(&events, "agentFinished");
    assert_eq!(
        finished.last().map(String::as_str),
        Some(root),
        "the root completes: {finished:?}"
    );
    let (status, body) = get(server, &format!("/v1/runs/{}", encoded(root))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let state = &body["state"];
    assert_eq!(state["status"], "completed", "{state}");
    let children: Vec<&str> = state["childRunIds"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(children.len(), 1, "one child, recorded once: {children:?}");
    let child = children[0];
    // One report in the history the parent's model read, about that child.
    let reports: Vec<&Value> = state["messageHistory"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| {
            m["tags"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t == "BACKGROUND_REPORT"))
        })
        .collect();
    assert_eq!(reports.len(), 1, "exactly one report: {reports:#?}");
    let text = reports[0]["content"].as_str().unwrap();
    assert!(text.contains(child) && text.contains("worked"), "{text}");
    // The journal agrees: the child finished once and was delivered once.
    let child_finished = finished.iter().filter(|r| *r == child).count();
    assert_eq!(child_finished, 1, "{finished:?}");
    let delivered: Vec<&Sse> = events
        .iter()
        .filter(|e| e.event == "backgroundDelivered")
        .collect();
    assert_eq!(delivered.len(), 1, "{delivered:#?}");
    assert_eq!(delivered[0].data["childRunId"], child);
    // The last step answered the report.
    let last = state["messageHistory"].as_array().unwrap().last().unwrap();
    assert_eq!(last["content"][0]["text"], "the worker reported", "{last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_before_the_background_child_starts_starts_it_once_after_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    // One live slot, held by the lead's slow second step: the child waits.
    let config = setup(dir.path(), 1, [0, HOLD_MS, 0], 0);
    let server = serve(dir.path(), &config);
    let root = start(&server).await;
    let seen = read_until(&server, &root, "event: childSpawned", 1).await;
    assert!(!seen.contains("event: agentFinished"), "{seen}");
    drop(server);
    let server = serve(dir.path(), &config);
    completes_with_one_delivery(&server, &root).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_while_the_background_child_runs_delivers_it_once_after_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = setup(dir.path(), 4, [0, 0, 0], HOLD_MS);
    let server = serve(dir.path(), &config);
    let root = start(&server).await;
    // The lead's two steps and the worker's one (which takes long).
    read_until(&server, &root, "event: stepStarted", 3).await;
    drop(server);
    let server = serve(dir.path(), &config);
    completes_with_one_delivery(&server, &root).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_after_the_child_ended_and_before_its_delivery_delivers_it_once() {
    let dir = tempfile::tempdir().unwrap();
    // The lead's second step is slow: the report waits for its end.
    let config = setup(dir.path(), 4, [0, HOLD_MS, 0], 0);
    let server = serve(dir.path(), &config);
    let root = start(&server).await;
    let seen = read_until(&server, &root, "event: agentFinished", 1).await;
    assert!(!seen.contains("event: backgroundDelivered"), "{seen}");
    let child = format!("{root}.1");
    durable(&server, &child).await;
    drop(server);
    let server = serve(dir.path(), &config);
    completes_with_one_delivery(&server, &root).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_after_the_delivery_does_not_deliver_again() {
    let dir = tempfile::tempdir().unwrap();
    // The step that answers the report is slow: the kill comes during it.
    let config = setup(dir.path(), 4, [0, 0, HOLD_MS], 0);
    let server = serve(dir.path(), &config);
    let root = start(&server).await;
    read_until(&server, &root, "event: backgroundDelivered", 1).await;
    durable(&server, &format!("{root}.1")).await;
    drop(server);
    let server = serve(dir.path(), &config);
    completes_with_one_delivery(&server, &root).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_after_the_parent_ended_leaves_one_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let config = setup(dir.path(), 4, [0, 0, 0], 0);
    let server = serve(dir.path(), &config);
    let root = start(&server).await;
    let events = stream(&server, &root, None, |_| {}).await;
    assert_eq!(
        runs_of(&events, "agentFinished").last().map(String::as_str),
        Some(root.as_str())
    );
    durable(&server, &root).await;
    drop(server);
    let server = serve(dir.path(), &config);
    completes_with_one_delivery(&server, &root).await;
}

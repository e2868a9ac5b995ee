//! Usage that was billed is counted, once (issue 34): a reply cut at the
//! output limit or refused counts in the run's state, the store's totals
//! (`arbor tree`, `arbor export`) and the tree's budget; a reply served from
//! the record after a kill -9 counts in none of the event stream, `/metrics`
//! or the store again. Against a loopback OpenAI-compatible endpoint that
//! counts what it received and what it answered.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::serve::{Server, TOKEN, client, get, post, stream};
use crate::support::poll;

/// How long any one wait may take before the test fails (never a pass).
const GUARD: Duration = Duration::from_secs(60);

/// What the endpoint does with one request.
enum Answer {
    /// A whole chat completion.
    Reply(Value),
    /// Nothing, ever: the request stays in flight until its client goes.
    Hold,
}

type Rule = Arc<dyn Fn(&Value) -> Answer + Send + Sync>;

struct Shared {
    rule: Rule,
    received: AtomicUsize,
    answered: AtomicUsize,
}

/// An OpenAI Chat Completions endpoint (non-streamed) on 127.0.0.1 whose
/// answers a [`Rule`] picks from each request's body.
struct Endpoint {
    base_url: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Endpoint {
    async fn start(rule: Rule) -> Endpoint {
        let shared = Arc::new(Shared {
            rule,
            received: AtomicUsize::new(0),
            answered: AtomicUsize::new(0),
        });
        let app = axum::Router::new()
            .route("/v1/chat/completions", axum::routing::post(chat))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Endpoint {
            base_url: format!("http://{addr}/v1"),
            shared,
            task,
        }
    }

    /// Requests that reached it.
    fn received(&self) -> usize {
        self.shared.received.load(Ordering::SeqCst)
    }

    /// Requests it answered (what a provider bills).
    fn answered(&self) -> usize {
        self.shared.answered.load(Ordering::SeqCst)
    }
}

async fn chat(State(shared): State<Arc<Shared>>, body: String) -> Response {
    shared.received.fetch_add(1, Ordering::SeqCst);
    let request: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    match (shared.rule)(&request) {
        Answer::Reply(reply) => {
            shared.answered.fetch_add(1, Ordering::SeqCst);
            axum::Json(reply).into_response()
        }
        Answer::Hold => std::future::pending().await,
    }
}

/// A chat completion with this message, finish reason and `(prompt,
/// completion)` usage.
fn completion(message: Value, finish: &str, (input, output): (u64, u64)) -> Answer {
    Answer::Reply(json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "test-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": input, "completion_tokens": output,
                  "total_tokens": input + output}
    }))
}

fn text(text: &str, usage: (u64, u64)) -> Answer {
    completion(json!({"role": "assistant", "content": text}), "stop", usage)
}

/// A call of `name` whose arguments are `arguments` as sent (JSON or not).
fn call(name: &str, arguments: &str, usage: (u64, u64)) -> Answer {
    let call = json!({"id": "call_1", "type": "function",
        "function": {"name": name, "arguments": arguments}});
    completion(
        json!({"role": "assistant", "content": null, "tool_calls": [call]}),
        "tool_calls",
        usage,
    )
}

/// A reply cut at the output limit (`finish_reason: "length"`).
fn cut(usage: (u64, u64)) -> Answer {
    completion(
        json!({"role": "assistant", "content": "The answer is"}),
        "length",
        usage,
    )
}

/// `spawn_agents` of `agent` `n` times.
fn spawn(agent: &str, n: usize, usage: (u64, u64)) -> Answer {
    let agents: Vec<Value> = (0..n)
        .map(|i| json!({"agent_type": agent, "prompt": format!("part {i}")}))
        .collect();
    call(
        "spawn_agents",
        &json!({ "agents": agents }).to_string(),
        usage,
    )
}

/// The request's system prompt.
fn system(request: &Value) -> &str {
    request["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "system"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
}

/// Whether the request carries a tool result (the step after a call).
fn has_result(request: &Value) -> bool {
    request["messages"]
        .as_array()
        .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"))
}

/// Credits per million tokens: 1000 in, 10000 out (so 220 + 40 tokens
/// cost 0.22 + 0.4).
const PRICING: &str = "pricing = { input = 1000, output = 10000 }";

fn cost((input, output): (u64, u64)) -> f64 {
    (input as f64 * 1000.0 + output as f64 * 10000.0) / 1e6
}

/// A config for the endpoint with `agents` and `extra` tables.
fn config(endpoint: &Endpoint, extra: &str, agents: &str) -> String {
    format!(
        r#"{extra}

[models.m]
provider = "openai"
base_url = "{}"
model = "test-model"
stream = false
retry = {{ max_retries = 0 }}
{PRICING}
{agents}"#,
        endpoint.base_url
    )
}

/// `arbor ARGS` in `dir`, off the runtime's threads (the endpoint runs on them).
async fn arbor(dir: &Path, args: &[&str]) -> std::process::Output {
    let dir = dir.to_owned();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        super::arbor_in(&dir, &args)
    })
    .await
    .unwrap()
}

/// `arbor tree TREE --json` and `arbor export TREE` of the store in `dir`.
async fn stored(dir: &Path, tree: &str) -> (Value, Value) {
    let out = arbor(dir, &["tree", tree, "--json", "--store", "arbor.db"]).await;
    assert!(out.status.success(), "{}", super::text(&out.stderr));
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    let out = arbor(dir, &["export", tree, "--store", "arbor.db"]).await;
    assert!(out.status.success(), "{}", super::text(&out.stderr));
    let export: Value = serde_json::from_slice(&out.stdout).unwrap();
    (shown, export)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// `(input, output, cost)` of a tree's row, as `arbor tree --json`, the
/// export's summary and `GET /v1/trees/{id}` show it.
fn totals(tree: &Value) -> (u64, u64, f64) {
    (
        tree["inputTokens"].as_u64().unwrap(),
        tree["outputTokens"].as_u64().unwrap(),
        tree["cost"].as_f64().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_cut_at_max_tokens_shows_its_billed_tokens_and_credits_in_the_state_tree_and_export()
 {
    let endpoint = Endpoint::start(Arc::new(|_: &Value| cut((220, 40)))).await;
    let dir = tempfile::tempdir().unwrap();
    let agents = "[agents.solo]\nmodel = \"m\"\nsystem_prompt = \"Answer.\"\n";
    std::fs::write(
        dir.path().join("config.toml"),
        config(&endpoint, "", agents),
    )
    .unwrap();
    let out = arbor(
        dir.path(),
        &[
            "run",
            "--json",
            "--quiet",
            "--agent",
            "solo",
            "--store",
            "arbor.db",
            "--tree-id",
            "cut",
            "answer at length",
        ],
    )
    .await;
    let state: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", super::text(&out.stderr)));
    assert_eq!(state["status"], "failed", "{state}");
    assert_eq!(endpoint.answered(), 1);
    let billed = cost((220, 40));
    // The run's state: its credits.
    assert!(
        close(state["creditsUsed"].as_f64().unwrap(), billed),
        "{state}"
    );
    assert!(
        close(state["directCreditsUsed"].as_f64().unwrap(), billed),
        "{state}"
    );

    let (shown, export) = stored(dir.path(), "cut").await;
    let tree = &shown["tree"];
    assert_eq!(totals(tree).0, 220, "{shown}");
    assert_eq!(totals(tree).1, 40, "{shown}");
    assert!(close(totals(tree).2, billed), "{shown}");
    let node = &shown["runs"][0];
    assert_eq!(
        (
            node["steps"].as_u64(),
            node["inputTokens"].as_u64(),
            node["outputTokens"].as_u64()
        ),
        (Some(1), Some(220), Some(40)),
        "{shown}"
    );
    assert!(close(node["cost"].as_f64().unwrap(), billed), "{shown}");
    let summary = &export["summary"];
    assert_eq!(
        (totals(summary).0, totals(summary).1),
        (220, 40),
        "{export}"
    );
    // The journal says what was billed and that it was not acted on.
    let responded: Vec<&Value> = export["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "modelResponded")
        .collect();
    assert_eq!(responded.len(), 1, "{export}");
    assert_eq!(responded[0]["refused"], true, "{export}");
    assert_eq!(responded[0]["usage"]["inputTokens"], 220, "{export}");
    assert_eq!(responded[0]["usage"]["outputTokens"], 40, "{export}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_cut_at_max_tokens_counts_against_the_trees_token_budget() {
    // The lead spawns a child (30 tokens); the child's reply is cut after
    // 220 + 40; the lead's next step then needs more than the 10 left.
    let endpoint = Endpoint::start(Arc::new(|request: &Value| {
        match (system(request), has_result(request)) {
            ("lead", false) => spawn("cutter", 1, (20, 10)),
            ("lead", true) => text("all done", (20, 10)),
            _ => cut((220, 40)),
        }
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let agents = "[agents.lead]\nmodel = \"m\"\nsystem_prompt = \"lead\"\n\
                  spawnable_agents = [\"cutter\"]\n\n\
                  [agents.cutter]\nmodel = \"m\"\nsystem_prompt = \"cutter\"\n";
    let limits = "[limits]\nmax_tokens = 300\non_budget = \"fail\"";
    std::fs::write(
        dir.path().join("config.toml"),
        config(&endpoint, limits, agents),
    )
    .unwrap();
    let out = arbor(
        dir.path(),
        &[
            "run",
            "--json",
            "--quiet",
            "--agent",
            "lead",
            "--store",
            "arbor.db",
            "--tree-id",
            "budget",
            "delegate",
        ],
    )
    .await;
    let state: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", super::text(&out.stderr)));
    assert_eq!(state["status"], "failed", "{state}");
    let error = state["output"]["errorMessage"].as_str().unwrap_or_default();
    assert!(error.contains("290 of 300 tokens used"), "{state}");
    assert_eq!(
        endpoint.received(),
        2,
        "the lead's second step is never sent"
    );
    let (shown, _) = stored(dir.path(), "budget").await;
    assert_eq!(
        (totals(&shown["tree"]).0, totals(&shown["tree"]).1),
        (240, 50),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_refused_for_invalid_tool_json_is_counted_in_the_state_and_the_tree() {
    let endpoint = Endpoint::start(Arc::new(|request: &Value| {
        if has_result(request) {
            text("sorry, done", (20, 10))
        } else {
            call("spawn_agents", "{\"agents\": [{\"agent_type\": ", (220, 40))
        }
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let agents = "[agents.lead]\nmodel = \"m\"\nsystem_prompt = \"lead\"\n\
                  spawnable_agents = [\"helper\"]\n\n\
                  [agents.helper]\nmodel = \"m\"\n";
    std::fs::write(
        dir.path().join("config.toml"),
        config(&endpoint, "", agents),
    )
    .unwrap();
    let out = arbor(
        dir.path(),
        &[
            "run",
            "--json",
            "--quiet",
            "--agent",
            "lead",
            "--store",
            "arbor.db",
            "--tree-id",
            "badjson",
            "go",
        ],
    )
    .await;
    let state: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", super::text(&out.stderr)));
    assert_eq!(state["status"], "completed", "{state}");
    let history = state["messageHistory"].to_string();
    assert!(history.contains("not valid JSON"), "{history}");
    let billed = cost((220, 40)) + cost((20, 10));
    assert!(
        close(state["creditsUsed"].as_f64().unwrap(), billed),
        "{state}"
    );
    let (shown, export) = stored(dir.path(), "badjson").await;
    assert_eq!(totals(&shown["tree"]).0, 240, "{shown}");
    assert_eq!(totals(&shown["tree"]).1, 50, "{shown}");
    assert!(close(totals(&shown["tree"]).2, billed), "{shown}");
    assert_eq!(totals(&export["summary"]).0, 240, "{export}");
}

/// A metric's value in a `/metrics` text (0 when it is not there yet).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// `(requests, input tokens, output tokens)` of model `m` on a server's `/metrics`.
async fn model_metrics(server: &Server) -> (f64, f64, f64) {
    let text = client()
        .get(server.url("/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    (
        metric(&text, "arbor_model_requests_total{model=\"m\"}"),
        metric(&text, "arbor_tokens_total{model=\"m\",kind=\"input\"}"),
        metric(&text, "arbor_tokens_total{model=\"m\",kind=\"output\"}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_served_from_the_record_after_kill_9_is_not_counted_again_on_the_stream_or_metrics()
{
    // The lead spawns two workers; the workers' requests hang until the
    // server is killed, then are answered (by the next server's requests).
    let holding = Arc::new(AtomicBool::new(true));
    let hold = holding.clone();
    let endpoint = Endpoint::start(Arc::new(move |request: &Value| {
        match (system(request), has_result(request)) {
            ("lead", false) => spawn("worker", 2, (100, 10)),
            ("lead", true) => text("merged", (50, 5)),
            _ if hold.load(Ordering::SeqCst) => Answer::Hold,
            _ => text("part done", (30, 3)),
        }
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let agents = "[agents.lead]\nmodel = \"m\"\nsystem_prompt = \"lead\"\n\
                  spawnable_agents = [\"worker\"]\n\n\
                  [agents.worker]\nmodel = \"m\"\nsystem_prompt = \"worker\"\n";
    let path = dir.path().join("usage.toml");
    std::fs::write(
        &path,
        config(&endpoint, "[service]\nbind = \"127.0.0.1:0\"", agents),
    )
    .unwrap();
    let config = path.display().to_string();

    let mut server = Server::start(dir.path(), &["--config", &config], Some(TOKEN));
    server.wait_for("ready");
    let (status, created) = post(
        &server,
        "/v1/runs",
        json!({"agent": "lead", "prompt": "go"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let tree_id = created["treeId"].as_str().unwrap().to_owned();
    let run_id = created["runId"].as_str().unwrap().to_owned();
    // The lead's reply is answered and stored; both workers' requests hang.
    let both_sent = poll(GUARD, || (endpoint.received() == 3).then_some(()));
    assert!(both_sent.is_some(), "received {}", endpoint.received());
    let mut stored_lead = None;
    for _ in 0..600 {
        let (_, tree) = get(&server, &format!("/v1/trees/{tree_id}")).await;
        if tree["tree"]["inputTokens"] == 100 {
            stored_lead = Some(tree);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(stored_lead.is_some(), "the lead's reply was never stored");
    let first = model_metrics(&server).await;
    assert_eq!(first, (3.0, 100.0, 10.0), "sent 3, billed the lead's");

    // kill -9, then a new server on the same store resumes the tree: the
    // lead's step 1 is served from the record, the workers ask again.
    drop(server);
    holding.store(false, Ordering::SeqCst);
    let before = (endpoint.received(), endpoint.answered());
    let mut server = Server::start(dir.path(), &["--config", &config], Some(TOKEN));
    server.wait_for("ready");
    let events = tokio::time::timeout(GUARD, stream(&server, &run_id, None, |_| {}))
        .await
        .expect("the resumed tree ends");
    assert_eq!(events.last().unwrap().data["status"], "completed");
    let (status, tree) = get(&server, &format!("/v1/trees/{tree_id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(tree["tree"]["resumes"], 1, "{tree}");
    let second = model_metrics(&server).await;
    let sent_again = endpoint.received() - before.0;
    assert_eq!(sent_again, 3, "two workers and the lead's step 2");
    assert_eq!(endpoint.answered() - before.1, 3);

    // The store: each answered reply once.
    let stored = totals(&tree["tree"]);
    assert_eq!(
        (stored.0, stored.1),
        (100 + 30 + 30 + 50, 10 + 3 + 3 + 5),
        "{tree}"
    );
    // The event stream from the start, summed: the same.
    let responded: Vec<&Value> = events
        .iter()
        .filter(|e| e.event == "modelResponded")
        .map(|e| &e.data)
        .collect();
    let sum = |key: &str| -> u64 {
        responded
            .iter()
            .map(|e| e["usage"][key].as_u64().unwrap_or(0))
            .sum()
    };
    let credits: f64 = responded
        .iter()
        .map(|e| e["usage"]["cost"].as_f64().unwrap_or(0.0))
        .sum();
    assert_eq!(
        (sum("inputTokens"), sum("outputTokens")),
        (stored.0, stored.1),
        "{responded:#?}"
    );
    assert!(close(credits, stored.2), "{credits} against {}", stored.2);
    // The lead's step 1 came twice: the second time from the record.
    let from_record: Vec<&&Value> = responded
        .iter()
        .filter(|e| e["fromRecord"] == true)
        .collect();
    assert_eq!(from_record.len(), 1, "{responded:#?}");
    assert_eq!(from_record[0]["step"], 1);
    // /metrics of both processes: every request sent, every reply billed, once.
    assert_eq!(
        second.0 as usize, sent_again,
        "requests_total counts only what the endpoint got"
    );
    assert_eq!(
        (first.0 + second.0) as usize,
        endpoint.received(),
        "requests over both processes"
    );
    assert_eq!(
        ((first.1 + second.1) as u64, (first.2 + second.2) as u64),
        (stored.0, stored.1),
        "tokens over both processes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_cut_and_asked_again_with_more_room_counts_both_replies() {
    // Cut below 8192 tokens of room: the first request (256) is cut, the
    // retry `on_truncated` sends (8192) is whole. Both were billed.
    let endpoint = Endpoint::start(Arc::new(|request: &Value| {
        if request["max_tokens"].as_u64().is_some_and(|n| n >= 8192) {
            text("The whole answer.", (20, 10))
        } else {
            cut((220, 40))
        }
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let agents = "[agents.solo]\nmodel = \"m\"\nsystem_prompt = \"Answer.\"\n";
    let text = config(&endpoint, "", agents).replace(
        "stream = false\n",
        "stream = false\nmax_tokens = 256\non_truncated = { max_tokens = 8192 }\n",
    );
    std::fs::write(dir.path().join("config.toml"), text).unwrap();
    let out = arbor(
        dir.path(),
        &[
            "run",
            "--json",
            "--quiet",
            "--agent",
            "solo",
            "--store",
            "arbor.db",
            "--tree-id",
            "room",
            "answer",
        ],
    )
    .await;
    let state: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", super::text(&out.stderr)));
    assert_eq!(state["status"], "completed", "{state}");
    assert_eq!(endpoint.answered(), 2, "the cut reply and its retry");
    let billed = cost((220, 40)) + cost((20, 10));
    assert!(
        close(state["creditsUsed"].as_f64().unwrap(), billed),
        "{state}"
    );
    let (shown, _) = stored(dir.path(), "room").await;
    let tree = totals(&shown["tree"]);
    assert_eq!((tree.0, tree.1), (240, 50), "{shown}");
    assert!(close(tree.2, billed), "{shown}");
}

//! Telemetry of a live `arbor serve`: one OTLP trace per tree (received by
//! a small OTLP/HTTP sink on loopback), continuing the caller's
//! `traceparent` or, without one, rooted at the request's span, with the
//! GenAI semantic conventions' names, kinds and attributes;
//! its JSON log lines carrying the trace's ids; and its `/metrics` as
//! promtool checks it, in both exposition formats, with requests counted
//! when sent, time to first token, and the HTTP request families.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message as _;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::serve::{Server, TOKEN, client};

/// The caller's trace: the tree must go on in it.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// lead → 2 workers → 2 leaves each: 7 agents, no latency.
fn config(otlp: Option<&str>) -> String {
    let otlp = otlp
        .map(|endpoint| format!("otlp_endpoint = \"{endpoint}\"\n"))
        .unwrap_or_default();
    format!(
        r#"
[limits]
max_depth = 3
deadline = "2m"

[store]
path = "arbor.db"

[service]
bind = "127.0.0.1:0"
shutdown_timeout = "5s"
{otlp}
[models.sim]
provider = "simulated"
fanout = 2
depth = 2
latency = "0"
reply_tokens = 5

[agents.lead]
name = "Lead"
model = "sim"
system_prompt = "You split the work."
spawnable_agents = ["worker"]

[agents.worker]
name = "Worker"
model = "sim"
system_prompt = "You split it again."
spawnable_agents = ["leaf"]

[agents.leaf]
name = "Leaf"
model = "sim"
system_prompt = "You answer."
"#
    )
}

fn start(dir: &Path, otlp: Option<&str>) -> Server {
    let path = dir.join("telemetry.toml");
    std::fs::write(&path, config(otlp)).unwrap();
    let path = path.display().to_string();
    let mut server = Server::start(dir, &["--config", &path], Some(TOKEN));
    server.wait_for("ready");
    server
}

/// Starts the 7-agent tree with the caller's `traceparent` and waits
/// (bounded, on the server's log) for its end.
async fn run_tree(server: &mut Server) -> String {
    start_tree(server, true).await
}

/// Starts the 7-agent tree, with the caller's `traceparent` if `traced`,
/// and waits (bounded, on the server's log) for its end.
async fn start_tree(server: &mut Server, traced: bool) -> String {
    let mut request = client().post(server.url("/v1/runs")).bearer_auth(TOKEN);
    if traced {
        request = request.header("traceparent", format!("00-{TRACE_ID}-{CALLER_SPAN}-01"));
    }
    let response = request
        .json(&json!({"agent": "lead", "prompt": "split it"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let created: Value = response.json().await.unwrap();
    let tree = created["treeId"].as_str().unwrap().to_owned();
    let line = tokio::task::block_in_place(|| server.wait_for("tree ended"));
    assert!(line.contains(&tree) && line.contains("completed"), "{line}");
    tree
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attr(span: &Span, key: &str) -> Option<String> {
    let value = span.attributes.iter().find(|kv| kv.key == key)?;
    Some(match value.value.as_ref()?.value.as_ref()? {
        Any::StringValue(s) => s.clone(),
        Any::IntValue(i) => i.to_string(),
        Any::BoolValue(b) => b.to_string(),
        Any::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    })
}

/// An OTLP/HTTP (protobuf) traces endpoint on loopback: every span it gets.
async fn sink() -> (String, Arc<Mutex<Vec<Span>>>) {
    let spans = Arc::new(Mutex::new(Vec::new()));
    let kept = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            let kept = kept.clone();
            async move {
                let request = ExportTraceServiceRequest::decode(body).unwrap();
                let mut kept = kept.lock().unwrap();
                for resource in request.resource_spans {
                    for scope in resource.scope_spans {
                        kept.extend(scope.spans);
                    }
                }
                // An empty ExportTraceServiceResponse.
                (
                    [("content-type", "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/v1/traces"), spans)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_is_one_trace_in_the_callers_with_genai_spans() {
    let dir = tempfile::tempdir().unwrap();
    let (endpoint, spans) = sink().await;
    let mut server = start(dir.path(), Some(&endpoint));
    let tree = run_tree(&mut server).await;
    // SIGTERM: the exporter sends what it holds before the process exits.
    let (status, _) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status}");
    let spans = std::mem::take(&mut *spans.lock().unwrap());

    // One trace, the caller's: the only request was the traced POST.
    let traces: HashSet<String> = spans.iter().map(|s| hex(&s.trace_id)).collect();
    assert_eq!(traces, HashSet::from([TRACE_ID.to_owned()]), "{spans:#?}");
    let by_id: HashMap<String, &Span> = spans.iter().map(|s| (hex(&s.span_id), s)).collect();
    let parent = |span: &Span| by_id.get(&hex(&span.parent_span_id)).copied();

    // request (child of the caller's span) → tree → the root agent.
    let request = spans.iter().find(|s| s.name == "request").unwrap();
    assert_eq!(hex(&request.parent_span_id), CALLER_SPAN);
    assert_eq!(request.kind, SpanKind::Server as i32);
    let tree_span = spans.iter().find(|s| s.name == "tree").unwrap();
    assert_eq!(attr(tree_span, "arbor.tree.id").as_deref(), Some(&*tree));
    assert_eq!(parent(tree_span).map(|s| &s.name), Some(&request.name));

    // Seven agent spans, parented as the tree is.
    let agents: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name.starts_with("invoke_agent "))
        .collect();
    assert_eq!(agents.len(), 7, "{agents:#?}");
    let by_run: HashMap<String, &Span> = agents
        .iter()
        .map(|s| (attr(s, "gen_ai.agent.id").unwrap(), *s))
        .collect();
    assert_eq!(by_run.len(), 7);
    let mut per_type: HashMap<String, usize> = HashMap::new();
    for agent in &agents {
        let kind = attr(agent, "agent_type").unwrap();
        assert_eq!(agent.name, format!("invoke_agent {kind}"));
        assert_eq!(
            attr(agent, "gen_ai.operation.name").as_deref(),
            Some("invoke_agent")
        );
        assert!(attr(agent, "gen_ai.agent.name").is_some(), "{agent:#?}");
        *per_type.entry(kind.clone()).or_default() += 1;
        let up = parent(agent).unwrap_or_else(|| panic!("no parent span: {agent:#?}"));
        match attr(agent, "parent_id").as_deref() {
            Some("-") | None => {
                assert_eq!(kind, "lead");
                assert_eq!(up.span_id, tree_span.span_id);
            }
            Some(parent_run) => {
                let expected = by_run[parent_run];
                assert_eq!(up.span_id, expected.span_id, "{agent:#?}");
                let parent_kind = attr(expected, "agent_type").unwrap();
                let want = if kind == "worker" { "lead" } else { "worker" };
                assert_eq!(parent_kind, want);
            }
        }
    }
    assert_eq!(
        per_type,
        HashMap::from([
            ("lead".to_owned(), 1),
            ("worker".to_owned(), 2),
            ("leaf".to_owned(), 4)
        ])
    );

    // Every model call: `chat sim`, a client span under its agent's span.
    let chats: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name.starts_with("chat "))
        .collect();
    assert!(chats.len() >= 7, "{chats:#?}");
    for chat in &chats {
        assert_eq!(chat.name, "chat sim");
        assert_eq!(chat.kind, SpanKind::Client as i32);
        assert_eq!(attr(chat, "gen_ai.operation.name").as_deref(), Some("chat"));
        assert_eq!(attr(chat, "gen_ai.request.model").as_deref(), Some("sim"));
        assert!(
            attr(chat, "gen_ai.usage.input_tokens").is_some(),
            "{chat:#?}"
        );
        assert!(
            attr(chat, "gen_ai.usage.output_tokens").is_some(),
            "{chat:#?}"
        );
        let up = parent(chat).unwrap();
        assert!(up.name.starts_with("invoke_agent "), "{up:#?}");
    }
}

/// A tree started by a caller that sends no `traceparent` is still one
/// trace: the `request` span (SERVER) is its root, the `tree` span its
/// child, and every other span hangs under them; agent spans are
/// INTERNAL, model calls CLIENT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_started_without_a_traceparent_is_one_trace_rooted_at_its_request() {
    let dir = tempfile::tempdir().unwrap();
    let (endpoint, spans) = sink().await;
    let mut server = start(dir.path(), Some(&endpoint));
    let tree = start_tree(&mut server, false).await;
    let (status, _) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status}");
    let spans = std::mem::take(&mut *spans.lock().unwrap());

    // One trace, of a fresh id.
    let traces: HashSet<String> = spans.iter().map(|s| hex(&s.trace_id)).collect();
    assert_eq!(traces.len(), 1, "{spans:#?}");
    let trace = traces.into_iter().next().unwrap();
    assert_ne!(trace, TRACE_ID);
    assert_ne!(trace, "0".repeat(32));

    // Its one root is the request; the tree span is the request's child.
    let roots: Vec<&Span> = spans
        .iter()
        .filter(|s| s.parent_span_id.is_empty())
        .collect();
    assert_eq!(roots.len(), 1, "{roots:#?}");
    let request = roots[0];
    assert_eq!(request.name, "request");
    assert_eq!(request.kind, SpanKind::Server as i32);
    assert_eq!(attr(request, "path").as_deref(), Some("/v1/runs"));
    let tree_span = spans.iter().find(|s| s.name == "tree").unwrap();
    assert_eq!(attr(tree_span, "arbor.tree.id").as_deref(), Some(&*tree));
    assert_eq!(tree_span.parent_span_id, request.span_id);

    // Every span leads up to the request, through spans the sink received.
    let by_id: HashMap<&[u8], &Span> = spans.iter().map(|s| (&s.span_id[..], s)).collect();
    for span in &spans {
        let mut at = span;
        let mut hops = 0;
        while !at.parent_span_id.is_empty() {
            at = by_id
                .get(&at.parent_span_id[..])
                .unwrap_or_else(|| panic!("{} has a parent not in the trace", span.name));
            hops += 1;
            assert!(hops <= spans.len(), "a cycle above {}", span.name);
        }
        assert_eq!(at.span_id, request.span_id, "{span:#?}");
    }

    // The kinds: agents INTERNAL (the root agent under the tree span),
    // model calls CLIENT under an agent.
    let agents: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name.starts_with("invoke_agent "))
        .collect();
    assert_eq!(agents.len(), 7, "{agents:#?}");
    for agent in &agents {
        assert_eq!(agent.kind, SpanKind::Internal as i32, "{agent:#?}");
    }
    let root_agent = spans
        .iter()
        .find(|s| s.name == "invoke_agent lead")
        .unwrap();
    assert_eq!(root_agent.parent_span_id, tree_span.span_id);
    let chats: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name.starts_with("chat "))
        .collect();
    assert!(chats.len() >= 7, "{chats:#?}");
    for chat in &chats {
        assert_eq!(chat.kind, SpanKind::Client as i32, "{chat:#?}");
        let up = by_id[&chat.parent_span_id[..]];
        assert!(up.name.starts_with("invoke_agent "), "{up:#?}");
    }
}

/// promtool, from ARBOR_PROMTOOL (`.ci/run` installs Debian's `prometheus`
/// and sets it) or /usr/bin/promtool. Missing: a failure under CI=true, else
/// the test is skipped with a note.
fn promtool() -> Option<String> {
    let promtool = std::env::var("ARBOR_PROMTOOL").unwrap_or_else(|_| "/usr/bin/promtool".into());
    if Path::new(&promtool).exists() {
        return Some(promtool);
    }
    let message = format!(
        "no promtool at {promtool}: install Debian's `prometheus` (or set ARBOR_PROMTOOL); .ci/run does"
    );
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{message}");
    eprintln!("skipped: {message}");
    None
}

fn promtool_check(promtool: &str, text: &str) {
    use std::io::Write as _;
    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "promtool check metrics:\n{}{}\n---\n{text}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_passes_metrics_in_both_formats_after_a_run() {
    let Some(promtool) = promtool() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), None);
    run_tree(&mut server).await;
    let scrape = |accept: Option<&'static str>| {
        let mut request = client().get(server.url("/metrics")).bearer_auth(TOKEN);
        if let Some(accept) = accept {
            request = request.header("accept", accept);
        }
        async move {
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            let kind = response.headers()["content-type"]
                .to_str()
                .unwrap()
                .to_owned();
            (kind, response.text().await.unwrap())
        }
    };
    for accept in [None, Some("text/plain")] {
        let (kind, text) = scrape(accept).await;
        assert_eq!(kind, "text/plain; version=0.0.4; charset=utf-8");
        assert!(!text.contains("# EOF"), "{text}");
        assert!(
            text.contains("arbor_model_requests_total{model=\"sim\"} 10\n"),
            "{text}"
        );
        assert!(
            text.contains("arbor_model_latency_seconds_count{model=\"sim\"} 10\n"),
            "{text}"
        );
        // The router's HTTP families, by route template (the tree's start).
        assert!(
            text.contains(
                "arbor_http_requests_total{method=\"POST\",route=\"/v1/runs\",status=\"201\"} 1\n"
            ),
            "{text}"
        );
        // The request's duration: one observation, in a bucket and the sum.
        assert!(
            text.contains(
                "arbor_http_request_duration_seconds_count{method=\"POST\",route=\"/v1/runs\"} 1\n"
            ),
            "{text}"
        );
        // (The `+Inf` bucket's labels in any order.)
        let inf = text.lines().any(|l| {
            l.strip_prefix("arbor_http_request_duration_seconds_bucket{")
                .and_then(|l| l.strip_suffix("} 1"))
                .is_some_and(|labels| {
                    let mut labels: Vec<&str> = labels.split(',').collect();
                    labels.sort_unstable();
                    labels == [r#"le="+Inf""#, r#"method="POST""#, r#"route="/v1/runs""#]
                })
        });
        assert!(inf, "{text}");
        let sum: f64 = text
            .lines()
            .find_map(|l| {
                l.strip_prefix(
                    "arbor_http_request_duration_seconds_sum{method=\"POST\",route=\"/v1/runs\"} ",
                )
            })
            .unwrap_or_else(|| panic!("no duration sum in\n{text}"))
            .parse()
            .unwrap();
        assert!(
            sum > 0.0 && sum < crate::support::GUARD.as_secs_f64(),
            "{sum}"
        );
        promtool_check(&promtool, &text);
    }
    let (kind, text) = scrape(Some("application/openmetrics-text; version=1.0.0")).await;
    assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
    assert!(text.ends_with("# EOF\n"), "{text}");
    // Every family has its HELP and TYPE.
    let families = |prefix: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .map(|l| l.split(' ').next().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(families("# HELP "), families("# TYPE "), "{text}");
}

/// What a fake OpenAI endpoint saw: each request's `traceparent`.
type Seen = Arc<Mutex<Vec<Option<String>>>>;

/// An OpenAI chat completions endpoint on loopback that answers request
/// number `n` (from 0) with `reply(n)` and keeps each request's
/// `traceparent`.
async fn fake_openai(reply: fn(usize) -> axum::response::Response) -> (String, Seen) {
    use axum::response::IntoResponse as _;
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move |headers: axum::http::HeaderMap| {
            let kept = kept.clone();
            async move {
                let traceparent = headers
                    .get("traceparent")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                let n = {
                    let mut kept = kept.lock().unwrap();
                    kept.push(traceparent);
                    kept.len() - 1
                };
                reply(n).into_response()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/v1"), seen)
}

/// A whole chat completion: "done", from `test-model-0613` (the model id
/// the provider answers with, not the one asked for).
fn done() -> axum::response::Response {
    use axum::response::IntoResponse as _;
    axum::Json(json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "test-model-0613",
        "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "done"}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
    }))
    .into_response()
}

/// A 500 once, then [`done`].
fn fails_once(n: usize) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    match n {
        0 => (StatusCode::INTERNAL_SERVER_ERROR, "busy").into_response(),
        _ => done(),
    }
}

/// The lines of a server's JSON log.
fn json_lines(lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_request_carries_its_chat_spans_traceparent() {
    let dir = tempfile::tempdir().unwrap();
    let (endpoint, spans) = sink().await;
    let (base_url, seen) = fake_openai(fails_once).await;
    let path = dir.path().join("remote.toml");
    let text = format!(
        r#"
[store]
path = "arbor.db"

[service]
bind = "127.0.0.1:0"
otlp_endpoint = "{endpoint}"

[models.remote]
provider = "openai"
base_url = "{base_url}"
model = "test-model"
stream = false
retry = {{ base_delay = "10ms" }}

[agents.solo]
model = "remote"
system_prompt = "Answer."
"#
    );
    std::fs::write(&path, text).unwrap();
    let path = path.display().to_string();
    let mut server = Server::start(
        dir.path(),
        &["--config", &path, "--log-format", "json"],
        Some(TOKEN),
    );
    server.wait_for("ready");
    let response = client()
        .post(server.url("/v1/runs"))
        .bearer_auth(TOKEN)
        .header("traceparent", format!("00-{TRACE_ID}-{CALLER_SPAN}-01"))
        .json(&json!({"agent": "solo", "prompt": "go"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let line = tokio::task::block_in_place(|| server.wait_for("tree ended"));
    assert!(line.contains("completed"), "{line}");
    let (status, lines) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status}");
    let spans = std::mem::take(&mut *spans.lock().unwrap());
    // Named `chat {gen_ai.request.model}`: the provider's model id, not
    // the catalog name (`remote`).
    let chat = spans.iter().find(|s| s.name == "chat test-model").unwrap();
    assert_eq!(
        attr(chat, "gen_ai.provider.name").as_deref(),
        Some("openai")
    );
    assert_eq!(
        attr(chat, "gen_ai.usage.input_tokens").as_deref(),
        Some("12")
    );
    assert_eq!(
        attr(chat, "gen_ai.usage.output_tokens").as_deref(),
        Some("5")
    );
    // The model id sent on the wire, the catalog's name beside it, and the
    // model the reply names; each key once.
    assert_eq!(
        attr(chat, "gen_ai.request.model").as_deref(),
        Some("test-model")
    );
    assert_eq!(attr(chat, "arbor.model").as_deref(), Some("remote"));
    assert_eq!(
        attr(chat, "gen_ai.response.model").as_deref(),
        Some("test-model-0613")
    );
    let keys: Vec<&str> = chat.attributes.iter().map(|kv| kv.key.as_str()).collect();
    let unique: HashSet<&str> = keys.iter().copied().collect();
    assert_eq!(keys.len(), unique.len(), "a key twice: {keys:?}");
    // The provider saw the chat span as the caller, in the tree's trace,
    // on the first attempt and on its retry.
    let traceparent = format!("00-{TRACE_ID}-{}-01", hex(&chat.span_id));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen, vec![Some(traceparent.clone()), Some(traceparent)]);

    // The retry's log line, written in the chat span, names its trace and
    // span; a line outside any tree's span names none.
    let lines = json_lines(&lines);
    let retrying = lines
        .iter()
        .find(|l| l["fields"]["message"] == "retrying model request")
        .unwrap_or_else(|| panic!("no retry line in {lines:#?}"));
    assert_eq!(retrying["trace_id"], TRACE_ID, "{retrying}");
    assert_eq!(retrying["span_id"], hex(&chat.span_id), "{retrying}");
    let listening = lines
        .iter()
        .find(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("listening on"))
        })
        .unwrap();
    assert!(listening.get("trace_id").is_none(), "{listening}");
}

/// A tool call is an `execute_tool {tool}` span under its agent's span, in
/// the tree's one trace, with the GenAI tool attributes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_is_an_execute_tool_span_under_its_agent() {
    let dir = tempfile::tempdir().unwrap();
    let (endpoint, spans) = sink().await;
    let config = format!(
        r#"
[store]
path = "arbor.db"

[service]
bind = "127.0.0.1:0"
otlp_endpoint = "{endpoint}"

[models.script]
provider = "scripted"
file = "script.json"

[tools.echo]
description = "Echoes its word."
input_schema = {{ type = "object", properties = {{ word = {{ type = "string" }} }}, required = ["word"] }}
command = ["echo", "{{word}}"]

[agents.lead]
model = "script"
tools = ["echo"]
"#
    );
    std::fs::write(dir.path().join("config.toml"), config).unwrap();
    let script = json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [{"name": "echo", "input": {"word": "one"}},
                           {"name": "echo", "input": {"word": "two"}}]},
            {"text": "done"}
        ]}
    ]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let mut server = Server::start(dir.path(), &["--config", "config.toml"], Some(TOKEN));
    server.wait_for("ready");
    let response = client()
        .post(server.url("/v1/runs"))
        .bearer_auth(TOKEN)
        .header("traceparent", format!("00-{TRACE_ID}-{CALLER_SPAN}-01"))
        .json(&json!({"agent": "lead", "prompt": "echo twice"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let line = tokio::task::block_in_place(|| server.wait_for("tree ended"));
    assert!(line.contains("completed"), "{line}");
    let (status, _) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status}");
    let spans = std::mem::take(&mut *spans.lock().unwrap());
    let traces: HashSet<String> = spans.iter().map(|s| hex(&s.trace_id)).collect();
    assert_eq!(traces, HashSet::from([TRACE_ID.to_owned()]), "{spans:#?}");
    let agent = spans
        .iter()
        .find(|s| s.name == "invoke_agent lead")
        .unwrap();
    let tools: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name.starts_with("execute_tool"))
        .collect();
    assert_eq!(tools.len(), 2, "{spans:#?}");
    let mut ids = HashSet::new();
    for tool in tools {
        assert_eq!(tool.name, "execute_tool echo");
        assert_eq!(tool.kind, SpanKind::Internal as i32);
        assert_eq!(
            attr(tool, "gen_ai.operation.name").as_deref(),
            Some("execute_tool")
        );
        assert_eq!(attr(tool, "gen_ai.tool.name").as_deref(), Some("echo"));
        let id = attr(tool, "gen_ai.tool.call.id").unwrap_or_default();
        assert!(!id.is_empty(), "{tool:#?}");
        ids.insert(id);
        assert_eq!(tool.parent_span_id, agent.span_id, "{tool:#?}");
    }
    assert_eq!(ids.len(), 2, "each call has its own id: {ids:?}");
}

/// A streamed completion: "done" in two pieces, then the usage.
fn streamed(_: usize) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "c1", "object": "chat.completion.chunk", "model": "test-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let usage = json!({"id": "c1", "object": "chat.completion.chunk", "model": "test-model",
        "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}});
    let body: String = [
        chunk(json!({"role": "assistant", "content": "do"}), Value::Null),
        chunk(json!({"content": "ne"}), json!("stop")),
        usage,
    ]
    .iter()
    .map(|event| format!("data: {event}\n\n"))
    .chain(["data: [DONE]\n\n".to_owned()])
    .collect();
    ([("content-type", "text/event-stream")], body).into_response()
}

/// Every request gets 429 with `Retry-After: 30`.
fn limited(_: usize) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    (
        StatusCode::TOO_MANY_REQUESTS,
        [("retry-after", "30")],
        axum::Json(json!({"error": {"message": "Rate limit reached", "type": "requests"}})),
    )
        .into_response()
}

/// Regression: a request refused before sending (a `Retry-After` beyond
/// the tree's deadline, the endpoint's cooldown gate closed) was counted in
/// `arbor_model_requests_total`. Also: a streamed request's time to first
/// token is measured per model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_counted_when_sent_and_streams_time_their_first_token() {
    let dir = tempfile::tempdir().unwrap();
    let (streaming_url, _) = fake_openai(streamed).await;
    let (limited_url, arrivals) = fake_openai(limited).await;
    let text = format!(
        r#"
[limits]
deadline = "5s"

[store]
path = "arbor.db"

[service]
bind = "127.0.0.1:0"

[models.streaming]
provider = "openai"
base_url = "{streaming_url}"
model = "test-model"

[models.limited]
provider = "openai"
base_url = "{limited_url}"
model = "test-model"
stream = false

[agents.streamer]
model = "streaming"
system_prompt = "Answer."

[agents.limited]
model = "limited"
system_prompt = "Answer."
"#
    );
    std::fs::write(dir.path().join("config.toml"), text).unwrap();
    let mut server = Server::start(dir.path(), &["--config", "config.toml"], Some(TOKEN));
    server.wait_for("ready");
    let mut start = async |agent: &str, status: &str| {
        let response = client()
            .post(server.url("/v1/runs"))
            .bearer_auth(TOKEN)
            .json(&json!({"agent": agent, "prompt": "go"}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
        let line = tokio::task::block_in_place(|| server.wait_for("tree ended"));
        assert!(line.contains(status), "{line}");
    };
    start("streamer", "completed").await;
    // The first is sent and told to wait 30 s, beyond the deadline; the
    // second finds the endpoint's gate closed and is never sent.
    start("limited", "failed").await;
    start("limited", "failed").await;
    assert_eq!(arrivals.lock().unwrap().len(), 1, "one request was sent");
    let text = client()
        .get(server.url("/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let sample = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
            .to_owned()
    };
    assert_eq!(sample("arbor_model_requests_total{model=\"limited\"}"), "1");
    assert_eq!(
        sample("arbor_model_requests_total{model=\"streaming\"}"),
        "1"
    );
    assert_eq!(
        sample("arbor_model_ttft_seconds_count{model=\"streaming\"}"),
        "1"
    );
    assert!(
        !text.contains("arbor_model_ttft_seconds_count{model=\"limited\"}"),
        "no first token without a stream:\n{text}"
    );
    if let Some(promtool) = promtool() {
        promtool_check(&promtool, &text);
    }
}

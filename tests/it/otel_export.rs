//! Traces a collector can use (issue 34): decoded by an OTLP/HTTP receiver
//! on loopback, as a collector would. Token counts are integers, a failed
//! model call and its agent have status ERROR with `error.type`, and `arbor
//! run` exports one trace per tree when only the OpenTelemetry environment
//! variables (`OTEL_EXPORTER_OTLP_*`, `OTEL_SERVICE_NAME`) say where.

use std::collections::HashSet;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::HeaderMap;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode as SpanStatus;
use prost::Message as _;
use reqwest::StatusCode;
use serde_json::json;

use crate::text;

/// What an OTLP/HTTP receiver got: each export request with its headers.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<(HeaderMap, ExportTraceServiceRequest)>>>);

impl Received {
    fn spans(&self) -> Vec<Span> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .flat_map(|(_, request)| &request.resource_spans)
            .flat_map(|resource| &resource.scope_spans)
            .flat_map(|scope| scope.spans.clone())
            .collect()
    }

    /// Every resource's `service.name`.
    fn service_names(&self) -> HashSet<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .flat_map(|(_, request)| &request.resource_spans)
            .filter_map(|resource| {
                let attributes = &resource.resource.as_ref()?.attributes;
                string(attributes, "service.name")
            })
            .collect()
    }

    /// Every export request's value of header `name`.
    fn headers(&self, name: &str) -> Vec<Option<String>> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(headers, _)| {
                headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            })
            .collect()
    }
}

/// An OTLP/HTTP (protobuf) receiver on loopback at `http://ADDR/v1/traces`:
/// returns its base URL (`http://ADDR`) and what it receives.
async fn receiver() -> (String, Received) {
    let received = Received::default();
    let kept = received.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let kept = kept.clone();
            async move {
                let request = ExportTraceServiceRequest::decode(body).unwrap();
                kept.0.lock().unwrap().push((headers, request));
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
    (format!("http://{addr}"), received)
}

fn value<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Any> {
    attributes
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()
}

fn string(attributes: &[KeyValue], key: &str) -> Option<String> {
    match value(attributes, key)? {
        Any::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `arbor run` in `dir` with `args` and only `envs` of the OpenTelemetry
/// variables (any the test process has are removed), off the async runtime.
async fn arbor_run(dir: &Path, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_arbor"));
    command.arg("run").args(args).current_dir(dir);
    for (name, _) in std::env::vars() {
        if name.starts_with("OTEL_") {
            command.env_remove(name);
        }
    }
    command.env_remove("RUST_LOG");
    command.envs(envs.iter().copied());
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

/// lead → 2 workers → 2 leaves each: 7 agents, no latency; the config's
/// `otlp_endpoint` is `otlp` when given.
fn tree_config(dir: &Path, otlp: Option<&str>) -> String {
    let service = otlp
        .map(|endpoint| format!("[service]\notlp_endpoint = \"{endpoint}\"\n"))
        .unwrap_or_default();
    let path = dir.join("tree.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[limits]
max_depth = 3
deadline = "2m"

[store]
enabled = false

{service}
[models.sim]
provider = "simulated"
fanout = 2
depth = 2
latency = "0"
reply_tokens = 5

[agents.lead]
model = "sim"
system_prompt = "You split the work."
spawnable_agents = ["worker"]

[agents.worker]
model = "sim"
system_prompt = "You split it again."
spawnable_agents = ["leaf"]

[agents.leaf]
model = "sim"
system_prompt = "You answer."
"#
        ),
    )
    .unwrap();
    path.display().to_string()
}

/// `gen_ai.usage.*_tokens` (and a span's `step`) reach the collector as
/// OTLP integers; they were strings ("12"), which a collector cannot sum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_counts_reach_the_collector_as_integers_not_strings() {
    let dir = tempfile::tempdir().unwrap();
    let (base, received) = receiver().await;
    let config = tree_config(dir.path(), None);
    let out = arbor_run(
        dir.path(),
        &["--config", &config, "--agent", "lead", "split it"],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &base)],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let spans = received.spans();
    let chats: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name.starts_with("chat "))
        .collect();
    assert!(chats.len() >= 7, "{spans:#?}");
    for chat in chats {
        for key in [
            "gen_ai.usage.input_tokens",
            "gen_ai.usage.output_tokens",
            "step",
        ] {
            match value(&chat.attributes, key) {
                Some(Any::IntValue(n)) => assert!(*n > 0, "{key} = {n}"),
                other => panic!("{key} is {other:?}, not an integer: {chat:#?}"),
            }
        }
    }
}

/// An OpenAI endpoint on loopback that refuses every request with 400 (a
/// rejection: not retried).
async fn refusing_endpoint() -> String {
    use axum::response::IntoResponse as _;
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(|| async {
            (
                StatusCode::BAD_REQUEST,
                axum::Json(
                    json!({"error": {"message": "no such thing", "type": "invalid_request_error"}}),
                ),
            )
                .into_response()
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/v1")
}

/// A model call that fails, and the agent it fails, end with span status
/// ERROR (the message as its description) and `error.type` the failure's
/// kind; their status was left unset, so a collector counted them as fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_model_call_and_its_agent_are_spans_with_status_error_and_error_type() {
    let dir = tempfile::tempdir().unwrap();
    let (base, received) = receiver().await;
    let model_url = refusing_endpoint().await;
    let config = dir.path().join("refused.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[store]
enabled = false

[models.remote]
provider = "openai"
base_url = "{model_url}"
model = "test-model"
stream = false

[agents.solo]
model = "remote"
system_prompt = "Answer."
"#
        ),
    )
    .unwrap();
    let config = config.display().to_string();
    let out = arbor_run(
        dir.path(),
        &["--config", &config, "--agent", "solo", "go"],
        &[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            &format!("{base}/v1/traces"),
        )],
    )
    .await;
    // The tree ran and failed on the model's refusal (not on the command line).
    assert!(!out.status.success());
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(said.contains("no such thing"), "{said}");
    let spans = received.spans();
    let chat = spans
        .iter()
        .find(|s| s.name == "chat test-model")
        .unwrap_or_else(|| panic!("no chat span: {spans:#?}"));
    let agent = spans
        .iter()
        .find(|s| s.name == "invoke_agent solo")
        .unwrap_or_else(|| panic!("no agent span: {spans:#?}"));
    for span in [chat, agent] {
        let status = span.status.as_ref().unwrap_or_else(|| panic!("{span:#?}"));
        assert_eq!(status.code, SpanStatus::Error as i32, "{span:#?}");
        assert!(status.message.contains("no such thing"), "{status:?}");
        assert_eq!(
            string(&span.attributes, "error.type").as_deref(),
            Some("model_rejected"),
            "{span:#?}"
        );
    }
    // A span that did not fail keeps its status unset.
    let tree = spans.iter().find(|s| s.name.starts_with("tree")).unwrap();
    assert_ne!(
        tree.status.as_ref().map(|s| s.code),
        Some(SpanStatus::Error as i32)
    );
}

/// `arbor run` with nothing but the OpenTelemetry variables exports: one
/// trace per tree (two runs, two traces, each rooted at its `tree` span),
/// as `OTEL_SERVICE_NAME`, with `OTEL_EXPORTER_OTLP_HEADERS` on every
/// request; and the environment wins over the config's `otlp_endpoint`.
/// It exported nothing and read none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arbor_run_with_only_otel_variables_exports_one_trace_per_tree_as_otel_service_name() {
    let dir = tempfile::tempdir().unwrap();
    let (base, received) = receiver().await;
    let (config_base, config_received) = receiver().await;
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", base.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_SERVICE_NAME", "arbor-under-test"),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "authorization=Bearer%20otel-t0k",
        ),
    ];
    let mut trees = Vec::new();
    for (n, otlp) in [None, Some(format!("{config_base}/v1/traces"))]
        .into_iter()
        .enumerate()
    {
        let config = tree_config(dir.path(), otlp.as_deref());
        let tree = format!("otel-tree-{n}");
        let out = arbor_run(
            dir.path(),
            &[
                "--config",
                &config,
                "--json",
                "--tree-id",
                &tree,
                "--agent",
                "lead",
                "split it",
            ],
            &env,
        )
        .await;
        assert!(out.status.success(), "{}", text(&out.stderr));
        trees.push(tree);
    }
    assert!(
        config_received.spans().is_empty(),
        "the config's endpoint got spans though OTEL_EXPORTER_OTLP_ENDPOINT is set"
    );
    assert_eq!(
        received.service_names(),
        HashSet::from(["arbor-under-test".to_owned()])
    );
    let auth = received.headers("authorization");
    assert!(!auth.is_empty());
    assert!(
        auth.iter().all(|v| v.as_deref() == Some("Bearer otel-t0k")),
        "{auth:?}"
    );
    let spans = received.spans();
    // Each tree is one trace: its spans share the trace of its `tree` span,
    // the trace's one root.
    let tree_spans: Vec<&Span> = spans.iter().filter(|s| s.name == "tree lead").collect();
    assert_eq!(tree_spans.len(), 2, "{spans:#?}");
    let mut seen_trees = HashSet::new();
    for tree_span in &tree_spans {
        assert!(tree_span.parent_span_id.is_empty(), "{tree_span:#?}");
        let tree_id = string(&tree_span.attributes, "arbor.tree.id").unwrap();
        seen_trees.insert(tree_id);
        let trace: Vec<&Span> = spans
            .iter()
            .filter(|s| s.trace_id == tree_span.trace_id)
            .collect();
        let roots = trace.iter().filter(|s| s.parent_span_id.is_empty()).count();
        assert_eq!(roots, 1, "{}", hex(&tree_span.trace_id));
        let agents = trace
            .iter()
            .filter(|s| s.name.starts_with("invoke_agent "))
            .count();
        assert_eq!(agents, 7, "{}", hex(&tree_span.trace_id));
    }
    assert_eq!(seen_trees, trees.into_iter().collect::<HashSet<_>>());
    let traces: HashSet<&[u8]> = spans.iter().map(|s| &s.trace_id[..]).collect();
    assert_eq!(traces.len(), 2, "one trace per tree");
}

/// A protocol Arbor does not send is refused, naming the variable, rather
/// than sending protobuf to a collector that expects another encoding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_otlp_protocol_arbor_does_not_send_is_refused_with_the_variable_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = tree_config(dir.path(), None);
    let out = arbor_run(
        dir.path(),
        &["--config", &config, "--agent", "lead", "split it"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ],
    )
    .await;
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("OTEL_EXPORTER_OTLP_PROTOCOL=\"grpc\"") && stderr.contains("http/protobuf"),
        "{stderr}"
    );
}

/// `arbor serve` too exports where the OpenTelemetry variables say (no
/// `otlp_endpoint` in its config), as `OTEL_SERVICE_NAME`: it read only
/// the config's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arbor_serve_with_only_otel_variables_exports_its_trees_as_otel_service_name() {
    use crate::serve::{Server, TOKEN, post};
    let dir = tempfile::tempdir().unwrap();
    let (base, received) = receiver().await;
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        r#"
[store]
path = "arbor.db"

[service]
bind = "127.0.0.1:0"
shutdown_timeout = "5s"

[models.sim]
provider = "simulated"
fanout = 2
depth = 1
latency = "0"

[agents.lead]
model = "sim"
system_prompt = "You split the work."
spawnable_agents = ["leaf"]

[agents.leaf]
model = "sim"
system_prompt = "You answer."
"#,
    )
    .unwrap();
    let config = config.display().to_string();
    let traces = format!("{base}/v1/traces");
    let mut server = Server::start_env(
        dir.path(),
        &["--config", &config],
        Some(TOKEN),
        &[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &traces),
            ("OTEL_SERVICE_NAME", "arbor-serve-under-test"),
        ],
    );
    server.wait_for("ready");
    let (status, created) = post(
        &server,
        "/v1/runs",
        json!({"agent": "lead", "prompt": "go"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let line = tokio::task::block_in_place(|| server.wait_for("tree ended"));
    assert!(line.contains("completed"), "{line}");
    let (status, _) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(
        received.service_names(),
        HashSet::from(["arbor-serve-under-test".to_owned()])
    );
    let spans = received.spans();
    let tree = spans.iter().find(|s| s.name == "tree").unwrap();
    assert_eq!(
        string(&tree.attributes, "arbor.tree.id").as_deref(),
        created["treeId"].as_str()
    );
    let agents = spans
        .iter()
        .filter(|s| s.name.starts_with("invoke_agent ") && s.trace_id == tree.trace_id)
        .count();
    assert_eq!(agents, 3, "{spans:#?}");
}

/// Ctrl-C on `arbor run` exits at once (`std::process::exit`, no unwinding):
/// the spans that had ended (here the root's first model call) are sent
/// before it does, not dropped with the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arbor_run_stopped_by_ctrl_c_sends_the_spans_that_had_ended() {
    use crate::support::{GUARD, Lines, wait_exit};
    let dir = tempfile::tempdir().unwrap();
    let (base, received) = receiver().await;
    let config = dir.path().join("slow.toml");
    // The root answers at once with its spawn calls; the leaves take a
    // minute, so the tree is running when the signal comes.
    std::fs::write(
        &config,
        r#"
[store]
enabled = false

[models.sim]
provider = "simulated"
fanout = 2
depth = 1
latency = "0"

[models.slow]
provider = "simulated"
latency = "60s"

[agents.lead]
model = "sim"
system_prompt = "You split the work."
spawnable_agents = ["leaf"]

[agents.leaf]
model = "slow"
system_prompt = "You answer."
"#,
    )
    .unwrap();
    let config = config.display().to_string();
    let mut command = Command::new(env!("CARGO_BIN_EXE_arbor"));
    command
        .args([
            "run", "--config", &config, "--events", "--agent", "lead", "go",
        ])
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &base)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut lines = Lines::read(child.stderr.take().unwrap());
    let (status, said) = tokio::task::spawn_blocking(move || {
        // A leaf started: the root's model call had answered.
        let started = lines.wait_for(GUARD, |l| {
            l.contains("agentStarted") && l.contains("\"depth\":1")
        });
        assert!(started.is_some(), "{}", lines.rest());
        let pid = child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-INT", &pid])
                .status()
                .unwrap()
                .success()
        );
        let status = wait_exit(&mut child, GUARD);
        (status, lines.rest())
    })
    .await
    .unwrap();
    assert_eq!(status.code(), Some(130), "{said}");
    let spans = received.spans();
    assert!(
        spans.iter().any(|s| s.name == "chat sim"),
        "the root's model call was not sent: {spans:#?}\n{said}"
    );
}

/// A tool call that fails ends its `execute_tool` span with status ERROR
/// and `error.type = "tool_error"`; one that succeeds keeps it unset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_tool_call_is_a_span_with_status_error_and_error_type() {
    let dir = tempfile::tempdir().unwrap();
    let (base, received) = receiver().await;
    std::fs::write(
        dir.path().join("tools.toml"),
        r#"
[store]
enabled = false

[models.script]
provider = "scripted"
file = "script.json"

[tools.echo]
description = "Echoes its word."
input_schema = { type = "object", properties = { word = { type = "string" } }, required = ["word"] }
command = ["echo", "{word}"]

[tools.fail]
description = "Fails."
input_schema = { type = "object" }
command = ["sh", "-c", "echo broken >&2; exit 3"]

[agents.lead]
model = "script"
tools = ["echo", "fail"]
"#,
    )
    .unwrap();
    let script = json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [{"name": "echo", "input": {"word": "one"}},
                           {"name": "fail", "input": {}}]},
            {"text": "done"}
        ]}
    ]});
    std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
    let out = arbor_run(
        dir.path(),
        &["--config", "tools.toml", "--agent", "lead", "go"],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &base)],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let spans = received.spans();
    let tool = |name: &str| {
        spans
            .iter()
            .find(|s| s.name == format!("execute_tool {name}"))
            .unwrap_or_else(|| panic!("no {name} span: {spans:#?}"))
    };
    let failed = tool("fail");
    let status = failed.status.as_ref().unwrap();
    assert_eq!(status.code, SpanStatus::Error as i32, "{failed:#?}");
    assert_eq!(
        string(&failed.attributes, "error.type").as_deref(),
        Some("tool_error")
    );
    let ok = tool("echo");
    assert_ne!(
        ok.status.as_ref().map(|s| s.code),
        Some(SpanStatus::Error as i32),
        "{ok:#?}"
    );
    assert_eq!(string(&ok.attributes, "error.type"), None);
}

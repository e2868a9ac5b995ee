//! Shared helpers for the provider tests: settings pointing at a local server,
//! reply bodies in both wire formats, a delta collector, and a tiny
//! OpenAI-compatible server (axum) that counts and shapes what it serves. The
//! helpers every crate's tests share (the echo tool, scripted models, catalogs,
//! tree runners) are in the `arbor-test-support` crate.
#![allow(dead_code)]

pub mod browser;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arbor::actors::message::Message;
use arbor::actors::state::ToolDefinition;
use arbor::actors::{Delta, DeltaSink, Event, EventKind, ModelRequest};
use arbor::providers::{ApiKey, HttpSection, ProviderKind, ProviderSettings};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use wiremock::ResponseTemplate;

/// The model id every test server is asked for.
pub const MODEL_ID: &str = "test-model";
/// The key the provider tests send (not a secret).
pub const TEST_KEY: &str = "sk-test-key";

/// A guard against a stuck test (never reached when things work; no test waits on it).
pub const GUARD: Duration = Duration::from_secs(60);

/// Awaits `f`, failing the test if it is still pending after [`GUARD`].
pub async fn guarded<T>(f: impl std::future::Future<Output = T>) -> T {
    arbor_test_support::within(GUARD, f).await
}

/// The path a provider posts to.
pub fn path(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::OpenAi => "/v1/chat/completions",
        ProviderKind::Anthropic => "/v1/messages",
    }
}

/// The `base_url` for a server at `uri` (OpenAI's includes `/v1`).
pub fn base_url(kind: ProviderKind, uri: &str) -> String {
    match kind {
        ProviderKind::OpenAi => format!("{uri}/v1"),
        ProviderKind::Anthropic => uri.to_owned(),
    }
}

/// Settings for a test server, built the way a config table is: streaming,
/// tiny retry delays, generous guard timeouts (they never fire unless a test is
/// about them).
pub fn settings(kind: ProviderKind, uri: &str) -> ProviderSettings {
    let section: HttpSection = toml::from_str(&format!(
        r#"
base_url = "{}"
model = "{MODEL_ID}"
max_tokens = 256
retry = {{ max_retries = 3, base_delay = "1ms", max_delay = "1s" }}
timeouts = {{ connect = "5s", request = "30s", idle = "30s" }}
"#,
        base_url(kind, uri)
    ))
    .unwrap();
    let mut settings = ProviderSettings::from_section(kind, &section).unwrap();
    // As if read from `api_key_env` (setting a variable in-process needs `unsafe`).
    settings.api_key = Some(ApiKey::new(TEST_KEY.into()));
    settings
}

/// A request with one user message and, optionally, the `echo` tool.
pub fn request(with_echo: bool) -> ModelRequest {
    let mut tools = BTreeMap::new();
    if with_echo {
        tools.insert(
            "echo".to_owned(),
            ToolDefinition {
                description: "Answers with its input.".into(),
                input_schema: json!({"type": "object"}),
            },
        );
    }
    ModelRequest {
        system_prompt: Arc::from("You are a test."),
        messages: [Message::user("hi")].into_iter().collect(),
        tools: Arc::new(tools),
        meta: Default::default(),
    }
}

/// A sink that keeps every delta.
pub fn collector() -> (DeltaSink, Arc<Mutex<Vec<Delta>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink: DeltaSink = {
        let seen = seen.clone();
        Arc::new(move |d| seen.lock().unwrap().push(d))
    };
    (sink, seen)
}

/// `(attempt, delay_ms, reason)` of every `Retry` delta.
pub fn retries(deltas: &Mutex<Vec<Delta>>) -> Vec<(u32, u64, String)> {
    deltas
        .lock()
        .unwrap()
        .iter()
        .filter_map(|d| match d {
            Delta::Retry {
                attempt,
                delay_ms,
                reason,
            } => Some((*attempt, *delay_ms, reason.clone())),
            _ => None,
        })
        .collect()
}

/// `(step, attempt, delay_ms, reason)` of every `modelRetrying` event.
pub fn retry_events(events: &[Arc<Event>]) -> Vec<(u32, u32, u64, String)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ModelRetrying {
                step,
                attempt,
                delay_ms,
                reason,
            } => Some((*step, *attempt, *delay_ms, reason.clone())),
            _ => None,
        })
        .collect()
}

/// How many events have this name.
pub fn count(events: &[Arc<Event>], name: &str) -> usize {
    events.iter().filter(|e| e.kind.name() == name).count()
}

/// A 200 response carrying server-sent events.
pub fn sse(body: String) -> ResponseTemplate {
    ResponseTemplate::new(200)
        .insert_header("content-type", "text/event-stream")
        .set_body_string(body)
}

/// Reply bodies in one wire format.
pub mod wire {
    use super::*;

    fn openai_chunk(delta: Value, finish: Option<&str>) -> String {
        let chunk = json!({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "model": MODEL_ID,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
        });
        format!("data: {chunk}\n\n")
    }

    fn openai_usage() -> String {
        let chunk = json!({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "model": MODEL_ID,
            "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
        });
        format!("data: {chunk}\n\n")
    }

    fn anthropic_event(kind: &str, data: Value) -> String {
        format!("event: {kind}\ndata: {data}\n\n")
    }

    fn anthropic_start() -> String {
        anthropic_event(
            "message_start",
            json!({"type": "message_start", "message": {
                "id": "msg_1", "type": "message", "role": "assistant", "content": [],
                "model": MODEL_ID, "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 12, "output_tokens": 1}
            }}),
        ) + &anthropic_event("ping", json!({"type": "ping"}))
    }

    fn anthropic_end(stop_reason: &str) -> String {
        anthropic_event(
            "message_delta",
            json!({"type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                "usage": {"output_tokens": 5}}),
        ) + &anthropic_event("message_stop", json!({"type": "message_stop"}))
    }

    /// A complete streamed text reply.
    pub fn text_stream(kind: ProviderKind, text: &str) -> String {
        match kind {
            ProviderKind::OpenAi => {
                openai_chunk(json!({"role": "assistant", "content": ""}), None)
                    + &openai_chunk(json!({"content": text}), None)
                    + &openai_chunk(json!({}), Some("stop"))
                    + &openai_usage()
                    + "data: [DONE]\n\n"
            }
            ProviderKind::Anthropic => {
                anthropic_start()
                    + &anthropic_event(
                        "content_block_start",
                        json!({"type": "content_block_start", "index": 0,
                            "content_block": {"type": "text", "text": ""}}),
                    )
                    + &anthropic_event(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": 0,
                            "delta": {"type": "text_delta", "text": text}}),
                    )
                    + &anthropic_event(
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": 0}),
                    )
                    + &anthropic_end("end_turn")
            }
        }
    }

    /// The start of a streamed tool call to `name`, with `chunks` of its
    /// arguments, and nothing after them (no end of block, no `[DONE]`).
    pub fn tool_stream_cut(kind: ProviderKind, id: &str, name: &str, chunks: &[&str]) -> String {
        match kind {
            ProviderKind::OpenAi => {
                let mut body = openai_chunk(
                    json!({"role": "assistant", "content": null, "tool_calls": [{
                        "index": 0, "id": id, "type": "function",
                        "function": {"name": name, "arguments": ""}
                    }]}),
                    None,
                );
                for c in chunks {
                    body += &openai_chunk(
                        json!({"tool_calls": [{"index": 0, "function": {"arguments": c}}]}),
                        None,
                    );
                }
                body
            }
            ProviderKind::Anthropic => {
                let mut body = anthropic_start()
                    + &anthropic_event(
                        "content_block_start",
                        json!({"type": "content_block_start", "index": 0,
                            "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
                    );
                for c in chunks {
                    body += &anthropic_event(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": 0,
                            "delta": {"type": "input_json_delta", "partial_json": c}}),
                    );
                }
                body
            }
        }
    }

    /// A complete streamed tool call.
    pub fn tool_stream(kind: ProviderKind, id: &str, name: &str, chunks: &[&str]) -> String {
        let body = tool_stream_cut(kind, id, name, chunks);
        match kind {
            ProviderKind::OpenAi => {
                body + &openai_chunk(json!({}), Some("tool_calls"))
                    + &openai_usage()
                    + "data: [DONE]\n\n"
            }
            ProviderKind::Anthropic => {
                body + &anthropic_event(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": 0}),
                ) + &anthropic_end("tool_use")
            }
        }
    }

    /// A stream whose first content chunk is not JSON.
    pub fn malformed_stream(kind: ProviderKind) -> String {
        match kind {
            ProviderKind::OpenAi => {
                openai_chunk(json!({"role": "assistant", "content": ""}), None)
                    + "data: {\"choices\": [{\"index\": 0, \"delta\": {\"content\": \"oops\n\n"
            }
            ProviderKind::Anthropic => {
                anthropic_start()
                    + "event: content_block_start\ndata: {\"type\": \"content_block_start\", \"index\": 0, \"content_bl\n\n"
            }
        }
    }

    /// A complete non-streamed text reply.
    pub fn text_json(kind: ProviderKind, text: &str) -> Value {
        match kind {
            ProviderKind::OpenAi => json!({
                "id": "chatcmpl-1", "object": "chat.completion", "model": MODEL_ID,
                "choices": [{"index": 0, "finish_reason": "stop",
                    "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
            }),
            ProviderKind::Anthropic => json!({
                "id": "msg_1", "type": "message", "role": "assistant", "model": MODEL_ID,
                "content": [{"type": "text", "text": text}],
                "stop_reason": "end_turn", "stop_sequence": null,
                "usage": {"input_tokens": 12, "output_tokens": 5}
            }),
        }
    }

    /// An error body as the API sends it.
    pub fn error_json(kind: ProviderKind, message: &str) -> Value {
        match kind {
            ProviderKind::OpenAi => json!({"error": {
                "message": message, "type": "invalid_request_error", "param": null, "code": null
            }}),
            ProviderKind::Anthropic => json!({"type": "error", "error": {
                "type": "invalid_request_error", "message": message
            }}),
        }
    }
}

/// What the fake server answers instead of a reply.
#[derive(Clone, Debug)]
pub struct Fault {
    pub status: u16,
    pub retry_after: Option<&'static str>,
    pub body: String,
}

/// Decides, from the request's number (from 0) and its `Authorization` header,
/// whether it fails.
pub type FaultFn = Arc<dyn Fn(usize, &str) -> Option<Fault> + Send + Sync>;

/// What the fake server has seen.
#[derive(Default)]
pub struct Stats {
    pub requests: AtomicUsize,
    pub in_flight: AtomicUsize,
    pub max_in_flight: AtomicUsize,
    pub failures: AtomicUsize,
    /// The `Authorization` header of every request.
    pub authorizations: Mutex<Vec<String>>,
}

struct Shared {
    stats: Arc<Stats>,
    hold: Duration,
    faults: Option<FaultFn>,
}

/// A tiny OpenAI Chat Completions server (non-streaming) on 127.0.0.1.
///
/// An agent whose system prompt is `spawn TYPE N` and whose tools include
/// `spawn_agents` is told to spawn N children of TYPE on its first step; every
/// other request is answered with text. Each request stays in flight for
/// `hold` (load shaping, so concurrent requests overlap at the server).
pub struct FakeOpenAi {
    /// `http://127.0.0.1:PORT`.
    pub uri: String,
    /// The `base_url` (ends in `/v1`).
    pub base_url: String,
    pub stats: Arc<Stats>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeOpenAi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeOpenAi {
    pub async fn start(hold: Duration, faults: Option<FaultFn>) -> FakeOpenAi {
        let stats = Arc::new(Stats::default());
        let shared = Arc::new(Shared {
            stats: stats.clone(),
            hold,
            faults,
        });
        let app = axum::Router::new()
            .route("/v1/chat/completions", axum::routing::post(chat))
            .with_state(shared);
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        FakeOpenAi {
            uri: format!("http://{addr}"),
            base_url: format!("http://{addr}/v1"),
            stats,
            task,
        }
    }

    pub fn requests(&self) -> usize {
        self.stats.requests.load(Ordering::SeqCst)
    }

    pub fn failures(&self) -> usize {
        self.stats.failures.load(Ordering::SeqCst)
    }

    pub fn max_in_flight(&self) -> usize {
        self.stats.max_in_flight.load(Ordering::SeqCst)
    }

    /// The `Authorization` header of every request so far.
    pub fn authorizations(&self) -> Vec<String> {
        self.stats.authorizations.lock().unwrap().clone()
    }
}

async fn chat(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: String) -> Response {
    let stats = &shared.stats;
    let n = stats.requests.fetch_add(1, Ordering::SeqCst);
    let now = stats.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    stats.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let authorization = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    stats
        .authorizations
        .lock()
        .unwrap()
        .push(authorization.clone());
    if !shared.hold.is_zero() {
        tokio::time::sleep(shared.hold).await;
    }
    let fault = shared.faults.as_ref().and_then(|f| f(n, &authorization));
    let response = match fault {
        Some(fault) => {
            stats.failures.fetch_add(1, Ordering::SeqCst);
            let status = StatusCode::from_u16(fault.status).unwrap();
            let mut response = (
                status,
                [("content-type", "application/json")],
                fault.body.clone(),
            )
                .into_response();
            if let Some(after) = fault.retry_after {
                response
                    .headers_mut()
                    .insert("retry-after", after.parse().unwrap());
            }
            response
        }
        None => match serde_json::from_str::<Value>(&body) {
            Ok(request) => axum::Json(answer(n, &request)).into_response(),
            Err(e) => (StatusCode::BAD_REQUEST, format!("bad JSON: {e}")).into_response(),
        },
    };
    stats.in_flight.fetch_sub(1, Ordering::SeqCst);
    response
}

/// The reply to one chat request (see [`FakeOpenAi`]).
fn answer(n: usize, request: &Value) -> Value {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let system = messages
        .iter()
        .find(|m| m["role"] == "system")
        .and_then(|m| m["content"].as_str())
        .unwrap_or("");
    let has_spawn = request["tools"].as_array().is_some_and(|tools| {
        tools
            .iter()
            .any(|t| t["function"]["name"] == "spawn_agents")
    });
    let has_result = messages.iter().any(|m| m["role"] == "tool");
    let directive: Vec<&str> = system.split_whitespace().collect();
    let message = match directive.as_slice() {
        ["spawn", agent_type, count] if has_spawn && !has_result => {
            let count: usize = count.parse().unwrap();
            let agents: Vec<Value> = (0..count)
                .map(|i| json!({"agent_type": agent_type, "prompt": format!("part {i}")}))
                .collect();
            json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": format!("call_{n}"), "type": "function",
                "function": {"name": "spawn_agents", "arguments": json!({"agents": agents}).to_string()}
            }]})
        }
        _ => {
            let last = messages
                .last()
                .and_then(|m| m["content"].as_str())
                .unwrap_or("results");
            json!({"role": "assistant", "content": format!("done with {last}")})
        }
    };
    json!({
        "id": format!("chatcmpl-{n}"), "object": "chat.completion", "model": request["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    })
}

/// The lines a child process writes to one of its pipes, read on a thread of
/// their own: every line is kept, and awaited with a bound.
pub struct Lines {
    rx: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    pub fn read(pipe: impl std::io::Read + Send + 'static) -> Lines {
        use std::io::BufRead;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines {
            rx,
            seen: Vec::new(),
        }
    }

    /// Waits (at most `within`) for a line `found` accepts; `None` if the
    /// pipe closed or the time ran out first.
    pub fn wait_for(&mut self, within: Duration, found: impl Fn(&str) -> bool) -> Option<String> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let left = deadline.checked_duration_since(std::time::Instant::now())?;
            let line = self.rx.recv_timeout(left).ok()?;
            self.seen.push(line.clone());
            if found(&line) {
                return Some(line);
            }
        }
    }

    /// Everything read so far and up to the pipe's end (the process has exited).
    pub fn rest(&mut self) -> String {
        while let Ok(line) = self.rx.recv_timeout(GUARD) {
            self.seen.push(line);
        }
        self.seen.join("\n")
    }
}

/// Waits (at most `within`) for a child process to exit.
pub fn wait_exit(child: &mut std::process::Child, within: Duration) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "process {} still running after {within:?}",
            child.id()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `check` (at most `within`) until it gives a value.
pub fn poll<T>(within: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Raises this process's soft limit on open files to its hard limit (child
/// processes started afterwards inherit it) and returns the limit; fails the
/// test if even the hard limit is below `needed`.
pub fn raise_open_files_limit(needed: u64) -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    }
    assert!(
        hard >= needed,
        "this test needs {needed} open files; the hard limit is {hard} (raise it: ulimit -Hn)"
    );
    hard
}

/// The process that listens on loopback `port` (among the processes this
/// user may look into), found by its listening socket's inode.
pub fn listening_pid(port: u16) -> Option<u32> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let local = format!("0100007F:{port:04X}");
    let inode = table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(1) == Some(&local.as_str()) && fields.get(3) == Some(&"0A"))
            .then(|| fields.get(9).map(|s| s.to_string()))
            .flatten()
    })?;
    let socket = format!("socket:[{inode}]");
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let fds = std::fs::read_dir(entry.path().join("fd")).ok()?;
            fds.flatten()
                .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.to_str() == Some(&socket)))
                .then_some(pid)
        })
}

/// A database of its own on the throwaway Postgres server of `ARBOR_PG_URL`
/// (`tests/pg/start`), created for one test and dropped with this. Fails
/// (never skips) without the variable.
pub struct PgDatabase {
    server: String,
    name: String,
}

impl PgDatabase {
    /// A fresh database named after `test` (and this process).
    pub fn new(test: &str) -> PgDatabase {
        let server = std::env::var("ARBOR_PG_URL").unwrap_or_else(|_| {
            panic!(
                "ARBOR_PG_URL is unset: start a throwaway server with \
                 `eval \"$(tests/pg/start)\"` (it prints ARBOR_PG_URL), then run the tests again"
            )
        });
        let server = server.trim_end_matches('/').to_owned();
        let name = format!("arbor_{test}_{}", std::process::id());
        psql(
            &format!("{server}/postgres"),
            &format!("CREATE DATABASE {name}"),
        );
        PgDatabase { server, name }
    }

    /// Its URL (what `--store` and `[store] url` take).
    pub fn url(&self) -> String {
        format!("{}/{}", self.server, self.name)
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        psql(
            &format!("{}/postgres", self.server),
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}

/// Runs one statement with `psql` (unaligned, tuples only); its output.
pub fn psql(url: &str, sql: &str) -> String {
    let out = std::process::Command::new("psql")
        .args([
            url,
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        ])
        .output()
        .expect("psql runs (Debian's postgresql-client; tests/pg/start installs it)");
    assert!(
        out.status.success(),
        "psql {sql:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

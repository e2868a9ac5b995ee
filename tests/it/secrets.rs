//! Secrets planted in a config (a stdio MCP server's `env`, an HTTP MCP
//! server's `headers`, `url` password and bearer token, a model's `base_url`
//! password and `headers`) and the service's API token reach the endpoints
//! that need them and nothing else: not the store's bytes, `arbor export`,
//! the CLI's listings, trace-level logs (text and JSON), `/metrics`, any API
//! answer, the event stream or error text. A tree resumed or continued from
//! its stored config, which has the values redacted, sends the real ones,
//! taken from the config file in force now.
//!
//! Everything runs on loopback: one axum server here is both the model (an
//! OpenAI-compatible endpoint) and the HTTP MCP server, and refuses a request
//! without the real credentials; the stdio MCP server is a small Python
//! script that writes the variable it got to a file the test reads.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::support::guarded;

/// The password in the model's `base_url`.
const MODEL_URL_PASSWORD: &str = "pw-model-url-5d1e7a";
/// A literal value of the model's `headers`.
const MODEL_HEADER: &str = "hdr-model-9b3c21";
/// A literal value of the stdio MCP server's `env`.
const MCP_ENV: &str = "env-mcp-4e8f02";
/// A literal value of the HTTP MCP server's `headers`.
const MCP_HEADER: &str = "hdr-mcp-7a6d13";
/// The password in the HTTP MCP server's `url`.
const MCP_URL_PASSWORD: &str = "pw-mcp-url-2c9b84";
/// The HTTP MCP server's bearer token (from `BEARER_VAR`).
const MCP_BEARER: &str = "tok-mcp-bearer-6f0a55";
/// The service's API token (from `ARBOR_API_TOKENS`).
const API_TOKEN: &str = "tok-api-3b7e91";
/// The variable `bearer_token_env` names.
const BEARER_VAR: &str = "ARBOR_TEST_SECRETS_MCP_TOKEN";
/// The user names of the two URLs (not secret).
const MODEL_USER: &str = "modeluser";
const MCP_USER: &str = "mcpuser";

/// How long one wait may take before the test fails (never a pass).
const GUARD: Duration = Duration::from_secs(60);

/// Every planted secret, and the forms it travels in (a URL's password goes
/// out as `Authorization: Basic base64(user:password)`), with a name for
/// messages.
fn planted() -> Vec<(&'static str, String)> {
    vec![
        ("the model's base_url password", MODEL_URL_PASSWORD.into()),
        (
            "the model's base_url credentials (Basic)",
            base64(&format!("{MODEL_USER}:{MODEL_URL_PASSWORD}")),
        ),
        ("the model's header value", MODEL_HEADER.into()),
        ("the MCP server's env value", MCP_ENV.into()),
        ("the MCP server's header value", MCP_HEADER.into()),
        ("the MCP server's url password", MCP_URL_PASSWORD.into()),
        (
            "the MCP server's url credentials (Basic)",
            base64(&format!("{MCP_USER}:{MCP_URL_PASSWORD}")),
        ),
        ("the MCP server's bearer token", MCP_BEARER.into()),
        ("the API token", API_TOKEN.into()),
    ]
}

/// Fails, naming the secret and where, if any planted secret is in `bytes`.
fn assert_clean(place: &str, bytes: &[u8]) {
    for (what, secret) in planted() {
        if let Some(at) = bytes
            .windows(secret.len())
            .position(|w| w == secret.as_bytes())
        {
            let from = at.saturating_sub(200);
            let to = (at + secret.len() + 200).min(bytes.len());
            panic!(
                "{what} reached {place}: …{}…",
                String::from_utf8_lossy(&bytes[from..to])
            );
        }
    }
}

/// Standard base64 with padding (what `Authorization: Basic` carries).
fn base64(text: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in text.as_bytes().chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

// ---- the endpoint: model and HTTP MCP server ----

/// What the endpoint has seen, and whether it holds requests.
#[derive(Default)]
struct Seen {
    /// The headers of every model request.
    model: Mutex<Vec<HeaderMap>>,
    /// The headers of every MCP request.
    mcp: Mutex<Vec<HeaderMap>>,
    /// Requests refused for missing or wrong credentials.
    refused: AtomicUsize,
    /// Whether a model request whose body says `HOLD` is held unanswered.
    hold: AtomicBool,
    /// Model requests held so far.
    held: AtomicUsize,
    /// `tools/call`s answered.
    calls: AtomicUsize,
}

impl Seen {
    fn model_requests(&self) -> usize {
        self.model.lock().unwrap().len()
    }
    fn mcp_requests(&self) -> usize {
        self.mcp.lock().unwrap().len()
    }
}

/// Every `Authorization` value of a request.
fn authorizations(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all("authorization")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_owned))
        .collect()
}

fn header<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Whether a model request carries the real credentials.
fn model_credentials(headers: &HeaderMap) -> bool {
    let basic = format!(
        "Basic {}",
        base64(&format!("{MODEL_USER}:{MODEL_URL_PASSWORD}"))
    );
    authorizations(headers).contains(&basic) && header(headers, "x-model-key") == Some(MODEL_HEADER)
}

/// Whether an MCP request carries the real credentials.
fn mcp_credentials(headers: &HeaderMap) -> bool {
    let basic = format!(
        "Basic {}",
        base64(&format!("{MCP_USER}:{MCP_URL_PASSWORD}"))
    );
    let auth = authorizations(headers);
    auth.contains(&basic)
        && auth.contains(&format!("Bearer {MCP_BEARER}"))
        && header(headers, "x-mcp-key") == Some(MCP_HEADER)
}

fn refuse(seen: &Seen) -> Response {
    seen.refused.fetch_add(1, Ordering::SeqCst);
    (
        StatusCode::UNAUTHORIZED,
        axum::Json(json!({"error": {"message": "missing or wrong credentials"}})),
    )
        .into_response()
}

/// An OpenAI chat completion: a first step calls both MCP tools, the next
/// one answers. A body saying `HOLD` is never answered while `hold` is set.
async fn chat(State(seen): State<Arc<Seen>>, headers: HeaderMap, body: String) -> Response {
    let ok = model_credentials(&headers);
    seen.model.lock().unwrap().push(headers);
    if !ok {
        return refuse(&seen);
    }
    if body.contains("HOLD") && seen.hold.load(Ordering::SeqCst) {
        seen.held.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<()>().await;
    }
    let request: Value = serde_json::from_str(&body).unwrap_or_default();
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let has_result = messages.iter().any(|m| m["role"] == "tool");
    let message = if body.contains("local__check") && !has_result {
        let call = |id: &str, name: &str| json!({"id": id, "type": "function", "function": {"name": name, "arguments": "{}"}});
        json!({"role": "assistant", "content": null, "tool_calls": [
            call("call_local", "local__check"), call("call_remote", "remote__check")
        ]})
    } else {
        json!({"role": "assistant", "content": "both tools answered"})
    };
    axum::Json(json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": request["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    }))
    .into_response()
}

/// A streamable HTTP MCP server with one tool, answering in JSON.
async fn mcp(State(seen): State<Arc<Seen>>, headers: HeaderMap, body: String) -> Response {
    let ok = mcp_credentials(&headers);
    seen.mcp.lock().unwrap().push(headers);
    if !ok {
        return refuse(&seen);
    }
    let message: Value = serde_json::from_str(&body).unwrap_or_default();
    let Some(id) = message.get("id") else {
        return StatusCode::ACCEPTED.into_response();
    };
    let result = match message["method"].as_str() {
        Some("initialize") => json!({
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "remote", "version": "1.0.0"}
        }),
        Some("tools/list") => json!({"tools": [{
            "name": "check", "description": "Says it was reached.",
            "inputSchema": {"type": "object", "properties": {}}
        }]}),
        Some("tools/call") => {
            seen.calls.fetch_add(1, Ordering::SeqCst);
            json!({"content": [{"type": "text", "text": "remote reached"}]})
        }
        _ => json!({}),
    };
    axum::Json(json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response()
}

/// The endpoint on a loopback port; aborted when dropped.
struct Endpoint {
    port: u16,
    seen: Arc<Seen>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Endpoint {
    async fn start() -> Endpoint {
        let seen = Arc::new(Seen::default());
        let app = axum::Router::new()
            .route("/v1/chat/completions", axum::routing::post(chat))
            .route("/mcp", axum::routing::post(mcp))
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Endpoint { port, seen, task }
    }

    /// Fails unless every request so far carried the real credentials and
    /// both servers were used.
    fn assert_real_values_sent(&self, model_from: usize, mcp_from: usize) {
        let seen = &self.seen;
        assert_eq!(
            seen.refused.load(Ordering::SeqCst),
            0,
            "a request was refused"
        );
        let model = seen.model.lock().unwrap();
        assert!(model.len() > model_from, "no model request");
        assert!(model[model_from..].iter().all(model_credentials));
        let mcp = seen.mcp.lock().unwrap();
        assert!(mcp.len() > mcp_from, "no MCP request");
        assert!(mcp[mcp_from..].iter().all(mcp_credentials));
    }
}

/// A stdio MCP server with one tool; it appends the value of
/// `LOCAL_SECRET` it was started with to the file its argument names.
const LOCAL_SERVER: &str = r#"
import json, os, sys
with open(sys.argv[1], "a") as seen:
    seen.write(os.environ.get("LOCAL_SECRET", "(unset)") + "\n")
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    method = message.get("method")
    if method == "initialize":
        result = {"protocolVersion": message["params"]["protocolVersion"],
                  "capabilities": {"tools": {}},
                  "serverInfo": {"name": "local", "version": "1.0.0"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "check", "description": "Says it was reached.",
                             "inputSchema": {"type": "object", "properties": {}}}]}
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": "local reached"}]}
    else:
        result = {}
    print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)
"#;

/// A test's directory: the config with every secret planted, the stdio
/// server's script and the file it writes.
struct Setup {
    dir: tempfile::TempDir,
    endpoint: Endpoint,
}

impl Setup {
    async fn new() -> Setup {
        let endpoint = Endpoint::start().await;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("local_server.py"), LOCAL_SERVER).unwrap();
        let setup = Setup { dir, endpoint };
        std::fs::write(setup.config(), setup.config_text("")).unwrap();
        setup
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn config(&self) -> PathBuf {
        self.path("secrets.toml")
    }

    fn store(&self) -> PathBuf {
        self.path("arbor.db")
    }

    /// The config, with `extra` at its end.
    fn config_text(&self, extra: &str) -> String {
        let port = self.endpoint.port;
        let script = self.path("local_server.py");
        let seen = self.path("local_seen.txt");
        format!(
            r#"[models.m]
provider = "openai"
base_url = "http://{MODEL_USER}:{MODEL_URL_PASSWORD}@127.0.0.1:{port}/v1"
model = "test"
stream = false
retry = {{ max_retries = 0 }}
headers = {{ "X-Model-Key" = "{MODEL_HEADER}", "X-Title" = "arbor tests" }}

[mcp_servers.local]
command = "python3"
args = [{script:?}, {seen:?}]
env = {{ LOCAL_SECRET = "{MCP_ENV}" }}

[mcp_servers.remote]
url = "http://{MCP_USER}:{MCP_URL_PASSWORD}@127.0.0.1:{port}/mcp"
headers = {{ "X-Mcp-Key" = "{MCP_HEADER}" }}
bearer_token_env = "{BEARER_VAR}"

[agents.solo]
model = "m"
system_prompt = "Check both tools."
tools = ["local/*", "remote/*"]
max_steps = 4
{extra}"#
        )
    }

    /// The values of `LOCAL_SECRET` the stdio server was started with.
    fn local_env_seen(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("local_seen.txt"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// A command running `arbor ARGS` in the test's directory with trace
    /// logging and the bearer token's variable set.
    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_arbor"));
        command
            .args(args)
            .current_dir(self.dir.path())
            .env("RUST_LOG", "trace")
            .env_remove("RUST_LOG_STYLE")
            .env_remove("ARBOR_API_TOKENS")
            .env(BEARER_VAR, MCP_BEARER)
            .kill_on_drop(true);
        command
    }

    /// Runs `arbor ARGS` (bounded); every byte it printed is checked for
    /// secrets. Returns its output.
    async fn arbor(&self, args: &[&str]) -> Output {
        let out = guarded(self.command(args).output()).await.unwrap();
        let place = format!("the output of `arbor {}`", args.join(" "));
        assert_clean(&place, &out.stdout);
        assert_clean(&place, &out.stderr);
        assert!(
            !crate::text(&out.stderr).contains("panicked"),
            "{place}: {}",
            crate::text(&out.stderr)
        );
        out
    }

    /// The store's files (the database, its WAL and shared memory), checked
    /// for secrets as bytes; returns how many bytes were read.
    fn assert_store_clean(&self) -> usize {
        let mut read = 0;
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let path = PathBuf::from(format!("{}{suffix}", self.store().display()));
            if let Ok(bytes) = std::fs::read(&path) {
                assert_clean(&format!("the store's file {suffix:?}"), &bytes);
                read += bytes.len();
            }
        }
        assert!(read > 0, "no store file was read");
        read
    }
}

/// Polls `check` (at most [`GUARD`]) without blocking the runtime.
async fn until<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A final state printed by `arbor run --json`, checked to be completed.
fn completed(out: &Output) -> Value {
    assert_eq!(out.status.code(), Some(0), "{}", crate::text(&out.stderr));
    let state: Value = serde_json::from_str(&crate::text(&out.stdout)).unwrap();
    assert_eq!(state["status"], "completed", "{state}");
    state
}

// ---- the service ----

/// `arbor serve` on a loopback port with trace-level JSON logs in files.
struct Served {
    child: tokio::process::Child,
    base: String,
    log: PathBuf,
    errors: PathBuf,
}

impl Served {
    async fn start(setup: &Setup, config: &Path) -> Served {
        let log = setup.path("serve.log");
        let errors = setup.path("serve.err");
        let mut command = setup.command(&[
            "serve",
            "--config",
            config.to_str().unwrap(),
            "--store",
            setup.store().to_str().unwrap(),
            "--bind",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ]);
        command
            .env("ARBOR_API_TOKENS", API_TOKEN)
            .stdout(Stdio::from(std::fs::File::create(&log).unwrap()))
            .stderr(Stdio::from(std::fs::File::create(&errors).unwrap()));
        let child = command.spawn().unwrap();
        let base = until("the server to listen", || {
            let text = std::fs::read_to_string(&log).ok()?;
            let at = text.find("listening on http://")? + "listening on ".len();
            let addr: String = text[at..]
                .chars()
                .take_while(|c| !c.is_whitespace() && *c != '"')
                .collect();
            text.contains("ready").then_some(addr)
        })
        .await;
        Served {
            child,
            base,
            log,
            errors,
        }
    }

    /// A request without a token.
    fn anonymous(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        reqwest::Client::builder()
            .timeout(GUARD)
            .build()
            .unwrap()
            .request(method, format!("{}{path}", self.base))
    }

    /// A request with the API token.
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.anonymous(method, path).bearer_auth(API_TOKEN)
    }

    /// Sends `request`; its status, headers and body are checked for secrets.
    async fn answer(&self, what: &str, request: reqwest::RequestBuilder) -> (StatusCode, String) {
        let response = guarded(request.send()).await.unwrap();
        let status = StatusCode::from_u16(response.status().as_u16()).unwrap();
        let headers = format!("{:?}", response.headers());
        let body = guarded(response.text()).await.unwrap();
        assert_clean(
            &format!("the answer to {what} ({status})"),
            headers.as_bytes(),
        );
        assert_clean(&format!("the answer to {what} ({status})"), body.as_bytes());
        (status, body)
    }

    async fn get(&self, path: &str) -> (StatusCode, String) {
        self.answer(
            &format!("GET {path}"),
            self.request(reqwest::Method::GET, path),
        )
        .await
    }

    /// Starts a run (or a tree's next turn) and reads its event stream to the
    /// end; returns the run id and the stream's text.
    async fn run_to_end(&self, path: &str, body: Value) -> (String, String) {
        let (status, created) = self
            .answer(
                &format!("POST {path}"),
                self.request(reqwest::Method::POST, path).json(&body),
            )
            .await;
        assert!(status.is_success(), "{status}: {created}");
        let created: Value = serde_json::from_str(&created).unwrap();
        let run_id = created["runId"].as_str().unwrap().to_owned();
        let events = format!("/v1/runs/{}/events", run_id.replace('/', "%2F"));
        let (status, stream) = self.get(&events).await;
        assert_eq!(status, StatusCode::OK, "{stream}");
        (run_id, stream)
    }

    /// Ends the server with SIGTERM (bounded); its logs are checked for
    /// secrets and returned.
    async fn stop(mut self) -> String {
        let pid = self.child.id().unwrap().to_string();
        let killed = tokio::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .unwrap();
        assert!(killed.success());
        guarded(self.child.wait()).await.unwrap();
        let log = std::fs::read(&self.log).unwrap();
        assert_clean("the service's JSON log", &log);
        let errors = std::fs::read(&self.errors).unwrap();
        assert_clean("the service's stderr", &errors);
        crate::text(&log)
    }
}

/// The regression test of issue 33's third item: every planted secret is
/// used where it belongs and is absent from everything Arbor keeps or shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_secrets_reach_no_store_export_log_or_answer() {
    let setup = Setup::new().await;
    let config = setup.config();
    let config = config.to_str().unwrap();
    let store = setup.store();
    let store = store.to_str().unwrap();

    // A stored tree that uses both MCP servers on the model.
    let out = setup
        .arbor(&["run", "--config", config, "--store", store, "--json", "go"])
        .await;
    let state = completed(&out);
    assert!(
        crate::text(&out.stderr).contains("TRACE"),
        "trace logging is on, so the check covers it"
    );
    setup.endpoint.assert_real_values_sent(0, 0);
    assert_eq!(setup.endpoint.seen.calls.load(Ordering::SeqCst), 1);
    assert_eq!(setup.local_env_seen(), vec![MCP_ENV.to_owned()]);
    let run_id = state["runId"].as_str().unwrap().to_owned();
    let tree_id = run_id.split('/').next().unwrap().to_owned();
    setup.assert_store_clean();

    // What the store gives back, and the config's listings.
    let export = setup
        .arbor(&["export", "--config", config, "--store", store, &tree_id])
        .await;
    assert_eq!(export.status.code(), Some(0));
    let export = crate::text(&export.stdout);
    for kept in [
        "X-Model-Key",
        "X-Mcp-Key",
        "LOCAL_SECRET",
        MODEL_USER,
        MCP_USER,
    ] {
        assert!(
            export.contains(kept),
            "the config is exported ({kept}): {export}"
        );
    }
    for args in [
        vec!["models", "--config", config],
        vec!["agents", "--config", config],
        vec!["tools", "--config", config],
        vec!["check-config", config],
        vec!["show", "--config", config, "--store", store, &run_id],
        vec!["tree", "--config", config, "--store", store, &tree_id],
        vec!["runs", "--config", config, "--store", store],
        vec!["replay", "--store", store, &tree_id],
    ] {
        let out = setup.arbor(&args).await;
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            crate::text(&out.stderr)
        );
    }
    let models = setup.arbor(&["models", "--config", config]).await;
    let models = crate::text(&models.stdout);
    assert!(
        models.contains(&format!("{MODEL_USER}:***@127.0.0.1")),
        "{models}"
    );
    // An error that names the model's URL.
    let broken = setup.path("broken.toml");
    std::fs::write(&broken, setup.config_text("[run]\nagent = \"nobody\"\n")).unwrap();
    let out = setup
        .arbor(&[
            "run",
            "--config",
            broken.to_str().unwrap(),
            "--no-store",
            "go",
        ])
        .await;
    assert_ne!(out.status.code(), Some(0));

    // The service, on an edited file (so the first tree's next turn runs on
    // its stored config, with the values taken from this file).
    let edited = setup.path("edited.toml");
    std::fs::write(
        &edited,
        setup.config_text("# edited after the first tree\n"),
    )
    .unwrap();
    let started = setup.local_env_seen().len();
    let served = Served::start(&setup, &edited).await;
    let (model_from, mcp_from) = (
        setup.endpoint.seen.model_requests(),
        setup.endpoint.seen.mcp_requests(),
    );
    let (new_run, stream) = served
        .run_to_end("/v1/runs", json!({"agent": "solo", "prompt": "go"}))
        .await;
    assert!(stream.contains("agentFinished"), "{stream}");
    assert!(stream.contains("\"completed\""), "{stream}");
    let (turn_run, stream) = served
        .run_to_end(
            &format!("/v1/trees/{tree_id}/turns"),
            json!({"prompt": "again"}),
        )
        .await;
    assert!(stream.contains("\"completed\""), "{stream}");
    setup.endpoint.assert_real_values_sent(model_from, mcp_from);
    let new_tree = new_run.split('/').next().unwrap().to_owned();
    for path in [
        format!("/v1/trees/{tree_id}"),
        format!("/v1/trees/{new_tree}"),
        format!("/v1/runs/{}", run_id.replace('/', "%2F")),
        format!("/v1/runs/{}", new_run.replace('/', "%2F")),
        format!("/v1/runs/{}", turn_run.replace('/', "%2F")),
        "/v1/runs".to_owned(),
        "/v1/agents".to_owned(),
        "/v1/approvals".to_owned(),
        "/openapi.json".to_owned(),
        "/metrics".to_owned(),
        "/healthz".to_owned(),
        "/readyz".to_owned(),
        "/v1/trees/no-such-tree".to_owned(),
    ] {
        let (status, body) = served.get(&path).await;
        assert!(
            status.is_success() || path.contains("no-such"),
            "{path}: {status} {body}"
        );
    }
    // Error answers: an unknown agent, a bad body, a wrong token.
    let (status, _) = served
        .answer(
            "an unknown agent",
            served
                .request(reqwest::Method::POST, "/v1/runs")
                .json(&json!({"agent": "nobody", "prompt": "go"})),
        )
        .await;
    assert!(status.is_client_error(), "{status}");
    let (status, _) = served
        .answer(
            "a bad body",
            served
                .request(reqwest::Method::POST, "/v1/runs")
                .header("content-type", "application/json")
                .body("{"),
        )
        .await;
    assert!(status.is_client_error(), "{status}");
    let (status, _) = served
        .answer(
            "a wrong token",
            served
                .anonymous(reqwest::Method::GET, "/v1/runs")
                .bearer_auth("not-the-token"),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    setup.assert_store_clean();
    let log = served.stop().await;
    assert!(log.contains("\"TRACE\""), "trace-level JSON logs");
    assert!(
        log.contains("runs on the config it started with"),
        "the first tree's turn ran on its stored config"
    );
    let seen = setup.local_env_seen();
    assert!(seen.len() > started, "the service started it: {seen:?}");
    assert!(seen.iter().all(|v| v == MCP_ENV), "{seen:?}");
    setup.assert_store_clean();
}

/// A tree interrupted mid-step and resumed (with `--config` naming the same
/// file, and without it after the file was edited) runs on the real secrets
/// of the file in force now, never on the placeholders its stored config
/// has; the same file is not "another config".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_tree_sends_the_current_files_secrets_not_the_stored_placeholders() {
    let setup = Setup::new().await;
    let config = setup.config();
    let config = config.to_str().unwrap();
    let store = setup.store();
    let store = store.to_str().unwrap();
    for round in 0..2 {
        // Started, held at its first model request, killed.
        setup.endpoint.seen.hold.store(true, Ordering::SeqCst);
        let held = setup.endpoint.seen.held.load(Ordering::SeqCst);
        let mut child = setup
            .command(&[
                "run", "--config", config, "--store", store, "--json", "HOLD",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        until("the first model request", || {
            (setup.endpoint.seen.held.load(Ordering::SeqCst) > held).then_some(())
        })
        .await;
        child.start_kill().unwrap();
        let out = guarded(child.wait_with_output()).await.unwrap();
        assert_clean("the killed run's output", &out.stdout);
        assert_clean("the killed run's output", &out.stderr);
        setup.assert_store_clean();
        let runs = setup
            .arbor(&["runs", "--config", config, "--store", store, "--json"])
            .await;
        let runs: Value = serde_json::from_str(&crate::text(&runs.stdout)).unwrap();
        let tree = runs
            .as_array()
            .and_then(|r| r.iter().find(|t| t["status"] != "completed"))
            .unwrap_or_else(|| panic!("no interrupted tree: {runs}"));
        let tree_id = tree["treeId"].as_str().unwrap().to_owned();

        // Resumed, answered this time.
        setup.endpoint.seen.hold.store(false, Ordering::SeqCst);
        let from = (
            setup.endpoint.seen.model_requests(),
            setup.endpoint.seen.mcp_requests(),
        );
        let out = if round == 0 {
            setup
                .arbor(&[
                    "resume", "--config", config, "--store", store, "--json", &tree_id,
                ])
                .await
        } else {
            std::fs::write(setup.config(), setup.config_text("# edited\n")).unwrap();
            setup
                .arbor(&["resume", "--store", store, "--json", &tree_id])
                .await
        };
        completed(&out);
        let said = crate::text(&out.stderr);
        assert!(
            !said.contains("instead of the config it started with"),
            "round {round}: the same file is not another config: {said}"
        );
        setup.endpoint.assert_real_values_sent(from.0, from.1);
        assert!(setup.local_env_seen().iter().all(|v| v == MCP_ENV));
        setup.assert_store_clean();
    }
}

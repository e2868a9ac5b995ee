//! The MCP client (`arbor::tools::mcp`) against real servers: the reference
//! servers `server-everything` (stdio and streamable HTTP) and
//! `server-filesystem`, and `tests/mcp/counter.mjs` (ours) for concurrency,
//! timeouts, cancellation, crashes and tool-list changes. The servers come
//! from `tests/mcp/node_modules` (`npm ci --prefix tests/mcp`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use arbor::actors::message::ToolResultPart;
use arbor::actors::{ToolContext, ToolError, ToolOutput};
use arbor::tools::mcp::{McpServerSection, McpServers};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Every test finishes well within this (starting node takes ~0.5 s).
const GUARD: Duration = Duration::from_secs(15);

async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(GUARD, f)
        .await
        .expect("stuck: an MCP test ran past its guard")
}

pub(crate) fn mcp_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp")
}

/// A file of the test servers' npm install, checked to exist.
pub(crate) fn installed(relative: &str) -> String {
    let path = mcp_dir().join("node_modules").join(relative);
    assert!(
        path.exists(),
        "{} is missing: run `npm ci --prefix tests/mcp --no-audit --no-fund` first",
        path.display()
    );
    path.display().to_string()
}

fn everything_bin() -> String {
    installed(".bin/mcp-server-everything")
}

pub(crate) fn counter_script() -> String {
    installed("@modelcontextprotocol/sdk/package.json");
    mcp_dir().join("counter.mjs").display().to_string()
}

/// `McpServers` from TOML tables (`[NAME]` …), as `[mcp_servers.NAME]` would be.
fn servers(tables: &str) -> Arc<McpServers> {
    let sections: BTreeMap<String, McpServerSection> = toml::from_str(tables).unwrap();
    let settings = sections
        .into_iter()
        .map(|(name, section)| {
            let settings = section.settings(&name, Path::new("/")).unwrap();
            (name, settings)
        })
        .collect();
    McpServers::new(settings)
}

/// The counter server with extra settings (TOML lines).
fn counter(extra: &str) -> Arc<McpServers> {
    servers(&format!(
        "[counter]\ncommand = \"node\"\nargs = [{:?}]\n{extra}\n",
        counter_script()
    ))
}

fn ctx() -> ToolContext {
    ToolContext {
        tree_id: "tree-mcp".parse().unwrap(),
        run_id: "tree-mcp/0.1".parse().unwrap(),
        agent_type: "tester".to_owned(),
        call_id: "call-1".to_owned(),
        workspace: None,
    }
}

async fn call(
    servers: &McpServers,
    server: &str,
    tool: &str,
    input: Value,
) -> Result<ToolOutput, ToolError> {
    servers.tool(server, tool).call(input, ctx()).await
}

/// The text parts of an output, joined.
fn text(output: &ToolOutput) -> String {
    let ToolOutput::Parts(parts) = output else {
        panic!("expected parts, got {output:?}");
    };
    parts
        .iter()
        .filter_map(|part| match part {
            ToolResultPart::Json {
                value: Value::String(s),
            } => Some(s.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The counter's text answer, parsed.
fn json_answer(output: &ToolOutput) -> Value {
    serde_json::from_str(&text(output)).unwrap()
}

fn problems(table: &str) -> Vec<(String, String)> {
    let section: McpServerSection = toml::from_str(table).unwrap();
    section.settings("srv", Path::new("/base")).unwrap_err()
}

#[test]
fn mcp_config_reports_every_problem() {
    let keys = |table: &str| -> Vec<String> { problems(table).into_iter().map(|p| p.0).collect() };
    let both = problems("command = \"x\"\nurl = \"http://127.0.0.1:1/mcp\"");
    assert_eq!(both.len(), 1, "{both:?}");
    assert_eq!(both[0].0, "command");
    assert!(both[0].1.contains("both command and url"), "{both:?}");
    assert_eq!(keys("timeout = \"1s\""), ["command"]);
    assert_eq!(keys("url = \"ftp://example.org/\""), ["url"]);
    assert_eq!(keys("url = \"not a url\""), ["url"]);
    assert_eq!(
        keys(
            "command = \"x\"\nmax_concurrent = 0\ntimeout = \"5 parsecs\"\nstartup_timeout = \"0\""
        ),
        ["timeout", "startup_timeout", "max_concurrent"]
    );
    assert_eq!(
        keys("url = \"http://127.0.0.1:1/mcp\"\nargs = []\ncwd = \"d\"\nenv = { A = \"b\" }"),
        ["args", "env", "cwd"]
    );
    assert_eq!(
        keys("command = \"x\"\nheaders = { A = \"b\" }\nbearer_token_env = \"T\""),
        ["headers", "bearer_token_env"]
    );
    assert_eq!(
        keys("url = \"http://127.0.0.1:1/mcp\"\nheaders = { \"bad name\" = \"v\" }"),
        ["headers.bad name"]
    );
    // Unknown keys and malformed values are serde errors.
    assert!(toml::from_str::<McpServerSection>("command = \"x\"\ncomand = \"y\"").is_err());
    assert!(
        toml::from_str::<McpServerSection>("command = \"x\"\nenv = { A = { var = \"B\" } }")
            .is_err()
    );

    // A good one: defaults, relative cwd resolved against the base dir.
    let section: McpServerSection = toml::from_str(
        "command = \"srv\"\ncwd = \"work\"\nenv = { TOKEN = \"literal-secret-value\", HOME2 = { env = \"HOME\" } }\ntools = [\"read_*\"]",
    )
    .unwrap();
    let settings = section.settings("srv", Path::new("/base")).unwrap();
    assert_eq!(settings.timeout, Duration::from_secs(60));
    assert_eq!(settings.startup_timeout, Duration::from_secs(30));
    assert_eq!(settings.max_concurrent, 8);
    assert!(!settings.eager);
    assert!(settings.allows("read_file") && !settings.allows("write_file"));
    let debug = format!("{settings:?} {section:?}");
    assert!(debug.contains("/base/work"), "{debug}");
    assert!(
        !debug.contains("literal-secret-value"),
        "a secret in Debug: {debug}"
    );
    assert!(
        debug.contains("REDACTED") && debug.contains("HOME"),
        "{debug}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_everything_over_stdio() {
    let servers = servers(&format!(
        r#"
[everything]
command = {:?}
args = ["stdio"]
env = {{ ARBOR_MCP_LITERAL = "literal-value-1234", ARBOR_MCP_FROM_ENV = {{ env = "PATH" }} }}
"#,
        everything_bin()
    ));
    bounded(async {
        assert_eq!(servers.names(), ["everything"]);
        assert_eq!(servers.status("everything"), "not started");
        let before = servers.generation();
        servers.prepare("everything").await;
        assert!(servers.generation() > before);
        assert!(servers.status("everything").starts_with("running with"), "{}", servers.status("everything"));
        let tools = servers.tools("everything").unwrap();
        let names: Vec<&str> = tools.iter().map(|t| t.name()).collect();
        for name in ["everything/echo", "everything/get-sum", "everything/get-tiny-image"] {
            assert!(names.contains(&name), "{name} not in {names:?}");
        }
        let echo = tools.iter().find(|t| t.name() == "everything/echo").unwrap();
        assert_eq!(echo.description(), "Echoes back the input string");
        assert_eq!(echo.input_schema()["properties"]["message"]["type"], "string");

        let out = echo.call(json!({"message": "hi there"}), ctx()).await.unwrap();
        assert_eq!(
            out,
            ToolOutput::Parts(vec![ToolResultPart::Json { value: json!("Echo: hi there") }])
        );
        let out = call(&servers, "everything", "get-sum", json!({"a": 2, "b": 3})).await.unwrap();
        assert!(text(&out).contains("is 5"), "{out:?}");
        let out = call(&servers, "everything", "get-tiny-image", json!({})).await.unwrap();
        let ToolOutput::Parts(parts) = &out else { panic!("{out:?}") };
        assert!(
            parts.iter().any(|p| matches!(p,
                ToolResultPart::Media { media_type, data } if media_type == "image/png" && !data.is_empty())),
            "no image/png part in {parts:?}"
        );

        // The process gets its env table (values scrubbed from what comes
        // back) and not Arbor's other variables.
        let out = call(&servers, "everything", "get-env", json!({})).await.unwrap();
        let env: Value = serde_json::from_str(&text(&out)).unwrap();
        assert_eq!(env["ARBOR_MCP_LITERAL"], "[REDACTED]");
        assert_eq!(env["ARBOR_MCP_FROM_ENV"], "[REDACTED]");
        assert!(env.get("CARGO_PKG_NAME").is_none(), "Arbor's environment leaked: {env}");

        let err = call(&servers, "everything", "no-such-tool", json!({})).await.unwrap_err();
        assert!(err.message.contains("no tool named"), "{err:?}");
        servers.shutdown().await;
    })
    .await;
}

/// A server-everything over streamable HTTP on a free loopback port; killed on drop.
pub(crate) struct HttpServer {
    _child: tokio::process::Child,
    /// Its endpoint, `http://127.0.0.1:PORT/mcp`.
    pub(crate) url: String,
}

/// Starts a server-everything over streamable HTTP and waits until it accepts connections.
pub(crate) async fn http_everything() -> HttpServer {
    let script = installed("@modelcontextprotocol/server-everything/dist/index.js");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let preload = mcp_dir().join("loopback.cjs");
    let mut child = tokio::process::Command::new("node")
        .arg(script)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .env(
            "NODE_OPTIONS",
            format!("--require \"{}\"", preload.display()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // It says so on stderr once it listens (from its listen callback).
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    while let Some(line) = lines.next_line().await.unwrap() {
        if line.contains("listening on port") {
            break;
        }
    }
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("the HTTP server does not accept connections");
    HttpServer {
        _child: child,
        url: format!("http://127.0.0.1:{port}/mcp"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_everything_over_streamable_http() {
    bounded(async {
        let server = http_everything().await;
        let servers = servers(&format!(
            r#"
[web]
url = {:?}
headers = {{ X-Arbor-Test = "header-secret-value" }}
bearer_token_env = "PATH"
"#,
            server.url
        ));
        servers.prepare("web").await;
        assert!(
            servers.status("web").starts_with("running with"),
            "{}",
            servers.status("web")
        );
        assert_eq!(servers.pid("web"), None);
        let tools = servers.tools("web").unwrap();
        assert!(tools.iter().any(|t| t.name() == "web/echo"));
        let out = call(&servers, "web", "echo", json!({"message": "over http"}))
            .await
            .unwrap();
        assert_eq!(text(&out), "Echo: over http");
        servers.shutdown().await;
        assert_eq!(servers.status("web"), "shut down");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_filesystem_writes_reads_and_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let servers = servers(&format!(
        "[fs]\ncommand = {:?}\nargs = [{:?}]\n",
        installed(".bin/mcp-server-filesystem"),
        root.display().to_string()
    ));
    bounded(async {
        servers.prepare("fs").await;
        let file = root.join("note.txt").display().to_string();
        let out = call(
            &servers,
            "fs",
            "write_file",
            json!({"path": file, "content": "hello from arbor"}),
        )
        .await
        .unwrap();
        assert!(text(&out).contains("Successfully wrote"), "{out:?}");
        let out = call(&servers, "fs", "read_text_file", json!({"path": file}))
            .await
            .unwrap();
        assert!(text(&out).contains("hello from arbor"), "{out:?}");
        // structuredContent comes as one more JSON part.
        let ToolOutput::Parts(parts) = &out else {
            panic!()
        };
        assert!(
            parts.contains(&ToolResultPart::Json {
                value: json!({"content": "hello from arbor"})
            }),
            "{parts:?}"
        );

        let err = call(
            &servers,
            "fs",
            "read_text_file",
            json!({"path": "/etc/passwd"}),
        )
        .await
        .unwrap_err();
        assert!(err.message.contains("Access denied"), "{err:?}");
        assert!(
            !err.message.starts_with("MCP"),
            "the server's own text, not ours: {err:?}"
        );
        servers.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_max_concurrent_bounds_calls_in_flight() {
    let servers = counter("max_concurrent = 4");
    bounded(async {
        servers.prepare("counter").await;
        let work = servers.tool("counter", "work");
        let calls = (0..40).map(|n| {
            let work = work.clone();
            async move { (n, work.call(json!({ "n": n }), ctx()).await) }
        });
        let mut most = 0;
        for (n, result) in futures::future::join_all(calls).await {
            let answer = json_answer(&result.unwrap());
            assert_eq!(answer["n"], n);
            most = most.max(answer["maxInFlight"].as_u64().unwrap());
        }
        assert!(most <= 4, "{most} calls were in flight at once");
        assert!(most >= 2, "calls ran one at a time");
        // The server's own tool error reaches the model as its text.
        let err = call(&servers, "counter", "fail", json!({}))
            .await
            .unwrap_err();
        assert_eq!(err.message, "failed on purpose");
        // A JSON-RPC error names the server and tool.
        let err = call(&servers, "counter", "throw", json!({}))
            .await
            .unwrap_err();
        assert!(
            err.message.starts_with("MCP tool counter/throw failed: ")
                && err.message.contains("thrown on purpose")
                && err.message.contains("JSON-RPC error"),
            "{err:?}"
        );
        servers.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_call_timeout_cancels_the_request() {
    let servers = counter("timeout = \"300ms\"");
    bounded(async {
        servers.prepare("counter").await;
        let err = call(&servers, "counter", "hang", json!({}))
            .await
            .unwrap_err();
        assert_eq!(err.message, "MCP tool counter/hang timed out after 300ms");
        // The notification goes on its own: awaited (bounded) by the server.
        let stats = json_answer(
            &call(
                &servers,
                "counter",
                "stats",
                json!({"cancelled_at_least": 1}),
            )
            .await
            .unwrap(),
        );
        assert_eq!(
            stats,
            json!({"hanging": 0, "cancelled": 1}),
            "notifications/cancelled was not sent"
        );
        servers.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_dropped_call_releases_its_permit() {
    let servers = counter("max_concurrent = 1\ntimeout = \"30s\"");
    bounded(async {
        servers.prepare("counter").await;
        // The agent is cancelled mid-call: its call future is dropped.
        let hang = call(&servers, "counter", "hang", json!({}));
        let dropped = tokio::time::timeout(Duration::from_millis(300), hang).await;
        assert!(dropped.is_err(), "hang answered: {dropped:?}");
        // The only permit is free again, and the server was told.
        let out = call(&servers, "counter", "work", json!({"n": 1}))
            .await
            .unwrap();
        assert_eq!(json_answer(&out)["n"], 1);
        let stats = json_answer(
            &call(
                &servers,
                "counter",
                "stats",
                json!({"cancelled_at_least": 1}),
            )
            .await
            .unwrap(),
        );
        assert_eq!(stats["cancelled"], 1, "{stats}");
        servers.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_killed_server_fails_the_call_and_restarts() {
    let servers = counter("timeout = \"10s\"");
    bounded(async {
        servers.prepare("counter").await;
        let pid = servers.pid("counter").unwrap();
        let hang = servers.tool("counter", "hang");
        let pending = tokio::spawn(async move { hang.call(json!({}), ctx()).await });
        // Wait (by asking the server) until the hang call is on the server.
        while json_answer(&call(&servers, "counter", "stats", json!({})).await.unwrap())["hanging"]
            == 0
        {}
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let err = pending.await.unwrap().unwrap_err();
        assert!(
            err.message
                .starts_with("MCP server counter was killed by SIGKILL")
                && err
                    .message
                    .ends_with("during the call; it is being restarted"),
            "{err:?}"
        );
        // The next call waits for the restart and goes through.
        let out = call(&servers, "counter", "work", json!({"n": 2}))
            .await
            .unwrap();
        assert_eq!(json_answer(&out)["n"], 2);
        let new_pid = servers.pid("counter").unwrap();
        assert_ne!(new_pid, pid);
        // It exits by itself in the middle of a call: the same, once more.
        let err = call(&servers, "counter", "die", json!({}))
            .await
            .unwrap_err();
        assert_eq!(
            err.message,
            "MCP server counter exited with code 7 during the call; it is being restarted"
        );
        let out = call(&servers, "counter", "work", json!({"n": 3}))
            .await
            .unwrap();
        assert_eq!(json_answer(&out)["n"], 3);
        servers.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_tool_list_change_bumps_the_generation() {
    let servers = counter("");
    bounded(async {
        servers.prepare("counter").await;
        assert!(
            servers
                .tools("counter")
                .unwrap()
                .iter()
                .all(|t| t.name() != "counter/extra")
        );
        let before = servers.generation();
        call(&servers, "counter", "grow", json!({})).await.unwrap();
        assert!(servers.changed(before).await > before);
        let tools = servers.tools("counter").unwrap();
        assert!(
            tools.iter().any(|t| t.name() == "counter/extra"),
            "no counter/extra"
        );
        let out = call(&servers, "counter", "extra", json!({})).await.unwrap();
        assert_eq!(text(&out), "\"extra\"");
        servers.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_allow_list_hides_other_tools() {
    let servers = counter("tools = [\"w*\", \"stats\"]");
    bounded(async {
        servers.prepare("counter").await;
        let mut names: Vec<String> = servers
            .tools("counter")
            .unwrap()
            .iter()
            .map(|t| t.name().to_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["counter/stats", "counter/work"]);
        let err = call(&servers, "counter", "hang", json!({}))
            .await
            .unwrap_err();
        assert!(err.message.contains("not allowed"), "{err:?}");
        servers.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_missing_command_is_reported() {
    let servers =
        servers("[ghost]\ncommand = \"/nonexistent/arbor-mcp-ghost\"\nstartup_timeout = \"2s\"\n");
    bounded(async {
        servers.prepare("ghost").await;
        let err = servers.tools("ghost").err().unwrap().to_string();
        assert!(
            err.starts_with("MCP server ghost could not start: "),
            "{err}"
        );
        assert!(err.contains("arbor-mcp-ghost"), "{err}");
        assert!(
            servers.status("ghost").starts_with("could not start"),
            "{}",
            servers.status("ghost")
        );
        let tool = servers.tool("ghost", "anything");
        assert_eq!(tool.name(), "ghost/anything");
        assert_eq!(tool.input_schema(), json!({"type": "object"}));
        assert!(
            tool.description().contains("unavailable"),
            "{}",
            tool.description()
        );
        let err = tool.call(json!({}), ctx()).await.unwrap_err();
        assert!(
            err.message.contains("MCP server ghost could not start"),
            "{err:?}"
        );
        // An unknown server, too.
        let err = call(&servers, "nobody", "x", json!({})).await.unwrap_err();
        assert!(err.message.contains("nobody"), "{err:?}");
        assert!(servers.tools("nobody").is_err());
        servers.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_unset_variable_fails_the_start_without_secrets() {
    let servers = servers(&format!(
        "[counter]\ncommand = \"node\"\nargs = [{:?}]\nenv = {{ TOKEN = {{ env = \"ARBOR_TEST_SURELY_UNSET_9F2C\" }}, OTHER = \"literal-secret-xyz\" }}\n",
        counter_script()
    ));
    bounded(async {
        servers.prepare("counter").await;
        let err = servers.tools("counter").err().unwrap().to_string();
        assert!(err.contains("ARBOR_TEST_SURELY_UNSET_9F2C"), "{err}");
        assert!(!err.contains("literal-secret-xyz"), "{err}");
        let status = servers.status("counter");
        assert!(
            status.contains("is not set") && !status.contains("literal-secret-xyz"),
            "{status}"
        );
        servers.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_shutdown_ends_the_process() {
    let servers = counter("");
    bounded(async {
        servers.prepare("counter").await;
        let pid = servers.pid("counter").unwrap();
        assert!(Path::new(&format!("/proc/{pid}")).exists());
        servers.shutdown().await;
        // Ended and reaped by the time shutdown returns.
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} is still there"
        );
        assert_eq!(servers.status("counter"), "shut down");
        assert_eq!(servers.pid("counter"), None);
        let err = call(&servers, "counter", "work", json!({"n": 1}))
            .await
            .unwrap_err();
        assert!(err.message.contains("shut down"), "{err:?}");
        // No restart after shutdown.
        servers.prepare("counter").await;
        assert_eq!(servers.status("counter"), "shut down");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_http_server_gone_fails_calls_at_once() {
    bounded(async {
        let server = http_everything().await;
        let servers = servers(&format!(
            "[web]\nurl = {:?}\ntimeout = \"1h\"\n",
            server.url
        ));
        servers.prepare("web").await;
        let HttpServer {
            _child: mut child, ..
        } = server;
        child.kill().await.unwrap();
        // The call fails at once (its timeout is an hour: waiting for it
        // would trip the test's guard), and the session is being re-opened.
        let err = call(&servers, "web", "echo", json!({"message": "anyone?"}))
            .await
            .unwrap_err();
        assert!(
            err.message
                .starts_with("MCP server web lost the connection (")
                && err
                    .message
                    .ends_with("during the call; it is being restarted")
                && !err.message.contains("WorkerTransport"),
            "{err:?}"
        );
        let status = servers.status("web");
        assert!(
            status.starts_with("restarting after it lost the connection"),
            "{status}"
        );
        servers.shutdown().await;
    })
    .await;
}

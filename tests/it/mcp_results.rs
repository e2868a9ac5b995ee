//! MCP results are bounded and said once (issue 34, item 6): a result over
//! the server's `max_output_bytes` is cut with a note, one too large to read
//! fails at once ("result too large (N bytes)") instead of after the call's
//! timeout, `structuredContent` reaches the model once, and a server that
//! never answers `initialize` says so. Real servers where they can show it
//! (`server-everything`), small python servers written here for the rest.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arbor::actors::message::ToolResultPart;
use arbor::actors::{ToolContext, ToolOutput};
use arbor::tools::mcp::{McpServerSection, McpServers};
use serde_json::{Value, json};

use super::mcp::installed;

/// Every call here ends well within this; the servers' own timeouts are longer.
const GUARD: Duration = Duration::from_secs(20);

/// A minimal MCP server over stdio: `silent` never answers anything; `big`
/// lists one tool, `big`, whose result is a text of `bytes` x's, written as
/// the TypeScript SDK writes messages (the id last).
const PY_SERVER: &str = r#"
import json, sys
mode = sys.argv[1]
for line in sys.stdin:
    msg = json.loads(line)
    if mode == "silent" or "id" not in msg:
        continue
    method, mid = msg.get("method"), msg["id"]
    if method == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"],
                  "capabilities": {"tools": {}}, "serverInfo": {"name": "py", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "big", "inputSchema": {"type": "object",
                  "properties": {"bytes": {"type": "integer"}}}}]}
    elif method == "tools/call":
        n = msg["params"]["arguments"]["bytes"]
        result = {"content": [{"type": "text", "text": "x" * n}]}
    else:
        result = {}
    sys.stdout.write(json.dumps({"result": result, "jsonrpc": "2.0", "id": mid}) + "\n")
    sys.stdout.flush()
"#;

fn servers(tables: &str) -> Arc<McpServers> {
    let sections: BTreeMap<String, McpServerSection> = toml::from_str(tables).unwrap();
    let settings = sections
        .into_iter()
        .map(|(name, section)| {
            (
                name.clone(),
                section.settings(&name, Path::new("/")).unwrap(),
            )
        })
        .collect();
    McpServers::new(settings)
}

/// A python server of `mode` as the `[py]` table, with `extra` lines.
fn py(dir: &Path, mode: &str, extra: &str) -> Arc<McpServers> {
    let script = dir.join("server.py");
    std::fs::write(&script, PY_SERVER).unwrap();
    servers(&format!(
        "[py]\ncommand = \"python3\"\nargs = [{:?}, {mode:?}]\n{extra}\n",
        script.display().to_string()
    ))
}

fn everything(extra: &str) -> Arc<McpServers> {
    servers(&format!(
        "[everything]\ncommand = {:?}\n{extra}\n",
        installed(".bin/mcp-server-everything")
    ))
}

fn ctx() -> ToolContext {
    ToolContext {
        tree_id: "tree-mcp-results".parse().unwrap(),
        run_id: "tree-mcp-results/0.1".parse().unwrap(),
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
) -> Result<ToolOutput, String> {
    tokio::time::timeout(GUARD, servers.tool(server, tool).call(input, ctx()))
        .await
        .expect("the call did not end within the guard")
        .map_err(|e| e.message)
}

fn parts(output: &ToolOutput) -> &[ToolResultPart] {
    let ToolOutput::Parts(parts) = output else {
        panic!("expected parts, got {output:?}");
    };
    parts
}

/// The text parts, joined.
fn text(output: &ToolOutput) -> String {
    parts(output)
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

#[tokio::test]
async fn a_structured_result_reaches_the_model_once_not_as_text_and_json() {
    let servers = everything("");
    let out = call(
        &servers,
        "everything",
        "get-structured-content",
        json!({"location": "New York"}),
    )
    .await
    .unwrap();
    let all = serde_json::to_string(parts(&out)).unwrap();
    assert_eq!(
        all.matches("Cloudy").count(),
        1,
        "the weather reaches the model more than once: {all}"
    );
    assert!(
        parts(&out).contains(&ToolResultPart::Json {
            value: json!({"temperature": 33, "conditions": "Cloudy", "humidity": 82})
        }),
        "{all}"
    );
    servers.shutdown().await;
}

#[tokio::test]
async fn an_mcp_result_over_max_output_bytes_is_cut_with_a_note_not_kept_whole() {
    let servers = everything("max_output_bytes = 1000");
    let message = "y".repeat(300_000);
    let out = call(
        &servers,
        "everything",
        "echo",
        json!({ "message": message }),
    )
    .await
    .unwrap();
    let shown = text(&out);
    let total = "Echo: ".len() + message.len();
    assert!(
        shown.len() < 1200,
        "{} bytes reached the model",
        shown.len()
    );
    assert!(
        shown.contains(&format!(
            "[output cut: showed the first 1000 of {total} bytes"
        )),
        "{}",
        &shown[shown.len().saturating_sub(200)..]
    );
    servers.shutdown().await;
}

#[tokio::test]
async fn a_result_too_large_to_read_fails_at_once_instead_of_timing_out() {
    let dir = tempfile::tempdir().unwrap();
    // The call's timeout is far beyond the test's guard: only an answer at
    // once passes.
    let servers = py(dir.path(), "big", "timeout = \"1h\"");
    let bytes = 17 << 20;
    let err = call(&servers, "py", "big", json!({ "bytes": bytes }))
        .await
        .unwrap_err();
    assert!(
        err.contains("result too large (") && err.contains(" bytes"),
        "{err}"
    );
    assert!(!err.contains("timed out"), "{err}");
    // The connection is still good.
    let out = call(&servers, "py", "big", json!({ "bytes": 10 }))
        .await
        .unwrap();
    assert_eq!(text(&out), "x".repeat(10));
    servers.shutdown().await;
}

#[tokio::test]
async fn a_server_that_never_answers_initialize_says_so_instead_of_tool_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let servers = py(dir.path(), "silent", "startup_timeout = \"500ms\"");
    tokio::time::timeout(GUARD, servers.prepare("py"))
        .await
        .unwrap();
    let why = servers
        .tools("py")
        .err()
        .expect("a silent server came up")
        .to_string();
    assert!(
        why.contains("never answered the MCP initialize request within 500ms"),
        "{why}"
    );
    // An agent offered py/* gets a stand-in that says why.
    let stand_in = servers.stand_in("py");
    assert_eq!(stand_in.name(), "py/unavailable");
    assert!(
        stand_in
            .description()
            .contains("never answered the MCP initialize request"),
        "{}",
        stand_in.description()
    );
    servers.shutdown().await;
}

/// A server-everything speaking only the legacy HTTP+SSE transport on a free
/// loopback port (killed on drop), and its event-stream URL.
async fn sse_everything() -> (tokio::process::Child, String) {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let script = installed("@modelcontextprotocol/server-everything/dist/index.js");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let preload = super::mcp::mcp_dir().join("loopback.cjs");
    let mut child = tokio::process::Command::new("node")
        .arg(script)
        .arg("sse")
        .env("PORT", port.to_string())
        .env(
            "NODE_OPTIONS",
            format!("--require \"{}\"", preload.display()),
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    while let Some(line) = lines.next_line().await.unwrap() {
        if line.contains("running on port") {
            break;
        }
    }
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, format!("http://127.0.0.1:{port}/sse"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_http_sse_server_is_spoken_to_instead_of_failing_on_its_post() {
    let (_server, url) = tokio::time::timeout(GUARD, sse_everything()).await.unwrap();
    // No transport named: streamable HTTP is refused, HTTP+SSE is tried.
    let servers = servers(&format!("[old]\nurl = {url:?}\n"));
    tokio::time::timeout(GUARD, servers.prepare("old"))
        .await
        .unwrap();
    assert!(
        servers.status("old").starts_with("running with"),
        "{}",
        servers.status("old")
    );
    let out = call(&servers, "old", "echo", json!({"message": "over sse"}))
        .await
        .unwrap();
    assert_eq!(text(&out), "Echo: over sse");
    let out = call(&servers, "old", "get-sum", json!({"a": 2, "b": 5}))
        .await
        .unwrap();
    assert!(text(&out).contains('7'), "{}", text(&out));
    servers.shutdown().await;

    // Named, it is spoken to at once.
    let servers = servers_sse(&url);
    tokio::time::timeout(GUARD, servers.prepare("old"))
        .await
        .unwrap();
    assert!(
        servers.status("old").starts_with("running with"),
        "{}",
        servers.status("old")
    );
    servers.shutdown().await;
}

fn servers_sse(url: &str) -> Arc<McpServers> {
    servers(&format!("[old]\nurl = {url:?}\ntransport = \"sse\"\n"))
}

#[test]
fn a_pasted_codex_mcp_block_is_read_as_written_not_refused_for_its_key_names() {
    let dir = tempfile::tempdir().unwrap();
    // As Codex's config.toml writes it.
    let config = format!(
        r#"
[run]
agent = "lead"

[models.m]
provider = "scripted"
file = "script.json"

[agents.lead]
model = "m"
tools = ["everything/*"]

[mcp_servers.everything]
command = {:?}
args = []
env_vars = ["HOME"]
startup_timeout_sec = 20
tool_timeout_sec = 30.5
enabled_tools = ["echo", "get-sum", "get-env"]
disabled_tools = ["get-sum"]

[mcp_servers.off]
url = "http://127.0.0.1:9/mcp"
bearer_token_env_var = "NO_SUCH_TOKEN"
http_headers = {{ X-Team = "arbor" }}
env_http_headers = {{ X-Key = "NO_SUCH_KEY" }}
enabled = false
"#,
        installed(".bin/mcp-server-everything")
    );
    std::fs::write(dir.path().join("config.toml"), config).unwrap();
    std::fs::write(dir.path().join("script.json"), r#"{"replies": []}"#).unwrap();
    let check = crate::arbor_in(dir.path(), &["check-config", "config.toml"]);
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let out = crate::arbor_in(dir.path(), &["tools", "--config", "config.toml", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["origin"] == "mcp")
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"everything/echo"), "{names:?}");
    assert!(names.contains(&"everything/get-env"), "{names:?}");
    assert!(
        !names.contains(&"everything/get-sum"),
        "disabled: {names:?}"
    );
    assert!(
        !names.contains(&"everything/get-tiny-image"),
        "not enabled: {names:?}"
    );
    let off = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "off/*")
        .unwrap_or_else(|| panic!("{list}"));
    assert!(
        off["description"]
            .as_str()
            .unwrap()
            .contains("disabled in the config (enabled = false)"),
        "{off}"
    );
}

#[test]
fn a_claude_style_entry_reads_dollar_brace_values_from_the_environment() {
    let section: McpServerSection = toml::from_str(
        r#"
type = "sse"
url = "http://127.0.0.1:9/sse"
headers = { Authorization = "${TEAM_TOKEN}", X-Plain = "$HOME and ${not a var}" }
"#,
    )
    .unwrap();
    let settings = format!("{:?}", section.settings("web", Path::new("/")).unwrap());
    assert!(settings.contains(r#"{ env = "TEAM_TOKEN" }"#), "{settings}");
    assert!(settings.contains("kind: Sse"), "{settings}");
    // Not a whole ${VAR}: a literal (a secret, never shown).
    assert!(!settings.contains("$HOME"), "{settings}");
}

/// Issue 34: a server configured for Claude Code could not be brought: its
/// `.mcp.json` (written as Claude Code's docs show, with a token header)
/// becomes `[mcp_servers.NAME]` tables with `arbor mcp import`, and the
/// server runs from them; an entry Arbor would send as written (a variable
/// inside a value) is named, and nothing is printed.
#[test]
fn a_claude_code_mcp_json_is_imported_and_its_server_offers_its_tools() {
    let dir = tempfile::tempdir().unwrap();
    let mcp_json = json!({"mcpServers": {
        "everything": {
            "type": "stdio",
            "command": installed(".bin/mcp-server-everything"),
            "args": ["stdio"],
            "env": {}
        },
        "remote": {
            "type": "http",
            "url": "https://mcp.example.com/mcp",
            "headers": {"Authorization": "Bearer ${ARBOR_TEST_REMOTE_TOKEN}"},
            "enabled": false
        }
    }});
    std::fs::write(dir.path().join(".mcp.json"), mcp_json.to_string()).unwrap();
    let out = crate::arbor_in(dir.path(), &["mcp", "import", ".mcp.json"]);
    let tables = crate::text(&out.stdout);
    assert!(out.status.success(), "{}", crate::text(&out.stderr));
    assert!(tables.contains("[mcp_servers.everything]"), "{tables}");
    assert!(
        tables.contains("bearer_token_env = \"ARBOR_TEST_REMOTE_TOKEN\""),
        "{tables}"
    );
    std::fs::write(dir.path().join("config.toml"), &tables).unwrap();
    let out = crate::arbor_in(dir.path(), &["tools", "--config", "config.toml", "--json"]);
    assert!(out.status.success(), "{}", crate::text(&out.stderr));
    let listing: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = listing
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"everything/echo"), "{names:?}");

    let bad = json!({"mcpServers": {"api": {
        "type": "http", "url": "${API_BASE_URL:-https://api.example.com}/mcp"
    }}});
    std::fs::write(dir.path().join("bad.json"), bad.to_string()).unwrap();
    let out = crate::arbor_in(dir.path(), &["mcp", "import", "bad.json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let said = crate::text(&out.stderr);
    assert!(
        said.contains("mcpServers.api.url") && said.contains("does not expand"),
        "{said}"
    );
}

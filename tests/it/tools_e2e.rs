//! MCP servers and command tools through the binary, as a user runs them:
//! real third-party MCP servers (`tests/mcp`, installed by `.ci/run` with
//! `npm ci --prefix tests/mcp`) called by a scripted tree at depth 2, every
//! failure a server can have turned into an error result the model reads,
//! `max_concurrent` held across 100 agents, and no tool process left behind
//! once `arbor run` exits.

use std::collections::BTreeSet;
use std::path::Path;

use arbor_test_support::{call, spawn_call};
use serde_json::{Value, json};

use crate::mcp::{counter_script, installed};
use crate::tools::{find_state, scene};
use crate::{arbor_in, text};

fn everything() -> String {
    installed("@modelcontextprotocol/server-everything/dist/index.js")
}

fn filesystem() -> String {
    installed("@modelcontextprotocol/server-filesystem/dist/index.js")
}

fn counter() -> String {
    counter_script()
}

/// Pids of live (not zombie) processes whose environment holds `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    let needle = format!("ARBOR_TEST_MARKER={marker}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| alive(*pid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}

/// Whether `pid` is a live process (a zombie has ended).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Whether `pid` ends within a bound (a SIGKILLed process takes a moment to
/// be scheduled and die after the signal is sent).
fn ends(pid: u32) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while alive(pid) {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::yield_now();
    }
    true
}

/// Every stored final state of one tree, through `arbor export`.
fn export(dir: &Path, tree: &str) -> Value {
    let out = arbor_in(dir, &["export", tree]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every state in an export whose prompt message contains `prompt`.
fn state_prompted(doc: &Value, agent_type: &str, prompt: &str) -> Value {
    fn walk(v: &Value, agent_type: &str, prompt: &str, out: &mut Option<Value>) {
        match v {
            Value::Object(map) => {
                if map.get("agentType") == Some(&json!(agent_type))
                    && map
                        .get("messageHistory")
                        .is_some_and(|h| h.to_string().contains(prompt))
                    && out.is_none()
                {
                    *out = Some(v.clone());
                    return;
                }
                map.values().for_each(|v| walk(v, agent_type, prompt, out));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, agent_type, prompt, out)),
            _ => {}
        }
    }
    let mut out = None;
    walk(doc, agent_type, prompt, &mut out);
    out.unwrap_or_else(|| panic!("no {agent_type} prompted {prompt:?} in the export"))
}

/// The tool results of a history, in order, as text.
fn results(state: &Value) -> Vec<String> {
    state["messageHistory"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_mcp_servers_answer_a_root_and_its_grandchildren_and_none_outlives_the_run() {
    let http = crate::mcp::http_everything().await;
    let files = tempfile::tempdir().unwrap();
    let note = files.path().join("note.txt");
    let marker = format!("real-{}", std::process::id());
    let config = format!(
        r#"
[run]
agent = "lead"

[limits]
max_depth = 2

[models.script]
provider = "scripted"
file = "script.json"

[mcp_servers.everything]
command = "node"
args = ["{everything}", "stdio"]
env = {{ ARBOR_TEST_MARKER = "{marker}" }}

[mcp_servers.fs]
command = "node"
args = ["{filesystem}", "{dir}"]
env = {{ ARBOR_TEST_MARKER = "{marker}" }}

[mcp_servers.web]
url = "{url}"

[agents.lead]
model = "script"
tools = ["everything/echo"]
spawnable_agents = ["writer", "reader"]

[agents.writer]
model = "script"
tools = ["fs/write_file"]
spawnable_agents = ["scribe"]

[agents.reader]
model = "script"
tools = ["fs/read_text_file"]
spawnable_agents = ["scribe"]

[agents.scribe]
model = "script"
tools = ["fs/*", "web/get-sum", "everything/get-tiny-image"]
"#,
        everything = everything(),
        filesystem = filesystem(),
        dir = files.path().display(),
        url = http.url,
    );
    let path = note.display().to_string();
    let script = json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [call("everything__echo", json!({"message": "hello"})), spawn_call(&[("writer", "write it")])]},
            {"toolCalls": [spawn_call(&[("reader", "read it")])]},
            {"text": "done"}
        ]},
        {"agent": "writer", "steps": [
            {"toolCalls": [
                call("fs__write_file", json!({"path": path, "content": "from the writer"})),
                spawn_call(&[("scribe", "scribe: sum")])
            ]},
            {"text": "written"}
        ]},
        {"agent": "reader", "steps": [
            {"toolCalls": [
                call("fs__read_text_file", json!({"path": path})),
                spawn_call(&[("scribe", "scribe: read")])
            ]},
            {"text": "read"}
        ]},
        {"agent": "scribe", "prompt": "scribe: sum", "steps": [
            {"toolCalls": [call("web__get-sum", json!({"a": 1, "b": 1}))]},
            {"text": "summed"}
        ]},
        {"agent": "scribe", "prompt": "scribe: read", "steps": [
            {"toolCalls": [
                call("fs__read_text_file", json!({"path": path})),
                call("web__get-sum", json!({"a": 2, "b": 40})),
                call("everything__get-tiny-image", json!({}))
            ]},
            {"text": "got it"}
        ]}
    ]});
    let dir = scene(&config, &script);
    let out = tokio::task::spawn_blocking({
        let dir = dir.path().to_owned();
        move || arbor_in(&dir, &["run", "--tree-id", "tmcp", "--quiet", "go"])
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "done");
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "from the writer");

    let doc = export(dir.path(), "tmcp");
    let lead = find_state(&doc, "lead").unwrap();
    assert!(
        results(&lead)[0].contains("Echo: hello"),
        "{:?}",
        results(&lead)
    );
    // The reader (a sibling of the writer) reads back what the writer wrote …
    let reader = find_state(&doc, "reader").unwrap();
    assert!(
        results(&reader)[0].contains("from the writer"),
        "{:?}",
        results(&reader)
    );
    // … and so does its child at depth 2, beside calls to the other servers.
    let reader_scribe = state_prompted(&doc, "scribe", "scribe: read");
    assert_eq!(reader_scribe["ancestorRunIds"].as_array().unwrap().len(), 2);
    let got = results(&reader_scribe);
    assert!(got[0].contains("from the writer"), "{got:?}");
    assert!(got[1].contains("The sum of 2 and 40 is 42."), "{got:?}");
    assert!(got[2].contains(r#""mediaType":"image/png""#), "{got:?}");
    // The model saw the server's own schema, under its namespaced name.
    let offered = &reader_scribe["toolDefinitions"]["fs__read_text_file"]["inputSchema"];
    assert_eq!(offered["required"], json!(["path"]), "{offered}");

    let left: Vec<u32> = processes_with(&marker)
        .into_iter()
        .filter(|p| !ends(*p))
        .collect();
    assert!(
        left.is_empty(),
        "MCP server processes outlived arbor run: {left:?}"
    );
}

#[test]
fn every_mcp_failure_is_an_error_result_the_model_reads_and_the_tree_completes() {
    let marker = format!("faults-{}", std::process::id());
    let pids = tempfile::NamedTempFile::new().unwrap();
    let config = format!(
        r#"
[models.script]
provider = "scripted"
file = "script.json"

[mcp_servers.counter]
command = "node"
args = ["{counter}"]
env = {{ ARBOR_TEST_MARKER = "{marker}", COUNTER_PID_FILE = "{pids}" }}
timeout = "20s"

[mcp_servers.slow]
command = "node"
args = ["{counter}"]
env = {{ ARBOR_TEST_MARKER = "{marker}", COUNTER_PID_FILE = "{pids}" }}
timeout = "300ms"

[mcp_servers.ghost]
command = "/nonexistent/mcp-server"
startup_timeout = "2s"

[agents.lead]
model = "script"
tools = ["counter/*", "slow/hang", "ghost/anything"]
max_steps = 10
"#,
        counter = counter(),
        pids = pids.path().display(),
    );
    let script = json!({"replies": [{"agent": "lead", "steps": [
        {"toolCalls": [call("counter__fail", json!({}))]},
        {"toolCalls": [call("counter__work", json!({"n": "not a number"}))]},
        {"toolCalls": [call("slow__hang", json!({}))]},
        {"toolCalls": [call("counter__die", json!({}))]},
        {"toolCalls": [call("counter__work", json!({"n": 5}))]},
        {"toolCalls": [call("ghost__anything", json!({}))]},
        {"text": "survived"}
    ]}]});
    let dir = scene(&config, &script);
    let out = arbor_in(
        dir.path(),
        &["run", "--tree-id", "tfaults", "--quiet", "go"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "survived");
    let lead = find_state(&export(dir.path(), "tfaults"), "lead").unwrap();
    let got = results(&lead);
    let expect = [
        "failed on purpose",
        "Invalid input for counter__work",
        "MCP tool slow/hang timed out after 300ms",
        "MCP server counter exited",
        r#"\"n\":5"#,
        "MCP server ghost could not start",
    ];
    assert_eq!(got.len(), expect.len(), "{got:#?}");
    for (result, needle) in got.iter().zip(expect) {
        assert!(result.contains(needle), "{needle:?} not in {result}");
    }
    for result in &got[..4] {
        assert!(
            result.contains("errorMessage"),
            "not an error result: {result}"
        );
    }
    // Started: counter (twice: it died once) and slow. None is left.
    let started: BTreeSet<u32> = std::fs::read_to_string(pids.path())
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    assert_eq!(started.len(), 3, "{started:?}");
    let left: Vec<u32> = started.into_iter().filter(|p| !ends(*p)).collect();
    assert!(
        left.is_empty(),
        "MCP server processes outlived arbor run: {left:?}"
    );
    assert!(processes_with(&marker).into_iter().all(ends));
}

#[test]
fn a_hundred_agents_share_one_server_with_at_most_four_calls_in_flight() {
    let config = format!(
        r#"
[run]
agent = "lead"

[limits]
max_depth = 1
max_children_per_call = 100
max_live_agents = 100

[models.script]
provider = "scripted"
file = "script.json"

[mcp_servers.counter]
command = "node"
args = ["{counter}"]
max_concurrent = 4

[agents.lead]
model = "script"
spawnable_agents = ["worker"]

[agents.worker]
model = "script"
tools = ["counter/work"]
"#,
        counter = counter(),
    );
    let jobs: Vec<(String, String)> = (0..100)
        .map(|i| ("worker".to_owned(), format!("[job {i:03}]")))
        .collect();
    let mut replies = vec![json!({"agent": "lead", "steps": [
        {"toolCalls": [spawn_call(&jobs.iter().map(|(a, p)| (a.as_str(), p.as_str())).collect::<Vec<_>>())]},
        {"text": "all done"}
    ]})];
    for i in 0..100 {
        replies.push(
            json!({"agent": "worker", "prompt": format!("[job {i:03}]"), "steps": [
                {"toolCalls": [call("counter__work", json!({"n": i}))]},
                {"text": format!("job {i} done")}
            ]}),
        );
    }
    let dir = scene(&config, &json!({"replies": replies}));
    let out = arbor_in(dir.path(), &["run", "--tree-id", "tfan", "--quiet", "go"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc = export(dir.path(), "tfan");
    let mut most = 0;
    for i in 0..100 {
        let worker = state_prompted(&doc, "worker", &format!("[job {i:03}]"));
        let got = results(&worker);
        let answer: Value = serde_json::from_str(
            serde_json::from_str::<Value>(&got[0]).unwrap()[0]["value"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(answer["n"], json!(i), "{got:?}");
        let in_flight = answer["maxInFlight"].as_u64().unwrap();
        assert!(in_flight <= 4, "{in_flight} calls were in flight at once");
        most = most.max(in_flight);
    }
    // The calls did overlap (the cap, not a lack of load, kept them at 4).
    assert!(
        most >= 2,
        "at most {most} calls in flight: no overlap at all"
    );
}

#[test]
fn command_tool_arguments_reach_the_program_literally_through_a_run() {
    let config = r#"
[models.script]
provider = "scripted"
file = "script.json"

[tools.argv]
description = "Prints its arguments as JSON."
input_schema = { type = "object", properties = { a = { type = "string" }, b = { type = "string" } }, required = ["a", "b"] }
command = ["python3", "-c", "import json,sys; print(json.dumps(sys.argv[1:]))", "{a}", "--flag={b}"]

[tools.fails]
description = "Exits 3."
input_schema = { type = "object" }
command = ["sh", "-c", "echo broken >&2; exit 3"]

[tools.big]
description = "Prints a lot."
input_schema = { type = "object" }
command = ["python3", "-c", "print('x' * 5000)"]
max_output_bytes = 100

[agents.lead]
model = "script"
tools = ["argv", "fails", "big"]
"#;
    let hostile = "a b; $(touch pwned) `id` 'q' \"d\" *";
    let script = json!({"replies": [{"agent": "lead", "steps": [
        {"toolCalls": [call("argv", json!({"a": "-rf", "b": hostile}))]},
        {"toolCalls": [call("fails", json!({}))]},
        {"toolCalls": [call("big", json!({}))]},
        {"text": "ok"}
    ]}]});
    let dir = scene(config, &script);
    let out = arbor_in(dir.path(), &["run", "--tree-id", "tcmd", "--quiet", "go"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!dir.path().join("pwned").exists());
    let lead = find_state(&export(dir.path(), "tcmd"), "lead").unwrap();
    let got = results(&lead);
    let argv: Vec<String> = serde_json::from_str(
        serde_json::from_str::<Value>(&got[0]).unwrap()[0]["value"]
            .as_str()
            .unwrap()
            .trim(),
    )
    .unwrap();
    assert_eq!(argv, vec!["-rf".to_owned(), format!("--flag={hostile}")]);
    assert!(got[1].contains("exited with code 3"), "{}", got[1]);
    assert!(got[1].contains("broken"), "{}", got[1]);
    assert!(
        got[2].contains("output cut: showed the first 100 of 5001 bytes"),
        "{}",
        got[2]
    );
}

/// A runtime over a config that names the counter server, on `script`.
fn counter_runtime(extra: &str, script: &Value) -> (tempfile::TempDir, arbor::Runtime) {
    let config = format!(
        r#"
[models.script]
provider = "scripted"
file = "script.json"

[mcp_servers.counter]
command = "node"
args = ["{counter}"]
{extra}

[agents.lead]
model = "script"
tools = ["counter/*"]
max_steps = 4
"#,
        counter = counter(),
    );
    let dir = scene(&config, script);
    let config = arbor::Config::load(&dir.path().join("config.toml")).unwrap();
    let runtime = arbor::Runtime::new(config).unwrap();
    (dir, runtime)
}

fn tool_context() -> arbor::actors::ToolContext {
    arbor::actors::ToolContext {
        tree_id: "t".parse().unwrap(),
        run_id: "t/0".parse().unwrap(),
        agent_type: "test".into(),
        call_id: "c".into(),
        workspace: None,
    }
}

/// The first JSON text part of a tool result.
fn answer(output: &arbor::actors::ToolOutput) -> Value {
    let arbor::actors::ToolOutput::Parts(parts) = output else {
        panic!("not parts: {output:?}");
    };
    let arbor::actors::message::ToolResultPart::Json { value } = &parts[0] else {
        panic!("not JSON: {parts:?}");
    };
    serde_json::from_str(value.as_str().unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_tool_list_reaches_agents_that_start_afterwards() {
    let script = json!({"replies": [{"agent": "lead", "steps": [
        {"toolCalls": [call("counter__extra", json!({}))]},
        {"text": "ok"}
    ]}]});
    let (_dir, runtime) = counter_runtime("", &script);
    let mcp = runtime.tools().unwrap().mcp().clone();
    crate::support::guarded(async {
        mcp.prepare("counter").await;
        let before = mcp.generation();
        // The server grows a tool and says so (notifications/tools/list_changed).
        mcp.tool("counter", "grow")
            .call(json!({}), tool_context())
            .await
            .unwrap();
        mcp.changed(before).await;
        let result = runtime.run("lead", "go").await.unwrap();
        assert!(result.state.tool_definitions.contains_key("counter__extra"));
        let shown = serde_json::to_string(&result.state.message_history).unwrap();
        assert!(
            shown.contains(
                r#""toolName":"counter__extra","content":[{"type":"json","value":"\"extra\""}]"#
            ),
            "{shown}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_tree_cancels_its_mcp_call_on_the_server() {
    let script = json!({"replies": [{"agent": "lead", "steps": [
        {"toolCalls": [call("counter__hang", json!({}))]},
        {"text": "never"}
    ]}]});
    let (_dir, runtime) = counter_runtime(r#"timeout = "1h""#, &script);
    let mcp = runtime.tools().unwrap().mcp().clone();
    let stats = mcp.tool("counter", "stats");
    crate::support::guarded(async {
        let run = runtime.start("lead", "go", None).await.unwrap();
        // Bounded: until the server holds the call (it says so through `stats`).
        loop {
            let now = answer(&stats.call(json!({}), tool_context()).await.unwrap());
            if now["hanging"] == json!(1) {
                break;
            }
            tokio::task::yield_now().await;
        }
        run.cancel();
        let result = run.result().await.unwrap();
        assert_eq!(result.state.status.as_str(), "cancelled");
        loop {
            let now = answer(&stats.call(json!({}), tool_context()).await.unwrap());
            if now["cancelled"] == json!(1) {
                assert_eq!(now["hanging"], json!(0));
                break;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// `arbor run` on a lead that calls `counter__hang` (which never answers);
/// the counter server appends its pid to `pids`.
fn hanging_run(pids: &Path) -> tempfile::TempDir {
    let config = format!(
        r#"
[models.script]
provider = "scripted"
file = "script.json"

[mcp_servers.counter]
command = "node"
args = ["{counter}"]
env = {{ COUNTER_PID_FILE = "{pids}" }}
timeout = "1h"

[agents.lead]
model = "script"
tools = ["counter/hang"]
"#,
        counter = counter(),
        pids = pids.display(),
    );
    let script = json!({"replies": [{"agent": "lead", "steps": [
        {"toolCalls": [call("counter__hang", json!({}))]},
        {"text": "never"}
    ]}]});
    scene(&config, &script)
}

/// The pid the counter server wrote, once it has (bounded); with `hanging`,
/// once it also holds a `hang` call (so it is idle, connected, mid-call).
fn server_pid(pids: &Path, hanging: bool) -> u32 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let written = std::fs::read_to_string(pids).unwrap_or_default();
        let pid = written.lines().next().and_then(|l| l.trim().parse().ok());
        if let Some(pid) = pid.filter(|_| !hanging || written.contains("hanging")) {
            return pid;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the MCP server never started"
        );
        std::thread::yield_now();
    }
}

/// Waits (bounded) for a child process to exit.
fn exited(child: &mut std::process::Child) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(std::time::Instant::now() < deadline, "arbor did not exit");
        std::thread::yield_now();
    }
}

#[test]
fn sigterm_mid_call_leaves_no_mcp_server_behind() {
    let pids = tempfile::NamedTempFile::new().unwrap();
    let dir = hanging_run(pids.path());
    let mut arbor = std::process::Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(["run", "--quiet", "--no-store", "go"])
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let server = server_pid(pids.path(), true);
    assert!(alive(server));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(arbor.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = exited(&mut arbor);
    assert_eq!(status.code(), Some(143));
    assert!(
        ends(server),
        "MCP server {server} outlived a SIGTERM'd arbor"
    );
}

#[test]
fn a_panicking_arbor_leaves_no_mcp_server_behind() {
    let pids = tempfile::NamedTempFile::new().unwrap();
    let config = format!(
        r#"
[models.script]
provider = "scripted"
file = "script.json"

[mcp_servers.counter]
command = "node"
args = ["{counter}"]
env = {{ COUNTER_PID_FILE = "{pids}" }}

[agents.lead]
model = "script"
tools = ["counter/work"]
"#,
        counter = counter(),
        pids = pids.path().display(),
    );
    let script = json!({"replies": [{"agent": "lead", "steps": [
        {"toolCalls": [call("counter__work", json!({"n": 1}))]},
        {"text": "never printed"}
    ]}]});
    let dir = scene(&config, &script);
    // A stderr nobody reads: the first line `run` writes there ("tree …",
    // once the root's MCP server is up) panics (eprintln! on EPIPE), and the
    // panic unwinds out of main with the runtime and the server still up.
    // (A closed stdout is not a panic: it ends the command quietly.)
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut arbor = std::process::Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(["run", "--no-store", "go"])
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(writer)
        .spawn()
        .unwrap();
    let status = exited(&mut arbor);
    assert_eq!(status.code(), Some(101), "arbor did not panic: {status}");
    let server = server_pid(pids.path(), false);
    assert!(
        ends(server),
        "MCP server {server} outlived a panicking arbor"
    );
}

#[test]
fn the_tools_example_checks_and_runs_its_swarm_over_the_filesystem_server_and_grep() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let example = root.join("examples/tools/config.toml");
    let out = arbor_in(root, &["check-config", example.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The same config with the server from tests/mcp instead of npx (which
    // would fetch it from the registry).
    let shipped = std::fs::read_to_string(&example).unwrap();
    let npx = r#"command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem@2026.8.31", "examples/tools/notes"]"#;
    assert!(shipped.contains(npx), "the example's server lines changed");
    let local = shipped.replace(
        npx,
        &format!(
            "command = \"node\"\nargs = [\"{}\", \"examples/tools/notes\"]",
            filesystem()
        ),
    );
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("arbor.db");
    let local = local.replace(
        "[store]\nenabled = false",
        &format!("[store]\npath = \"{}\"", store.display()),
    );
    std::fs::write(dir.path().join("config.toml"), local).unwrap();
    std::fs::copy(
        root.join("examples/tools/script.json"),
        dir.path().join("script.json"),
    )
    .unwrap();
    let config = dir.path().join("config.toml");
    let out = arbor_in(
        root,
        &[
            "run",
            "--config",
            config.to_str().unwrap(),
            "--json",
            "--tree-id",
            "texample",
            "What do the notes say?",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let root_state: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(root_state["status"], "completed");
    assert_eq!(root_state["childRunIds"].as_array().unwrap().len(), 2);
    // Each researcher's answer came from grep and the filesystem server.
    let out = arbor_in(
        root,
        &["export", "--config", config.to_str().unwrap(), "texample"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let caching = results(&state_prompted(&doc, "researcher", "about caching"));
    assert!(caching[0].contains("caching.md:"), "{caching:?}");
    assert!(
        caching[1].contains("pays for the shared prefix once"),
        "{caching:?}"
    );
    let limits = results(&state_prompted(&doc, "researcher", "about limits"));
    assert!(limits[1].contains("wait for a slot"), "{limits:?}");
}

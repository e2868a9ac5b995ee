//! What a tool call costs through Arbor, against bare loops in the same run.
//!
//! **MCP** (`@modelcontextprotocol/server-everything` over stdio, its `echo`
//! tool, sequential calls):
//!
//! - `a` bare rmcp: a client session of our own over the server's stdin and
//!   stdout (the transport Arbor uses), `peer.call_tool(echo)`;
//! - `b` Arbor's tool handle: `McpServers::tool("everything", "echo")` and
//!   `Tool::call` (allow-list, permit of the server's semaphore, per-call
//!   timeout, the connection's liveness, the result mapped to parts);
//! - `c` the agent path: a tree of one agent on a scripted model (`StepModel`) that makes K
//!   steps, each one `everything__echo` call, then ends; against the same tree
//!   with an in-process code tool of the same schema that answers at once
//!   (`c_code`). `c_mcp − c_code` is what an MCP call costs inside a tree.
//!
//! `a` and `b` run on two node processes of the same server (`c` shares
//! `b`'s). **Command tools**: 1,000 calls of `true` across a tree (a lead
//! spawns W workers, each makes S steps of one call), against a bare loop (W
//! tokio tasks each running `true` S times with `tokio::process::Command`,
//! `process_group(0)`, output read). Between the two: the bare loop with the
//! environment cleared but for `PATH` (as a command tool runs its program),
//! `CommandTool::call` in the same W × S loop, the program named `true` or by
//! its absolute path (std spawns a bare name on a changed `PATH` with fork and
//! exec, a path with `posix_spawn`), and the same tree with an in-process tool
//! (no process at all).
//!
//! Every variant runs once per round, the order reversed every other round
//! (drift cancels); the figures are over all rounds. CPU time comes from
//! `/proc` (100 Hz ticks): this process, the node server, and the reaped
//! children (the `true` processes).
//!
//! Run: `cargo bench --bench tools` (needs `npm ci --prefix tests/mcp`; skips
//! the MCP part without it). Settings: `ARBOR_BENCH_ROUNDS` (5), `ARBOR_BENCH_N`
//! (2000 calls per round for a and b), `ARBOR_BENCH_WARMUP` (3000),
//! `ARBOR_BENCH_K` (500 steps), `ARBOR_BENCH_WORKERS` (10),
//! `ARBOR_BENCH_STEPS` (100 per worker), `ARBOR_BENCH_ONLY` (`mcp` or `command`),
//! `ARBOR_BENCH_MODEL=scripted` (the trees on `ScriptedModel` instead of the
//! bench's `StepModel`, which answers the same script at O(1) per request).

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arbor::Runtime;
use arbor::actors::message::TOOL_CALL_ERROR;
use arbor::actors::models::ScriptedModel;
use arbor::actors::models::scripted::{Script, ScriptedReply};
use arbor::actors::{
    AgentState, AgentStatus, AgentTemplate, Content, Delta, DeltaSink, Message, Model, ModelError,
    ModelRequest, ModelResponse, Part, Tool, ToolCall, ToolContext, ToolError, ToolOutput,
    ToolResultPart, Usage,
};
use arbor::supervisor::{Catalog, TreeLimits};
use arbor::tools::ToolSet;
use arbor::tools::command::{CommandTool, CommandToolSection};
use arbor::tools::mcp::McpServerSection;
use async_trait::async_trait;
use hdrhistogram::Histogram;
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, ContentBlock, Implementation,
    JsonObject, ProtocolVersion,
};
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod common;

use common::*;

// ---------------------------------------------------------------- MCP

/// The in-process stand-in for `echo`: same schema, same answer.
struct CodeEcho {
    schema: Value,
}

#[async_trait]
impl Tool for CodeEcho {
    fn name(&self) -> &str {
        "echo"
    }
    fn description(&self) -> &str {
        "Echoes back the input string"
    }
    fn input_schema(&self) -> Value {
        self.schema.clone()
    }
    async fn call(&self, input: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let message = input["message"].as_str().unwrap_or_default();
        Ok(ToolOutput::Parts(vec![ToolResultPart::Json {
            value: Value::String(format!("Echo: {message}")),
        }]))
    }
}

/// A bare rmcp session with the server over its stdio, as Arbor opens one
/// (same client info and protocol version), without Arbor around it.
async fn bare_session(
    script: &Path,
) -> (
    RunningService<RoleClient, ClientConfig>,
    tokio::process::Child,
) {
    let mut child = tokio::process::Command::new("node")
        .arg(script)
        .arg("stdio")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn node");
    let stdin = child.stdin.take().expect("stdin");
    let stdout = child.stdout.take().expect("stdout");
    let info = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("bench", "0"),
    )
    .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE);
    let service = info.serve((stdout, stdin)).await.expect("initialize");
    (service, child)
}

async fn bare_call(service: &RunningService<RoleClient, ClientConfig>, arguments: &JsonObject) {
    let params = CallToolRequestParams::new("echo").with_arguments(arguments.clone());
    let result = service.peer().call_tool(params).await.expect("call");
    match result.content.first() {
        Some(ContentBlock::Text(text)) => assert_eq!(text.text, "Echo: hi"),
        other => panic!("unexpected echo result {other:?}"),
    }
}

async fn arbor_call(tool: &Arc<dyn Tool>, ctx: &ToolContext) {
    let output = tool
        .call(json!({"message": "hi"}), ctx.clone())
        .await
        .expect("echo");
    assert_eq!(
        output,
        ToolOutput::Parts(vec![ToolResultPart::Json {
            value: json!("Echo: hi")
        }])
    );
}

/// One tree: an agent making `k` steps of one call of `tool`, then ending.
/// Returns the tree's wall time.
async fn echo_tree(s: &Settings, tools: &ToolSet, code: Option<Arc<dyn Tool>>) -> Duration {
    let k = s.k;
    let (entry, wire) = if code.is_some() {
        ("echo", "echo")
    } else {
        ("everything/echo", "everything__echo")
    };
    let script = json!({"replies": [
        {"agent": "agent", "steps": steps_of(wire, &json!({"message": "hi"}), k)}
    ]});
    let runtime = runtime(
        tools,
        code,
        scripted(&script, s),
        vec![template("agent", &[entry], k + 5)],
    );
    let start = Instant::now();
    let result = runtime.run("agent", "go").await.expect("run");
    let elapsed = start.elapsed();
    assert_eq!(result.state.status, AgentStatus::Completed, "{entry} tree");
    assert_eq!(
        tool_results(&result.state),
        (k, 0),
        "{entry} tree's results"
    );
    elapsed
}

struct Calls {
    hist: Histogram<u64>,
    cpu: Cpu,
    rounds: Vec<f64>,
}

impl Calls {
    fn new() -> Calls {
        Calls {
            hist: histogram(),
            cpu: Cpu::default(),
            rounds: Vec::new(),
        }
    }
}

struct Trees {
    per_step_ns: Vec<f64>,
    cpu: Cpu,
}

async fn mcp_section(s: &Settings, script: &Path) {
    // a: the bare client.
    let (bare, bare_child) = bare_session(script).await;
    let bare_pid = bare_child.id();
    let arguments: JsonObject = json!({"message": "hi"})
        .as_object()
        .cloned()
        .expect("object");

    // b, c: Arbor's servers (one connection, shared by b and the trees).
    let section = McpServerSection {
        command: Some("node".to_owned()),
        args: Some(vec![script.display().to_string(), "stdio".to_owned()]),
        ..McpServerSection::default()
    };
    let settings = section
        .settings("everything", Path::new("/"))
        .expect("settings");
    let tools = ToolSet::new(
        &BTreeMap::from([("everything".to_owned(), settings)]),
        Vec::new(),
    );
    tools.mcp().prepare("everything").await;
    let status = tools.mcp().status("everything");
    assert!(status.starts_with("running"), "everything: {status}");
    let arbor_pid = tools.mcp().pid("everything");
    let handle = tools.mcp().tool("everything", "echo");
    let code: Arc<dyn Tool> = Arc::new(CodeEcho {
        schema: handle.input_schema(),
    });
    let ctx = ctx();

    for _ in 0..s.warmup {
        bare_call(&bare, &arguments).await;
        arbor_call(&handle, &ctx).await;
    }
    echo_tree(s, &tools, None).await;
    echo_tree(s, &tools, Some(code.clone())).await;

    let mut a = Calls::new();
    let mut b = Calls::new();
    let mut trees = [
        Trees {
            per_step_ns: Vec::new(),
            cpu: Cpu::default(),
        },
        Trees {
            per_step_ns: Vec::new(),
            cpu: Cpu::default(),
        },
    ];
    for round in 0..s.rounds {
        for variant in order(round, 4) {
            match variant {
                0 => {
                    let mark = CpuMark::now(bare_pid);
                    let started = Instant::now();
                    for _ in 0..s.n {
                        let t = Instant::now();
                        bare_call(&bare, &arguments).await;
                        a.hist
                            .record(t.elapsed().as_nanos() as u64)
                            .expect("record");
                    }
                    a.rounds.push(us(started.elapsed()) / s.n as f64);
                    mark.add_to(&mut a.cpu);
                }
                1 => {
                    let mark = CpuMark::now(arbor_pid);
                    let started = Instant::now();
                    for _ in 0..s.n {
                        let t = Instant::now();
                        arbor_call(&handle, &ctx).await;
                        b.hist
                            .record(t.elapsed().as_nanos() as u64)
                            .expect("record");
                    }
                    b.rounds.push(us(started.elapsed()) / s.n as f64);
                    mark.add_to(&mut b.cpu);
                }
                2 | 3 => {
                    let which = variant - 2;
                    let tool = (which == 1).then(|| code.clone());
                    let mark = CpuMark::now(arbor_pid);
                    let wall = echo_tree(s, &tools, tool).await;
                    mark.add_to(&mut trees[which].cpu);
                    trees[which]
                        .per_step_ns
                        .push(wall.as_nanos() as f64 / s.k as f64);
                }
                _ => unreachable!(),
            }
        }
    }

    drop(bare.cancel().await);
    drop(bare_child);
    tools.mcp().shutdown().await;

    let calls = s.n * s.rounds;
    let trees_steps = s.k * s.rounds;
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let a_mean = ns_us(a.hist.mean());
    let b_mean = ns_us(b.hist.mean());
    let c_mcp = ns_us(mean(&trees[0].per_step_ns));
    let c_code = ns_us(mean(&trees[1].per_step_ns));
    println!(
        "MCP echo (server-everything, stdio): a, b {} sequential calls x {} rounds (after {} warm-up); c one agent x {} steps x {} rounds on {}",
        s.n,
        s.rounds,
        s.warmup,
        s.k,
        s.rounds,
        if s.scripted {
            "ScriptedModel"
        } else {
            "StepModel"
        }
    );
    println!(
        "{:<44} {:>9} {:>9} {:>9} {:>10} {:>12}",
        "variant", "p50 µs", "p99 µs", "mean µs", "cpu µs", "server µs"
    );
    for (label, calls_of) in [
        ("a  bare rmcp peer.call_tool", &a),
        ("b  McpServers tool, Tool::call", &b),
    ] {
        println!(
            "{label:<44} {:>9.1} {:>9.1} {:>9.1} {:>10.1} {:>12.1}",
            ns_us(calls_of.hist.value_at_quantile(0.5) as f64),
            ns_us(calls_of.hist.value_at_quantile(0.99) as f64),
            ns_us(calls_of.hist.mean()),
            per_call_us(calls_of.cpu.own, calls),
            per_call_us(calls_of.cpu.server, calls),
        );
    }
    for (label, t, m) in [
        ("c  tree, step calling everything__echo", &trees[0], c_mcp),
        (
            "c0 tree, step calling an in-process echo",
            &trees[1],
            c_code,
        ),
    ] {
        println!(
            "{label:<44} {:>9} {:>9} {m:>9.1} {:>10.1} {:>12.1}",
            "-",
            "-",
            per_call_us(t.cpu.own, trees_steps),
            per_call_us(t.cpu.server, trees_steps),
        );
    }
    let show = |v: &[f64], scale: f64| {
        v.iter()
            .map(|x| format!("{:.1}", x * scale))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!("per-round means µs: a [{}]", show(&a.rounds, 1.0));
    println!("                    b [{}]", show(&b.rounds, 1.0));
    println!(
        "                    c [{}]",
        show(&trees[0].per_step_ns, 1e-3)
    );
    println!(
        "                   c0 [{}]",
        show(&trees[1].per_step_ns, 1e-3)
    );
    println!(
        "ratios: b/a p50 {:.2}, p99 {:.2}, mean {:.2}; c - c0 = {:.1} µs per MCP call in a tree = {:.2}x a's mean ({:.2}x b's)",
        a_ratio(&b.hist, &a.hist, 0.5),
        a_ratio(&b.hist, &a.hist, 0.99),
        b_mean / a_mean,
        c_mcp - c_code,
        (c_mcp - c_code) / a_mean,
        (c_mcp - c_code) / b_mean,
    );
    println!();
}

fn a_ratio(num: &Histogram<u64>, den: &Histogram<u64>, q: f64) -> f64 {
    num.value_at_quantile(q) as f64 / den.value_at_quantile(q) as f64
}

// ---------------------------------------------------------------- command tools

/// The in-process stand-in for the command tool: answers what `true` prints.
struct Noop;

#[async_trait]
impl Tool for Noop {
    fn name(&self) -> &str {
        "noop"
    }
    fn description(&self) -> &str {
        "Does nothing."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object"})
    }
    async fn call(&self, _input: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::Json(Value::String(String::new())))
    }
}

fn command_tool(name: &str, program: &str) -> CommandTool {
    let section: CommandToolSection = serde_json::from_value(json!({
        "description": "Runs true.",
        "input_schema": {"type": "object"},
        "command": [program],
    }))
    .expect("section");
    section
        .build(name, Path::new("/"))
        .unwrap_or_else(|problems| panic!("command tool: {problems:?}"))
}

/// Where `PATH` finds `program` (what an absolute `command[0]` would say).
fn on_path(program: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("{program} is not on PATH"))
}

/// `workers` tasks, each running `true` `steps` times, one after the other.
/// `like_arbor`: the environment cleared but for `PATH`, as a command tool
/// runs its program (std then forks instead of using `posix_spawn`, since the
/// program is a bare name looked up on a changed `PATH`).
async fn bare_loop(workers: usize, steps: usize, like_arbor: bool) {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let path = path.clone();
            tokio::spawn(async move {
                for _ in 0..steps {
                    let mut command = tokio::process::Command::new("true");
                    if like_arbor {
                        command.env_clear().env("PATH", &path);
                    }
                    let out = command
                        .stdin(Stdio::null())
                        .process_group(0)
                        .output()
                        .await
                        .expect("run true");
                    assert!(out.status.success());
                }
            })
        })
        .collect();
    for task in futures::future::join_all(tasks).await {
        task.expect("task");
    }
}

async fn tool_loop(tool: &Arc<CommandTool>, workers: usize, steps: usize) {
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let tool = tool.clone();
            tokio::spawn(async move {
                for i in 0..steps {
                    // A call id of its own, as in a tree: calls of one id
                    // wait for each other (the call lock).
                    let mut ctx = ctx();
                    ctx.call_id = format!("w{w}-c{i}");
                    let out = tool.call(json!({}), ctx).await.expect("true");
                    assert_eq!(out, ToolOutput::Json(json!("")));
                }
            })
        })
        .collect();
    for task in futures::future::join_all(tasks).await {
        task.expect("task");
    }
}

/// One tree: a lead spawns `workers` workers, each making `steps` steps of
/// one call of `tool`. Returns the tree's wall time.
async fn worker_tree(
    s: &Settings,
    tools: &ToolSet,
    extra: Option<Arc<dyn Tool>>,
    tool: &str,
) -> Duration {
    let (workers, steps) = (s.workers, s.steps);
    let agents: Vec<Value> = (0..workers)
        .map(|i| json!({"agent_type": "worker", "prompt": format!("part {i}")}))
        .collect();
    let script = json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [{"name": "spawn_agents", "input": {"agents": agents}}]},
            {"text": "merged"}
        ]},
        {"agent": "worker", "steps": steps_of(tool, &json!({}), steps)}
    ]});
    let lead = template("lead", &[], 5).spawns(&["worker"]);
    let worker = template("worker", &[tool], steps + 5);
    let runtime = runtime(tools, extra, scripted(&script, s), vec![lead, worker]);
    let start = Instant::now();
    let result = runtime.run("lead", "go").await.expect("run");
    let elapsed = start.elapsed();
    assert_eq!(result.state.status, AgentStatus::Completed, "{tool} tree");
    assert_eq!(result.state.child_run_ids.len(), workers);
    for child in &result.state.child_run_ids {
        let state = runtime.state(child).await.expect("worker state");
        assert_eq!(state.status, AgentStatus::Completed, "{tool} worker");
        assert_eq!(tool_results(&state), (steps, 0), "{tool} worker's results");
    }
    elapsed
}

async fn command_section(s: &Settings) {
    let absolute = on_path("true");
    let by_name = Arc::new(command_tool("truth", "true"));
    let by_path = Arc::new(command_tool("truth_abs", &absolute.display().to_string()));
    let tools = ToolSet::new(&BTreeMap::new(), vec![by_name.clone(), by_path.clone()]);
    let noop: Arc<dyn Tool> = Arc::new(Noop);
    let calls = s.workers * s.steps;
    let labels = [
        "bare loop: Command(\"true\").output() [base]",
        "bare loop, env cleared but PATH (as Arbor)",
        "CommandTool::call loop, [\"true\"]",
        "CommandTool::call loop, [\"/usr/bin/true\"]",
        "tree: command tool [\"true\"]",
        "tree: command tool [\"/usr/bin/true\"]",
        "tree: in-process tool (no process)",
    ];
    let run = |variant: usize| {
        let (tools, by_name, by_path, noop) = (&tools, &by_name, &by_path, &noop);
        async move {
            let start = Instant::now();
            match variant {
                0 => bare_loop(s.workers, s.steps, false).await,
                1 => bare_loop(s.workers, s.steps, true).await,
                2 => tool_loop(by_name, s.workers, s.steps).await,
                3 => tool_loop(by_path, s.workers, s.steps).await,
                4 => return worker_tree(s, tools, None, "truth").await,
                5 => return worker_tree(s, tools, None, "truth_abs").await,
                6 => {
                    let noop = Some(noop.clone());
                    return worker_tree(s, tools, noop, "noop").await;
                }
                _ => unreachable!(),
            }
            start.elapsed()
        }
    };

    // Warm-up: one of each.
    for variant in 0..labels.len() {
        run(variant).await;
    }
    let mut walls: Vec<Vec<Duration>> = vec![Vec::new(); labels.len()];
    let mut cpus = vec![Cpu::default(); labels.len()];
    for round in 0..s.rounds {
        for variant in order(round, labels.len()) {
            let mark = CpuMark::now(None);
            let wall = run(variant).await;
            mark.add_to(&mut cpus[variant]);
            walls[variant].push(wall);
        }
    }

    let median = |v: &[Duration]| {
        let mut v = v.to_vec();
        v.sort();
        v[v.len() / 2]
    };
    let base = median(&walls[0]);
    println!(
        "command tools: {} calls per variant ({} concurrent x {} sequential), {} rounds; wall = median of rounds; `true` is {}",
        calls,
        s.workers,
        s.steps,
        s.rounds,
        absolute.display()
    );
    println!(
        "{:<46} {:>9} {:>9} {:>7} {:>11} {:>13}",
        "variant", "wall ms", "µs/call", "ratio", "cpu µs/call", "child µs/call"
    );
    let total_calls = calls * s.rounds;
    for (i, label) in labels.iter().enumerate() {
        let wall = median(&walls[i]);
        println!(
            "{i} {label:<44} {:>9.1} {:>9.1} {:>7.2} {:>11.1} {:>13.1}",
            wall.as_secs_f64() * 1e3,
            us(wall) / calls as f64,
            wall.as_secs_f64() / base.as_secs_f64(),
            per_call_us(cpus[i].own, total_calls),
            per_call_us(cpus[i].children, total_calls),
        );
    }
    for (i, wall) in walls.iter().enumerate() {
        let shown: Vec<String> = wall
            .iter()
            .map(|d| format!("{:.1}", d.as_secs_f64() * 1e3))
            .collect();
        println!("per-round wall ms {i}: [{}]", shown.join(" "));
    }
    println!();
}

// ---------------------------------------------------------------- main

fn everything_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
}

fn node_runs() -> bool {
    std::process::Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn main() {
    let settings = Settings::from_env();
    let only = std::env::var("ARBOR_BENCH_ONLY").unwrap_or_default();
    let script = everything_script();
    let mcp = only.is_empty() || only == "mcp";
    let command = only.is_empty() || only == "command";
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        if mcp {
            if !script.exists() {
                eprintln!(
                    "skipping the MCP benchmarks: {} is missing (run `npm ci --prefix tests/mcp`)",
                    script.display()
                );
            } else if !node_runs() {
                eprintln!("skipping the MCP benchmarks: `node` does not run");
            } else {
                mcp_section(&settings, &script).await;
            }
        }
        if command {
            command_section(&settings).await;
        }
    });
}

//! Tools as a user meets them: what each model is told (spawnable agents,
//! output schemas, instructions), tree tool policies, tools registered in code
//! and named from TOML, and `check-config`'s reports on tool declarations.
//! MCP servers and command tools through the binary are in `tools_e2e.rs`.

use std::path::Path;
use std::sync::Arc;

use arbor::Runtime;
use arbor::actors::models::ScriptedModel;
use arbor::actors::{Tool, ToolContext, ToolError, ToolOutput};
use arbor::config::Config;
use arbor::supervisor::{Catalog, ToolRule};
use arbor_test_support::{call, scripted_as, spawn_call};
use async_trait::async_trait;
use serde_json::{Value, json};

use crate::{arbor_in, text};

/// A config and script written into a fresh temp dir.
pub fn scene(config: &str, script: &Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), config).unwrap();
    std::fs::write(
        dir.path().join("script.json"),
        serde_json::to_string_pretty(script).unwrap(),
    )
    .unwrap();
    dir
}

const TOLD: &str = r#"
[run]
agent = "lead"

[limits]
max_depth = 2

[models.script]
provider = "scripted"
file = "script.json"

[agents.lead]
model = "script"
description = "Leads the team."
spawnable_agents = ["judge", "researcher"]
instructions_prompt = "Delegate, then merge."
step_prompt = "Be brief."

[agents.researcher]
model = "script"
description = "Researches one narrow question and reports the facts."
spawner_prompt = "Spawn one per sub-question."
input_schema = { params = { type = "object", required = ["topic"], properties = { topic = { type = "string" } } } }

[agents.judge]
model = "script"
description = "Scores an answer."
output_mode = "structured_output"
output_schema = { type = "object", required = ["score"], properties = { score = { type = "number", minimum = 0, maximum = 10 } } }
"#;

/// Builds a runtime over a config's templates with `model` as its only model
/// (so the test can read what every agent sent).
fn runtime_over(config: &Config, model: Arc<ScriptedModel>) -> Runtime {
    let mut builder = config.tool_set().register(Catalog::builder());
    builder = builder.model_as("script", model);
    for t in &config.templates {
        builder = builder.template(t.clone());
    }
    Runtime::from_catalog(builder.build().unwrap(), config.limits.clone())
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_parent_model_is_told_each_spawnable_agents_description_and_input_schema() {
    let dir = scene(TOLD, &json!({"replies": []}));
    let config = Config::load(&dir.path().join("config.toml")).unwrap();
    let script = json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [call("spawn_agents", json!({"agents": [
                {"agent_type": "judge", "prompt": "score it"}]}))]},
            {"text": "merged"}
        ]},
        {"agent": "judge", "steps": [
            {"toolCalls": [call("set_output", json!({"score": 11}))]},
            {"toolCalls": [call("set_output", json!({"score": 7}))]},
            {"text": "scored"}
        ]}
    ]});
    let model = scripted_as("script", &script);
    let runtime = runtime_over(&config, model.clone());
    let result = runtime.run("lead", "Is it good?").await.unwrap();
    assert_eq!(result.state.status.as_str(), "completed");

    let requests = model.requests();
    let lead = requests
        .iter()
        .find(|r| r.agent_type == "lead")
        .expect("the lead asked its model");
    let spawn = &lead.definitions["spawn_agents"];
    for needle in [
        "researcher: Researches one narrow question and reports the facts.",
        "When to use: Spawn one per sub-question.",
        "judge: Scores an answer.",
        r#"params must match: {"properties":{"topic":{"type":"string"}},"required":["topic"],"type":"object"}"#,
    ] {
        assert!(
            spawn.description.contains(needle),
            "{needle:?} not in {:?}",
            spawn.description
        );
    }
    assert_eq!(
        spawn
            .input_schema
            .pointer("/properties/agents/items/properties/agent_type/examples"),
        Some(&json!(["judge", "researcher"]))
    );
    // The inline spawn tool says the same.
    assert!(
        lead.definitions["spawn_agent_inline"]
            .description
            .contains("researcher: Researches")
    );

    // The judge's set_output carries its output schema, and an output that
    // fails it is an error result the judge reads.
    let judge = requests
        .iter()
        .find(|r| r.agent_type == "judge")
        .expect("the judge asked its model");
    assert_eq!(
        judge.definitions["set_output"].input_schema["properties"]["score"]["maximum"],
        json!(10)
    );
    let judge_state = runtime.state(&result.state.child_run_ids[0]).await.unwrap();
    assert_eq!(judge_state.output, Some(json!({"score": 7})));
    let shown = serde_json::to_string(&judge_state.message_history).unwrap();
    assert!(
        shown.contains("Output does not match the output schema"),
        "{shown}"
    );
}

#[tokio::test]
async fn instructions_follow_the_prompt_and_the_step_prompt_is_sent_but_never_stored() {
    let dir = scene(TOLD, &json!({"replies": []}));
    let config = Config::load(&dir.path().join("config.toml")).unwrap();
    let script = json!({"replies": [
        {"agent": "lead", "steps": [{"toolCalls": [call("end_turn", json!({}))], "text": "ok"}]}
    ]});
    let model = scripted_as("script", &script);
    let runtime = runtime_over(&config, model.clone());
    let result = runtime.run("lead", "Is it good?").await.unwrap();
    let sent = serde_json::to_value(&model.requests()[0].messages).unwrap();
    let texts: Vec<&str> = sent
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(
        texts,
        vec!["Is it good?", "Delegate, then merge.", "Be brief."]
    );
    // The instructions live for the turn (`timeToLive: "userPrompt"`, as
    // Codebuff's): sent with its requests, expired once it ended, so
    // follow-up turns do not pile them up (issue 34).
    let stored = serde_json::to_string(&result.state.message_history).unwrap();
    assert!(!stored.contains("Delegate, then merge."), "{stored}");
    assert!(!stored.contains("Be brief."), "{stored}");
    assert!(stored.contains("Is it good?"), "{stored}");
}

/// A tool written in Rust that the config's templates name.
struct Lookup;

#[async_trait]
impl Tool for Lookup {
    fn name(&self) -> &str {
        "lookup"
    }
    fn description(&self) -> &str {
        "Looks a key up."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]})
    }
    async fn call(&self, input: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        Ok(json!({"value": format!("{} for {}", input["key"], ctx.agent_type)}).into())
    }
}

const CODE_TOOL: &str = r#"
[models.script]
provider = "scripted"
file = "script.json"

[agents.lead]
model = "script"
tools = ["lookup"]
"#;

#[tokio::test]
async fn a_tool_registered_in_code_is_named_from_toml() {
    let dir = scene(
        CODE_TOOL,
        &json!({"replies": [{"agent": "lead", "steps": [
            {"toolCalls": [call("lookup", json!({"key": "alpha"}))]},
            {"text": "found"}
        ]}]}),
    );
    let config = Config::load(&dir.path().join("config.toml")).unwrap();
    // Without the tool, the name is a problem at its line.
    let err = Runtime::builder(config.clone())
        .build()
        .err()
        .expect("an unknown tool is refused")
        .to_string();
    assert!(
        err.contains("config.toml:8: agents.lead.tools: unknown tool \"lookup\""),
        "{err}"
    );
    let runtime = Runtime::builder(config)
        .tool(Arc::new(Lookup))
        .build()
        .unwrap();
    let result = runtime.run("lead", "go").await.unwrap();
    let shown = serde_json::to_string(&result.state.message_history).unwrap();
    assert!(shown.contains(r#"\"alpha\" for lead"#), "{shown}");
}

const POLICY: &str = r#"
[run]
agent = "lead"

[limits]
max_depth = 2

[policy]
deny_tools = ["add_*"]

[models.script]
provider = "scripted"
file = "script.json"

[tools.echo]
description = "Echoes its word."
input_schema = { type = "object", properties = { word = { type = "string" } }, required = ["word"] }
command = ["echo", "{word}"]

[agents.lead]
model = "script"
spawnable_agents = ["worker"]
tools = ["echo"]

[agents.worker]
model = "script"
tools = ["echo", "add_message"]
"#;

fn policy_script() -> Value {
    json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("worker", "go")])]},
            {"text": "done"}
        ]},
        {"agent": "worker", "steps": [
            {"toolCalls": [
                call("echo", json!({"word": "forged"})),
                call("add_message", json!({"role": "user", "content": "x"}))
            ]},
            {"text": "worked"}
        ]}
    ]})
}

/// The worker's stored state, through `arbor export`.
fn worker_state(dir: &Path, tree: &str) -> Value {
    let out = arbor_in(dir, &["export", tree]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    find_state(&doc, "worker").unwrap_or_else(|| panic!("no worker state in {doc}"))
}

/// The first stored final state of an agent type anywhere in an export.
pub fn find_state(doc: &Value, agent_type: &str) -> Option<Value> {
    match doc {
        Value::Object(map) => {
            if map.get("agentType") == Some(&json!(agent_type))
                && map.contains_key("messageHistory")
            {
                return Some(doc.clone());
            }
            map.values().find_map(|v| find_state(v, agent_type))
        }
        Value::Array(items) => items.iter().find_map(|v| find_state(v, agent_type)),
        _ => None,
    }
}

#[test]
fn a_tree_wide_deny_stops_a_child_whose_template_lists_the_tool() {
    let dir = scene(POLICY, &policy_script());
    let out = arbor_in(
        dir.path(),
        &[
            "run",
            "--tree-id",
            "tpolicy",
            "--deny-tools",
            "ech*",
            "--quiet",
            "go",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let worker = worker_state(dir.path(), "tpolicy");
    // Neither tool is offered to the worker's model …
    let offered: Vec<&String> = worker["toolDefinitions"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert!(
        !offered.iter().any(|t| *t == "echo" || *t == "add_message"),
        "{offered:?}"
    );
    // … and the calls it forged anyway got error results naming the policy.
    let history = worker["messageHistory"].to_string();
    assert!(
        history.contains("Tool echo (echo) is not allowed by this tree's tool policy"),
        "{history}"
    );
    assert!(
        history
            .contains("Tool add_message (add_message) is not allowed by this tree's tool policy"),
        "{history}"
    );
    assert!(!history.contains("forged\\n"), "{history}");
}

#[test]
fn without_the_deny_the_same_child_runs_its_command_tool() {
    let dir = scene(POLICY, &policy_script());
    let out = arbor_in(
        dir.path(),
        &["run", "--tree-id", "tpolicy2", "--quiet", "go"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let worker = worker_state(dir.path(), "tpolicy2");
    let history = worker["messageHistory"].to_string();
    assert!(history.contains("forged\\n"), "{history}");
    // The config's own [policy] still refuses add_message.
    assert!(
        history.contains("Tool add_message (add_message) is not allowed"),
        "{history}"
    );
}

#[test]
fn a_start_request_cannot_widen_the_configs_policy() {
    let dir = scene(POLICY, &policy_script());
    let out = arbor_in(
        dir.path(),
        &[
            "run",
            "--tree-id",
            "tpolicy3",
            "--allow-tools",
            "*",
            "--quiet",
            "go",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let history = worker_state(dir.path(), "tpolicy3")["messageHistory"].to_string();
    assert!(
        history.contains("Tool add_message (add_message) is not allowed"),
        "{history}"
    );
    let rule = ToolRule {
        allow: Some(vec!["*".into()]),
        deny: vec![],
        approve: vec![],
    };
    assert!(rule.problems().is_empty());
}

#[test]
fn a_bad_tool_pattern_on_the_command_line_is_named() {
    let dir = scene(POLICY, &policy_script());
    let out = arbor_in(dir.path(), &["run", "--deny-tools", "fs read", "go"]);
    // A config error, as the same pattern in [policy] is (issue 34).
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("pattern \"fs read\": ' ' cannot be in a tool name"),
        "{}",
        text(&out.stderr)
    );
}

const BAD_TOOLS: &str = r#"[models.m]
provider = "simulated"

[mcp_servers.both]
command = "mcp-server"
url = "http://127.0.0.1:9/mcp"

[tools.grep]
description = "Greps."
input_schema = { type = "object", properties = { pattern = { type = "string" } } }
command = ["grep", "{pattern}", "{path}"]

[policy]
allow_tools = ["fs/[x]"]

[agents.lead]
model = "m"
tools = ["nowhere/*", "grepp"]
"#;

#[test]
fn check_config_reports_every_tool_problem_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tools.toml");
    std::fs::write(&path, BAD_TOOLS).unwrap();
    let out = arbor_in(dir.path(), &["check-config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    for needle in [
        "tools.toml:5: mcp_servers.both.command: ",
        "has both command and url",
        "tools.toml:11: tools.grep.command: ",
        "{path}",
        "tools.toml:14: policy.allow_tools: pattern \"fs/[x]\"",
        "tools.toml:18: agents.lead.tools: \"nowhere/*\" names MCP server \"nowhere\", which is not declared under [mcp_servers]",
        "tools.toml:18: agents.lead.tools: unknown tool \"grepp\"",
    ] {
        assert!(err.contains(needle), "{needle:?} not in:\n{err}");
    }
}

#[test]
fn arbor_agents_shows_descriptions_and_tools() {
    let dir = scene(POLICY, &policy_script());
    let out = arbor_in(dir.path(), &["agents"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(shown.contains("output=last_message"), "{shown}");
    assert!(shown.contains("tools: echo, add_message"), "{shown}");
    let dir = scene(TOLD, &json!({"replies": []}));
    let shown = text(&arbor_in(dir.path(), &["agents"]).stdout);
    assert!(shown.contains("Researches one narrow question"), "{shown}");
}

#[test]
fn arbor_tools_lists_builtins_and_commands_with_their_agents_and_schemas() {
    let dir = scene(POLICY, &policy_script());
    let out = arbor_in(dir.path(), &["tools"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(table.contains("echo"), "{table}");
    assert!(table.contains("command"), "{table}");
    let out = arbor_in(dir.path(), &["tools", "--json"]);
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    let echo = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "echo")
        .unwrap();
    assert_eq!(echo["origin"], "command");
    assert_eq!(echo["agents"], json!(["lead", "worker"]));
    assert_eq!(echo["inputSchema"]["required"], json!(["word"]));
    let spawn = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "spawn_agents")
        .unwrap();
    assert_eq!(spawn["origin"], "builtin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_over_http_narrows_the_tool_policy_and_a_bad_pattern_is_a_422() {
    use crate::serve::{Server, TOKEN, get, post};
    let dir = scene(POLICY, &policy_script());
    let config = dir.path().join("config.toml").display().to_string();
    // A port of its own: tests run in parallel.
    let args = ["--config", &config, "--bind", "127.0.0.1:0"];
    let mut server = Server::start(dir.path(), &args, Some(TOKEN));
    server.wait_for("ready");

    let (status, body) = post(
        &server,
        "/v1/runs",
        json!({"agent": "lead", "prompt": "go", "tools": {"deny": ["fs read"]}}),
    )
    .await;
    assert_eq!(status.as_u16(), 422, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tools.deny: pattern \"fs read\""),
        "{body}"
    );

    let (status, body) = post(
        &server,
        "/v1/runs",
        json!({"agent": "lead", "prompt": "go", "tools": {"deny": ["echo"]}}),
    )
    .await;
    assert_eq!(status.as_u16(), 201, "{body}");
    let root = body["runId"].as_str().unwrap().to_owned();
    // Wait for the tree to end through its event stream, then read the worker.
    crate::serve::stream(&server, &root, None, |_| {}).await;
    let (_, tree) = get(
        &server,
        &format!("/v1/trees/{}", body["treeId"].as_str().unwrap()),
    )
    .await;
    let worker_run = tree
        .to_string()
        .split("\"runId\":\"")
        .filter_map(|s| s.split('"').next())
        .find(|id| id.ends_with("/0.1"))
        .expect("the worker's run")
        .to_owned();
    let (_, worker) = get(
        &server,
        &format!("/v1/runs/{}", crate::serve::encoded(&worker_run)),
    )
    .await;
    let history = worker["state"]["messageHistory"].to_string();
    assert!(
        history.contains("Tool echo (echo) is not allowed by this tree's tool policy"),
        "{history}"
    );
    assert!(
        !worker["state"]["toolDefinitions"]
            .as_object()
            .unwrap()
            .contains_key("echo")
    );
}

//! Shared helpers for the tree-level scenario tests: a scripted model, a
//! supervisor built from templates, event collection and result digging.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arbor_actors::message::{Message, TOOL_CALL_ERROR};
use arbor_actors::models::scripted::ScriptedModel;
use arbor_actors::{
    AgentState, AgentTemplate, Event, EventKind, Model, RunResult, Tool, ToolContext, ToolError,
    ToolOutput,
};
use arbor_supervisor::{Catalog, EventStream, StartRequest, Supervisor, TreeHandle, TreeLimits};
use async_trait::async_trait;
use serde_json::{Value, json};

/// The name every scripted model is registered under.
pub const MODEL: &str = "m";

/// A guard for anything awaited: virtual time under `start_paused`, so it only
/// fires when the tree is stuck.
pub const GUARD: Duration = Duration::from_secs(24 * 3600);

/// A scripted model from a `{"replies": [...]}` JSON value.
pub fn scripted(script: Value) -> Arc<ScriptedModel> {
    Arc::new(ScriptedModel::from_json(MODEL, &script.to_string(), "test").expect("valid script"))
}

pub fn template(id: &str) -> AgentTemplate {
    AgentTemplate::new(id, MODEL)
}

/// A supervisor over `templates`, the scripted `model`, extra models and tools.
pub fn supervisor_with(
    model: &Arc<ScriptedModel>,
    templates: Vec<AgentTemplate>,
    models: Vec<(&str, Arc<dyn Model>)>,
    tools: Vec<Arc<dyn Tool>>,
    limits: TreeLimits,
) -> Supervisor {
    let mut builder = Catalog::builder().model(model.clone() as Arc<dyn Model>);
    for (name, m) in models {
        builder = builder.model_as(name, m);
    }
    for tool in tools {
        builder = builder.tool(tool);
    }
    for t in templates {
        builder = builder.template(t);
    }
    Supervisor::new(builder.build().expect("valid catalog"), limits)
}

pub fn supervisor(
    model: &Arc<ScriptedModel>,
    templates: Vec<AgentTemplate>,
    limits: TreeLimits,
) -> Supervisor {
    supervisor_with(model, templates, Vec::new(), vec![echo()], limits)
}

pub fn request(agent: &str, prompt: &str) -> StartRequest {
    StartRequest {
        agent: agent.to_owned(),
        prompt: prompt.to_owned(),
        tree_id: Some("t".to_owned()),
        ..StartRequest::default()
    }
}

pub async fn start(sup: &Supervisor, agent: &str, prompt: &str) -> TreeHandle {
    sup.start(request(agent, prompt))
        .await
        .expect("tree starts")
}

/// Waits (guarded) for the root's result.
pub async fn finish(handle: TreeHandle) -> RunResult {
    tokio::time::timeout(GUARD, handle.wait())
        .await
        .expect("the tree ends")
        .expect("the root reports")
}

/// Starts a tree and waits for its result; returns it with every event published
/// until then (the root's final event is published before its result is sent).
pub async fn run(sup: &Supervisor, agent: &str, prompt: &str) -> (RunResult, Vec<Arc<Event>>) {
    let mut rx = sup.subscribe();
    let result = finish(start(sup, agent, prompt).await).await;
    (result, drain(&mut rx))
}

/// Every event already queued.
pub fn drain(rx: &mut EventStream) -> Vec<Arc<Event>> {
    let mut events = Vec::new();
    while let Ok(e) = rx.try_recv() {
        events.push(e);
    }
    events
}

/// Waits (guarded) for the first event matching `pred`, keeping the ones before it in `seen`.
pub async fn wait_for(
    rx: &mut EventStream,
    seen: &mut Vec<Arc<Event>>,
    pred: impl Fn(&Event) -> bool,
) -> Arc<Event> {
    tokio::time::timeout(GUARD, async {
        loop {
            let e = rx.recv().await.expect("event stream open");
            seen.push(e.clone());
            if pred(&e) {
                return e;
            }
        }
    })
    .await
    .expect("the awaited event arrives")
}

/// A `spawn_agents` call asking for `(agent_type, prompt)` children.
pub fn spawn_call(children: &[(&str, &str)]) -> Value {
    let agents: Vec<Value> = children
        .iter()
        .map(|(t, p)| json!({"agent_type": t, "prompt": p}))
        .collect();
    json!({"name": "spawn_agents", "input": {"agents": agents}})
}

/// The JSON value of the (first) tool result answering a call to `tool`.
pub fn tool_result(state: &AgentState, tool: &str) -> Value {
    tool_results(state, tool)
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no {tool} result in {:#?}", state.message_history))
}

/// The JSON values of every tool result answering a call to `tool`, in order.
pub fn tool_results(state: &AgentState, tool: &str) -> Vec<Value> {
    state
        .message_history
        .iter()
        .filter_map(|m| match &**m {
            Message::Tool {
                tool_name, content, ..
            } if tool_name == tool => {
                let v = serde_json::to_value(content).unwrap();
                Some(v[0]["value"].clone())
            }
            _ => None,
        })
        .collect()
}

/// Whether a message is an error result tagged `TOOL_CALL_ERROR`.
pub fn is_tool_error(m: &Message) -> bool {
    matches!(m, Message::Tool { .. }) && m.has_tag(TOOL_CALL_ERROR)
}

/// The text of the last assistant message of a `lastMessage` value.
pub fn last_text(value: &Value) -> String {
    assert_eq!(
        value["type"], "lastMessage",
        "not a lastMessage value: {value}"
    );
    let turn = value["value"].as_array().expect("a turn");
    let last = turn.last().expect("a message");
    match &last["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter(|p| p["type"] == "text")
            .filter_map(|p| p["text"].as_str())
            .collect(),
        other => panic!("unexpected content {other}"),
    }
}

/// Final states of every run, keyed by run id (from the final events).
pub fn final_states(events: &[Arc<Event>]) -> HashMap<String, Arc<AgentState>> {
    events
        .iter()
        .filter_map(|e| e.kind.final_state())
        .map(|s| (s.run_id.clone(), s.clone()))
        .collect()
}

/// Run ids of `ChildSpawned` events for `agent_type`, in order.
pub fn spawned(events: &[Arc<Event>], agent_type: &str) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ChildSpawned {
                child_run_id,
                agent_type: t,
                ..
            } if t == agent_type => Some(child_run_id.clone()),
            _ => None,
        })
        .collect()
}

/// The `errorMessage` of a spawn result entry, if it is one.
pub fn error_of(entry: &Value) -> Option<&str> {
    entry["value"]["errorMessage"].as_str()
}

/// A tool that answers with its input.
pub struct Echo;

#[async_trait]
impl Tool for Echo {
    fn name(&self) -> &str {
        "echo"
    }
    fn description(&self) -> &str {
        "Answers with its input."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object"})
    }
    async fn call(&self, input: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        Ok(json!({ "echo": input }).into())
    }
}

pub fn echo() -> Arc<dyn Tool> {
    Arc::new(Echo)
}

/// A template that may call `echo`.
pub fn with_echo(mut t: AgentTemplate) -> AgentTemplate {
    t.tools.push("echo".to_owned());
    t
}

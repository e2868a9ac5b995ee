//! Helpers of the tree-level scenario tests: what the shared ones
//! (`arbor-test-support`: scripted models, supervisors, tree runners, the echo
//! tool) do not have, digging results out of states and events.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;

use arbor_actors::message::{Message, TOOL_CALL_ERROR};
use arbor_actors::{AgentState, Event, EventKind};
pub use arbor_actors::{RunId, TreeId};
pub use arbor_test_support::*;
use serde_json::Value;

/// The JSON value of the (first) tool result answering a call to `tool`.
/// The run id of a test's text.
pub fn rid(text: &str) -> RunId {
    text.parse().expect("a run id")
}

/// The tree id of a test's text.
pub fn as_tree(text: &str) -> TreeId {
    text.parse().expect("a tree id")
}

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
pub fn final_states(events: &[Arc<Event>]) -> HashMap<RunId, Arc<AgentState>> {
    events
        .iter()
        .filter_map(|e| e.kind.final_state())
        .map(|s| (s.run_id.clone(), s.clone()))
        .collect()
}

/// Run ids of `ChildSpawned` events for `agent_type`, in order.
pub fn spawned(events: &[Arc<Event>], agent_type: &str) -> Vec<RunId> {
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

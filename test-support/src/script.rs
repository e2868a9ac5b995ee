//! Scripted models and the entries of their scripts.

use std::sync::Arc;

use arbor_actors::AgentTemplate;
use arbor_actors::models::scripted::ScriptedModel;
use serde_json::{Value, json};

/// The name [`scripted`] registers its model under.
pub const MODEL: &str = "m";

/// A scripted model named [`MODEL`] from a `{"replies": [...]}` JSON value.
pub fn scripted(script: Value) -> Arc<ScriptedModel> {
    scripted_as(MODEL, &script)
}

/// A scripted model named `name` from a `{"replies": [...]}` JSON value.
pub fn scripted_as(name: &str, script: &Value) -> Arc<ScriptedModel> {
    Arc::new(ScriptedModel::from_json(name, &script.to_string(), "test").expect("valid script"))
}

/// A template `id` on the model [`MODEL`].
pub fn template(id: &str) -> AgentTemplate {
    AgentTemplate::new(id, MODEL)
}

/// A script's tool call of `name` with `input`.
pub fn call(name: &str, input: Value) -> Value {
    json!({"name": name, "input": input})
}

/// A `spawn_agents` call asking for `(agent_type, prompt)` children.
pub fn spawn_call(children: &[(&str, &str)]) -> Value {
    let agents: Vec<Value> = children
        .iter()
        .map(|(t, p)| json!({"agent_type": t, "prompt": p}))
        .collect();
    call("spawn_agents", json!({"agents": agents}))
}

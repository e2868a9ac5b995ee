//! The tools one template's agents may call: the built-ins of semantics §5 plus
//! external tools, each with its compiled input schema. Built once per template.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, LazyLock};

use serde_json::{Value, json};

use crate::schema::Schema;
use crate::state::{ToolDefinition, ToolDefinitions};
use crate::template::AgentTemplate;
use crate::tool::Tool;

pub const ADD_MESSAGE: &str = "add_message";
pub const SET_MESSAGES: &str = "set_messages";
pub const SET_OUTPUT: &str = "set_output";
pub const END_TURN: &str = "end_turn";
pub const SPAWN_AGENTS: &str = "spawn_agents";
pub const SPAWN_AGENT_INLINE: &str = "spawn_agent_inline";

/// Built-in tools a template may list by name (the others are always there when they apply).
pub const OPTIONAL_BUILTINS: [&str; 2] = [ADD_MESSAGE, SET_MESSAGES];

#[derive(Clone)]
pub enum ToolKind {
    AddMessage,
    SetMessages,
    SetOutput,
    EndTurn,
    SpawnAgents,
    SpawnAgentInline,
    External(Arc<dyn Tool>),
}

impl fmt::Debug for ToolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToolKind::External(tool) => write!(f, "External({})", tool.name()),
            other => write!(f, "{}", other.builtin_name().unwrap_or("?")),
        }
    }
}

impl ToolKind {
    fn builtin_name(&self) -> Option<&'static str> {
        Some(match self {
            ToolKind::AddMessage => ADD_MESSAGE,
            ToolKind::SetMessages => SET_MESSAGES,
            ToolKind::SetOutput => SET_OUTPUT,
            ToolKind::EndTurn => END_TURN,
            ToolKind::SpawnAgents => SPAWN_AGENTS,
            ToolKind::SpawnAgentInline => SPAWN_AGENT_INLINE,
            ToolKind::External(_) => return None,
        })
    }
}

#[derive(Clone, Debug)]
pub struct ToolEntry {
    pub kind: ToolKind,
    pub schema: Schema,
}

#[derive(Clone, Debug)]
pub struct Toolbox {
    entries: HashMap<String, ToolEntry>,
    definitions: ToolDefinitions,
}

struct Builtin {
    description: &'static str,
    schema: Schema,
}

fn builtin(description: &'static str, schema: Value) -> Builtin {
    // The built-in schemas are constants checked by the tests below.
    let schema = Schema::compile(schema).unwrap_or_else(|e| panic!("built-in schema: {e}"));
    Builtin {
        description,
        schema,
    }
}

static BUILTINS: LazyLock<HashMap<&'static str, Builtin>> = LazyLock::new(|| {
    let child = json!({
        "type": "object",
        "properties": {
            "agent_type": {"type": "string", "minLength": 1},
            "prompt": {"type": "string"},
            "params": {"type": "object"}
        },
        "required": ["agent_type"]
    });
    HashMap::from([
        (
            ADD_MESSAGE,
            builtin(
                "Append a message to your conversation.",
                json!({"type": "object", "properties": {
                "role": {"enum": ["user", "assistant"]},
                "content": {"type": "string"}
            }, "required": ["role", "content"]}),
            ),
        ),
        (
            SET_MESSAGES,
            builtin(
                "Replace your whole conversation with these messages.",
                json!({"type": "object", "properties": {
                "messages": {"type": "array", "items": {"type": "object"}}
            }, "required": ["messages"]}),
            ),
        ),
        (
            SET_OUTPUT,
            builtin(
                "Set your output to this object (replaces any earlier output).",
                json!({"type": "object"}),
            ),
        ),
        (
            END_TURN,
            builtin("End your turn after this step.", json!({"type": "object"})),
        ),
        (
            SPAWN_AGENTS,
            builtin(
                "Run sub-agents in parallel; you get their results in request order.",
                json!({"type": "object", "properties": {
                "agents": {"type": "array", "minItems": 1, "items": child}
            }, "required": ["agents"]}),
            ),
        ),
        (
            SPAWN_AGENT_INLINE,
            builtin(
                "Hand your conversation to one sub-agent; its history becomes yours.",
                child,
            ),
        ),
    ])
});

impl Toolbox {
    /// The toolbox of `template`. `external` resolves tool names that are not built-ins.
    pub fn build(
        template: &AgentTemplate,
        external: impl Fn(&str) -> Option<Arc<dyn Tool>>,
    ) -> Result<Toolbox, String> {
        let mut entries = HashMap::new();
        let mut definitions = BTreeMap::new();
        let add_builtin = |entries: &mut HashMap<String, ToolEntry>,
                           definitions: &mut BTreeMap<String, ToolDefinition>,
                           name: &str,
                           kind: ToolKind| {
            let b = &BUILTINS[name];
            let mut schema = b.schema.source().clone();
            if matches!(kind, ToolKind::SpawnAgents | ToolKind::SpawnAgentInline) {
                describe_spawnable(&mut schema, &template.spawnable_agents);
            }
            definitions.insert(
                name.to_owned(),
                ToolDefinition {
                    description: b.description.to_owned(),
                    input_schema: schema,
                },
            );
            entries.insert(
                name.to_owned(),
                ToolEntry {
                    kind,
                    schema: b.schema.clone(),
                },
            );
        };
        add_builtin(
            &mut entries,
            &mut definitions,
            SET_OUTPUT,
            ToolKind::SetOutput,
        );
        add_builtin(&mut entries, &mut definitions, END_TURN, ToolKind::EndTurn);
        if !template.spawnable_agents.is_empty() {
            add_builtin(
                &mut entries,
                &mut definitions,
                SPAWN_AGENTS,
                ToolKind::SpawnAgents,
            );
            add_builtin(
                &mut entries,
                &mut definitions,
                SPAWN_AGENT_INLINE,
                ToolKind::SpawnAgentInline,
            );
        }
        for name in &template.tools {
            match name.as_str() {
                ADD_MESSAGE => add_builtin(
                    &mut entries,
                    &mut definitions,
                    ADD_MESSAGE,
                    ToolKind::AddMessage,
                ),
                SET_MESSAGES => add_builtin(
                    &mut entries,
                    &mut definitions,
                    SET_MESSAGES,
                    ToolKind::SetMessages,
                ),
                SET_OUTPUT | END_TURN | SPAWN_AGENTS | SPAWN_AGENT_INLINE => {}
                _ => {
                    let tool = external(name).ok_or_else(|| format!("unknown tool {name}"))?;
                    let source = tool.input_schema();
                    let schema = Schema::compile(source.clone())
                        .map_err(|e| format!("tool {name} has an invalid input schema: {e}"))?;
                    definitions.insert(
                        name.clone(),
                        ToolDefinition {
                            description: tool.description().to_owned(),
                            input_schema: source,
                        },
                    );
                    entries.insert(
                        name.clone(),
                        ToolEntry {
                            kind: ToolKind::External(tool),
                            schema,
                        },
                    );
                }
            }
        }
        Ok(Toolbox {
            entries,
            definitions: Arc::new(definitions),
        })
    }

    pub fn get(&self, name: &str) -> Option<&ToolEntry> {
        self.entries.get(name)
    }

    pub fn definitions(&self) -> &ToolDefinitions {
        &self.definitions
    }

    /// Tool names, sorted, for error messages.
    pub fn names(&self) -> Vec<&str> {
        self.definitions.keys().map(String::as_str).collect()
    }
}

/// Lists the spawnable types in the schema the model sees (as `examples`, so a
/// short id like `researcher` still validates against `acme/researcher@1`).
fn describe_spawnable(schema: &mut Value, spawnable: &[String]) {
    let agent_type = match schema.pointer_mut("/properties/agents/items/properties/agent_type") {
        Some(v) => Some(v),
        None => schema.pointer_mut("/properties/agent_type"),
    };
    if let Some(Value::Object(obj)) = agent_type {
        obj.insert("examples".into(), json!(spawnable));
        obj.insert(
            "description".into(),
            json!(format!("One of: {}", spawnable.join(", "))),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_compile_and_spawn_tools_list_the_spawnable_types() {
        let t = AgentTemplate::new("lead", "m").spawns(&["researcher", "acme/writer@1"]);
        let tb = Toolbox::build(&t, |_| None).unwrap();
        assert_eq!(
            tb.names(),
            vec![
                "end_turn",
                "set_output",
                "spawn_agent_inline",
                "spawn_agents"
            ]
        );
        let schema = &tb.definitions()["spawn_agents"].input_schema;
        assert_eq!(
            schema.pointer("/properties/agents/items/properties/agent_type/examples"),
            Some(&json!(["researcher", "acme/writer@1"]))
        );
    }

    #[test]
    fn an_unknown_external_tool_is_named() {
        let mut t = AgentTemplate::new("lead", "m");
        t.tools = vec!["add_message".into(), "grep".into()];
        assert_eq!(
            Toolbox::build(&t, |_| None).unwrap_err(),
            "unknown tool grep"
        );
    }
}

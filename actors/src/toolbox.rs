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

/// The built-in that appends a message to the history.
pub const ADD_MESSAGE: &str = "add_message";
/// The built-in that replaces the history.
pub const SET_MESSAGES: &str = "set_messages";
/// The built-in that sets the run's output.
pub const SET_OUTPUT: &str = "set_output";
/// The built-in that ends the turn.
pub const END_TURN: &str = "end_turn";
/// The built-in that spawns children, each in its own actor.
pub const SPAWN_AGENTS: &str = "spawn_agents";
/// The built-in that spawns one child on the parent's history.
pub const SPAWN_AGENT_INLINE: &str = "spawn_agent_inline";
/// The built-in that starts children in the background: its result comes
/// back at once, each child's report later, as a message (semantics §15).
pub const SPAWN_AGENTS_ASYNC: &str = "spawn_agents_async";

/// Built-in tools a template may list by name (the others are always there
/// when they apply). `spawn_agents_async` also needs `spawnable_agents`.
pub const OPTIONAL_BUILTINS: [&str; 3] = [ADD_MESSAGE, SET_MESSAGES, SPAWN_AGENTS_ASYNC];

/// Every built-in tool's name (no other tool may take one).
pub const BUILTIN_NAMES: [&str; 7] = [
    ADD_MESSAGE,
    SET_MESSAGES,
    SET_OUTPUT,
    END_TURN,
    SPAWN_AGENTS,
    SPAWN_AGENT_INLINE,
    SPAWN_AGENTS_ASYNC,
];

/// What a toolbox entry runs: a built-in (by name) or an external tool.
#[derive(Clone)]
pub(crate) enum ToolKind {
    /// [`ADD_MESSAGE`].
    AddMessage,
    /// [`SET_MESSAGES`].
    SetMessages,
    /// [`SET_OUTPUT`].
    SetOutput,
    /// [`END_TURN`].
    EndTurn,
    /// [`SPAWN_AGENTS`].
    SpawnAgents,
    /// [`SPAWN_AGENT_INLINE`].
    SpawnAgentInline,
    /// [`SPAWN_AGENTS_ASYNC`].
    SpawnAgentsAsync,
    /// An external tool.
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
    /// A built-in the template's output mode and spawnable agents govern
    /// (not its `tools` list, nor a policy).
    fn structural(&self) -> bool {
        matches!(
            self,
            ToolKind::SetOutput
                | ToolKind::EndTurn
                | ToolKind::SpawnAgents
                | ToolKind::SpawnAgentInline
                | ToolKind::SpawnAgentsAsync
        )
    }

    fn builtin_name(&self) -> Option<&'static str> {
        Some(match self {
            ToolKind::AddMessage => ADD_MESSAGE,
            ToolKind::SetMessages => SET_MESSAGES,
            ToolKind::SetOutput => SET_OUTPUT,
            ToolKind::EndTurn => END_TURN,
            ToolKind::SpawnAgents => SPAWN_AGENTS,
            ToolKind::SpawnAgentInline => SPAWN_AGENT_INLINE,
            ToolKind::SpawnAgentsAsync => SPAWN_AGENTS_ASYNC,
            ToolKind::External(_) => return None,
        })
    }
}

/// One tool of a toolbox.
#[derive(Clone, Debug)]
pub(crate) struct ToolEntry {
    /// What it runs.
    pub kind: ToolKind,
    /// Its input schema, checked before it runs.
    pub schema: Schema,
    /// The name templates and policies use (`fs/read_file`); the toolbox is
    /// keyed by the name the model sees (`fs__read_file`).
    pub name: String,
    /// Whether a call waits for a person's decision before it runs
    /// (semantics §12; external tools only).
    pub approval: bool,
}

/// The tools one template's agents may call, keyed by the name the model sees.
#[derive(Clone, Debug)]
pub struct Toolbox {
    entries: HashMap<String, ToolEntry>,
    definitions: ToolDefinitions,
    /// Model-facing names a tree's policy took out, for the error a forged call gets.
    denied: HashMap<String, String>,
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

fn child_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "agent_type": {"type": "string", "minLength": 1},
            "prompt": {"type": "string"},
            "params": {"type": "object"}
        },
        "required": ["agent_type"]
    })
}

/// One child of a spawn call. `spawn_agents` checks each entry against it on
/// its own, so one bad entry gets its own refusal and the others run; the
/// call as a whole only needs a non-empty list of objects.
pub(crate) static CHILD_SCHEMA: LazyLock<Schema> = LazyLock::new(|| {
    Schema::compile(child_schema()).unwrap_or_else(|e| panic!("built-in schema: {e}"))
});

/// What `spawn_agents` checks of the whole call (the model is shown the full
/// schema, with each entry's).
static SPAWN_AGENTS_CALL: LazyLock<Schema> = LazyLock::new(|| {
    Schema::compile(json!({"type": "object", "properties": {
        "agents": {"type": "array", "minItems": 1, "items": {"type": "object"}}
    }, "required": ["agents"]}))
    .unwrap_or_else(|e| panic!("built-in schema: {e}"))
});

static BUILTINS: LazyLock<HashMap<&'static str, Builtin>> = LazyLock::new(|| {
    let child = child_schema();
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
            SPAWN_AGENTS_ASYNC,
            builtin(
                "Start sub-agents in the background and go on at once: the result lists \
                 their run ids, and each one's report reaches you later as a message.",
                json!({"type": "object", "properties": {
                "agents": {"type": "array", "minItems": 1, "items": child.clone()}
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

use crate::names::short_hash;
pub use crate::names::{MAX_WIRE_NAME, wire_name};

/// What a spawn tool tells the model of one agent it may spawn.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SpawnableInfo {
    /// The `spawnableAgents` entry (what `agent_type` should say).
    pub agent_type: String,
    pub description: Option<String>,
    /// When to use it (the template's `spawner_prompt`).
    pub spawner_prompt: Option<String>,
    pub prompt_schema: Option<Value>,
    pub params_schema: Option<Value>,
}

impl SpawnableInfo {
    pub fn of(entry: &str, template: &AgentTemplate) -> Self {
        SpawnableInfo {
            agent_type: entry.to_owned(),
            description: template.description.clone(),
            spawner_prompt: template.spawner_prompt.clone(),
            prompt_schema: template
                .input_schema
                .prompt
                .as_ref()
                .map(|s| s.source().clone()),
            params_schema: template
                .input_schema
                .params
                .as_ref()
                .map(|s| s.source().clone()),
        }
    }
}

/// Why a template's toolbox cannot be made: what the error of a spawn of
/// its agents says, and why a catalog refuses the template.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolboxError {
    /// A `tools` entry names no tool (the entry as written).
    #[error("unknown tool {0}")]
    UnknownTool(String),
    /// A `tools` entry under the workspace tools' prefix names none of them.
    #[error("no workspace tool is named {0}")]
    NoWorkspaceTool(String),
    /// A `tools` entry a tool source owns is not `SERVER/TOOL`.
    #[error("{0} is not SERVER/TOOL")]
    NotServerTool(String),
    /// A tool source has no tools for a `tools` entry, for its own reason.
    #[error("{reason}")]
    Unresolved {
        /// The entry as written.
        entry: String,
        /// Why the source has none, as it says it.
        reason: String,
    },
    /// An external tool's input schema does not compile.
    #[error("tool {tool} has an invalid input schema: {problem}")]
    InvalidSchema {
        /// The tool's name.
        tool: String,
        /// What the schema compiler said.
        problem: String,
    },
    /// The template is not one of the catalog's, so it has no toolbox.
    #[error("agent type {0} is not in the catalog")]
    UnknownAgent(String),
}

/// The tools one `tools` entry of a template names (`rg`, `fs/*`,
/// `fs/read_file`); `Err` says why it names none.
pub type Resolve<'a> = &'a dyn Fn(&str) -> Result<Vec<Arc<dyn Tool>>, ToolboxError>;

/// Where a toolbox finds what is not built in.
pub struct ToolSources<'a> {
    /// The external tools a template's `tools` entry names.
    pub resolve: Resolve<'a>,
    /// The template a `spawnableAgents` entry names, for the spawn tools' descriptions.
    pub spawnable: &'a dyn Fn(&str) -> Option<Arc<AgentTemplate>>,
}

impl Toolbox {
    /// The toolbox of `template`. `external` resolves tool names that are not built-ins.
    pub fn build(
        template: &AgentTemplate,
        external: impl Fn(&str) -> Option<Arc<dyn Tool>>,
    ) -> Result<Toolbox, ToolboxError> {
        let resolve = |name: &str| {
            external(name)
                .map(|t| vec![t])
                .ok_or_else(|| ToolboxError::UnknownTool(name.to_owned()))
        };
        Self::build_with(
            template,
            &ToolSources {
                resolve: &resolve,
                spawnable: &|_| None,
            },
        )
    }

    /// The toolbox of `template`, its external tools and spawnable agents found through `sources`.
    pub fn build_with(
        template: &AgentTemplate,
        sources: &ToolSources<'_>,
    ) -> Result<Toolbox, ToolboxError> {
        let mut tb = Toolbox {
            entries: HashMap::new(),
            definitions: Arc::new(BTreeMap::new()),
            denied: HashMap::new(),
        };
        let mut definitions = BTreeMap::new();
        let mut set_output = builtin_definition(SET_OUTPUT);
        if let Some(schema) = &template.output_schema {
            // The model sees the schema its output must match (set_output checks it).
            set_output.input_schema = schema.source().clone();
            set_output.description =
                "Set your output to this object (replaces any earlier output). It must match the schema of the parameters.".into();
        }
        // A native structured output is the reply's text: no set_output.
        if !template.native_output() {
            tb.add_builtin(
                &mut definitions,
                SET_OUTPUT,
                ToolKind::SetOutput,
                set_output,
            );
        }
        tb.add_builtin(
            &mut definitions,
            END_TURN,
            ToolKind::EndTurn,
            builtin_definition(END_TURN),
        );
        if !template.spawnable_agents.is_empty() {
            let agents: Vec<SpawnableInfo> = template
                .spawnable_agents
                .iter()
                .map(|entry| match (sources.spawnable)(entry) {
                    Some(t) => SpawnableInfo::of(entry, &t),
                    None => SpawnableInfo {
                        agent_type: entry.clone(),
                        description: None,
                        spawner_prompt: None,
                        prompt_schema: None,
                        params_schema: None,
                    },
                })
                .collect();
            let background = template.tools.iter().any(|t| t == SPAWN_AGENTS_ASYNC);
            let kinds = [
                (SPAWN_AGENTS, ToolKind::SpawnAgents),
                (SPAWN_AGENT_INLINE, ToolKind::SpawnAgentInline),
            ]
            .into_iter()
            .chain(background.then_some((SPAWN_AGENTS_ASYNC, ToolKind::SpawnAgentsAsync)));
            for (name, kind) in kinds {
                let mut def = builtin_definition(name);
                describe_spawnable(&mut def, &agents);
                tb.add_builtin(&mut definitions, name, kind, def);
            }
        }
        let mut external: Vec<Arc<dyn Tool>> = Vec::new();
        for name in &template.tools {
            match name.as_str() {
                ADD_MESSAGE => tb.add_builtin(
                    &mut definitions,
                    ADD_MESSAGE,
                    ToolKind::AddMessage,
                    builtin_definition(ADD_MESSAGE),
                ),
                SET_MESSAGES => tb.add_builtin(
                    &mut definitions,
                    SET_MESSAGES,
                    ToolKind::SetMessages,
                    builtin_definition(SET_MESSAGES),
                ),
                SET_OUTPUT | END_TURN | SPAWN_AGENTS | SPAWN_AGENT_INLINE | SPAWN_AGENTS_ASYNC => {}
                _ => external.extend((sources.resolve)(name)?),
            }
        }
        // In name order, so a clash of model-facing names resolves the same way every time.
        external.sort_by(|a, b| a.name().cmp(b.name()));
        external.dedup_by(|a, b| a.name() == b.name());
        for tool in external {
            let name = tool.name().to_owned();
            let source = tool.input_schema();
            let schema =
                Schema::compile(source.clone()).map_err(|e| ToolboxError::InvalidSchema {
                    tool: name.clone(),
                    problem: e.to_string(),
                })?;
            let mut wire = wire_name(&name);
            if tb.entries.contains_key(&wire) {
                wire.truncate(MAX_WIRE_NAME - 9);
                wire.push('_');
                wire.push_str(&short_hash(&name));
            }
            definitions.insert(
                wire.clone(),
                ToolDefinition {
                    description: tool.description().to_owned(),
                    input_schema: source,
                },
            );
            tb.entries.insert(
                wire,
                ToolEntry {
                    kind: ToolKind::External(tool),
                    schema,
                    name,
                    approval: false,
                },
            );
        }
        tb.definitions = Arc::new(definitions);
        Ok(tb)
    }

    fn add_builtin(
        &mut self,
        definitions: &mut BTreeMap<String, ToolDefinition>,
        name: &str,
        kind: ToolKind,
        definition: ToolDefinition,
    ) {
        definitions.insert(name.to_owned(), definition);
        let schema = match kind {
            ToolKind::SpawnAgents | ToolKind::SpawnAgentsAsync => SPAWN_AGENTS_CALL.clone(),
            _ => BUILTINS[name].schema.clone(),
        };
        self.entries.insert(
            name.to_owned(),
            ToolEntry {
                kind,
                schema,
                name: name.to_owned(),
                approval: false,
            },
        );
    }

    /// This toolbox with the external tools `needs` names (by the name
    /// templates and policies use) waiting for a person's decision before
    /// each call runs (semantics §12). The built-ins never wait.
    pub fn with_approval(&self, needs: impl Fn(&[&str]) -> bool) -> Toolbox {
        let mut tb = self.clone();
        for entry in tb.entries.values_mut() {
            if let ToolKind::External(tool) = &entry.kind {
                let aliases = tool.aliases();
                if needs(&names_of(&entry.name, &aliases)) {
                    entry.approval = true;
                }
            }
        }
        tb
    }

    /// This toolbox without the tools `allowed` refuses (by the name templates
    /// and policies use). The structural built-ins (`set_output`, `end_turn`,
    /// the spawn tools) stay: the template's output mode and spawnable agents
    /// govern those. A refused tool is neither offered nor callable.
    pub fn restricted(&self, allowed: impl Fn(&[&str]) -> bool) -> Toolbox {
        let mut entries = HashMap::new();
        let mut definitions = BTreeMap::new();
        let mut denied = self.denied.clone();
        for (wire, entry) in &self.entries {
            let aliases = match &entry.kind {
                ToolKind::External(tool) => tool.aliases(),
                _ => Vec::new(),
            };
            if entry.kind.structural() || allowed(&names_of(&entry.name, &aliases)) {
                entries.insert(wire.clone(), entry.clone());
                if let Some(def) = self.definitions.get(wire) {
                    definitions.insert(wire.clone(), def.clone());
                }
            } else {
                denied.insert(wire.clone(), entry.name.clone());
            }
        }
        Toolbox {
            entries,
            definitions: Arc::new(definitions),
            denied,
        }
    }

    /// The toolbox a child that inherits this (its parent's) toolbox runs
    /// with (`inheritParentSystemPrompt`): the parent's tools, with the
    /// structural built-ins (`set_output`, `end_turn`, the spawn tools) of
    /// the child's `own` toolbox instead of the parent's. A spawn tool of the
    /// parent names the agents the parent may spawn and would refuse every
    /// call of the child; the child is offered only what it can use.
    pub fn inherited_by(self: &Arc<Self>, own: &Toolbox) -> Arc<Toolbox> {
        // The usual case shares the parent's toolbox as it is (no copy per child).
        let same = |name: &str| {
            self.entries.contains_key(name) == own.entries.contains_key(name)
                && self.definitions.get(name) == own.definitions.get(name)
        };
        if [SPAWN_AGENTS, SPAWN_AGENT_INLINE, SPAWN_AGENTS_ASYNC]
            .iter()
            .all(|n| !self.entries.contains_key(*n) && !own.entries.contains_key(*n))
            && [SET_OUTPUT, END_TURN].iter().all(|n| same(n))
        {
            return self.clone();
        }
        let mut entries = HashMap::new();
        let mut definitions = BTreeMap::new();
        let (inherited, structural) = (
            self.entries.iter().filter(|(_, e)| !e.kind.structural()),
            own.entries.iter().filter(|(_, e)| e.kind.structural()),
        );
        let from_parent = inherited.map(|(wire, e)| (wire, e, &self.definitions));
        let from_own = structural.map(|(wire, e)| (wire, e, &own.definitions));
        for (wire, entry, defs) in from_parent.chain(from_own) {
            entries.insert(wire.clone(), entry.clone());
            if let Some(def) = defs.get(wire) {
                definitions.insert(wire.clone(), def.clone());
            }
        }
        let mut denied = self.denied.clone();
        denied.extend(own.denied.iter().map(|(k, v)| (k.clone(), v.clone())));
        denied.retain(|wire, _| !entries.contains_key(wire));
        Arc::new(Toolbox {
            entries,
            definitions: Arc::new(definitions),
            denied,
        })
    }

    /// The tool the model calls `name` (its wire name).
    pub(crate) fn get(&self, name: &str) -> Option<&ToolEntry> {
        self.entries.get(name)
    }

    /// The name templates and policies use for a tool a policy took out of
    /// this toolbox, by the name the model sees.
    pub(crate) fn denied(&self, wire: &str) -> Option<&str> {
        self.denied.get(wire).map(String::as_str)
    }

    /// The tools as the model is offered them, by wire name.
    pub fn definitions(&self) -> &ToolDefinitions {
        &self.definitions
    }

    /// Tool names, sorted, for error messages.
    pub(crate) fn names(&self) -> Vec<&str> {
        self.definitions.keys().map(String::as_str).collect()
    }

    /// Every tool with the name templates use and the name the model sees.
    #[cfg(test)]
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&str, &ToolEntry)> {
        self.entries.iter().map(|(wire, e)| (wire.as_str(), e))
    }
}

/// Every built-in tool with its plain definition (before a template's
/// spawnable agents or output schema are written into it), by name.
pub fn builtin_definitions() -> Vec<(&'static str, ToolDefinition)> {
    let mut out: Vec<_> = BUILTINS
        .keys()
        .map(|name| (*name, builtin_definition(name)))
        .collect();
    out.sort_by_key(|(name, _)| *name);
    out
}

fn builtin_definition(name: &str) -> ToolDefinition {
    let b = &BUILTINS[name];
    ToolDefinition {
        description: b.description.to_owned(),
        input_schema: b.schema.source().clone(),
    }
}

/// Tells the model which agents it may spawn: each one's type, what it is for,
/// when to use it and its input schemas, in the tool's description; the types
/// in the schema too (as `examples`, so a short id like `researcher` still
/// validates against `acme/researcher@1`).
fn describe_spawnable(def: &mut ToolDefinition, agents: &[SpawnableInfo]) {
    let mut text = String::from("\n\nAgents you can spawn:");
    for a in agents {
        text.push_str(&format!("\n- {}", a.agent_type));
        if let Some(d) = &a.description {
            text.push_str(&format!(": {d}"));
        }
        if let Some(p) = &a.spawner_prompt {
            text.push_str(&format!(" When to use: {p}"));
        }
        if let Some(s) = &a.prompt_schema {
            text.push_str(&format!("\n  prompt must match: {s}"));
        }
        if let Some(s) = &a.params_schema {
            text.push_str(&format!("\n  params must match: {s}"));
        }
    }
    def.description.push_str(&text);
    let schema = &mut def.input_schema;
    let agent_type = match schema.pointer_mut("/properties/agents/items/properties/agent_type") {
        Some(v) => Some(v),
        None => schema.pointer_mut("/properties/agent_type"),
    };
    if let Some(Value::Object(obj)) = agent_type {
        let types: Vec<&str> = agents.iter().map(|a| a.agent_type.as_str()).collect();
        obj.insert("examples".into(), json!(types));
        let listed: Vec<String> = agents
            .iter()
            .map(|a| match &a.description {
                Some(d) => format!("{} ({d})", a.agent_type),
                None => a.agent_type.clone(),
            })
            .collect();
        obj.insert(
            "description".into(),
            json!(format!("One of: {}", listed.join(", "))),
        );
    }
}

/// A tool's name, then the other names policies may use for it.
fn names_of<'a>(name: &'a str, aliases: &'a [String]) -> Vec<&'a str> {
    std::iter::once(name)
        .chain(aliases.iter().map(String::as_str))
        .collect()
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

    fn valid_on_the_wire(name: &str) -> bool {
        !name.is_empty()
            && name.len() <= MAX_WIRE_NAME
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    }

    #[test]
    fn wire_names_fit_every_provider_and_keep_the_namespace() {
        assert_eq!(wire_name("fs/read_file"), "fs__read_file");
        assert_eq!(wire_name("web/get-sum"), "web__get-sum");
        assert_eq!(wire_name("rg"), "rg");
        assert_eq!(wire_name("docs/search.v2 (beta)"), "docs__search_v2__beta_");
        let long = format!("server/{}", "x".repeat(100));
        let wire = wire_name(&long);
        assert!(valid_on_the_wire(&wire), "{wire}");
        // Two long names that share their start stay apart.
        let other = format!("server/{}y", "x".repeat(100));
        assert_ne!(wire_name(&other), wire);
        for name in ["ä/ö", "", "a/b/c", "//"] {
            assert!(valid_on_the_wire(&wire_name(name)), "{name:?}");
        }
    }

    struct Named(&'static str);

    #[async_trait::async_trait]
    impl Tool for Named {
        fn name(&self) -> &str {
            self.0
        }
        fn description(&self) -> &str {
            "a tool"
        }
        fn input_schema(&self) -> Value {
            json!({"type": "object"})
        }
        async fn call(
            &self,
            input: Value,
            _ctx: crate::tool::ToolContext,
        ) -> Result<crate::tool::ToolOutput, crate::tool::ToolError> {
            Ok(input.into())
        }
    }

    #[test]
    fn tools_whose_wire_names_clash_stay_apart_and_map_back_exactly() {
        let mut t = AgentTemplate::new("lead", "m");
        t.tools = vec!["a.b/x".into(), "a_b/x".into()];
        let tb = Toolbox::build(&t, |name| {
            Some(Arc::new(Named(if name == "a.b/x" { "a.b/x" } else { "a_b/x" })) as Arc<dyn Tool>)
        })
        .unwrap();
        let mut back: Vec<(String, String)> = tb
            .entries()
            .filter(|(_, e)| matches!(e.kind, ToolKind::External(_)))
            .map(|(wire, e)| (wire.to_owned(), e.name.clone()))
            .collect();
        back.sort();
        assert_eq!(back.len(), 2, "{back:?}");
        assert_eq!(back[0].0, "a_b__x");
        assert!(
            back.iter().all(|(wire, _)| valid_on_the_wire(wire)),
            "{back:?}"
        );
        let names: Vec<&str> = back.iter().map(|(_, n)| n.as_str()).collect();
        assert!(names.contains(&"a.b/x") && names.contains(&"a_b/x"));
    }

    #[test]
    fn a_policy_takes_tools_out_but_keeps_the_structural_builtins() {
        let mut t = AgentTemplate::new("lead", "m").spawns(&["w"]);
        t.tools = vec!["add_message".into(), "fs/read".into()];
        let tb = Toolbox::build(&t, |_| Some(Arc::new(Named("fs/read")) as Arc<dyn Tool>)).unwrap();
        let cut = tb.restricted(|names| names.contains(&"nothing"));
        assert_eq!(
            cut.names(),
            vec![
                "end_turn",
                "set_output",
                "spawn_agent_inline",
                "spawn_agents"
            ]
        );
        assert_eq!(cut.denied("fs__read"), Some("fs/read"));
        assert_eq!(cut.denied("add_message"), Some("add_message"));
        assert!(cut.get("fs__read").is_none());
    }

    #[test]
    fn a_child_that_inherits_its_parents_toolbox_is_offered_only_the_spawn_tools_it_can_use() {
        let mut lead = AgentTemplate::new("lead", "m").spawns(&["w"]);
        lead.tools = vec!["fs/read".into()];
        let parent = Arc::new(
            Toolbox::build(&lead, |_| Some(Arc::new(Named("fs/read")) as Arc<dyn Tool>)).unwrap(),
        );
        let heir = AgentTemplate::new("heir", "m");
        let own = Toolbox::build(&heir, |_| None).unwrap();
        let child = parent.inherited_by(&own);
        assert_eq!(child.names(), vec!["end_turn", "fs__read", "set_output"]);
        assert!(child.get("spawn_agents").is_none());
        // A child with agents of its own to spawn is offered its own spawn tools.
        let spawner = AgentTemplate::new("heir", "m").spawns(&["v"]);
        let own = Toolbox::build(&spawner, |_| None).unwrap();
        let child = parent.inherited_by(&own);
        let described = &child.definitions()["spawn_agents"].description;
        assert!(
            described.contains("- v") && !described.contains("- w"),
            "{described}"
        );
    }

    #[test]
    fn an_unknown_external_tool_is_named() {
        let mut t = AgentTemplate::new("lead", "m");
        t.tools = vec!["add_message".into(), "grep".into()];
        assert_eq!(
            Toolbox::build(&t, |_| None).unwrap_err().to_string(),
            "unknown tool grep"
        );
    }
}

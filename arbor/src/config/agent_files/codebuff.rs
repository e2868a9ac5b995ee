//! Codebuff's agent definitions (`.agents/NAME.ts`, `.js`, `.json`): a
//! module whose default export is an `AgentDefinition`, evaluated by
//! `arbor-programs` (types stripped with oxc, run in QuickJS, relative
//! imports resolved inside the agents directory). A module whose default
//! export is not an object with an `id` (helpers, `types/`) is not an
//! agent and is left out, as Codebuff's loader leaves it out. Every
//! `AgentDefinition` field is mapped here, or refused by name at its line.
//!
//! | field | becomes |
//! |---|---|
//! | `id` | the agent's name (required) |
//! | `displayName` | `name` (what `spawn_agents` reports as `agentName`) |
//! | `model` | an OpenRouter-style id (`anthropic/claude-sonnet-4.5`): a `[model_aliases]` key, a `[models]` entry of that name, or the `model` of one `openai`/`anthropic` entry (an OpenRouter entry, say); required, as Codebuff requires it |
//! | `reasoningOptions` | `model_options.reasoning`: `effort` (`minimal`, `low`, `medium`, `high`; `none` or `enabled: false`: no reasoning options), `max_tokens` as `budget_tokens`; `exclude: true` refused (Arbor keeps the reasoning parts) |
//! | `providerOptions` | `model_options.extra_body.provider` (OpenRouter's provider routing, sent as OpenRouter reads it) |
//! | `toolNames` | `tools` in Codebuff's names (`tool_names = "codebuff"`): `read_files`, `write_file`, `str_replace`, `find_files`, `code_search`, `run_terminal_command`, `write_todos`, `think_deeply`; the built-ins `set_output`, `end_turn`, `spawn_agents`, `spawn_agent_inline`, `add_message`, `set_messages` (each offered by its own rule, §5); `SERVER/TOOL` of an MCP server; Codebuff tools Arbor has no counterpart of refused by name |
//! | `mcpServers` | a server of each name (`.mcp.json`'s shape); all its tools, unless `toolNames` lists some of them (`SERVER/TOOL`), as Codebuff does |
//! | `spawnableAgents` | `spawnable_agents`; `publisher/id@version` names the local definition `id` (Arbor has no agent store) |
//! | `inputSchema` | `input_schema` (`prompt`, `params`) |
//! | `outputMode`, `outputSchema` | `output_mode`, `output_schema` |
//! | `includeMessageHistory`, `inheritParentSystemPrompt` | the same keys |
//! | `spawnerPrompt` | `spawner_prompt` |
//! | `systemPrompt`, `instructionsPrompt`, `stepPrompt` | the same prompts, placeholders expanded (below) |
//! | `handleSteps` | the agent's program (a generator function, or its source as a string) |
//! | `version`, `publisher` | read, used for nothing (a reference to it is resolved by `id`) |
//!
//! **Placeholders.** Codebuff replaces `{CODEBUFF_NAME}` placeholders in the
//! three prompts. Arbor expands, when the config is read: `AGENT_NAME` (the
//! display name), `TOOLS_PROMPT` (the agent's tools, a line each),
//! `AGENTS_PROMPT` (the agents it may spawn, with their spawner prompts)
//! and `REMAINING_STEPS` (its step budget, what it has when it starts).
//! Those that describe the project and the run (`PROJECT_ROOT`, `USER_CWD`,
//! `CURRENT_DATE`, `SYSTEM_INFO_PROMPT`, `FILE_TREE_PROMPT` and its `_SMALL`
//! and `_LARGE`, `GIT_CHANGES_PROMPT`, `KNOWLEDGE_FILES_CONTENTS`,
//! `USER_INPUT_PROMPT`, `INITIAL_AGENT_PROMPT`) are left for each tree to
//! fill when it starts, from its workspace (`scene`). Codebuff's own client
//! settings (`CONFIG_SCHEMA`, `FRONTEND_SECTION`) have no meaning here and
//! are replaced with nothing, as Codebuff does with a placeholder it has no
//! value for, with a warning naming them. An unknown `{CODEBUFF_…}` stays as
//! written, as in Codebuff.
//! Codebuff's older runtimes appended the tools and agents prompts to every
//! system prompt; Arbor does not (the model is offered its tools, and the
//! spawn tools' descriptions list the agents, §5).

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::{Mapped, ModelChoice, Spawn};
use crate::config::Problem;

/// Every field of Codebuff's `AgentDefinition`.
const FIELDS: [&str; 21] = [
    "id",
    "version",
    "publisher",
    "displayName",
    "model",
    "reasoningOptions",
    "providerOptions",
    "mcpServers",
    "toolNames",
    "spawnableAgents",
    "inputSchema",
    "outputMode",
    "outputSchema",
    "spawnerPrompt",
    "includeMessageHistory",
    "inheritParentSystemPrompt",
    "systemPrompt",
    "instructionsPrompt",
    "stepPrompt",
    "handleSteps",
    "$schema",
];

/// Codebuff's tools that Arbor has no counterpart of: refused by name
/// (unless a `[tools]` entry of the same name exists).
const NOT_IN_ARBOR: [&str; 17] = [
    "web_search",
    "read_docs",
    "browser_logs",
    "create_plan",
    "add_subgoal",
    "update_subgoal",
    "run_file_change_hooks",
    "read_image",
    "lookup_agent_info",
    "ask_user",
    "suggest_followups",
    "glob",
    "list_directory",
    "read_subtree",
    "task_completed",
    "skill",
    "spawn_agent_async",
];

/// The placeholders Codebuff documents that Arbor fills when the config is
/// read.
pub(super) const EXPANDED: [&str; 4] = [
    "AGENT_NAME",
    "TOOLS_PROMPT",
    "AGENTS_PROMPT",
    "REMAINING_STEPS",
];

/// The placeholders Codebuff documents that describe its own client's
/// settings (its `codebuff.json` schema, its web front end): replaced with
/// nothing, with a warning. (Those that describe the project and the run
/// are filled per tree: `scene`.)
const EMPTIED: [&str; 2] = ["CONFIG_SCHEMA", "FRONTEND_SECTION"];

/// What the mapping needs of the rest of the config.
pub(super) struct Context<'a> {
    /// `[tools]` entries by name.
    pub command_tools: &'a [String],
}

struct Out<'a> {
    file: &'a str,
    problems: Vec<Problem>,
}

impl Out<'_> {
    fn at(&mut self, line: usize, key: &str, message: impl Into<String>) {
        self.problems.push(Problem {
            file: Some(self.file.to_owned()),
            line: Some(line),
            key: key.to_owned(),
            message: message.into(),
        });
    }
}

/// `publisher/id@version` (each part but `id` optional) as `id`.
pub(super) fn local_id(reference: &str) -> &str {
    let id = reference.rsplit_once('/').map_or(reference, |(_, id)| id);
    id.split_once('@').map_or(id, |(id, _)| id)
}

/// Maps one loaded `AgentDefinition` (`definition`, the default export as
/// JSON; `lines`, the line of each top-level field) of `file` into an
/// `[agents.NAME]` section.
pub(super) fn map(
    file: &str,
    definition: &Value,
    lines: &[(String, usize)],
    ctx: &Context<'_>,
) -> Result<Mapped, Vec<Problem>> {
    let mut out = Out {
        file,
        problems: Vec::new(),
    };
    let line_of = |key: &str| {
        lines
            .iter()
            .find(|(k, _)| k == key)
            .map_or(1, |(_, line)| *line)
    };
    let Some(fields) = definition.as_object() else {
        out.at(
            1,
            "(default export)",
            "is not an object (an AgentDefinition)",
        );
        return Err(out.problems);
    };
    let text = |out: &mut Out<'_>, key: &str| -> Option<(String, usize)> {
        let value = fields.get(key)?;
        match value.as_str() {
            Some(s) => Some((s.to_owned(), line_of(key))),
            None => {
                out.at(line_of(key), key, format!("must be a string, not {value}"));
                None
            }
        }
    };
    let flag = |out: &mut Out<'_>, key: &str| -> Option<(bool, usize)> {
        let value = fields.get(key)?;
        match value.as_bool() {
            Some(b) => Some((b, line_of(key))),
            None => {
                out.at(
                    line_of(key),
                    key,
                    format!("must be true or false, not {value}"),
                );
                None
            }
        }
    };
    let (id, id_line) = match text(&mut out, "id") {
        Some((id, line)) if !id.trim().is_empty() => (id, line),
        Some((_, line)) => {
            out.at(line, "id", "must not be empty (id: 'code-reviewer')");
            return Err(out.problems);
        }
        None => {
            if !fields.contains_key("id") {
                out.at(
                    1,
                    "id",
                    "missing: an AgentDefinition names its agent (id: 'code-reviewer')",
                );
            }
            return Err(out.problems);
        }
    };
    let mut lines: BTreeMap<&'static str, (&'static str, usize)> = BTreeMap::new();
    let mut section = Map::new();
    section.insert("tool_names".into(), json!("codebuff"));
    if let Some((name, line)) = text(&mut out, "displayName") {
        section.insert("name".into(), json!(name));
        lines.insert("name", ("displayName", line));
    }
    let model = match text(&mut out, "model") {
        Some((m, line)) => ModelChoice::Named(m.trim().to_owned(), line),
        None => {
            if !fields.contains_key("model") {
                out.at(
                    id_line,
                    "model",
                    "missing: an AgentDefinition names its model (model: 'anthropic/claude-sonnet-4.5'), \
                     which [model_aliases] maps to a [models] entry",
                );
            }
            ModelChoice::Inherit(id_line)
        }
    };
    lines.insert("model", ("model", model.line()));
    for (key, field) in [
        ("spawner_prompt", "spawnerPrompt"),
        ("system_prompt", "systemPrompt"),
        ("instructions_prompt", "instructionsPrompt"),
        ("step_prompt", "stepPrompt"),
    ] {
        if let Some((prompt, line)) = text(&mut out, field) {
            section.insert(key.into(), json!(prompt));
            lines.insert(key, (field, line));
        }
    }
    for (key, field) in [
        ("include_message_history", "includeMessageHistory"),
        ("inherit_parent_system_prompt", "inheritParentSystemPrompt"),
    ] {
        if let Some((value, line)) = flag(&mut out, field) {
            section.insert(key.into(), json!(value));
            lines.insert(key, (field, line));
        }
    }
    if let Some((mode, line)) = text(&mut out, "outputMode") {
        section.insert("output_mode".into(), json!(mode));
        lines.insert("output_mode", ("outputMode", line));
    }
    for (key, field) in [
        ("output_schema", "outputSchema"),
        ("input_schema", "inputSchema"),
    ] {
        if let Some(value) = fields.get(field) {
            section.insert(key.into(), value.clone());
            lines.insert(key, (field, line_of(field)));
        }
    }

    // Tools, in Codebuff's names.
    let tools_line = line_of("toolNames");
    let mut tools: Vec<String> = Vec::new();
    match fields.get("toolNames") {
        None => {}
        Some(Value::Array(items)) => {
            for item in items {
                let Some(name) = item.as_str() else {
                    out.at(
                        tools_line,
                        "toolNames",
                        format!("each entry is a tool's name, not {item}"),
                    );
                    continue;
                };
                if NOT_IN_ARBOR.contains(&name) && !ctx.command_tools.iter().any(|t| t == name) {
                    out.at(
                        tools_line,
                        "toolNames",
                        format!(
                            "{name:?} is a Codebuff tool Arbor has no counterpart of (it has {}, and \
                             the built-ins {}): remove it, or configure a [tools.{name}] command tool",
                            arbor_tools::workspace::names(arbor_tools::workspace::Family::Codebuff)
                                .join(", "),
                            arbor_actors::toolbox::BUILTIN_NAMES.join(", ")
                        ),
                    );
                    continue;
                }
                if !tools.iter().any(|t| t == name) {
                    tools.push(name.to_owned());
                }
            }
        }
        Some(other) => out.at(
            tools_line,
            "toolNames",
            format!("must be a list of tool names, not {other}"),
        ),
    }
    lines.insert("tools", ("toolNames", tools_line));

    // MCP servers: each its own, with all its tools unless some are listed.
    let mut servers = Vec::new();
    let mut secrets = Vec::new();
    if let Some(value) = fields.get("mcpServers") {
        let line = line_of("mcpServers");
        match value.as_object() {
            Some(map) => {
                for (name, definition) in map {
                    if name.contains('/') {
                        out.at(
                            line,
                            "mcpServers",
                            format!("{name:?}: a server's name cannot contain `/`"),
                        );
                        continue;
                    }
                    secrets.extend(
                        crate::config::redact::server_secrets(definition)
                            .into_iter()
                            .map(|s| (s.value, s.stored)),
                    );
                    servers.push((name.clone(), line, definition.clone()));
                    let prefix = format!("{name}/");
                    if !tools.iter().any(|t| t.starts_with(&prefix)) {
                        tools.push(format!("{name}/*"));
                    }
                }
            }
            None => out.at(
                line,
                "mcpServers",
                format!("must be an object of servers by name, not {value}"),
            ),
        }
    }
    section.insert("tools".into(), json!(tools));

    // Whom it spawns: local definitions, by id.
    let mut spawn = Vec::new();
    let spawn_line = line_of("spawnableAgents");
    match fields.get("spawnableAgents") {
        None => {}
        Some(Value::Array(items)) => {
            for item in items {
                match item.as_str() {
                    Some(reference) if !local_id(reference).is_empty() => {
                        let id = local_id(reference).to_owned();
                        if !spawn.iter().any(|(a, _)| *a == id) {
                            spawn.push((id, spawn_line));
                        }
                    }
                    _ => out.at(
                        spawn_line,
                        "spawnableAgents",
                        format!("each entry is an agent's id, not {item}"),
                    ),
                }
            }
        }
        Some(other) => out.at(
            spawn_line,
            "spawnableAgents",
            format!("must be a list of agent ids, not {other}"),
        ),
    }
    lines.insert("spawnable_agents", ("spawnableAgents", spawn_line));

    // Model options: reasoning and OpenRouter's provider routing.
    let mut options = Map::new();
    if let Some(value) = fields.get("reasoningOptions") {
        let line = line_of("reasoningOptions");
        lines.insert("model_options", ("reasoningOptions", line));
        match reasoning(value) {
            Ok(Some(r)) => {
                options.insert("reasoning".into(), r);
            }
            Ok(None) => {}
            Err(why) => out.at(line, "reasoningOptions", why.to_string()),
        }
    }
    if let Some(value) = fields.get("providerOptions") {
        let line = line_of("providerOptions");
        lines
            .entry("model_options")
            .or_insert(("providerOptions", line));
        if value.is_object() {
            options.insert("extra_body".into(), json!({ "provider": value }));
        } else {
            out.at(
                line,
                "providerOptions",
                format!("must be an object (OpenRouter's provider routing), not {value}"),
            );
        }
    }
    if !options.is_empty() {
        section.insert("model_options".into(), Value::Object(options));
    }

    for key in fields.keys() {
        if !FIELDS.contains(&key.as_str()) {
            out.at(
                line_of(key),
                key,
                format!(
                    "unknown field `{key}` (Codebuff's AgentDefinition fields: {})",
                    FIELDS[..20].join(", ")
                ),
            );
        }
    }
    if !out.problems.is_empty() {
        return Err(out.problems);
    }
    let id = id.trim().to_owned();
    section.insert(
        "name".into(),
        section.get("name").cloned().unwrap_or_else(|| json!(id)),
    );
    Ok(Mapped {
        id,
        line: id_line,
        section: Value::Object(section),
        model,
        spawn: Spawn::Some(spawn),
        servers,
        secrets: Vec::new(),
        hooks: None,
        color: None,
        lines,
        codebuff_secrets: secrets,
        placeholders: true,
        handler: None,
    })
}

/// What is wrong with `reasoningOptions`.
#[derive(Debug, thiserror::Error)]
enum BadReasoning {
    /// Not an object (the value).
    #[error("must be an object ({{ effort }} or {{ max_tokens }}), not {0}")]
    NotObject(Value),
    /// A key it does not take.
    #[error("unknown key `{0}` (enabled, exclude, effort, max_tokens)")]
    UnknownKey(String),
    /// `exclude: true`.
    #[error(
        "exclude: true is not supported: Arbor keeps the model's reasoning in the history (remove it)"
    )]
    Exclude,
    /// An effort that is none of the known ones.
    #[error("effort {0:?}: minimal, low, medium, high or none")]
    Effort(String),
}

/// `reasoningOptions` as `model_options.reasoning` (`None`: no options).
fn reasoning(value: &Value) -> Result<Option<Value>, BadReasoning> {
    let Some(fields) = value.as_object() else {
        return Err(BadReasoning::NotObject(value.clone()));
    };
    for key in fields.keys() {
        if !["enabled", "exclude", "effort", "max_tokens"].contains(&key.as_str()) {
            return Err(BadReasoning::UnknownKey(key.clone()));
        }
    }
    if fields.get("exclude") == Some(&Value::Bool(true)) {
        return Err(BadReasoning::Exclude);
    }
    if fields.get("enabled") == Some(&Value::Bool(false)) {
        return Ok(None);
    }
    let mut out = Map::new();
    match fields.get("effort").and_then(Value::as_str) {
        Some("none") | None => {}
        Some(effort @ ("minimal" | "low" | "medium" | "high")) => {
            out.insert("effort".into(), json!(effort));
        }
        Some(other) => return Err(BadReasoning::Effort(other.to_owned())),
    }
    if let Some(tokens) = fields.get("max_tokens") {
        out.insert("budget_tokens".into(), tokens.clone());
    }
    Ok((!out.is_empty()).then_some(Value::Object(out)))
}

/// What the placeholders of a loaded agent's prompts stand for.
pub(super) struct Values<'a> {
    /// Its display name.
    pub name: &'a str,
    /// Its tools (as the template lists them) and, where known, what each does.
    pub tools: Vec<(String, Option<String>)>,
    /// The agents it may spawn and when to use each (its spawner prompt, or
    /// its description).
    pub agents: Vec<(String, Option<String>)>,
    /// Its step budget.
    pub max_steps: u32,
}

/// `prompt` with Codebuff's placeholders expanded; the names of those
/// replaced with nothing are added to `emptied`.
pub(super) fn expand(prompt: &str, values: &Values<'_>, emptied: &mut Vec<&'static str>) -> String {
    if !prompt.contains("{CODEBUFF_") {
        return prompt.to_owned();
    }
    let list = |items: &[(String, Option<String>)]| -> String {
        items
            .iter()
            .map(|(name, what)| match what {
                Some(what) => format!("- {name}: {what}"),
                None => format!("- {name}"),
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let mut out = prompt.to_owned();
    for name in EXPANDED {
        let placeholder = format!("{{CODEBUFF_{name}}}");
        if !out.contains(&placeholder) {
            continue;
        }
        let value = match name {
            "AGENT_NAME" => values.name.to_owned(),
            "TOOLS_PROMPT" if values.tools.is_empty() => String::new(),
            "TOOLS_PROMPT" => format!("# Tools\n\n{}", list(&values.tools)),
            "AGENTS_PROMPT" if values.agents.is_empty() => String::new(),
            "AGENTS_PROMPT" => format!(
                "# Agents\n\nYou can spawn these agents (spawn_agents):\n\n{}",
                list(&values.agents)
            ),
            _ => values.max_steps.to_string(),
        };
        out = out.replace(&placeholder, &value);
    }
    for name in EMPTIED {
        let placeholder = format!("{{CODEBUFF_{name}}}");
        if out.contains(&placeholder) {
            out = out.replace(&placeholder, "");
            if !emptied.contains(&name) {
                emptied.push(name);
            }
        }
    }
    out
}

/// A Codebuff agent file as evaluated.
#[cfg_attr(not(feature = "programs"), allow(dead_code))]
pub(super) struct Evaluated {
    /// Its key under its agents directory.
    pub key: String,
    /// The default export, `handleSteps` left out.
    pub definition: Value,
    /// The line of each top-level field.
    pub lines: Vec<(String, usize)>,
    /// Its `handleSteps`, ready to run.
    pub handler: Option<std::sync::Arc<dyn arbor_actors::handler::StepHandler>>,
    /// Every module of it (its own included): key and text, to store.
    pub modules: Vec<(String, String)>,
}

/// A module that cannot be loaded, as a problem at its `file:line`.
#[cfg(feature = "programs")]
fn problem(e: arbor_programs::LoadError) -> Problem {
    Problem {
        file: Some(e.file.display().to_string()),
        line: e.line,
        key: "(module)".into(),
        message: e.message,
    }
}

#[cfg(feature = "programs")]
fn evaluated(
    bundle: arbor_programs::Bundle,
    file: &std::path::Path,
) -> Result<Option<Evaluated>, Problem> {
    use arbor_programs::{JsHandler, Limits, load_agent_bundle};
    let key = bundle.entry().to_owned();
    let modules: Vec<(String, String)> = bundle
        .sources()
        .map(|(k, t)| (k.to_owned(), t.to_owned()))
        .collect();
    let limits = Limits::default();
    let Some(agent) = load_agent_bundle(bundle, file, limits).map_err(problem)? else {
        return Ok(None);
    };
    Ok(Some(Evaluated {
        key,
        definition: agent.definition,
        lines: agent.field_lines,
        handler: agent.program.map(|p| {
            std::sync::Arc::new(JsHandler::new(p, limits))
                as std::sync::Arc<dyn arbor_actors::handler::StepHandler>
        }),
        modules,
    }))
}

/// Evaluates the Codebuff agent file `file` of the agents directory `root`:
/// `Ok(None)` when it is not an agent (no default export with an `id`).
#[cfg(feature = "programs")]
pub(super) fn evaluate(
    root: &std::path::Path,
    file: &std::path::Path,
) -> Result<Option<Evaluated>, Problem> {
    let bundle = arbor_programs::bundle(root, file).map_err(problem)?;
    evaluated(bundle, file)
}

/// [`evaluate`] on the modules a stored config kept, by key.
#[cfg(feature = "programs")]
pub(super) fn evaluate_stored(
    root: &std::path::Path,
    files: &BTreeMap<String, String>,
    key: &str,
) -> Result<Option<Evaluated>, Problem> {
    let bundle = arbor_programs::bundle_from(root, files, key).map_err(problem)?;
    evaluated(bundle, &root.join(key))
}

/// `text`, module `key`, with each string literal of a secret (a key of
/// `secrets`) replaced by what the stored copy has instead.
#[cfg(feature = "programs")]
pub(super) fn redact(text: &str, key: &str, secrets: &BTreeMap<String, String>) -> String {
    if secrets.is_empty() {
        return text.to_owned();
    }
    arbor_programs::replace_strings(text, key, &|value| secrets.get(value).cloned())
}

#[cfg(not(feature = "programs"))]
const NO_ENGINE: &str = "a Codebuff agent file needs the JavaScript engine, which this build \
                         does not have (arbor-agents' feature `programs`)";

/// Without the `programs` feature a Codebuff file cannot be evaluated.
#[cfg(not(feature = "programs"))]
pub(super) fn evaluate(
    _root: &std::path::Path,
    file: &std::path::Path,
) -> Result<Option<Evaluated>, Problem> {
    Err(Problem {
        file: Some(file.display().to_string()),
        line: None,
        key: "(file)".into(),
        message: NO_ENGINE.into(),
    })
}

/// Without the `programs` feature a Codebuff file cannot be evaluated.
#[cfg(not(feature = "programs"))]
pub(super) fn evaluate_stored(
    root: &std::path::Path,
    _files: &BTreeMap<String, String>,
    key: &str,
) -> Result<Option<Evaluated>, Problem> {
    evaluate(root, &root.join(key))
}

/// Without the `programs` feature no Codebuff module is stored.
#[cfg(not(feature = "programs"))]
pub(super) fn redact(text: &str, _key: &str, _secrets: &BTreeMap<String, String>) -> String {
    text.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_names_the_local_definition_by_id() {
        assert_eq!(local_id("codebuff/file-picker@0.0.1"), "file-picker");
        assert_eq!(local_id("file-picker@1"), "file-picker");
        assert_eq!(local_id("acme/file-picker"), "file-picker");
        assert_eq!(local_id("file-picker"), "file-picker");
    }

    #[test]
    fn placeholders_are_expanded_and_unknown_ones_left_as_written() {
        let values = Values {
            name: "Picker",
            tools: vec![("read_files".into(), Some("Reads files".into()))],
            agents: vec![("helper".into(), None)],
            max_steps: 7,
        };
        let mut emptied = Vec::new();
        let out = expand(
            "I am {CODEBUFF_AGENT_NAME} ({CODEBUFF_REMAINING_STEPS} steps).\n{CODEBUFF_TOOLS_PROMPT}\n{CODEBUFF_AGENTS_PROMPT}\n[{CODEBUFF_CONFIG_SCHEMA}] {CODEBUFF_NOT_A_THING} {CODEBUFF_PROJECT_ROOT}",
            &values,
            &mut emptied,
        );
        assert_eq!(
            out,
            "I am Picker (7 steps).\n# Tools\n\n- read_files: Reads files\n# Agents\n\nYou can spawn these agents (spawn_agents):\n\n- helper\n[] {CODEBUFF_NOT_A_THING} {CODEBUFF_PROJECT_ROOT}"
        );
        assert_eq!(emptied, ["CONFIG_SCHEMA"]);
    }
}

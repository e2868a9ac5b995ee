//! Claude Code's sub-agent files (`.claude/agents/NAME.md`): YAML front
//! matter between `---` lines, then the system prompt in Markdown. Every
//! front matter field Claude Code documents is mapped to an `[agents.NAME]`
//! key here, or refused by name; none is dropped.
//!
//! | field | becomes |
//! |---|---|
//! | `name` | the agent's id (required) |
//! | `description` | `description` (required) |
//! | `tools` | `tools` in Claude Code's names (`tool_names = "claude"`): `Read`, `Write`, `Edit`, `MultiEdit`, `Bash`, `Grep`, `Glob`, `LS`, `TodoWrite`; `mcp__SERVER__TOOL` is `SERVER/TOOL`, `mcp__SERVER` is `SERVER/*`; `Agent` or `Task` (Claude Code's old name) may spawn every other agent, `Agent(a, b)` those. Absent: every workspace tool and every configured tool (`[tools]`, `[mcp_servers]`), no spawning |
//! | `disallowedTools` | taken out of the above |
//! | `model` | `sonnet`, `opus`, `haiku` and full ids through `[model_aliases]` (a full id also names a `[models]` entry of that name or `model`); `inherit` or absent: the model of the agents that spawn it |
//! | `maxTurns` | `max_steps` |
//! | `permissionMode` | `default`: approvals on `Write`, `Edit`, `MultiEdit`, `Bash`; `acceptEdits`: on `Bash`; `plan`: no `Write`, `Edit`, `MultiEdit`, `Bash`; `dontAsk`: whatever would ask is denied at once; `bypassPermissions`: no approvals of its own (`[policy]` still applies); `auto` refused |
//! | `mcpServers` | a name: that `[mcp_servers]` entry's tools (`NAME/*`); `{NAME: {...}}` (as `.mcp.json`): a server of that name, and its tools |
//! | `hooks` | its hooks, run for this agent only (`Stop` as `Stop` at a root, `SubagentStop` for a child); events Arbor does not run refused |
//! | `effort` | `model_options.reasoning.effort` (`low`, `medium`, `high`) |
//! | `initialPrompt` | `instructions_prompt` |
//! | `color` | kept for `arbor agents` |
//! | `background: false` | nothing (`true` refused: the spawning agent picks background with `spawn_agents_async`) |
//! | `isolation: worktree` | `isolation = "worktree"` |
//! | `skills`, `memory` | refused by name |

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::yaml::{self, Kind, Node};
use super::{Mapped, ModelChoice, Spawn};
use crate::config::Problem;

/// Claude Code's workspace tools (the `claude` family of names).
pub(super) fn workspace_names() -> Vec<&'static str> {
    arbor_tools::workspace::names(arbor_tools::workspace::Family::Claude)
}

/// The tools that change the workspace or run commands: what `default`
/// asks about, and what `plan` takes away.
const WRITERS: [&str; 4] = ["Write", "Edit", "MultiEdit", "Bash"];

/// Claude Code tools Arbor has no counterpart of: named, they are refused
/// with that said (unless a `[tools]` entry of the same name exists).
const NOT_IN_ARBOR: [&str; 12] = [
    "WebFetch",
    "WebSearch",
    "NotebookEdit",
    "NotebookRead",
    "BashOutput",
    "KillShell",
    "KillBash",
    "SlashCommand",
    "Skill",
    "ExitPlanMode",
    "AskUserQuestion",
    "ListMcpResourcesTool",
];

/// A file split into its front matter and body.
pub(super) struct Split<'t> {
    /// The front matter's text (between the fences).
    pub front: &'t str,
    /// Where the front matter starts in the file's text, in bytes.
    pub front_at: usize,
    /// The line the front matter starts on.
    pub front_line: usize,
    /// The body: the system prompt.
    pub body: &'t str,
    /// The line the body starts on.
    pub body_line: usize,
}

/// Splits a Markdown file at its front matter; `None` if it has none
/// (it does not start with a `---` line); `Err` if one is never closed.
pub(super) fn split(text: &str) -> Option<Result<Split<'_>, (usize, String)>> {
    let bom = if text.starts_with('\u{feff}') {
        '\u{feff}'.len_utf8()
    } else {
        0
    };
    let text = text.get(bom..).unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next()?;
    if first.trim_end() != "---" {
        return None;
    }
    let start = first.len();
    let mut at = start;
    let mut line = 1;
    for l in lines {
        line += 1;
        if matches!(l.trim_end(), "---" | "...") {
            let front = &text[start..at];
            let rest = &text[at + l.len()..];
            // The prompt starts at its first line with text.
            let skipped = rest.len() - rest.trim_start_matches(['\n', '\r']).len();
            let blank_lines = rest[..skipped].matches('\n').count();
            return Some(Ok(Split {
                front,
                front_at: bom + start,
                front_line: 2,
                body: rest.trim(),
                body_line: line + 1 + blank_lines,
            }));
        }
        at += l.len();
    }
    Some(Err((
        1,
        "the front matter opened with --- on line 1 is never closed with ---".to_owned(),
    )))
}

/// What the mapping needs of the rest of the config.
pub(super) struct Context<'a> {
    /// `[tools]` entries by name.
    pub command_tools: &'a [String],
    /// `[mcp_servers]` entries of the config file by name.
    pub servers: &'a [String],
}

/// One problem of the file being mapped.
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

/// A `tools` or `disallowedTools` value: a comma-separated string or a
/// list, each entry with its line. `Agent(a, b)` keeps its commas.
fn tool_list(node: &Node, key: &str, out: &mut Out<'_>) -> Vec<(String, usize)> {
    match &node.kind {
        Kind::Str(s) => split_top_level(s)
            .into_iter()
            .map(|t| (t, node.line))
            .collect(),
        Kind::Seq(items) => {
            let mut list = Vec::new();
            for item in items {
                match item.as_str() {
                    Some(s) => list.extend(split_top_level(s).into_iter().map(|t| (t, item.line))),
                    None => out.at(
                        item.line,
                        key,
                        format!("each entry is a tool's name, not {}", item.what()),
                    ),
                }
            }
            list
        }
        Kind::Null => Vec::new(),
        _ => {
            out.at(
                node.line,
                key,
                format!(
                    "a comma-separated string or a list of tool names, not {}",
                    node.what()
                ),
            );
            Vec::new()
        }
    }
}

/// `Read, Agent(a, b), Bash` as its three entries.
fn split_top_level(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut current = String::new();
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    out.push(current);
    out.into_iter()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

/// One tool entry in Claude Code's spelling.
enum Entry {
    /// `Agent`, `Task`: may spawn every other agent; `Agent(a, b)`: those.
    Spawn(Option<Vec<String>>),
    /// An Arbor tool name or pattern.
    Tool(String),
}

/// Why a tool entry has no Arbor counterpart (each names the entry).
#[derive(Debug, thiserror::Error)]
enum BadEntry {
    /// `mcp__` without a server.
    #[error(
        "{0:?} is not an MCP tool's name (mcp__SERVER__TOOL, or mcp__SERVER for all its tools)"
    )]
    NotMcp(String),
    /// A permission rule: a tool with arguments (the entry, the tool).
    #[error(
        "{0:?} is a Claude Code permission rule (a tool with arguments), which Arbor has no \
         counterpart of here: list the tool ({1}) and use [policy] or hooks to narrow it"
    )]
    Rule(String, String),
    /// A Claude Code tool Arbor does not have (the entry, Arbor's tools).
    #[error(
        "{0:?} is a Claude Code tool Arbor has no counterpart of (it has {1}, and Agent to \
         spawn): remove it, or configure a [tools.{0}] command tool"
    )]
    NotInArbor(String, String),
}

fn entry(name: &str, ctx: &Context<'_>) -> Result<Entry, BadEntry> {
    if let Some(inner) = name
        .strip_prefix("Agent(")
        .or_else(|| name.strip_prefix("Task("))
        .and_then(|r| r.strip_suffix(')'))
    {
        let agents: Vec<String> = inner
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect();
        return Ok(Entry::Spawn(Some(agents)));
    }
    if name == "Agent" || name == "Task" {
        return Ok(Entry::Spawn(None));
    }
    if let Some(rest) = name.strip_prefix("mcp__") {
        return match rest.split_once("__") {
            Some((server, tool)) if !server.is_empty() && !tool.is_empty() => {
                Ok(Entry::Tool(format!("{server}/{tool}")))
            }
            None if !rest.is_empty() => Ok(Entry::Tool(format!("{rest}/*"))),
            _ => Err(BadEntry::NotMcp(name.to_owned())),
        };
    }
    if let Some((tool, _)) = name.split_once('(') {
        return Err(BadEntry::Rule(name.to_owned(), tool.to_owned()));
    }
    if NOT_IN_ARBOR.contains(&name) && !ctx.command_tools.iter().any(|t| t == name) {
        return Err(BadEntry::NotInArbor(
            name.to_owned(),
            workspace_names().join(", "),
        ));
    }
    Ok(Entry::Tool(name.to_owned()))
}

/// Reads one Claude Code agent file into an `[agents.NAME]` section and
/// the rest its loading needs; `Err` holds every problem found, each at
/// its line.
pub(super) fn map(
    file: &str,
    text: &str,
    ctx: &Context<'_>,
) -> Result<Option<Mapped>, Vec<Problem>> {
    let mut out = Out {
        file,
        problems: Vec::new(),
    };
    let parts = match split(text) {
        None => return Ok(None),
        Some(Ok(parts)) => parts,
        Some(Err((line, why))) => {
            out.at(line, "(front matter)", why);
            return Err(out.problems);
        }
    };
    let front = match yaml::parse(parts.front, parts.front_line) {
        Ok(node) => node,
        Err((line, why)) => {
            out.at(line, "(front matter)", why);
            return Err(out.problems);
        }
    };
    let fields = match front.kind {
        Kind::Map(fields) => fields,
        Kind::Null => Vec::new(),
        _ => {
            out.at(
                front.line,
                "(front matter)",
                format!(
                    "must be a mapping of fields (name: ..., description: ...), not {}",
                    front.what()
                ),
            );
            return Err(out.problems);
        }
    };
    let field = |name: &str| fields.iter().find(|(k, _, _)| k == name);
    let text_field = |out: &mut Out<'_>, name: &str| -> Option<(String, usize)> {
        let (_, line, node) = field(name)?;
        match &node.kind {
            Kind::Str(s) => Some((s.clone(), *line)),
            Kind::Int(_) | Kind::Float(_) | Kind::Bool(_) => Some((
                match &node.to_json() {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                },
                *line,
            )),
            _ => {
                out.at(*line, name, format!("must be text, not {}", node.what()));
                None
            }
        }
    };
    let name = text_field(&mut out, "name");
    let description = text_field(&mut out, "description");
    let Some((id, name_line)) = name.clone().filter(|(n, _)| !n.trim().is_empty()) else {
        out.at(
            field("name").map_or(1, |f| f.1),
            "name",
            "missing: a Claude Code agent file names its agent (name: code-reviewer)",
        );
        return Err(out.problems);
    };
    let id = id.trim().to_owned();
    if description.is_none() {
        out.at(
            name_line,
            "description",
            "missing: a Claude Code agent file says when to use its agent (description: ...)",
        );
    }
    let mut lines: BTreeMap<&'static str, (&'static str, usize)> = BTreeMap::new();
    let mut section = Map::new();
    section.insert("name".into(), json!(id));
    if let Some((d, line)) = &description {
        section.insert("description".into(), json!(d));
        lines.insert("description", ("description", *line));
    }
    section.insert("system_prompt".into(), json!(parts.body));
    lines.insert("system_prompt", ("(body)", parts.body_line));
    section.insert("tool_names".into(), json!("claude"));

    // Tools: the list, or all of them.
    let mut spawn = Spawn::None;
    let mut tools: Vec<String> = Vec::new();
    let tools_line = field("tools").map_or(name_line, |f| f.1);
    match field("tools") {
        Some((_, _, node)) => {
            for (name, line) in tool_list(node, "tools", &mut out) {
                match entry(&name, ctx) {
                    Ok(Entry::Spawn(None)) => spawn = Spawn::All,
                    Ok(Entry::Spawn(Some(agents))) => {
                        let mut list = match std::mem::replace(&mut spawn, Spawn::None) {
                            Spawn::Some(list) => list,
                            _ => Vec::new(),
                        };
                        list.extend(agents.into_iter().map(|a| (a, line)));
                        spawn = Spawn::Some(list);
                    }
                    Ok(Entry::Tool(t)) => {
                        if !tools.contains(&t) {
                            tools.push(t);
                        }
                    }
                    Err(why) => out.at(line, "tools", why.to_string()),
                }
            }
        }
        None => {
            tools.extend(workspace_names().into_iter().map(str::to_owned));
            tools.extend(ctx.command_tools.iter().cloned());
            tools.extend(ctx.servers.iter().map(|s| format!("{s}/*")));
        }
    }
    lines.insert("tools", ("tools", tools_line));
    lines.insert("spawnable_agents", ("tools", tools_line));

    // MCP servers: named ones and inline ones, and their tools.
    let mut servers = Vec::new();
    let mut secrets = Vec::new();
    if let Some((_, line, node)) = field("mcpServers") {
        let items: Vec<&Node> = match &node.kind {
            Kind::Seq(items) => items.iter().collect(),
            Kind::Map(_) => vec![node],
            _ => {
                out.at(
                    *line,
                    "mcpServers",
                    format!(
                        "a list of server names or {{NAME: {{...}}}} definitions, not {}",
                        node.what()
                    ),
                );
                Vec::new()
            }
        };
        for item in items {
            match &item.kind {
                Kind::Str(server) => {
                    if !ctx.servers.iter().any(|s| s == server) {
                        out.at(
                            item.line,
                            "mcpServers",
                            format!(
                                "names MCP server {server:?}, which is not declared under [mcp_servers] (configured: {})",
                                if ctx.servers.is_empty() { "none".to_owned() } else { ctx.servers.join(", ") }
                            ),
                        );
                    }
                    let all = format!("{server}/*");
                    if !tools.contains(&all) {
                        tools.push(all);
                    }
                }
                Kind::Map(entries) => {
                    for (server, server_line, definition) in entries {
                        let json = definition.to_json();
                        secrets.extend(secret_spans(definition, &json, &parts));
                        servers.push((server.clone(), *server_line, json));
                        let all = format!("{server}/*");
                        if !tools.contains(&all) {
                            tools.push(all);
                        }
                    }
                }
                _ => out.at(
                    item.line,
                    "mcpServers",
                    format!(
                        "each entry is a server's name or {{NAME: {{...}}}}, not {}",
                        item.what()
                    ),
                ),
            }
        }
    }

    // What is taken away: disallowedTools, then the permission mode.
    if let Some((_, _, node)) = field("disallowedTools") {
        for (name, line) in tool_list(node, "disallowedTools", &mut out) {
            match entry(&name, ctx) {
                Ok(Entry::Spawn(None)) => spawn = Spawn::None,
                Ok(Entry::Spawn(Some(agents))) => {
                    if let Spawn::Some(list) = &mut spawn {
                        list.retain(|(a, _)| !agents.contains(a));
                    } else if matches!(spawn, Spawn::All) {
                        spawn = Spawn::AllBut(agents);
                    }
                }
                Ok(Entry::Tool(t)) => {
                    if let Some(server) = t.strip_suffix("/*") {
                        tools.retain(|x| !x.starts_with(&format!("{server}/")));
                    } else if let Some((server, _)) = t.split_once('/')
                        && tools.contains(&format!("{server}/*"))
                    {
                        out.at(
                            line,
                            "disallowedTools",
                            format!(
                                "{name:?}: Arbor cannot take one tool out of all of MCP server \
                                 {server:?}'s: list the tools this agent may use in `tools` \
                                 (mcp__{server}__TOOL), or set disabled_tools on [mcp_servers.{server}]"
                            ),
                        );
                    } else {
                        tools.retain(|x| *x != t);
                    }
                }
                Err(why) => out.at(line, "disallowedTools", why.to_string()),
            }
        }
    }
    if let Some((mode, line)) = text_field(&mut out, "permissionMode") {
        let mut approve: Vec<&str> = Vec::new();
        match mode.as_str() {
            "default" => approve.extend(WRITERS),
            "acceptEdits" => approve.push("Bash"),
            "plan" => tools.retain(|t| !WRITERS.contains(&t.as_str())),
            "bypassPermissions" => {}
            "dontAsk" => {
                section.insert("approval_timeout".into(), json!("1ms"));
                section.insert("approval_default".into(), json!("deny"));
            }
            "auto" => out.at(
                line,
                "permissionMode",
                "\"auto\" needs Claude Code's classifier, which Arbor does not have: use \
                 default, acceptEdits, plan, dontAsk or bypassPermissions",
            ),
            other => out.at(
                line,
                "permissionMode",
                format!("unknown mode {other:?} (default, acceptEdits, plan, dontAsk, bypassPermissions)"),
            ),
        }
        approve.retain(|t| tools.iter().any(|x| x == t));
        section.insert("approve".into(), json!(approve));
        for key in ["approve", "approval_timeout", "approval_default"] {
            lines.insert(key, ("permissionMode", line));
        }
    }
    section.insert("tools".into(), json!(tools));

    // The model: named, or inherited from the agents that spawn it.
    let model = match text_field(&mut out, "model") {
        None => ModelChoice::Inherit(name_line),
        Some((m, line)) if m.trim() == "inherit" => ModelChoice::Inherit(line),
        Some((m, line)) => ModelChoice::Named(m.trim().to_owned(), line),
    };
    lines.insert("model", ("model", model.line()));

    if let Some((_, line, node)) = field("maxTurns") {
        match &node.kind {
            Kind::Int(n) if *n >= 1 && *n <= i64::from(u32::MAX) => {
                section.insert("max_steps".into(), json!(n));
            }
            _ => out.at(
                *line,
                "maxTurns",
                format!(
                    "must be a whole number of turns, at least 1 (it is {})",
                    node.what()
                ),
            ),
        }
        lines.insert("max_steps", ("maxTurns", *line));
    }
    if let Some((prompt, line)) = text_field(&mut out, "initialPrompt") {
        section.insert("instructions_prompt".into(), json!(prompt));
        lines.insert("instructions_prompt", ("initialPrompt", line));
    }
    if let Some((effort, line)) = text_field(&mut out, "effort") {
        if ["low", "medium", "high"].contains(&effort.as_str()) {
            section.insert(
                "model_options".into(),
                json!({"reasoning": {"effort": effort}}),
            );
        } else {
            out.at(
                line,
                "effort",
                format!("{effort:?}: Arbor's models take low, medium or high"),
            );
        }
        lines.insert("model_options", ("effort", line));
    }
    let color = text_field(&mut out, "color").map(|(c, _)| c);
    let hooks = field("hooks").map(|(_, line, node)| (node.clone(), *line));

    // Every other field: known but refused, or unknown.
    for (key, line, node) in &fields {
        match key.as_str() {
            "name" | "description" | "tools" | "disallowedTools" | "model" | "maxTurns"
            | "permissionMode" | "mcpServers" | "hooks" | "initialPrompt" | "color" | "effort" => {}
            "background" => match node.kind {
                Kind::Bool(false) => {}
                Kind::Bool(true) => out.at(
                    *line,
                    "background",
                    "true is not honoured: in Arbor the spawning agent runs a child in the \
                     background (give it spawn_agents_async); remove the field",
                ),
                _ => out.at(*line, "background", format!("must be true or false, not {}", node.what())),
            },
            "isolation" => match node.as_str() {
                Some("worktree") => {
                    section.insert("isolation".into(), json!("worktree"));
                    lines.insert("isolation", ("isolation", *line));
                }
                _ => out.at(
                    *line,
                    "isolation",
                    format!(
                        "must be worktree (a git worktree of its own), not {}",
                        node.to_json()
                    ),
                ),
            },
            "skills" => out.at(
                *line,
                "skills",
                "is not supported: Arbor has no Claude Code skills to preload; put what the agent needs in its prompt",
            ),
            "memory" => out.at(
                *line,
                "memory",
                "is not supported: Arbor keeps no persistent agent memory directory",
            ),
            other => out.at(
                *line,
                other,
                format!(
                    "unknown field `{other}` (Claude Code's fields: name, description, tools, \
                     disallowedTools, model, permissionMode, maxTurns, skills, mcpServers, hooks, \
                     memory, background, effort, isolation, color, initialPrompt)"
                ),
            ),
        }
    }
    if !out.problems.is_empty() {
        return Err(out.problems);
    }
    Ok(Some(Mapped {
        id,
        line: name_line,
        section: Value::Object(section),
        model,
        spawn,
        servers,
        secrets,
        codebuff_secrets: Vec::new(),
        placeholders: false,
        handler: None,
        hooks,
        color,
        lines,
    }))
}

/// The byte spans in the file of an inline MCP server's secrets (its
/// `definition`, read as `json`), each with the YAML its stored copy has
/// instead (see `config::redact`).
fn secret_spans(
    definition: &Node,
    json: &Value,
    parts: &Split<'_>,
) -> Vec<(std::ops::Range<usize>, String)> {
    let front = parts.front;
    let byte = |chars: usize| {
        front
            .char_indices()
            .nth(chars)
            .map_or(front.len(), |(b, _)| b)
    };
    let entry = |node: &Node, key: &str| -> Option<Node> {
        match &node.kind {
            Kind::Map(entries) => entries
                .iter()
                .find(|(k, _, _)| k == key)
                .map(|(_, _, v)| v.clone()),
            _ => None,
        }
    };
    let mut out = Vec::new();
    for secret in crate::config::redact::server_secrets(json) {
        let (key, name) = &secret.key;
        let node = match name {
            Some(name) => entry(definition, key).and_then(|map| entry(&map, name)),
            None => entry(definition, key),
        };
        let Some(node) = node.filter(|n| n.as_str() == Some(secret.value.as_str())) else {
            continue;
        };
        let (mut start, mut end) = (byte(node.chars.start), byte(node.chars.end));
        // The scalar alone: no space after it, its quotes included.
        while end > start && front[..end].ends_with(char::is_whitespace) {
            end -= front[..end].chars().next_back().map_or(1, char::len_utf8);
        }
        for quote in ['"', '\''] {
            if front[..start].ends_with(quote) && front[end..].starts_with(quote) {
                start -= 1;
                end += 1;
            }
        }
        let stored = serde_json::to_string(&secret.stored).unwrap_or_default();
        out.push((parts.front_at + start..parts.front_at + end, stored));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_tool_string_splits_at_top_level_commas_only() {
        assert_eq!(
            split_top_level("Agent(worker, researcher), Read, Bash"),
            ["Agent(worker, researcher)", "Read", "Bash"]
        );
        assert_eq!(split_top_level(" Read ,, Grep "), ["Read", "Grep"]);
    }

    #[test]
    fn the_body_starts_on_its_first_line_with_text() {
        let text = "---\nname: a\ndescription: b\n---\n\nYou review.\n";
        let parts = split(text).unwrap().unwrap();
        assert_eq!(parts.front, "name: a\ndescription: b\n");
        assert_eq!(parts.body, "You review.");
        assert_eq!(parts.body_line, 6);
        assert!(split("# Just a README\n").is_none());
        assert!(split("---\nname: a\n").unwrap().is_err());
    }
}

//! Agent files: agents written for other tools, loaded as they are into
//! the config's templates (`[agents] include`, `--agents DIR`, and a
//! workspace's `.claude/agents` when it has one).
//!
//! Discovery walks each directory (files in name order, hidden ones and
//! subdirectories deeper than [`MAX_DEPTH`] left out) and dispatches each
//! file by its extension: `.md` is a Claude Code sub-agent (`claude.rs`);
//! `.ts`, `.js` and `.json` (and `.mts`, `.mjs`; not `.d.ts`) are Codebuff
//! agent definitions (`codebuff.rs`), evaluated in the JavaScript engine
//! (feature `programs`; without it such a file is an error, never a silent
//! skip). A Markdown file without front matter (a README), and a module
//! whose default export is no object with an `id` (helpers, types), are
//! left out. Each file becomes an `[agents.NAME]` section, through the same
//! checks as one written in TOML (`check/agents.rs`); its problems are
//! reported at the file's line of the field they come from
//! (`reviewer.md:4: tools: ...`). TOML templates and loaded ones spawn
//! each other; a name defined twice is an error naming both places.
//!
//! A tree stores the files' text with its config (`[[stored_agent_files]]`
//! appended to the snapshot; a Codebuff agent's with every module it
//! imports), so that resume and replay run on the agents it started with,
//! whatever the directory holds by then. The secrets of their inline MCP
//! servers are not stored (`config::redact`).

mod claude;
mod codebuff;
mod discover;
mod models;
mod scene;
mod yaml;

pub(crate) use scene::CodebuffScene;

use discover::discover;
#[cfg(test)]
use discover::walk;
use models::Models;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arbor_actors::handler::StepHandler;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::read::Source;
use super::{AgentSection, ConfigFile, Problem};

/// How deep below an included directory files are looked for.
pub const MAX_DEPTH: usize = 8;
/// The most files one config loads (a directory of thousands is a mistake).
pub const MAX_FILES: usize = 10_000;
/// The directories looked up in a workspace, and loaded when present.
pub const WORKSPACE_DIRS: [&str; 2] = [".claude/agents", ".agents"];

/// The extensions of Codebuff's agent files (and the modules they import).
const CODEBUFF_EXTENSIONS: [&str; 7] = ["ts", "js", "json", "mts", "mjs", "cts", "cjs"];

/// Where agent files are loaded from besides `[agents] include`.
#[derive(Clone, Debug, Default)]
pub struct AgentFiles {
    /// Directories (or files) named on the command line (`--agents DIR`):
    /// each must exist.
    pub dirs: Vec<PathBuf>,
    /// The workspace whose [`WORKSPACE_DIRS`] are loaded when present.
    pub workspace: Option<PathBuf>,
}

/// An agent file's text, as a stored config keeps it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StoredAgentFile {
    /// The file, as messages name it.
    pub path: String,
    /// Its whole text.
    pub text: String,
    /// A Codebuff module's agents directory, which its imports stay in
    /// (absent for a Claude Code file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// A module a Codebuff agent imports, not an agent file itself.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub module_only: bool,
}

/// Where a loaded agent came from (what `arbor agents` shows).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentOrigin {
    /// The file.
    pub file: String,
    /// The line of its `name`.
    pub line: usize,
    /// Its display colour (Claude Code's `color`), kept as written.
    pub color: Option<String>,
}

/// A file's agent, mapped into an `[agents.NAME]` section (as JSON) with
/// what is decided once every agent is known: its model and whom it
/// spawns.
pub(super) struct Mapped {
    id: String,
    /// The line of its `name`.
    line: usize,
    section: Value,
    model: ModelChoice,
    spawn: Spawn,
    /// Inline MCP servers: name, line, definition (`.mcp.json`'s shape).
    servers: Vec<(String, usize, Value)>,
    /// Where their secrets are in the file (byte spans) and what its
    /// stored copy has instead (`config::redact`).
    secrets: Vec<(std::ops::Range<usize>, String)>,
    /// A Codebuff agent's server secrets: each value and what its stored
    /// modules have in its place (their string literals of that value).
    codebuff_secrets: Vec<(String, String)>,
    /// Whether its prompts may hold Codebuff's placeholders.
    placeholders: bool,
    /// Its program (Codebuff's `handleSteps`).
    handler: Option<Arc<dyn StepHandler>>,
    /// Its own hooks (Claude Code's shape) and their line.
    hooks: Option<(yaml::Node, usize)>,
    color: Option<String>,
    /// Each `[agents]` key it set: the file's field and line.
    lines: BTreeMap<&'static str, (&'static str, usize)>,
}

/// A file's `model`.
pub(super) enum ModelChoice {
    /// `inherit` or absent: its spawners' model (the line of the field, or
    /// of `name`).
    Inherit(usize),
    /// An alias, a model id or a `[models]` entry, at its line.
    Named(String, usize),
}

impl ModelChoice {
    fn line(&self) -> usize {
        match self {
            ModelChoice::Inherit(line) | ModelChoice::Named(_, line) => *line,
        }
    }
}

/// Whom a file's agent may spawn.
pub(super) enum Spawn {
    None,
    /// Every other agent (`Agent`).
    All,
    /// Every other agent but these.
    AllBut(Vec<String>),
    /// These (`Agent(a, b)`), each with its line.
    Some(Vec<(String, usize)>),
}

/// Where a loaded agent's problems are reported.
struct Place {
    file: String,
    /// The line of its `name`: where a problem of no field of its own goes.
    line: usize,
    /// Each `[agents]` key it set: the file's field and line.
    lines: BTreeMap<&'static str, (&'static str, usize)>,
}

/// What loading left for the rest of the config: the places to report
/// problems at, the hooks to add, the files to store.
#[derive(Default)]
pub(super) struct Loaded {
    /// Each loaded agent: its file and the line of each field it set.
    places: BTreeMap<String, Place>,
    /// Each inline MCP server: its file and line.
    servers: BTreeMap<String, (String, usize)>,
    /// Agent hooks: agent, hooks, file.
    hooks: Vec<(String, yaml::Node, String)>,
    /// The files read, to store with a tree (empty when they came from a
    /// stored config).
    pub stored: Vec<StoredAgentFile>,
    /// Where each loaded agent came from.
    pub origins: BTreeMap<String, AgentOrigin>,
    /// The programs of loaded agents (Codebuff's `handleSteps`), by agent.
    handlers: BTreeMap<String, Arc<dyn StepHandler>>,
}

/// Loads the agent files into `file.agents` (and their inline MCP
/// servers into `file.mcp_servers`): the stored ones when the config
/// carries them, else those `[agents] include`, `sources` and the
/// workspace name. Problems go to `problems`, each at its file and line;
/// an agent that cannot be loaded is added to `broken`, so that what names
/// it is not reported too.
pub(super) fn load(
    file: &mut ConfigFile,
    base_dir: &Path,
    sources: &AgentFiles,
    text: &Source<'_>,
    source_name: &str,
    problems: &mut Vec<Problem>,
    broken: &mut HashSet<String>,
) -> Loaded {
    let mut loaded = Loaded::default();
    let fresh = file.stored_agent_files.is_empty();
    // Claude Code's files as read; Codebuff's as evaluated, with the
    // modules to store.
    let mut markdown: Vec<StoredAgentFile> = Vec::new();
    let mut evaluated: Vec<(String, codebuff::Evaluated)> = Vec::new();
    let mut modules: BTreeMap<(String, String), (String, bool)> = BTreeMap::new();
    if fresh {
        for f in discover(file, base_dir, sources, text, problems) {
            let shown = f.path.display().to_string();
            let ext = f.path.extension().and_then(|e| e.to_str()).unwrap_or("");
            if ext == "md" {
                match super::open::read_text(&f.path) {
                    Ok(text) => markdown.push(StoredAgentFile {
                        path: shown,
                        text,
                        root: None,
                        module_only: false,
                    }),
                    Err(why) => problems.push(file_problem(&shown, why.to_string())),
                }
            } else if CODEBUFF_EXTENSIONS.contains(&ext) && !not_an_agent(&f.path) {
                match codebuff::evaluate(&f.root, &f.path) {
                    Ok(Some(agent)) => {
                        let root = f.root.display().to_string();
                        for (key, text) in &agent.modules {
                            let entry = *key == agent.key;
                            let stored = modules
                                .entry((root.clone(), key.clone()))
                                .or_insert_with(|| (text.clone(), true));
                            stored.1 &= !entry;
                        }
                        evaluated.push((shown, agent));
                    }
                    Ok(None) => tracing::debug!(
                        "{shown}: left out: its default export is no AgentDefinition"
                    ),
                    Err(problem) => problems.push(problem),
                }
            }
        }
    } else {
        let stored = std::mem::take(&mut file.stored_agent_files);
        let mut roots: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for f in &stored {
            match &f.root {
                None => markdown.push(f.clone()),
                Some(root) => {
                    let key = key_under(root, &f.path);
                    roots
                        .entry(root.clone())
                        .or_default()
                        .insert(key, f.text.clone());
                }
            }
        }
        for f in stored.iter().filter(|f| !f.module_only) {
            let Some(root) = &f.root else { continue };
            let Some(files) = roots.get(root) else {
                continue;
            };
            match codebuff::evaluate_stored(Path::new(root), files, &key_under(root, &f.path)) {
                Ok(Some(agent)) => evaluated.push((f.path.clone(), agent)),
                Ok(None) => {}
                Err(problem) => problems.push(problem),
            }
        }
    }
    let command_tools: Vec<String> = file.tools.keys().cloned().collect();
    let servers: Vec<String> = file.mcp_servers.keys().cloned().collect();
    let ctx = claude::Context {
        command_tools: &command_tools,
        servers: &servers,
    };
    let mut mapped: Vec<(String, Mapped)> = Vec::new();
    // Each file's secrets, replaced in the copy stored with a tree.
    let mut redactions: BTreeMap<String, Vec<(std::ops::Range<usize>, String)>> = BTreeMap::new();
    for f in &markdown {
        match claude::map(&f.path, &f.text, &ctx) {
            Ok(Some(mut m)) => {
                redactions
                    .entry(f.path.clone())
                    .or_default()
                    .append(&mut m.secrets);
                mapped.push((f.path.clone(), m));
            }
            Ok(None) => tracing::warn!(
                "{}: left out: a Markdown file without front matter (---) is not an agent file",
                f.path
            ),
            Err(found) => {
                // Its name, if it has one, is known: what names it is not
                // reported too.
                if let Some(id) = name_of(&f.text) {
                    broken.insert(format!("agents.{id}"));
                }
                problems.extend(found);
            }
        }
    }
    let codebuff_ctx = codebuff::Context {
        command_tools: &command_tools,
    };
    let mut codebuff_secrets: BTreeMap<String, String> = BTreeMap::new();
    for (path, agent) in evaluated {
        match codebuff::map(&path, &agent.definition, &agent.lines, &codebuff_ctx) {
            Ok(mut m) => {
                codebuff_secrets.extend(m.codebuff_secrets.drain(..));
                m.handler = agent.handler;
                mapped.push((path, m));
            }
            Err(found) => {
                if let Some(id) = agent.definition.get("id").and_then(Value::as_str) {
                    broken.insert(format!("agents.{id}"));
                }
                problems.extend(found);
            }
        }
    }
    if fresh {
        let mut stored: Vec<StoredAgentFile> = markdown
            .iter()
            .map(|f| StoredAgentFile {
                path: f.path.clone(),
                text: match redactions.get_mut(&f.path) {
                    Some(spans) if !spans.is_empty() => {
                        spans.sort_by_key(|(span, _)| span.start);
                        super::redact::splice(&f.text, spans)
                    }
                    _ => f.text.clone(),
                },
                root: None,
                module_only: false,
            })
            .collect();
        for ((root, key), (text, module_only)) in modules {
            stored.push(StoredAgentFile {
                path: Path::new(&root).join(&key).display().to_string(),
                text: codebuff::redact(&text, &key, &codebuff_secrets),
                root: Some(root),
                module_only,
            });
        }
        loaded.stored = stored;
    }
    // A name defined twice: in the config and a file, or in two files.
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let mut unique = Vec::new();
    for (path, m) in mapped {
        let here = format!("{path}:{}", m.line);
        let before = if file.agents.contains_key(&m.id) {
            Some(match text.line(&["agents", &m.id]) {
                Some(line) => format!("{source_name}:{line} ([agents.{}])", m.id),
                None => format!("{source_name} ([agents.{}])", m.id),
            })
        } else {
            seen.get(&m.id).cloned()
        };
        if let Some(before) = before {
            problems.push(Problem {
                file: Some(path.clone()),
                line: Some(m.line),
                key: "name".into(),
                message: format!(
                    "agent {:?} is defined twice: here and at {before}; rename one",
                    m.id
                ),
            });
            continue;
        }
        seen.insert(m.id.clone(), here);
        unique.push((path, m));
    }
    // Whom each spawns, now that every agent is known.
    let mut names: BTreeSet<String> = file.agents.keys().cloned().collect();
    names.extend(unique.iter().map(|(_, m)| m.id.clone()));
    let spawns: BTreeMap<String, Vec<String>> = unique
        .iter()
        .map(|(_, m)| {
            let list = match &m.spawn {
                Spawn::None => Vec::new(),
                Spawn::All => names.iter().filter(|n| **n != m.id).cloned().collect(),
                Spawn::AllBut(but) => names
                    .iter()
                    .filter(|n| **n != m.id && !but.contains(n))
                    .cloned()
                    .collect(),
                Spawn::Some(list) => list.iter().map(|(a, _)| a.clone()).collect(),
            };
            (m.id.clone(), list)
        })
        .collect();
    let models = Models {
        file,
        unique: &unique,
        spawns: &spawns,
    };
    let mut all = models.resolve_all();
    let mut resolved = Vec::new();
    for (path, m) in &unique {
        match all
            .remove(&m.id)
            .unwrap_or_else(|| Err(models::NoModel::NoAgent(m.id.clone())))
        {
            Ok(model) => resolved.push(Some(model)),
            Err(why) => {
                problems.push(Problem {
                    file: Some(path.clone()),
                    line: Some(m.model.line()),
                    key: "model".into(),
                    message: why.to_string(),
                });
                broken.insert(format!("agents.{}", m.id));
                resolved.push(None);
            }
        }
    }
    // When to use each agent, for Codebuff's agents prompt.
    let mut about: BTreeMap<String, Option<String>> = file
        .agents
        .iter()
        .map(|(n, a)| {
            (
                n.clone(),
                a.spawner_prompt.clone().or(a.description.clone()),
            )
        })
        .collect();
    for (_, m) in &unique {
        let said = |key: &str| {
            m.section
                .get(key)
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        about.insert(
            m.id.clone(),
            said("spawner_prompt").or_else(|| said("description")),
        );
    }
    let described: BTreeMap<String, String> = arbor_tools::workspace::all_tools()
        .iter()
        .map(|t| (t.name().to_owned(), t.description().to_owned()))
        .chain(
            file.tools
                .iter()
                .map(|(n, t)| (n.clone(), t.description.clone())),
        )
        .collect();
    for ((path, m), model) in unique.into_iter().zip(resolved) {
        let Some(model) = model else { continue };
        let mut section = m.section;
        if let Value::Object(map) = &mut section {
            map.insert("model".into(), Value::String(model));
            map.insert(
                "spawnable_agents".into(),
                serde_json::json!(spawns.get(&m.id).cloned().unwrap_or_default()),
            );
        }
        let mut agent: AgentSection = match serde_path_to_error::deserialize(section) {
            Ok(agent) => agent,
            Err(e) => {
                let key = e
                    .path()
                    .iter()
                    .next()
                    .map(|s| s.to_string())
                    .unwrap_or_default();
                let (field, line) = m
                    .lines
                    .get(key.as_str())
                    .copied()
                    .unwrap_or(("(definition)", m.line));
                problems.push(Problem {
                    file: Some(path.clone()),
                    line: Some(line),
                    key: field.into(),
                    message: e.inner().to_string(),
                });
                broken.insert(format!("agents.{}", m.id));
                continue;
            }
        };
        if m.placeholders {
            let values = codebuff::Values {
                name: agent.name.as_deref().unwrap_or(&m.id),
                tools: agent
                    .tools
                    .iter()
                    .map(|t| (t.clone(), described.get(t).cloned()))
                    .collect(),
                agents: agent
                    .spawnable_agents
                    .iter()
                    .map(|a| (a.clone(), about.get(a).cloned().flatten()))
                    .collect(),
                max_steps: agent.max_steps,
            };
            let mut emptied = Vec::new();
            let system = codebuff::expand(&agent.system_prompt, &values, &mut emptied);
            let instructions = agent
                .instructions_prompt
                .as_deref()
                .map(|p| codebuff::expand(p, &values, &mut emptied));
            let step = agent
                .step_prompt
                .as_deref()
                .map(|p| codebuff::expand(p, &values, &mut emptied));
            agent.system_prompt = system;
            agent.instructions_prompt = instructions;
            agent.step_prompt = step;
            if !emptied.is_empty() {
                tracing::warn!(
                    "{path}: placeholders Arbor has no value for are replaced with nothing: {}",
                    emptied
                        .iter()
                        .map(|n| format!("{{CODEBUFF_{n}}}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        if let Some(handler) = m.handler {
            loaded.handlers.insert(m.id.clone(), handler);
        }
        for (server, line, definition) in m.servers {
            let taken = if file.mcp_servers.contains_key(&server) {
                Some(match loaded.servers.get(&server) {
                    Some((f, l)) => format!("{f}:{l}"),
                    None => format!("{source_name} ([mcp_servers.{server}])"),
                })
            } else {
                None
            };
            if let Some(taken) = taken {
                problems.push(Problem {
                    file: Some(path.clone()),
                    line: Some(line),
                    key: format!("mcpServers.{server}"),
                    message: format!(
                        "MCP server {server:?} is defined here and at {taken}: name the one \
                         configured (- {server}) or rename this one"
                    ),
                });
                continue;
            }
            match serde_json::from_value(definition) {
                Ok(section) => {
                    file.mcp_servers.insert(server.clone(), section);
                    loaded.servers.insert(server, (path.clone(), line));
                }
                Err(e) => problems.push(Problem {
                    file: Some(path.clone()),
                    line: Some(line),
                    key: format!("mcpServers.{server}"),
                    message: format!("not an MCP server definition Arbor reads: {e}"),
                }),
            }
        }
        if let Some((hooks, _)) = m.hooks {
            loaded.hooks.push((m.id.clone(), hooks, path.clone()));
        }
        loaded.origins.insert(
            m.id.clone(),
            AgentOrigin {
                file: path.clone(),
                line: m.line,
                color: m.color,
            },
        );
        loaded.places.insert(
            m.id.clone(),
            Place {
                file: path,
                line: m.line,
                lines: m.lines,
            },
        );
        file.agents.insert(m.id, agent);
    }
    loaded
}

/// A config's stored text with the agent files it loaded appended, as
/// `[[stored_agent_files]]` tables (read back by [`load`] instead of the
/// directories).
pub(super) fn with_stored(text: &str, files: &[StoredAgentFile]) -> std::sync::Arc<str> {
    #[derive(Serialize)]
    struct Stored<'a> {
        stored_agent_files: &'a [StoredAgentFile],
    }
    let tables = toml::to_string(&Stored {
        stored_agent_files: files,
    })
    .unwrap_or_default();
    let mut out = String::with_capacity(text.len() + tables.len() + 100);
    out.push_str(text);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(
        "\n# The agent files this config loaded, as they were (arbor stores them with a tree).\n",
    );
    out.push_str(&tables);
    std::sync::Arc::from(out)
}

/// A declaration file or a test (`x.d.ts`, `x.test.ts`, `x.spec.js`), which
/// Codebuff's loader does not read as agents either.
fn not_an_agent(path: &Path) -> bool {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    [".d.ts", ".d.mts"].iter().any(|e| name.ends_with(e))
        || name.contains(".test.")
        || name.contains(".spec.")
}

/// The key of stored module `path` under its agents directory `root`
/// (`/`-separated).
fn key_under(root: &str, path: &str) -> String {
    let rel = Path::new(path)
        .strip_prefix(root)
        .unwrap_or_else(|_| Path::new(path));
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

/// A file's `name`, read without the rest (for a file that fails).
fn name_of(text: &str) -> Option<String> {
    let parts = claude::split(text)?.ok()?;
    parts.front.lines().find_map(|l| {
        let value = l.strip_prefix("name:")?.trim().trim_matches(['"', '\'']);
        (!value.is_empty()).then(|| value.to_owned())
    })
}

fn file_problem(file: &str, message: String) -> Problem {
    Problem {
        file: Some(file.to_owned()),
        line: None,
        key: "(file)".into(),
        message,
    }
}

impl Loaded {
    /// Adds each loaded agent's own hooks to `set`; a hook Arbor cannot
    /// run is a problem at its line.
    pub(super) fn add_hooks(
        &self,
        set: &mut crate::tools::hooks::HookSet,
        problems: &mut Vec<Problem>,
    ) {
        for (agent, hooks, file) in &self.hooks {
            if let Err((key, why)) = set.add_agent_hooks(agent, &hooks.to_json()) {
                let path = key_path(key.strip_prefix("hooks").unwrap_or(&key));
                problems.push(Problem {
                    file: Some(file.clone()),
                    line: Some(hooks.line_at(&path)),
                    key,
                    message: why,
                });
            }
        }
    }

    /// Gives each loaded agent's template its program (Codebuff's
    /// `handleSteps`).
    pub(super) fn attach_programs(&self, templates: &mut [arbor_actors::AgentTemplate]) {
        for t in templates {
            if let Some(handler) = self.handlers.get(&t.id) {
                t.handler = Some(Arc::clone(handler));
            }
        }
    }

    /// Whether any loaded agent has hooks of its own.
    pub(super) fn has_hooks(&self) -> bool {
        !self.hooks.is_empty()
    }

    /// Moves each problem the config's checks found in a loaded agent
    /// (`agents.NAME.KEY`) or an inline MCP server (`mcp_servers.NAME.KEY`)
    /// to its file, at the line of the field it came from, named as the
    /// file names it.
    pub(super) fn relocate(&self, problem: &mut Problem) {
        if problem.file.is_some() {
            return;
        }
        if let Some(rest) = problem.key.strip_prefix("agents.") {
            // The longest agent name that the key starts with.
            let found = self
                .places
                .iter()
                .filter(|(id, _)| rest == id.as_str() || rest.starts_with(&format!("{id}.")))
                .max_by_key(|(id, _)| id.len());
            if let Some((id, place)) = found {
                let key = rest[id.len()..].trim_start_matches('.');
                let first = key.split('.').next().unwrap_or("");
                let (field, at) = place
                    .lines
                    .get(first)
                    .copied()
                    .unwrap_or(("name", place.line));
                problem.file = Some(place.file.clone());
                problem.line = Some(at);
                problem.key = field.to_owned();
            }
        } else if let Some(rest) = problem.key.strip_prefix("mcp_servers.") {
            let server = rest.split('.').next().unwrap_or(rest);
            if let Some((file, line)) = self.servers.get(server) {
                problem.file = Some(file.clone());
                problem.line = Some(*line);
                problem.key = format!("mcpServers.{rest}");
            }
        }
    }
}

/// `.PreToolUse[0].hooks[1]` as `["PreToolUse", "0", "hooks", "1"]`.
fn key_path(key: &str) -> Vec<String> {
    key.split(['.', '[', ']'])
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests;

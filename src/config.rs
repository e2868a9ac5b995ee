//! `config.toml`: models, agent templates and limits, parsed into a validated
//! `Config`. Every problem is reported with its file, line and key.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arbor_actors::models::{Latency, ScriptedModel, SimulatedConfig, SimulatedModel};
use arbor_actors::schema::Schema;
use arbor_actors::template::InputSchema;
use arbor_actors::{AgentTemplate, FailurePolicy, OutputMode};
use arbor_supervisor::{Catalog, ToolPolicy, ToolRule, TreeLimits, check_pattern};

use crate::providers::{HttpModel, HttpSection, ProviderKind, ProviderSettings};
use crate::tools::ToolSet;
use crate::tools::command::{CommandTool, CommandToolSection};
use crate::tools::mcp::{McpServerSection, McpSettings};
use serde::Deserialize;
use serde_json::Value;

/// The configuration a fresh checkout runs with (the repository's `config.toml`).
pub const DEFAULT_CONFIG: &str = include_str!("../config.toml");
/// How the embedded default is named in messages.
pub const DEFAULT_CONFIG_NAME: &str = "<built-in config.toml>";

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default)]
    pub run: RunSection,
    #[serde(default)]
    pub limits: LimitsSection,
    #[serde(default)]
    pub models: BTreeMap<String, ModelSection>,
    #[serde(default)]
    pub agents: BTreeMap<String, AgentSection>,
    #[serde(default)]
    pub store: StoreSection,
    #[serde(default)]
    pub service: ServiceSection,
    /// MCP servers whose tools templates may name as `NAME/*` or `NAME/TOOL`.
    #[serde(default)]
    pub mcp_servers: BTreeMap<String, McpServerSection>,
    /// Command tools: programs on this machine, called with an argv template.
    #[serde(default)]
    pub tools: BTreeMap<String, CommandToolSection>,
    /// Which tools any tree may use, whatever its templates list.
    #[serde(default)]
    pub policy: PolicySection,
}

/// `[policy]`: patterns over tool names (`fs/*`, `fs/write_*`, `rg`) that cap
/// every template. A start request can narrow them for one tree, never widen.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySection {
    /// Only tools matching one of these (absent: every tool).
    pub allow_tools: Option<Vec<String>>,
    /// No tool matching one of these.
    #[serde(default)]
    pub deny_tools: Vec<String>,
}

impl PolicySection {
    pub fn rule(&self) -> ToolRule {
        ToolRule {
            allow: self.allow_tools.clone(),
            deny: self.deny_tools.clone(),
        }
    }
}

/// `arbor serve`: where it listens and who may call it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSection {
    /// Address to listen on; a non-loopback one needs tokens.
    #[serde(default = "default_bind")]
    pub bind: String,
    /// The environment variable holding the API's bearer tokens, comma-separated.
    /// (Tokens are never written in the config file.)
    #[serde(default = "default_tokens_env")]
    pub tokens_env: String,
    /// Largest request body, in bytes.
    #[serde(default = "default_body_limit")]
    pub body_limit: usize,
    /// How long a shutdown waits for the store to take what is in flight.
    #[serde(default = "default_shutdown_timeout")]
    pub shutdown_timeout: String,
    /// Trees running at once; a start beyond it is refused with 503.
    #[serde(default = "default_max_running_trees")]
    pub max_running_trees: usize,
    /// How long a client has to send a whole request head (also the most a
    /// kept-alive connection waits for its next request).
    #[serde(default = "default_header_read_timeout")]
    pub header_read_timeout: String,
    /// A connection on which no byte moves for this long is closed.
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout: String,
    /// Connections open at once (kept under the open-files limit).
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Event streams open at once, over every tree; more get 503.
    #[serde(default = "default_max_event_streams")]
    pub max_event_streams: usize,
    /// Event streams open at once on one tree; more get 429.
    #[serde(default = "default_max_event_streams_per_tree")]
    pub max_event_streams_per_tree: usize,
    /// Send traces (agent, step, tool and request spans) to this OpenTelemetry
    /// collector's OTLP/HTTP traces URL, e.g. `http://127.0.0.1:4318/v1/traces`.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
}

impl Default for ServiceSection {
    fn default() -> Self {
        ServiceSection {
            bind: default_bind(),
            tokens_env: default_tokens_env(),
            body_limit: default_body_limit(),
            shutdown_timeout: default_shutdown_timeout(),
            max_running_trees: default_max_running_trees(),
            header_read_timeout: default_header_read_timeout(),
            idle_timeout: default_idle_timeout(),
            max_connections: default_max_connections(),
            max_event_streams: default_max_event_streams(),
            max_event_streams_per_tree: default_max_event_streams_per_tree(),
            otlp_endpoint: None,
        }
    }
}

/// `[service]`, validated and typed by `check_service` (each value within
/// its documented range), for `ServiceOptions` and the server's limits.
#[derive(Clone, Debug)]
pub struct ServiceSettings {
    pub shutdown_timeout: std::time::Duration,
    pub limits: crate::service::ServiceLimits,
}

impl Default for ServiceSettings {
    fn default() -> Self {
        ServiceSettings {
            shutdown_timeout: std::time::Duration::from_secs(10),
            limits: crate::service::ServiceLimits::default(),
        }
    }
}

fn default_bind() -> String {
    "127.0.0.1:8080".into()
}

fn default_tokens_env() -> String {
    "ARBOR_API_TOKENS".into()
}

fn default_body_limit() -> usize {
    1 << 20
}

fn default_shutdown_timeout() -> String {
    "10s".into()
}

fn default_max_running_trees() -> usize {
    1000
}

fn default_header_read_timeout() -> String {
    "10s".into()
}

fn default_idle_timeout() -> String {
    "60s".into()
}

fn default_max_connections() -> usize {
    crate::service::ServiceLimits::default().max_connections
}

fn default_max_event_streams() -> usize {
    crate::service::ServiceLimits::default().max_event_streams
}

fn default_max_event_streams_per_tree() -> usize {
    crate::service::ServiceLimits::default().max_event_streams_per_tree
}

/// Where runs are kept (`arbor runs`, `resume`, `replay`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSection {
    /// Whether `arbor run` stores its trees.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// The SQLite file, relative to the working directory.
    #[serde(default = "default_store_path")]
    pub path: PathBuf,
}

impl Default for StoreSection {
    fn default() -> Self {
        StoreSection {
            enabled: true,
            path: default_store_path(),
        }
    }
}

fn default_true() -> bool {
    true
}

fn default_store_path() -> PathBuf {
    PathBuf::from("arbor.db")
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSection {
    /// The agent `arbor run` starts when `--agent` is not given.
    pub agent: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    pub max_depth: Option<usize>,
    pub max_children_per_call: Option<usize>,
    pub max_live_agents: Option<usize>,
    pub max_agents: Option<usize>,
    pub max_steps: Option<u64>,
    pub max_tokens: Option<u64>,
    pub max_credits: Option<f64>,
    pub deadline: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "provider", rename_all = "lowercase")]
pub enum ModelSection {
    Simulated(SimulatedSection),
    Scripted(ScriptedSection),
    /// The OpenAI Chat Completions API (and compatible servers).
    Openai(HttpSection),
    /// The Anthropic Messages API.
    Anthropic(HttpSection),
}

impl ModelSection {
    pub fn provider(&self) -> &'static str {
        match self {
            ModelSection::Simulated(_) => "simulated",
            ModelSection::Scripted(_) => "scripted",
            ModelSection::Openai(_) => "openai",
            ModelSection::Anthropic(_) => "anthropic",
        }
    }

    /// One line describing the model, without secrets.
    pub fn describe(&self) -> String {
        match self {
            ModelSection::Simulated(s) => format!(
                "fanout {} depth {} latency {} reply {} tokens",
                s.fanout, s.depth, s.latency, s.reply_tokens
            ),
            ModelSection::Scripted(s) => format!("script {}", s.file.display()),
            ModelSection::Openai(s) | ModelSection::Anthropic(s) => format!(
                "{} at {} (key from {}){}",
                s.model,
                s.base_url.as_deref().unwrap_or("the default URL"),
                s.api_key_env.as_deref().unwrap_or("no variable"),
                if s.stream { ", streaming" } else { "" }
            ),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimulatedSection {
    #[serde(default = "default_fanout")]
    pub fanout: usize,
    #[serde(default = "default_depth")]
    pub depth: usize,
    #[serde(default = "default_latency")]
    pub latency: String,
    #[serde(default = "default_reply_tokens")]
    pub reply_tokens: usize,
    /// Children per level (e.g. `[10, 10, 5]`), instead of `fanout` and `depth`.
    pub shape: Option<Vec<usize>>,
}

fn default_fanout() -> usize {
    3
}
fn default_depth() -> usize {
    2
}
fn default_latency() -> String {
    "0".into()
}
fn default_reply_tokens() -> usize {
    40
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedSection {
    /// The script (JSON), relative to the config file.
    pub file: PathBuf,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSection {
    pub name: Option<String>,
    /// What this agent is for (its parents' spawn tools tell their model).
    pub description: Option<String>,
    /// When a parent should spawn it.
    pub spawner_prompt: Option<String>,
    /// A user message added after the prompt.
    pub instructions_prompt: Option<String>,
    /// A short user message added to every model request (not stored).
    pub step_prompt: Option<String>,
    pub model: String,
    #[serde(default)]
    pub system_prompt: String,
    #[serde(default)]
    pub tools: Vec<String>,
    #[serde(default)]
    pub spawnable_agents: Vec<String>,
    #[serde(default)]
    pub output_mode: OutputMode,
    pub output_schema: Option<Value>,
    pub input_schema: Option<InputSchemaSection>,
    #[serde(default)]
    pub include_message_history: bool,
    #[serde(default)]
    pub inherit_parent_system_prompt: bool,
    #[serde(default = "default_max_steps")]
    pub max_steps: u32,
    pub step_timeout: Option<String>,
    pub context_window: Option<u64>,
    #[serde(default)]
    pub failure: FailureSection,
}

fn default_max_steps() -> u32 {
    20
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputSchemaSection {
    pub prompt: Option<Value>,
    pub params: Option<Value>,
}

/// `"report"`, `"escalate"` or `{ retry = { max = 2, backoff = "500ms" } }`.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum FailureSection {
    Named(String),
    Retry { retry: RetrySection },
}

impl Default for FailureSection {
    fn default() -> Self {
        FailureSection::Named("report".into())
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySection {
    pub max: u32,
    pub backoff: String,
}

/// One problem in a config file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub line: Option<usize>,
    pub key: String,
    pub message: String,
}

/// A config that cannot be used, with every problem found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    pub file: String,
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            match p.line {
                Some(line) => write!(f, "{}:{line}: {}: {}", self.file, p.key, p.message)?,
                None => write!(f, "{}: {}: {}", self.file, p.key, p.message)?,
            }
        }
        Ok(())
    }
}

/// A parsed and validated config, ready to build a catalog from.
#[derive(Clone, Debug)]
pub struct Config {
    pub file: ConfigFile,
    /// Where relative paths (scripts) are resolved.
    pub base_dir: PathBuf,
    /// The name used in messages (the path, or the built-in marker).
    pub source: String,
    pub limits: TreeLimits,
    pub templates: Vec<AgentTemplate>,
    /// The MCP servers, validated (started only by a runtime that needs them).
    pub mcp_servers: BTreeMap<String, McpSettings>,
    /// The command tools, built.
    pub command_tools: Vec<Arc<CommandTool>>,
    /// `[service]`, validated and typed.
    pub service: ServiceSettings,
    /// What trees started from this config store with them (see
    /// [`Config::snapshot`]).
    snapshot: Arc<str>,
    /// Template tool entries nothing in the file provides: problems unless a
    /// tool registered in code has that name (see [`Config::check_tools`]).
    unresolved_tools: Vec<(String, Problem)>,
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let source = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: source.clone(),
            problems: vec![Problem {
                line: None,
                key: "(file)".into(),
                message: format!("cannot read: {e}"),
            }],
        })?;
        let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::parse(&text, &source, base_dir)
    }

    /// The built-in default config.
    pub fn default_config() -> Result<Config, ConfigError> {
        Self::parse(DEFAULT_CONFIG, DEFAULT_CONFIG_NAME, PathBuf::from("."))
    }

    /// Parses and validates config text; `source` names it in errors.
    pub fn parse(text: &str, source: &str, base_dir: PathBuf) -> Result<Config, ConfigError> {
        let error = |problems| ConfigError {
            file: source.to_owned(),
            problems,
        };
        let (file, mut problems, broken) = parse_file(text).map_err(|p| error(vec![p]))?;
        let mut limits = limits(&file.limits, text, &mut problems);
        let rule = file.policy.rule();
        for (key, patterns) in [
            (
                "allow_tools",
                file.policy.allow_tools.clone().unwrap_or_default(),
            ),
            ("deny_tools", file.policy.deny_tools.clone()),
        ] {
            for pattern in patterns {
                if let Err(why) = check_pattern(&pattern) {
                    problems.push(at(
                        text,
                        "policy",
                        key,
                        format!("pattern {pattern:?}: {why}"),
                    ));
                }
            }
        }
        limits.tools = ToolPolicy::new(rule);
        let mcp_servers = mcp_servers(&file, &base_dir, text, &mut problems);
        let command_tools = command_tools(&file, &base_dir, text, &mut problems);
        let mut unresolved_tools = Vec::new();
        let templates = templates(&file, &broken, text, &mut problems, &mut unresolved_tools);
        check_graph(&file, &limits, text, &mut problems);
        check_models(&file, &base_dir, text, &mut problems);
        if file.store.path.as_os_str().is_empty() {
            problems.push(at(
                text,
                "store",
                "path",
                "must name a file (to store nothing, set enabled = false)".into(),
            ));
        }
        let service = check_service(&file.service, text, &mut problems);
        if let Some(agent) = &file.run.agent
            && !file.agents.contains_key(agent)
            && !broken.contains(&format!("agents.{agent}"))
        {
            problems.push(at(
                text,
                "run",
                "agent",
                format!("no agent named {agent:?}"),
            ));
        }
        if !problems.is_empty() {
            // The file fails anyway: report the tool names nothing in it
            // provides too, so one check shows every problem.
            problems.extend(unresolved_tools.into_iter().map(|(_, p)| p));
            problems.sort_by_key(|p| p.line);
            return Err(error(problems));
        }
        Ok(Config {
            file,
            base_dir,
            snapshot: redacted(text),
            source: source.to_owned(),
            limits,
            templates,
            mcp_servers,
            command_tools,
            service,
            unresolved_tools,
        })
    }

    /// Checks that every tool a template names is provided: by the file
    /// (built-ins, `[tools]`, `[mcp_servers]`) or by a tool registered in code
    /// under one of `code_tools`. Each unprovided name is a problem at its line.
    pub fn check_tools(&self, code_tools: &[&str]) -> Result<(), ConfigError> {
        let problems: Vec<Problem> = self
            .unresolved_tools
            .iter()
            .filter(|(name, _)| !code_tools.contains(&name.as_str()))
            .map(|(_, p)| p.clone())
            .collect();
        if problems.is_empty() {
            return Ok(());
        }
        Err(ConfigError {
            file: self.source.clone(),
            problems,
        })
    }

    /// The tools this config declares, for one runtime: its MCP servers (not
    /// started yet: a tree that needs one starts it) and its command tools.
    pub fn tool_set(&self) -> ToolSet {
        ToolSet::new(&self.mcp_servers, self.command_tools.clone())
    }

    /// Where this config came from, to record with a stored tree (so it can be
    /// resumed and replayed with the same templates): its file's full path,
    /// or `None` for the built-in one.
    pub fn origin(&self) -> Option<String> {
        if self.source == DEFAULT_CONFIG_NAME {
            return None;
        }
        std::fs::canonicalize(&self.source)
            .ok()
            .map(|p| p.display().to_string())
    }

    /// What a tree started from this config stores with it, so that resume
    /// and replay run it on what it started with: the file's text, every
    /// literal header value of a `[models]` entry removed (it may be a
    /// credential; API keys come from environment variables and are never in
    /// it). [`Config::from_snapshot`] reads it back.
    pub fn snapshot(&self) -> Arc<str> {
        self.snapshot.clone()
    }

    /// The config a tree stored (`snapshot`), read back as it was: removed
    /// header values are taken from `current` (the same model's same
    /// header), or left out with a warning. Relative paths (a script) are
    /// resolved against `base_dir`.
    pub fn from_snapshot(
        snapshot: &str,
        tree_id: &str,
        base_dir: PathBuf,
        current: Option<&Config>,
    ) -> Result<Config, ConfigError> {
        let mut config = Config::parse(
            snapshot,
            &format!("<the config tree {tree_id} started with>"),
            base_dir,
        )?;
        for (name, model) in config.file.models.iter_mut() {
            let (ModelSection::Openai(section) | ModelSection::Anthropic(section)) = model else {
                continue;
            };
            let theirs = current.and_then(|c| match c.file.models.get(name) {
                Some(ModelSection::Openai(s) | ModelSection::Anthropic(s)) => Some(&s.headers),
                _ => None,
            });
            section.headers.retain(|header, value| {
                if value != REDACTED {
                    return true;
                }
                match theirs.and_then(|h| h.get(header)) {
                    Some(now) => {
                        value.clone_from(now);
                        true
                    }
                    None => {
                        tracing::warn!(
                            tree = tree_id,
                            model = %name,
                            header = %header,
                            "the header's value is not stored with the tree and the current \
                             config has none: sent without it"
                        );
                        false
                    }
                }
            });
        }
        config.snapshot = Arc::from(snapshot);
        Ok(config)
    }

    /// The agent `arbor run` starts by default.
    pub fn default_agent(&self) -> Option<&str> {
        self.file
            .run
            .agent
            .as_deref()
            .or_else(|| self.file.agents.keys().next().map(String::as_str))
    }

    /// Builds the models and the catalog (with a tool set of its own).
    pub fn catalog(&self) -> Result<Catalog, ConfigError> {
        self.catalog_with(&self.tool_set(), &[])
    }

    /// Builds the models and the catalog over `tools` and the tools registered
    /// in code (which templates may name).
    pub fn catalog_with(
        &self,
        tools: &ToolSet,
        code_tools: &[Arc<dyn arbor_actors::Tool>],
    ) -> Result<Catalog, ConfigError> {
        let names: Vec<&str> = code_tools.iter().map(|t| t.name()).collect();
        self.check_tools(&names)?;
        let mut builder = tools.register(Catalog::builder());
        for tool in code_tools {
            builder = builder.tool(tool.clone());
        }
        for (name, section) in &self.file.models {
            let model: Arc<dyn arbor_actors::Model> = match section {
                ModelSection::Simulated(s) => Arc::new(SimulatedModel::new(
                    name,
                    simulated_config(s).map_err(|m| self.problem("models", name, "latency", m))?,
                )),
                ModelSection::Scripted(s) => Arc::new(
                    ScriptedModel::from_file(name, &self.base_dir.join(&s.file))
                        .map_err(|e| self.problem("models", name, "file", e.to_string()))?,
                ),
                ModelSection::Openai(s) => {
                    Arc::new(self.http_model(name, ProviderKind::OpenAi, s)?)
                }
                ModelSection::Anthropic(s) => {
                    Arc::new(self.http_model(name, ProviderKind::Anthropic, s)?)
                }
            };
            builder = builder.model_as(name, model);
        }
        for template in &self.templates {
            builder = builder.template(template.clone());
        }
        builder.build().map_err(|e| ConfigError {
            file: self.source.clone(),
            problems: vec![Problem {
                line: None,
                key: "agents".into(),
                message: e.to_string(),
            }],
        })
    }

    /// The HTTP model of `[models.NAME]`; the key is read from the environment now.
    pub fn http_model(
        &self,
        name: &str,
        kind: ProviderKind,
        section: &HttpSection,
    ) -> Result<HttpModel, ConfigError> {
        let settings = ProviderSettings::from_section(kind, section)
            .map_err(|(key, message)| self.problem("models", name, &key, message))?;
        HttpModel::new(name, settings)
            .map_err(|message| self.problem("models", name, "provider", message))
    }

    fn problem(&self, table: &str, name: &str, key: &str, message: String) -> ConfigError {
        ConfigError {
            file: self.source.clone(),
            problems: vec![Problem {
                line: None,
                key: format!("{table}.{name}.{key}"),
                message,
            }],
        }
    }
}

fn simulated_config(s: &SimulatedSection) -> Result<SimulatedConfig, String> {
    Ok(SimulatedConfig {
        shape: s.shape.clone().unwrap_or_else(|| vec![s.fanout; s.depth]),
        latency: Latency::parse(&s.latency)?,
        reply_tokens: s.reply_tokens,
    })
}

/// Parses TOML into the file structure, reporting every problem it can
/// find, each with its key and line: a value of the wrong type is dropped and
/// the rest of its table read on, so one `check-config` shows them all. An
/// entry that cannot be read at all (a required key missing) is left out and
/// its name returned in `broken`, so that what names it is not reported too.
fn parse_file(text: &str) -> Result<(ConfigFile, Vec<Problem>, HashSet<String>), Problem> {
    let root: toml::Table = toml::from_str(text).map_err(|e| Problem {
        line: e.span().map(|s| line_of(text, s.start)),
        key: "(syntax)".into(),
        message: e.message().trim().to_owned(),
    })?;
    let mut reader = Reader {
        text,
        problems: Vec::new(),
        broken: HashSet::new(),
    };
    let mut file = ConfigFile::default();
    for (key, value) in root {
        match key.as_str() {
            "run" => reader.section(&key, value, &mut file.run),
            "limits" => reader.section(&key, value, &mut file.limits),
            "store" => reader.section(&key, value, &mut file.store),
            "service" => reader.section(&key, value, &mut file.service),
            "policy" => reader.section(&key, value, &mut file.policy),
            "models" => {
                for (name, entry) in reader.entries(&key, value) {
                    if let Some(model) = reader.model(&name, entry) {
                        file.models.insert(name, model);
                    }
                }
            }
            "agents" => reader.map(&key, value, &mut file.agents),
            "mcp_servers" => reader.map(&key, value, &mut file.mcp_servers),
            "tools" => reader.map(&key, value, &mut file.tools),
            _ => reader.problems.push(Problem {
                line: locate_path(text, &[key.as_str()]),
                key: key.clone(),
                message: format!(
                    "unknown section `{key}` (run, limits, models, agents, store, service, \
                     mcp_servers, tools, policy)"
                ),
            }),
        }
    }
    Ok((file, reader.problems, reader.broken))
}

/// What a header value removed from a stored config reads.
const REDACTED: &str = "(not stored)";

/// `text` with the value of every `[models.NAME.headers]` entry replaced by
/// [`REDACTED`], found by the TOML parser's spans (so the rest of the text,
/// its comments and its lines, stay as they were).
fn redacted(text: &str) -> Arc<str> {
    use toml::de::{DeTable, DeValue};
    let Ok(root) = DeTable::parse(text) else {
        return Arc::from(text);
    };
    let mut spans = Vec::new();
    let models = root.get_ref().iter().find(|(k, _)| k.get_ref() == "models");
    if let Some((_, models)) = models
        && let DeValue::Table(models) = models.get_ref()
    {
        for (_, model) in models.iter() {
            let DeValue::Table(model) = model.get_ref() else {
                continue;
            };
            if let Some((_, headers)) = model.iter().find(|(k, _)| k.get_ref() == "headers")
                && let DeValue::Table(headers) = headers.get_ref()
            {
                spans.extend(
                    headers
                        .iter()
                        .filter(|(_, v)| matches!(v.get_ref(), DeValue::String(_)))
                        .map(|(_, v)| v.span()),
                );
            }
        }
    }
    if spans.is_empty() {
        return Arc::from(text);
    }
    spans.sort_by_key(|s| s.start);
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for span in spans {
        out.push_str(&text[at..span.start]);
        out.push_str(&format!("{REDACTED:?}"));
        at = span.end;
    }
    out.push_str(&text[at..]);
    Arc::from(out)
}

/// Reads the file's tables one entry at a time, collecting problems.
struct Reader<'t> {
    text: &'t str,
    problems: Vec<Problem>,
    broken: HashSet<String>,
}

impl Reader<'_> {
    /// Deserializes `value` (at `path`); a bad key is reported and removed,
    /// and the rest read again, until it reads or cannot be read at all.
    fn read<T: serde::de::DeserializeOwned>(
        &mut self,
        path: &[&str],
        mut value: toml::Value,
    ) -> Option<T> {
        loop {
            match serde_path_to_error::deserialize::<_, T>(value.clone()) {
                Ok(t) => return Some(t),
                Err(e) => {
                    let inner: Vec<String> = e
                        .path()
                        .iter()
                        .filter_map(|s| match s {
                            serde_path_to_error::Segment::Map { key } => Some(key.clone()),
                            serde_path_to_error::Segment::Seq { index } => Some(index.to_string()),
                            _ => None,
                        })
                        .collect();
                    let full: Vec<&str> = path
                        .iter()
                        .copied()
                        .chain(inner.iter().map(String::as_str))
                        .collect();
                    let message = e.into_inner().message().trim().to_owned();
                    self.problems.push(Problem {
                        line: locate_path(self.text, &full),
                        key: full.join("."),
                        message,
                    });
                    if inner.is_empty() || !remove(&mut value, &inner) {
                        return None;
                    }
                }
            }
        }
    }

    fn section<T: serde::de::DeserializeOwned>(
        &mut self,
        key: &str,
        value: toml::Value,
        into: &mut T,
    ) {
        if let Some(section) = self.read(&[key], value) {
            *into = section;
        }
    }

    /// The named entries of a table of tables (`[agents.NAME]`).
    fn entries(&mut self, key: &str, value: toml::Value) -> Vec<(String, toml::Value)> {
        match value {
            toml::Value::Table(table) => table.into_iter().collect(),
            other => {
                self.problems.push(Problem {
                    line: locate_path(self.text, &[key]),
                    key: key.to_owned(),
                    message: format!(
                        "must be a table of named entries, not a {}",
                        other.type_str()
                    ),
                });
                Vec::new()
            }
        }
    }

    fn map<T: serde::de::DeserializeOwned>(
        &mut self,
        key: &str,
        value: toml::Value,
        into: &mut BTreeMap<String, T>,
    ) {
        for (name, entry) in self.entries(key, value) {
            match self.read(&[key, name.as_str()], entry) {
                Some(t) => {
                    into.insert(name, t);
                }
                None => {
                    self.broken.insert(format!("{key}.{name}"));
                }
            }
        }
    }

    /// `[models.NAME]`: its `provider` picks the table's shape.
    fn model(&mut self, name: &str, value: toml::Value) -> Option<ModelSection> {
        let path = ["models", name];
        let mut table = match value {
            toml::Value::Table(t) => t,
            other => {
                self.problems.push(Problem {
                    line: locate_path(self.text, &path),
                    key: path.join("."),
                    message: format!("must be a table, not a {}", other.type_str()),
                });
                return None;
            }
        };
        let provider = table.remove("provider");
        let known = "simulated, scripted, openai, anthropic";
        let problem = |message: String| Problem {
            line: locate_path(self.text, &["models", name, "provider"])
                .or_else(|| locate_path(self.text, &path)),
            key: format!("models.{name}.provider"),
            message,
        };
        let rest = toml::Value::Table(table);
        let model = match provider.as_ref().and_then(toml::Value::as_str) {
            Some("simulated") => self.read(&path, rest).map(ModelSection::Simulated),
            Some("scripted") => self.read(&path, rest).map(ModelSection::Scripted),
            Some("openai") => self.read(&path, rest).map(ModelSection::Openai),
            Some("anthropic") => self.read(&path, rest).map(ModelSection::Anthropic),
            Some(other) => {
                self.problems
                    .push(problem(format!("unknown provider {other:?} ({known})")));
                None
            }
            None => {
                self.problems
                    .push(problem(format!("missing: say which provider ({known})")));
                None
            }
        };
        if model.is_none() {
            self.broken.insert(format!("models.{name}"));
        }
        model
    }
}

/// Removes the value at `path` inside `value`; whether there was one.
fn remove(value: &mut toml::Value, path: &[String]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut current = value;
    for segment in parents {
        current = match current {
            toml::Value::Table(t) => match t.get_mut(segment) {
                Some(v) => v,
                None => return false,
            },
            toml::Value::Array(a) => match segment.parse::<usize>().ok().and_then(|i| a.get_mut(i))
            {
                Some(v) => v,
                None => return false,
            },
            _ => return false,
        };
    }
    match current {
        toml::Value::Table(t) => t.remove(last).is_some(),
        toml::Value::Array(a) => match last.parse::<usize>() {
            Ok(i) if i < a.len() => {
                // The array cannot lose an element without shifting the
                // others' indices; drop it whole instead.
                a.clear();
                true
            }
            _ => false,
        },
        _ => false,
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// A problem at `table.name.key`, with the line where that key (or table) is.
fn at(text: &str, table: &str, key: &str, message: String) -> Problem {
    Problem {
        line: locate(text, table, key),
        key: format!("{table}.{key}"),
        message,
    }
}

/// The line of `key` inside `[table]` (or of the table's own key, in its
/// header). `table` is `SECTION` or `SECTION.NAME` (the name may hold dots,
/// as a version does).
fn locate(text: &str, table: &str, key: &str) -> Option<usize> {
    let mut path: Vec<&str> = match table.split_once('.') {
        Some((section, name)) => vec![section, name],
        None => vec![table],
    };
    path.push(key);
    locate_path(text, &path)
}

/// The line of the deepest key of `path` the file has, from the TOML
/// parser's spans: quoted keys (`[agents."acme/writer@1"]`), dotted ones and
/// array elements find their line too.
fn locate_path(text: &str, path: &[&str]) -> Option<usize> {
    use toml::de::{DeTable, DeValue};
    let root = DeTable::parse(text).ok()?;
    let mut current = DeValue::Table(root.get_ref().clone());
    let mut at = None;
    for segment in path {
        let next = match &current {
            DeValue::Table(t) => t
                .iter()
                .find(|(k, _)| k.get_ref().as_ref() == *segment)
                .map(|(k, v)| (k.span().start, v.get_ref().clone())),
            DeValue::Array(a) => segment
                .parse::<usize>()
                .ok()
                .and_then(|i| a.get(i))
                .map(|v| (v.span().start, v.get_ref().clone())),
            _ => None,
        };
        match next {
            Some((start, value)) => {
                at = Some(start);
                current = value;
            }
            None => break,
        }
    }
    at.map(|start| line_of(text, start))
}

/// A duration key within `range` (inclusive), or its problem.
fn duration_in(
    text: &str,
    table: &str,
    key: &str,
    value: &Option<String>,
    range: (std::time::Duration, std::time::Duration),
    problems: &mut Vec<Problem>,
) -> Option<std::time::Duration> {
    let value = value.as_ref()?;
    match arbor_actors::duration::parse(value)
        .map_err(|e| e.to_string())
        .and_then(|d| arbor_actors::duration::within(d, range.0, range.1))
    {
        Ok(d) => Some(d),
        Err(e) => {
            problems.push(at(text, table, key, e));
            None
        }
    }
}

/// A number key within `min..=max`, or its problem (NaN is outside every range).
fn number<T: PartialOrd + fmt::Display + Copy>(
    text: &str,
    table: &str,
    key: &str,
    value: Option<T>,
    (min, max): (T, T),
    problems: &mut Vec<Problem>,
) {
    if let Some(v) = value
        && !(v >= min && v <= max)
    {
        problems.push(at(
            text,
            table,
            key,
            format!("{v} is out of range: must be from {min} to {max}"),
        ));
    }
}

/// The documented range of the agent and simulated-model keys (docs/config.md
/// lists every key's; `[limits]` ranges are the supervisor's, `[service]`'s
/// are in `check_service`).
pub mod ranges {
    use std::time::Duration;

    const MS: Duration = Duration::from_millis(1);
    const HOUR: Duration = Duration::from_secs(3600);
    const DAY: Duration = Duration::from_secs(86_400);

    pub const AGENT_MAX_STEPS: (u32, u32) = (1, 100_000);
    pub const STEP_TIMEOUT: (Duration, Duration) = (MS, DAY);
    pub const CONTEXT_WINDOW: (u64, u64) = (256, 100_000_000);
    pub const RETRY_MAX: (u32, u32) = (0, 100);
    pub const RETRY_BACKOFF: (Duration, Duration) = (Duration::ZERO, HOUR);
    pub const FANOUT: (usize, usize) = (0, 10_000);
    pub const DEPTH: (usize, usize) = (0, 100);
    pub const REPLY_TOKENS: (usize, usize) = (0, 100_000);
    /// A simulated model's whole tree, root included.
    pub const SIMULATED_AGENTS: u64 = 100_000_000;
}

/// Checks `[service]`, each numeric and duration key against its range
/// (README's service section lists them), and gives the typed values.
fn check_service(
    service: &ServiceSection,
    text: &str,
    problems: &mut Vec<Problem>,
) -> ServiceSettings {
    use std::time::Duration;
    let defaults = ServiceSettings::default();
    if let Err(e) = service.bind.parse::<std::net::SocketAddr>() {
        problems.push(at(
            text,
            "service",
            "bind",
            format!(
                "{:?} is not an address like 127.0.0.1:8080 ({e})",
                service.bind
            ),
        ));
    }
    // A duration within [min, max], or the default after a problem.
    let mut within = |key: &str, value: &String, min: Duration, max: Duration, default| {
        duration_in(
            text,
            "service",
            key,
            &Some(value.clone()),
            (min, max),
            problems,
        )
        .unwrap_or(default)
    };
    let secs = Duration::from_secs;
    let shutdown_timeout = within(
        "shutdown_timeout",
        &service.shutdown_timeout,
        Duration::ZERO,
        secs(3600),
        defaults.shutdown_timeout,
    );
    let header_read_timeout = within(
        "header_read_timeout",
        &service.header_read_timeout,
        Duration::from_millis(100),
        secs(300),
        defaults.limits.header_read_timeout,
    );
    let idle_timeout = within(
        "idle_timeout",
        &service.idle_timeout,
        secs(1),
        secs(3600),
        defaults.limits.idle_timeout,
    );
    // A count within [min, max], or the default after a problem.
    let mut count =
        |key: &str, value: usize, min: usize, max: usize, unit: &str, default: usize| {
            if value < min {
                problems.push(at(
                    text,
                    "service",
                    key,
                    format!("must be at least {min}{unit}"),
                ));
                default
            } else if value > max {
                problems.push(at(
                    text,
                    "service",
                    key,
                    format!("must be at most {max}{unit} (got {value})"),
                ));
                default
            } else {
                value
            }
        };
    count(
        "body_limit",
        service.body_limit,
        1024,
        64 << 20,
        " bytes",
        1 << 20,
    );
    count(
        "max_running_trees",
        service.max_running_trees,
        1,
        100_000,
        "",
        1000,
    );
    let max_connections = count(
        "max_connections",
        service.max_connections,
        1,
        1_000_000,
        "",
        defaults.limits.max_connections,
    );
    let max_event_streams = count(
        "max_event_streams",
        service.max_event_streams,
        1,
        100_000,
        "",
        defaults.limits.max_event_streams,
    );
    let max_event_streams_per_tree = count(
        "max_event_streams_per_tree",
        service.max_event_streams_per_tree,
        1,
        max_event_streams,
        " (max_event_streams)",
        defaults
            .limits
            .max_event_streams_per_tree
            .min(max_event_streams),
    );
    if let Some(endpoint) = &service.otlp_endpoint {
        let ok = endpoint
            .strip_prefix("http://")
            .or_else(|| endpoint.strip_prefix("https://"))
            .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'));
        if !ok {
            problems.push(at(
                text,
                "service",
                "otlp_endpoint",
                format!("{endpoint:?} is not an http(s) URL like http://127.0.0.1:4318/v1/traces"),
            ));
        }
    }
    if service.tokens_env.is_empty() {
        problems.push(at(
            text,
            "service",
            "tokens_env",
            "must name an environment variable".into(),
        ));
    }
    ServiceSettings {
        shutdown_timeout,
        limits: crate::service::ServiceLimits {
            header_read_timeout,
            idle_timeout,
            max_connections,
            max_event_streams,
            max_event_streams_per_tree,
        },
    }
}

fn limits(section: &LimitsSection, text: &str, problems: &mut Vec<Problem>) -> TreeLimits {
    let t = "limits";
    let mut deadline_problem = Vec::new();
    let limits = TreeLimits {
        max_depth: section.max_depth,
        max_children_per_call: section.max_children_per_call,
        max_live_agents: section.max_live_agents,
        max_agents: section.max_agents,
        max_steps: section.max_steps,
        max_tokens: section.max_tokens,
        max_credits: section.max_credits,
        deadline: duration_in(
            text,
            t,
            "deadline",
            &section.deadline,
            (Duration::ZERO, Duration::MAX),
            &mut deadline_problem,
        ),
        tools: ToolPolicy::default(),
    };
    problems.extend(deadline_problem);
    for (key, problem) in limits.problems() {
        problems.push(at(text, t, key, problem));
    }
    limits
}

/// A name for a server or a command tool: what fits a tool name on the wire.
fn check_tool_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 48 {
        return Err("must have 1 to 48 characters".into());
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err("may hold only letters, digits, '_' and '-'".into());
    }
    Ok(())
}

fn mcp_servers(
    file: &ConfigFile,
    base_dir: &Path,
    text: &str,
    problems: &mut Vec<Problem>,
) -> BTreeMap<String, McpSettings> {
    let mut out = BTreeMap::new();
    for (name, section) in &file.mcp_servers {
        let table = format!("mcp_servers.{name}");
        if let Err(why) = check_tool_name(name) {
            problems.push(at(
                text,
                "mcp_servers",
                name,
                format!("server name {name:?} {why}"),
            ));
            continue;
        }
        match section.settings(name, base_dir) {
            Ok(settings) => {
                out.insert(name.clone(), settings);
            }
            Err(found) => {
                for (key, message) in found {
                    problems.push(at(text, &table, &key, message));
                }
            }
        }
    }
    out
}

fn command_tools(
    file: &ConfigFile,
    base_dir: &Path,
    text: &str,
    problems: &mut Vec<Problem>,
) -> Vec<Arc<CommandTool>> {
    let mut out = Vec::new();
    for (name, section) in &file.tools {
        let table = format!("tools.{name}");
        if let Err(why) = check_tool_name(name) {
            problems.push(at(text, "tools", name, format!("tool name {name:?} {why}")));
            continue;
        }
        if arbor_actors::toolbox::BUILTIN_NAMES.contains(&name.as_str()) {
            problems.push(at(
                text,
                &table,
                "command",
                format!("{name:?} is a built-in tool's name; choose another"),
            ));
            continue;
        }
        match section.build(name, base_dir) {
            Ok(tool) => out.push(Arc::new(tool)),
            Err(found) => {
                for (key, message) in found {
                    problems.push(at(text, &table, &key, message));
                }
            }
        }
    }
    out
}

fn templates(
    file: &ConfigFile,
    broken: &HashSet<String>,
    text: &str,
    problems: &mut Vec<Problem>,
    unresolved: &mut Vec<(String, Problem)>,
) -> Vec<AgentTemplate> {
    let mut out = Vec::new();
    for (id, a) in &file.agents {
        let table = format!("agents.{id}");
        let mut schema = |key: &str, value: &Option<Value>| -> Option<Schema> {
            let value = value.clone()?;
            Schema::compile(value)
                .map_err(|e| {
                    problems.push(at(text, &table, key, format!("invalid JSON Schema: {e}")))
                })
                .ok()
        };
        let output_schema = schema("output_schema", &a.output_schema);
        let input_schema = match &a.input_schema {
            Some(s) => InputSchema {
                prompt: schema("input_schema", &s.prompt),
                params: schema("input_schema", &s.params),
            },
            None => InputSchema::default(),
        };
        if !file.models.contains_key(&a.model) && !broken.contains(&format!("models.{}", a.model)) {
            let known: Vec<&str> = file.models.keys().map(String::as_str).collect();
            problems.push(at(
                text,
                &table,
                "model",
                format!(
                    "unknown model {:?} (configured: {})",
                    a.model,
                    known.join(", ")
                ),
            ));
        }
        for entry in &a.spawnable_agents {
            if !file.agents.contains_key(entry) && !broken.contains(&format!("agents.{entry}")) {
                problems.push(at(
                    text,
                    &table,
                    "spawnable_agents",
                    format!("spawns {entry:?}, which is not defined under [agents]"),
                ));
            }
        }
        for tool in &a.tools {
            if arbor_actors::toolbox::OPTIONAL_BUILTINS.contains(&tool.as_str())
                || file.tools.contains_key(tool)
            {
                continue;
            }
            if let Some((server, name)) = tool.split_once('/') {
                if !file.mcp_servers.contains_key(server) {
                    problems.push(at(
                        text,
                        &table,
                        "tools",
                        format!(
                            "{tool:?} names MCP server {server:?}, which is not declared under [mcp_servers]"
                        ),
                    ));
                } else if let Err(why) = check_pattern(tool).and_then(|()| {
                    if name.is_empty() {
                        Err("names no tool (write SERVER/* for all of its tools)".into())
                    } else {
                        Ok(())
                    }
                }) {
                    problems.push(at(text, &table, "tools", format!("{tool:?}: {why}")));
                }
                continue;
            }
            unresolved.push((
                tool.clone(),
                at(
                    text,
                    &table,
                    "tools",
                    format!(
                        "unknown tool {tool:?}: not a built-in (add_message, set_messages), not under [tools], \
                         not SERVER/TOOL of an [mcp_servers] entry, and no tool of that name is registered in code"
                    ),
                ),
            ));
        }
        let failure = match &a.failure {
            FailureSection::Named(name) if name == "report" => FailurePolicy::Report,
            FailureSection::Named(name) if name == "escalate" => FailurePolicy::Escalate,
            FailureSection::Named(name) => {
                problems.push(at(
                    text,
                    &table,
                    "failure",
                    format!("unknown policy {name:?} (report, escalate, or {{ retry = {{ max, backoff }} }})"),
                ));
                FailurePolicy::Report
            }
            FailureSection::Retry { retry } => FailurePolicy::Retry {
                max: retry.max,
                backoff: duration_in(
                    text,
                    &table,
                    "failure",
                    &Some(retry.backoff.clone()),
                    ranges::RETRY_BACKOFF,
                    problems,
                )
                .unwrap_or_default(),
            },
        };
        if let FailureSection::Retry { retry } = &a.failure {
            number(
                text,
                &table,
                "failure",
                Some(retry.max),
                ranges::RETRY_MAX,
                problems,
            );
        }
        number(
            text,
            &table,
            "max_steps",
            Some(a.max_steps),
            ranges::AGENT_MAX_STEPS,
            problems,
        );
        number(
            text,
            &table,
            "context_window",
            a.context_window,
            ranges::CONTEXT_WINDOW,
            problems,
        );
        let step_timeout = duration_in(
            text,
            &table,
            "step_timeout",
            &a.step_timeout,
            ranges::STEP_TIMEOUT,
            problems,
        );
        let mut t = AgentTemplate::new(id.clone(), a.model.clone());
        t.display_name = a.name.clone().unwrap_or_else(|| id.clone());
        t.description = a.description.clone();
        t.spawner_prompt = a.spawner_prompt.clone();
        t.instructions_prompt = a.instructions_prompt.as_deref().map(Arc::from);
        t.step_prompt = a.step_prompt.as_deref().map(Arc::from);
        t.system_prompt = Arc::from(a.system_prompt.as_str());
        t.tools = a.tools.clone();
        t.spawnable_agents = a.spawnable_agents.clone();
        t.output_mode = a.output_mode;
        t.output_schema = output_schema;
        t.input_schema = input_schema;
        t.include_message_history = a.include_message_history;
        t.inherit_parent_system_prompt = a.inherit_parent_system_prompt;
        t.max_steps = a.max_steps;
        t.step_timeout = step_timeout;
        t.context_window = a.context_window;
        t.failure = failure;
        out.push(t);
    }
    out
}

/// A spawn cycle needs `limits.max_depth`, or a tree could grow without end.
fn check_graph(file: &ConfigFile, limits: &TreeLimits, text: &str, problems: &mut Vec<Problem>) {
    if limits.max_depth.is_some() {
        return;
    }
    let mut reported = HashSet::new();
    for start in file.agents.keys() {
        let mut path = vec![start.as_str()];
        if let Some(cycle) = find_cycle(file, &mut path) {
            let mut members: Vec<&str> = cycle.clone();
            members.sort();
            if reported.insert(members) {
                problems.push(at(
                    text,
                    &format!("agents.{}", cycle[0]),
                    "spawnable_agents",
                    format!(
                        "spawn cycle {} with no limits.max_depth: set max_depth so the tree ends",
                        cycle.join(" -> ")
                    ),
                ));
            }
        }
    }
}

fn find_cycle<'a>(file: &'a ConfigFile, path: &mut Vec<&'a str>) -> Option<Vec<&'a str>> {
    let current = *path.last()?;
    let agent = file.agents.get(current)?;
    for next in &agent.spawnable_agents {
        if let Some(pos) = path.iter().position(|p| *p == next.as_str()) {
            let mut cycle: Vec<&str> = path[pos..].to_vec();
            cycle.push(next.as_str());
            return Some(cycle);
        }
        if file.agents.contains_key(next) {
            path.push(next.as_str());
            if let Some(c) = find_cycle(file, path) {
                return Some(c);
            }
            path.pop();
        }
    }
    None
}

fn check_models(file: &ConfigFile, base_dir: &Path, text: &str, problems: &mut Vec<Problem>) {
    for (name, model) in &file.models {
        let table = format!("models.{name}");
        match model {
            ModelSection::Simulated(s) => {
                if let Err(e) = Latency::parse(&s.latency) {
                    problems.push(at(text, &table, "latency", e));
                }
                number(
                    text,
                    &table,
                    "fanout",
                    Some(s.fanout),
                    ranges::FANOUT,
                    problems,
                );
                number(
                    text,
                    &table,
                    "depth",
                    Some(s.depth),
                    ranges::DEPTH,
                    problems,
                );
                number(
                    text,
                    &table,
                    "reply_tokens",
                    Some(s.reply_tokens),
                    ranges::REPLY_TOKENS,
                    problems,
                );
                if let Some(shape) = &s.shape {
                    if shape.len() > ranges::DEPTH.1 {
                        problems.push(at(
                            text,
                            &table,
                            "shape",
                            format!("has {} levels: at most {}", shape.len(), ranges::DEPTH.1),
                        ));
                    }
                    if let Some(&wide) = shape.iter().find(|&&f| f > ranges::FANOUT.1) {
                        problems.push(at(
                            text,
                            &table,
                            "shape",
                            format!("a level of {wide} children: at most {}", ranges::FANOUT.1),
                        ));
                    }
                }
                let agents = simulated_config(s).map(|c| c.agents()).unwrap_or(0);
                if agents > ranges::SIMULATED_AGENTS {
                    problems.push(at(
                        text,
                        &table,
                        if s.shape.is_some() { "shape" } else { "fanout" },
                        format!(
                            "makes a tree of {agents} agents: at most {} (a smaller fanout, depth or shape)",
                            ranges::SIMULATED_AGENTS
                        ),
                    ));
                }
            }
            ModelSection::Scripted(s) => {
                let path = base_dir.join(&s.file);
                if let Err(e) = ScriptedModel::from_file(name, &path) {
                    problems.push(at(text, &table, "file", e.to_string()));
                }
            }
            ModelSection::Openai(s) | ModelSection::Anthropic(s) => {
                let kind = match model {
                    ModelSection::Anthropic(_) => ProviderKind::Anthropic,
                    _ => ProviderKind::OpenAi,
                };
                if let Err((key, message)) = ProviderSettings::from_section(kind, s) {
                    let mut path = vec!["models", name.as_str()];
                    path.extend(key.split('.'));
                    problems.push(Problem {
                        line: locate_path(text, &path),
                        key: path.join("."),
                        message,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_shipped_config_loads_and_builds_a_catalog() {
        let config = Config::default_config().unwrap();
        assert_eq!(config.default_agent(), Some("coordinator"));
        assert_eq!(config.limits.max_live_agents, Some(64));
        assert_eq!(
            config.limits.deadline,
            Some(std::time::Duration::from_secs(300))
        );
        let researcher = config
            .templates
            .iter()
            .find(|t| t.id == "researcher")
            .unwrap();
        assert_eq!(
            researcher.failure,
            FailurePolicy::Retry {
                max: 2,
                backoff: std::time::Duration::from_millis(200)
            }
        );
        let catalog = config.catalog().unwrap();
        assert!(catalog.template("analyst").is_some());
        assert!(catalog.model("sim").is_some());
    }

    #[test]
    fn schemas_in_toml_become_json_schemas() {
        let text = r#"
[models.m]
provider = "simulated"

[agents.judge]
model = "m"
output_mode = "structured_output"
output_schema = { type = "object", required = ["score"], properties = { score = { type = "number" } } }
input_schema = { params = { type = "object", required = ["topic"] } }
"#;
        let config = Config::parse(text, "inline.toml", PathBuf::new()).unwrap();
        let judge = &config.templates[0];
        let schema = judge.output_schema.as_ref().unwrap();
        assert!(schema.check(&serde_json::json!({"score": 1})).is_ok());
        assert!(schema.check(&serde_json::json!({})).is_err());
        assert!(
            judge
                .check_input(Some("x"), Some(&serde_json::json!({"topic": "t"})))
                .is_ok()
        );
        assert!(judge.check_input(Some("x"), None).is_err());
    }

    #[test]
    fn an_invalid_schema_is_a_problem_with_its_key() {
        let text = "[models.m]\nprovider = \"simulated\"\n\n[agents.a]\nmodel = \"m\"\noutput_schema = { type = 5 }\n";
        let err = Config::parse(text, "s.toml", PathBuf::new()).unwrap_err();
        assert_eq!(err.problems[0].key, "agents.a.output_schema");
        assert_eq!(err.problems[0].line, Some(6));
    }

    #[test]
    fn an_unknown_key_is_refused_by_name() {
        let text =
            "[models.m]\nprovider = \"simulated\"\n\n[agents.a]\nmodel = \"m\"\nmax_stepz = 3\n";
        let err = Config::parse(text, "k.toml", PathBuf::new()).unwrap_err();
        let shown = err.to_string();
        assert!(
            shown.starts_with("k.toml:6: agents.a.max_stepz: unknown field `max_stepz`"),
            "{shown}"
        );
    }

    #[test]
    fn an_unknown_provider_is_named() {
        let text = "[models.m]\nprovider = \"telepathy\"\n";
        let err = Config::parse(text, "p.toml", PathBuf::new())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("models.m") && err.contains("telepathy"),
            "{err}"
        );
    }

    #[test]
    fn a_stored_config_keeps_no_header_value_and_takes_it_back_from_the_current_file() {
        let text = "[models.m]\nprovider = \"openai\"\nmodel = \"x\"\nbase_url = \"http://127.0.0.1:9\"\n\
                    headers = { Authorization = \"Bearer sk-secret\", X-Title = \"arbor\" }\n\n\
                    [agents.a]\nmodel = \"m\"\n";
        let config = Config::parse(text, "c.toml", PathBuf::from(".")).unwrap();
        let snapshot = config.snapshot();
        assert!(!snapshot.contains("sk-secret"), "{snapshot}");
        assert!(
            !snapshot.contains("\"arbor\""),
            "every literal header value goes"
        );
        assert!(
            snapshot.contains("model = \"x\""),
            "the rest stays: {snapshot}"
        );
        let headers = |c: &Config| match &c.file.models["m"] {
            ModelSection::Openai(s) => s.headers.clone(),
            _ => unreachable!(),
        };
        // Back with the current file's values.
        let back =
            Config::from_snapshot(&snapshot, "t", PathBuf::from("."), Some(&config)).unwrap();
        assert_eq!(headers(&back), headers(&config));
        assert_eq!(&*back.snapshot(), &*snapshot, "stored again as it was");
        // Without a current file, the header is left out (not sent as a placeholder).
        let alone = Config::from_snapshot(&snapshot, "t", PathBuf::from("."), None).unwrap();
        assert!(headers(&alone).is_empty());
    }
}

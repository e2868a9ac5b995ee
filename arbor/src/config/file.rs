//! The file format: `config.toml`'s sections as serde structs, with their
//! defaults. [`super::read`] reads them key by key; [`super::check`] checks them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use arbor_actors::OutputMode;
use arbor_supervisor::{ToolRule, TreeLimits};

use crate::providers::HttpSection;
use crate::tools::command::CommandToolSection;
use crate::tools::mcp::McpServerSection;
use serde::Deserialize;
use serde_json::Value;

/// A whole `config.toml`, section by section, as read (not yet checked).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// `[run]`: what `arbor run` starts by default.
    #[serde(default)]
    pub run: RunSection,
    /// `[limits]`, read straight into the supervisor's type (its zeros refused
    /// as it is read; the rest of each range checked by `check`).
    #[serde(default, deserialize_with = "TreeLimits::deserialize_config")]
    pub limits: TreeLimits,
    /// `[models.NAME]`: the models templates name.
    #[serde(default)]
    pub models: BTreeMap<String, ModelSection>,
    /// `[agents.NAME]`: the agent templates.
    #[serde(default)]
    pub agents: BTreeMap<String, AgentSection>,
    /// `[store]`: where trees are stored.
    #[serde(default)]
    pub store: StoreSection,
    /// `[service]`: `arbor serve`.
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
    /// Lifecycle hooks (Claude Code's `PreToolUse` and the others): the
    /// config's own `[[hooks.EVENT]]` and `.claude/settings.json` files.
    #[serde(default)]
    pub hooks: crate::tools::hooks::HooksSection,
    /// Where trees' agents work, and how their commands run.
    #[serde(default)]
    pub workspace: WorkspaceSection,
    /// `[model_aliases]`: the model names of agent files (Claude Code's
    /// `sonnet`, `opus`, `haiku`, full model ids, and `inherit` for a root)
    /// as `[models]` entries.
    #[serde(default)]
    pub model_aliases: BTreeMap<String, String>,
    /// `[agents] include`: agent files and directories of them to load,
    /// relative to the config's directory (`super::agent_files`).
    #[serde(skip)]
    pub agent_include: Vec<PathBuf>,
    /// `[[stored_agent_files]]`: the agent files a stored config carries
    /// (what its tree started with); loaded instead of any directory.
    #[serde(skip)]
    pub stored_agent_files: Vec<super::agent_files::StoredAgentFile>,
}

/// `[workspace]`: the workspace tools' directory and the shell's sandbox.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceSection {
    /// `"bwrap"`: the shell runs under bubblewrap (the workspace writable,
    /// the rest read-only, a fresh /tmp, no network unless `network`).
    #[serde(default)]
    pub sandbox: crate::tools::sandbox::SandboxKind,
    /// Whether sandboxed commands may use the network.
    #[serde(default)]
    pub network: bool,
    /// Other directories a sandboxed command may write (a build cache).
    #[serde(default)]
    pub writable: Vec<PathBuf>,
    /// The variables the shell passes from Arbor's environment (besides
    /// `PATH`); absent: HOME, USER, LOGNAME, LANG, LC_*, TERM, TZ, TMPDIR.
    #[serde(default)]
    pub shell_env: Option<Vec<String>>,
    /// Directories a start request's workspace must be inside (`arbor
    /// serve`); empty: any directory (the CLI's).
    #[serde(default)]
    pub roots: Vec<PathBuf>,
    /// `[workspace.principal_roots] NAME = [...]`: the directories the
    /// requests of principal `NAME` (`[service.principals.NAME]`) must keep
    /// their workspace inside, instead of `roots`, so tenants of one
    /// service cannot point their agents at each other's repositories.
    #[serde(default)]
    pub principal_roots: std::collections::BTreeMap<String, Vec<PathBuf>>,
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
    /// Calls of the tools matching one of these wait for a person's decision
    /// (semantics §12).
    #[serde(default)]
    pub approve_tools: Vec<String>,
}

impl PolicySection {
    /// The section as the supervisor's tool rule.
    pub fn rule(&self) -> ToolRule {
        ToolRule {
            allow: self.allow_tools.clone(),
            deny: self.deny_tools.clone(),
            approve: self.approve_tools.clone(),
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
    /// Largest request head (request line and headers), in bytes; a larger
    /// one is answered 431 once this much is read.
    #[serde(default = "default_max_head_size")]
    pub max_head_size: usize,
    /// How long a client has to send a request's whole body, from the end
    /// of its head; a slower one is answered 408 and the connection closed.
    #[serde(default = "default_body_read_timeout")]
    pub body_read_timeout: String,
    /// Steering messages one run may hold before its next step takes them;
    /// more get 429.
    #[serde(default = "default_max_pending_steers")]
    pub max_pending_steers: usize,
    /// Their bytes at once, in bytes; more get 429.
    #[serde(default = "default_max_pending_steer_bytes")]
    pub max_pending_steer_bytes: usize,
    /// Follow-up turns one tree may have queued behind its running turn;
    /// more get 429.
    #[serde(default = "default_max_queued_turns")]
    pub max_queued_turns: usize,
    /// Send traces (agent, step, tool and request spans) to this OpenTelemetry
    /// collector's OTLP/HTTP traces URL, e.g. `http://127.0.0.1:4318/v1/traces`.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
    /// `[service.principals.NAME]`: named API callers, each with its own
    /// tokens and a role (the tokens of `tokens_env` are unnamed admins).
    #[serde(default)]
    pub principals: BTreeMap<String, PrincipalSection>,
    /// The completion webhook of every tree started without one: an http(s)
    /// URL each tree's end is posted to, signed with `webhook_secret`.
    #[serde(default)]
    pub webhook: Option<String>,
    /// The shared secret webhooks are signed with (HMAC-SHA256): a string,
    /// or `{ env = "VAR" }`.
    #[serde(default)]
    pub webhook_secret: Option<crate::config::webhooks::WebhookSecret>,
    /// Attempts per webhook delivery, the first included.
    #[serde(default = "crate::config::webhooks::default_attempts")]
    pub webhook_attempts: u32,
    /// The wait after a failed delivery attempt; it doubles at each next.
    #[serde(default = "crate::config::webhooks::default_backoff")]
    pub webhook_backoff: String,
    /// The longest wait between delivery attempts.
    #[serde(default = "crate::config::webhooks::default_backoff_max")]
    pub webhook_backoff_max: String,
    /// How long one delivery attempt may take.
    #[serde(default = "crate::config::webhooks::default_timeout")]
    pub webhook_timeout: String,
    /// The hosts a start request's webhook may post to (`hooks.example.com`,
    /// or `*.example.com` for its subdomains); empty: any.
    #[serde(default)]
    pub webhook_hosts: Vec<String>,
}

/// `[service.principals.NAME]`: an API caller by name. The trees it starts
/// are its own; its role says what else it may see and do.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrincipalSection {
    /// The environment variable holding its bearer tokens, comma-separated
    /// (tokens are never written in the config file).
    pub token_env: String,
    /// `admin` (every tree), `user` (its own trees only) or `read` (every
    /// tree, read only); checked by `check_service`.
    pub role: String,
}

/// What a principal may do (`[service.principals.NAME] role`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Sees and controls every tree, reads the metrics.
    Admin,
    /// Starts trees, and sees and controls only those it started.
    User,
    /// Sees every tree and the metrics; starts and changes nothing.
    Read,
}

impl Role {
    /// Every role, in the order messages list them.
    pub const ALL: [Role; 3] = [Role::Admin, Role::User, Role::Read];

    /// The role's name in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::User => "user",
            Role::Read => "read",
        }
    }

    /// The role of that name.
    pub fn parse(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == name)
    }
}

/// A `[service.principals.NAME]` entry, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrincipalSettings {
    /// Its name: what the trees it starts are stored with.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// The environment variable holding its tokens (read when the service
    /// starts, which refuses one that is unset or empty).
    pub token_env: String,
    /// The line of its `token_env` in the file, for the service's error.
    pub line: Option<usize>,
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
            max_head_size: default_max_head_size(),
            body_read_timeout: default_body_read_timeout(),
            max_pending_steers: default_max_pending_steers(),
            max_pending_steer_bytes: default_max_pending_steer_bytes(),
            max_queued_turns: default_max_queued_turns(),
            otlp_endpoint: None,
            principals: BTreeMap::new(),
            webhook: None,
            webhook_secret: None,
            webhook_attempts: crate::config::webhooks::default_attempts(),
            webhook_backoff: crate::config::webhooks::default_backoff(),
            webhook_backoff_max: crate::config::webhooks::default_backoff_max(),
            webhook_timeout: crate::config::webhooks::default_timeout(),
            webhook_hosts: Vec::new(),
        }
    }
}

/// `[service]`, validated and typed by `check_service` (each value within
/// its documented range), for `ServiceOptions` and the server's limits.
#[derive(Clone, Debug)]
pub struct ServiceSettings {
    /// How long a shutdown waits for the store to take what is in flight.
    pub shutdown_timeout: std::time::Duration,
    /// How much steering a run may hold before it takes it (the runtime's
    /// supervisor is built with it).
    pub steering: arbor_actors::steer::SteerLimits,
    /// Follow-up turns one tree may have queued (the runtime's supervisor
    /// is built with it).
    pub queued_turns: usize,
    /// The server's limits.
    pub limits: ServiceLimits,
    /// The named API callers, by name.
    pub principals: Vec<PrincipalSettings>,
    /// The address `arbor serve` listens on unless `--bind` says another
    /// (checked to be one).
    pub bind: std::net::SocketAddr,
    /// The variable that holds the unnamed admin tokens.
    pub tokens_env: String,
    /// Where traces go, unless `OTEL_EXPORTER_OTLP_*` says.
    pub otlp_endpoint: Option<String>,
    /// The largest request body the API reads, in bytes.
    pub body_limit: usize,
    /// Trees one server runs at once.
    pub max_running_trees: usize,
    /// Completion webhooks: the default, the secret, the retries.
    pub webhooks: crate::config::webhooks::WebhookSettings,
}

impl Default for ServiceSettings {
    fn default() -> Self {
        ServiceSettings {
            bind: std::net::SocketAddr::from(([127, 0, 0, 1], 8080)),
            tokens_env: default_tokens_env(),
            otlp_endpoint: None,
            body_limit: default_body_limit(),
            max_running_trees: default_max_running_trees(),
            shutdown_timeout: std::time::Duration::from_secs(10),
            steering: arbor_actors::steer::SteerLimits::default(),
            queued_turns: arbor_supervisor::DEFAULT_TURN_QUEUE,
            limits: ServiceLimits::default(),
            principals: Vec::new(),
            webhooks: Default::default(),
        }
    }
}

/// Connection and event-stream limits of `arbor serve` (`[service]`, or set
/// in code); plain values, so the config reads them without the `arbor-service` crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceLimits {
    /// How long a client has to send a whole request head, from its connect
    /// or, on a kept-alive connection, from the end of the previous response
    /// (so it also bounds an idle keep-alive connection).
    pub header_read_timeout: Duration,
    /// A connection on which no byte is read or written for this long is
    /// closed (a stalled upload, a client that stopped reading).
    pub idle_timeout: Duration,
    /// Connections open at once (lowered at start to stay under the process's
    /// file-descriptor limit).
    pub max_connections: usize,
    /// Event streams open at once, over every tree.
    pub max_event_streams: usize,
    /// Event streams open at once on one tree.
    pub max_event_streams_per_tree: usize,
    /// Largest request head (request line and headers), in bytes (at least
    /// 8192, what the HTTP parser needs): a larger one is answered 431 once
    /// this much is read, so an unfinished head holds no more memory.
    pub max_head_size: usize,
    /// How long a client has to send a request's whole body, from the end of
    /// its head: a body that trickles in (a byte every few seconds keeps a
    /// connection from being idle) is answered 408 and its connection closed.
    pub body_read_timeout: Duration,
}

impl Default for ServiceLimits {
    fn default() -> Self {
        ServiceLimits {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 10_000,
            max_event_streams: 1_000,
            max_event_streams_per_tree: 64,
            max_head_size: 32 << 10,
            body_read_timeout: Duration::from_secs(30),
        }
    }
}

impl ServiceLimits {
    /// How often an event stream sends a keep-alive comment: often enough
    /// that a quiet stream is never taken for an idle connection.
    pub fn stream_keep_alive(&self) -> Duration {
        (self.idle_timeout / 3).clamp(Duration::from_millis(100), Duration::from_secs(15))
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
    ServiceLimits::default().max_connections
}

fn default_max_event_streams() -> usize {
    ServiceLimits::default().max_event_streams
}

fn default_max_event_streams_per_tree() -> usize {
    ServiceLimits::default().max_event_streams_per_tree
}

fn default_max_head_size() -> usize {
    ServiceLimits::default().max_head_size
}

fn default_body_read_timeout() -> String {
    "30s".into()
}

fn default_max_pending_steers() -> usize {
    arbor_actors::steer::SteerLimits::default().max_pending
}

fn default_max_pending_steer_bytes() -> usize {
    arbor_actors::steer::SteerLimits::default().max_pending_bytes
}

fn default_max_queued_turns() -> usize {
    arbor_supervisor::DEFAULT_TURN_QUEUE
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
    /// A shared store instead of the file: `postgres://user@host:port/db`
    /// (the password from the URL or `ARBOR_PG_PASSWORD`), or
    /// `sqlite://PATH`. Set `path` or `url`, not both (see `config::store`).
    #[serde(default)]
    pub url: Option<String>,
    /// How long the store may stay down (unreachable, its disk full) before
    /// this process gives its trees up: it releases them to the next process,
    /// fails them here and fails its health check. Until then the writes
    /// wait and are tried again. `60s` unless set (1s to 1d).
    #[serde(default)]
    pub fail_after: Option<String>,
}

impl Default for StoreSection {
    fn default() -> Self {
        StoreSection {
            enabled: true,
            path: default_store_path(),
            url: None,
            fail_after: None,
        }
    }
}

fn default_true() -> bool {
    true
}

fn default_store_path() -> PathBuf {
    PathBuf::from("arbor.db")
}

/// `[run]`: what `arbor run` does without options.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSection {
    /// The agent `arbor run` starts when `--agent` is not given.
    pub agent: Option<String>,
}

/// `[models.NAME]`, its shape picked by its `provider`.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "provider", rename_all = "lowercase")]
pub enum ModelSection {
    /// A simulated model that spawns a tree of a given shape.
    Simulated(SimulatedSection),
    /// A model that replays a script.
    Scripted(ScriptedSection),
    /// The OpenAI Chat Completions API (and compatible servers).
    Openai(HttpSection),
    /// The Anthropic Messages API.
    Anthropic(HttpSection),
}

impl ModelSection {
    /// The `provider` value that names this kind of model.
    pub fn provider(&self) -> &'static str {
        match self {
            ModelSection::Simulated(_) => "simulated",
            ModelSection::Scripted(_) => "scripted",
            ModelSection::Openai(_) => "openai",
            ModelSection::Anthropic(_) => "anthropic",
        }
    }

    /// One line describing the model, without secrets (a `base_url`'s
    /// password shows as `***`).
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
                s.base_url
                    .as_deref()
                    .map_or_else(|| "the default URL".into(), super::store::redact),
                s.api_key_env.as_deref().unwrap_or("no variable"),
                if s.stream { ", streaming" } else { "" }
            ),
        }
    }
}

/// `[models.NAME]` with `provider = "simulated"`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimulatedSection {
    /// Children each agent spawns, down to `depth`.
    #[serde(default = "default_fanout")]
    pub fanout: usize,
    /// Levels of children below the root.
    #[serde(default = "default_depth")]
    pub depth: usize,
    /// Each reply's latency: a duration, or `lognormal:MEDIAN,SIGMA`.
    #[serde(default = "default_latency")]
    pub latency: String,
    /// Words in each reply.
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

/// `[models.NAME]` with `provider = "scripted"`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedSection {
    /// The script (JSON), relative to the config file.
    pub file: PathBuf,
}

/// `compact_at`: tokens, or a share of the template's `context_window`.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(untagged)]
pub enum CompactAt {
    /// A token count (`compact_at = 60000`).
    Tokens(u64),
    /// A share of `context_window` (`compact_at = 0.8`).
    Share(f64),
}

/// `[agents.NAME]`: one agent template (see `AgentTemplate` for each field).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSection {
    /// The name a parent's spawn result shows; by default the id's name part.
    pub name: Option<String>,
    /// What this agent is for (its parents' spawn tools tell their model).
    pub description: Option<String>,
    /// When a parent should spawn it.
    pub spawner_prompt: Option<String>,
    /// A user message added after the prompt.
    pub instructions_prompt: Option<String>,
    /// A short user message added to every model request (not stored).
    pub step_prompt: Option<String>,
    /// The `[models]` entry it runs on.
    pub model: String,
    /// The system message of every model call.
    #[serde(default)]
    pub system_prompt: String,
    /// External tools by name or pattern (built-ins are always available).
    #[serde(default)]
    pub tools: Vec<String>,
    /// Whose names and schemas the workspace tools it lists as
    /// `workspace/*` (or `workspace/NAME`) have: `"arbor"` (absent:
    /// `workspace/read`, ...), `"codebuff"` (`read_files`, ...) or
    /// `"claude"` (`Read`, ...).
    pub tool_names: Option<arbor_tools::workspace::Family>,
    /// The agent types it may spawn.
    #[serde(default)]
    pub spawnable_agents: Vec<String>,
    /// How its run becomes its parent's value.
    #[serde(default)]
    pub output_mode: OutputMode,
    /// The JSON schema `set_output` values must satisfy (absent: any value).
    pub output_schema: Option<Value>,
    /// How a `structured_output` run gives its output: `"tool"`
    /// (`set_output`), `"native"` (the schema goes in the provider's
    /// structured-output field and the reply's text is the output) or
    /// `"auto"` (absent: what the model's provider does best).
    #[serde(default)]
    pub structured: StructuredChoice,
    /// The schemas its spawn input must satisfy.
    pub input_schema: Option<InputSchemaSection>,
    /// Whether a child starts from its parent's history.
    #[serde(default)]
    pub include_message_history: bool,
    /// Whether a child runs with its parent's system prompt and toolbox.
    #[serde(default)]
    pub inherit_parent_system_prompt: bool,
    /// Model steps one run may take.
    #[serde(default = "default_max_steps")]
    pub max_steps: u32,
    /// The longest a step's model call and tools may take (a duration).
    pub step_timeout: Option<String>,
    /// The longest its own work in flight (model call, tools) may go without
    /// progress before it fails as stalled (a duration; semantics §11).
    pub idle_timeout: Option<String>,
    /// Estimated tokens a request may hold before truncation shortens it.
    pub context_window: Option<u64>,
    /// The share of its remaining context window one child's report may take
    /// (a fraction in (0, 1]; only with `context_window`).
    pub report_share: Option<f64>,
    /// When a run compacts its history before a step (issue 37): a token
    /// count (`60000`) or a share of `context_window` (`0.8`).
    pub compact_at: Option<CompactAt>,
    /// The most recent model steps a compaction keeps verbatim (absent: 4).
    pub compact_keep: Option<u32>,
    /// What the summary call of a compaction asks (absent: the built-in prompt).
    pub compact_prompt: Option<String>,
    /// When the same tool call repeated warns and fails.
    pub loop_detection: Option<LoopDetectionSection>,
    /// Patterns of its tools (`fs/write_*`) whose calls wait for a person's
    /// decision (semantics §12).
    #[serde(default)]
    pub approve: Vec<String>,
    /// How long a step's calls wait for decisions before each one still
    /// waiting gets `approval_default` (a duration; absent: for ever).
    pub approval_timeout: Option<String>,
    /// `"deny"` (absent) or `"approve"`: the decision `approval_timeout` gives.
    pub approval_default: Option<String>,
    /// `model_options = { ... }`: request options over the model's `options`.
    pub model_options: Option<arbor_actors::model::ModelOptions>,
    /// `"wait"` (absent) or `"cancel"`: what a run whose turn would end does
    /// while its background children still run (semantics §15).
    pub on_turn_end: Option<String>,
    /// What its parent does when its run fails.
    #[serde(default)]
    pub failure: FailureSection,
    /// `"worktree"`: each of its runs works in a git worktree of its own,
    /// on a new branch from its parent's workspace (absent: `"shared"`, in
    /// its parent's workspace).
    #[serde(default)]
    pub isolation: arbor_actors::worktree::Isolation,
    /// A program that drives it (semantics §4.5): a `.ts` or `.js` file,
    /// relative to the config's directory, whose default export is a
    /// generator function (Codebuff's `handleSteps`) or an
    /// `AgentDefinition` with one (feature `programs`).
    pub program: Option<String>,
}

/// An agent's `structured`: a way, or `auto` to let its model decide.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StructuredChoice {
    /// The model's `structured`, else its provider's default (native on
    /// OpenAI's APIs, the tool on Anthropic and the built-in models).
    #[default]
    Auto,
    /// Always native.
    Native,
    /// Always `set_output`.
    Tool,
}

fn default_max_steps() -> u32 {
    20
}

/// An agent's `loop_detection = { warn_after, fail_after }` (0 turns a stage off).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoopDetectionSection {
    /// Identical calls in a row that emit a `looping` event (absent: 3).
    pub warn_after: Option<u32>,
    /// Identical calls in a row that fail the run (absent: 5).
    pub fail_after: Option<u32>,
}

/// An agent's `input_schema`: the schemas of its spawn input.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputSchemaSection {
    /// The JSON schema of `prompt` (absent: any prompt, or none).
    pub prompt: Option<Value>,
    /// The JSON schema of `params` (absent: any params, or none).
    pub params: Option<Value>,
}

/// `"report"`, `"escalate"` or `{ retry = { max = 2, backoff = "500ms" } }`.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum FailureSection {
    /// `"report"` or `"escalate"`.
    Named(String),
    /// Run the agent again, up to `max` times.
    Retry {
        /// How often, and how long to wait before each.
        retry: RetrySection,
    },
}

impl Default for FailureSection {
    fn default() -> Self {
        FailureSection::Named("report".into())
    }
}

/// `failure = { retry = { max, backoff } }`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySection {
    /// Runs after the first.
    pub max: u32,
    /// The wait before each (a duration).
    pub backoff: String,
}

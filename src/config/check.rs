//! The checks: every section's values against their ranges and each other
//! (limits, templates, models, `[service]`, the spawn graph), turned into the
//! validated values a [`Config`](super::Config) holds.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use arbor_actors::approval::ApprovalDefault;
use arbor_actors::model::{ModelOptions, ToolChoice};
use arbor_actors::models::Latency;
use arbor_actors::models::scripted::Script;
use arbor_actors::schema::Schema;
use arbor_actors::template::{InputSchema, LoopDetection, Share, Structured};
use arbor_actors::{AgentTemplate, FailurePolicy, OutputMode};
use arbor_supervisor::{TreeLimits, check_pattern};

use super::catalog::{ModelSpec, simulated_config};
use super::file::{LoopDetectionSection, PrincipalSettings, Role, StructuredChoice};
use super::read::{Source, at};
use super::{ConfigFile, FailureSection, ModelSection, Problem, ServiceSection, ServiceSettings};
use crate::providers::{ProviderKind, ProviderSettings};
use crate::tools::command::CommandTool;
use crate::tools::mcp::McpSettings;
use serde_json::Value;

/// A duration key within `range` (inclusive), or its problem.
fn duration_in(
    text: &Source<'_>,
    table: &str,
    key: &str,
    value: &Option<String>,
    range: (std::time::Duration, std::time::Duration),
    problems: &mut Vec<Problem>,
) -> Option<std::time::Duration> {
    let value = value.as_ref()?;
    match arbor_actors::duration::parse(value)
        .map_err(|e| too_long(value, range.1).unwrap_or_else(|| e.to_string()))
        .and_then(|d| arbor_actors::duration::within(d, range.0, range.1))
    {
        Ok(d) => Some(d),
        Err(e) => {
            problems.push(at(text, table, key, e));
            None
        }
    }
}

/// The range's message for a duration written well but too long for any
/// number to hold (`99999999999h`, `1000000000000000000000s`): the parser's
/// overflow says nothing of the key's range. `None` if `text` is refused for
/// its form, which the same text with every number 1 is refused for too.
fn too_long(text: &str, max: std::time::Duration) -> Option<String> {
    let mut small = String::with_capacity(text.len());
    let mut in_number = false;
    for c in text.chars() {
        if c.is_ascii_digit() {
            if !in_number {
                small.push('1');
            }
            in_number = true;
        } else {
            small.push(c);
            in_number = false;
        }
    }
    arbor_actors::duration::parse(&small).ok()?;
    Some(format!(
        "duration {text:?} is too long: must be at most {}",
        arbor_actors::duration::Human(max)
    ))
}

/// `[store] fail_after`: a duration of 1 s to 1 day.
pub(super) fn store_fail_after(
    section: &crate::config::StoreSection,
    text: &Source<'_>,
    problems: &mut Vec<Problem>,
) {
    use std::time::Duration;
    let range = (Duration::from_secs(1), Duration::from_secs(86_400));
    duration_in(
        text,
        "store",
        "fail_after",
        &section.fail_after,
        range,
        problems,
    );
}

/// A number key within `min..=max`, or its problem (NaN is outside every range).
fn number<T: PartialOrd + fmt::Display + Copy>(
    text: &Source<'_>,
    table: &str,
    key: &str,
    value: Option<T>,
    (min, max): (T, T),
    problems: &mut Vec<Problem>,
) {
    if let Some(why) = value.and_then(|v| arbor_supervisor::out_of_range(v, (min, max))) {
        problems.push(at(text, table, key, why));
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

    /// An agent's `max_steps`.
    pub const AGENT_MAX_STEPS: (u32, u32) = (1, 100_000);
    /// An agent's `step_timeout`.
    pub const STEP_TIMEOUT: (Duration, Duration) = (MS, DAY);
    /// An agent's `idle_timeout`.
    pub const IDLE_TIMEOUT: (Duration, Duration) = (MS, DAY);
    /// An agent's `approval_timeout`.
    pub const APPROVAL_TIMEOUT: (Duration, Duration) = (MS, Duration::from_secs(30 * 86_400));
    /// An agent's `context_window`, in tokens.
    pub const CONTEXT_WINDOW: (u64, u64) = (256, 100_000_000);
    /// An agent's `loop_detection` counts (`warn_after`, `fail_after`; 0 is off).
    pub const LOOP_COUNT: (u32, u32) = (0, 1000);
    /// An agent's `failure = { retry = { max } }`.
    pub const RETRY_MAX: (u32, u32) = (0, 100);
    /// An agent's `failure = { retry = { backoff } }`.
    pub const RETRY_BACKOFF: (Duration, Duration) = (Duration::ZERO, HOUR);
    /// A simulated model's `fanout` (and each level of its `shape`).
    pub const FANOUT: (usize, usize) = (0, 10_000);
    /// A simulated model's `depth` (and the levels of its `shape`).
    pub const DEPTH: (usize, usize) = (0, 100);
    /// A simulated model's `reply_tokens`.
    pub const REPLY_TOKENS: (usize, usize) = (0, 100_000);
    /// A simulated model's whole tree, root included.
    pub const SIMULATED_AGENTS: u64 = 100_000_000;
}

/// Checks `[service]`, each numeric and duration key against its range
/// (README's service section lists them), and gives the typed values.
pub(super) fn check_service(
    service: &ServiceSection,
    text: &Source<'_>,
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
    let body_read_timeout = within(
        "body_read_timeout",
        &service.body_read_timeout,
        Duration::from_millis(100),
        secs(3600),
        defaults.limits.body_read_timeout,
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
    // At least what hyper's parser needs (it refuses a smaller buffer).
    let max_head_size = count(
        "max_head_size",
        service.max_head_size,
        8 << 10,
        1 << 20,
        " bytes",
        defaults.limits.max_head_size,
    );
    let steering = arbor_actors::steer::SteerLimits {
        max_pending: count(
            "max_pending_steers",
            service.max_pending_steers,
            1,
            100_000,
            "",
            defaults.steering.max_pending,
        ),
        max_pending_bytes: count(
            "max_pending_steer_bytes",
            service.max_pending_steer_bytes,
            1024,
            64 << 20,
            " bytes",
            defaults.steering.max_pending_bytes,
        ),
    };
    let queued_turns = count(
        "max_queued_turns",
        service.max_queued_turns,
        1,
        10_000,
        "",
        defaults.queued_turns,
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
    let principals = check_principals(service, text, problems);
    ServiceSettings {
        shutdown_timeout,
        steering,
        queued_turns,
        limits: super::ServiceLimits {
            header_read_timeout,
            idle_timeout,
            max_connections,
            max_event_streams,
            max_event_streams_per_tree,
            max_head_size,
            body_read_timeout,
        },
        principals,
    }
}

/// `[service.principals.NAME]`: a known role, and a `token_env` of its own
/// (two principals reading one variable would share their tokens, and so
/// their identity). Whether the variable is set is the service's check, at
/// its start: other commands do not need it.
fn check_principals(
    service: &ServiceSection,
    text: &Source<'_>,
    problems: &mut Vec<Problem>,
) -> Vec<PrincipalSettings> {
    let mut out = Vec::new();
    let mut envs: BTreeMap<&str, &str> = BTreeMap::new();
    for (name, section) in &service.principals {
        let key = |k: &str| format!("service.principals.{name}.{k}");
        let line = |k: &str| text.line(&["service", "principals", name, k]);
        let mut problem = |k: &str, message: String| {
            problems.push(Problem {
                line: line(k),
                key: key(k),
                message,
            })
        };
        if name.trim().is_empty() {
            problem("role", "a principal needs a name".into());
            continue;
        }
        let role = Role::parse(&section.role);
        if role.is_none() {
            let known: Vec<&str> = Role::ALL.iter().map(|r| r.as_str()).collect();
            problem(
                "role",
                format!(
                    "{:?} is not a role (one of {})",
                    section.role,
                    known.join(", ")
                ),
            );
        }
        let env = section.token_env.as_str();
        if env.is_empty() || env.contains('=') || env.contains('\0') {
            problem(
                "token_env",
                "must name an environment variable (holding the principal's tokens)".into(),
            );
            continue;
        }
        if env == service.tokens_env {
            problem(
                "token_env",
                format!(
                    "{env} is [service] tokens_env, whose tokens are unnamed admins; give \
                     the principal a variable of its own"
                ),
            );
            continue;
        }
        if let Some(other) = envs.insert(env, name) {
            problem(
                "token_env",
                format!(
                    "{env} is also principal {other:?}'s token_env: each principal needs a \
                     variable of its own"
                ),
            );
            continue;
        }
        if let Some(role) = role {
            out.push(PrincipalSettings {
                name: name.clone(),
                role,
                token_env: env.to_owned(),
                line: line("token_env"),
            });
        }
    }
    out
}

/// The range of each of `[limits]`' values (zeros were refused as it was read).
pub(super) fn check_limits(limits: &TreeLimits, text: &Source<'_>, problems: &mut Vec<Problem>) {
    for (key, problem) in limits.problems() {
        problems.push(at(text, "limits", key, problem));
    }
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

pub(super) fn mcp_servers(
    file: &ConfigFile,
    base_dir: &Path,
    text: &Source<'_>,
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

pub(super) fn command_tools(
    file: &ConfigFile,
    base_dir: &Path,
    text: &Source<'_>,
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

pub(super) fn templates(
    file: &ConfigFile,
    broken: &HashSet<String>,
    text: &Source<'_>,
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
            // Codebuff's templates list every built-in they use (`set_output`,
            // `end_turn`, `spawn_agents` included): each is offered by its own
            // rule (the output mode, the spawnable agents), listed or not.
            if arbor_actors::toolbox::BUILTIN_NAMES.contains(&tool.as_str())
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
                        "unknown tool {tool:?}: not a built-in ({}), not under [tools], \
                         not SERVER/TOOL of an [mcp_servers] entry, and no tool of that name is registered in code",
                        arbor_actors::toolbox::BUILTIN_NAMES.join(", ")
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
        let idle_timeout = duration_in(
            text,
            &table,
            "idle_timeout",
            &a.idle_timeout,
            ranges::IDLE_TIMEOUT,
            problems,
        );
        let approval_timeout = duration_in(
            text,
            &table,
            "approval_timeout",
            &a.approval_timeout,
            ranges::APPROVAL_TIMEOUT,
            problems,
        );
        let approval_default = match a.approval_default.as_deref() {
            None => ApprovalDefault::Deny,
            Some(name) => ApprovalDefault::parse(name).unwrap_or_else(|| {
                problems.push(at(
                    text,
                    &table,
                    "approval_default",
                    format!("unknown decision {name:?} (deny or approve)"),
                ));
                ApprovalDefault::Deny
            }),
        };
        if let Some(Err((key, why))) = a.model_options.as_ref().map(|o| o.check()) {
            problems.push(at(text, &table, "model_options", format!("{key}: {why}")));
        }
        let on_turn_end = match a.on_turn_end.as_deref() {
            None => arbor_actors::OnTurnEnd::Wait,
            Some(name) => name.parse().unwrap_or_else(|why: String| {
                problems.push(at(text, &table, "on_turn_end", why));
                arbor_actors::OnTurnEnd::Wait
            }),
        };
        {
            use arbor_actors::toolbox::{SPAWN_AGENT_INLINE, SPAWN_AGENTS, SPAWN_AGENTS_ASYNC};
            // A spawn tool is offered only with agents to spawn: listed
            // without any, it would silently do nothing.
            if a.spawnable_agents.is_empty()
                && let Some(spawn) = a.tools.iter().find(|t| {
                    [SPAWN_AGENTS, SPAWN_AGENT_INLINE, SPAWN_AGENTS_ASYNC].contains(&t.as_str())
                })
            {
                problems.push(at(
                    text,
                    &table,
                    "tools",
                    format!("lists {spawn} but has no spawnable_agents to start"),
                ));
            }
        }
        if a.inherit_parent_system_prompt && !a.system_prompt.is_empty() {
            // Codebuff refuses the pair too: the inherited prompt would
            // silently replace this one.
            problems.push(at(
                text,
                &table,
                "inherit_parent_system_prompt",
                "runs on its parent's system prompt, so its own system_prompt would never be \
                 sent: remove one of the two"
                    .to_owned(),
            ));
        }
        let report_share = match a.report_share {
            None => Share::DEFAULT_REPORT,
            Some(fraction) => Share::new(fraction).unwrap_or_else(|| {
                problems.push(at(
                    text,
                    &table,
                    "report_share",
                    format!("{fraction} is not a fraction in (0, 1] (0.25 is a quarter of the remaining context window)"),
                ));
                Share::DEFAULT_REPORT
            }),
        };
        let loop_detection =
            check_loop_detection(a.loop_detection.as_ref(), text, &table, problems);
        for pattern in &a.approve {
            if let Err(why) = arbor_supervisor::check_pattern(pattern) {
                problems.push(at(
                    text,
                    &table,
                    "approve",
                    format!("pattern {pattern:?}: {why}"),
                ));
            }
        }
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
        t.idle_timeout = idle_timeout;
        t.context_window = a.context_window;
        t.report_share = report_share;
        t.loop_detection = loop_detection;
        t.approve = a.approve.clone();
        t.approval_timeout = approval_timeout;
        t.approval_default = approval_default;
        t.on_turn_end = on_turn_end;
        t.model_options = std::sync::Arc::new(a.model_options.clone().unwrap_or_default());
        t.failure = failure;
        let structured = structured_mode(
            a.structured,
            a.output_mode,
            &a.model,
            file.models.get(&a.model),
        )
        .unwrap_or_else(|why| {
            problems.push(at(text, &table, "structured", why));
            Structured::Tool
        });
        // Last: it puts the output schema on the template's requests.
        out.push(t.structured(structured));
    }
    out
}

/// How a template gives its structured output, from its `structured`, its
/// output mode and the `[models]` entry it runs on (`None`: not defined,
/// reported on its own); `Err` names the model and why it cannot be native.
/// `auto` is native only for `structured_output` on a model that does it
/// best natively: the model's own `structured`, else its provider's default.
pub(super) fn structured_mode(
    choice: StructuredChoice,
    output_mode: OutputMode,
    model_name: &str,
    model: Option<&ModelSection>,
) -> Result<Structured, String> {
    let structured_output = output_mode == OutputMode::StructuredOutput;
    let (kind, said) = match model {
        Some(ModelSection::Openai(s)) => (Some(ProviderKind::OpenAi), s.structured),
        Some(ModelSection::Anthropic(s)) => (Some(ProviderKind::Anthropic), s.structured),
        _ => (None, None),
    };
    match choice {
        StructuredChoice::Tool => Ok(Structured::Tool),
        StructuredChoice::Auto if !structured_output => Ok(Structured::Tool),
        StructuredChoice::Auto => {
            Ok(said
                .unwrap_or_else(|| kind.map_or(Structured::Tool, ProviderKind::structured_default)))
        }
        StructuredChoice::Native if !structured_output => Err(format!(
            "\"native\" needs output_mode = \"structured_output\" (this agent's is {:?})",
            output_mode_name(output_mode)
        )),
        StructuredChoice::Native => match (model, said) {
            (_, Some(Structured::Tool)) => Err(format!(
                "\"native\" on model {model_name:?}, whose structured = \"tool\" says it cannot \
                 answer in a schema (use \"tool\" or \"auto\" here, or another model)"
            )),
            (Some(ModelSection::Simulated(_)), _) => Err(format!(
                "\"native\" on model {model_name:?}, a simulated model, which cannot answer in a \
                 schema (use \"tool\" or \"auto\")"
            )),
            _ => Ok(Structured::Native),
        },
    }
}

fn output_mode_name(mode: OutputMode) -> &'static str {
    match mode {
        OutputMode::LastMessage => "last_message",
        OutputMode::AllMessages => "all_messages",
        OutputMode::StructuredOutput => "structured_output",
    }
}

/// An agent's `loop_detection`: each count within its range, and a warning
/// that comes before the failure (absent keys take the defaults).
fn check_loop_detection(
    section: Option<&LoopDetectionSection>,
    text: &Source<'_>,
    table: &str,
    problems: &mut Vec<Problem>,
) -> LoopDetection {
    let defaults = LoopDetection::default();
    let Some(section) = section else {
        return defaults;
    };
    let warn_after = section.warn_after.unwrap_or(defaults.warn_after);
    let fail_after = section.fail_after.unwrap_or(defaults.fail_after);
    let before = problems.len();
    for (name, value) in [("warn_after", warn_after), ("fail_after", fail_after)] {
        if let Some(why) = arbor_supervisor::out_of_range(value, ranges::LOOP_COUNT) {
            problems.push(at(text, table, "loop_detection", format!("{name}: {why}")));
        } else if value == 1 {
            // A run of one is every call: 1 would warn on (or fail) the first.
            problems.push(at(
                text,
                table,
                "loop_detection",
                format!(
                    "{name} = 1 counts every tool call as a loop (a loop is at least 2 \
                     identical calls in a row): use 2 or more, or 0 to turn it off"
                ),
            ));
        }
    }
    if warn_after > 0 && fail_after > 0 && warn_after >= fail_after {
        problems.push(at(
            text,
            table,
            "loop_detection",
            format!(
                "warn_after ({warn_after}) must be below fail_after ({fail_after}), \
                 or 0 to fail without a warning"
            ),
        ));
    }
    if problems.len() > before {
        return defaults;
    }
    LoopDetection {
        warn_after,
        fail_after,
    }
}

/// A spawn cycle needs `limits.max_depth`, or a tree could grow without end.
pub(super) fn check_graph(
    file: &ConfigFile,
    limits: &TreeLimits,
    text: &Source<'_>,
    problems: &mut Vec<Problem>,
) {
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

/// Checks every `[models.NAME]` entry and gives what each model is built
/// from (an entry with a problem gives nothing).
pub(super) fn check_models(
    file: &ConfigFile,
    base_dir: &Path,
    text: &Source<'_>,
    problems: &mut Vec<Problem>,
) -> BTreeMap<String, ModelSpec> {
    let mut out = BTreeMap::new();
    for (name, model) in &file.models {
        let table = format!("models.{name}");
        let spec = match model {
            ModelSection::Simulated(s) => {
                let latency = Latency::parse(&s.latency)
                    .map_err(|e| problems.push(at(text, &table, "latency", e)))
                    .ok();
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
                // Out of range, the tree is not built: `depth = 4294967296` would
                // ask for a 32 GiB shape before being refused.
                let sized = s.fanout <= ranges::FANOUT.1
                    && s.depth <= ranges::DEPTH.1
                    && s.shape.as_ref().is_none_or(|shape| {
                        shape.len() <= ranges::DEPTH.1
                            && shape.iter().all(|&f| f <= ranges::FANOUT.1)
                    });
                let config = latency
                    .filter(|_| sized)
                    .map(|latency| simulated_config(s, latency));
                let agents = config.as_ref().map(|c| c.agents()).unwrap_or(0);
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
                config.map(ModelSpec::Simulated)
            }
            ModelSection::Scripted(s) => match Script::from_file(&base_dir.join(&s.file)) {
                Ok(script) => Some(ModelSpec::Scripted(script)),
                Err(e) => {
                    problems.push(at(text, &table, "file", e.to_string()));
                    None
                }
            },
            ModelSection::Openai(s) | ModelSection::Anthropic(s) => {
                let kind = match model {
                    ModelSection::Anthropic(_) => ProviderKind::Anthropic,
                    _ => ProviderKind::OpenAi,
                };
                match ProviderSettings::from_section(kind, s) {
                    // Without the key: that is read when a catalog is built,
                    // and never kept in a config.
                    Ok(settings) => Some(ModelSpec::Http(Box::new(settings))),
                    Err((key, message)) => {
                        let mut path = vec!["models", name.as_str()];
                        path.extend(key.split('.'));
                        problems.push(Problem {
                            line: text.line(&path),
                            key: path.join("."),
                            message,
                        });
                        None
                    }
                }
            }
        };
        if let Some(spec) = spec {
            out.insert(name.clone(), spec);
        }
    }
    check_thinking(file, text, problems);
    out
}

/// Where a value of a request's options was set: a model's `options` or an
/// agent's `model_options` (laid over its model's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layer<'a> {
    /// `[models.NAME] options`.
    Model(&'a str),
    /// `[agents.NAME] model_options`.
    Agent(&'a str),
}

impl<'a> Layer<'a> {
    /// The path of `field` (dotted, e.g. `extra_body.top_k`) in the file.
    fn path(self, field: &'a str) -> Vec<&'a str> {
        let mut path = match self {
            Layer::Model(name) => vec!["models", name, "options"],
            Layer::Agent(name) => vec!["agents", name, "model_options"],
        };
        path.extend(field.split('.'));
        path
    }

    /// The dotted key of `field`: `models.an.options.temperature`.
    fn key(self, field: &str) -> String {
        self.path(field).join(".")
    }
}

/// One option as the request sends it: its value and the layer that set it.
#[derive(Clone, Debug, PartialEq)]
struct Sent<'a, T> {
    value: T,
    field: &'static str,
    layer: Layer<'a>,
}

/// The layer that set a field: the agent's when it has one that set it.
fn layer_of<'a>(
    agent: Option<(&'a str, &ModelOptions)>,
    model: &'a str,
    set: impl Fn(&ModelOptions) -> bool,
) -> Layer<'a> {
    match agent {
        Some((name, options)) if set(options) => Layer::Agent(name),
        _ => Layer::Model(model),
    }
}

/// A key of `extra_body` as sent (an agent's win over its model's), and the
/// layer that set it.
fn extra<'a>(
    key: &'static str,
    field: &'static str,
    model: (&'a str, &ModelOptions),
    agent: Option<(&'a str, &ModelOptions)>,
) -> Option<Sent<'a, Value>> {
    let of = |o: &ModelOptions| o.extra_body.as_ref().and_then(|e| e.get(key)).cloned();
    if let Some((name, options)) = agent
        && let Some(value) = of(options)
    {
        return Some(Sent {
            value,
            field,
            layer: Layer::Agent(name),
        });
    }
    of(model.1).map(|value| Sent {
        value,
        field,
        layer: Layer::Model(model.0),
    })
}

/// What refuses an Anthropic request with extended thinking on, for the
/// options a model sends (`agent`: an agent's `model_options` laid over
/// them, [`ModelOptions::over`]): each problem's layer, field and why.
/// Empty when thinking is off.
///
/// The rules are the Messages API's, from "Extended thinking" (feature
/// compatibility and sampling parameters,
/// <https://platform.claude.com/docs/en/build-with-claude/extended-thinking#feature-compatibility>):
/// with `thinking` enabled, `tool_choice` may only be `auto` or `none` (a
/// forced tool, `any` or `tool`, is an error), `temperature` only 1 (or
/// unset), `top_k` unset, and `top_p` only from 0.95 to 1. The budget's
/// own rules (at least 1024, below `max_tokens`) hold already:
/// [`ModelOptions::check`] refuses a budget under 1024, and the provider
/// raises `max_tokens` above the budget when it would not be.
fn thinking_conflicts<'a>(
    model: (&'a str, &ModelOptions),
    agent: Option<(&'a str, &ModelOptions)>,
) -> Vec<(Layer<'a>, &'static str, String)> {
    let options = match agent {
        Some((_, a)) => a.over(model.1),
        None => model.1.clone(),
    };
    // Thinking as sent: `reasoning.budget_tokens`, unless `extra_body`
    // replaces the `thinking` field (then its `type` says).
    let thinking = match extra("thinking", "extra_body.thinking", model, agent) {
        Some(sent) => {
            let kind = sent.value.get("type").and_then(Value::as_str);
            matches!(kind, Some("enabled" | "adaptive")).then(|| {
                format!(
                    "{} = {}",
                    sent.layer.key(sent.field),
                    serde_json::to_string(&sent.value).unwrap_or_default()
                )
            })
        }
        None => options
            .reasoning
            .as_ref()
            .and_then(|r| r.budget_tokens)
            .map(|budget| {
                let layer = layer_of(agent, model.0, |o| o.reasoning.is_some());
                format!("{} = {budget}", layer.key("reasoning.budget_tokens"))
            }),
    };
    let Some(thinking) = thinking else {
        return Vec::new();
    };
    let with = format!("with extended thinking on ({thinking})");
    let mut out = Vec::new();

    // A number as sent: `extra_body`'s key wins over the typed field.
    let number = |key: &'static str,
                  field: &'static str,
                  typed: Option<f64>,
                  set: fn(&ModelOptions) -> bool| {
        match extra(key, field, model, agent) {
            Some(sent) => Some(Sent {
                value: sent.value.as_f64(),
                field: sent.field,
                layer: sent.layer,
            }),
            None => typed.map(|v| Sent {
                value: Some(v),
                field: key,
                layer: layer_of(agent, model.0, set),
            }),
        }
    };
    if let Some(sent) = number(
        "temperature",
        "extra_body.temperature",
        options.temperature,
        |o| o.temperature.is_some(),
    ) && sent.value != Some(1.0)
    {
        out.push((
            sent.layer,
            sent.field,
            format!(
                "{} {with}: Anthropic accepts only temperature 1 (or none) when thinking is on",
                shown(sent.value)
            ),
        ));
    }
    if let Some(sent) = number("top_p", "extra_body.top_p", options.top_p, |o| {
        o.top_p.is_some()
    }) && !sent.value.is_some_and(|p| (0.95..=1.0).contains(&p))
    {
        out.push((
            sent.layer,
            sent.field,
            format!(
                "{} {with}: Anthropic accepts top_p only from 0.95 to 1 when thinking is on",
                shown(sent.value)
            ),
        ));
    }
    if let Some(sent) = extra("top_k", "extra_body.top_k", model, agent) {
        out.push((
            sent.layer,
            sent.field,
            format!(
                "{} {with}: Anthropic refuses top_k when thinking is on (remove it)",
                sent.value
            ),
        ));
    }
    // The tool choice as sent: `extra_body`'s object, else the typed one.
    let forced = match extra("tool_choice", "extra_body.tool_choice", model, agent) {
        Some(sent) => {
            let kind = sent.value.get("type").and_then(Value::as_str);
            matches!(kind, Some("any" | "tool"))
                .then(|| (sent.layer, sent.field, sent.value.to_string()))
        }
        None => match &options.tool_choice {
            Some(choice @ (ToolChoice::Required | ToolChoice::Tool(_))) => {
                let layer = layer_of(agent, model.0, |o| o.tool_choice.is_some());
                let shown = match choice {
                    ToolChoice::Tool(name) => format!("{name:?} (a tool it must call)"),
                    _ => "\"required\"".to_owned(),
                };
                Some((layer, "tool_choice", shown))
            }
            _ => None,
        },
    };
    if let Some((layer, field, shown)) = forced {
        out.push((
            layer,
            field,
            format!(
                "{shown} forces a tool call {with}: Anthropic refuses a forced tool when \
                 thinking is on (use \"auto\" or \"none\")"
            ),
        ));
    }
    out
}

/// A number from the config as the message shows it (not a number: "a non-number").
fn shown(value: Option<f64>) -> String {
    value.map_or_else(
        || "a value that is not a number".to_owned(),
        |v| v.to_string(),
    )
}

/// What the provider of `model` (a `[models]` entry, `name` and section)
/// refuses of the options a request on it sends, `agent` being the
/// `[agents]` entry (id and `model_options`) whose requests they are, or
/// `None` for the model's own: each problem's layer, field and why. The one
/// check of options against a model, run by the config check for each agent
/// on its configured model and by [`Config::check_model_override`] for each
/// agent of a tree on the model a start request puts it on. Empty for a
/// model that is not Anthropic's, and for options out of their ranges (those
/// are reported on their own). Today's rules: Anthropic's with extended
/// thinking on ([`thinking_conflicts`]).
///
/// [`Config::check_model_override`]: super::Config::check_model_override
fn option_conflicts<'a>(
    model: (&'a str, &'a ModelSection),
    agent: Option<(&'a str, &'a ModelOptions)>,
) -> Vec<(Layer<'a>, &'static str, String)> {
    let ModelSection::Anthropic(section) = model.1 else {
        return Vec::new();
    };
    if section.options.check().is_err() || agent.is_some_and(|(_, o)| o.check().is_err()) {
        return Vec::new();
    }
    thinking_conflicts((model.0, &section.options), agent)
}

/// Each effective combination of options a model sends (its own `options`,
/// and each agent's on it with its `model_options` over them) against what
/// its provider refuses ([`option_conflicts`]). A problem is reported once,
/// at the key that set the refused value, naming where thinking was turned
/// on.
fn check_thinking(file: &ConfigFile, text: &Source<'_>, problems: &mut Vec<Problem>) {
    let mut seen = HashSet::new();
    for (name, model) in &file.models {
        let agents = file
            .agents
            .iter()
            .filter(|(_, a)| a.model == *name)
            .map(|(id, a)| a.model_options.as_ref().map(|o| (id.as_str(), o)));
        for agent in std::iter::once(None).chain(agents) {
            for (layer, field, message) in option_conflicts((name.as_str(), model), agent) {
                let key = layer.key(field);
                if seen.insert((key.clone(), message.clone())) {
                    problems.push(Problem {
                        line: text.line(&layer.path(field)),
                        key,
                        message,
                    });
                }
            }
        }
    }
}

impl super::Config {
    /// Whether a tree of `agent` (an id, or the one `[agents]` entry a
    /// `publisher/name@version` pattern matches) may run every agent on the
    /// model `model` instead of its own (`arbor run --model`, `POST /v1/runs`
    /// `{"model"}`): each agent the tree can reach (the root and what it may
    /// spawn, transitively), with its `model_options` over that model's
    /// `options`, passes the same check (`option_conflicts`) the config
    /// check runs on an agent's configured model. `Err` names the model, the
    /// agent and the option, and why. An agent or a model this config does
    /// not have passes: starting the tree reports it.
    pub fn check_model_override(&self, agent: &str, model: &str) -> Result<(), String> {
        let file = &self.file;
        let Some((model, section)) = file.models.get_key_value(model) else {
            return Ok(());
        };
        let root = match file.agents.get_key_value(agent) {
            Some((id, _)) => id,
            None => {
                let want = arbor_actors::template::AgentTypeId::parse(agent);
                let mut matching = file
                    .agents
                    .keys()
                    .filter(|id| want.matches(&arbor_actors::template::AgentTypeId::parse(id)));
                match (matching.next(), matching.next()) {
                    (Some(id), None) => id,
                    _ => return Ok(()),
                }
            }
        };
        // The tree's agents, root first, then in the order they are reached.
        let mut reached = vec![root];
        let mut next = 0;
        while let Some(id) = reached.get(next) {
            next += 1;
            for entry in file
                .agents
                .get(*id)
                .map_or(&[][..], |a| &a.spawnable_agents)
            {
                if let Some((entry, _)) = file.agents.get_key_value(entry)
                    && !reached.contains(&entry)
                {
                    reached.push(entry);
                }
            }
        }
        for id in reached {
            let options = file.agents[id].model_options.as_ref();
            let found =
                option_conflicts((model.as_str(), section), options.map(|o| (id.as_str(), o)));
            if let Some((layer, field, why)) = found.into_iter().next() {
                let reached = if id == root {
                    String::new()
                } else {
                    format!(" (which {root:?} may spawn)")
                };
                return Err(format!(
                    "model {model:?} cannot run agent {id:?}{reached}: {}: {why}",
                    layer.key(field)
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::path::PathBuf;

    use crate::config::Config;

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
    fn approval_timeout_and_default_are_checked_by_key_and_line() {
        use arbor_actors::approval::ApprovalDefault;
        let base = "[models.m]\nprovider = \"simulated\"\n\n[agents.a]\nmodel = \"m\"\n";
        let cases = [
            (
                "approval_timeout = \"soon\"",
                "agents.a.approval_timeout",
                "\"soon\"",
            ),
            (
                "approval_timeout = \"0s\"",
                "agents.a.approval_timeout",
                "at least 1ms",
            ),
            (
                "approval_timeout = \"31d\"",
                "agents.a.approval_timeout",
                "at most 30d",
            ),
            (
                "approval_default = \"allow\"",
                "agents.a.approval_default",
                "unknown decision \"allow\" (deny or approve)",
            ),
            (
                "model_options = { temperature = 5.0 }",
                "agents.a.model_options",
                "temperature: must be within 0 and 2",
            ),
            (
                "on_turn_end = \"later\"",
                "agents.a.on_turn_end",
                "must be \"wait\" or \"cancel\", got \"later\"",
            ),
            (
                "tools = [\"spawn_agents_async\"]",
                "agents.a.tools",
                "lists spawn_agents_async but has no spawnable_agents",
            ),
        ];
        for (line, key, why) in cases {
            let err =
                Config::parse(&format!("{base}{line}\n"), "s.toml", PathBuf::new()).unwrap_err();
            assert_eq!(err.problems.len(), 1, "{line}: {err:?}");
            assert_eq!(err.problems[0].key, key, "{line}");
            assert_eq!(err.problems[0].line, Some(6), "{line}");
            assert!(
                err.problems[0].message.contains(why),
                "{line}: {}",
                err.problems[0].message
            );
        }
        let fine = "approval_timeout = \"10m\"\napproval_default = \"approve\"\n";
        let config = Config::parse(&format!("{base}{fine}"), "s.toml", PathBuf::new()).unwrap();
        let a = &config.templates[0];
        assert_eq!(
            a.approval_timeout,
            Some(std::time::Duration::from_secs(600))
        );
        assert_eq!(a.approval_default, ApprovalDefault::Approve);
        let config = Config::parse(base, "s.toml", PathBuf::new()).unwrap();
        let a = &config.templates[0];
        assert_eq!(
            (a.approval_timeout, a.approval_default),
            (None, ApprovalDefault::Deny)
        );
    }

    /// A config with models `oa` (openai), `an` (anthropic), `local`
    /// (openai with `structured = "tool"`) and `sim`, and one agent.
    fn structured_config(agent: &str) -> Result<Config, crate::config::ConfigError> {
        let text = format!(
            "[models.oa]\nprovider = \"openai\"\nmodel = \"gpt-4o\"\n\n\
             [models.an]\nprovider = \"anthropic\"\nmodel = \"claude-sonnet-4-5\"\n\n\
             [models.local]\nprovider = \"openai\"\nmodel = \"q\"\nstructured = \"tool\"\n\n\
             [models.sim]\nprovider = \"simulated\"\n\n\
             [agents.a]\n{agent}\n"
        );
        Config::parse(&text, "s.toml", PathBuf::new())
    }

    #[test]
    fn auto_structured_output_is_native_on_openai_and_the_tool_on_anthropic() {
        use arbor_actors::template::Structured;
        let mode = |agent: &str| structured_config(agent).unwrap().templates[0].structured;
        let so = "output_mode = \"structured_output\"";
        assert_eq!(mode(&format!("model = \"oa\"\n{so}")), Structured::Native);
        assert_eq!(mode(&format!("model = \"an\"\n{so}")), Structured::Tool);
        assert_eq!(mode(&format!("model = \"local\"\n{so}")), Structured::Tool);
        assert_eq!(mode(&format!("model = \"sim\"\n{so}")), Structured::Tool);
        // Not structured_output: nothing native about it.
        assert_eq!(mode("model = \"oa\""), Structured::Tool);
        // Said outright, on a model that can.
        let native =
            structured_config(&format!("model = \"an\"\n{so}\nstructured = \"native\"")).unwrap();
        assert_eq!(native.templates[0].structured, Structured::Native);
        assert!(native.templates[0].model_options.output.is_some());
        assert_eq!(
            mode(&format!("model = \"oa\"\n{so}\nstructured = \"tool\"")),
            Structured::Tool
        );
    }

    #[test]
    fn native_structured_output_where_it_cannot_be_names_the_agent_and_the_model() {
        let so = "output_mode = \"structured_output\"";
        let cases = [
            (
                "model = \"oa\"\nstructured = \"native\"".to_owned(),
                "needs output_mode = \"structured_output\"",
            ),
            (
                format!("model = \"local\"\n{so}\nstructured = \"native\""),
                "model \"local\", whose structured = \"tool\"",
            ),
            (
                format!("model = \"sim\"\n{so}\nstructured = \"native\""),
                "model \"sim\", a simulated model",
            ),
        ];
        for (agent, why) in cases {
            let err = structured_config(&agent).unwrap_err();
            assert_eq!(err.problems.len(), 1, "{agent}: {err:?}");
            assert_eq!(err.problems[0].key, "agents.a.structured", "{agent}");
            assert!(
                err.problems[0].message.contains(why),
                "{agent}: {}",
                err.problems[0].message
            );
        }
        let err = structured_config("model = \"oa\"\nstructured = \"sometimes\"").unwrap_err();
        assert_eq!(err.problems[0].key, "agents.a.structured", "{err:?}");
    }

    fn options(v: serde_json::Value) -> arbor_actors::model::ModelOptions {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn thinking_conflicts_follow_what_the_request_sends() {
        use super::{Layer, thinking_conflicts};
        use serde_json::json;
        let fields = |model: serde_json::Value, agent: Option<serde_json::Value>| {
            let model = options(model);
            let agent = agent.map(options);
            thinking_conflicts(("an", &model), agent.as_ref().map(|a| ("a", a)))
                .into_iter()
                .map(|(layer, field, _)| (layer, field))
                .collect::<Vec<_>>()
        };
        let thinking = json!({"reasoning": {"budget_tokens": 2048}, "temperature": 0.5});
        assert_eq!(
            fields(thinking.clone(), None),
            [(Layer::Model("an"), "temperature")]
        );
        // An agent's reasoning replaces the model's whole: effort alone sends
        // no thinking, so nothing is refused.
        assert!(
            fields(
                thinking.clone(),
                Some(json!({"reasoning": {"effort": "high"}}))
            )
            .is_empty()
        );
        // extra_body's thinking replaces the field on the wire.
        assert!(
            fields(
                thinking.clone(),
                Some(json!({"extra_body": {"thinking": {"type": "disabled"}}}))
            )
            .is_empty()
        );
        assert_eq!(
            fields(
                json!({"temperature": 0.5, "tool_choice": "required"}),
                Some(
                    json!({"extra_body": {"thinking": {"type": "enabled", "budget_tokens": 2048}}})
                )
            ),
            [
                (Layer::Model("an"), "temperature"),
                (Layer::Model("an"), "tool_choice")
            ]
        );
        // An extra_body temperature wins over the typed 1.
        assert_eq!(
            fields(
                json!({"reasoning": {"budget_tokens": 2048}, "temperature": 1.0}),
                Some(json!({"extra_body": {"temperature": 0.7}}))
            ),
            [(Layer::Agent("a"), "extra_body.temperature")]
        );
        assert!(
            fields(
                json!({"reasoning": {"budget_tokens": 2048}, "temperature": 1.0, "top_p": 1.0,
                       "tool_choice": "none", "parallel_tool_calls": false}),
                None
            )
            .is_empty()
        );
    }

    #[test]
    fn a_model_override_is_checked_for_every_agent_the_tree_can_reach() {
        let text = "[models.sim]\nprovider = \"simulated\"\n\n\
                    [models.an]\nprovider = \"anthropic\"\nmodel = \"c\"\n\
                    options = { temperature = 0.5 }\n\n\
                    [agents.lead]\nmodel = \"sim\"\nspawnable_agents = [\"deep\"]\n\n\
                    [agents.deep]\nmodel = \"sim\"\nspawnable_agents = [\"thinker\"]\n\n\
                    [agents.thinker]\nmodel = \"sim\"\n\
                    model_options = { reasoning = { budget_tokens = 2048 } }\n\n\
                    [agents.alone]\nmodel = \"sim\"\n";
        let config = Config::parse(text, "s.toml", PathBuf::new()).unwrap();
        // Thinking turned on by an agent two spawns down, against the
        // override model's temperature: the model's key is named.
        let why = config.check_model_override("lead", "an").unwrap_err();
        assert!(
            why.starts_with(
                "model \"an\" cannot run agent \"thinker\" (which \"lead\" may spawn): \
                 models.an.options.temperature: 0.5 with extended thinking on \
                 (agents.thinker.model_options.reasoning.budget_tokens = 2048)"
            ),
            "{why}"
        );
        // Nothing reachable turns thinking on; an unknown agent or model
        // is left to the start to report.
        assert_eq!(config.check_model_override("alone", "an"), Ok(()));
        assert_eq!(config.check_model_override("lead", "sim"), Ok(()));
        assert_eq!(config.check_model_override("nobody", "an"), Ok(()));
        assert_eq!(config.check_model_override("lead", "nothing"), Ok(()));
    }

    #[test]
    fn an_invalid_schema_is_a_problem_with_its_key() {
        let text = "[models.m]\nprovider = \"simulated\"\n\n[agents.a]\nmodel = \"m\"\noutput_schema = { type = 5 }\n";
        let err = Config::parse(text, "s.toml", PathBuf::new()).unwrap_err();
        assert_eq!(err.problems[0].key, "agents.a.output_schema");
        assert_eq!(err.problems[0].line, Some(6));
    }
}

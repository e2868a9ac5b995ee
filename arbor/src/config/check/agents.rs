//! `[agents.NAME]`: each template's keys against their ranges and each
//! other (output mode and schema, loop detection, timeouts, tools), and the
//! spawn graph (unknown agents, cycles).

use std::collections::HashSet;
use std::sync::Arc;

use arbor_actors::approval::ApprovalDefault;
use arbor_actors::schema::Schema;
use arbor_actors::template::{InputSchema, LoopDetection, Share, Structured};
use arbor_actors::{AgentTemplate, FailurePolicy, OutputMode};
use arbor_supervisor::{TreeLimits, check_pattern};
use serde_json::Value;

use crate::config::file::{LoopDetectionSection, StructuredChoice};
use crate::config::read::{Source, at};
use crate::config::{ConfigFile, FailureSection, ModelSection, Problem};
use crate::providers::ProviderKind;

use super::{duration_in, number, ranges};

/// The template's tools with each `workspace/...` entry (a name or a
/// pattern over Arbor's workspace tool names) made the names of its
/// `tool_names` family (Arbor's by default); an entry that matches no
/// workspace tool, or one the family lacks named outright, is a problem.
fn workspace_tools(
    a: &crate::config::file::AgentSection,
    text: &Source<'_>,
    table: &str,
    problems: &mut Vec<Problem>,
) -> Vec<String> {
    use arbor_tools::workspace::{self, Family};
    let family = a.tool_names.unwrap_or(Family::Arbor);
    let mut out: Vec<String> = Vec::with_capacity(a.tools.len());
    for entry in &a.tools {
        let Some(names) = workspace::expand(entry, family) else {
            out.push(entry.clone());
            continue;
        };
        let matched_any = workspace::expand(entry, Family::Arbor).is_some_and(|n| !n.is_empty());
        if !matched_any {
            problems.push(at(
                text,
                table,
                "tools",
                format!(
                    "{entry:?} names no workspace tool (they are {})",
                    workspace::names(Family::Arbor).join(", ")
                ),
            ));
        } else if names.is_empty() && !entry.contains('*') {
            problems.push(at(
                text,
                table,
                "tools",
                format!("{entry:?}: the {family:?} family of tool names has no such tool"),
            ));
        }
        for name in names {
            if !out.contains(&name) {
                out.push(name);
            }
        }
    }
    out
}

pub(in crate::config) fn templates(
    file: &ConfigFile,
    base_dir: &std::path::Path,
    broken: &HashSet<String>,
    text: &Source<'_>,
    problems: &mut Vec<Problem>,
    unresolved: &mut Vec<(String, Problem)>,
) -> Vec<AgentTemplate> {
    let mut out = Vec::new();
    let workspace_tools_all = arbor_tools::workspace::all_tools();
    let workspace_names: Vec<&str> = workspace_tools_all.iter().map(|t| t.name()).collect();
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
        let tools = workspace_tools(a, text, &table, problems);
        for tool in &tools {
            // Codebuff's templates list every built-in they use (`set_output`,
            // `end_turn`, `spawn_agents` included): each is offered by its own
            // rule (the output mode, the spawnable agents), listed or not.
            if arbor_actors::toolbox::BUILTIN_NAMES.contains(&tool.as_str())
                || file.tools.contains_key(tool)
                || workspace_names.contains(&tool.as_str())
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
                } else if let Err(why) =
                    check_pattern(tool)
                        .map_err(|e| e.to_string())
                        .and_then(|()| {
                            if name.is_empty() {
                                Err("names no tool (write SERVER/* for all of its tools)"
                                    .to_owned())
                            } else {
                                Ok(())
                            }
                        })
                {
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
            Some(name) => {
                name.parse()
                    .unwrap_or_else(|why: arbor_actors::template::UnknownOnTurnEnd| {
                        problems.push(at(text, &table, "on_turn_end", why.to_string()));
                        arbor_actors::OnTurnEnd::Wait
                    })
            }
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
        let compact = check_compaction(a, text, &table, problems);
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
        t.tools = tools;
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
        t.compact = compact;
        t.loop_detection = loop_detection;
        t.approve = a.approve.clone();
        t.approval_timeout = approval_timeout;
        t.approval_default = approval_default;
        t.on_turn_end = on_turn_end;
        t.isolation = a.isolation;
        t.model_options = std::sync::Arc::new(a.model_options.clone().unwrap_or_default());
        t.failure = failure;
        if let Some(program) = &a.program {
            match program_handler(base_dir, program) {
                Ok(handler) => t.handler = Some(handler),
                Err(why) => problems.push(at(text, &table, "program", why.to_string())),
            }
        }
        let structured = structured_mode(
            a.structured,
            a.output_mode,
            &a.model,
            file.models.get(&a.model),
        )
        .unwrap_or_else(|why| {
            problems.push(at(text, &table, "structured", why.to_string()));
            Structured::Tool
        });
        // Last: it puts the output schema on the template's requests.
        out.push(t.structured(structured));
    }
    out
}

/// Why an agent's `program` cannot run (each names the program as
/// configured).
#[derive(Debug, thiserror::Error)]
enum BadProgram {
    /// Its file or a file it imports does not load (`file:line: problem`).
    #[cfg(feature = "programs")]
    #[error("{0:?}: {1}")]
    Load(String, arbor_programs::LoadError),
    /// This build has no JavaScript engine.
    #[cfg(not(feature = "programs"))]
    #[error("{0:?}: this build has no JavaScript engine (arbor-agents' feature `programs`)")]
    NoEngine(String),
}

/// The step handler of `program = "..."`: the file (relative to the
/// config's directory, which is also the directory its imports stay in)
/// loaded into the JavaScript engine.
#[cfg(feature = "programs")]
fn program_handler(
    base_dir: &std::path::Path,
    program: &str,
) -> Result<Arc<dyn arbor_actors::handler::StepHandler>, BadProgram> {
    use arbor_programs::{JsHandler, Limits, load_program_file};
    let limits = Limits::default();
    let root = if base_dir.as_os_str().is_empty() {
        std::path::Path::new(".")
    } else {
        base_dir
    };
    let loaded = load_program_file(root, &root.join(program), limits)
        .map_err(|e| BadProgram::Load(program.to_owned(), e))?;
    Ok(Arc::new(JsHandler::new(loaded, limits)))
}

/// Without the `programs` feature there is no engine to run a program in.
#[cfg(not(feature = "programs"))]
fn program_handler(
    _base_dir: &std::path::Path,
    program: &str,
) -> Result<Arc<dyn arbor_actors::handler::StepHandler>, BadProgram> {
    Err(BadProgram::NoEngine(program.to_owned()))
}

/// Why an agent's `structured = "native"` cannot be.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
enum NotNative {
    /// Its output mode is not `structured_output` (the mode's name).
    #[error("\"native\" needs output_mode = \"structured_output\" (this agent's is {0:?})")]
    OutputMode(&'static str),
    /// Its model says `structured = "tool"` (the model's name).
    #[error(
        "\"native\" on model {0:?}, whose structured = \"tool\" says it cannot \
         answer in a schema (use \"tool\" or \"auto\" here, or another model)"
    )]
    ToolModel(String),
    /// Its model is a simulated one (the model's name).
    #[error(
        "\"native\" on model {0:?}, a simulated model, which cannot answer in a \
         schema (use \"tool\" or \"auto\")"
    )]
    Simulated(String),
}

/// How a template gives its structured output, from its `structured`, its
/// output mode and the `[models]` entry it runs on (`None`: not defined,
/// reported on its own); `Err` names the model and why it cannot be native.
/// `auto` is native only for `structured_output` on a model that does it
/// best natively: the model's own `structured`, else its provider's default.
fn structured_mode(
    choice: StructuredChoice,
    output_mode: OutputMode,
    model_name: &str,
    model: Option<&ModelSection>,
) -> Result<Structured, NotNative> {
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
        StructuredChoice::Native if !structured_output => {
            Err(NotNative::OutputMode(output_mode_name(output_mode)))
        }
        StructuredChoice::Native => match (model, said) {
            (_, Some(Structured::Tool)) => Err(NotNative::ToolModel(model_name.to_owned())),
            (Some(ModelSection::Simulated(_)), _) => {
                Err(NotNative::Simulated(model_name.to_owned()))
            }
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
pub(in crate::config) fn check_graph(
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

/// An agent's `compact_at`, `compact_keep` and `compact_prompt` (issue 37):
/// a token count within `context_window`'s range, or a share of a
/// `context_window` the template has; the other two only with it.
fn check_compaction(
    a: &crate::config::file::AgentSection,
    text: &Source<'_>,
    table: &str,
    problems: &mut Vec<Problem>,
) -> Option<arbor_actors::compact::Compaction> {
    use crate::config::file::CompactAt;
    let Some(compact_at) = a.compact_at else {
        for (key, set) in [
            ("compact_keep", a.compact_keep.is_some()),
            ("compact_prompt", a.compact_prompt.is_some()),
        ] {
            if set {
                problems.push(at(
                    text,
                    table,
                    key,
                    "is used only with compact_at, which is not set".to_owned(),
                ));
            }
        }
        return None;
    };
    let before = problems.len();
    let tokens = match compact_at {
        CompactAt::Tokens(tokens) => {
            number(
                text,
                table,
                "compact_at",
                Some(tokens),
                ranges::CONTEXT_WINDOW,
                problems,
            );
            if let Some(window) = a.context_window.filter(|w| tokens > *w) {
                problems.push(at(
                    text,
                    table,
                    "compact_at",
                    format!(
                        "{tokens} tokens is over context_window ({window}): the window's \
                         truncation would cut the history first"
                    ),
                ));
            }
            tokens
        }
        CompactAt::Share(share) if share.is_nan() || share <= 0.0 || share > 1.0 => {
            problems.push(at(
                text,
                table,
                "compact_at",
                format!(
                    "{share} is neither a token count nor a share of context_window in (0, 1] \
                     (0.8 compacts at 80% of the window)"
                ),
            ));
            0
        }
        CompactAt::Share(share) => match a.context_window {
            Some(window) => (window as f64 * share).round() as u64,
            None => {
                problems.push(at(
                    text,
                    table,
                    "compact_at",
                    format!(
                        "{share} is a share of context_window, which this agent does not set: \
                         set context_window, or give compact_at in tokens"
                    ),
                ));
                0
            }
        },
    };
    if let Some(keep) = a.compact_keep {
        number(
            text,
            table,
            "compact_keep",
            Some(keep),
            ranges::COMPACT_KEEP,
            problems,
        );
    }
    if a.compact_prompt
        .as_deref()
        .is_some_and(|p| p.trim().is_empty())
    {
        problems.push(at(
            text,
            table,
            "compact_prompt",
            "is empty: remove it to use the built-in summary prompt".to_owned(),
        ));
    }
    if problems.len() > before {
        return None;
    }
    Some(arbor_actors::compact::Compaction {
        at: tokens,
        keep: a
            .compact_keep
            .map_or(arbor_actors::compact::Compaction::DEFAULT_KEEP, |k| {
                k as usize
            }),
        prompt: a.compact_prompt.as_deref().map(Arc::from),
    })
}

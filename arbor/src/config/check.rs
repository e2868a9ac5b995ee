//! The checks: every section's values against their ranges and each other
//! (limits, templates, models, `[service]`, the spawn graph), turned into the
//! validated values a [`Config`](super::Config) holds. The helpers every
//! section's checks share (a duration or a number within its range, the
//! documented ranges) are here; the checks of each part of the file are in
//! `service`, `tools`, `agents` (templates and the spawn graph) and
//! `models`.

use std::fmt;

use arbor_actors::models::SimulatedConfig;
use arbor_supervisor::TreeLimits;

use super::Problem;
use super::read::{Source, at};

mod agents;
mod models;
mod service;
mod tools;

pub(super) use agents::{check_graph, templates};
pub(super) use models::check_models;
pub(super) use service::check_service;
pub(super) use tools::{command_tools, mcp_servers};

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
        .and_then(|d| {
            arbor_actors::duration::within(d, range.0, range.1).map_err(|e| e.to_string())
        }) {
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

/// What a tree may be estimated to hold at its peak on this machine: 80 %
/// of its memory (or of its cgroup's limit, when that is lower), or of
/// 8 GiB when neither can be read. A check refuses a simulated tree whose
/// estimate ([`SimulatedConfig::peak_bytes`]) is over it, so that what
/// passes does not abort on allocation (issue 34).
pub fn memory_budget() -> u64 {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find_map(|l| l.strip_prefix("MemTotal:"))?;
            let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
            Some(kib.saturating_mul(1024))
        });
    // cgroup v2's limit; "max" (none) does not parse.
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok());
    let memory = match (total, cgroup) {
        (Some(total), Some(limit)) => total.min(limit),
        (total, limit) => total.or(limit).unwrap_or(8 << 30),
    };
    memory / 5 * 4
}

/// Why the simulated tree `config` cannot run here, if its estimated peak
/// with `live` agents stepping at once and at most `max_agents` is over
/// [`memory_budget`]; `lower` says what to change.
pub fn peak_problem(
    config: &SimulatedConfig,
    live: Option<u64>,
    max_agents: Option<u64>,
    lower: &str,
) -> Option<String> {
    let peak = config.peak_bytes(live, max_agents);
    let budget = memory_budget();
    let gb = |bytes: u64| format!("{:.1} GB", bytes as f64 / 1e9);
    let alive = match live {
        None => "with no live cap every agent is alive at once".to_owned(),
        Some(live) => format!("{live} agents stepping at once"),
    };
    (peak > budget).then(|| {
        format!(
            "makes a tree that holds about {} at its peak ({alive}): more than the {} this \
             machine can give it (80 % of its memory); {lower}",
            gb(peak),
            gb(budget)
        )
    })
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
    /// An agent's `compact_keep`: model steps a compaction keeps verbatim.
    pub const COMPACT_KEEP: (u32, u32) = (1, 1000);
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

/// The range of each of `[limits]`' values (zeros were refused as it was read).
pub(super) fn check_limits(limits: &TreeLimits, text: &Source<'_>, problems: &mut Vec<Problem>) {
    for (key, problem) in limits.problems() {
        problems.push(at(text, "limits", key, problem));
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
        use super::models::{Layer, thinking_conflicts};
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
        let why = config
            .check_model_override("lead", "an")
            .unwrap_err()
            .to_string();
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

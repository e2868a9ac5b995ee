//! Agent templates: what an agent runs, may spawn, and how it reports (semantics §1, §6–§8).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::approval::ApprovalDefault;
use crate::handler::StepHandler;
use crate::schema::Schema;

/// How a child's run becomes the `value` its parent sees (semantics §7).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputMode {
    /// `last_message` (the default): the last assistant turn.
    #[default]
    LastMessage,
    /// `all_messages`: the messages the run added.
    AllMessages,
    /// `structured_output`: the value of `set_output` (or null).
    StructuredOutput,
}

/// How a `structured_output` run gives its output (a template's
/// `structured`, semantics §7).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Structured {
    /// The model calls `set_output` with the value (the default).
    #[default]
    Tool,
    /// The request carries the output schema in the provider's
    /// structured-output field and `set_output` is not offered: the text of
    /// the reply that ends the turn is the output, parsed as JSON and checked
    /// against the schema (a bad one is sent back to the model to retry).
    Native,
}

impl Structured {
    /// Its config name (`tool`, `native`).
    pub fn name(self) -> &'static str {
        match self {
            Structured::Tool => "tool",
            Structured::Native => "native",
        }
    }
}

/// What a parent does when this template's run fails (semantics §8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailurePolicy {
    /// The failure becomes the child's `{errorMessage}` value.
    #[default]
    Report,
    /// Run again from the initial state, up to `max` more times, waiting `backoff`
    /// (doubled each attempt) in between.
    Retry {
        /// Retries after the first run.
        max: u32,
        /// The wait before the first retry.
        backoff: Duration,
    },
    /// The parent fails too.
    Escalate,
}

/// A fraction in (0, 1], such as a template's `report_share`.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub struct Share(f64);

impl Share {
    /// A template's `report_share` unless it says otherwise: a quarter.
    pub const DEFAULT_REPORT: Share = Share(0.25);

    /// `fraction` as a share, or `None` if it is not in (0, 1] (NaN included).
    pub fn new(fraction: f64) -> Option<Share> {
        (fraction > 0.0 && fraction <= 1.0).then_some(Share(fraction))
    }

    /// The fraction.
    pub fn get(self) -> f64 {
        self.0
    }

    /// This share of `total`, rounded down.
    pub fn of(self, total: u64) -> u64 {
        // Exact for any window a config accepts (at most 10^8 tokens).
        (total as f64 * self.0).floor() as u64
    }
}

/// When the same tool call, made again and again with the same result,
/// counts as a loop (semantics §11). A count of 0 turns that stage off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoopDetection {
    /// Identical calls in a row that emit a `looping` event (default 3).
    pub warn_after: u32,
    /// Identical calls in a row that fail the run (default 5).
    pub fail_after: u32,
}

impl LoopDetection {
    /// Never warns, never fails.
    pub const OFF: LoopDetection = LoopDetection {
        warn_after: 0,
        fail_after: 0,
    };
}

impl Default for LoopDetection {
    fn default() -> Self {
        LoopDetection {
            warn_after: 3,
            fail_after: 5,
        }
    }
}

/// What a run does when its turn would end while background children it
/// started with `spawn_agents_async` still run (semantics §15).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnTurnEnd {
    /// It waits for them (holding no live slot); each report starts a step.
    #[default]
    Wait,
    /// It ends, and they are cancelled.
    Cancel,
}

/// A text that is no [`OnTurnEnd`] (the text as given).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("must be \"wait\" or \"cancel\", got {0:?}")]
pub struct UnknownOnTurnEnd(pub String);

impl std::str::FromStr for OnTurnEnd {
    type Err = UnknownOnTurnEnd;
    fn from_str(s: &str) -> Result<Self, UnknownOnTurnEnd> {
        match s {
            "wait" => Ok(OnTurnEnd::Wait),
            "cancel" => Ok(OnTurnEnd::Cancel),
            other => Err(UnknownOnTurnEnd(other.to_owned())),
        }
    }
}

/// The JSON Schemas a spawn's `prompt` and `params` must satisfy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InputSchema {
    /// The schema of `prompt` (a JSON string); `None`: any prompt, or none.
    pub prompt: Option<Schema>,
    /// The schema of `params`; `None`: any params, or none.
    pub params: Option<Schema>,
}

/// A named agent definition. Built from `config.toml` or in code.
#[derive(Clone)]
pub struct AgentTemplate {
    /// The id spawns refer to, e.g. `researcher` or `acme/researcher@1.2.0`.
    pub id: String,
    /// The name a parent's spawn result shows (`agentName`); by default the id's name part.
    pub display_name: String,
    /// What this agent is for, as the spawn tools of its parents tell their model.
    pub description: Option<String>,
    /// When a parent should spawn it (added to the spawn tools' description).
    pub spawner_prompt: Option<String>,
    /// A user message added after the prompt (tagged `INSTRUCTIONS_PROMPT`, kept
    /// during truncation), as Codebuff's `instructionsPrompt`.
    pub instructions_prompt: Option<Arc<str>>,
    /// A short user message added at the end of every model request (tagged
    /// `STEP_PROMPT`); never stored in the history.
    pub step_prompt: Option<Arc<str>>,
    /// Name of the model in the catalog.
    pub model: String,
    /// The system message of every model call.
    pub system_prompt: Arc<str>,
    /// External tools by name (built-ins are always available).
    pub tools: Vec<String>,
    /// The agent types it may spawn (`publisher/name@version`, parts optional).
    pub spawnable_agents: Vec<String>,
    /// How its run becomes its parent's `value`.
    pub output_mode: OutputMode,
    /// The schema `set_output` values must satisfy (`None`: any value).
    pub output_schema: Option<Schema>,
    /// How a `structured_output` run gives its output: through `set_output`
    /// or natively, in the reply's text. Set it with
    /// [`AgentTemplate::structured`], which also puts the schema on the
    /// template's requests (`model_options.output`).
    pub structured: Structured,
    /// The schemas its spawn input must satisfy.
    pub input_schema: InputSchema,
    /// Whether a child starts from its parent's history (filtered), then a
    /// `SUBAGENT_SPAWN` notice.
    pub include_message_history: bool,
    /// Whether a child runs with its parent's system prompt and toolbox.
    pub inherit_parent_system_prompt: bool,
    /// Model steps one run may take (its `stepsRemaining` at the start).
    pub max_steps: u32,
    /// The longest a step's model call and tools may take (not waiting for
    /// children); `None`: no limit.
    pub step_timeout: Option<Duration>,
    /// The longest the run's own work in flight (its model call, its tools)
    /// may go without progress (a delta, a tool ending, a step starting)
    /// before it fails as stalled (semantics §11); `None`: not watched.
    pub idle_timeout: Option<Duration>,
    /// Estimated tokens a request may hold before truncation builds a shorter view.
    pub context_window: Option<u64>,
    /// The share of its remaining context window (`context_window` less
    /// `contextTokenCount`) one child's report may take in a spawn result;
    /// a larger one is cut (semantics §10). Only with a `context_window`.
    pub report_share: Share,
    /// When and how the run compacts its history before a step
    /// (`compact_at`, issue 37); `None`: never.
    pub compact: Option<crate::compact::Compaction>,
    /// When repeating the same tool call warns and fails (semantics §11).
    pub loop_detection: LoopDetection,
    /// Patterns of the tools (by the names templates use, `fs/write_*`)
    /// whose calls wait for a person's decision (semantics §12); the
    /// supervisor marks them when it builds the template's toolbox.
    pub approve: Vec<String>,
    /// How long a step's calls wait for decisions before each one still
    /// waiting gets `approval_default` (semantics §12); `None`: for ever.
    pub approval_timeout: Option<Duration>,
    /// The decision a call gets when `approval_timeout` passes without one.
    pub approval_default: ApprovalDefault,
    /// What its parent does when its run fails.
    pub failure: FailurePolicy,
    /// Request options over the model's own (`model_options`): sampling,
    /// tool choice, reasoning, extra body fields.
    pub model_options: Arc<crate::model::ModelOptions>,
    /// What a run whose turn would end does while its background children
    /// (`spawn_agents_async`) still run (semantics §15).
    pub on_turn_end: OnTurnEnd,
    /// A programmatic driver (semantics §4.5); `None` lets the model drive.
    pub handler: Option<Arc<dyn StepHandler>>,
    /// Where its runs work: in their parent's workspace, or in a git
    /// worktree of their own ([`crate::worktree`]).
    pub isolation: crate::worktree::Isolation,
}

impl AgentTemplate {
    /// Where a run of this template whose parent works in `parent` (for a
    /// root, the tree's workspace) works: there, or in a worktree of its
    /// own made from it when the template isolates it
    /// ([`crate::worktree`]). Nothing is made here.
    pub fn workspace_for(
        &self,
        parent: Option<&Arc<dyn crate::tool::Workspace>>,
        run_id: &crate::id::RunId,
    ) -> Option<Arc<dyn crate::tool::Workspace>> {
        let parent = parent?.clone();
        if self.isolation != crate::worktree::Isolation::Worktree {
            return Some(parent);
        }
        let agent_type = AgentTypeId::parse(&self.id).name;
        match parent.clone().isolate(run_id, agent_type) {
            Some(own) => Some(own),
            None => Some(parent),
        }
    }

    /// A template with defaults: no tools, no children, `last_message` output, 20 steps.
    pub fn new(id: impl Into<String>, model: impl Into<String>) -> Self {
        let id = id.into();
        AgentTemplate {
            display_name: AgentTypeId::parse(&id).name.to_owned(),
            id,
            description: None,
            spawner_prompt: None,
            instructions_prompt: None,
            step_prompt: None,
            model: model.into(),
            system_prompt: Arc::from(""),
            tools: Vec::new(),
            spawnable_agents: Vec::new(),
            output_mode: OutputMode::LastMessage,
            output_schema: None,
            structured: Structured::Tool,
            input_schema: InputSchema::default(),
            include_message_history: false,
            inherit_parent_system_prompt: false,
            max_steps: 20,
            step_timeout: None,
            idle_timeout: None,
            context_window: None,
            report_share: Share::DEFAULT_REPORT,
            compact: None,
            loop_detection: LoopDetection::default(),
            approve: Vec::new(),
            approval_timeout: None,
            approval_default: ApprovalDefault::Deny,
            failure: FailurePolicy::Report,
            on_turn_end: OnTurnEnd::Wait,
            model_options: Arc::default(),
            handler: None,
            isolation: crate::worktree::Isolation::Shared,
        }
    }

    /// This template with a system prompt.
    pub fn system_prompt(mut self, prompt: &str) -> Self {
        self.system_prompt = Arc::from(prompt);
        self
    }

    /// This template allowed to spawn these agent types.
    pub fn spawns(mut self, agents: &[&str]) -> Self {
        self.spawnable_agents = agents.iter().map(|a| (*a).to_owned()).collect();
        self
    }

    /// This template with an output mode.
    pub fn output_mode(mut self, mode: OutputMode) -> Self {
        self.output_mode = mode;
        self
    }

    /// This template giving its structured output this way. With
    /// [`Structured::Native`] its requests carry the output schema
    /// ([`AgentTemplate::output_format`], in `model_options.output`), so
    /// call this after setting `output_mode`, `output_schema` and
    /// `model_options`.
    pub fn structured(mut self, mode: Structured) -> Self {
        self.structured = mode;
        let output = self.output_format();
        if self.model_options.output != output {
            let mut options = (*self.model_options).clone();
            options.output = output;
            self.model_options = Arc::new(options);
        }
        self
    }

    /// Whether its run gives its output natively: `structured_output` mode
    /// with [`Structured::Native`].
    pub fn native_output(&self) -> bool {
        self.output_mode == OutputMode::StructuredOutput && self.structured == Structured::Native
    }

    /// The schema a native reply must follow: the output schema (an object
    /// schema when there is none), named after the template; `None` unless
    /// [`AgentTemplate::native_output`].
    pub fn output_format(&self) -> Option<crate::model::OutputFormat> {
        if !self.native_output() {
            return None;
        }
        let schema = self.output_schema.clone().unwrap_or_else(any_object);
        Some(crate::model::OutputFormat {
            name: crate::names::wire_name(&self.display_name),
            strict: crate::schema::fits_strict_subset(schema.source()),
            schema,
        })
    }

    /// This template with a step limit per run.
    pub fn max_steps(mut self, steps: u32) -> Self {
        self.max_steps = steps;
        self
    }

    /// This template with a failure policy.
    pub fn failure(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// This template driven by a step handler.
    pub fn handler(mut self, handler: Arc<dyn StepHandler>) -> Self {
        self.handler = Some(handler);
        self
    }

    /// The first `spawnableAgents` entry that `requested` names (semantics §6).
    pub(crate) fn match_spawnable(&self, requested: &str) -> Option<&str> {
        let want = AgentTypeId::parse(requested);
        self.spawnable_agents
            .iter()
            .find(|entry| want.matches(&AgentTypeId::parse(entry)))
            .map(String::as_str)
    }

    /// Checks a spawn's prompt and params against this template's input schema.
    pub fn check_input(
        &self,
        prompt: Option<&str>,
        params: Option<&Value>,
    ) -> Result<(), InputError> {
        if let Some(schema) = &self.input_schema.prompt {
            let prompt = prompt.map_or(Value::Null, |p| Value::String(p.to_owned()));
            schema.check(&prompt).map_err(|e| InputError::Prompt {
                agent: self.id.clone(),
                problem: e.to_string(),
            })?;
        }
        if let Some(schema) = &self.input_schema.params {
            let params = params.cloned().unwrap_or(Value::Object(Default::default()));
            schema.check(&params).map_err(|e| InputError::Params {
                agent: self.id.clone(),
                problem: e.to_string(),
            })?;
        }
        Ok(())
    }
}

/// The schema of an output when a template names none: any object (what
/// `set_output` takes).
pub(crate) fn any_object() -> Schema {
    static ANY: std::sync::LazyLock<Schema> = std::sync::LazyLock::new(|| {
        Schema::compile(serde_json::json!({"type": "object"}))
            .unwrap_or_else(|e| panic!("built-in schema: {e}"))
    });
    ANY.clone()
}

impl fmt::Debug for AgentTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentTemplate")
            .field("id", &self.id)
            .field("model", &self.model)
            .field("spawnable_agents", &self.spawnable_agents)
            .field("output_mode", &self.output_mode)
            .field("structured", &self.structured)
            .field("max_steps", &self.max_steps)
            .field("failure", &self.failure)
            .field("on_turn_end", &self.on_turn_end)
            .field("handler", &self.handler.is_some())
            .finish_non_exhaustive()
    }
}

/// A prompt or params that do not fit an agent's input schema.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// The prompt does not fit.
    #[error("Invalid prompt for agent {agent}: {problem}")]
    Prompt {
        /// The agent's template id.
        agent: String,
        /// What the schema check found.
        problem: String,
    },
    /// The params do not fit.
    #[error("Invalid params for agent {agent}: {problem}")]
    Params {
        /// The agent's template id.
        agent: String,
        /// What the schema check found.
        problem: String,
    },
}

/// An agent type id, `publisher/name@version` with publisher and version optional.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentTypeId<'a> {
    /// The publisher, if the id names one.
    pub publisher: Option<&'a str>,
    /// The name.
    pub name: &'a str,
    /// The version, if the id names one.
    pub version: Option<&'a str>,
}

impl<'a> AgentTypeId<'a> {
    /// Splits an id into its parts (no validation: every text is an id).
    pub fn parse(id: &'a str) -> Self {
        let (rest, version) = match id.rsplit_once('@') {
            Some((rest, version)) => (rest, Some(version)),
            None => (id, None),
        };
        let (publisher, name) = match rest.split_once('/') {
            Some((publisher, name)) => (Some(publisher), name),
            None => (None, rest),
        };
        AgentTypeId {
            publisher,
            name,
            version,
        }
    }

    /// A request matches an entry equal in every part the request gives.
    pub fn matches(&self, entry: &AgentTypeId<'_>) -> bool {
        self.name == entry.name
            && self.publisher.is_none_or(|p| entry.publisher == Some(p))
            && self.version.is_none_or(|v| entry.version == Some(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ids_parse_in_every_form() {
        let full = AgentTypeId::parse("acme/researcher@1.2.0");
        assert_eq!(full.publisher, Some("acme"));
        assert_eq!(full.name, "researcher");
        assert_eq!(full.version, Some("1.2.0"));
        let bare = AgentTypeId::parse("researcher");
        assert_eq!(
            (bare.publisher, bare.name, bare.version),
            (None, "researcher", None)
        );
    }

    #[test]
    fn a_request_matches_entries_equal_in_the_parts_it_gives() {
        let t = AgentTemplate::new("p", "m").spawns(&[
            "other/researcher@2.0.0",
            "acme/researcher@1.0.0",
            "acme/researcher@1.2.0",
            "writer",
        ]);
        assert_eq!(
            t.match_spawnable("researcher"),
            Some("other/researcher@2.0.0")
        );
        assert_eq!(
            t.match_spawnable("acme/researcher"),
            Some("acme/researcher@1.0.0")
        );
        assert_eq!(
            t.match_spawnable("acme/researcher@1.2.0"),
            Some("acme/researcher@1.2.0")
        );
        assert_eq!(
            t.match_spawnable("researcher@1.2.0"),
            Some("acme/researcher@1.2.0")
        );
        assert_eq!(t.match_spawnable("writer"), Some("writer"));
        assert_eq!(t.match_spawnable("acme/writer"), None);
        assert_eq!(t.match_spawnable("researcher@9"), None);
    }

    #[test]
    fn a_native_template_puts_its_output_schema_on_its_requests() {
        let mut t =
            AgentTemplate::new("acme/judge@1", "m").output_mode(OutputMode::StructuredOutput);
        t.output_schema = Some(
            Schema::compile(json!({"type": "object", "additionalProperties": false,
                "properties": {"score": {"type": "number"}}, "required": ["score"]}))
            .unwrap(),
        );
        let t = t.structured(Structured::Native);
        assert!(t.native_output());
        let format = t.model_options.output.clone().unwrap();
        assert_eq!(format.name, "judge");
        assert!(format.strict);
        assert_eq!(format.schema, t.output_schema.clone().unwrap());
        // Back to the tool: the requests carry no schema.
        let t = t.structured(Structured::Tool);
        assert!(!t.native_output());
        assert_eq!(t.model_options.output, None);
        // Native means nothing outside structured_output.
        let plain = AgentTemplate::new("w", "m").structured(Structured::Native);
        assert!(!plain.native_output());
        assert_eq!(plain.output_format(), None);
    }

    #[test]
    fn input_schemas_check_prompt_and_params() {
        let mut t = AgentTemplate::new("c", "m");
        t.input_schema.params = Some(
            Schema::compile(json!({"type": "object", "required": ["n"],
                "properties": {"n": {"type": "integer"}}}))
            .unwrap(),
        );
        assert!(t.check_input(Some("go"), Some(&json!({"n": 3}))).is_ok());
        let err = t
            .check_input(Some("go"), Some(&json!({"n": "x"})))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("Invalid params for agent c: at /n"),
            "{err}"
        );
        assert!(t.check_input(Some("go"), None).is_err());
    }

    #[test]
    fn a_prompt_the_input_schema_refuses_is_an_invalid_prompt_error_naming_the_agent() {
        let mut t = AgentTemplate::new("c", "m");
        t.input_schema.prompt =
            Some(Schema::compile(json!({"type": "string", "minLength": 5})).unwrap());
        assert!(t.check_input(Some("a long task"), None).is_ok());
        let err = t.check_input(Some("go"), None).unwrap_err();
        assert!(
            matches!(&err, InputError::Prompt { agent, .. } if agent == "c"),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(text.starts_with("Invalid prompt for agent c: "), "{text}");
        // No prompt at all is checked as null, and refused the same way.
        let none = t.check_input(None, None).unwrap_err().to_string();
        assert!(none.starts_with("Invalid prompt for agent c: "), "{none}");
    }
}

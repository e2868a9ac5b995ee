//! The `Model` port: what an agent asks of a language model and what it gets back.
//!
//! Providers (HTTP), the scripted model and the simulated model all implement it.
//! A request is built by the step machine from an already repaired history.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::failure::{Failure, FailureKind};
use crate::history::History;
use crate::message::Message;
use crate::state::ToolDefinitions;

/// One model call.
#[derive(Clone, Debug)]
pub struct ModelRequest {
    /// The agent's system prompt, sent as the system message.
    pub system_prompt: Arc<str>,
    /// The history view: paired by id, expired messages removed, truncated to
    /// fit. A `History`, so building a request copies nothing.
    pub messages: History,
    /// The tools the model is offered, by wire name.
    pub tools: ToolDefinitions,
    /// Who is asking.
    pub meta: RequestMeta,
}

/// Who is asking; providers ignore it, built-in models use it.
#[derive(Clone, Debug, Default)]
pub struct RequestMeta {
    /// The agent's tree.
    pub tree_id: Arc<str>,
    /// The agent's run id.
    pub run_id: String,
    /// The agent's `agentType` (empty if it has none).
    pub agent_type: String,
    /// 0 for a root agent.
    pub depth: usize,
    /// 1 for the first step of the run.
    pub step: u32,
    /// Leading messages of `messages` that the run took from its parent, up
    /// to its own prompt: the same for every sibling spawned from that
    /// parent at once, so a provider cache breakpoint after them lets the
    /// siblings share the cached prefix (0 for a root).
    pub shared_prefix: usize,
    /// When the tree's deadline falls (`None`: it has none). A model client
    /// must not wait for a retry beyond it.
    pub deadline: Option<tokio::time::Instant>,
    /// The template's request options (`model_options`), over the model's own.
    pub options: Arc<ModelOptions>,
    /// The call summarises the run's old turns to compact its history
    /// (`compact_at`), before step `step`'s own call: no reply of a step
    /// (a store's record of the step's reply never answers it).
    pub summary: bool,
}

/// How a model call asks: sampling, tool use, reasoning and an escape hatch
/// for server-specific fields. A model's `options` and a template's
/// `model_options` are both this; the template's win ([`ModelOptions::over`]).
/// Every field is optional: `None` sends nothing and leaves the API's default.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelOptions {
    /// Sampling temperature (0 to 2).
    pub temperature: Option<f64>,
    /// Nucleus sampling mass (0 to 1).
    pub top_p: Option<f64>,
    /// Sequences that end the reply (at most 4).
    pub stop: Option<Vec<String>>,
    /// A seed for providers that sample reproducibly.
    pub seed: Option<i64>,
    /// Whether and which tool the model must call.
    pub tool_choice: Option<ToolChoice>,
    /// Whether the model may call several tools in one reply.
    pub parallel_tool_calls: Option<bool>,
    /// Reasoning ("thinking") controls.
    pub reasoning: Option<Reasoning>,
    /// A JSON object merged into the request body as it is (the last word:
    /// its keys replace the ones Arbor set), for server-specific fields such
    /// as Ollama's `options` or vLLM's `guided_json`.
    pub extra_body: Option<serde_json::Map<String, Value>>,
    /// The schema the reply's text must follow, for a template whose
    /// structured output is native (`Structured::Native`): set by the
    /// template (`AgentTemplate::structured`), never read from a config. A provider sends it as its API's structured-output field.
    #[serde(skip)]
    pub output: Option<OutputFormat>,
}

/// The schema a native structured reply must follow, as a provider sends it
/// (OpenAI's `response_format` json_schema, the Responses API's
/// `text.format`, Anthropic's `output_config.format`).
#[derive(Clone, Debug, PartialEq)]
pub struct OutputFormat {
    /// A name for the schema (`[A-Za-z0-9_-]`, at most 64 characters, as
    /// OpenAI requires): the template's display name as a wire name.
    pub name: String,
    /// The output schema (`{"type": "object"}` when the template has none).
    pub schema: crate::schema::Schema,
    /// Whether the schema fits OpenAI's strict subset
    /// ([`crate::schema::fits_strict_subset`]), so it can be sent with
    /// `strict: true`.
    pub strict: bool,
}

/// Whether the model must call a tool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// The model must call some tool.
    Required,
    /// The model must not call a tool.
    None,
    /// The model must call this tool (by the name the model sees).
    #[serde(untagged)]
    Tool(String),
}

/// Reasoning controls: an effort (OpenAI's `reasoning_effort`) or a token
/// budget (Anthropic's `thinking`); a provider uses what it has.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reasoning {
    /// `minimal`, `low`, `medium` or `high`.
    pub effort: Option<ReasoningEffort>,
    /// Tokens the model may think for (at least 1024).
    pub budget_tokens: Option<u32>,
}

/// How hard a reasoning model thinks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningEffort {
    /// As little as the model allows.
    Minimal,
    /// Low.
    Low,
    /// Medium.
    Medium,
    /// High.
    High,
}

impl ReasoningEffort {
    /// Its wire name (`low`).
    pub fn name(self) -> &'static str {
        match self {
            ReasoningEffort::Minimal => "minimal",
            ReasoningEffort::Low => "low",
            ReasoningEffort::Medium => "medium",
            ReasoningEffort::High => "high",
        }
    }
}

impl ModelOptions {
    /// These options over `base`: each field set here wins; `extra_body`
    /// objects are merged (keys set here win).
    pub fn over(&self, base: &ModelOptions) -> ModelOptions {
        let extra_body = match (&base.extra_body, &self.extra_body) {
            (Some(b), Some(o)) => {
                let mut merged = b.clone();
                merged.extend(o.iter().map(|(k, v)| (k.clone(), v.clone())));
                Some(merged)
            }
            (b, o) => o.clone().or_else(|| b.clone()),
        };
        ModelOptions {
            temperature: self.temperature.or(base.temperature),
            top_p: self.top_p.or(base.top_p),
            stop: self.stop.clone().or_else(|| base.stop.clone()),
            seed: self.seed.or(base.seed),
            tool_choice: self
                .tool_choice
                .clone()
                .or_else(|| base.tool_choice.clone()),
            parallel_tool_calls: self.parallel_tool_calls.or(base.parallel_tool_calls),
            reasoning: self.reasoning.clone().or_else(|| base.reasoning.clone()),
            extra_body,
            output: self.output.clone().or_else(|| base.output.clone()),
        }
    }

    /// The first out-of-range field: its key and why (checked once, where a
    /// config is read).
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if let Some(t) = self.temperature
            && !(0.0..=2.0).contains(&t)
        {
            return Err(("temperature", format!("must be within 0 and 2, got {t}")));
        }
        if let Some(p) = self.top_p
            && !(0.0..=1.0).contains(&p)
        {
            return Err(("top_p", format!("must be within 0 and 1, got {p}")));
        }
        if let Some(stop) = &self.stop {
            if stop.len() > 4 {
                return Err(("stop", format!("at most 4 sequences, got {}", stop.len())));
            }
            if stop.iter().any(String::is_empty) {
                return Err(("stop", "a stop sequence must not be empty".into()));
            }
        }
        if let Some(ToolChoice::Tool(name)) = &self.tool_choice
            && name.is_empty()
        {
            return Err((
                "tool_choice",
                "auto, required, none or a tool's name".into(),
            ));
        }
        if let Some(budget) = self.reasoning.as_ref().and_then(|r| r.budget_tokens)
            && budget < 1024
        {
            return Err((
                "reasoning.budget_tokens",
                format!("at least 1024, got {budget}"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod options_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_templates_options_win_over_the_models_and_extra_bodies_merge() {
        let model: ModelOptions = serde_json::from_value(json!({
            "temperature": 0.2, "seed": 7, "tool_choice": "required",
            "extra_body": {"options": {"num_ctx": 8192}, "keep": 1}
        }))
        .unwrap();
        let template: ModelOptions = serde_json::from_value(json!({
            "temperature": 0.9, "tool_choice": "search",
            "reasoning": {"effort": "high"},
            "extra_body": {"options": {"num_ctx": 4096}}
        }))
        .unwrap();
        let both = template.over(&model);
        assert_eq!(both.temperature, Some(0.9));
        assert_eq!(both.seed, Some(7));
        assert_eq!(both.tool_choice, Some(ToolChoice::Tool("search".into())));
        assert_eq!(
            both.reasoning.and_then(|r| r.effort),
            Some(ReasoningEffort::High)
        );
        assert_eq!(
            serde_json::Value::Object(both.extra_body.unwrap()),
            json!({"options": {"num_ctx": 4096}, "keep": 1})
        );
    }

    #[test]
    fn out_of_range_options_name_their_key() {
        let bad = |v: serde_json::Value| {
            serde_json::from_value::<ModelOptions>(v)
                .unwrap()
                .check()
                .unwrap_err()
                .0
        };
        assert_eq!(bad(json!({"temperature": 3.0})), "temperature");
        assert_eq!(bad(json!({"top_p": -0.1})), "top_p");
        assert_eq!(bad(json!({"stop": ["a", "b", "c", "d", "e"]})), "stop");
        assert_eq!(
            bad(json!({"reasoning": {"budget_tokens": 100}})),
            "reasoning.budget_tokens"
        );
        assert!(serde_json::from_value::<ModelOptions>(json!({"temprature": 1})).is_err());
        assert_eq!(
            serde_json::from_value::<ToolChoice>(json!("none")).unwrap(),
            ToolChoice::None
        );
    }
}

pub use crate::message::ESTIMATED_BYTES_PER_TOKEN;

/// Where the counts of a `Usage` come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum UsageSource {
    /// The endpoint (or the model itself) reported them.
    #[default]
    Reported,
    /// The reply carried no usage: the counts are 0 because nothing was
    /// reported, not because nothing was used.
    Absent,
    /// The reply carried no usage; the counts are an estimate from the text
    /// (`ESTIMATED_BYTES_PER_TOKEN`).
    Estimated,
    /// The reply was served from the store's record of an earlier call (a
    /// resumed or replayed tree): the counts are that call's, which were
    /// counted when it was recorded. Its `modelResponded` event carries no
    /// usage of its own (`fromRecord`), so sums over events count it once.
    Recorded,
}

impl UsageSource {
    pub(crate) fn is_reported(&self) -> bool {
        *self == UsageSource::Reported
    }
}

/// Token counts (and cost, when the model prices its own calls) of one call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Tokens of the request.
    pub input_tokens: u64,
    /// Tokens of the reply.
    pub output_tokens: u64,
    /// Request tokens read from the provider's prompt cache.
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// Request tokens written to the provider's prompt cache.
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// Credits this call cost.
    #[serde(default)]
    pub cost: f64,
    /// Whether the counts were reported (the default, and then not written),
    /// absent from the reply, or estimated.
    #[serde(default, skip_serializing_if = "UsageSource::is_reported")]
    pub source: UsageSource,
}

impl Usage {
    /// Input plus output tokens.
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }

    /// The usage of two calls made for one request (a reply cut at the
    /// output limit and the retry that asked again): both were billed.
    /// Reported when the later one's counts were.
    pub fn plus(self, later: Usage) -> Usage {
        Usage {
            input_tokens: self.input_tokens + later.input_tokens,
            output_tokens: self.output_tokens + later.output_tokens,
            cache_read_tokens: self.cache_read_tokens + later.cache_read_tokens,
            cache_write_tokens: self.cache_write_tokens + later.cache_write_tokens,
            cost: self.cost + later.cost,
            source: later.source,
        }
    }

    /// Whether the reply was served from the store's record
    /// ([`UsageSource::Recorded`]).
    pub fn is_recorded(&self) -> bool {
        self.source == UsageSource::Recorded
    }

    /// The usage of a reply that reported none: input and output estimated
    /// from the request's messages and the reply (`ESTIMATED_BYTES_PER_TOKEN`).
    pub fn estimated(request: &ModelRequest, reply: &Message) -> Usage {
        Usage {
            input_tokens: request.messages.estimated_tokens(),
            output_tokens: reply.estimated_tokens(),
            source: UsageSource::Estimated,
            ..Usage::default()
        }
    }
}

/// What a model call returns: one assistant message and its usage.
#[derive(Clone, Debug)]
pub struct ModelResponse {
    /// The reply, an assistant message.
    pub message: Message,
    /// What the call used.
    pub usage: Usage,
}

/// A piece of a streamed reply, surfaced as an event while the step runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
#[non_exhaustive]
pub enum Delta {
    /// More reply text.
    Text {
        /// The text, appended to what came before.
        text: String,
    },
    /// More reasoning text.
    Reasoning {
        /// The text, appended to what came before.
        text: String,
    },
    /// More of a tool call's input (JSON text, in pieces).
    ToolCallArgs {
        /// The call's index among the reply's tool calls.
        index: usize,
        /// The piece, appended to what came before.
        text: String,
    },
    /// The attempt failed and will be retried after `delay_ms` (the partial reply
    /// streamed so far is discarded).
    #[serde(rename_all = "camelCase")]
    Retry {
        /// The retry that comes next (1 for the first).
        attempt: u32,
        /// The wait before it, in milliseconds.
        delay_ms: u64,
        /// Why the attempt failed.
        reason: String,
    },
}

/// Where a model sends its streaming deltas.
pub type DeltaSink = Arc<dyn Fn(Delta) + Send + Sync>;

/// Why a model call failed. `is_retryable` says whether trying again may help.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The endpoint refused the request (bad request, auth, not found): do not retry.
    #[error("model {model} refused the request ({status}): {message}")]
    Rejected {
        /// The model's catalog name.
        model: String,
        /// The HTTP status.
        status: u16,
        /// What the endpoint said.
        message: String,
    },
    /// The endpoint rate-limited the request (HTTP 429).
    #[error("model {model} is rate-limited: {message}")]
    RateLimited {
        /// The model's catalog name.
        model: String,
        /// What the endpoint said.
        message: String,
        /// How long the endpoint asked to wait (`None`: it did not say).
        retry_after: Option<Duration>,
    },
    /// Overload, server errors, timeouts, dropped connections.
    #[error("model {model} is unavailable: {message}")]
    Transient {
        /// The model's catalog name.
        model: String,
        /// What went wrong.
        message: String,
        /// How long the endpoint asked to wait (`None`: it did not say).
        retry_after: Option<Duration>,
    },
    /// The reply could not be understood.
    #[error("model {model} sent a malformed reply: {message}")]
    Malformed {
        /// The model's catalog name.
        model: String,
        /// What is wrong with the reply.
        message: String,
    },
    /// The reply was cut at the output limit before it ended (`finish_reason:
    /// length`, `stop_reason: max_tokens`): its text or tool call may be
    /// incomplete, so it is not acted on. Retried only when the provider
    /// can ask for more room.
    #[error("model {model} cut its reply at the output limit: {message}")]
    Truncated {
        /// The model's catalog name.
        model: String,
        /// What was cut (and the limit).
        message: String,
        /// What the cut reply (and any cut reply before it) used: billed
        /// though not acted on, so counted like any reply's.
        usage: Usage,
    },
    /// The request itself is invalid for this model (e.g. the scripted model ran out of replies).
    #[error("model {model}: {message}")]
    Invalid {
        /// The model's catalog name.
        model: String,
        /// What is wrong.
        message: String,
    },
}

impl ModelError {
    /// Whether trying again may help (transient failures and malformed replies).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ModelError::RateLimited { .. }
                | ModelError::Transient { .. }
                | ModelError::Malformed { .. }
        )
    }

    /// How long the endpoint asked to wait before trying again, if it said.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ModelError::RateLimited { retry_after, .. }
            | ModelError::Transient { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// What the provider billed for a reply it sent but that is not acted
    /// on (a reply cut at the output limit); `None` when no reply came.
    pub fn billed(&self) -> Option<Usage> {
        match self {
            ModelError::Truncated { usage, .. } => Some(*usage),
            _ => None,
        }
    }

    /// The kind of failure this error makes of the run it ends.
    pub fn kind(&self) -> FailureKind {
        match self {
            ModelError::Rejected { .. } => FailureKind::ModelRejected,
            ModelError::RateLimited { .. } => FailureKind::ModelRateLimited,
            ModelError::Transient { .. } => FailureKind::ModelUnavailable,
            ModelError::Malformed { .. } => FailureKind::ModelMalformed,
            ModelError::Truncated { .. } => FailureKind::ModelTruncated,
            ModelError::Invalid { .. } => FailureKind::ModelInvalid,
        }
    }

    /// The final error of a request tried `attempts` times: it says so.
    pub fn after_attempts(mut self, attempts: u32) -> Self {
        if let ModelError::RateLimited { message, .. }
        | ModelError::Transient { message, .. }
        | ModelError::Malformed { message, .. } = &mut self
        {
            message.push_str(&format!(" (gave up after {attempts} attempts)"));
        }
        self
    }
}

/// A language model, as agents see it.
#[async_trait]
pub trait Model: Send + Sync + 'static {
    /// The name this model has in the catalog.
    fn name(&self) -> &str;

    /// Answers one request. Streaming models send deltas to `deltas` as they arrive;
    /// the returned message is the whole reply either way.
    async fn complete(
        &self,
        request: ModelRequest,
        deltas: DeltaSink,
    ) -> Result<ModelResponse, ModelError>;
}

impl From<ModelError> for Failure {
    fn from(error: ModelError) -> Self {
        Failure::new(error.kind(), error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_limited_and_a_rejected_model_error_stay_apart() {
        let limited = ModelError::RateLimited {
            model: "m".into(),
            message: "429: slow down".into(),
            retry_after: None,
        };
        let down = ModelError::Transient {
            model: "m".into(),
            message: "503: down".into(),
            retry_after: None,
        };
        let rejected = ModelError::Rejected {
            model: "m".into(),
            status: 401,
            message: "bad key".into(),
        };
        assert_eq!(Failure::from(limited).kind, FailureKind::ModelRateLimited);
        assert_eq!(Failure::from(down).kind, FailureKind::ModelUnavailable);
        let rejected = Failure::from(rejected);
        assert_eq!(rejected.kind, FailureKind::ModelRejected);
        assert!(rejected.message.contains("bad key"), "{}", rejected.message);
    }
}

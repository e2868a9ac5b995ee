//! The `Model` port: what an agent asks of a language model and what it gets back.
//!
//! Providers (HTTP), the scripted model and the simulated model all implement it.
//! A request is built by the step machine from an already repaired history.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

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

    /// The kind of failure this error makes of the run it ends.
    pub fn kind(&self) -> FailureKind {
        match self {
            ModelError::Rejected { .. } => FailureKind::ModelRejected,
            ModelError::RateLimited { .. } => FailureKind::ModelRateLimited,
            ModelError::Transient { .. } => FailureKind::ModelUnavailable,
            ModelError::Malformed { .. } => FailureKind::ModelMalformed,
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

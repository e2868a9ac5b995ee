//! What a wire format is to the HTTP client: the endpoint, the headers, the
//! request body, the reply parse and the stream assembler. Each format
//! implements [`WireFormat`] in its own module; the client knows only the trait.

use std::time::Duration;

use arbor_actors::message::Message;
use arbor_actors::{DeltaSink, ModelRequest};
use serde_json::Value;

use super::settings::{ProviderKind, ProviderSettings};

/// One API's wire format, both ways.
pub(crate) trait WireFormat: Send + Sync {
    /// The provider it is (whose name errors show).
    fn kind(&self) -> ProviderKind;

    /// The endpoint's path after the base URL (`/chat/completions`).
    fn path(&self) -> &'static str;

    /// The header carrying the API key, and its value.
    fn auth_header(&self, key: &str) -> (&'static str, String);

    /// Headers every request carries (after the key, before the configured ones).
    fn fixed_headers(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }

    /// The JSON body of one request.
    fn request_body(&self, settings: &ProviderSettings, request: &ModelRequest) -> Value;

    /// `body` (built by [`WireFormat::request_body`] from `settings`) asking
    /// for a reply of up to `max_tokens` tokens instead: the retry of a reply
    /// cut at the output limit ([`ProviderSettings::truncated_max_tokens`]).
    fn with_room(&self, body: &mut Value, settings: &ProviderSettings, max_tokens: u32);

    /// A whole (non-streamed) reply.
    fn parse_response(&self, body: &Value) -> Result<Reply, Failure>;

    /// A fresh assembler for one streamed reply.
    fn assembler(&self) -> Box<dyn Assembler>;
}

/// Token counts as the API reports them; `input` excludes cached tokens.
/// `reported` is false while the reply has carried no usage (the counts are
/// then 0 for want of a report, not measured as 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tokens {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    pub reported: bool,
}

/// One assembled reply.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Reply {
    pub message: Message,
    pub tokens: Tokens,
}

/// Builds a reply from a stream of server-sent events.
pub(crate) trait Assembler: Send {
    /// Handles one event; `Ok(true)` when the reply is complete.
    fn event(&mut self, event: &str, data: &str, sink: &DeltaSink) -> Result<bool, Failure>;
    fn finish(self: Box<Self>) -> Result<Reply, Failure>;

    /// Whether the reply is whole even though the stream ended without its end
    /// marker (some OpenAI-compatible servers close after the finish reason).
    fn complete_without_end(&self) -> bool {
        false
    }
}

/// Why one attempt failed.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Failure {
    /// Worth another attempt (rate limit, overload, server error, transport, timeout).
    Transient {
        status: Option<u16>,
        message: String,
        retry_after: Option<Duration>,
    },
    /// The reply could not be understood (also retried).
    Malformed(String),
    /// The endpoint refused the request: do not retry.
    Rejected { status: u16, message: String },
    /// The reply was cut at the output limit (`finish_reason: length`,
    /// `stop_reason: max_tokens`): not acted on, not retried; the tokens
    /// it reported were billed all the same.
    Truncated(String, Tokens),
}

impl Failure {
    pub(crate) fn transient(message: impl Into<String>) -> Self {
        Failure::Transient {
            status: None,
            message: message.into(),
            retry_after: None,
        }
    }

    pub(crate) fn retryable(&self) -> bool {
        !matches!(self, Failure::Rejected { .. } | Failure::Truncated(..))
    }
}

/// Conversions shared by the wire formats.
pub(crate) mod convert {
    use std::collections::HashMap;
    use std::sync::Arc;

    use arbor_actors::message::{Message, ToolResultPart};
    use serde_json::Value;

    /// The messages with each assistant message's results moved right after it,
    /// in call order (APIs want them adjacent; Arbor pairs by id).
    pub fn adjacent_results(messages: &[Arc<Message>]) -> Vec<Arc<Message>> {
        let mut results: HashMap<&str, &Arc<Message>> = messages
            .iter()
            .filter_map(|m| Some((m.answers()?, m)))
            .collect();
        let mut out = Vec::with_capacity(messages.len());
        for m in messages {
            if m.answers().is_some() {
                continue;
            }
            out.push(m.clone());
            for call in m.tool_calls() {
                if let Some(result) = results.remove(call.tool_call_id.as_str()) {
                    out.push(result.clone());
                }
            }
        }
        out
    }

    /// A tool result's JSON parts as text (strings unquoted).
    pub fn result_text(content: &[ToolResultPart]) -> String {
        content
            .iter()
            .filter_map(|p| match p {
                ToolResultPart::Json {
                    value: Value::String(s),
                } => Some(s.clone()),
                ToolResultPart::Json { value } => Some(value.to_string()),
                ToolResultPart::Media { .. } => None,
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Tool arguments as the API sent them: parsed JSON, or the raw text when it is
    /// not JSON (the step machine turns that into an error the model reads).
    pub fn arguments(text: &str) -> Value {
        if text.trim().is_empty() {
            return Value::Object(Default::default());
        }
        serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
    }
}

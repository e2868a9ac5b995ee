//! Assembling a streamed Messages reply.

use std::collections::BTreeMap;

use arbor_actors::message::ToolCall;
use arbor_actors::{Delta, DeltaSink};
use serde_json::Value;

use super::{Block, api_error, assistant, truncated, update_tokens};
use crate::wire::convert::arguments;
use crate::wire::{Assembler, Failure, Reply, Tokens};

/// A content block being streamed.
enum Partial {
    Text(String),
    Thinking {
        text: String,
        /// From `signature_delta`s (or the start block).
        signature: String,
    },
    Redacted(String),
    ToolUse {
        id: String,
        name: String,
        /// The `input` of `content_block_start` (`{}` in practice).
        start: Value,
        json: String,
        /// Which tool call of the reply this is (the index of its deltas).
        ordinal: usize,
    },
    Other,
}

/// Assembles a streamed Messages reply.
#[derive(Default)]
pub(crate) struct StreamState {
    blocks: BTreeMap<u64, Partial>,
    calls: usize,
    tokens: Tokens,
    stop_reason: Option<String>,
}

/// The signature a `content_block_start` thinking block already has (`""`).
fn start_signature(block: &Value) -> String {
    block
        .get("signature")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn block_index(event: &Value) -> Result<u64, Failure> {
    event
        .get("index")
        .and_then(Value::as_u64)
        .ok_or_else(|| Failure::Malformed("stream event has no block index".into()))
}

impl StreamState {
    fn start_block(&mut self, event: &Value, sink: &DeltaSink) -> Result<(), Failure> {
        let index = block_index(event)?;
        let block = &event["content_block"];
        let text = |key: &str| {
            block
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let partial = match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                let text = text("text");
                if !text.is_empty() {
                    sink(Delta::Text { text: text.clone() });
                }
                Partial::Text(text)
            }
            Some("thinking") => {
                let text = text("thinking");
                if !text.is_empty() {
                    sink(Delta::Reasoning { text: text.clone() });
                }
                Partial::Thinking {
                    text,
                    signature: start_signature(block),
                }
            }
            Some("redacted_thinking") => Partial::Redacted(text("data")),
            Some("tool_use") => {
                self.calls += 1;
                Partial::ToolUse {
                    id: text("id"),
                    name: text("name"),
                    start: block.get("input").cloned().unwrap_or(Value::Null),
                    json: String::new(),
                    ordinal: self.calls - 1,
                }
            }
            _ => Partial::Other,
        };
        self.blocks.insert(index, partial);
        Ok(())
    }

    fn delta(&mut self, event: &Value, sink: &DeltaSink) -> Result<(), Failure> {
        let index = block_index(event)?;
        let delta = &event["delta"];
        let kind = delta.get("type").and_then(Value::as_str).unwrap_or("");
        let piece = |key: &str| {
            delta
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let Some(block) = self.blocks.get_mut(&index) else {
            return Err(Failure::Malformed(format!(
                "{kind} for content block {index}, which never started"
            )));
        };
        match (kind, block) {
            ("text_delta", Partial::Text(text)) => {
                let more = piece("text");
                if !more.is_empty() {
                    text.push_str(&more);
                    sink(Delta::Text { text: more });
                }
            }
            ("thinking_delta", Partial::Thinking { text, .. }) => {
                let more = piece("thinking");
                if !more.is_empty() {
                    text.push_str(&more);
                    sink(Delta::Reasoning { text: more });
                }
            }
            ("input_json_delta", Partial::ToolUse { json, ordinal, .. }) => {
                let more = piece("partial_json");
                if !more.is_empty() {
                    json.push_str(&more);
                    sink(Delta::ToolCallArgs {
                        index: *ordinal,
                        text: more,
                    });
                }
            }
            ("signature_delta", Partial::Thinking { signature, .. }) => {
                signature.push_str(&piece("signature"));
            }
            ("text_delta" | "thinking_delta" | "input_json_delta" | "signature_delta", _) => {
                return Err(Failure::Malformed(format!(
                    "{kind} for content block {index} of another type"
                )));
            }
            // citations_delta and whatever comes next.
            _ => {}
        }
        Ok(())
    }
}

impl Assembler for StreamState {
    fn event(&mut self, event: &str, data: &str, sink: &DeltaSink) -> Result<bool, Failure> {
        let data = data.trim();
        if data.is_empty() {
            return Ok(false);
        }
        let value: Value = serde_json::from_str(data)
            .map_err(|e| Failure::Malformed(format!("stream event is not JSON: {e}")))?;
        let kind = value.get("type").and_then(Value::as_str).unwrap_or(event);
        match kind {
            "message_start" => {
                if let Some(usage) = value.pointer("/message/usage") {
                    update_tokens(&mut self.tokens, usage);
                }
            }
            "content_block_start" => self.start_block(&value, sink)?,
            "content_block_delta" => self.delta(&value, sink)?,
            "message_delta" => {
                if let Some(reason) = value.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(reason.to_owned());
                }
                if let Some(usage) = value.get("usage") {
                    update_tokens(&mut self.tokens, usage);
                }
            }
            "message_stop" => return Ok(true),
            "error" => return Err(api_error(&value["error"])),
            // ping, content_block_stop, and event types added later.
            _ => {}
        }
        Ok(false)
    }

    fn finish(self: Box<Self>) -> Result<Reply, Failure> {
        if self.stop_reason.as_deref() == Some("max_tokens") {
            return Err(truncated(&self.tokens));
        }
        let blocks = self.blocks.into_values().map(|partial| match partial {
            Partial::Text(text) => Block::Text(text),
            Partial::Thinking { text, signature } => Block::Thinking {
                text,
                signature: (!signature.is_empty()).then_some(signature),
            },
            Partial::Redacted(data) => Block::Redacted(data),
            Partial::ToolUse {
                id,
                name,
                start,
                json,
                ..
            } => Block::ToolUse(ToolCall {
                tool_call_id: id,
                tool_name: name,
                input: if json.trim().is_empty() && start.as_object().is_some_and(|o| !o.is_empty())
                {
                    start.into()
                } else {
                    arguments(&json).into()
                },
            }),
            Partial::Other => Block::Other,
        });
        Ok(Reply {
            message: assistant(blocks),
            tokens: self.tokens,
        })
    }
}

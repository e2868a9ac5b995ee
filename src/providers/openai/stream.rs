//! Assembling a streamed Chat Completions reply.

use std::collections::BTreeMap;

use arbor_actors::message::ToolCall;
use arbor_actors::{Delta, DeltaSink};
use serde_json::Value;

use super::{assistant, error_failure, reasoning, tokens};
use crate::providers::wire::convert::arguments;
use crate::providers::wire::{Assembler, Failure, Reply, Tokens};

#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// Assembles a streamed Chat Completions reply.
#[derive(Default)]
pub(crate) struct StreamState {
    text: String,
    /// Sent instead of text when the model refuses; the text if there is none.
    refusal: String,
    reasoning: String,
    calls: BTreeMap<usize, PartialCall>,
    tokens: Tokens,
    finished: bool,
}

impl Assembler for StreamState {
    fn event(&mut self, _event: &str, data: &str, sink: &DeltaSink) -> Result<bool, Failure> {
        let data = data.trim();
        if data == "[DONE]" {
            if !self.finished {
                return Err(Failure::transient(
                    "the stream ended without a finish reason",
                ));
            }
            return Ok(true);
        }
        if data.is_empty() {
            return Ok(false);
        }
        let chunk: Value = serde_json::from_str(data)
            .map_err(|e| Failure::Malformed(format!("stream chunk is not JSON: {e}")))?;
        if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
            return Err(error_failure(error));
        }
        if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
            self.tokens = tokens(usage);
        }
        let Some(choice) = chunk.pointer("/choices/0") else {
            return Ok(false);
        };
        let delta = &choice["delta"];
        if let Some(text) = delta
            .get("content")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            self.text.push_str(text);
            sink(Delta::Text {
                text: text.to_owned(),
            });
        }
        if let Some(text) = delta
            .get("refusal")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            self.refusal.push_str(text);
            sink(Delta::Text {
                text: text.to_owned(),
            });
        }
        if let Some(text) = reasoning(delta) {
            self.reasoning.push_str(text);
            sink(Delta::Reasoning {
                text: text.to_owned(),
            });
        }
        for call in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let index = call.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
            let partial = self.calls.entry(index).or_default();
            // The id and name come whole in the call's first chunk; some servers
            // repeat them (or send them empty) in later ones.
            if let Some(id) = call
                .get("id")
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
            {
                partial.id = id.to_owned();
            }
            if let Some(name) = call
                .pointer("/function/name")
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
            {
                partial.name = name.to_owned();
            }
            if let Some(args) = call.pointer("/function/arguments").and_then(Value::as_str) {
                partial.arguments.push_str(args);
                if !args.is_empty() {
                    sink(Delta::ToolCallArgs {
                        index,
                        text: args.to_owned(),
                    });
                }
            }
        }
        if choice.get("finish_reason").is_some_and(|r| !r.is_null()) {
            self.finished = true;
        }
        Ok(false)
    }

    fn complete_without_end(&self) -> bool {
        self.finished
    }

    fn finish(self: Box<Self>) -> Result<Reply, Failure> {
        let calls = self
            .calls
            .into_values()
            .map(|c| ToolCall {
                tool_call_id: c.id,
                tool_name: c.name,
                input: arguments(&c.arguments),
            })
            .collect();
        let text = if self.text.is_empty() {
            self.refusal
        } else {
            self.text
        };
        Ok(Reply {
            message: assistant(self.reasoning, text, calls),
            tokens: self.tokens,
        })
    }
}

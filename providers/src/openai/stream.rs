//! Assembling a streamed Chat Completions reply.

use std::collections::BTreeMap;

use arbor_actors::message::ToolCall;
use arbor_actors::{Delta, DeltaSink};
use serde_json::Value;

use super::{assistant, error_failure, reasoning, tokens, truncated};
use crate::wire::convert::arguments;
use crate::wire::{Assembler, Failure, Reply, Tokens};

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
    /// The reply's calls, in the order they started.
    calls: Vec<PartialCall>,
    /// The call (in `calls`) each wire `index` last started. A delta at an
    /// index continues that call unless it carries another `id`: then it
    /// starts a new one (Ollama gives every parallel call `index: 0`).
    open: BTreeMap<u64, usize>,
    tokens: Tokens,
    finished: bool,
    /// The reply was cut at the output limit (`finish_reason: "length"`).
    cut: bool,
}

impl StreamState {
    /// The position in `calls` of the call a delta at `index` with `id` belongs to.
    fn call_for(&mut self, index: u64, id: Option<&str>) -> usize {
        if let Some(&position) = self.open.get(&index) {
            let current = &self.calls[position].id;
            if id.is_none_or(|id| current.is_empty() || current == id) {
                return position;
            }
        }
        self.calls.push(PartialCall::default());
        let position = self.calls.len() - 1;
        self.open.insert(index, position);
        position
    }
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
            let id = call
                .get("id")
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty());
            let wire_index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
            let index = self.call_for(wire_index, id);
            let partial = &mut self.calls[index];
            // The id and name come whole in the call's first chunk; some servers
            // repeat them (or send them empty) in later ones.
            if let Some(id) = id {
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
        match choice.get("finish_reason") {
            None | Some(Value::Null) => {}
            Some(reason) => {
                self.finished = true;
                self.cut |= reason.as_str() == Some("length");
            }
        }
        Ok(false)
    }

    fn complete_without_end(&self) -> bool {
        self.finished
    }

    fn finish(self: Box<Self>) -> Result<Reply, Failure> {
        let calls: Vec<ToolCall> = self
            .calls
            .into_iter()
            .map(|c| ToolCall {
                tool_call_id: c.id,
                tool_name: c.name,
                input: arguments(&c.arguments).into(),
            })
            .collect();
        // The usage chunk comes after the finish reason: the message can say
        // how many tokens the reply had when it was cut.
        if self.cut {
            return Err(truncated(&calls, &self.tokens));
        }
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

//! The OpenAI Chat Completions wire format, both ways.

use std::collections::BTreeMap;

use arbor_actors::message::{Content, Message, Part, ToolCall, ToolResultPart};
use arbor_actors::{Delta, DeltaSink, ModelRequest};
use serde_json::{Value, json};

use super::client::convert::{adjacent_results, arguments, result_text};
use super::client::{Assembler, Failure, Reply, Tokens};
use super::settings::ProviderSettings;

pub(crate) fn request_body(settings: &ProviderSettings, request: &ModelRequest) -> Value {
    let mut messages = Vec::new();
    if !request.system_prompt.is_empty() {
        messages.push(json!({"role": "system", "content": &*request.system_prompt}));
    }
    for m in adjacent_results(&request.messages) {
        messages.push(message(&m));
    }
    let mut body = json!({
        "model": settings.model,
        "messages": messages,
        "max_tokens": settings.max_tokens,
    });
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|(name, def)| {
                json!({"type": "function", "function": {
                    "name": name, "description": def.description, "parameters": def.input_schema
                }})
            })
            .collect();
        body["tools"] = json!(tools);
    }
    if settings.stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

fn message(m: &Message) -> Value {
    match m {
        Message::System { content, .. } => json!({"role": "system", "content": content.text()}),
        Message::User { content, .. } => json!({"role": "user", "content": user_content(content)}),
        Message::Assistant { content, .. } => {
            let text = content.text();
            let calls: Vec<Value> = m
                .tool_calls()
                .map(|c| {
                    json!({"id": c.tool_call_id, "type": "function", "function": {
                        "name": c.tool_name,
                        "arguments": match &c.input { Value::String(s) => s.clone(), v => v.to_string() }
                    }})
                })
                .collect();
            let mut out = json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { json!(text) }});
            if !calls.is_empty() {
                out["tool_calls"] = json!(calls);
            }
            out
        }
        Message::Tool {
            tool_call_id,
            content,
            ..
        } => {
            let mut text = result_text(content);
            for part in content {
                if let ToolResultPart::Media { media_type, .. } = part {
                    text.push_str(&format!(
                        "\n[{media_type} attachment omitted: not supported in tool results]"
                    ));
                }
            }
            json!({"role": "tool", "tool_call_id": tool_call_id, "content": text})
        }
    }
}

fn user_content(content: &Content) -> Value {
    let Content::Parts(parts) = content else {
        return json!(content.text());
    };
    let parts: Vec<Value> = parts
        .iter()
        .filter_map(|p| match p {
            Part::Text { text } => Some(json!({"type": "text", "text": text})),
            Part::Image { image, media_type } => Some(json!({"type": "image_url", "image_url": {
                "url": data_url(image, media_type.as_deref().unwrap_or("image/png"))
            }})),
            Part::File {
                data,
                filename,
                media_type,
            } => Some(json!({"type": "file", "file": {
                "filename": filename.clone().unwrap_or_else(|| "file".into()),
                "file_data": data_url(data, media_type)
            }})),
            Part::Reasoning { .. } | Part::ToolCall(_) => None,
        })
        .collect();
    json!(parts)
}

/// A URL as is, or base64 data as a `data:` URL.
fn data_url(data: &str, media_type: &str) -> String {
    if data.starts_with("http://") || data.starts_with("https://") || data.starts_with("data:") {
        data.to_owned()
    } else {
        format!("data:{media_type};base64,{data}")
    }
}

fn tokens(usage: &Value) -> Tokens {
    let n = |p: &str| usage.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let cached = n("/prompt_tokens_details/cached_tokens");
    Tokens {
        input: n("/prompt_tokens").saturating_sub(cached),
        output: n("/completion_tokens"),
        cache_read: cached,
        cache_write: 0,
    }
}

fn assistant(reasoning: String, text: String, calls: Vec<ToolCall>) -> Message {
    let mut parts = Vec::new();
    if !reasoning.is_empty() {
        parts.push(Part::Reasoning { text: reasoning });
    }
    if !text.is_empty() {
        parts.push(Part::Text { text });
    }
    parts.extend(calls.into_iter().map(Part::ToolCall));
    Message::Assistant {
        content: Content::Parts(parts),
        meta: Default::default(),
    }
}

pub(crate) fn parse_response(body: &Value) -> Result<Reply, Failure> {
    let message = body
        .pointer("/choices/0/message")
        .ok_or_else(|| Failure::Malformed("reply has no choices[0].message".into()))?;
    let text = |key: &str| {
        message
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let mut content = text("content");
    if content.is_empty() {
        content = text("refusal");
    }
    let calls = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|calls| {
            calls
                .iter()
                .map(|c| ToolCall {
                    tool_call_id: c
                        .get("id")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    tool_name: c
                        .pointer("/function/name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    input: arguments(
                        c.pointer("/function/arguments")
                            .and_then(Value::as_str)
                            .unwrap_or(""),
                    ),
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(Reply {
        message: assistant(text("reasoning_content"), content, calls),
        tokens: body.get("usage").map(tokens).unwrap_or_default(),
    })
}

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
        if let Some(error) = chunk.get("error") {
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("stream error");
            return Err(Failure::transient(message.to_owned()));
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
            .get("reasoning_content")
            .or_else(|| delta.get("reasoning"))
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
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
            if let Some(id) = call.get("id").and_then(Value::as_str) {
                partial.id = id.to_owned();
            }
            if let Some(name) = call.pointer("/function/name").and_then(Value::as_str) {
                partial.name.push_str(name);
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
        Ok(Reply {
            message: assistant(self.reasoning, self.text, calls),
            tokens: self.tokens,
        })
    }
}

//! The Anthropic Messages wire format, both ways.
//!
//! Requests: system messages are lifted into the top-level `system`, tool results
//! become `tool_result` blocks of a user message, and consecutive messages of one
//! role are merged, since the API wants strictly alternating user/assistant turns
//! that start (and, here, end) with a user turn. Reasoning parts are not sent back:
//! the API only accepts thinking blocks with the signature it issued.

use std::collections::BTreeMap;

use arbor_actors::message::{Content, Message, Part, TOOL_CALL_ERROR, ToolCall, ToolResultPart};
use arbor_actors::{Delta, DeltaSink, ModelRequest};
use serde_json::{Value, json};

use super::client::convert::{adjacent_results, arguments, result_text};
use super::client::{Assembler, Failure, Reply, Tokens};
use super::settings::ProviderSettings;

/// The user turn inserted where the API needs one and the history has none.
const CONTINUE: &str = "(continue)";

pub(crate) fn request_body(settings: &ProviderSettings, request: &ModelRequest) -> Value {
    let mut system = Vec::new();
    if !request.system_prompt.trim().is_empty() {
        system.push(request.system_prompt.to_string());
    }
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for m in adjacent_results(&request.messages.to_vec()) {
        let (role, blocks) = match &*m {
            Message::System { content, .. } => {
                let text = content.text();
                if !text.trim().is_empty() {
                    system.push(text);
                }
                continue;
            }
            Message::User { content, .. } => ("user", user_blocks(content)),
            Message::Assistant { content, .. } => ("assistant", assistant_blocks(content)),
            Message::Tool {
                tool_call_id,
                content,
                ..
            } => (
                "user",
                vec![tool_result(
                    tool_call_id,
                    content,
                    m.has_tag(TOOL_CALL_ERROR),
                )],
            ),
        };
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last, previous)) if *last == role => previous.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    if turns.first().is_none_or(|(role, _)| *role != "user") {
        turns.insert(0, ("user", vec![text_block(CONTINUE)]));
    }
    // A final assistant turn would be a prefill the model continues in place
    // (and some models refuse); every other provider answers with a new message.
    if turns.last().is_some_and(|(role, _)| *role == "assistant") {
        turns.push(("user", vec![text_block(CONTINUE)]));
    }
    let messages: Vec<Value> = turns
        .into_iter()
        .map(|(role, blocks)| json!({"role": role, "content": content_value(blocks)}))
        .collect();
    let mut body = json!({
        "model": settings.model,
        "max_tokens": settings.max_tokens.unwrap_or(4096),
        "messages": messages,
    });
    if !system.is_empty() {
        body["system"] = json!(system.join("\n\n"));
    }
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|(name, def)| {
                let schema = if def.input_schema.is_object() {
                    def.input_schema.clone()
                } else {
                    json!({"type": "object"})
                };
                json!({"name": name, "description": def.description, "input_schema": schema})
            })
            .collect();
        body["tools"] = json!(tools);
    }
    if settings.stream {
        body["stream"] = json!(true);
    }
    body
}

/// One text block alone goes as a plain string.
fn content_value(mut blocks: Vec<Value>) -> Value {
    let single_text = blocks.len() == 1
        && blocks[0].as_object().is_some_and(|b| b.len() == 2)
        && blocks[0]["type"] == "text";
    if single_text {
        return blocks.swap_remove(0)["text"].take();
    }
    json!(blocks)
}

fn text_block(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

/// The API rejects text blocks without visible text.
fn push_text(blocks: &mut Vec<Value>, text: &str) {
    if !text.trim().is_empty() {
        blocks.push(text_block(text));
    }
}

fn user_blocks(content: &Content) -> Vec<Value> {
    let mut blocks = Vec::new();
    match content {
        Content::Text(text) => push_text(&mut blocks, text),
        Content::Parts(parts) => {
            for part in parts {
                match part {
                    Part::Text { text } => push_text(&mut blocks, text),
                    Part::Image { image, media_type } => {
                        let media_type = media_type.clone().unwrap_or_else(|| sniff_image(image));
                        blocks.push(json!({"type": "image", "source": source(image, &media_type)}));
                    }
                    Part::File {
                        data,
                        filename,
                        media_type,
                    } => blocks.push(file_block(data, filename.as_deref(), media_type)),
                    Part::Reasoning { .. } | Part::ToolCall(_) => {}
                }
            }
        }
    }
    blocks
}

fn assistant_blocks(content: &Content) -> Vec<Value> {
    let mut blocks = Vec::new();
    match content {
        Content::Text(text) => push_text(&mut blocks, text),
        Content::Parts(parts) => {
            for part in parts {
                match part {
                    Part::Text { text } => push_text(&mut blocks, text),
                    Part::ToolCall(call) => blocks.push(json!({
                        "type": "tool_use",
                        "id": call.tool_call_id,
                        "name": call.tool_name,
                        "input": tool_input(&call.input),
                    })),
                    // Thinking needs the signature the API issued; media cannot be
                    // in an assistant turn.
                    Part::Reasoning { .. } | Part::Image { .. } | Part::File { .. } => {}
                }
            }
        }
    }
    blocks
}

/// `tool_use.input` must be an object. A call whose arguments were not JSON is
/// stored as the raw string (and was answered with an error): it goes as `{}`.
fn tool_input(input: &Value) -> Value {
    match input {
        Value::Object(_) => input.clone(),
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(value @ Value::Object(_)) => value,
            _ => json!({}),
        },
        _ => json!({}),
    }
}

fn tool_result(tool_call_id: &str, content: &[ToolResultPart], is_error: bool) -> Value {
    let text = result_text(content);
    let media: Vec<Value> = content
        .iter()
        .filter_map(|p| match p {
            ToolResultPart::Media { data, media_type } => Some(media_block(data, media_type)),
            ToolResultPart::Json { .. } => None,
        })
        .collect();
    let mut block = json!({"type": "tool_result", "tool_use_id": tool_call_id});
    if media.is_empty() {
        if !text.is_empty() {
            block["content"] = json!(text);
        }
    } else {
        let mut blocks = Vec::new();
        push_text(&mut blocks, &text);
        blocks.extend(media);
        block["content"] = json!(blocks);
    }
    if is_error {
        block["is_error"] = json!(true);
    }
    block
}

/// Media of a tool result: images and PDFs as such, other types as a note.
fn media_block(data: &str, media_type: &str) -> Value {
    if media_type.starts_with("image/") {
        json!({"type": "image", "source": source(data, media_type)})
    } else if media_type == "application/pdf" {
        json!({"type": "document", "source": source(data, media_type)})
    } else {
        text_block(&format!(
            "[{media_type} attachment omitted: not supported in tool results]"
        ))
    }
}

/// A user file: PDFs as base64 documents, text as a plain-text document, images
/// as images; the API takes nothing else, so other types become a note.
fn file_block(data: &str, filename: Option<&str>, media_type: &str) -> Value {
    if media_type.starts_with("image/") {
        return json!({"type": "image", "source": source(data, media_type)});
    }
    let source = if media_type == "application/pdf" || is_url(data) {
        source(data, media_type)
    } else if media_type.starts_with("text/") {
        let (_, encoded) = split_data_url(data).unwrap_or((media_type, data));
        match decode_base64(encoded).and_then(|bytes| String::from_utf8(bytes).ok()) {
            Some(text) => json!({"type": "text", "media_type": "text/plain", "data": text}),
            None => source(data, media_type),
        }
    } else {
        let name = filename.unwrap_or("file");
        return text_block(&format!(
            "[{name} ({media_type}) omitted: Anthropic accepts only PDF, text and image files]"
        ));
    };
    let mut block = json!({"type": "document", "source": source});
    if let Some(name) = filename {
        block["title"] = json!(name);
    }
    block
}

fn is_url(data: &str) -> bool {
    data.starts_with("https://") || data.starts_with("http://")
}

/// An image or document source: a URL, a `data:` URL, or bare base64.
fn source(data: &str, media_type: &str) -> Value {
    if is_url(data) {
        return json!({"type": "url", "url": data});
    }
    let (media_type, data) = split_data_url(data).unwrap_or((media_type, data));
    json!({"type": "base64", "media_type": media_type, "data": data})
}

/// `data:TYPE;base64,DATA` as (TYPE, DATA).
fn split_data_url(data: &str) -> Option<(&str, &str)> {
    let (header, payload) = data.strip_prefix("data:")?.split_once(',')?;
    let media_type = header.strip_suffix(";base64")?;
    Some((media_type.split(';').next().unwrap_or(media_type), payload))
}

/// The media type of base64 image data without one (the API checks it).
fn sniff_image(data: &str) -> String {
    if let Some((media_type, _)) = split_data_url(data) {
        return media_type.to_owned();
    }
    let media_type = if data.starts_with("/9j/") {
        "image/jpeg"
    } else if data.starts_with("R0lGOD") {
        "image/gif"
    } else if data.starts_with("UklGR") {
        "image/webp"
    } else {
        "image/png"
    };
    media_type.to_owned()
}

/// Standard or URL-safe base64, padding and line breaks allowed.
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let value = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'=' => break,
            b'\r' | b'\n' | b' ' | b'\t' => continue,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// A content block of a reply, as far as Arbor keeps it.
enum Block {
    Text(String),
    Thinking(String),
    ToolUse(ToolCall),
    Other,
}

impl Block {
    fn from_json(block: &Value) -> Block {
        let text = |key: &str| {
            block
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        match block.get("type").and_then(Value::as_str) {
            Some("text") => Block::Text(text("text")),
            Some("thinking") => Block::Thinking(text("thinking")),
            Some("tool_use") => Block::ToolUse(ToolCall {
                tool_call_id: text("id"),
                tool_name: text("name"),
                input: block.get("input").cloned().unwrap_or_else(|| json!({})),
            }),
            _ => Block::Other,
        }
    }
}

/// The assistant message of a reply's blocks, in order; adjacent text (or
/// thinking) blocks are one part, empty ones none.
fn assistant(blocks: impl IntoIterator<Item = Block>) -> Message {
    let mut parts: Vec<Part> = Vec::new();
    for block in blocks {
        match (block, parts.last_mut()) {
            (Block::Text(more), Some(Part::Text { text })) => text.push_str(&more),
            (Block::Thinking(more), Some(Part::Reasoning { text })) => text.push_str(&more),
            (Block::Text(text), _) if !text.is_empty() => parts.push(Part::Text { text }),
            (Block::Thinking(text), _) if !text.is_empty() => parts.push(Part::Reasoning { text }),
            (Block::ToolUse(call), _) => parts.push(Part::ToolCall(call)),
            _ => {}
        }
    }
    Message::Assistant {
        content: Content::Parts(parts),
        meta: Default::default(),
    }
}

/// Takes the counts `usage` has. Stream events repeat them cumulatively
/// (`message_start`, then `message_delta`), so a count only grows: a later event
/// that leaves one out or reports 0 or null keeps the earlier value.
fn update_tokens(tokens: &mut Tokens, usage: &Value) {
    let mut reported = false;
    let mut set = |field: &mut u64, key: &str| {
        if let Some(n) = usage.get(key).and_then(Value::as_u64) {
            *field = (*field).max(n);
            reported = true;
        }
    };
    set(&mut tokens.input, "input_tokens");
    set(&mut tokens.output, "output_tokens");
    set(&mut tokens.cache_read, "cache_read_input_tokens");
    set(&mut tokens.cache_write, "cache_creation_input_tokens");
    tokens.reported |= reported;
}

/// An `{"type":"error"}` body or stream event. HTTP errors are handled before
/// parsing; this one arrived with status 200, so the documented status of its
/// type decides whether it is worth another attempt.
fn api_error(error: &Value) -> Failure {
    let kind = error.get("type").and_then(Value::as_str).unwrap_or("error");
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .map_or_else(|| kind.to_owned(), |m| format!("{m} ({kind})"));
    let status = match kind {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "billing_error" => 402,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "rate_limit_error" => 429,
        "api_error" => 500,
        "timeout_error" => 504,
        "overloaded_error" => 529,
        _ => {
            return Failure::transient(message);
        }
    };
    if status < 429 {
        Failure::Rejected { status, message }
    } else {
        Failure::Transient {
            status: Some(status),
            message,
            retry_after: None,
        }
    }
}

pub(crate) fn parse_response(body: &Value) -> Result<Reply, Failure> {
    if body.get("type").and_then(Value::as_str) == Some("error") {
        return Err(api_error(&body["error"]));
    }
    let content = body
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| Failure::Malformed("reply has no content array".into()))?;
    if body.get("stop_reason").and_then(Value::as_str) == Some("max_tokens") {
        tracing::debug!("the reply was cut off at max_tokens");
    }
    let mut tokens = Tokens::default();
    if let Some(usage) = body.get("usage") {
        update_tokens(&mut tokens, usage);
    }
    Ok(Reply {
        message: assistant(content.iter().map(Block::from_json)),
        tokens,
    })
}

/// A content block being streamed.
enum Partial {
    Text(String),
    Thinking(String),
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
                Partial::Thinking(text)
            }
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
            ("thinking_delta", Partial::Thinking(text)) => {
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
            ("text_delta" | "thinking_delta" | "input_json_delta", _) => {
                return Err(Failure::Malformed(format!(
                    "{kind} for content block {index} of another type"
                )));
            }
            // signature_delta, citations_delta and whatever comes next.
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
            tracing::debug!("the reply was cut off at max_tokens");
        }
        let blocks = self.blocks.into_values().map(|partial| match partial {
            Partial::Text(text) => Block::Text(text),
            Partial::Thinking(text) => Block::Thinking(text),
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
                    start
                } else {
                    arguments(&json)
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use arbor_actors::message::Meta;

    use super::*;
    use crate::providers::openai::tests::{
        assemble, feed, joined, non_adjacent_history, request, sample_history, settings, sink, sse,
        weather_call,
    };
    use crate::providers::settings::ProviderKind;

    // Captured from aimock (/tmp/aimock-notes.md §2, §3): the same fixture
    // (text + two calls, usage 42/17) non-streamed and streamed.
    const TOOL_REPLY: &str = r#"{"id":"msg_boUndv3fNk5YHuoQ","type":"message","role":"assistant","content":[{"type":"text","text":"Checking both cities."},{"type":"tool_use","id":"call_paris","name":"get_weather","input":{"city":"Paris","unit":"celsius"}},{"type":"tool_use","id":"call_berlin","name":"get_weather","input":{"city":"Berlin","unit":"celsius"}}],"model":"claude-sonnet-4-5","stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":42,"output_tokens":17}}"#;

    const TEXT_REPLY: &str = r#"{"id":"msg_NQ5i4d7uTs66Z6HA","type":"message","role":"assistant","content":[{"type":"text","text":"Hi there! How can I help?"}],"model":"claude-sonnet-4-5","stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}"#;

    const TOOL_STREAM: &str = r#"event: message_start
data: {"type":"message_start","message":{"id":"msg_ICCOkWRWxKr2Wxm0","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":42,"output_tokens":17}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Checking both cities"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"."}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"call_paris","name":"get_weather","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"city\":\"Paris\",\"uni"}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"t\":\"celsius\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: content_block_start
data: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"call_berlin","name":"get_weather","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"city\":\"Berlin\",\"un"}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"it\":\"celsius\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":2}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":17}}

event: message_stop
data: {"type":"message_stop"}

"#;

    fn parse(body: &str) -> Result<Reply, Failure> {
        parse_response(&serde_json::from_str(body).unwrap())
    }

    fn stream_state() -> Box<dyn Assembler> {
        Box::new(StreamState::default())
    }

    fn body(messages: Vec<Message>) -> Value {
        request_body(
            &settings(ProviderKind::Anthropic, false),
            &request("", messages, false),
        )
    }

    fn tokens(input: u64, output: u64, cache_read: u64, cache_write: u64) -> Tokens {
        Tokens {
            input,
            output,
            cache_read,
            cache_write,
            reported: true,
        }
    }

    fn two_calls() -> Vec<ToolCall> {
        ["Paris", "Berlin"]
            .map(|city| ToolCall {
                tool_call_id: format!("call_{}", city.to_lowercase()),
                tool_name: "get_weather".into(),
                input: json!({"city": city, "unit": "celsius"}),
            })
            .to_vec()
    }

    fn parts(parts: Vec<Part>) -> Message {
        Message::User {
            content: Content::Parts(parts),
            meta: Meta::default(),
        }
    }

    #[test]
    fn request_body_lifts_the_system_prompt_and_groups_results_in_one_user_turn() {
        let body = request_body(
            &settings(ProviderKind::Anthropic, true),
            &request("You are terse.", sample_history(), true),
        );
        assert_eq!(
            body,
            json!({
                "model": "claude-sonnet-4-5",
                "max_tokens": 1024,
                "stream": true,
                "system": "You are terse.",
                "messages": [
                    // The two user messages are one turn (the API wants alternation).
                    {"role": "user", "content": [
                        {"type": "text", "text": "What is the weather in Paris and Berlin?"},
                        {"type": "text", "text": "And this chart:"},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}},
                        {"type": "image", "source": {"type": "url", "url": "https://example.com/chart.png"}}
                    ]},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "Checking both cities."},
                        {"type": "tool_use", "id": "call_paris", "name": "get_weather", "input": {"city": "Paris"}},
                        {"type": "tool_use", "id": "call_berlin", "name": "get_weather", "input": {"city": "Berlin"}}
                    ]},
                    // Both results, then the follow-up, in one user turn.
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "call_paris", "content": "{\"tempC\":18}"},
                        {"type": "tool_result", "tool_use_id": "call_berlin",
                         "content": "{\"errorMessage\":\"no station in Berlin\"}", "is_error": true},
                        {"type": "text", "text": "Thanks. Any rain?"}
                    ]}
                ],
                "tools": [
                    {"name": "get_weather", "description": "Current weather in a city",
                     "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
                    {"name": "read_file", "description": "Reads a file",
                     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
                ]
            })
        );
    }

    #[test]
    fn request_body_without_streaming_tools_or_system_has_none_of_them() {
        assert_eq!(
            body(vec![Message::user("hi")]),
            json!({"model": "claude-sonnet-4-5", "max_tokens": 1024,
                   "messages": [{"role": "user", "content": "hi"}]})
        );
    }

    #[test]
    fn results_not_adjacent_to_their_call_are_moved_right_after_it() {
        assert_eq!(
            body(non_adjacent_history())["messages"],
            json!([
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "call_paris", "name": "get_weather", "input": {"city": "Paris"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_paris", "content": "18C"},
                    {"type": "text", "text": "Hurry up."}
                ]}
            ])
        );
    }

    #[test]
    fn system_messages_join_the_system_prompt() {
        let body = request_body(
            &settings(ProviderKind::Anthropic, false),
            &request(
                "Be brief.",
                vec![
                    Message::system("Rule one."),
                    Message::user("a"),
                    Message::system("Rule two."),
                    Message::user("b"),
                ],
                false,
            ),
        );
        assert_eq!(body["system"], json!("Be brief.\n\nRule one.\n\nRule two."));
        assert_eq!(
            body["messages"],
            json!([{"role": "user", "content": [
                {"type": "text", "text": "a"}, {"type": "text", "text": "b"}
            ]}])
        );
        let only_history = body_with_system("", vec![Message::system("S"), Message::user("u")]);
        assert_eq!(only_history["system"], json!("S"));
    }

    fn body_with_system(system: &str, messages: Vec<Message>) -> Value {
        request_body(
            &settings(ProviderKind::Anthropic, false),
            &request(system, messages, false),
        )
    }

    #[test]
    fn the_conversation_starts_and_ends_with_a_user_turn() {
        let reasoning_only = Message::Assistant {
            content: Content::Parts(vec![Part::Reasoning { text: "hm".into() }]),
            meta: Meta::default(),
        };
        assert_eq!(
            body(vec![
                Message::assistant_text("Hello."),
                Message::user(""),
                reasoning_only,
                Message::assistant_text("Anything else?"),
            ])["messages"],
            json!([
                {"role": "user", "content": "(continue)"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Hello."},
                    {"type": "text", "text": "Anything else?"}
                ]},
                {"role": "user", "content": "(continue)"}
            ])
        );
        assert_eq!(
            body(vec![])["messages"],
            json!([{"role": "user", "content": "(continue)"}])
        );
    }

    #[test]
    fn tool_inputs_are_always_objects() {
        let bad = ToolCall {
            tool_call_id: "c1".into(),
            tool_name: "get_weather".into(),
            input: json!("{oops"),
        };
        let as_text = ToolCall {
            tool_call_id: "c2".into(),
            tool_name: "get_weather".into(),
            input: json!("{\"city\":\"Oslo\"}"),
        };
        let null = ToolCall {
            tool_call_id: "c3".into(),
            tool_name: "get_weather".into(),
            input: Value::Null,
        };
        let body = body(vec![
            Message::user("go"),
            Message::assistant(None, vec![bad.clone(), as_text.clone(), null.clone()]),
            Message::tool_error(&bad, "arguments are not JSON"),
            Message::tool_result(&as_text, json!("ok")),
            Message::tool_result(&null, json!("")),
        ]);
        let inputs: Vec<&Value> = (0..3)
            .map(|i| &body["messages"][1]["content"][i]["input"])
            .collect();
        assert_eq!(inputs, [&json!({}), &json!({"city": "Oslo"}), &json!({})]);
        assert_eq!(
            body["messages"][2]["content"],
            json!([
                {"type": "tool_result", "tool_use_id": "c1",
                 "content": "{\"errorMessage\":\"arguments are not JSON\"}", "is_error": true},
                {"type": "tool_result", "tool_use_id": "c2", "content": "ok"},
                {"type": "tool_result", "tool_use_id": "c3"}
            ])
        );
    }

    #[test]
    fn media_goes_as_image_and_document_blocks() {
        let call = weather_call("c1", "Oslo");
        let result = Message::Tool {
            tool_call_id: "c1".into(),
            tool_name: "get_weather".into(),
            content: vec![
                ToolResultPart::Json {
                    value: json!("a map"),
                },
                ToolResultPart::Media {
                    data: "iVBORw0KGgo=".into(),
                    media_type: "image/png".into(),
                },
                ToolResultPart::Media {
                    data: "AAAA".into(),
                    media_type: "audio/wav".into(),
                },
            ],
            meta: Meta::default(),
        };
        let body = body(vec![
            parts(vec![
                Part::Image {
                    image: "data:image/jpeg;base64,/9j/AA==".into(),
                    media_type: None,
                },
                Part::Image {
                    image: "/9j/AA==".into(),
                    media_type: None,
                },
                Part::File {
                    data: "JVBERi0=".into(),
                    filename: Some("a.pdf".into()),
                    media_type: "application/pdf".into(),
                },
                Part::File {
                    data: "aGVsbG8gd29ybGQ=".into(),
                    filename: None,
                    media_type: "text/plain".into(),
                },
                Part::File {
                    data: "UEsDBA==".into(),
                    filename: Some("a.zip".into()),
                    media_type: "application/zip".into(),
                },
            ]),
            Message::assistant(None, vec![call]),
            result,
        ]);
        assert_eq!(
            body["messages"],
            json!([
                {"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/AA=="}},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/AA=="}},
                    {"type": "document", "title": "a.pdf",
                     "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}},
                    {"type": "document",
                     "source": {"type": "text", "media_type": "text/plain", "data": "hello world"}},
                    {"type": "text",
                     "text": "[a.zip (application/zip) omitted: Anthropic accepts only PDF, text and image files]"}
                ]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "c1", "name": "get_weather", "input": {"city": "Oslo"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": [
                        {"type": "text", "text": "a map"},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                        {"type": "text", "text": "[audio/wav attachment omitted: not supported in tool results]"}
                    ]}
                ]}
            ])
        );
    }

    #[test]
    fn base64_decodes_with_and_without_padding() {
        assert_eq!(decode_base64("aGVsbG8gd29ybGQ=").unwrap(), b"hello world");
        assert_eq!(decode_base64("aGk").unwrap(), b"hi");
        assert_eq!(decode_base64("aGVs\nbG8=").unwrap(), b"hello");
        assert_eq!(decode_base64("a?b"), None);
    }

    #[test]
    fn parses_the_captured_reply_with_text_and_two_tool_calls() {
        let reply = parse(TOOL_REPLY).unwrap();
        assert_eq!(
            reply.message,
            Message::assistant(Some("Checking both cities.".into()), two_calls())
        );
        assert_eq!(reply.tokens, tokens(42, 17, 0, 0));
    }

    #[test]
    fn parses_the_captured_text_reply() {
        let reply = parse(TEXT_REPLY).unwrap();
        assert_eq!(
            reply.message,
            Message::assistant(Some("Hi there! How can I help?".into()), vec![])
        );
        // Zeros that were reported are counts, not an absence.
        assert_eq!(reply.tokens, tokens(0, 0, 0, 0));
    }

    #[test]
    fn thinking_is_reasoning_and_adjacent_text_blocks_are_one_part() {
        let body = json!({"type": "message", "content": [
            {"type": "thinking", "thinking": "Let me ", "signature": "sig"},
            {"type": "thinking", "thinking": "think."},
            {"type": "redacted_thinking", "data": "xyz"},
            {"type": "text", "text": "Part one, "},
            {"type": "text", "text": "part two."},
            {"type": "tool_use", "id": "c1", "name": "get_weather", "input": {"city": "Oslo"}},
            {"type": "text", "text": ""},
            {"type": "text", "text": "After."}
        ], "usage": {"input_tokens": 3, "output_tokens": 4}});
        assert_eq!(
            parse_response(&body).unwrap().message,
            Message::Assistant {
                content: Content::Parts(vec![
                    Part::Reasoning {
                        text: "Let me think.".into()
                    },
                    Part::Text {
                        text: "Part one, part two.".into()
                    },
                    Part::ToolCall(weather_call("c1", "Oslo")),
                    Part::Text {
                        text: "After.".into()
                    },
                ]),
                meta: Meta::default(),
            }
        );
    }

    #[test]
    fn the_captured_stream_gives_the_same_reply_as_its_non_streamed_form() {
        let (reply, deltas) = assemble(stream_state(), TOOL_STREAM);
        assert_eq!(reply.unwrap(), parse(TOOL_REPLY).unwrap());
        let (text, reasoning, args) = joined(&deltas);
        assert_eq!(text, "Checking both cities.");
        assert_eq!(reasoning, "");
        // Indexed by tool call, not by content block.
        assert_eq!(
            args,
            BTreeMap::from([
                (0, r#"{"city":"Paris","unit":"celsius"}"#.to_owned()),
                (1, r#"{"city":"Berlin","unit":"celsius"}"#.to_owned()),
            ])
        );
    }

    #[test]
    fn a_streamed_thinking_reply_matches_its_non_streamed_form() {
        let events = [
            json!({"type": "message_start", "message": {"content": [], "usage": {"input_tokens": 5, "output_tokens": 1}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Hm"}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "ping"}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hi"}}),
            json!({"type": "content_block_stop", "index": 1}),
            json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "c1", "name": "read_file", "input": {}}}),
            json!({"type": "content_block_stop", "index": 2}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}}),
            json!({"type": "message_stop"}),
        ];
        let stream: String = events
            .iter()
            .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
            .collect();
        let whole = json!({"type": "message", "content": [
            {"type": "thinking", "thinking": "Hm", "signature": "sig"},
            {"type": "text", "text": "Hi"},
            {"type": "tool_use", "id": "c1", "name": "read_file", "input": {}}
        ], "usage": {"input_tokens": 5, "output_tokens": 9}});
        let (reply, deltas) = assemble(stream_state(), &stream);
        assert_eq!(reply.unwrap(), parse_response(&whole).unwrap());
        let (text, reasoning, args) = joined(&deltas);
        assert_eq!((text.as_str(), reasoning.as_str()), ("Hi", "Hm"));
        assert!(args.is_empty());
    }

    #[test]
    fn malformed_streamed_input_comes_back_as_a_string() {
        let stream = TOOL_STREAM
            .replace(r#"it\":\"celsius\"}"#, "")
            .replace(r#"{\"city\":\"Berlin\",\"un"#, "{oops");
        let (reply, _) = assemble(stream_state(), &stream);
        let calls: Vec<_> = reply.unwrap().message.tool_calls().cloned().collect();
        assert_eq!(calls[0].input, json!({"city": "Paris", "unit": "celsius"}));
        assert_eq!(calls[1].input, json!("{oops"));
    }

    #[test]
    fn a_stream_cut_before_message_stop_never_completes() {
        let events = sse(TOOL_STREAM);
        let (sink, deltas) = sink();
        let mut state = StreamState::default();
        let outcomes = feed(&mut state, &events[..events.len() - 1], &sink);
        assert!(outcomes.into_iter().all(|o| o == Ok(false)));
        assert_eq!(joined(&deltas).0, "Checking both cities.");

        // aimock's truncation: message_start and content_block_start, then nothing.
        let mut state = StreamState::default();
        let outcomes = feed(&mut state, &events[..2], &sink);
        assert!(outcomes.into_iter().all(|o| o == Ok(false)));
    }

    #[test]
    fn data_that_is_not_json_is_malformed() {
        let (sink, _) = sink();
        let mut state = StreamState::default();
        let outcome = state.event("message_start", "{malformed json: <<<chaos>>>", &sink);
        assert!(matches!(outcome, Err(Failure::Malformed(_))), "{outcome:?}");
        assert!(matches!(
            parse_response(&json!({"type": "message"})),
            Err(Failure::Malformed(_))
        ));
    }

    #[test]
    fn a_delta_without_its_block_is_malformed() {
        let (sink, _) = sink();
        let mut state = StreamState::default();
        let delta = json!({"type": "content_block_delta", "index": 3,
                           "delta": {"type": "text_delta", "text": "x"}});
        let outcome = state.event("content_block_delta", &delta.to_string(), &sink);
        assert!(matches!(outcome, Err(Failure::Malformed(_))), "{outcome:?}");
    }

    #[test]
    fn error_events_and_bodies_map_by_error_type() {
        let (sink, _) = sink();
        let mut state = StreamState::default();
        let event = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
        assert_eq!(
            state.event("error", &event.to_string(), &sink),
            Err(Failure::Transient {
                status: Some(529),
                message: "Overloaded (overloaded_error)".into(),
                retry_after: None
            })
        );
        let rejected =
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}});
        assert_eq!(
            parse_response(&rejected),
            Err(Failure::Rejected {
                status: 400,
                message: "bad (invalid_request_error)".into()
            })
        );
        let unknown = json!({"type": "error", "error": {"type": "mystery_error"}});
        assert_eq!(
            parse_response(&unknown),
            Err(Failure::transient("mystery_error"))
        );
    }

    #[test]
    fn cache_tokens_are_read_streamed_or_not() {
        let usage = json!({"input_tokens": 12, "output_tokens": 30,
            "cache_read_input_tokens": 900, "cache_creation_input_tokens": 100});
        let mut body: Value = serde_json::from_str(TEXT_REPLY).unwrap();
        body["usage"] = usage.clone();
        assert_eq!(
            parse_response(&body).unwrap().tokens,
            tokens(12, 30, 900, 100)
        );

        let stream = TOOL_STREAM
            .replace(
                r#""usage":{"input_tokens":42,"output_tokens":17}"#,
                r#""usage":{"input_tokens":12,"output_tokens":1,"cache_read_input_tokens":900,"cache_creation_input_tokens":100}"#,
            )
            .replace(
                r#""usage":{"output_tokens":17}"#,
                r#""usage":{"input_tokens":0,"output_tokens":30,"cache_read_input_tokens":null}"#,
            );
        let (reply, _) = assemble(stream_state(), &stream);
        assert_eq!(reply.unwrap().tokens, tokens(12, 30, 900, 100));
    }
}

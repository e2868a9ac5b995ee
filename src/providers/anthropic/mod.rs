//! The Anthropic Messages wire format, both ways.
//!
//! Requests: system messages are lifted into the top-level `system`, tool results
//! become `tool_result` blocks of a user message, and consecutive messages of one
//! role are merged, since the API wants strictly alternating user/assistant turns
//! that start (and, here, end) with a user turn. Reasoning parts are not sent back:
//! the API only accepts thinking blocks with the signature it issued.

mod stream;

use arbor_actors::ModelRequest;
use arbor_actors::message::{Content, Message, Part, TOOL_CALL_ERROR, ToolCall, ToolResultPart};
use serde_json::{Value, json};

pub(crate) use self::stream::StreamState;
use crate::providers::settings::{ProviderKind, ProviderSettings};
use crate::providers::wire::convert::{adjacent_results, result_text};
use crate::providers::wire::{Assembler, Failure, Reply, Tokens, WireFormat};

/// The Messages API.
pub(crate) struct Anthropic;

impl WireFormat for Anthropic {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Anthropic
    }

    fn path(&self) -> &'static str {
        "/v1/messages"
    }

    fn auth_header(&self, key: &str) -> (&'static str, String) {
        ("x-api-key", key.to_owned())
    }

    fn fixed_headers(&self) -> &'static [(&'static str, &'static str)] {
        &[("anthropic-version", "2023-06-01")]
    }

    fn request_body(&self, settings: &ProviderSettings, request: &ModelRequest) -> Value {
        request_body(settings, request)
    }

    fn parse_response(&self, body: &Value) -> Result<Reply, Failure> {
        parse_response(body)
    }

    fn assembler(&self) -> Box<dyn Assembler> {
        Box::new(StreamState::default())
    }
}

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

#[cfg(test)]
mod tests;
